// Gather, Where and Compare (include/tboost/ops/select.h): the mask and index arithmetic of
// exported graphs. These run on small tensors (masks (B, 1, S, S), ids), once per forward, so
// they are plain element loops over strided views rather than vector kernels: generality
// (any dtype, any broadcast) matters here, bandwidth does not.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "src/core/parallel.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"

namespace tboost::ops_internal {
namespace {

// numpy broadcast of descriptors' shapes; fails naming both inputs.
Shape broadcast_shapes(const Checker& chk, const std::vector<TensorDesc>& in,
                       const std::vector<const char*>& roles) {
  size_t r = 0;
  for (const TensorDesc& d : in) r = std::max(r, static_cast<size_t>(d.ndim));
  Shape s(r, 1);
  for (size_t k = 0; k < in.size(); ++k)
    for (int i = 1; i <= in[k].ndim; ++i) {
      const int64_t d = in[k].dim(-i);
      int64_t& o = s[r - static_cast<size_t>(i)];
      if (d == o || d == 1) continue;
      if (o != 1)
        chk.fail(ErrorCode::kShapeMismatch, std::string("input ") + std::to_string(k) + " (" +
                                                roles[k] + ") " + in[k].shape_string() +
                                                " does not broadcast with the other inputs");
      o = d;
    }
  return s;
}

// Element offset of the flat (row-major) index `i` of `shape` in a view broadcast onto it.
int64_t offset_of(int64_t i, const Shape& shape, const TensorDesc& d) {
  int64_t off = 0;
  for (size_t k = shape.size(); k-- > 0;) {
    const int64_t c = i % shape[k];
    i /= shape[k];
    const int j = static_cast<int>(k) - static_cast<int>(shape.size()) + d.ndim;
    if (j >= 0 && d.dim(j) != 1) off += c * d.stride(j);
  }
  return off;
}

double load(const void* base, DType t, int64_t off) { return load_as_f64(base, t, off); }

// Every op here writes y element by element in row-major order.
void require_contiguous_y(const VariantPack& pack, const Checker& chk) {
  if (!pack.outputs[0].is_contiguous())
    chk.fail(ErrorCode::kInvalidArgument,
             "output 0 (y) must be contiguous, got " + pack.outputs[0].desc().to_string());
}

constexpr int64_t kMinPerThread = 1 << 14;

class GatherOp : public OpBase<ops::GatherParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Gather"; }
  bool checks_input_values() const override { return true; }  // indices
  std::string input_role(size_t i) const override { return i == 0 ? "data" : "indices"; }
  std::string output_role(size_t) const override { return "y"; }
  Overlap input_overlap(size_t) const override { return Overlap::kNone; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, 2, "data, indices");
    chk.rank(0, "data", in[0], 1, kMaxDims);
    chk.dtype_in(1, "indices", in[1], {DType::kI32, DType::kI64});
    const int a = chk.axis(param_.axis, in[0].ndim, "axis on input 0 (data)");
    Shape s;
    for (int i = 0; i < a; ++i) s.push_back(in[0].dim(i));
    for (int i = 0; i < in[1].ndim; ++i) s.push_back(in[1].dim(i));
    for (int i = a + 1; i < in[0].ndim; ++i) s.push_back(in[0].dim(i));
    if (s.size() > static_cast<size_t>(kMaxDims))
      chk.fail(ErrorCode::kShapeMismatch, "output would have more than 8 dims");
    return {TensorDesc::contiguous(in[0].dtype, s)};
  }

  size_t do_setup(const VariantPack& pack, Context&, const Checker& chk) override {
    require_contiguous_y(pack, chk);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& data = pack.inputs[0];
    const Tensor& idx = pack.inputs[1];
    const Tensor& y = pack.outputs[0];
    const int a = Checker(name()).axis(param_.axis, data.ndim(), "axis");
    const int64_t n = data.dim(a);
    // Every index first: nothing is written when one is out of range.
    const int64_t ni = idx.numel();
    std::vector<int64_t> ix(static_cast<size_t>(ni));
    const Shape is = idx.shape();
    for (int64_t i = 0; i < ni; ++i) {
      // Indices read as integers (a double would not hold every int64).
      const char* ip = static_cast<const char*>(idx.data()) +
                       offset_of(i, is, idx.desc()) * static_cast<int64_t>(dtype_size(idx.dtype()));
      int64_t v = 0;
      if (idx.dtype() == DType::kI64) {
        std::memcpy(&v, ip, 8);
      } else {
        int32_t w;
        std::memcpy(&w, ip, 4);
        v = w;
      }
      if (v < -n || v >= n)
        Checker(name()).fail(ErrorCode::kInvalidArgument,
                             "input 1 (indices) element " + std::to_string(i) + " = " +
                                 std::to_string(v) + " is out of range for data dim " +
                                 std::to_string(a) + " of size " + std::to_string(n));
      ix[static_cast<size_t>(i)] = v < 0 ? v + n : v;
    }
    const Shape ys = y.shape();
    const size_t es = dtype_size(y.dtype());
    const int ir = idx.ndim();
    parallel_for(
        ctx.num_threads(), y.numel(), kMinPerThread, ctx.flush_denormals(),
        [&](int64_t b, int64_t e) {
          std::vector<int64_t> c(ys.size());
          for (int64_t i = b; i < e; ++i) {
            int64_t r = i;
            for (size_t k = ys.size(); k-- > 0;) {
              c[k] = r % ys[k];
              r /= ys[k];
            }
            // y index: data dims before a, index dims, data dims after a.
            int64_t flat_idx = 0;
            for (int k = 0; k < ir; ++k)
              flat_idx = flat_idx * idx.dim(k) + c[static_cast<size_t>(a + k)];
            int64_t off = 0;
            for (int k = 0; k < a; ++k) off += c[static_cast<size_t>(k)] * data.stride(k);
            off += ix[static_cast<size_t>(flat_idx)] * data.stride(a);
            for (int k = a + 1; k < data.ndim(); ++k)
              off += c[static_cast<size_t>(k - 1 + ir)] * data.stride(k);
            std::memcpy(static_cast<char*>(y.data()) + i * static_cast<int64_t>(es),
                        static_cast<const char*>(data.data()) + off * static_cast<int64_t>(es), es);
          }
        });
  }
};

