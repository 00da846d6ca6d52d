// Float64 graph interpreter (see eval64.h).
#include "tests/graph/eval64.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "src/kernels/ref/reference.h"

namespace tboost::testing {
namespace {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

// Calls fn(flat index, multi-index) for every element of shape s in row-major order.
template <class Fn>
void for_each_index(const Shape& s, Fn&& fn) {
  const int64_t n = numel(s);
  std::vector<int64_t> idx(s.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    fn(i, idx);
    for (size_t d = s.size(); d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
}

// Element of t at the broadcast index idx of an output of rank r.
double at_broadcast(const T64& t, const std::vector<int64_t>& st, const std::vector<int64_t>& idx) {
  const size_t off = idx.size() - t.shape.size();
  int64_t f = 0;
  for (size_t d = 0; d < t.shape.size(); ++d) f += (t.shape[d] == 1 ? 0 : idx[off + d]) * st[d];
  return t.v[static_cast<size_t>(f)];
}

double unary(ops::ElementwiseParam p, double x) {
  using E = ops::ElementwiseType;
  switch (p.type) {
    case E::kScale:
      return p.alpha * x;
    case E::kCast:
      return x;
    case E::kNeg:
      return -x;
    case E::kSqrt:
      return std::sqrt(x);
    case E::kRsqrt:
      return 1.0 / std::sqrt(x);
    case E::kReciprocal:
      return 1.0 / x;
    case E::kExp:
      return std::exp(x);
    case E::kTanh:
      return std::tanh(x);
    case E::kErf:
      return std::erf(x);
    case E::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case E::kAbs:
      return std::abs(x);
    default:
      throw std::runtime_error("eval64: not a unary type");
  }
}

double binary(ops::ElementwiseType t, double a, double b) {
  using E = ops::ElementwiseType;
  switch (t) {
    case E::kAdd:
      return a + b;
    case E::kSub:
      return a - b;
    case E::kMul:
      return a * b;
    case E::kDiv:
      return a / b;
    case E::kPow:
      return std::pow(a, b);
    case E::kMax:
      return std::max(a, b);
    case E::kMin:
      return std::min(a, b);
    default:
      throw std::runtime_error("eval64: not a binary type");
  }
}

T64 elementwise(const ops::ElementwiseParam& p, const std::vector<T64>& in) {
  if (!ops::is_binary(p.type)) {
    T64 y = in[0];
    for (double& x : y.v) x = unary(p, x);
    return y;
  }
  const T64& a = in[0];
  const T64& b = in[1];
  const size_t r = std::max(a.shape.size(), b.shape.size());
  Shape s(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + a.shape.size() >= r ? a.shape[i + a.shape.size() - r] : 1;
    const int64_t db = i + b.shape.size() >= r ? b.shape[i + b.shape.size() - r] : 1;
    s[i] = da == 1 ? db : da;
  }
  T64 y{s, std::vector<double>(static_cast<size_t>(numel(s)))};
  const auto sa = strides_of(a.shape), sb = strides_of(b.shape);
  for_each_index(s, [&](int64_t i, const std::vector<int64_t>& idx) {
    y.v[static_cast<size_t>(i)] =
        binary(p.type, at_broadcast(a, sa, idx), at_broadcast(b, sb, idx));
  });
  return y;
}

T64 reduce(const ops::ReduceParam& p, const T64& x) {
  const int r = static_cast<int>(x.shape.size());
  std::vector<char> red(static_cast<size_t>(r), p.axes.empty() ? 1 : 0);
  for (int64_t a : p.axes) red[static_cast<size_t>(a < 0 ? a + r : a)] = 1;
  Shape keep = x.shape;
  for (int d = 0; d < r; ++d)
    if (red[static_cast<size_t>(d)]) keep[static_cast<size_t>(d)] = 1;
  const auto ks = strides_of(keep);
  std::vector<double> acc(static_cast<size_t>(numel(keep)),
                          p.type == ops::ReduceType::kMax ? -std::numeric_limits<double>::infinity()
                          : p.type == ops::ReduceType::kMin
                              ? std::numeric_limits<double>::infinity()
                              : 0.0);
  for_each_index(x.shape, [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t o = 0;
    for (int d = 0; d < r; ++d)
      if (!red[static_cast<size_t>(d)])
        o += idx[static_cast<size_t>(d)] * ks[static_cast<size_t>(d)];
    double& a = acc[static_cast<size_t>(o)];
    const double v = x.v[static_cast<size_t>(i)];
    a = p.type == ops::ReduceType::kMax   ? std::max(a, v)
        : p.type == ops::ReduceType::kMin ? std::min(a, v)
                                          : a + v;
  });
  if (p.type == ops::ReduceType::kMean) {
    const double n = static_cast<double>(numel(x.shape) / numel(keep));
    for (double& a : acc) a /= n;
  }
  Shape out;
  for (int d = 0; d < r; ++d)
    if (!red[static_cast<size_t>(d)] || p.keepdims) out.push_back(keep[static_cast<size_t>(d)]);
  return {out, acc};
}

T64 transpose(const std::vector<int64_t>& perm0, const T64& x) {
  const size_t r = x.shape.size();
  std::vector<int64_t> perm(r);
  for (size_t i = 0; i < r; ++i) perm[i] = perm0.empty() ? static_cast<int64_t>(i) : perm0[i];
  for (auto& p : perm)
    if (p < 0) p += static_cast<int64_t>(r);
  Shape s(r);
  for (size_t i = 0; i < r; ++i) s[i] = x.shape[static_cast<size_t>(perm[i])];
  const auto xs = strides_of(x.shape);
  T64 y{s, std::vector<double>(x.v.size())};
  for_each_index(s, [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t f = 0;
    for (size_t d = 0; d < r; ++d) f += idx[d] * xs[static_cast<size_t>(perm[d])];
    y.v[static_cast<size_t>(i)] = x.v[static_cast<size_t>(f)];
  });
  return y;
}

T64 matmul(const ops::MatMulParam& p, T64 a, T64 b) {
  auto swap_last = [](const T64& t) {
    std::vector<int64_t> perm(t.shape.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
    return transpose(perm, t);
  };
  if (p.transpose_a) a = swap_last(a);
  if (p.transpose_b) b = swap_last(b);
  const int64_t M = a.shape[a.shape.size() - 2], K = a.shape.back(), N = b.shape.back();
  const Shape ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  const size_t r = std::max(ba.size(), bb.size());
  Shape bs(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + ba.size() >= r ? ba[i + ba.size() - r] : 1;
    const int64_t db = i + bb.size() >= r ? bb[i + bb.size() - r] : 1;
    bs[i] = da == 1 ? db : da;
  }
  Shape s = bs;
  s.push_back(M), s.push_back(N);
  T64 y{s, std::vector<double>(static_cast<size_t>(numel(s)))};
  const auto sa = strides_of(ba), sb = strides_of(bb);
  for_each_index(bs, [&](int64_t bi, const std::vector<int64_t>& idx) {
    auto base = [&](const Shape& sh, const std::vector<int64_t>& st) {
      const size_t off = r - sh.size();
      int64_t f = 0;
      for (size_t d = 0; d < sh.size(); ++d) f += (sh[d] == 1 ? 0 : idx[off + d]) * st[d];
      return f;
    };
    const int64_t oa = base(ba, sa) * M * K, ob = base(bb, sb) * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc +=
              a.v[static_cast<size_t>(oa + m * K + k)] * b.v[static_cast<size_t>(ob + k * N + n)];
        y.v[static_cast<size_t>((bi * M + m) * N + n)] = p.alpha * acc;
      }
  });
  return y;
}

T64 concat(int64_t axis, const std::vector<T64>& in) {
  const int r = static_cast<int>(in[0].shape.size());
  const int a = static_cast<int>(axis < 0 ? axis + r : axis);
  Shape s = in[0].shape;
  s[static_cast<size_t>(a)] = 0;
  for (const T64& t : in) s[static_cast<size_t>(a)] += t.shape[static_cast<size_t>(a)];
  const int64_t outer = numel(Shape(s.begin(), s.begin() + a));
  T64 y{s, {}};
  for (int64_t o = 0; o < outer; ++o)
    for (const T64& t : in) {
      const int64_t chunk = numel(Shape(t.shape.begin() + a, t.shape.end()));
      y.v.insert(y.v.end(), t.v.begin() + o * chunk, t.v.begin() + (o + 1) * chunk);
    }
  return y;
}

T64 slice(const graph::Slice& sl, const T64& x) {
  const int r = static_cast<int>(x.shape.size());
  const int a = static_cast<int>(sl.axis < 0 ? sl.axis + r : sl.axis);
  const int64_t n = x.shape[static_cast<size_t>(a)];
  auto clamp = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  const int64_t s0 = clamp(sl.start), e = std::max(clamp(sl.end), s0);
  Shape s = x.shape;
  s[static_cast<size_t>(a)] = e - s0;
  const auto xs = strides_of(x.shape);
  T64 y{s, std::vector<double>(static_cast<size_t>(numel(s)))};
  for_each_index(s, [&](int64_t i, const std::vector<int64_t>& idx) {
    int64_t f = 0;
    for (int d = 0; d < r; ++d)
      f += (idx[static_cast<size_t>(d)] + (d == a ? s0 : 0)) * xs[static_cast<size_t>(d)];
    y.v[static_cast<size_t>(i)] = x.v[static_cast<size_t>(f)];
  });
  return y;
}

T64 rope(const ops::RopeParam& p, const T64& x, const T64& pos) {
  // BSND (B, S, H, D): row r = ((b * S + s) * H + h); token = r / H.
  const int64_t D = x.shape.back(), H = x.shape[x.shape.size() - 2];
  const int64_t rows = numel(x.shape) / D;
  kernels::ref::Vec positions(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t tok = r / H;
    if (p.layout == ops::QkvLayout::kBNSD) {  // (B, H, S, D)
      const int64_t S = x.shape[2];
      tok = (r / (H * S)) * S + r % S;
    }
    positions[static_cast<size_t>(r)] = pos.v[static_cast<size_t>(tok)];
  }
  kernels::ref::RefOut y;
  kernels::ref::rope(&y, x.v, positions, rows, D, p.rotary_dim ? p.rotary_dim : D, p.rotation,
                     p.theta, p.scaling_factor);
  return {x.shape, y.value};
}

}  // namespace

T64 to_t64(const Tensor& t) {
  T64 y{t.shape(), std::vector<double>(static_cast<size_t>(t.numel()))};
  for_each_index(y.shape, [&](int64_t i, const std::vector<int64_t>& idx) {
    y.v[static_cast<size_t>(i)] = t.get(idx);
  });
  return y;
}

std::vector<T64> eval64(const graph::Graph& g, const std::vector<Tensor>& inputs) {
  std::vector<T64> val(g.tensors().size());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    val[static_cast<size_t>(g.inputs()[i])] = to_t64(inputs[i]);
  for (size_t t = 0; t < g.tensors().size(); ++t)
    if (g.tensors()[t].kind == graph::TensorKind::kWeight) val[t] = to_t64(g.tensors()[t].value);
  for (const graph::Node& n : g.nodes()) {
    std::vector<T64> in;
    for (graph::TensorId i : n.inputs) in.push_back(val[static_cast<size_t>(i)]);
    T64 y;
    if (const auto* r = std::get_if<graph::Reshape>(&n.op)) {
      y = in[0];
      y.shape = graph::reshape_shape(*r, in[0].shape);
    } else if (const auto* s = std::get_if<graph::Slice>(&n.op)) {
      y = slice(*s, in[0]);
    } else if (const auto* ex = std::get_if<graph::Expand>(&n.op)) {
      // Broadcast by adding zeros of the target shape.
      T64 zeros{Shape(ex->shape.begin(), ex->shape.end()), {}};
      zeros.v.assign(static_cast<size_t>(numel(zeros.shape)), 0.0);
      y = elementwise(ops::ElementwiseParam{.type = ops::ElementwiseType::kAdd}, {in[0], zeros});
    } else {
      const AnyParam& p = std::get<AnyParam>(n.op);
      if (const auto* e = std::get_if<ops::ElementwiseParam>(&p)) {
        y = elementwise(*e, in);
      } else if (const auto* rd = std::get_if<ops::ReduceParam>(&p)) {
        y = reduce(*rd, in[0]);
      } else if (const auto* m = std::get_if<ops::MatMulParam>(&p)) {
        y = matmul(*m, in[0], in[1]);
      } else if (const auto* tp = std::get_if<ops::TransposeParam>(&p)) {
        y = transpose(tp->perm, in[0]);
      } else if (const auto* c = std::get_if<ops::ConcatParam>(&p)) {
        y = concat(c->axis, in);
      } else if (const auto* sm = std::get_if<ops::SoftmaxParam>(&p)) {
        kernels::ref::RefOut o;
        const int64_t cols = in[0].shape.back();
        kernels::ref::softmax(&o, in[0].v, numel(in[0].shape) / cols, cols, sm->scale);
        y = {in[0].shape, o.value};
      } else if (std::holds_alternative<ops::ReshapeAndCacheParam>(p)) {
        // k (T, H, D), v, slots (T), caches (blocks, H, block_size, D): rows scattered.
        T64 kc = in[3], vc = in[4];
        const int64_t T = in[0].shape[0], H = in[0].shape[1], D = in[0].shape[2],
                      Dv = in[1].shape[2], bs = kc.shape[2];
        for (int64_t t = 0; t < T; ++t) {
          const auto slot = static_cast<int64_t>(in[2].v[static_cast<size_t>(t)]);
          if (slot < 0) continue;
          const int64_t blk = slot / bs, off = slot % bs;
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t d = 0; d < D; ++d)
              kc.v[static_cast<size_t>(((blk * H + h) * bs + off) * D + d)] =
                  in[0].v[static_cast<size_t>((t * H + h) * D + d)];
            for (int64_t d = 0; d < Dv; ++d)
              vc.v[static_cast<size_t>(((blk * H + h) * bs + off) * Dv + d)] =
                  in[1].v[static_cast<size_t>((t * H + h) * Dv + d)];
          }
        }
        val[static_cast<size_t>(n.outputs[1])] = vc;
        y = kc;
      } else if (const auto* rp = std::get_if<ops::RopeParam>(&p)) {
        y = rope(*rp, in[0], in[1]);
      } else if (const auto* a = std::get_if<ops::ActivationParam>(&p)) {
        kernels::ref::RefOut o;
        Shape s = in[0].shape;
        if (ops::is_gated(a->type)) s.back() /= 2;
        kernels::ref::activation(&o, in[0].v, numel(s) / s.back(), s.back(), a->type,
                                 a->gate_first);
        y = {s, o.value};
      } else {
        throw std::runtime_error("eval64: no float64 reference for node '" + n.name + "' (" +
                                 graph::op_name(n.op) + ")");
      }
    }
    val[static_cast<size_t>(n.outputs[0])] = std::move(y);
  }
  std::vector<T64> out;
  for (graph::TensorId o : g.outputs()) out.push_back(val[static_cast<size_t>(o)]);
  return out;
}

double rel_error(const Tensor& out, const T64& ref) {
  const T64 o = to_t64(out);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.v.size(); ++i) {
    const double d = o.v[i] - ref.v[i];
    num += d * d;
    den += ref.v[i] * ref.v[i];
  }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace tboost::testing
