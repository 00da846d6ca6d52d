// ONNX import (see include/tboost/graph/onnx.h).
//
// One walk over the nodes in file order (ONNX requires topological order). Every value is
// either a constant (an initializer, a Constant node, or anything computed only from
// constants and shapes: evaluated here in float64 by a small interpreter) or a runtime tensor
// of the graph being built, whose descriptor is known because the symbolic dims are bound.
#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <unordered_map>

#include "tboost/core/error.h"
#include "tboost/graph/onnx.h"

namespace tboost::graph {
namespace {

using ops::ElementwiseType;

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, "ONNX import: " + msg);
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

DType dtype_of(int32_t t, const std::string& who) {
  switch (t) {
    case onnx::TensorProto::FLOAT:
    case onnx::TensorProto::DOUBLE:  // computed and stored as f32
      return DType::kF32;
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL:
      return DType::kU8;
    case onnx::TensorProto::INT8:
      return DType::kI8;
    case onnx::TensorProto::INT32:
      return DType::kI32;
    case onnx::TensorProto::INT64:
      return DType::kI64;
    case onnx::TensorProto::FLOAT16:
      return DType::kF16;
    case onnx::TensorProto::BFLOAT16:
      return DType::kBF16;
    default:
      fail(ErrorCode::kUnsupported,
           who + ": tensor element type " + std::to_string(t) + " is not supported");
  }
}

// A constant in float64 (shapes, indices, masks, scalars: small tensors) with its dtype.
struct Lit {
  Shape shape;
  DType dt = DType::kF32;
  std::vector<double> v;
};

double get_d(const Tensor& t, int64_t i) { return load_as_f64(t.data(), t.dtype(), i); }

Lit to_lit(const Tensor& t) {
  Lit l{t.shape(), t.dtype(), std::vector<double>(static_cast<size_t>(t.numel()))};
  const Tensor c = t.is_contiguous() ? t : t.contiguous_copy();
  for (int64_t i = 0; i < c.numel(); ++i) l.v[static_cast<size_t>(i)] = get_d(c, i);
  return l;
}

Tensor to_tensor(const Lit& l, DType dt) {
  Tensor t = Tensor::empty(dt, l.shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    char* p = static_cast<char*>(t.data()) + i * static_cast<int64_t>(dtype_size(dt));
    const double v = l.v[static_cast<size_t>(i)];
    switch (dt) {
      case DType::kI64: {
        const int64_t x =
            v >= 9.2e18 ? INT64_MAX : (v <= -9.2e18 ? INT64_MIN : static_cast<int64_t>(v));
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::kI32: {
        const auto x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kU8:
        *p = static_cast<char>(static_cast<unsigned char>(v));
        break;
      case DType::kI8:
        *p = static_cast<char>(static_cast<signed char>(v));
        break;
      default: {
        const auto f = static_cast<float>(v);
        convert(p, dt, &f, DType::kF32, 1);
      }
    }
  }
  return t;
}

Tensor read_tensor(const onnx::TensorProto& tp) {
  const std::string who = "tensor '" + tp.name() + "'";
  if (tp.data_location() == onnx::TensorProto::EXTERNAL)
    fail(ErrorCode::kUnsupported,
         who + " uses external data; save the model with its weights inside");
  Shape shape;
  int64_t n = 1;
  for (int64_t d : tp.dims()) {
    if (d < 0) fail(ErrorCode::kInvalidArgument, who + " has a negative dim");
    if (d > 0 && n > (int64_t{1} << 40) / d)
      fail(ErrorCode::kInvalidArgument, who + " has more than 2^40 elements");
    n *= d;
    shape.push_back(d);
  }
  if (shape.size() > static_cast<size_t>(kMaxDims))
    fail(ErrorCode::kUnsupported, who + " has more than 8 dims");
  const DType dt = dtype_of(tp.data_type(), who);
  const bool is_double = tp.data_type() == onnx::TensorProto::DOUBLE;
  // The data must be there before memory is taken for it (a 100-byte file may declare 16 GiB).
  const int64_t have = tp.has_raw_data() ? static_cast<int64_t>(tp.raw_data().size()) /
                                               static_cast<int64_t>(is_double ? 8 : dtype_size(dt))
                                         : std::max({static_cast<int64_t>(tp.float_data_size()),
                                                     static_cast<int64_t>(tp.double_data_size()),
                                                     static_cast<int64_t>(tp.int64_data_size()),
                                                     static_cast<int64_t>(tp.int32_data_size())});
  if (have < n)
    fail(ErrorCode::kInvalidArgument, who + " holds " + std::to_string(have) +
                                          " values, its shape " + shape_to_string(shape) +
                                          " needs " + std::to_string(n));
  Tensor t = Tensor::empty(dt, shape);
  if (tp.has_raw_data()) {
    const std::string& raw = tp.raw_data();
    const size_t esz = is_double ? 8 : dtype_size(dt);
    if (raw.size() != static_cast<size_t>(n) * esz)
      fail(ErrorCode::kInvalidArgument, who + ": raw data holds " + std::to_string(raw.size()) +
                                            " bytes, its shape needs " +
                                            std::to_string(n * static_cast<int64_t>(esz)));
    if (is_double) {
      for (int64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, raw.data() + i * 8, 8);
        t.data_as<float>()[i] = static_cast<float>(d);
      }
    } else if (n > 0) {
      std::memcpy(t.data(), raw.data(), raw.size());
    }
    return t;
  }
  auto need = [&](int64_t have) {
    if (have != n)
      fail(ErrorCode::kInvalidArgument, who + " holds " + std::to_string(have) +
                                            " values, its shape needs " + std::to_string(n));
  };
  switch (tp.data_type()) {
    case onnx::TensorProto::FLOAT:
      need(tp.float_data_size());
      for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = tp.float_data(static_cast<int>(i));
      break;
    case onnx::TensorProto::DOUBLE:
      need(tp.double_data_size());
      for (int64_t i = 0; i < n; ++i)
        t.data_as<float>()[i] = static_cast<float>(tp.double_data(static_cast<int>(i)));
      break;
    case onnx::TensorProto::INT64:
      need(tp.int64_data_size());
      for (int64_t i = 0; i < n; ++i) t.data_as<int64_t>()[i] = tp.int64_data(static_cast<int>(i));
      break;
    default:  // int32, int8, uint8, bool, f16, bf16: in int32_data (16-bit types as their bits)
      need(tp.int32_data_size());
      for (int64_t i = 0; i < n; ++i) {
        const int32_t v = tp.int32_data(static_cast<int>(i));
        char* p = static_cast<char*>(t.data()) + i * static_cast<int64_t>(dtype_size(dt));
        if (dtype_size(dt) == 4) {
          std::memcpy(p, &v, 4);
        } else if (dtype_size(dt) == 2) {
          const auto b = static_cast<uint16_t>(v);
          std::memcpy(p, &b, 2);
        } else {
          *p = static_cast<char>(v);
        }
      }
  }
  return t;
}

// numpy broadcast of shapes
Shape broadcast(const Shape& a, const Shape& b, const std::string& who) {
  const size_t r = std::max(a.size(), b.size());
  Shape s(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    const int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    if (da != db && da != 1 && db != 1)
      fail(ErrorCode::kShapeMismatch, who + ": shapes " + shape_to_string(a) + " and " +
                                          shape_to_string(b) + " do not broadcast");
    s[i] = da == 1 ? db : da;
  }
  return s;
}

// Index of output element `flat` of shape `out` in a broadcast input of shape `in`.
int64_t bcast_index(int64_t flat, const Shape& out, const Shape& in) {
  int64_t idx = 0, stride = 1;
  for (size_t k = out.size(); k-- > 0;) {
    const int64_t c = flat % out[k];
    flat /= out[k];
    const size_t off = out.size() - in.size();
    if (k >= off) {
      const int64_t d = in[k - off];
      if (d != 1) idx += c * stride;
      stride *= d;
    }
  }
  return idx;
}

Lit nary(const std::vector<Lit>& in, DType dt, const std::function<double(const double*)>& f,
         const std::string& who) {
  Shape s = in[0].shape;
  for (size_t i = 1; i < in.size(); ++i) s = broadcast(s, in[i].shape, who);
  Lit y{s, dt, std::vector<double>(static_cast<size_t>(numel(s)))};
  std::vector<double> args(in.size());
  for (int64_t i = 0; i < numel(s); ++i) {
    for (size_t k = 0; k < in.size(); ++k)
      args[k] = in[k].v[static_cast<size_t>(bcast_index(i, s, in[k].shape))];
    y.v[static_cast<size_t>(i)] = f(args.data());
  }
  return y;
}

int norm_axis(int64_t a, size_t rank, const std::string& who) {
  const auto r = static_cast<int64_t>(rank);
  if (a < -r || a >= r)
    fail(ErrorCode::kInvalidArgument,
         who + ": axis " + std::to_string(a) + " out of range for rank " + std::to_string(r));
  return static_cast<int>(a < 0 ? a + r : a);
}

// Constants evaluated at import are shapes, ids and masks; anything larger than this is
// refused rather than computed in float64.
constexpr int64_t kMaxConstElements = int64_t{1} << 26;

class Importer {
 public:
  Importer(const onnx::ModelProto& m, const Bindings& dims) : model_(m), dims_(dims) {
    for (const auto& os : m.opset_import())
      if (os.domain().empty() || os.domain() == "ai.onnx") opset_ = os.version();
  }

  Graph run() {
    const onnx::GraphProto& gp = model_.graph();
    for (const auto& init : gp.initializer()) consts_[init.name()] = read_tensor(init);
    for (const auto& in : gp.input()) {
      if (consts_.count(in.name())) continue;  // an initializer listed as input (IR < 4)
      add_input(in);
    }
    for (const auto& n : gp.node()) {
      try {
        node(n);
      } catch (const Error& e) {
        const std::string msg = e.what();
        if (msg.rfind("ONNX import: node", 0) == 0) throw;
        throw Error(e.code(), "ONNX import: node '" + n.name() + "' (" + n.op_type() + "): " + msg);
      }
    }
    for (const auto& o : gp.output()) {
      auto it = rt_.find(o.name());
      if (it == rt_.end())
        fail(ErrorCode::kUnsupported,
             "graph output '" + o.name() +
                 "' is a constant or an input; only computed outputs are supported");
      TensorId id = it->second;
      if (g_.tensor(id).kind != TensorKind::kIntermediate)  // already an output or an input
        id = g_.add1(o.name() + ".copy", ops::TransposeParam{}, {id});
      // ONNX node and value names are separate namespaces: an internal tensor named like this
      // output (after a nameless node) steps aside.
      if (g_.has(o.name()) && g_.id(o.name()) != id) {
        g_.rename(g_.id(o.name()), g_.unique_name(o.name()));
      }
      g_.output(id, o.name());
    }
    g_.validate_and_sort();
    return std::move(g_);
  }

  int64_t opset() const { return opset_; }

 private:
  const onnx::ModelProto& model_;
  Bindings dims_;
  int64_t opset_ = 0;
  Graph g_;
  std::unordered_map<std::string, Tensor> consts_;  // constant values
  std::unordered_map<std::string, TensorId> rt_;    // runtime values
  std::unordered_map<std::string, TensorId> weight_ids_;
  std::map<TensorId, TensorDesc> desc_;
  std::string where_;  // "node 'x' (Op)"

  void add_input(const onnx::ValueInfoProto& in) {
    const auto& tt = in.type().tensor_type();
    const DType dt = dtype_of(tt.elem_type(), "input '" + in.name() + "'");
    SymShape shape;
    int k = 0;
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value()) {
        shape.emplace_back(d.dim_value());
      } else {
        auto it = dims_.find(d.dim_param());
        const char* pos = k == 0 ? "batch" : (k == 1 ? "seq" : nullptr);
        if (it == dims_.end() && pos) it = dims_.find(pos);
        if (it == dims_.end())
          fail(ErrorCode::kInvalidArgument, "input '" + in.name() + "' dim " + std::to_string(k) +
                                                " ('" + d.dim_param() +
                                                "') is symbolic and not bound");
        shape.emplace_back(it->second);
      }
      ++k;
    }
    const TensorId id = g_.input(in.name(), dt == DType::kU8 ? DType::kU8 : dt, shape);
    rt_[in.name()] = id;
    Shape s;
    for (const Dim& d : shape) s.push_back(d.size);
    desc_[id] = TensorDesc::contiguous(dt, s);
  }

