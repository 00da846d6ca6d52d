// OpBase<Param>: the shared half of every Operation.
//
// It owns the Param, implements update/param, and makes setup and execute follow the contract:
// params validated, inputs validated through infer_shape (which every op writes to throw on
// bad input), data pointers checked, outputs compared against the inferred descriptors, and
// only then the op's own do_setup. execute re-runs that validation whenever the pack's
// descriptors differ from the last setup, so nothing is written on bad input.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "src/kernels/cpu/kernels.h"
#include "tboost/core/error.h"
#include "tboost/ops/operation.h"

namespace tboost::ops_internal {

// Error builder for one op: every message starts with the op's name.
class Checker {
 public:
  explicit Checker(const char* op) : op_(op) {}
  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const;
  void count(const std::vector<TensorDesc>& in, size_t expected, const std::string& names) const;
  void rank(int idx, const char* role, const TensorDesc& d, int min_rank, int max_rank) const;
  void dtype_in(int idx, const char* role, const TensorDesc& d,
                std::initializer_list<DType> allowed) const;
  void dtype_eq(int idx, const char* role, const TensorDesc& d, DType expected,
                const char* why = nullptr) const;
  void shape_eq(int idx, const char* role, const TensorDesc& d, const Shape& expected) const;
  void dim_eq(int idx, const char* role, const TensorDesc& d, int axis, int64_t expected,
              const char* what = nullptr) const;
  void last_dim_contiguous(int idx, const char* role, const TensorDesc& d) const;
  // axis resolved against `rank` (negative counts from the end); throws an invalid-param
  // error naming the range and `who` (the tensor whose rank it is) when outside.
  int axis(int64_t axis, int rank, const std::string& who) const;
  void param(bool ok, const std::string& msg) const {
    if (!ok) fail(ErrorCode::kInvalidArgument, "invalid param: " + msg);
  }
  const char* op() const { return op_; }

 private:
  const char* op_;
};

std::vector<TensorDesc> descs_of(const std::vector<Tensor>& ts);
// Rank 0..8, dims >= 0, strides >= 0, element count and byte span within int64.
void check_desc(const Checker& chk, const TensorDesc& d, const std::string& who);
// Byte ranges of two views intersect / two views are the same elements in the same order.
bool overlaps(const Tensor& a, const Tensor& b);
bool same_view(const Tensor& a, const Tensor& b);
bool same_descs(const std::vector<Tensor>& ts, const std::vector<TensorDesc>& ds);

template <class P>
class OpBase : public Operation {
 public:
  explicit OpBase(const P& p) : param_(p) {}

  void update(const AnyParam& p) override {
    const P* q = std::get_if<P>(&p);
    if (!q) Checker(name()).fail(ErrorCode::kInvalidArgument, "update() given another op's Param");
    param_ = *q;
    ready_ = false;
  }
  AnyParam param() const override { return param_; }
  std::string impl_info() const override { return impl_; }

  // Descriptor sanity (rank, dims, strides, sizes) for every op, then the op's own rules.
  std::vector<TensorDesc> infer_shape(const std::vector<TensorDesc>& inputs) const final {
    const Checker chk(name());
    for (size_t i = 0; i < inputs.size(); ++i)
      check_desc(chk, inputs[i], "input " + std::to_string(i) + " (" + input_role(i) + ")");
    return do_infer_shape(inputs);
  }

  size_t setup(const VariantPack& pack, Context& ctx) final {
    ready_ = false;
    const Checker chk(name());
    validate_param(chk);
    const std::vector<TensorDesc> in = descs_of(pack.inputs);
    const std::vector<TensorDesc> expected = infer_shape(in);
    for (size_t i = 0; i < pack.outputs.size(); ++i)
      check_desc(chk, pack.outputs[i].desc(),
                 "output " + std::to_string(i) + " (" + output_role(i) + ")");
    for (size_t i = 0; i < pack.inputs.size(); ++i)
      if (pack.inputs[i].numel() > 0 && pack.inputs[i].data() == nullptr)
        chk.fail(ErrorCode::kNullData, "input " + std::to_string(i) + " (" + input_role(i) + ") " +
                                           in[i].to_string() + " has no data pointer");
    if (pack.outputs.size() != expected.size())
      chk.fail(ErrorCode::kInvalidArgument, "expected " + std::to_string(expected.size()) +
                                                " outputs, got " +
                                                std::to_string(pack.outputs.size()));
    for (size_t i = 0; i < expected.size(); ++i) {
      const TensorDesc& o = pack.outputs[i].desc();
      if (!o.same_shape(expected[i]) || o.dtype != expected[i].dtype)
        chk.fail(
            o.dtype != expected[i].dtype ? ErrorCode::kDTypeMismatch : ErrorCode::kShapeMismatch,
            "output " + std::to_string(i) + " (" + output_role(i) + ") expected " +
                expected[i].to_string() + ", got " + o.to_string());
      if (o.numel() > 0 && pack.outputs[i].data() == nullptr)
        chk.fail(ErrorCode::kNullData,
                 "output " + std::to_string(i) + " (" + output_role(i) + ") has no data pointer");
    }
    check_aliasing(chk, pack);
    ws_ = do_setup(pack, ctx, chk);
    in_ = in;
    out_ = descs_of(pack.outputs);
    ready_ = true;
    return ws_;
  }

