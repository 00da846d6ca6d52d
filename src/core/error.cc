// tboost::Error helpers.
#include "tboost/core/error.h"

#include <cstring>

namespace tboost {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kShapeMismatch:
      return "shape mismatch";
    case ErrorCode::kDTypeMismatch:
      return "dtype mismatch";
    case ErrorCode::kNullData:
      return "null data";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kIo:
      return "i/o error";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "error";
}

namespace detail {

void throw_error(ErrorCode code, const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(code, concat(msg, " [", error_code_name(code), " at ", base ? base + 1 : file, ":",
                           line, "]"));
}

}  // namespace detail
}  // namespace tboost