  // ---- value access
  bool is_const(const std::string& n) const { return n.empty() || consts_.count(n) != 0; }
  const Tensor& cst(const std::string& n) const {
    auto it = consts_.find(n);
    if (it == consts_.end())
      fail(ErrorCode::kUnsupported, where_ + ": input '" + n + "' must be a constant here");
    return it->second;
  }
  Lit lit(const std::string& n) const { return to_lit(cst(n)); }
  // Integer constants read as integers: INT64_MAX (an exporter's "to the end") does not
  // survive a trip through double.
  std::vector<int64_t> ints(const std::string& n) const {
    const Tensor& t = cst(n);
    const Tensor c = t.is_contiguous() ? t : t.contiguous_copy();
    std::vector<int64_t> v;
    for (int64_t i = 0; i < c.numel(); ++i) {
      if (c.dtype() == DType::kI64) {
        v.push_back(c.data_as<int64_t>()[i]);
      } else if (c.dtype() == DType::kI32) {
        v.push_back(c.data_as<int32_t>()[i]);
      } else {
        v.push_back(static_cast<int64_t>(get_d(c, i)));
      }
    }
    return v;
  }
  const TensorDesc& desc(TensorId id) const { return desc_.at(id); }
  Shape shape_of(const std::string& n) const {
    if (is_const(n)) return cst(n).shape();
    return desc(rt(n)).shape();
  }
  DType dtype_of_value(const std::string& n) const {
    if (is_const(n)) return cst(n).dtype();
    return desc(rt(n)).dtype;
  }
  TensorId rt(const std::string& n) const {
    auto it = rt_.find(n);
    if (it == rt_.end())
      fail(ErrorCode::kInvalidArgument, where_ + ": input '" + n + "' is not defined before use");
    return it->second;
  }
  // A runtime id for any value; constants become weights (converted to `dt` when given).
  TensorId id_of(const std::string& n, DType dt = DType::kU8, bool convert_dt = false) {
    if (!is_const(n)) return rt(n);
    Tensor t = cst(n);
    const std::string key = n + (convert_dt ? std::string("@") + dtype_name(dt) : "");
    auto it = weight_ids_.find(key);
    if (it != weight_ids_.end()) return it->second;
    if (convert_dt && t.dtype() != dt) t = to_tensor(to_lit(t), dt);
    const TensorId id = g_.weight(g_.unique_name(key), t);
    desc_[id] = t.desc();
    weight_ids_[key] = id;
    return id;
  }

