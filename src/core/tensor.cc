// TensorDesc and Tensor: descriptors, views, owning aligned buffers.
#include "tboost/core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "tboost/core/error.h"

namespace tboost {

namespace {
// Buffers of 2 x kHuge bytes and more go on kHuge (2 MiB) pages where the kernel allows it.
constexpr size_t kHuge = size_t{2} << 20;
void check_size(size_t bytes) {
  TBOOST_CHECK_CODE(bytes <= (size_t{1} << 62), ErrorCode::kOutOfMemory, "allocation of ", bytes,
                    " bytes is beyond any machine");
}
}  // namespace

std::shared_ptr<void> aligned_buffer(size_t bytes) {
  check_size(bytes);
  // Big buffers (weights, caches, arenas) go on 2 MiB pages where the kernel allows it
  // (transparent huge pages in "madvise" mode are common): a stream over 4 KiB pages takes a
  // TLB miss every 4 KiB and the hardware prefetcher stops at every page boundary, which
  // keeps weight-streaming decode below the DRAM read bandwidth.
  const bool huge = bytes >= 2 * kHuge;
  const size_t align = huge ? kHuge : 64;
  const size_t rounded = ((bytes + align - 1) / align) * align;
  void* p = rounded ? std::aligned_alloc(align, rounded) : nullptr;
  TBOOST_CHECK_CODE(p != nullptr || rounded == 0, ErrorCode::kOutOfMemory, "could not allocate ",
                    bytes, " bytes (64-byte aligned)");
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

std::shared_ptr<void> zeroed_buffer(size_t bytes, ZeroPages pages) {
  if (bytes < 2 * kHuge) {
    std::shared_ptr<void> p = aligned_buffer(bytes);
    if (bytes) std::memset(p.get(), 0, bytes);
    return p;
  }
  check_size(bytes);
  // Map 2 MiB more than asked and unmap the unaligned head and the tail, so the buffer starts
  // on a huge-page boundary. Anonymous pages read as zero until written, and take memory only
  // then: Tensor::zeros(KV cache of 8192 positions) for SmolLM2 (377 MB in f32) had memset,
  // and so committed, all of it before the first token.
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  const size_t span = rounded + kHuge;
  void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TBOOST_CHECK_CODE(m != MAP_FAILED, ErrorCode::kOutOfMemory, "could not map ", bytes,
                    " bytes of zeroed memory");
  const auto base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (base + kHuge - 1) / kHuge * kHuge;
  if (start > base) munmap(m, start - base);
  const uintptr_t end = start + rounded, map_end = base + span;
  if (map_end > end) munmap(reinterpret_cast<void*>(end), map_end - end);
  void* p = reinterpret_cast<void*>(start);
  // Advice only: failure changes nothing. kAsWritten says so explicitly, so that a system whose
  // transparent huge pages are "always" does not give the region 2 MiB pages either.
#ifdef MADV_HUGEPAGE
  if (pages == ZeroPages::kHuge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
#ifdef MADV_NOHUGEPAGE
  if (pages == ZeroPages::kAsWritten) madvise(p, rounded, MADV_NOHUGEPAGE);
#endif
  (void)pages;
  return std::shared_ptr<void>(p, [rounded](void* q) { munmap(q, rounded); });
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

TensorDesc TensorDesc::contiguous(DType dtype, const Shape& shape) {
  TBOOST_CHECK_CODE(shape.size() <= static_cast<size_t>(kMaxDims), ErrorCode::kShapeMismatch,
                    "tensor rank ", shape.size(), " exceeds the maximum of ", kMaxDims);
  TensorDesc d;
  d.dtype = dtype;
  d.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = d.ndim - 1; i >= 0; --i) {
    TBOOST_CHECK_CODE(shape[static_cast<size_t>(i)] >= 0, ErrorCode::kShapeMismatch,
                      "negative dimension in shape ", shape_to_string(shape));
    d.dims[static_cast<size_t>(i)] = shape[static_cast<size_t>(i)];
    d.strides[static_cast<size_t>(i)] = stride;
    TBOOST_CHECK_CODE(!__builtin_mul_overflow(
                          stride, std::max<int64_t>(shape[static_cast<size_t>(i)], 1), &stride),
                      ErrorCode::kShapeMismatch, "shape ", shape_to_string(shape),
                      " overflows int64 sizes");
  }
  return d;
}

int64_t TensorDesc::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

bool TensorDesc::is_contiguous() const {
  if (numel() == 0) return true;  // no element to address: any strides will do
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    const auto u = static_cast<size_t>(i);
    if (dims[u] != 1 && strides[u] != stride) return false;
    stride *= dims[u];
  }
  return true;
}

int64_t TensorDesc::storage_span() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    last += (dims[u] - 1) * strides[u];
  }
  return last + 1;
}

bool TensorDesc::same_shape(const TensorDesc& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (dims[static_cast<size_t>(i)] != o.dims[static_cast<size_t>(i)]) return false;
  return true;
}

std::string TensorDesc::shape_string() const { return shape_to_string(shape()); }