class WhereOp : public OpBase<ops::WhereParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Where"; }
  std::string input_role(size_t i) const override { return i == 0 ? "cond" : (i == 1 ? "x" : "z"); }
  std::string output_role(size_t) const override { return "y"; }
  Overlap input_overlap(size_t) const override { return Overlap::kNone; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, 3, "cond, x, z");
    chk.dtype_eq(0, "cond", in[0], DType::kU8, "bool as u8");
    chk.dtype_eq(2, "z", in[2], in[1].dtype, "same as x");
    return {TensorDesc::contiguous(in[1].dtype, broadcast_shapes(chk, in, {"cond", "x", "z"}))};
  }

  size_t do_setup(const VariantPack& pack, Context&, const Checker& chk) override {
    require_contiguous_y(pack, chk);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& c = pack.inputs[0];
    const Tensor& x = pack.inputs[1];
    const Tensor& z = pack.inputs[2];
    const Tensor& y = pack.outputs[0];
    const Shape ys = y.shape();
    const int64_t es = static_cast<int64_t>(dtype_size(y.dtype()));
    parallel_for(
        ctx.num_threads(), y.numel(), kMinPerThread, ctx.flush_denormals(),
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            const bool t =
                static_cast<const unsigned char*>(c.data())[offset_of(i, ys, c.desc())] != 0;
            const Tensor& s = t ? x : z;
            std::memcpy(static_cast<char*>(y.data()) + i * es,
                        static_cast<const char*>(s.data()) + offset_of(i, ys, s.desc()) * es,
                        static_cast<size_t>(es));
          }
        });
  }
};

class CompareOp : public OpBase<ops::CompareParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Compare"; }
  std::string input_role(size_t i) const override { return i == 0 ? "a" : "b"; }
  std::string output_role(size_t) const override { return "y"; }
  Overlap input_overlap(size_t) const override { return Overlap::kNone; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    const bool unary = param_.type == ops::CompareType::kNot;
    chk.count(in, unary ? 1 : 2, unary ? "a" : "a, b");
    return {TensorDesc::contiguous(DType::kU8, broadcast_shapes(chk, in, {"a", "b"}))};
  }

  size_t do_setup(const VariantPack& pack, Context&, const Checker& chk) override {
    require_contiguous_y(pack, chk);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& a = pack.inputs[0];
    const Tensor& b = pack.inputs.size() > 1 ? pack.inputs[1] : pack.inputs[0];
    const Tensor& y = pack.outputs[0];
    const Shape ys = y.shape();
    const ops::CompareType t = param_.type;
    parallel_for(ctx.num_threads(), y.numel(), kMinPerThread, ctx.flush_denormals(),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t i = lo; i < hi; ++i) {
                     const double u = load(a.data(), a.dtype(), offset_of(i, ys, a.desc()));
                     const double v = load(b.data(), b.dtype(), offset_of(i, ys, b.desc()));
                     bool r = false;
                     switch (t) {
                       case ops::CompareType::kEqual:
                         r = u == v;
                         break;
                       case ops::CompareType::kLess:
                         r = u < v;
                         break;
                       case ops::CompareType::kLessEqual:
                         r = u <= v;
                         break;
                       case ops::CompareType::kGreater:
                         r = u > v;
                         break;
                       case ops::CompareType::kGreaterEqual:
                         r = u >= v;
                         break;
                       case ops::CompareType::kAnd:
                         r = u != 0 && v != 0;
                         break;
                       case ops::CompareType::kOr:
                         r = u != 0 || v != 0;
                         break;
                       case ops::CompareType::kXor:
                         r = (u != 0) != (v != 0);
                         break;
                       case ops::CompareType::kNot:
                         r = u == 0;
                         break;
                     }
                     static_cast<unsigned char*>(y.data())[i] = r ? 1 : 0;
                   }
                 });
  }
};

}  // namespace

std::unique_ptr<Operation> make_gather(const ops::GatherParam& p) {
  return std::make_unique<GatherOp>(p);
}
std::unique_ptr<Operation> make_where(const ops::WhereParam& p) {
  return std::make_unique<WhereOp>(p);
}
std::unique_ptr<Operation> make_compare(const ops::CompareParam& p) {
  return std::make_unique<CompareOp>(p);
}

}  // namespace tboost::ops_internal

namespace tboost::ops {
const char* compare_type_name(CompareType t) {
  switch (t) {
    case CompareType::kEqual:
      return "equal";
    case CompareType::kLess:
      return "less";
    case CompareType::kLessEqual:
      return "less_equal";
    case CompareType::kGreater:
      return "greater";
    case CompareType::kGreaterEqual:
      return "greater_equal";
    case CompareType::kAnd:
      return "and";
    case CompareType::kOr:
      return "or";
    case CompareType::kXor:
      return "xor";
    case CompareType::kNot:
      return "not";
  }
  return "?";
}
}  // namespace tboost::ops
