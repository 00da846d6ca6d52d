// TensorDesc and Tensor: up to 8 dims, int64 strides counted in elements.
//
// A Tensor is a descriptor plus a data pointer. It is either a non-owning view over memory the
// caller owns, or it shares ownership of a 64-byte-aligned buffer (Tensor::empty). Views
// (slice, transpose, reshape of contiguous data) never copy. Kernels require the last dim of
// most operands to be contiguous (stride 1); ops say so in their validation errors.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tboost/core/dtype.h"

namespace tboost {

inline constexpr int kMaxDims = 8;
using Shape = std::vector<int64_t>;

// The pages of large zero-filled memory (Tensor::zeros, zeroed_buffer), each committed when
// first written. kHuge: 2 MiB pages advised, for memory written whole soon after and then
// streamed (weights, optimizer state). kAsWritten: 4 KiB pages, for memory written a little at
// a time (a KV cache, a token per step). On these VMs, after the host had been idle, a first
// write to a 2 MiB page took about 5 ms: with a KV cache on huge pages, SmolLM2-135M's first
// 16-token prompt took 0.50-0.62 s (its cache writes 283 ms for 60 such pages, one per layer's
// k and v) against 0.03-0.05 s on 4 KiB pages, and decode at depth 1900-4096 was within the
// noise either way (3 pairs each; bench/RESULTS.md, twenty-eighth session). Below 4 MiB the
// memory is memset, committed at once, whatever `pages` says.
enum class ZeroPages { kHuge, kAsWritten };

struct TensorDesc {
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> dims{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  // Row-major contiguous descriptor. Throws on more than kMaxDims dims or negative sizes.
  static TensorDesc contiguous(DType dtype, const Shape& shape);
  static TensorDesc contiguous(DType dtype, std::initializer_list<int64_t> shape) {
    return contiguous(dtype, Shape(shape));
  }

  int64_t numel() const;
  int64_t dim(int i) const { return dims[static_cast<size_t>(i < 0 ? i + ndim : i)]; }
  int64_t stride(int i) const { return strides[static_cast<size_t>(i < 0 ? i + ndim : i)]; }
  Shape shape() const { return Shape(dims.begin(), dims.begin() + ndim); }
  bool is_contiguous() const;
  // Span in elements from the first to one past the last addressed element.
  int64_t storage_span() const;
  bool same_shape(const TensorDesc& o) const;
  // "bf16[2,3,5] strides [15,5,1]"-style text for messages.
  std::string to_string() const;
  std::string shape_string() const;
};

// Formats a shape as "[2,3,5]".
std::string shape_to_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // Non-owning view.
  Tensor(const TensorDesc& desc, void* data) : desc_(desc), data_(data) {}

  // Owning, 64-byte aligned, contiguous, uninitialized.
  static Tensor empty(DType dtype, const Shape& shape);
  // Owning and zero-filled. Large ones (4 MiB and up) are fresh zero pages from the OS that
  // take memory only where they are first touched: a KV cache sized for a model's whole
  // context costs only the tokens written to it (pages: see ZeroPages).
  static Tensor zeros(DType dtype, const Shape& shape, ZeroPages pages = ZeroPages::kHuge);
  static Tensor view(void* data, DType dtype, const Shape& shape) {
    return Tensor(TensorDesc::contiguous(dtype, shape), data);
  }

  const TensorDesc& desc() const { return desc_; }
  DType dtype() const { return desc_.dtype; }
  int ndim() const { return desc_.ndim; }
  int64_t dim(int i) const { return desc_.dim(i); }
  int64_t stride(int i) const { return desc_.stride(i); }
  Shape shape() const { return desc_.shape(); }
  int64_t numel() const { return desc_.numel(); }
  bool is_contiguous() const { return desc_.is_contiguous(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool owns_data() const { return static_cast<bool>(storage_); }

  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }

  // Views that share storage.
  Tensor slice(int dim, int64_t start, int64_t length) const;
  Tensor transpose(int dim0, int dim1) const;
  Tensor reshape(const Shape& shape) const;  // requires contiguous data
  // Deep copy into a new contiguous buffer.
  Tensor contiguous_copy() const;

  // Element access as double (slow; tests, references, debugging).
  double get(const Shape& index) const;
  void set(const Shape& index, double v);

 private:
  TensorDesc desc_;
  void* data_ = nullptr;
  std::shared_ptr<void> storage_;
};

// Allocates 64-byte-aligned memory; throws kOutOfMemory with the size on failure.
std::shared_ptr<void> aligned_buffer(size_t bytes);
// Zero-filled, 64-byte-aligned memory. From 4 MiB on, fresh anonymous pages (2 MiB aligned):
// no memset, and resident only once touched, a page at a time (ZeroPages).
std::shared_ptr<void> zeroed_buffer(size_t bytes, ZeroPages pages = ZeroPages::kHuge);

// Inputs and outputs of one op invocation. The caller owns all of them.
struct VariantPack {
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
};

}  // namespace tboost