  void execute(const VariantPack& pack, void* workspace, size_t workspace_size,
               Context& ctx) final {
    if (!ready_ || !same_descs(pack.inputs, in_) || !same_descs(pack.outputs, out_)) {
      setup(pack, ctx);
    } else {
      const Checker chk(name());
      for (size_t i = 0; i < pack.inputs.size(); ++i)
        if (pack.inputs[i].numel() > 0 && pack.inputs[i].data() == nullptr)
          chk.fail(ErrorCode::kNullData,
                   "input " + std::to_string(i) + " (" + input_role(i) + ") has no data pointer");
      for (size_t i = 0; i < pack.outputs.size(); ++i)
        if (pack.outputs[i].numel() > 0 && pack.outputs[i].data() == nullptr)
          chk.fail(ErrorCode::kNullData,
                   "output " + std::to_string(i) + " (" + output_role(i) + ") has no data pointer");
    }
    check_aliasing(Checker(name()), pack);  // pointers may change without the shapes changing
    if (workspace_size < ws_ || (ws_ > 0 && workspace == nullptr))
      Checker(name()).fail(ErrorCode::kInvalidArgument,
                           "workspace of " + std::to_string(workspace_size) +
                               " bytes given, setup asked for " + std::to_string(ws_));
    DenormalGuard guard(ctx.flush_denormals());
    do_execute(pack, workspace, ctx);
  }

 protected:
  virtual std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& inputs) const = 0;
  virtual void validate_param(const Checker& chk) const {}
  // How input i may share memory with an output. Default: only as the identical view (every
  // elementwise-style kernel reads element j before writing element j). An op that stages an
  // input before writing (Linear's x and residual) says kAny; one that reads an input after it
  // starts writing (Linear's weight and bias) says kNone.
  enum class Overlap { kSameViewOnly, kAny, kNone };
  virtual Overlap input_overlap(size_t input) const { return Overlap::kSameViewOnly; }
  virtual size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) { return 0; }
  virtual void do_execute(const VariantPack& pack, void* workspace, Context& ctx) = 0;
  virtual std::string input_role(size_t i) const { return "#" + std::to_string(i); }
  virtual std::string output_role(size_t i) const { return "#" + std::to_string(i); }

  P param_;
  std::string impl_;

 private:
  // Outputs: no stride-0 (self-overlapping) dims, no overlap with each other, and an overlap
  // with an input only as the identical view (element i read, then element i written: every
  // kernel here is safe in place). Anything else would make results depend on thread timing.
  void check_aliasing(const Checker& chk, const VariantPack& pack) const {
    for (size_t o = 0; o < pack.outputs.size(); ++o) {
      const Tensor& y = pack.outputs[o];
      const std::string who = "output " + std::to_string(o) + " (" + output_role(o) + ")";
      for (int d = 0; d < y.ndim(); ++d)
        if (y.dim(d) > 1 && y.stride(d) == 0)
          chk.fail(ErrorCode::kInvalidArgument,
                   who + " has a broadcast (stride 0) dim " + std::to_string(d) + ": " +
                       y.desc().to_string() + "; outputs must not overlap themselves");
      for (size_t k = o + 1; k < pack.outputs.size(); ++k)
        if (overlaps(y, pack.outputs[k]))
          chk.fail(ErrorCode::kInvalidArgument,
                   who + " overlaps output " + std::to_string(k) + " (" + output_role(k) + ")");
      for (size_t i = 0; i < pack.inputs.size(); ++i) {
        const Overlap rule = input_overlap(i);
        if (rule == Overlap::kAny || !overlaps(y, pack.inputs[i])) continue;
        if (rule == Overlap::kSameViewOnly && same_view(y, pack.inputs[i])) continue;
        chk.fail(ErrorCode::kInvalidArgument,
                 who + " " + y.desc().to_string() + " overlaps input " + std::to_string(i) + " (" +
                     input_role(i) + ") " + pack.inputs[i].desc().to_string() +
                     (rule == Overlap::kNone
                          ? ", which is read while the output is written: use separate memory"
                          : " without being the same view (in place: pass the input itself)"));
      }
    }
  }

  bool ready_ = false;
  std::vector<TensorDesc> in_, out_;
  size_t ws_ = 0;
};

// Numpy broadcasting of two shapes (right-aligned; a missing dim counts as 1; each pair must be
// equal or contain a 1). False when they do not broadcast; *bad then says which dim (counted
// from the end, 1 = last) disagrees.
bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out, int* bad);
// Descriptor of `in` broadcast to `out_shape` (right-aligned; size-1 or missing dims get
// stride 0). The caller has checked that the shapes are compatible.
TensorDesc broadcast_to(const TensorDesc& in, const Shape& out_shape);
// Views of one shape made as flat as they can be walked together: size-1 dims dropped and
// neighbours merged where every view allows (kernels::coalesce_dims). If that leaves a last
// dim that is not contiguous in every view (stride 1, or 0 for an input broadcast along it),
// a unit last dim is appended so row views stay valid. Up to 4 views; the first sets the dims.
void coalesce_views(std::initializer_list<TensorDesc*> views);

// kernels::strided_copy arguments for y = x, two views of one shape (y's dims are used).
kernels::CopyArgs copy_args(void* y, const TensorDesc& yd, const void* x, const TensorDesc& xd,
                            int threads);

using kernels::RowView;
RowView row_view(const TensorDesc& d);
// Each element of d as a row of one column: offset(i) is element i's offset (row-major i).
RowView element_view(const TensorDesc& d);

}  // namespace tboost::ops_internal
