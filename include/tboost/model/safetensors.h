// Safetensors checkpoints: one file, or shards listed by model.safetensors.index.json.
//
// Format: 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data that follows
// the header), then the data. Everything is checked when a file is opened: the header length
// against the file size, the JSON, every dtype, every shape, every offset pair (inside the
// data, end - begin = elements x dtype size). Errors name the file and the tensor.
//
// Load::kMmap maps each file read-only (fast start); tensor(name) is a zero-copy view into the
// mapping. Load::kRead (benchmarks: PERF.md, mapped weights are dropped from the page cache on
// shared hosts) reads only the headers at open and each tensor's bytes when asked for:
// tensor(name) reads them into a buffer of their own on first use, and read_into(name, dst)
// straight into the caller's memory, converted on the way where the dtypes differ. A model
// loader thus holds its weights once, never the file besides (a bf16 model from an f32 file
// had peaked at the whole file plus the converted weights). Views stay valid while the
// SafeTensors lives. One object, one caller: tensor() fills a cache, so concurrent calls race.
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
    const void* data = nullptr;  // kMmap: in the mapping; kRead: null (tensor() reads it)
    size_t bytes = 0;
    std::string file;
    bool released = false;  // release() gave its memory back: no view any more
    uint64_t offset = 0;    // of its first byte in the file
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
  // A view of the tensor's bytes (throws for dtypes tboost has no type for, e.g. F64, BOOL):
  // in the mapping, or (kRead) in a buffer read on the first call.
  Tensor tensor(const std::string& name) const;
  // The tensor's elements converted to `dtype` (round to nearest even) into dst, which holds
  // numel x dtype size bytes. kRead reads the file directly into dst where the dtypes match,
  // else through a buffer of a few MiB: the whole tensor never sits in memory twice.
  void read_into(const std::string& name, void* dst, DType dtype) const;
  // Gives back the memory under a tensor that the caller has copied out and will not read
  // through this object again: kRead frees the buffer tensor() read it into; a mapped file
  // drops the whole pages inside its bytes from the resident set. tensor() and read_into() then
  // throw for it.
  void release(const std::string& name);
  Load load() const { return load_; }
  size_t total_bytes() const { return total_bytes_; }
  const std::string& path() const { return path_; }

 private:
  SafeTensors() = default;
  void add_file(const std::string& file, Load load);
  const Entry& usable(const std::string& name) const;  // present, supported, not released
  struct Mapping;
  std::vector<std::unique_ptr<Mapping>> files_;
  std::map<std::string, Entry> entries_;
  Load load_ = Load::kRead;
  // kRead: what tensor() has read, by name (mutable: tensor() is a const read).
  mutable std::map<std::string, std::shared_ptr<void>> read_;
  size_t total_bytes_ = 0;
  std::string path_;
};

// Writes tensors (contiguous or not) to one .safetensors file, in name order; written to
// path + ".tmp" and renamed, so a failure never leaves a partial file at `path`.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors);

}  // namespace tboost::model
