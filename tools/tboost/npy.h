// Reading and writing NumPy .npy files (format 1.0/2.0, little-endian, C order): the golden
// inputs and outputs the export scripts write. Header-only; errors are tboost::Error naming
// the file.
#pragma once

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "tboost/core/error.h"
#include "tboost/core/tensor.h"

namespace tboost::npy {

inline Tensor load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kIo, "npy: cannot open '" + path + "'");
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw Error(ErrorCode::kInvalidArgument, "npy: '" + path + "' is not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  if (!f || hlen > (1u << 20))
    throw Error(ErrorCode::kInvalidArgument, "npy: '" + path + "' has a bad header");
  std::string h(hlen, '\0');
  f.read(h.data(), hlen);
  auto field = [&](const char* key) {
    const size_t k = h.find(key);
    if (k == std::string::npos)
      throw Error(ErrorCode::kInvalidArgument, "npy: '" + path + "' header lacks " + key);
    return k + std::strlen(key);
  };
  size_t d = h.find('\'', field("'descr':"));
  const std::string descr = h.substr(d + 1, h.find('\'', d + 1) - d - 1);
  if (h.find("True", field("'fortran_order':")) < h.find(',', field("'fortran_order':")))
    throw Error(ErrorCode::kUnsupported, "npy: '" + path + "' is Fortran order");
  DType dt;
  if (descr == "<f4") {
    dt = DType::kF32;
  } else if (descr == "<i8") {
    dt = DType::kI64;
  } else if (descr == "<i4") {
    dt = DType::kI32;
  } else if (descr == "|u1" || descr == "|b1") {
    dt = DType::kU8;
  } else {
    throw Error(ErrorCode::kUnsupported,
                "npy: '" + path + "' has dtype " + descr + " (f4, i8, i4, u1, b1 read)");
  }
  Shape shape;
  const size_t p0 = h.find('(', field("'shape':")), p1 = h.find(')', p0);
  std::string dims = h.substr(p0 + 1, p1 - p0 - 1);
  for (size_t i = 0; i < dims.size();) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    size_t j = i;
    while (j < dims.size() && dims[j] >= '0' && dims[j] <= '9') ++j;
    if (j == i) throw Error(ErrorCode::kInvalidArgument, "npy: '" + path + "' has a bad shape");
    shape.push_back(std::stoll(dims.substr(i, j - i)));
    i = j;
  }
  Tensor t = Tensor::empty(dt, shape);
  f.read(static_cast<char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  if (!f) throw Error(ErrorCode::kIo, "npy: '" + path + "' is truncated");
  return t;
}

// Writes an f32 tensor (contiguous) as a .npy file (format 1.0), via a temporary file renamed
// into place, so a failed write never leaves a partial file.
inline void save_f32(const std::string& path, const Tensor& t) {
  if (t.dtype() != DType::kF32 || !t.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, "npy: save_f32 needs a contiguous f32 tensor");
  std::string shape = "(";
  for (int i = 0; i < t.ndim(); ++i)
    shape += std::to_string(t.dim(i)) + (t.ndim() == 1 ? "," : i + 1 < t.ndim() ? ", " : "");
  shape += ")";
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw Error(ErrorCode::kIo, "npy: cannot write '" + tmp + "'");
    const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    f.write(magic, 8);
    const auto n = static_cast<uint16_t>(h.size());
    const char len[2] = {static_cast<char>(n & 0xff), static_cast<char>(n >> 8)};
    f.write(len, 2);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    f.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
    if (!f) throw Error(ErrorCode::kIo, "npy: writing '" + tmp + "' failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error(ErrorCode::kIo, "npy: cannot rename '" + tmp + "' to '" + path + "'");
}

}  // namespace tboost::npy