  // ---- emitting
  TensorId emit(const std::string& name, const NodeOp& op, const std::vector<TensorId>& in,
                int n_out = 1, std::vector<TensorId>* outs = nullptr) {
    const std::vector<TensorId> o = g_.add(name, op, in, n_out);
    std::vector<TensorDesc> d;
    for (TensorId i : in) d.push_back(desc(i));
    std::vector<TensorDesc> od;
    if (is_view(op)) {
      TensorDesc v;
      int64_t off = 0;
      if (!view_desc(op, d[0], &v, &off))
        v = TensorDesc::contiguous(d[0].dtype, reshape_shape(std::get<Reshape>(op), d[0].shape()));
      od.push_back(v);
    } else {
      od = create_operation(std::get<AnyParam>(op))->infer_shape(d);
    }
    for (size_t k = 0; k < o.size(); ++k) desc_[o[k]] = od[k];
    if (outs) *outs = o;
    return o[0];
  }
  void set_rt(const std::string& name, TensorId id) { rt_[name] = id; }
  void set_const(const std::string& name, Tensor t) { consts_[name] = std::move(t); }

  // ---- attributes
  static const onnx::AttributeProto* attr(const onnx::NodeProto& n, const char* name) {
    for (const auto& a : n.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  static int64_t attr_i(const onnx::NodeProto& n, const char* name, int64_t def) {
    const auto* a = attr(n, name);
    return a ? a->i() : def;
  }
  static float attr_f(const onnx::NodeProto& n, const char* name, float def) {
    const auto* a = attr(n, name);
    return a ? a->f() : def;
  }
  static std::vector<int64_t> attr_ints(const onnx::NodeProto& n, const char* name) {
    const auto* a = attr(n, name);
    if (!a) return {};
    return {a->ints().begin(), a->ints().end()};
  }
  // Axes from an attribute (older opsets) or an optional constant input (newer ones).
  std::vector<int64_t> axes(const onnx::NodeProto& n, int input) const {
    if (n.input_size() > input && !n.input(input).empty()) return ints(n.input(input));
    return attr_ints(n, "axes");
  }

  // ---- shape helpers for views
  TensorId reshape_to(const std::string& name, TensorId x, const Shape& s) {
    return emit(name, Reshape{.shape = std::vector<int64_t>(s.begin(), s.end())}, {x});
  }

  // A shape given as values: non-negative, at most 8 dims, element count bounded.
  Shape checked_shape(const std::vector<double>& v) const {
    Shape s;
    int64_t n = 1;
    if (v.size() > static_cast<size_t>(kMaxDims))
      fail(ErrorCode::kInvalidArgument, where_ + ": more than 8 dims");
    for (double d : v) {
      if (!(d >= 0 && d <= double(kMaxConstElements)))
        fail(ErrorCode::kInvalidArgument,
             where_ + ": dim " + std::to_string(d) + " is negative or too large");
      s.push_back(static_cast<int64_t>(d));
      n *= s.back();
      if (n > kMaxConstElements) fail(ErrorCode::kUnsupported, where_ + ": constant too large");
    }
    return s;
  }

  // starts / ends / axes / steps of a Slice: one entry per sliced axis each.
  void slice_lengths(const std::vector<int64_t>& st, const std::vector<int64_t>& en,
                     const std::vector<int64_t>& ax, const std::vector<int64_t>& sp) const {
    if (en.size() != st.size() || (!ax.empty() && ax.size() != st.size()) ||
        (!sp.empty() && sp.size() != st.size()))
      fail(ErrorCode::kInvalidArgument, where_ + ": starts, ends, axes and steps differ in length");
  }

  // ---- constant evaluation
  bool all_const(const onnx::NodeProto& n) const {
    for (const auto& i : n.input())
      if (!is_const(i)) return false;
    return true;
  }

  // Input count of node n must be in [lo, hi], the first `lo` inputs named, an output named.
  void arity(const onnx::NodeProto& n, int lo, int hi) const {
    if (n.input_size() < lo || n.input_size() > hi)
      fail(ErrorCode::kInvalidArgument, where_ + ": " + std::to_string(n.input_size()) +
                                            " inputs, expected " + std::to_string(lo) +
                                            (hi > lo ? ".." + std::to_string(hi) : ""));
    for (int i = 0; i < lo; ++i)
      if (n.input(i).empty())
        fail(ErrorCode::kInvalidArgument, where_ + ": input " + std::to_string(i) + " is missing");
    if (n.output_size() < 1 || n.output(0).empty())
      fail(ErrorCode::kInvalidArgument, where_ + ": no output");
  }

  void check_arity(const onnx::NodeProto& n) const {
    static const std::map<std::string, std::pair<int, int>> k = {{"Add", {2, 2}},
                                                                 {"Sub", {2, 2}},
                                                                 {"Mul", {2, 2}},
                                                                 {"Div", {2, 2}},
                                                                 {"Pow", {2, 2}},
                                                                 {"Max", {2, 2}},
                                                                 {"Min", {2, 2}},
                                                                 {"Equal", {2, 2}},
                                                                 {"Less", {2, 2}},
                                                                 {"LessOrEqual", {2, 2}},
                                                                 {"Greater", {2, 2}},
                                                                 {"GreaterOrEqual", {2, 2}},
                                                                 {"And", {2, 2}},
                                                                 {"Or", {2, 2}},
                                                                 {"Xor", {2, 2}},
                                                                 {"Not", {1, 1}},
                                                                 {"Neg", {1, 1}},
                                                                 {"Sqrt", {1, 1}},
                                                                 {"Exp", {1, 1}},
                                                                 {"Abs", {1, 1}},
                                                                 {"Tanh", {1, 1}},
                                                                 {"Erf", {1, 1}},
                                                                 {"Reciprocal", {1, 1}},
                                                                 {"Sigmoid", {1, 1}},
                                                                 {"Relu", {1, 1}},
                                                                 {"Where", {3, 3}},
                                                                 {"Cast", {1, 1}},
                                                                 {"Range", {3, 3}},
                                                                 {"ConstantOfShape", {1, 1}},
                                                                 {"Expand", {2, 2}},
                                                                 {"Reshape", {2, 2}},
                                                                 {"Flatten", {1, 1}},
                                                                 {"Squeeze", {1, 2}},
                                                                 {"Unsqueeze", {1, 2}},
                                                                 {"Concat", {1, 1 << 20}},
                                                                 {"Gather", {2, 2}},
                                                                 {"GatherElements", {2, 2}},
                                                                 {"Slice", {3, 5}},
                                                                 {"Transpose", {1, 1}},
                                                                 {"Split", {1, 2}},
                                                                 {"MatMul", {2, 2}},
                                                                 {"Gemm", {2, 3}},
                                                                 {"LayerNormalization", {2, 3}},
                                                                 {"Softmax", {1, 1}},
                                                                 {"ReduceMean", {1, 2}},
                                                                 {"ReduceSum", {1, 2}},
                                                                 {"ReduceMax", {1, 2}},
                                                                 {"ReduceMin", {1, 2}},
                                                                 {"Identity", {1, 1}},
                                                                 {"Dropout", {1, 3}},
                                                                 {"Shape", {1, 1}},
                                                                 {"Gelu", {1, 1}}};
    auto it = k.find(n.op_type());
    if (it != k.end()) arity(n, it->second.first, it->second.second);
  }

  void node(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    where_ = "node '" + n.name() + "' (" + op + ")";
    check_arity(n);
    if (!n.domain().empty() && n.domain() != "ai.onnx")
      fail(ErrorCode::kUnsupported, where_ + ": domain '" + n.domain() + "' is not supported");
    const std::string out = n.output_size() ? n.output(0) : "";
    if (op == "Constant") {
      const auto* a = n.attribute_size() ? &n.attribute(0) : nullptr;
      if (!a) fail(ErrorCode::kInvalidArgument, where_ + ": no value");
      if (a->name() == "value") {
        set_const(out, read_tensor(a->t()));
      } else if (a->name() == "value_float") {
        set_const(out, to_tensor(Lit{{}, DType::kF32, {a->f()}}, DType::kF32));
      } else if (a->name() == "value_int") {
        set_const(out, to_tensor(Lit{{}, DType::kI64, {static_cast<double>(a->i())}}, DType::kI64));
      } else if (a->name() == "value_ints") {
        Lit l{{static_cast<int64_t>(a->ints_size())}, DType::kI64, {}};
        for (int64_t v : a->ints()) l.v.push_back(static_cast<double>(v));
        set_const(out, to_tensor(l, DType::kI64));
      } else if (a->name() == "value_floats") {
        Lit l{{static_cast<int64_t>(a->floats_size())}, DType::kF32, {}};
        for (float v : a->floats()) l.v.push_back(v);
        set_const(out, to_tensor(l, DType::kF32));
      } else {
        fail(ErrorCode::kUnsupported, where_ + ": constant attribute '" + a->name() + "'");
      }
      return;
    }
    if (op == "Identity" || op == "Dropout") {
      if (is_const(n.input(0)))
        set_const(out, cst(n.input(0)));
      else
        set_rt(out, rt(n.input(0)));
      return;
    }
    if (op == "Shape") {
      const Shape s = shape_of(n.input(0));
      const auto r = static_cast<int64_t>(s.size());
      int64_t start = attr_i(n, "start", 0), end = attr_i(n, "end", r);
      if (start < 0) start += r;
      if (end < 0) end += r;
      start = std::clamp<int64_t>(start, 0, r), end = std::clamp<int64_t>(end, start, r);
      Lit l{{end - start}, DType::kI64, {}};
      for (int64_t i = start; i < end; ++i)
        l.v.push_back(static_cast<double>(s[static_cast<size_t>(i)]));
      set_const(out, to_tensor(l, DType::kI64));
      return;
    }
    if (all_const(n) && n.input_size() > 0) {
      evaluate(n);
      return;
    }
    runtime(n);
  }

  // Every input constant: compute the outputs now.
  void evaluate(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    std::vector<Lit> in;
    for (const auto& i : n.input()) in.push_back(i.empty() ? Lit{} : lit(i));
    const DType dt0 = in.empty() ? DType::kF32 : in[0].dt;
    auto set = [&](const Lit& l) {
      if (static_cast<int64_t>(l.v.size()) != numel(l.shape))
        fail(ErrorCode::kInternal, where_ + ": evaluated " + std::to_string(l.v.size()) +
                                       " values for shape " + shape_to_string(l.shape));
      set_const(n.output(0), to_tensor(l, l.dt));
    };
    using F = std::function<double(const double*)>;
    static const std::map<std::string, F> binary = {
        {"Add", [](const double* a) { return a[0] + a[1]; }},
        {"Sub", [](const double* a) { return a[0] - a[1]; }},
        {"Mul", [](const double* a) { return a[0] * a[1]; }},
        {"Pow", [](const double* a) { return std::pow(a[0], a[1]); }},
        {"Max", [](const double* a) { return std::max(a[0], a[1]); }},
        {"Min", [](const double* a) { return std::min(a[0], a[1]); }}};
    static const std::map<std::string, F> compare = {
        {"Equal", [](const double* a) { return double(a[0] == a[1]); }},
        {"Less", [](const double* a) { return double(a[0] < a[1]); }},
        {"LessOrEqual", [](const double* a) { return double(a[0] <= a[1]); }},
        {"Greater", [](const double* a) { return double(a[0] > a[1]); }},
        {"GreaterOrEqual", [](const double* a) { return double(a[0] >= a[1]); }},
        {"And", [](const double* a) { return double(a[0] != 0 && a[1] != 0); }},
        {"Or", [](const double* a) { return double(a[0] != 0 || a[1] != 0); }},
        {"Xor", [](const double* a) { return double((a[0] != 0) != (a[1] != 0)); }}};
    static const std::map<std::string, std::function<double(double)>> unary = {
        {"Neg", [](double x) { return -x; }},
        {"Sqrt", [](double x) { return std::sqrt(x); }},
        {"Exp", [](double x) { return std::exp(x); }},
        {"Abs", [](double x) { return std::abs(x); }},
        {"Tanh", [](double x) { return std::tanh(x); }},
        {"Erf", [](double x) { return std::erf(x); }},
        {"Reciprocal", [](double x) { return 1.0 / x; }},
        {"Not", [](double x) { return double(x == 0); }},
        {"Sigmoid", [](double x) { return 1.0 / (1.0 + std::exp(-x)); }},
        {"Relu", [](double x) { return std::max(0.0, x); }}};
    if (auto it = binary.find(op); it != binary.end())
      return set(nary({in[0], in[1]}, dt0, it->second, where_));
    if (op == "Div") {
      const bool integer = dt0 == DType::kI64 || dt0 == DType::kI32;
      // Integer division truncates toward zero (ONNX follows C).
      return set(nary(
          {in[0], in[1]}, dt0,
          [integer](const double* a) { return integer ? std::trunc(a[0] / a[1]) : a[0] / a[1]; },
          where_));
    }
    if (auto it = compare.find(op); it != compare.end())
      return set(nary({in[0], in[1]}, DType::kU8, it->second, where_));
    if (auto it = unary.find(op); it != unary.end()) {
      Lit y = in[0];
      for (double& x : y.v) x = it->second(x);
      if (op == "Not") y.dt = DType::kU8;
      return set(y);
    }
    if (op == "Where")
      return set(nary(
          {in[0], in[1], in[2]}, in[1].dt, [](const double* a) { return a[0] != 0 ? a[1] : a[2]; },
          where_));
    if (op == "Cast") {
      Lit y = in[0];
      y.dt = dtype_of(static_cast<int32_t>(attr_i(n, "to", 1)), where_);
      if (y.dt == DType::kU8 && attr_i(n, "to", 1) == onnx::TensorProto::BOOL)
        for (double& x : y.v) x = x != 0;
      if (y.dt == DType::kI64 || y.dt == DType::kI32)
        for (double& x : y.v) x = std::trunc(x);
      return set(y);
    }
    if (op == "Range") {
      const double start = in[0].v.at(0), limit = in[1].v.at(0), delta = in[2].v.at(0);
      if (delta == 0) fail(ErrorCode::kInvalidArgument, where_ + ": delta 0");
      const double cnt = std::max(0.0, std::ceil((limit - start) / delta));
      if (!(cnt <= double(kMaxConstElements)))
        fail(ErrorCode::kUnsupported, where_ + ": a range of " + std::to_string(cnt) + " elements");
      const auto count = static_cast<int64_t>(cnt);
      Lit y{{count}, dt0, {}};
      for (int64_t i = 0; i < count; ++i) y.v.push_back(start + static_cast<double>(i) * delta);
      return set(y);
    }
    if (op == "ConstantOfShape") {
      const Shape s = checked_shape(in[0].v);
      Lit y{s, DType::kF32, std::vector<double>(static_cast<size_t>(numel(s)), 0.0)};
      if (const auto* a = attr(n, "value")) {
        const Lit v = to_lit(read_tensor(a->t()));
        y.dt = v.dt;
        std::fill(y.v.begin(), y.v.end(), v.v.at(0));
      }
      return set(y);
    }
    if (op == "Expand") {
      const Shape s = checked_shape(in[1].v);
      Lit zero{broadcast(in[0].shape, s, where_), dt0, {}};
      if (numel(zero.shape) > kMaxConstElements)
        fail(ErrorCode::kUnsupported, where_ + ": constant too large");
      zero.v.assign(static_cast<size_t>(numel(zero.shape)), 0.0);
      return set(nary(
          {in[0], zero}, dt0, [](const double* a) { return a[0]; }, where_));
    }
    if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") {
      Lit y = in[0];
      y.shape = view_shape(n, in[0].shape);
      return set(y);
    }
    if (op == "Concat") {
      std::vector<Lit> parts;
      for (const Lit& l : in)
        if (!l.shape.empty() || !l.v.empty()) parts.push_back(l);
      return set(concat(parts, attr_i(n, "axis", 0)));
    }
    if (op == "Gather") {
      const Lit& d = in[0];
      const int ax = norm_axis(attr_i(n, "axis", 0), d.shape.size(), where_);
      const int64_t outer = numel(Shape(d.shape.begin(), d.shape.begin() + ax));
      const int64_t dim = d.shape[static_cast<size_t>(ax)];
      const int64_t inner = numel(Shape(d.shape.begin() + ax + 1, d.shape.end()));
      Shape s(d.shape.begin(), d.shape.begin() + ax);
      s.insert(s.end(), in[1].shape.begin(), in[1].shape.end());
      s.insert(s.end(), d.shape.begin() + ax + 1, d.shape.end());
      Lit y{s, d.dt, {}};
      for (int64_t o = 0; o < outer; ++o)
        for (double iv : in[1].v) {
          auto idx = static_cast<int64_t>(iv);
          if (idx < 0) idx += dim;
          if (idx < 0 || idx >= dim)
            fail(ErrorCode::kInvalidArgument, where_ + ": index out of range");
          for (int64_t k = 0; k < inner; ++k)
            y.v.push_back(d.v[static_cast<size_t>((o * dim + idx) * inner + k)]);
        }
      return set(y);
    }
    if (op == "GatherElements") {
      const Lit& d = in[0];
      const Lit& ix = in[1];
      const int ax = norm_axis(attr_i(n, "axis", 0), d.shape.size(), where_);
      if (ix.shape.size() != d.shape.size())
        fail(ErrorCode::kShapeMismatch, where_ + ": ranks differ");
      for (size_t k = 0; k < d.shape.size(); ++k)
        if (static_cast<int>(k) != ax && ix.shape[k] > d.shape[k])
          fail(ErrorCode::kShapeMismatch,
               where_ + ": indices dim " + std::to_string(k) + " exceeds the data's");
      std::vector<int64_t> dst(d.shape.size(), 1);
      for (size_t k = d.shape.size(); k-- > 1;) dst[k - 1] = dst[k] * d.shape[k];
      Lit y{ix.shape, d.dt, std::vector<double>(ix.v.size())};
      for (int64_t i = 0; i < numel(ix.shape); ++i) {
        int64_t rem = i, off = 0;
        for (size_t k = ix.shape.size(); k-- > 0;) {
          int64_t c = rem % ix.shape[k];
          rem /= ix.shape[k];
          if (static_cast<int>(k) == ax) {
            c = static_cast<int64_t>(ix.v[static_cast<size_t>(i)]);
            if (c < 0) c += d.shape[k];
            if (c < 0 || c >= d.shape[k])
              fail(ErrorCode::kInvalidArgument, where_ + ": index out of range");
          }
          off += c * dst[k];
        }
        y.v[static_cast<size_t>(i)] = d.v[static_cast<size_t>(off)];
      }
      return set(y);
    }
    if (op == "Slice") {
      Lit y = in[0];
      std::vector<int64_t> st = ints(n.input(1)), en = ints(n.input(2));
      std::vector<int64_t> ax =
          n.input_size() > 3 && !n.input(3).empty() ? ints(n.input(3)) : std::vector<int64_t>{};
      std::vector<int64_t> sp =
          n.input_size() > 4 && !n.input(4).empty() ? ints(n.input(4)) : std::vector<int64_t>{};
      slice_lengths(st, en, ax, sp);
      for (size_t i = 0; i < st.size(); ++i) {
        const int a =
            norm_axis(ax.empty() ? static_cast<int64_t>(i) : ax[i], y.shape.size(), where_);
        const int64_t step = sp.empty() ? 1 : sp[i];
        y = slice_lit(y, a, st[i], en[i], step);
      }
      return set(y);
    }
    if (op == "Transpose") {
      std::vector<int64_t> perm = attr_ints(n, "perm");
      if (perm.empty())
        for (size_t i = in[0].shape.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
      return set(transpose_lit(in[0], perm));
    }
    if (op == "Split") {
      const int ax = norm_axis(attr_i(n, "axis", 0), in[0].shape.size(), where_);
      const std::vector<int64_t> sizes = split_sizes(n, in[0].shape[static_cast<size_t>(ax)]);
      int64_t off = 0;
      for (size_t k = 0; k < sizes.size(); ++k) {
        set_const(n.output(static_cast<int>(k)),
                  to_tensor(slice_lit(in[0], ax, off, off + sizes[k], 1), dt0));
        off += sizes[k];
      }
      return;
    }
    // Anything else on constants: let the runtime path try (weight-only subgraphs are folded
    // by the fold_constants pass later).
    runtime(n);
  }

  Lit concat(const std::vector<Lit>& parts, int64_t axis) const {
    if (parts.empty()) fail(ErrorCode::kInvalidArgument, where_ + ": nothing to concatenate");
    const int ax = norm_axis(axis, parts.at(0).shape.size(), where_);
    for (const Lit& p : parts) {
      bool ok = p.shape.size() == parts[0].shape.size();
      for (size_t k = 0; ok && k < p.shape.size(); ++k)
        ok = static_cast<int>(k) == ax || p.shape[k] == parts[0].shape[k];
      if (!ok)
        fail(ErrorCode::kShapeMismatch,
             where_ + ": inputs differ in rank or in a dim other than the axis");
    }
    Shape s = parts[0].shape;
    s[static_cast<size_t>(ax)] = 0;
    for (const Lit& p : parts) s[static_cast<size_t>(ax)] += p.shape[static_cast<size_t>(ax)];
    const int64_t outer = numel(Shape(s.begin(), s.begin() + ax));
    Lit y{s, parts[0].dt, {}};
    for (int64_t o = 0; o < outer; ++o)
      for (const Lit& p : parts) {
        const int64_t chunk = numel(Shape(p.shape.begin() + ax, p.shape.end()));
        y.v.insert(y.v.end(), p.v.begin() + o * chunk, p.v.begin() + (o + 1) * chunk);
      }
    return y;
  }

  static void clamp_range(int64_t n, int64_t step, int64_t* start, int64_t* end) {
    auto fix = [n](int64_t v, int64_t lo, int64_t hi) {
      if (v < 0) v += n;
      return std::clamp<int64_t>(v, lo, hi);
    };
    if (step > 0) {
      *start = fix(*start, 0, n);
      *end = fix(*end, 0, n);
    } else {
      *start = fix(*start, -1, n - 1);
      *end = fix(*end, -1, n - 1);
    }
  }

  Lit slice_lit(const Lit& x, int ax, int64_t start, int64_t end, int64_t step) const {
    if (step == 0) fail(ErrorCode::kInvalidArgument, where_ + ": step 0");
    const int64_t n = x.shape[static_cast<size_t>(ax)];
    clamp_range(n, step, &start, &end);
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < end : i > end; i += step) idx.push_back(i);
    Shape s = x.shape;
    s[static_cast<size_t>(ax)] = static_cast<int64_t>(idx.size());
    const int64_t outer = numel(Shape(x.shape.begin(), x.shape.begin() + ax));
    const int64_t inner = numel(Shape(x.shape.begin() + ax + 1, x.shape.end()));
    Lit y{s, x.dt, {}};
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i : idx)
        for (int64_t k = 0; k < inner; ++k)
          y.v.push_back(x.v[static_cast<size_t>((o * n + i) * inner + k)]);
    return y;
  }

