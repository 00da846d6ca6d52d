// Safetensors checkpoints: one file, or shards listed by model.safetensors.index.json.
//
// Format: 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data that follows
// the header), then the data. Everything is checked when a file is opened: the header length
// against the file size, the JSON, every dtype, every shape, every offset pair (inside the
// data, end - begin = elements x dtype size). Errors name the file and the tensor.
//
// Load::kRead reads each file into one aligned buffer (benchmarks: PERF.md, mapped weights are
// dropped from the page cache on shared hosts); Load::kMmap maps it read-only (fast start).
// tensor(name) is a zero-copy view into that memory, valid while the SafeTensors lives.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tboost/core/tensor.h"

namespace tboost::model {

class SafeTensors {
 public:
  enum class Load { kRead, kMmap };
  struct Entry {
    std::string dtype_name;  // as in the file: "F32", "BF16", ...
    bool supported = false;  // dtype maps to a tboost DType
    DType dtype = DType::kF32;
    Shape shape;
    const void* data = nullptr;
    size_t bytes = 0;
    std::string file;
    bool released = false;  // release() gave its memory back: no view any more
  };

  // A .safetensors file, or a directory holding model.safetensors or
  // model.safetensors.index.json (shards).
  static std::shared_ptr<SafeTensors> open(const std::string& path, Load load = Load::kRead);
  ~SafeTensors();
  SafeTensors(const SafeTensors&) = delete;
  SafeTensors& operator=(const SafeTensors&) = delete;

  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const Entry& entry(const std::string& name) const;  // throws naming the tensor
  std::vector<std::string> names() const;
  // Zero-copy view (throws for dtypes tboost has no type for, e.g. F64, BOOL).
  Tensor tensor(const std::string& name) const;
  // Gives back the memory under a tensor that the caller has copied out and will not read
  // through this object again: the whole pages inside its bytes (a file read into memory frees
  // them; a mapped file drops them from the resident set). tensor() then throws for it.
  void release(const std::string& name);
  size_t total_bytes() const { return total_bytes_; }
  const std::string& path() const { return path_; }

 private:
  SafeTensors() = default;
  void add_file(const std::string& file, Load load);
  struct Mapping;
  std::vector<std::unique_ptr<Mapping>> files_;
  std::map<std::string, Entry> entries_;
  size_t total_bytes_ = 0;
  std::string path_;
};

// Writes tensors (contiguous or not) to one .safetensors file, in name order; written to
// path + ".tmp" and renamed, so a failure never leaves a partial file at `path`.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors);

}  // namespace tboost::model
