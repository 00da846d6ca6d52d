// Whole-file reads and atomic writes, shared by the model loaders, the trainer and the CLI.
#pragma once

#include <string>
#include <string_view>

namespace tboost {

// The file's bytes. kIo naming the path (prefixed by `what`, e.g. "tokenizer") when it is
// missing, not a regular file, or unreadable.
std::string read_file(const std::string& path, std::string_view what = {});

// Writes data to path + ".tmp", then renames it over path: a reader never sees a partial file.
// kIo naming the path on failure (the temp file is removed).
void write_file_atomic(const std::string& path, std::string_view data);

}  // namespace tboost