  Lit transpose_lit(const Lit& x, const std::vector<int64_t>& perm) const {
    const size_t r = x.shape.size();
    std::vector<char> seen(r, 0);
    if (perm.size() != r)
      fail(ErrorCode::kInvalidArgument, where_ + ": perm length differs from the rank");
    for (int64_t p : perm) {
      char& f = seen[static_cast<size_t>(norm_axis(p, r, where_))];
      if (f) fail(ErrorCode::kInvalidArgument, where_ + ": perm is not a permutation");
      f = 1;
    }
    Shape s(r);
    for (size_t i = 0; i < r; ++i)
      s[i] = x.shape[static_cast<size_t>(norm_axis(perm[i], r, where_))];
    std::vector<int64_t> st(r, 1);
    for (size_t i = r; i-- > 1;) st[i - 1] = st[i] * x.shape[i];
    Lit y{s, x.dt, std::vector<double>(x.v.size())};
    std::vector<int64_t> idx(r, 0);
    for (int64_t i = 0; i < numel(s); ++i) {
      int64_t f = 0;
      for (size_t d = 0; d < r; ++d)
        f += idx[d] * st[static_cast<size_t>(norm_axis(perm[d], r, where_))];
      y.v[static_cast<size_t>(i)] = x.v[static_cast<size_t>(f)];
      for (size_t d = r; d-- > 0;) {
        if (++idx[d] < s[d]) break;
        idx[d] = 0;
      }
    }
    return y;
  }