std::string TensorDesc::to_string() const {
  std::string s = std::string(dtype_name(dtype)) + shape_string();
  if (!is_contiguous()) {
    s += " strides ";
    s += shape_to_string(Shape(strides.begin(), strides.begin() + ndim));
  }
  return s;
}

namespace {
// Bytes of a contiguous tensor of this shape; throws kOutOfMemory, naming it, when too large.
size_t alloc_bytes(const TensorDesc& d, const Shape& shape) {
  const int64_t n = d.numel();
  TBOOST_CHECK_CODE(n <= (int64_t{1} << 60) / static_cast<int64_t>(dtype_size(d.dtype)),
                    ErrorCode::kOutOfMemory, "tensor ", shape_to_string(shape), " of ",
                    dtype_name(d.dtype), " is too large to allocate");
  return static_cast<size_t>(n) * dtype_size(d.dtype);
}
}  // namespace

Tensor Tensor::empty(DType dtype, const Shape& shape) {
  Tensor t;
  t.desc_ = TensorDesc::contiguous(dtype, shape);
  t.storage_ = aligned_buffer(alloc_bytes(t.desc_, shape));
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(DType dtype, const Shape& shape, ZeroPages pages) {
  Tensor t;
  t.desc_ = TensorDesc::contiguous(dtype, shape);
  t.storage_ = zeroed_buffer(alloc_bytes(t.desc_, shape), pages);
  t.data_ = t.storage_.get();
  return t;
}

static int norm_dim(int dim, int ndim) {
  const int d = dim < 0 ? dim + ndim : dim;
  TBOOST_CHECK_CODE(d >= 0 && d < ndim, ErrorCode::kShapeMismatch, "dimension ", dim,
                    " out of range for rank ", ndim);
  return d;
}

Tensor Tensor::slice(int dim, int64_t start, int64_t length) const {
  const int d = norm_dim(dim, desc_.ndim);
  const auto u = static_cast<size_t>(d);
  TBOOST_CHECK_CODE(start >= 0 && length >= 0 && start + length <= desc_.dims[u],
                    ErrorCode::kShapeMismatch, "slice [", start, ", ", start + length,
                    ") out of range for dim ", d, " of size ", desc_.dims[u]);
  Tensor t = *this;
  t.desc_.dims[u] = length;
  t.data_ = static_cast<char*>(data_) +
            start * desc_.strides[u] * static_cast<int64_t>(dtype_size(desc_.dtype));
  return t;
}

Tensor Tensor::transpose(int dim0, int dim1) const {
  const auto a = static_cast<size_t>(norm_dim(dim0, desc_.ndim));
  const auto b = static_cast<size_t>(norm_dim(dim1, desc_.ndim));
  Tensor t = *this;
  std::swap(t.desc_.dims[a], t.desc_.dims[b]);
  std::swap(t.desc_.strides[a], t.desc_.strides[b]);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  TBOOST_CHECK_CODE(is_contiguous(), ErrorCode::kShapeMismatch,
                    "reshape needs contiguous data, got ", desc_.to_string());
  Tensor t = *this;
  t.desc_ = TensorDesc::contiguous(desc_.dtype, shape);
  TBOOST_CHECK_CODE(t.desc_.numel() == numel(), ErrorCode::kShapeMismatch, "reshape from ",
                    desc_.shape_string(), " to ", shape_to_string(shape),
                    " changes the element count");
  return t;
}

Tensor Tensor::contiguous_copy() const {
  Tensor t = empty(desc_.dtype, shape());
  const int64_t n = numel();
  const size_t es = dtype_size(desc_.dtype);
  Shape idx(static_cast<size_t>(desc_.ndim), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int d = 0; d < desc_.ndim; ++d)
      off += idx[static_cast<size_t>(d)] * desc_.strides[static_cast<size_t>(d)];
    std::memcpy(static_cast<char*>(t.data_) + static_cast<size_t>(i) * es,
                static_cast<const char*>(data_) + off * static_cast<int64_t>(es), es);
    for (int d = desc_.ndim - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < desc_.dims[static_cast<size_t>(d)]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  return t;
}

static int64_t flat_offset(const TensorDesc& d, const Shape& index) {
  TBOOST_CHECK_CODE(static_cast<int>(index.size()) == d.ndim, ErrorCode::kShapeMismatch,
                    "index of rank ", index.size(), " for tensor of rank ", d.ndim);
  int64_t off = 0;
  for (int i = 0; i < d.ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    TBOOST_CHECK_CODE(index[u] >= 0 && index[u] < d.dims[u], ErrorCode::kShapeMismatch, "index ",
                      shape_to_string(index), " out of range for ", d.shape_string());
    off += index[u] * d.strides[u];
  }
  return off;
}

double Tensor::get(const Shape& index) const {
  return load_as_f64(data_, desc_.dtype, flat_offset(desc_, index));
}

void Tensor::set(const Shape& index, double v) {
  store_from_f64(data_, desc_.dtype, flat_offset(desc_, index), v);
}

}  // namespace tboost
