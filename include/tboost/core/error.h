// tboost::Error and the TBOOST_CHECK macros.
//
// Contract: every failure inside the library is a tboost::Error (an exception carrying an
// ErrorCode and a message that names what was wrong, the values involved and file:line).
// The library never calls exit() or abort(); frontends turn an Error into a message and a
// non-zero exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tboost {

enum class ErrorCode {
  kInvalidArgument,  // a parameter value that makes no sense
  kShapeMismatch,    // a tensor's rank or dims differ from what the op needs
  kDTypeMismatch,    // a tensor's dtype is not one the op accepts
  kNullData,         // a tensor with elements but no data pointer
  kUnsupported,      // valid request, but no kernel for it (device, dtype, ISA)
  kOutOfMemory,      // an allocation failed
  kIo,               // reading or writing a file failed
  kInternal,         // a broken invariant inside the library (a bug)
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {

template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_error(ErrorCode code, const char* file, int line, const std::string& msg);

}  // namespace detail
}  // namespace tboost

// Throws tboost::Error(code) with the streamed arguments as message, plus file:line.
#define TBOOST_THROW(code, ...) \
  ::tboost::detail::throw_error((code), __FILE__, __LINE__, ::tboost::detail::concat(__VA_ARGS__))

// Checks a condition; on failure throws kInvalidArgument naming the condition.
#define TBOOST_CHECK(cond, ...)                                                   \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ::tboost::detail::throw_error(                                              \
          ::tboost::ErrorCode::kInvalidArgument, __FILE__, __LINE__,              \
          ::tboost::detail::concat("check failed: " #cond " — ", ##__VA_ARGS__)); \
    }                                                                             \
  } while (0)

// Checks a condition; on failure throws the given code.
#define TBOOST_CHECK_CODE(cond, code, ...)                                  \
  do {                                                                      \
    if (!(cond)) {                                                          \
      ::tboost::detail::throw_error((code), __FILE__, __LINE__,             \
                                    ::tboost::detail::concat(__VA_ARGS__)); \
    }                                                                       \
  } while (0)

// Binary comparison that reports both values.
#define TBOOST_CHECK_OP_(a, b, op, ...)                                                        \
  do {                                                                                         \
    const auto& tboost_a_ = (a);                                                               \
    const auto& tboost_b_ = (b);                                                               \
    if (!(tboost_a_ op tboost_b_)) {                                                           \
      ::tboost::detail::throw_error(                                                           \
          ::tboost::ErrorCode::kInvalidArgument, __FILE__, __LINE__,                           \
          ::tboost::detail::concat("check failed: " #a " " #op " " #b " (", tboost_a_, " vs ", \
                                   tboost_b_, ") ", ##__VA_ARGS__));                           \
    }                                                                                          \
  } while (0)
#define TBOOST_CHECK_EQ(a, b, ...) TBOOST_CHECK_OP_(a, b, ==, ##__VA_ARGS__)
#define TBOOST_CHECK_NE(a, b, ...) TBOOST_CHECK_OP_(a, b, !=, ##__VA_ARGS__)
#define TBOOST_CHECK_LT(a, b, ...) TBOOST_CHECK_OP_(a, b, <, ##__VA_ARGS__)
#define TBOOST_CHECK_LE(a, b, ...) TBOOST_CHECK_OP_(a, b, <=, ##__VA_ARGS__)
#define TBOOST_CHECK_GT(a, b, ...) TBOOST_CHECK_OP_(a, b, >, ##__VA_ARGS__)
#define TBOOST_CHECK_GE(a, b, ...) TBOOST_CHECK_OP_(a, b, >=, ##__VA_ARGS__)