  std::vector<int64_t> split_sizes(const onnx::NodeProto& n, int64_t dim) const {
    std::vector<int64_t> sizes;
    if (n.input_size() > 1 && !n.input(1).empty()) {
      sizes = ints(n.input(1));
    } else if (!attr_ints(n, "split").empty()) {
      sizes = attr_ints(n, "split");
    } else {
      const int64_t parts = attr_i(n, "num_outputs", n.output_size());
      if (parts <= 0)
        fail(ErrorCode::kInvalidArgument, where_ + ": num_outputs " + std::to_string(parts));
      const int64_t each = (dim + parts - 1) / parts;
      for (int64_t k = 0; k < parts; ++k) sizes.push_back(std::min(each, dim - k * each));
    }
    int64_t total = 0;
    for (int64_t s : sizes) {
      if (s < 0) fail(ErrorCode::kInvalidArgument, where_ + ": negative split size");
      total += s;
    }
    if (total != dim || static_cast<int>(sizes.size()) != n.output_size())
      fail(ErrorCode::kInvalidArgument, where_ + ": split sizes do not cover the axis");
    return sizes;
  }

  // Output shape of Reshape / Flatten / Squeeze / Unsqueeze for input shape s.
  Shape view_shape(const onnx::NodeProto& n, const Shape& s) const {
    const std::string& op = n.op_type();
    if (op == "Reshape") {
      if (attr_i(n, "allowzero", 0)) fail(ErrorCode::kUnsupported, where_ + ": allowzero=1");
      return reshape_shape(Reshape{.shape = ints(n.input(1))}, s);
    }
    if (op == "Flatten") {
      const auto r = static_cast<int64_t>(s.size());
      int64_t ax = attr_i(n, "axis", 1);
      if (ax < -r || ax > r)
        fail(ErrorCode::kInvalidArgument,
             where_ + ": axis " + std::to_string(ax) + " for rank " + std::to_string(r));
      if (ax < 0) ax += r;
      return {numel(Shape(s.begin(), s.begin() + ax)), numel(Shape(s.begin() + ax, s.end()))};
    }
    std::vector<int64_t> ax = axes(n, 1);
    if (op == "Squeeze") {
      Shape y;
      for (size_t i = 0; i < s.size(); ++i) {
        bool drop = ax.empty() ? s[i] == 1 : false;
        for (int64_t a : ax) drop |= norm_axis(a, s.size(), where_) == static_cast<int>(i);
        if (drop && s[i] != 1)
          fail(ErrorCode::kInvalidArgument, where_ + ": squeezing dim " + std::to_string(i) +
                                                " of size " + std::to_string(s[i]));
        if (!drop) y.push_back(s[i]);
      }
      return y;
    }
    // Unsqueeze
    const size_t r = s.size() + ax.size();
    std::vector<char> at(r, 0);
    for (int64_t a : ax) {
      char& slot = at[static_cast<size_t>(norm_axis(a, r, where_))];
      if (slot)
        fail(ErrorCode::kInvalidArgument, where_ + ": axis " + std::to_string(a) + " repeated");
      slot = 1;
    }
    Shape y;
    size_t k = 0;
    for (size_t i = 0; i < r; ++i) y.push_back(at[i] ? 1 : s[k++]);
    return y;
  }

