#include "src/core/file_io.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tboost/core/error.h"

namespace tboost {

std::string read_file(const std::string& path, std::string_view what) {
  const std::string name = what.empty() ? path : std::string(what) + " " + path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(ErrorCode::kIo, name + ": no such file");
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(ErrorCode::kIo, name + ": not a regular file");
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (!f) throw Error(ErrorCode::kIo, name + ": cannot read");
  return ss.str();
}

void write_file_atomic(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    f.flush();
    if (!f) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw Error(ErrorCode::kIo, "cannot write " + tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot rename " + tmp + " to " + path + ": " + ec.message());
}

}  // namespace tboost
