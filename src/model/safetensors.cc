// Safetensors reading (validated, zero-copy views) and writing.
#include "tboost/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tboost/core/error.h"

namespace tboost::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw Error(ErrorCode::kIo, file + ": " + what);
}

struct DtypeInfo {
  const char* name;
  size_t size;
  bool supported;
  DType dtype;
};
constexpr DtypeInfo kDtypes[] = {
    {"F32", 4, true, DType::kF32},     {"F16", 2, true, DType::kF16},
    {"BF16", 2, true, DType::kBF16},   {"I64", 8, true, DType::kI64},
    {"I32", 4, true, DType::kI32},     {"I8", 1, true, DType::kI8},
    {"U8", 1, true, DType::kU8},       {"F64", 8, false, DType::kF32},
    {"I16", 2, false, DType::kF32},    {"U16", 2, false, DType::kF32},
    {"U32", 4, false, DType::kF32},    {"U64", 8, false, DType::kF32},
    {"BOOL", 1, false, DType::kF32},   {"F8_E4M3", 1, false, DType::kF32},
    {"F8_E5M2", 1, false, DType::kF32}};

const char* st_name(DType t) {
  for (const auto& d : kDtypes)
    if (d.supported && d.dtype == t) return d.name;
  return "?";
}

}  // namespace

struct SafeTensors::Mapping {
  std::string file;
  int fd = -1;  // kRead: open until the SafeTensors goes
  void* map = nullptr;
  size_t map_bytes = 0;
  size_t size = 0;
  ~Mapping() {
    if (map) munmap(map, map_bytes);
    if (fd >= 0) ::close(fd);
  }
  // Reads n bytes at offset off into dst. Returns "" or why it stopped short: how many bytes
  // it got, and the system's error or the file's end.
  std::string read_at(void* dst, size_t n, uint64_t off) const {
    char* d = static_cast<char*>(dst);
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd, d + done, n - done, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        return "read " + std::to_string(done) + " of " + std::to_string(n) + " bytes at offset " +
               std::to_string(off) + ": " +
               (r < 0 ? std::string(std::strerror(errno)) : std::string("end of file"));
      done += static_cast<size_t>(r);
    }
    return {};
  }
};

SafeTensors::~SafeTensors() = default;