  // A node with at least one runtime input.
  void runtime(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    const std::string name = n.name().empty() ? n.output(0) : n.name();
    const std::string out = n.output(0);
    static const std::map<std::string, ElementwiseType> binary = {
        {"Add", ElementwiseType::kAdd}, {"Sub", ElementwiseType::kSub},
        {"Mul", ElementwiseType::kMul}, {"Div", ElementwiseType::kDiv},
        {"Pow", ElementwiseType::kPow}, {"Max", ElementwiseType::kMax},
        {"Min", ElementwiseType::kMin}};
    static const std::map<std::string, ElementwiseType> unary = {
        {"Neg", ElementwiseType::kNeg}, {"Sqrt", ElementwiseType::kSqrt},
        {"Exp", ElementwiseType::kExp}, {"Tanh", ElementwiseType::kTanh},
        {"Erf", ElementwiseType::kErf}, {"Sigmoid", ElementwiseType::kSigmoid},
        {"Abs", ElementwiseType::kAbs}, {"Reciprocal", ElementwiseType::kReciprocal}};
    static const std::map<std::string, ops::CompareType> compare = {
        {"Equal", ops::CompareType::kEqual},
        {"Less", ops::CompareType::kLess},
        {"LessOrEqual", ops::CompareType::kLessEqual},
        {"Greater", ops::CompareType::kGreater},
        {"GreaterOrEqual", ops::CompareType::kGreaterEqual},
        {"And", ops::CompareType::kAnd},
        {"Or", ops::CompareType::kOr},
        {"Xor", ops::CompareType::kXor},
        {"Not", ops::CompareType::kNot}};
    if (auto it = binary.find(op); it != binary.end()) {
      // The runtime operand's dtype decides; a constant operand is converted to it.
      const DType dt =
          is_const(n.input(0)) ? dtype_of_value(n.input(1)) : dtype_of_value(n.input(0));
      const TensorId a = id_of(n.input(0), dt, true), b = id_of(n.input(1), dt, true);
      set_rt(out, emit(name, ops::ElementwiseParam{.type = it->second}, {a, b}));
      return;
    }
    if (auto it = unary.find(op); it != unary.end()) {
      set_rt(out, emit(name, ops::ElementwiseParam{.type = it->second}, {id_of(n.input(0))}));
      return;
    }
    if (auto it = compare.find(op); it != compare.end()) {
      std::vector<TensorId> in;
      for (const auto& i : n.input()) in.push_back(id_of(i));
      set_rt(out, emit(name, ops::CompareParam{.type = it->second}, in));
      return;
    }
    if (op == "Relu") {
      set_rt(out, emit(name, ops::ActivationParam{.type = ops::ActivationType::kRelu},
                       {id_of(n.input(0))}));
      return;
    }
    if (op == "Cast") {
      const DType to = dtype_of(static_cast<int32_t>(attr_i(n, "to", 1)), where_);
      const TensorId x = id_of(n.input(0));
      const DType from = desc(x).dtype;
      if (attr_i(n, "to", 1) == onnx::TensorProto::BOOL) {
        // bool: nonzero -> 1
        set_rt(out,
               emit(name, ops::CompareParam{.type = ops::CompareType::kNot},
                    {emit(name + ".not", ops::CompareParam{.type = ops::CompareType::kNot}, {x})}));
        return;
      }
      const bool is_float = from == DType::kF32 || from == DType::kBF16 || from == DType::kF16;
      if (is_float && to != DType::kF32 && to != DType::kBF16 && to != DType::kF16)
        fail(ErrorCode::kUnsupported, where_ +
                                          ": a float to integer cast at run time (ONNX "
                                          "truncates; our Cast rounds to nearest even)");
      set_rt(out, emit(name, ops::ElementwiseParam{.type = ElementwiseType::kCast, .out_dtype = to},
                       {x}));
      return;
    }
    if (op == "Where") {
      const DType dt =
          is_const(n.input(1)) ? dtype_of_value(n.input(2)) : dtype_of_value(n.input(1));
      set_rt(out,
             emit(name, ops::WhereParam{},
                  {id_of(n.input(0)), id_of(n.input(1), dt, true), id_of(n.input(2), dt, true)}));
      return;
    }
    if (op == "MatMul") {
      const TensorId a = id_of(n.input(0)), b = id_of(n.input(1));
      if (desc(a).ndim < 2 || desc(b).ndim < 2)
        fail(ErrorCode::kUnsupported, where_ + ": MatMul with a rank-1 operand");
      set_rt(out, emit(name, ops::MatMulParam{}, {a, b}));
      return;
    }
    if (op == "Gemm") {
      if (attr_f(n, "alpha", 1.0f) != 1.0f || attr_f(n, "beta", 1.0f) != 1.0f)
        fail(ErrorCode::kUnsupported, where_ + ": alpha/beta other than 1");
      ops::LinearParam p;
      p.transpose_a = attr_i(n, "transA", 0) != 0;
      p.transpose_b = attr_i(n, "transB", 0) != 0;
      // A weight computed at run time must be read every call, not packed once.
      p.constant_weight = is_const(n.input(1));
      if (shape_of(n.input(0)).size() != 2 || shape_of(n.input(1)).size() != 2)
        fail(ErrorCode::kInvalidArgument, where_ + ": A and B must be 2-D, got " +
                                              shape_to_string(shape_of(n.input(0))) + " and " +
                                              shape_to_string(shape_of(n.input(1))));
      std::vector<TensorId> in = {id_of(n.input(0)), id_of(n.input(1))};
      if (n.input_size() > 2 && !n.input(2).empty()) {
        const Shape cs = shape_of(n.input(2));
        const int64_t nout = p.transpose_b ? shape_of(n.input(1))[0] : shape_of(n.input(1))[1];
        const bool per_column = (cs.size() == 1 && cs[0] == nout) ||
                                (cs.size() == 2 && cs[0] == 1 && cs[1] == nout) ||
                                (numel(cs) == 1 && nout == 1);
        if (!per_column)
          fail(ErrorCode::kUnsupported,
               where_ + ": bias C of shape " + shape_to_string(cs) + " (only per-column bias)");
        TensorId c = id_of(n.input(2));
        if (desc(c).ndim != 1) c = reshape_to(name + ".bias1d", c, {nout});
        in.push_back(c);
        p.has_bias = true;
      }
      set_rt(out, emit(name, p, in));
      return;
    }
    if (op == "LayerNormalization") {
      const TensorId x = id_of(n.input(0));
      const int ax = norm_axis(attr_i(n, "axis", -1), static_cast<size_t>(desc(x).ndim), where_);
      if (ax != desc(x).ndim - 1)
        fail(ErrorCode::kUnsupported, where_ + ": normalizing over more than the last axis");
      for (int k = 1; k < n.output_size(); ++k)
        if (!n.output(k).empty())
          fail(ErrorCode::kUnsupported, where_ + ": mean / inv_std_dev outputs");
      ops::LayerNormParam p{.epsilon = attr_f(n, "epsilon", 1e-5f)};
      std::vector<TensorId> in = {x, id_of(n.input(1))};
      p.has_bias = n.input_size() > 2 && !n.input(2).empty();
      if (p.has_bias) in.push_back(id_of(n.input(2)));
      set_rt(out, emit(name, p, in));
      return;
    }
    if (op == "Softmax") {
      const TensorId x = id_of(n.input(0));
      const int64_t def = opset_ >= 13 ? -1 : 1;
      const int ax = norm_axis(attr_i(n, "axis", def), static_cast<size_t>(desc(x).ndim), where_);
      if (ax != desc(x).ndim - 1)
        fail(ErrorCode::kUnsupported, where_ + ": softmax over an axis other than the last");
      set_rt(out, emit(name, ops::SoftmaxParam{}, {x}));
      return;
    }
    if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin") {
      ops::ReduceParam p;
      p.type = op == "ReduceMean"  ? ops::ReduceType::kMean
               : op == "ReduceSum" ? ops::ReduceType::kSum
               : op == "ReduceMax" ? ops::ReduceType::kMax
                                   : ops::ReduceType::kMin;
      // ReduceSum takes axes as an input from opset 13, the others from 18.
      p.axes = axes(n, 1);
      p.keepdims = attr_i(n, "keepdims", 1) != 0;
      if (p.axes.empty() && attr_i(n, "noop_with_empty_axes", 0)) {
        set_rt(out, rt(n.input(0)));
        return;
      }
      set_rt(out, emit(name, p, {id_of(n.input(0))}));
      return;
    }
    if (op == "Transpose") {
      const TensorId x = id_of(n.input(0));
      std::vector<int64_t> perm = attr_ints(n, "perm");
      if (perm.empty())
        for (int i = desc(x).ndim; i-- > 0;) perm.push_back(i);
      set_rt(out, emit(name, ops::TransposeParam{.perm = perm}, {x}));
      return;
    }
    if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") {
      const TensorId x = id_of(n.input(0));
      set_rt(out, reshape_to(name, x, view_shape(n, desc(x).shape())));
      return;
    }
    if (op == "Expand") {
      const TensorId x = id_of(n.input(0));
      set_rt(out, emit(name, Expand{.shape = ints(n.input(1))}, {x}));
      return;
    }
    if (op == "Split") {
      const TensorId x = id_of(n.input(0));
      const int ax = norm_axis(attr_i(n, "axis", 0), static_cast<size_t>(desc(x).ndim), where_);
      const std::vector<int64_t> sizes = split_sizes(n, desc(x).dim(ax));
      int64_t off = 0;
      for (size_t k = 0; k < sizes.size(); ++k) {
        set_rt(n.output(static_cast<int>(k)),
               emit(name + ":" + std::to_string(k),
                    Slice{.axis = ax, .start = off, .end = off + sizes[k]}, {x}));
        off += sizes[k];
      }
      return;
    }
    if (op == "Slice") {
      TensorId x = id_of(n.input(0));
      const std::vector<int64_t> st = ints(n.input(1)), en = ints(n.input(2));
      const std::vector<int64_t> ax =
          n.input_size() > 3 && !n.input(3).empty() ? ints(n.input(3)) : std::vector<int64_t>{};
      const std::vector<int64_t> sp =
          n.input_size() > 4 && !n.input(4).empty() ? ints(n.input(4)) : std::vector<int64_t>{};
      slice_lengths(st, en, ax, sp);
      for (size_t i = 0; i < st.size(); ++i) {
        if (!sp.empty() && sp[i] != 1)
          fail(ErrorCode::kUnsupported, where_ + ": slice step other than 1");
        const int a = norm_axis(ax.empty() ? static_cast<int64_t>(i) : ax[i],
                                static_cast<size_t>(desc(x).ndim), where_);
        int64_t s = st[i], e = en[i];
        clamp_range(desc(x).dim(a), 1, &s, &e);
        x = emit(name + (i ? ":" + std::to_string(i) : ""),
                 Slice{.axis = a, .start = s, .end = std::max(s, e)}, {x});
      }
      set_rt(out, x);
      return;
    }
    if (op == "Concat") {
      std::vector<TensorId> in;
      DType dt = DType::kF32;
      for (const auto& i : n.input())
        if (!is_const(i)) dt = desc(rt(i)).dtype;
      for (const auto& i : n.input())
        if (!(is_const(i) && cst(i).numel() == 0)) in.push_back(id_of(i, dt, true));
      set_rt(out, emit(name, ops::ConcatParam{.axis = attr_i(n, "axis", 0)}, in));
      return;
    }
    if (op == "Gather") {
      const int64_t axis = attr_i(n, "axis", 0);
      if (is_const(n.input(0)) && !is_const(n.input(1)) && axis == 0 &&
          cst(n.input(0)).ndim() == 2 &&
          (cst(n.input(0)).dtype() == DType::kF32 || cst(n.input(0)).dtype() == DType::kBF16 ||
           cst(n.input(0)).dtype() == DType::kF16)) {
        set_rt(out, emit(name, ops::EmbeddingParam{}, {id_of(n.input(0)), id_of(n.input(1))}));
        return;
      }
      if (!is_const(n.input(0)) && is_const(n.input(1)) && cst(n.input(1)).numel() == 1) {
        // x[..., i, ...]: a slice and a squeeze, no copy.
        const TensorId x = rt(n.input(0));
        const int a = norm_axis(axis, static_cast<size_t>(desc(x).ndim), where_);
        int64_t i = ints(n.input(1))[0];
        if (i < -desc(x).dim(a) || i >= desc(x).dim(a))
          fail(ErrorCode::kInvalidArgument, where_ + ": index " + std::to_string(i) +
                                                " out of range for a dim of " +
                                                std::to_string(desc(x).dim(a)));
        if (i < 0) i += desc(x).dim(a);
        const TensorId s = emit(name + ".slice", Slice{.axis = a, .start = i, .end = i + 1}, {x});
        Shape sh = desc(s).shape();
        if (cst(n.input(1)).ndim() == 0) sh.erase(sh.begin() + a);
        set_rt(out, reshape_to(name, s, sh));
        return;
      }
      set_rt(out,
             emit(name, ops::GatherParam{.axis = axis}, {id_of(n.input(0)), id_of(n.input(1))}));
      return;
    }
    if (op == "Gelu") {
      const std::string approx = attr(n, "approximate") ? attr(n, "approximate")->s() : "none";
      set_rt(out,
             emit(name,
                  ops::ActivationParam{.type = approx == "tanh" ? ops::ActivationType::kGeluTanh
                                                                : ops::ActivationType::kGeluErf},
                  {id_of(n.input(0))}));
      return;
    }
    fail(ErrorCode::kUnsupported, where_ + ": op type '" + op + "' is not supported");
  }
};

}  // namespace

bool onnx_import_available() { return true; }

Graph import_onnx(const std::string& path, const Bindings& dims, OnnxInfo* info) {
  GOOGLE_PROTOBUF_VERIFY_VERSION;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    throw Error(ErrorCode::kIo, "ONNX import: cannot open '" + path + "': " + std::strerror(errno));
  onnx::ModelProto model;
  bool ok = false;
  {
    google::protobuf::io::FileInputStream raw(fd);
    google::protobuf::io::CodedInputStream in(&raw);
    in.SetTotalBytesLimit(INT32_MAX);
    ok = model.ParseFromCodedStream(&in) && in.ConsumedEntireMessage();
  }
  ::close(fd);
  if (!ok)
    throw Error(ErrorCode::kInvalidArgument,
                "ONNX import: '" + path + "' is not a valid ONNX model (protobuf parse failed)");
  if (!model.has_graph())
    throw Error(ErrorCode::kInvalidArgument, "ONNX import: '" + path + "' has no graph");
  Importer im(model, dims);
  if (im.opset() == 0 || im.opset() > 18)
    throw Error(ErrorCode::kUnsupported,
                "ONNX import: opset " + std::to_string(im.opset()) + " (supported: 11-18)");
  Graph g;
  try {
    g = im.run();
  } catch (const Error& e) {  // errors from below (tensor sizes, ...) say where they come from
    const std::string msg = e.what();
    if (msg.rfind("ONNX import", 0) == 0) throw;
    throw Error(e.code(), "ONNX import: '" + path + "': " + msg);
  }
  if (info) {
    info->nodes = model.graph().node_size();
    info->constants = 0;
    for (const auto& n : model.graph().node()) info->constants += n.op_type() == "Constant";
    info->opset = im.opset();
    info->producer = model.producer_name() + " " + model.producer_version();
  }
  return g;
}

}  // namespace tboost::graph