void SafeTensors::add_file(const std::string& file, Load load) {
  auto m = std::make_unique<Mapping>();
  m->file = file;
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) bad(file, std::string("cannot open: ") + std::strerror(errno));
  m->fd = fd;  // closed by ~Mapping on every path out
  struct stat st {};
  if (fstat(fd, &st) != 0) bad(file, "cannot stat");
  m->size = static_cast<size_t>(st.st_size);
  if (m->size < 8)
    bad(file,
        "truncated: " + std::to_string(m->size) + " bytes, less than the 8-byte header length");
  const char* base = nullptr;  // the file's first byte (kMmap) or the header's copy (kRead)
  std::string head;
  if (load == Load::kMmap) {
    m->map = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    m->fd = -1;
    if (m->map == MAP_FAILED) {
      m->map = nullptr;
      bad(file, "mmap failed");
    }
    m->map_bytes = m->size;
    base = static_cast<const char*>(m->map);
  } else {
    head.resize(8);
    if (auto why = m->read_at(head.data(), 8, 0); !why.empty())
      bad(file, "cannot read the header length (" + why + ")");
  }
  if (!base) base = head.data();
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(base[i]);
  if (hlen > m->size - 8)
    bad(file, "truncated or corrupt: header length " + std::to_string(hlen) + " but only " +
                  std::to_string(m->size - 8) + " bytes follow");
  if (load == Load::kRead) {
    head.resize(8 + hlen);
    if (auto why = m->read_at(head.data() + 8, hlen, 8); !why.empty())
      bad(file, "cannot read the header (" + why + ")");
    base = head.data();
  }
  json h;
  try {
    h = json::parse(base + 8, base + 8 + hlen);
  } catch (const std::exception& e) {
    bad(file, std::string("header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) bad(file, "header is not a JSON object");
  const uint64_t data_at = 8 + hlen;
  const size_t data_size = m->size - 8 - hlen;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const json& e = it.value();
    const std::string where = "tensor \"" + name + "\"";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets"))
      bad(file, where + ": entry needs dtype, shape and data_offsets");
    Entry en;
    en.file = file;
    if (!e["dtype"].is_string()) bad(file, where + ": dtype is not a string");
    en.dtype_name = e["dtype"].get<std::string>();
    const DtypeInfo* di = nullptr;
    for (const auto& d : kDtypes)
      if (en.dtype_name == d.name) di = &d;
    if (!di) bad(file, where + ": unknown dtype \"" + en.dtype_name + "\"");
    en.supported = di->supported;
    en.dtype = di->dtype;
    if (!e["shape"].is_array()) bad(file, where + ": shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        bad(file, where + ": shape " + e["shape"].dump() + " has a bad dim");
      const auto v = d.get<uint64_t>();
      if (v != 0 && numel > (uint64_t{1} << 62) / v)
        bad(file, where + ": shape " + e["shape"].dump() + " overflows");
      numel *= v;
      en.shape.push_back(static_cast<int64_t>(v));
    }
    if (en.shape.size() > 8) bad(file, where + ": rank above 8");
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad(file, where + ": data_offsets must be two non-negative integers");
    const auto b = off[0].get<uint64_t>(), en_ = off[1].get<uint64_t>();
    if (b > en_ || en_ > data_size)
      bad(file, where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en_) +
                    "] outside the " + std::to_string(data_size) + " data bytes (truncated file?)");
    if (en_ - b != numel * di->size)
      bad(file, where + ": " + std::to_string(en_ - b) + " data bytes for shape " +
                    e["shape"].dump() + " of " + en.dtype_name + " (expected " +
                    std::to_string(numel * di->size) + ")");
    en.data = load == Load::kMmap ? base + data_at + b : nullptr;
    en.offset = data_at + b;
    en.bytes = en_ - b;
    if (entries_.count(name))
      bad(file, where + " appears twice (also in " + entries_[name].file + ")");
    total_bytes_ += en.bytes;
    entries_[name] = std::move(en);
  }
  files_.push_back(std::move(m));
}

std::shared_ptr<SafeTensors> SafeTensors::open(const std::string& path, Load load) {
  std::shared_ptr<SafeTensors> st(new SafeTensors());
  st->path_ = path;
  st->load_ = load;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "model.safetensors")) {
      st->add_file((dir / "model.safetensors").string(), load);
    } else if (fs::exists(dir / "model.safetensors.index.json")) {
      const std::string idx = (dir / "model.safetensors.index.json").string();
      std::ifstream f(idx);
      std::stringstream ss;
      ss << f.rdbuf();
      json j;
      try {
        j = json::parse(ss.str());
      } catch (const std::exception& e) {
        bad(idx, std::string("not valid JSON: ") + e.what());
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        bad(idx, "no \"weight_map\" object");
      std::map<std::string, std::vector<std::string>> by_file;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          bad(idx, "weight_map entry \"" + it.key() + "\" is not a file name");
        by_file[it.value().get<std::string>()].push_back(it.key());
      }
      for (const auto& [file, names] : by_file) {
        if (file.find('/') != std::string::npos || file.find("..") != std::string::npos)
          bad(idx, "shard name \"" + file + "\" must be a plain file name");
        st->add_file((dir / file).string(), load);
        for (const auto& n : names)
          if (!st->has(n))
            bad(idx, "tensor \"" + n + "\" is listed for " + file + " but not in it");
      }
    } else {
      throw Error(ErrorCode::kIo, path + ": no model.safetensors or model.safetensors.index.json");
    }
  } else {
    st->add_file(path, load);
  }
  return st;
}

const SafeTensors::Entry& SafeTensors::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw Error(ErrorCode::kInvalidArgument, path_ + ": missing tensor \"" + name + "\"");
  return it->second;
}

std::vector<std::string> SafeTensors::names() const {
  std::vector<std::string> v;
  for (const auto& [n, e] : entries_) v.push_back(n);
  return v;
}

const SafeTensors::Entry& SafeTensors::usable(const std::string& name) const {
  const Entry& e = entry(name);
  if (!e.supported)
    throw Error(ErrorCode::kDTypeMismatch,
                e.file + ": tensor \"" + name + "\" has dtype " + e.dtype_name +
                    ", which tboost cannot use (F32, F16, BF16, integer types)");
  if (e.released)
    throw Error(ErrorCode::kInvalidArgument,
                e.file + ": tensor \"" + name + "\" was released after it was copied out");
  return e;
}

Tensor SafeTensors::tensor(const std::string& name) const {
  const Entry& e = usable(name);
  if (e.data || e.bytes == 0) return Tensor::view(const_cast<void*>(e.data), e.dtype, e.shape);
  std::shared_ptr<void>& buf = read_[name];
  if (!buf) {
    std::shared_ptr<void> b = aligned_buffer(e.bytes);
    read_into(name, b.get(), e.dtype);
    buf = std::move(b);
  }
  return Tensor::view(buf.get(), e.dtype, e.shape);
}

void SafeTensors::read_into(const std::string& name, void* dst, DType dtype) const {
  const Entry& e = usable(name);
  const auto numel = static_cast<int64_t>(e.bytes / dtype_size(e.dtype));
  const void* have = e.data;
  if (auto it = read_.find(name); !have && it != read_.end()) have = it->second.get();
  if (have || e.bytes == 0) {
    convert(dst, dtype, have, e.dtype, numel);
    return;
  }
  const Mapping* m = nullptr;
  for (const auto& f : files_)
    if (f->file == e.file) m = f.get();
  auto check = [&](const std::string& why) {
    if (!why.empty())
      bad(e.file, "tensor \"" + name + "\": read failed, " + why +
                      " (the file changed or was truncated after it was opened?)");
  };
  if (dtype == e.dtype) {
    check(m->read_at(dst, e.bytes, e.offset));
    return;
  }
  // Another dtype: a few MiB at a time through a buffer, converted into dst.
  const size_t es = dtype_size(e.dtype), ds = dtype_size(dtype);
  const size_t piece = std::min<size_t>(e.bytes, (size_t{4} << 20) / es * es);
  std::vector<char> buf(piece);
  for (size_t done = 0; done < e.bytes; done += piece) {
    const size_t n = std::min(piece, e.bytes - done);
    check(m->read_at(buf.data(), n, e.offset + done));
    convert(static_cast<char*>(dst) + done / es * ds, dtype, buf.data(), e.dtype,
            static_cast<int64_t>(n / es));
  }
}

void SafeTensors::release(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw Error(ErrorCode::kInvalidArgument, path_ + ": missing tensor \"" + name + "\"");
  Entry& e = it->second;
  if (e.released) return;
  e.released = true;
  read_.erase(name);  // kRead: the buffer tensor() read it into, if any
  if (!e.data) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto b = reinterpret_cast<uintptr_t>(e.data), end = b + e.bytes;
  const uintptr_t lo = (b + page - 1) / page * page, hi = end / page * page;
  // Advice only: where it fails, the pages stay resident and nothing else changes.
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    json e;
    e["dtype"] = st_name(t.dtype());
    e["shape"] = t.shape();
    e["data_offsets"] = {off, off + t.nbytes()};
    off += t.nbytes();
    h[name] = e;
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw Error(ErrorCode::kIo, "cannot write " + tmp);
    uint64_t n = hs.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    f.write(len, 8);
    f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
    for (const auto& [name, t] : tensors) {
      const Tensor c = t.is_contiguous() ? t : t.contiguous_copy();
      f.write(static_cast<const char*>(c.data()), static_cast<std::streamsize>(c.nbytes()));
    }
    if (!f) throw Error(ErrorCode::kIo, "writing " + tmp + " failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot rename " + tmp + " to " + path + ": " + ec.message());
}

}  // namespace tboost::model
