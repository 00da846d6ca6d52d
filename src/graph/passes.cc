// The fusion patterns, in one list (kPatterns), and the driver that runs them to a fixed point.
//
// A pattern sweeps the nodes once, rewriting every match whose nodes no earlier rewrite of the
// same sweep touched, and returns the number of rewrites. A rewrite replaces the op of the
// match's last node (so the ids other nodes read stay the same) and leaves the matched
// producers unread; dead_nodes removes them. Matches require the intermediate tensors to have
// exactly one reader and not be graph outputs, so nothing else observes what disappears.
#include "tboost/graph/passes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "tboost/core/error.h"

namespace tboost::graph {
namespace {

using ops::ElementwiseType;

struct State {
  Graph& g;
  std::vector<TensorDesc> example;
  std::vector<TensorDesc> example2;  // the example with every symbolic dim + 1 (or empty)
  std::vector<TensorDesc> d;         // every tensor under the example inputs
  std::vector<TensorDesc> d2;        // ... and under example2
  std::vector<int> prod;             // tensor -> producing node, -1
  std::vector<int> uses;             // tensor -> reading nodes (+1 if a graph output)
  std::vector<char> out;             // tensor is a graph output
  std::vector<char> dirty;           // node rewritten in this sweep

  void refresh() {
    g.validate_and_sort();
    d = g.infer(example);
    // Shapes at a second binding: a rewrite that holds only because a symbolic dim happens to
    // be 1 (or equal to another) in the example must not fire.
    d2 = d;
    if (!example2.empty()) {
      try {
        d2 = g.infer(example2);
      } catch (const Error&) {  // the graph fixes its sizes (a constant mask, say)
      }
    }
    const size_t nt = g.tensors().size();
    prod.assign(nt, -1);
    uses.assign(nt, 0);
    out.assign(nt, 0);
    const auto& nodes = g.nodes();
    for (size_t k = 0; k < nodes.size(); ++k) {
      for (TensorId o : nodes[k].outputs) prod[static_cast<size_t>(o)] = static_cast<int>(k);
      for (TensorId i : nodes[k].inputs) ++uses[static_cast<size_t>(i)];
    }
    for (TensorId o : g.outputs()) {
      out[static_cast<size_t>(o)] = 1;
      ++uses[static_cast<size_t>(o)];
    }
    dirty.assign(nodes.size(), 0);
  }

  const Node& node(int k) const { return g.nodes()[static_cast<size_t>(k)]; }
  Node& mnode(int k) { return g.mutable_nodes()[static_cast<size_t>(k)]; }
  const TensorDesc& desc(TensorId t) const { return d[static_cast<size_t>(t)]; }
  bool same(TensorId a, TensorId b) const {
    return d[static_cast<size_t>(a)].same_shape(d[static_cast<size_t>(b)]) &&
           d2[static_cast<size_t>(a)].same_shape(d2[static_cast<size_t>(b)]);
  }
  int producer(TensorId t) const {
    return t >= 0 && static_cast<size_t>(t) < prod.size() ? prod[static_cast<size_t>(t)] : -1;
  }
  // Read by exactly one node and not a graph output.
  bool single(TensorId t) const { return uses[static_cast<size_t>(t)] == 1; }
  const Tensor* weight(TensorId t) const {
    const TensorInfo& i = g.tensors()[static_cast<size_t>(t)];
    return i.kind == TensorKind::kWeight ? &i.value : nullptr;
  }
  // A weight holding one value (any shape of one element).
  bool scalar(TensorId t, double* v) const {
    const Tensor* w = weight(t);
    if (!w || w->numel() != 1) return false;
    *v = w->get(Shape(static_cast<size_t>(w->ndim()), 0));
    return true;
  }
  bool free(int k) const { return k >= 0 && !dirty[static_cast<size_t>(k)]; }

  template <class P>
  const P* param(int k) const {
    if (k < 0) return nullptr;
    const auto* a = std::get_if<AnyParam>(&node(k).op);
    return a ? std::get_if<P>(a) : nullptr;
  }
  // Node k is an Elementwise of type t.
  bool ew(int k, ElementwiseType t) const {
    const auto* e = param<ops::ElementwiseParam>(k);
    return e && e->type == t;
  }
  // The producer of t when it is an Elementwise of type `type`, t has one reader, and the
  // node is untouched in this sweep; else -1.
  int ew_of(TensorId t, ElementwiseType type) const {
    const int k = producer(t);
    return free(k) && single(t) && ew(k, type) ? k : -1;
  }
  void mark(std::initializer_list<int> ks) {
    for (int k : ks)
      if (k >= 0) dirty[static_cast<size_t>(k)] = 1;
  }
  void set_op(int k, const AnyParam& p, std::vector<TensorId> inputs) {
    Node& n = mnode(k);
    n.op = p;
    n.inputs = std::move(inputs);
    dirty[static_cast<size_t>(k)] = 1;
  }
  TensorId add_weight(const std::string& name, const Tensor& v) {
    return g.weight(g.unique_name(name), v);
  }
};

int norm_axis(int64_t a, int rank) { return static_cast<int>(a < 0 ? a + rank : a); }

bool reduces_last_axis(const ops::ReduceParam& r, int rank) {
  return r.keepdims && r.axes.size() == 1 && norm_axis(r.axes[0], rank) == rank - 1;
}

// ---- remove_noop: reshapes / slices to the same shape, identity transposes of contiguous data,
// casts to the same dtype.
int remove_noop(State& s) {
  int fired = 0;
  const auto& nodes = s.g.nodes();
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (n.inputs.empty() || n.outputs.size() != 1) continue;
    const TensorId in = n.inputs[0], o = n.outputs[0];
    if (s.out[static_cast<size_t>(o)]) continue;  // the graph's output ids stay produced
    const TensorDesc& a = s.desc(in);
    bool noop = false;
    if (is_view(n.op)) {
      noop = s.same(in, o);  // at both example bindings: symbolic dims must agree too
    } else if (const auto* t = s.param<ops::TransposeParam>(static_cast<int>(k))) {
      bool identity = true;
      for (size_t i = 0; i < t->perm.size(); ++i)
        identity &= norm_axis(t->perm[i], a.ndim) == static_cast<int>(i);
      noop = identity && a.is_contiguous();
    } else if (const auto* e = s.param<ops::ElementwiseParam>(static_cast<int>(k))) {
      noop = e->type == ElementwiseType::kCast && e->out_dtype == a.dtype;
    }
    if (!noop) continue;
    s.g.replace_uses(o, in);
    ++fired;
  }
  return fired;
}

// ---- fold_constants: a compute node whose inputs are all weights runs once, now; its outputs
// become weights. Views of weights become (copied) weights too.
int fold_constants(State& s) {
  int fired = 0;
  const size_t nn = s.g.nodes().size();
  for (size_t k = 0; k < nn; ++k) {
    const Node n = s.g.nodes()[k];
    if (n.inputs.empty()) continue;
    if (const auto* a = std::get_if<AnyParam>(&n.op);
        a && std::holds_alternative<ops::GraphParam>(*a))
      continue;
    bool all = true;
    for (TensorId i : n.inputs) all &= s.weight(i) != nullptr;
    if (!all) continue;
    std::vector<Tensor> outs;
    if (is_view(n.op)) {
      TensorDesc v;
      int64_t off = 0;
      const Tensor& w = *s.weight(n.inputs[0]);
      if (view_desc(n.op, w.desc(), &v, &off)) {
        outs.push_back(Tensor(v, static_cast<char*>(w.data()) +
                                     off * static_cast<int64_t>(dtype_size(w.dtype())))
                           .contiguous_copy());
      } else {
        outs.push_back(w.contiguous_copy().reshape(s.desc(n.outputs[0]).shape()));
      }
    } else {
      VariantPack pack;
      for (TensorId i : n.inputs) pack.inputs.push_back(*s.weight(i));
      for (TensorId o : n.outputs) {
        const TensorDesc& od = s.desc(o);
        pack.outputs.push_back(Tensor::empty(od.dtype, od.shape()));
      }
      Context ctx;
      auto op = create_operation(std::get<AnyParam>(n.op));
      run_operation(*op, pack, ctx);
      outs = pack.outputs;
    }
    bool replaced = false;
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      const TensorId o = n.outputs[j];
      if (s.out[static_cast<size_t>(o)]) continue;  // a graph output stays computed
      replaced = true;
      const TensorId w =
          s.add_weight(n.name + (n.outputs.size() > 1 ? ":" + std::to_string(j) : ""), outs[j]);
      s.g.replace_uses(o, w);
    }
    fired += replaced ? 1 : 0;
  }
  return fired;
}

// ---- silu: x * sigmoid(x) -> Activation(silu).
int silu(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    if (!s.free(k) || !s.ew(k, ElementwiseType::kMul)) continue;
    const Node& n = s.node(k);
    for (int side = 0; side < 2; ++side) {
      const TensorId sg = n.inputs[static_cast<size_t>(side)];
      const TensorId x = n.inputs[static_cast<size_t>(1 - side)];
      const int ks = s.ew_of(sg, ElementwiseType::kSigmoid);
      if (ks < 0 || s.node(ks).inputs[0] != x || !s.same(x, n.outputs[0])) continue;
      s.mark({ks});
      s.set_op(k, ops::ActivationParam{.type = ops::ActivationType::kSilu}, {x});
      ++fired;
      break;
    }
  }
  return fired;
}

// The leaves of a product tree: t = Π leaves, through Mul nodes with one reader (and Div by a
// scalar, as a factor 1/c). Scalar constants multiply into *scalar.
void mul_leaves(const State& s, TensorId t, bool root, std::vector<TensorId>* leaves,
                double* scalar, std::vector<int>* nodes) {
  double c = 0;
  if (s.scalar(t, &c)) {
    *scalar *= c;
    return;
  }
  const int k = s.producer(t);
  if (s.free(k) && (root || s.single(t))) {
    const Node& n = s.node(k);
    if (s.ew(k, ElementwiseType::kMul)) {
      nodes->push_back(k);
      mul_leaves(s, n.inputs[0], false, leaves, scalar, nodes);
      mul_leaves(s, n.inputs[1], false, leaves, scalar, nodes);
      return;
    }
    if (s.ew(k, ElementwiseType::kDiv) && s.scalar(n.inputs[1], &c) && c != 0.0) {
      nodes->push_back(k);
      *scalar /= c;
      mul_leaves(s, n.inputs[0], false, leaves, scalar, nodes);
      return;
    }
  }
  leaves->push_back(t);
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-4 * std::abs(b); }

// t = c * x with c near `want` (a product tree of x and scalars).
bool scaled_x(const State& s, TensorId t, TensorId x, double want, std::vector<int>* nodes) {
  std::vector<TensorId> leaves;
  double c = 1;
  std::vector<int> sub;
  mul_leaves(s, t, false, &leaves, &c, &sub);
  if (leaves.size() != 1 || leaves[0] != x || !near(c, want)) return false;
  nodes->insert(nodes->end(), sub.begin(), sub.end());
  return true;
}

// t = 1 + f(...) where f is Erf or Tanh: returns f's node and its input.
int one_plus(const State& s, TensorId t, ElementwiseType f, TensorId* arg,
             std::vector<int>* nodes) {
  const int ka = s.ew_of(t, ElementwiseType::kAdd);
  if (ka < 0) return -1;
  const Node& a = s.node(ka);
  for (int side = 0; side < 2; ++side) {
    double one = 0;
    if (!s.scalar(a.inputs[static_cast<size_t>(1 - side)], &one) || one != 1.0) continue;
    const int kf = s.ew_of(a.inputs[static_cast<size_t>(side)], f);
    if (kf < 0) continue;
    nodes->push_back(ka);
    nodes->push_back(kf);
    *arg = s.node(kf).inputs[0];
    return kf;
  }
  return -1;
}

// x^3 as Pow(x, 3) or a product tree x·x·x.
bool cube_of(const State& s, TensorId t, TensorId x, std::vector<int>* nodes) {
  const int kp = s.ew_of(t, ElementwiseType::kPow);
  double p = 0;
  if (kp >= 0 && s.node(kp).inputs[0] == x && s.scalar(s.node(kp).inputs[1], &p) && p == 3.0) {
    nodes->push_back(kp);
    return true;
  }
  std::vector<TensorId> leaves;
  double c = 1;
  std::vector<int> sub;
  mul_leaves(s, t, false, &leaves, &c, &sub);
  if (c != 1.0 || leaves.size() != 3 || leaves[0] != x || leaves[1] != x || leaves[2] != x)
    return false;
  nodes->insert(nodes->end(), sub.begin(), sub.end());
  return true;
}

// ---- gelu: the exported forms of GELU -> Activation.
//   erf:  0.5 · x · (1 + erf(x / √2))
//   tanh: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))
// in any association and operand order of the products.
int gelu(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    if (!s.free(k) || !s.ew(k, ElementwiseType::kMul)) continue;
    std::vector<TensorId> leaves;
    double half = 1;
    std::vector<int> used;
    mul_leaves(s, s.node(k).outputs[0], true, &leaves, &half, &used);
    if (leaves.size() != 2 || !near(half, 0.5)) continue;
    for (int side = 0; side < 2; ++side) {
      const TensorId x = leaves[static_cast<size_t>(side)];
      const TensorId a = leaves[static_cast<size_t>(1 - side)];
      std::vector<int> nodes = used;
      TensorId arg = -1;
      ops::ActivationType type;
      if (one_plus(s, a, ElementwiseType::kErf, &arg, &nodes) >= 0 &&
          scaled_x(s, arg, x, 0.7071067811865476, &nodes)) {
        type = ops::ActivationType::kGeluErf;
      } else if (nodes.resize(used.size()),
                 one_plus(s, a, ElementwiseType::kTanh, &arg, &nodes) >= 0) {
        // arg = √(2/π) · (x + 0.044715 · x³)
        std::vector<TensorId> inner;
        double c = 1;
        mul_leaves(s, arg, false, &inner, &c, &nodes);
        if (inner.size() != 1 || !near(c, 0.7978845608028654)) continue;
        const int kadd = s.ew_of(inner[0], ElementwiseType::kAdd);
        if (kadd < 0) continue;
        const Node& add = s.node(kadd);
        const int xs = add.inputs[0] == x ? 0 : (add.inputs[1] == x ? 1 : -1);
        if (xs < 0) continue;
        std::vector<TensorId> cube;
        double c2 = 1;
        mul_leaves(s, add.inputs[static_cast<size_t>(1 - xs)], false, &cube, &c2, &nodes);
        if (!near(c2, 0.044715)) continue;
        if (cube.size() == 1) {
          if (!cube_of(s, cube[0], x, &nodes)) continue;
        } else if (!(cube.size() == 3 && cube[0] == x && cube[1] == x && cube[2] == x)) {
          continue;
        }
        nodes.push_back(kadd);
        type = ops::ActivationType::kGeluTanh;
      } else {
        continue;
      }
      if (!s.same(x, s.node(k).outputs[0])) continue;
      for (int u : nodes)
        if (u != k) s.mark({u});
      s.set_op(k, ops::ActivationParam{.type = type}, {x});
      ++fired;
      break;
    }
  }
  return fired;
}

// The node computing 1/sqrt(v + eps) of a mean-of-squares: returns the ReduceMean's input
// (the squared tensor's base x, or the centered d) through `base`, and eps.
//   r = Reciprocal(Sqrt(Add(mean, eps)))  |  Rsqrt(Add(mean, eps))
// `div`: the pattern divides by Sqrt(Add(mean, eps)) instead (then `t` is the Sqrt's output).
bool inv_rms(const State& s, TensorId t, bool div, TensorId* squared_of, double* eps,
             std::vector<int>* nodes) {
  int k_add = -1;
  if (div) {
    const int k_sqrt = s.ew_of(t, ElementwiseType::kSqrt);
    if (k_sqrt < 0) return false;
    nodes->push_back(k_sqrt);
    k_add = s.ew_of(s.node(k_sqrt).inputs[0], ElementwiseType::kAdd);
  } else if (const int k_rs = s.ew_of(t, ElementwiseType::kRsqrt); k_rs >= 0) {
    nodes->push_back(k_rs);
    k_add = s.ew_of(s.node(k_rs).inputs[0], ElementwiseType::kAdd);
  } else if (const int k_rc = s.ew_of(t, ElementwiseType::kReciprocal); k_rc >= 0) {
    nodes->push_back(k_rc);
    const int k_sqrt = s.ew_of(s.node(k_rc).inputs[0], ElementwiseType::kSqrt);
    if (k_sqrt < 0) return false;
    nodes->push_back(k_sqrt);
    k_add = s.ew_of(s.node(k_sqrt).inputs[0], ElementwiseType::kAdd);
  }
  if (k_add < 0) return false;
  nodes->push_back(k_add);
  const Node& add = s.node(k_add);
  TensorId mean = -1;
  for (int side = 0; side < 2 && mean < 0; ++side)
    if (s.scalar(add.inputs[static_cast<size_t>(1 - side)], eps))
      mean = add.inputs[static_cast<size_t>(side)];
  if (mean < 0) return false;
  const int k_mean = s.producer(mean);
  const auto* r = s.param<ops::ReduceParam>(k_mean);
  if (!s.free(k_mean) || !s.single(mean) || !r || r->type != ops::ReduceType::kMean ||
      !reduces_last_axis(*r, s.desc(mean).ndim))
    return false;
  nodes->push_back(k_mean);
  const TensorId sq = s.node(k_mean).inputs[0];
  const int k_sq = s.producer(sq);
  if (!s.free(k_sq) || !s.single(sq)) return false;
  const Node& q = s.node(k_sq);
  double p = 0;
  if (s.ew(k_sq, ElementwiseType::kPow) && s.scalar(q.inputs[1], &p) && p == 2.0) {
    *squared_of = q.inputs[0];
  } else if (s.ew(k_sq, ElementwiseType::kMul) && q.inputs[0] == q.inputs[1]) {
    *squared_of = q.inputs[0];
  } else {
    return false;
  }
  nodes->push_back(k_sq);
  return true;
}

// x * inv_rms(x) or x / rms(x): the normalized tensor; returns x and eps.
bool normalized(const State& s, TensorId t, TensorId* x, double* eps, std::vector<int>* nodes) {
  const int k = s.producer(t);
  if (!s.free(k) || !s.single(t)) return false;
  const Node& n = s.node(k);
  if (s.ew(k, ElementwiseType::kDiv)) {
    TensorId sq_of = -1;
    if (!inv_rms(s, n.inputs[1], true, &sq_of, eps, nodes) || sq_of != n.inputs[0]) return false;
    *x = n.inputs[0];
  } else if (s.ew(k, ElementwiseType::kMul)) {
    bool ok = false;
    for (int side = 0; side < 2 && !ok; ++side) {
      std::vector<int> sub;
      TensorId sq_of = -1;
      const TensorId cand = n.inputs[static_cast<size_t>(side)];
      if (inv_rms(s, n.inputs[static_cast<size_t>(1 - side)], false, &sq_of, eps, &sub) &&
          sq_of == cand) {
        *x = cand;
        nodes->insert(nodes->end(), sub.begin(), sub.end());
        ok = true;
      }
    }
    if (!ok) return false;
  } else {
    return false;
  }
  nodes->push_back(k);
  return true;
}

// ---- norms: decomposed RmsNorm and LayerNorm -> one norm op.
//   RmsNorm:   w * (x * rsqrt(mean(x^2) + eps))            (and the div / reciprocal forms)
//   LayerNorm: w * ((x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)) [+ b]
int norms(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    if (!s.free(k) || !s.ew(k, ElementwiseType::kMul)) continue;
    const Node& n = s.node(k);
    const TensorId y = n.outputs[0];
    for (int side = 0; side < 2; ++side) {
      const TensorId w = n.inputs[static_cast<size_t>(side)];
      const TensorId a = n.inputs[static_cast<size_t>(1 - side)];
      const Tensor* wt = s.weight(w);
      if (!wt || wt->ndim() != 1 || s.desc(a).ndim < 1 || wt->dim(0) != s.desc(a).dim(-1) ||
          !s.same(a, y))
        continue;
      std::vector<int> used;
      TensorId x = -1;
      double eps = 0;
      if (!normalized(s, a, &x, &eps, &used)) continue;
      // Centered? x = Sub(x0, mean(x0)) with one more reader (the square) than a plain RMS.
      const int k_sub = s.producer(x);
      bool layer = false;
      TensorId x0 = x;
      if (s.free(k_sub) && s.ew(k_sub, ElementwiseType::kSub)) {
        const Node& sub = s.node(k_sub);
        const int k_m = s.producer(sub.inputs[1]);
        const auto* r = s.param<ops::ReduceParam>(k_m);
        if (s.free(k_m) && s.single(sub.inputs[1]) && r && r->type == ops::ReduceType::kMean &&
            reduces_last_axis(*r, s.desc(sub.inputs[0]).ndim) &&
            s.node(k_m).inputs[0] == sub.inputs[0]) {
          layer = true;
          x0 = sub.inputs[0];
          used.push_back(k_sub);
          used.push_back(k_m);
        }
      }
      for (int u : used) s.mark({u});
      if (layer) {
        // A following "+ b" with a 1-D weight b becomes the LayerNorm bias.
        s.set_op(k, ops::LayerNormParam{.epsilon = static_cast<float>(eps), .has_bias = false},
                 {x0, w});
      } else {
        s.set_op(k, ops::RmsNormParam{.epsilon = static_cast<float>(eps)}, {x0, w});
      }
      ++fired;
      break;
    }
  }
  return fired;
}

// ---- norm_bias: LayerNorm without bias, then + b (1-D weight) -> LayerNorm with bias.
int norm_bias(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    if (!s.free(k) || !s.ew(k, ElementwiseType::kAdd)) continue;
    const Node& n = s.node(k);
    for (int side = 0; side < 2; ++side) {
      const TensorId t = n.inputs[static_cast<size_t>(side)];
      const TensorId b = n.inputs[static_cast<size_t>(1 - side)];
      const int kn = s.producer(t);
      const auto* ln = s.param<ops::LayerNormParam>(kn);
      const Tensor* bt = s.weight(b);
      if (!ln || !s.free(kn) || !s.single(t) || ln->has_bias ||
          ln->layer != ops::NormLayer::kNorm || ln->output_stats || !bt || bt->ndim() != 1 ||
          bt->dim(0) != s.desc(t).dim(-1))
        continue;
      ops::LayerNormParam p = *ln;
      p.has_bias = true;
      const Node& nn = s.node(kn);
      s.mark({kn});
      s.set_op(k, p, {nn.inputs[0], nn.inputs[1], b});
      ++fired;
      break;
    }
  }
  return fired;
}

// ---- linear: MatMul(x, W) with a constant 2-D W -> Linear (weight re-packed once).
int linear(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    const auto* m = s.param<ops::MatMulParam>(k);
    if (!m || !s.free(k) || m->transpose_a || m->alpha != 1.0f) continue;
    const Node& n = s.node(k);
    const Tensor* w = s.weight(n.inputs[1]);
    if (!w || w->ndim() != 2 || s.desc(n.inputs[0]).ndim < 2) continue;
    s.set_op(k, ops::LinearParam{.transpose_b = m->transpose_b}, {n.inputs[0], n.inputs[1]});
    ++fired;
  }
  return fired;
}

// A Linear node without epilogue of its own kind: its output t read only by node `reader`.
const ops::LinearParam* plain_linear(const State& s, TensorId t, int* kl) {
  *kl = s.producer(t);
  const auto* l = s.param<ops::LinearParam>(*kl);
  if (!l || !s.free(*kl) || !s.single(t) || l->has_residual) return nullptr;
  return l;
}

// ---- linear_bias: Linear + b (1-D weight of N) -> Linear with bias.
int linear_bias(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    if (!s.free(k) || !s.ew(k, ElementwiseType::kAdd)) continue;
    const Node& n = s.node(k);
    for (int side = 0; side < 2; ++side) {
      int kl = -1;
      const TensorId t = n.inputs[static_cast<size_t>(side)];
      const TensorId b = n.inputs[static_cast<size_t>(1 - side)];
      const auto* l = plain_linear(s, t, &kl);
      const Tensor* bt = s.weight(b);
      if (!l || l->has_bias || l->activation != ops::Activation::kNone || !bt || bt->ndim() != 1 ||
          bt->dim(0) != s.desc(t).dim(-1) || !s.same(t, n.outputs[0]))
        continue;
      ops::LinearParam p = *l;
      p.has_bias = true;
      const Node& ln = s.node(kl);
      s.mark({kl});
      s.set_op(k, p, {ln.inputs[0], ln.inputs[1], b});
      ++fired;
      break;
    }
  }
  return fired;
}

// Copies `src` (contiguous copy first) into rows [row0, row0 + rows) of a 2-D dst.
void copy_rows_into(Tensor& dst, int64_t row0, const Tensor& src) {
  const Tensor c = src.contiguous_copy();
  const size_t row_bytes = static_cast<size_t>(dst.dim(1)) * dtype_size(dst.dtype());
  std::memcpy(static_cast<char*>(dst.data()) + static_cast<size_t>(row0) * row_bytes, c.data(),
              c.nbytes());
}

// ---- merge_linears: Linears reading the same x with constant weights (Q, K, V; gate and up)
// -> one Linear with the weights concatenated along N; each old output is a Slice view of it.
int merge_linears(State& s) {
  int fired = 0;
  const auto& nodes = s.g.nodes();
  for (size_t k0 = 0; k0 < nodes.size(); ++k0) {
    const auto* l0 = s.param<ops::LinearParam>(static_cast<int>(k0));
    if (!l0 || !s.free(static_cast<int>(k0)) || l0->has_residual || l0->transpose_a) continue;
    const TensorId x = nodes[k0].inputs[0];
    std::vector<int> group;
    for (size_t k = k0; k < nodes.size(); ++k) {
      const auto* l = s.param<ops::LinearParam>(static_cast<int>(k));
      if (!l || !s.free(static_cast<int>(k)) || nodes[k].inputs[0] != x || l->has_residual ||
          l->transpose_a || l->transpose_b != l0->transpose_b || l->has_bias != l0->has_bias ||
          l->activation != l0->activation)
        continue;
      const Tensor* w = s.weight(nodes[k].inputs[1]);
      const Tensor* w0 = s.weight(nodes[k0].inputs[1]);
      if (!w || !w0 || w->dtype() != w0->dtype()) continue;
      const int kdim = l0->transpose_b ? 1 : 0;
      if (w->dim(kdim) != w0->dim(kdim)) continue;
      if (l->has_bias) {
        const Tensor* b = s.weight(nodes[k].inputs[2]);
        const Tensor* b0 = s.weight(nodes[k0].inputs[2]);
        if (!b || !b0 || b->dtype() != b0->dtype()) continue;
      }
      group.push_back(static_cast<int>(k));
    }
    if (group.size() < 2) continue;
    const bool tb = l0->transpose_b;
    const Tensor& w0 = *s.weight(nodes[k0].inputs[1]);
    const int64_t K = tb ? w0.dim(1) : w0.dim(0);
    int64_t n_total = 0;
    std::vector<int64_t> widths;
    for (int k : group) {
      const Tensor& w = *s.weight(s.node(k).inputs[1]);
      widths.push_back(tb ? w.dim(0) : w.dim(1));
      n_total += widths.back();
    }
    // (N, K) weights stack their rows; (K, N) ones are stacked as (N, K) rows of the
    // transposed weights and the merged Linear reads them transposed.
    Tensor wcat = Tensor::empty(w0.dtype(), {n_total, K});
    Tensor bcat;
    if (l0->has_bias) bcat = Tensor::empty(s.weight(nodes[k0].inputs[2])->dtype(), {n_total});
    int64_t off = 0;
    std::string name = "merged";
    for (size_t i = 0; i < group.size(); ++i) {
      const Node& n = s.node(group[i]);
      const Tensor& w = *s.weight(n.inputs[1]);
      copy_rows_into(wcat, off, tb ? w : w.transpose(0, 1));
      if (l0->has_bias) {
        const Tensor b = s.weight(n.inputs[2])->contiguous_copy();
        std::memcpy(
            static_cast<char*>(bcat.data()) + static_cast<size_t>(off) * dtype_size(bcat.dtype()),
            b.data(), b.nbytes());
      }
      name += "_" + n.name;
      off += widths[i];
    }
    ops::LinearParam p = *l0;
    p.transpose_b = true;
    std::vector<TensorId> in = {x, s.add_weight(name + ".weight", wcat)};
    if (l0->has_bias) in.push_back(s.add_weight(name + ".bias", bcat));
    const TensorId fused = s.g.add1(name, p, in);
    off = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      Node& n = s.mnode(group[i]);
      n.op = Slice{.axis = -1, .start = off, .end = off + widths[i]};
      n.inputs = {fused};
      s.dirty[static_cast<size_t>(group[i])] = 1;
      off += widths[i];
    }
    s.dirty.push_back(1);  // the node just added
    ++fired;
  }
  return fired;
}

// ---- gated_mlp: act(gate) * up, where gate and up are the two halves of one tensor (a merged
// gate-up Linear) -> Activation SwiGLU / GeGLU on that tensor.
int gated_mlp(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    if (!s.free(k) || !s.ew(k, ElementwiseType::kMul)) continue;
    const Node& n = s.node(k);
    for (int side = 0; side < 2; ++side) {
      const TensorId ta = n.inputs[static_cast<size_t>(side)];
      const TensorId up = n.inputs[static_cast<size_t>(1 - side)];
      const int ka = s.producer(ta);
      const auto* act = s.param<ops::ActivationParam>(ka);
      if (!act || !s.free(ka) || !s.single(ta) || ops::is_gated(act->type)) continue;
      ops::ActivationType gated;
      if (act->type == ops::ActivationType::kSilu) {
        gated = ops::ActivationType::kSwiGlu;
      } else if (act->type == ops::ActivationType::kGeluErf) {
        gated = ops::ActivationType::kGeGluErf;
      } else if (act->type == ops::ActivationType::kGeluTanh) {
        gated = ops::ActivationType::kGeGluTanh;
      } else {
        continue;
      }
      const TensorId gate = s.node(ka).inputs[0];
      const int kg = s.producer(gate), ku = s.producer(up);
      const auto* sg = kg >= 0 ? std::get_if<Slice>(&s.node(kg).op) : nullptr;
      const auto* su = ku >= 0 ? std::get_if<Slice>(&s.node(ku).op) : nullptr;
      if (!sg || !su || !s.free(kg) || !s.free(ku) || !s.single(gate) || !s.single(up)) continue;
      const TensorId base = s.node(kg).inputs[0];
      if (s.node(ku).inputs[0] != base) continue;
      const TensorDesc& bd = s.desc(base);
      const int64_t f = s.desc(gate).dim(-1);
      if (norm_axis(sg->axis, bd.ndim) != bd.ndim - 1 ||
          norm_axis(su->axis, bd.ndim) != bd.ndim - 1 || bd.dim(-1) != 2 * f ||
          s.desc(up).dim(-1) != f || s.uses[static_cast<size_t>(base)] != 2)
        continue;
      const bool gate_first = sg->start == 0 && su->start == f;
      const bool up_first = su->start == 0 && sg->start == f;
      if (!gate_first && !up_first) continue;
      s.mark({ka, kg, ku});
      s.set_op(k, ops::ActivationParam{.type = gated, .gate_first = gate_first}, {base});
      ++fired;
      break;
    }
  }
  return fired;
}

// t is a plain Linear's output, or a Reshape view of one that keeps the last dim (an exporter
// flattens to 2-D around Gemm): returns the Linear (kl) and the view node (kv, or -1).
const ops::LinearParam* linear_through_view(const State& s, TensorId t, int* kl, int* kv) {
  *kv = -1;
  const int k = s.producer(t);
  if (s.free(k) && s.single(t) && std::holds_alternative<Reshape>(s.node(k).op)) {
    const TensorId in = s.node(k).inputs[0];
    if (s.desc(in).ndim >= 1 && s.desc(t).ndim >= 1 && s.desc(in).dim(-1) == s.desc(t).dim(-1)) {
      *kv = k;
      t = in;
    }
  }
  return plain_linear(s, t, kl);
}

// After folding node k into Linear kl: node k becomes the view the Linear's output went
// through (or is left unread when there was none).
void retarget(State& s, int k, int kl, int kv) {
  if (kv < 0) return;
  Node& n = s.mnode(k);
  n.op = s.node(kv).op;
  n.inputs = {s.node(kl).outputs[0]};
  s.mark({k, kv});
}

// ---- linear_activation: Linear -> GELU / SiLU / ReLU -> one Linear with the activation.
int linear_activation(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    const auto* a = s.param<ops::ActivationParam>(k);
    if (!a || !s.free(k) || ops::is_gated(a->type)) continue;
    int kl = -1, kv = -1;
    const auto* l = linear_through_view(s, s.node(k).inputs[0], &kl, &kv);
    if (!l || l->activation != ops::Activation::kNone) continue;
    ops::LinearParam p = *l;
    switch (a->type) {
      case ops::ActivationType::kRelu:
        p.activation = ops::Activation::kRelu;
        break;
      case ops::ActivationType::kGeluErf:
        p.activation = ops::Activation::kGeluErf;
        break;
      case ops::ActivationType::kGeluTanh:
        p.activation = ops::Activation::kGeluTanh;
        break;
      case ops::ActivationType::kSilu:
        p.activation = ops::Activation::kSilu;
        break;
      default:
        continue;
    }
    if (kv < 0) {
      const std::vector<TensorId> in = s.node(kl).inputs;
      s.mark({kl});
      s.set_op(k, p, in);
    } else {
      s.set_op(kl, p, s.node(kl).inputs);
      retarget(s, k, kl, kv);
    }
    ++fired;
  }
  return fired;
}

// ---- linear_residual: Linear + r (same shape) -> Linear with the residual in its epilogue.
int linear_residual(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    if (!s.free(k) || !s.ew(k, ElementwiseType::kAdd)) continue;
    const Node& n = s.node(k);
    for (int side = 0; side < 2; ++side) {
      int kl = -1, kv = -1;
      const TensorId t = n.inputs[static_cast<size_t>(side)];
      const TensorId r = n.inputs[static_cast<size_t>(1 - side)];
      const auto* l = linear_through_view(s, t, &kl, &kv);
      if (!l || r == t || !s.same(t, r) || !s.same(t, n.outputs[0]) ||
          s.desc(r).dtype != s.desc(t).dtype)
        continue;
      ops::LinearParam p = *l;
      p.has_residual = true;
      std::vector<TensorId> in = s.node(kl).inputs;
      if (kv < 0) {
        in.push_back(r);
        s.mark({kl});
        s.set_op(k, p, in);
      } else {
        // The residual seen in the Linear's own (flattened) shape: a view, no copy.
        const TensorDesc lo = s.desc(s.node(kl).outputs[0]);
        if (lo.ndim != 2) continue;  // only the 2-D flattening exporters emit
        const std::string view_name = n.name + ".residual_view";
        in.push_back(s.g.add1(view_name, Reshape{.shape = {-1, lo.dim(-1)}}, {r}));
        s.dirty.push_back(1);
        s.set_op(kl, p, in);
        retarget(s, k, kl, kv);
      }
      ++fired;
      break;
    }
  }
  return fired;
}

// ---- prenorm: Add(a, b) -> Norm  =>  one norm op that adds the residual: PRENORM (also gives
// the sum, when others read it) or POSTNORM (only the norm reads it).
int prenorm(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    const auto* rms = s.param<ops::RmsNormParam>(k);
    const auto* ln = s.param<ops::LayerNormParam>(k);
    if ((!rms && !ln) || !s.free(k)) continue;
    if ((rms && (rms->layer != ops::NormLayer::kNorm || rms->output_stats)) ||
        (ln && (ln->layer != ops::NormLayer::kNorm || ln->output_stats)))
      continue;
    const Node& n = s.node(k);
    const TensorId sum = n.inputs[0];
    const int ka = s.producer(sum);
    if (!s.free(ka) || !s.ew(ka, ElementwiseType::kAdd)) continue;
    const Node& add = s.node(ka);
    const TensorId a = add.inputs[0], b = add.inputs[1];
    if (!s.same(a, sum) || !s.same(b, sum) || s.weight(a) || s.weight(b)) continue;
    if (s.out[static_cast<size_t>(sum)]) continue;  // keep graph outputs where they are
    const bool others = !s.single(sum);
    std::vector<TensorId> in = {a, b};
    for (size_t i = 1; i < n.inputs.size(); ++i) in.push_back(n.inputs[i]);
    const ops::NormLayer layer = others ? ops::NormLayer::kPreNorm : ops::NormLayer::kPostNorm;
    AnyParam p;
    if (rms) {
      ops::RmsNormParam q = *rms;
      q.layer = layer;
      p = q;
    } else {
      ops::LayerNormParam q = *ln;
      q.layer = layer;
      p = q;
    }
    s.mark({ka});
    s.set_op(k, p, in);
    if (others) {
      // The sum becomes the norm's second output; the Add is left unread.
      const TensorId fresh = s.g.new_tensor(s.g.tensors()[static_cast<size_t>(sum)].name + ".sum");
      s.g.replace_uses(sum, fresh);
      s.mnode(k).outputs.push_back(fresh);
    }
    ++fired;
  }
  return fired;
}

// A chain of Transposes from t back to a source: t = permute(src, perm) with the composite
// perm (identity when t is not a transpose). Intermediate transposes must have one reader.
TensorId transpose_source(const State& s, TensorId t, std::vector<int>* perm,
                          std::vector<int>* used) {
  const int rank = s.desc(t).ndim;
  perm->resize(static_cast<size_t>(rank));
  std::iota(perm->begin(), perm->end(), 0);
  for (;;) {
    const int k = s.producer(t);
    const auto* tp = s.param<ops::TransposeParam>(k);
    if (!tp || !s.free(k) || !s.single(t)) return t;
    if (tp->perm.empty()) {  // the identity: a contiguous copy
      used->push_back(k);
      t = s.node(k).inputs[0];
      continue;
    }
    // t.dim(i) = in.dim(p[i]); composite: result.dim(i) = t.dim(perm[i]) = in.dim(p[perm[i]]).
    std::vector<int> next(static_cast<size_t>(rank));
    for (int i = 0; i < rank; ++i)
      next[static_cast<size_t>(i)] =
          norm_axis(tp->perm[static_cast<size_t>((*perm)[static_cast<size_t>(i)])], rank);
    *perm = next;
    used->push_back(k);
    t = s.node(k).inputs[0];
  }
}

// t = repeat_kv(base), the exporter's GQA expansion: Reshape base (B, Hkv, S, D) to
// (B, Hkv, 1, S, D), Expand to (B, Hkv, n, S, D), Reshape to (B, Hkv·n, S, D). Returns base and
// the three nodes, or -1. Flash attention reads the Hkv heads directly (GQA), so the copy the
// last Reshape makes disappears.
TensorId repeat_kv_base(const State& s, TensorId t, std::vector<int>* used) {
  auto view_of = [&](TensorId x, auto kind) -> int {
    const int k = s.producer(x);
    return s.free(k) && s.single(x) && std::holds_alternative<decltype(kind)>(s.node(k).op) ? k
                                                                                            : -1;
  };
  const int k1 = view_of(t, Reshape{});
  if (k1 < 0) return -1;
  const TensorId e = s.node(k1).inputs[0];
  const int k2 = view_of(e, Expand{});
  if (k2 < 0) return -1;
  const TensorId u = s.node(k2).inputs[0];
  const int k3 = view_of(u, Reshape{});
  if (k3 < 0) return -1;
  const TensorId base = s.node(k3).inputs[0];
  const TensorDesc &bd = s.desc(base), &ud = s.desc(u), &ed = s.desc(e), &td = s.desc(t);
  if (bd.ndim != 4 || ud.ndim != 5 || ed.ndim != 5 || td.ndim != 4) return -1;
  const int64_t B = bd.dim(0), H = bd.dim(1), S = bd.dim(2), D = bd.dim(3), n = ed.dim(2);
  if (ud.shape() != Shape{B, H, 1, S, D} || ed.shape() != Shape{B, H, n, S, D} ||
      td.shape() != Shape{B, H * n, S, D})
    return -1;
  used->insert(used->end(), {k1, k2, k3});
  return base;
}

// Layout of a (B, H, S, D)-ordered tensor given as permute(src, perm): BNSD when the perm is
// the identity, BSND when it swaps axes 1 and 2; else no layout (-1).
int layout_of(const std::vector<int>& perm) {
  if (perm == std::vector<int>{0, 1, 2, 3}) return static_cast<int>(ops::QkvLayout::kBNSD);
  if (perm == std::vector<int>{0, 2, 1, 3}) return static_cast<int>(ops::QkvLayout::kBSND);
  return -1;
}

// The mask kind of a constant additive mask (Sq, Sk) or (1, 1, Sq, Sk): causal when entries
// visible under bottom-right causal alignment are 0 and the others are -inf or <= -1e4 (which
// exp underflows to exactly 0 in f32 after the max is subtracted).
// *all_inf: every hidden entry is -inf (then any softmax scale keeps it hidden). Sq > Sk is
// not causal here: its first rows see no key, which the unfused softmax does not turn to 0.
bool causal_mask(const Tensor& m, bool* all_inf) {
  if (m.ndim() < 2 || m.numel() != m.dim(-1) * m.dim(-2) || m.dtype() != DType::kF32) return false;
  const int64_t sq = m.dim(-2), sk = m.dim(-1);
  if (sq > sk) return false;
  *all_inf = true;
  const Tensor c = m.contiguous_copy();
  const float* p = c.data_as<float>();
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j) {
      const float v = p[i * sk + j];
      const bool visible = j <= i + sk - sq;
      if (visible ? v != 0.0f : !(v <= -1e4f)) return false;
      if (!visible && !std::isinf(v)) *all_inf = false;
    }
  return true;
}

// ---- attention: MatMul(Q, Kᵀ) [· c | / c] [+ mask] -> Softmax -> MatMul(·, V) -> SelfAttention,
// reading q, k, v in place (BSND when they come from (B, S, H, D) tensors through transposes)
// and writing o in the layout its reader wants.
int attention(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    const auto* pv = s.param<ops::MatMulParam>(k);
    if (!pv || !s.free(k) || pv->transpose_a || pv->transpose_b || pv->alpha != 1.0f) continue;
    const Node& n_pv = s.node(k);
    const TensorId probs = n_pv.inputs[0], v = n_pv.inputs[1];
    if (s.desc(probs).ndim != 4 || s.desc(v).ndim != 4) continue;
    const int k_sm = s.producer(probs);
    const auto* sm = s.param<ops::SoftmaxParam>(k_sm);
    if (!sm || !s.free(k_sm) || !s.single(probs)) continue;
    std::vector<int> used = {k_sm};
    double scale = sm->scale;
    TensorId t = s.node(k_sm).inputs[0];
    TensorId mask = -1;
    bool causal = false;
    int64_t mask_rows = 0;  // > 0: a key mask to repeat over this many queries
    Shape mask_shape;
    // Optional mask add.
    if (const int ka = s.ew_of(t, ElementwiseType::kAdd); ka >= 0) {
      const Node& add = s.node(ka);
      for (int side = 0; side < 2; ++side) {
        const TensorId m = add.inputs[static_cast<size_t>(1 - side)];
        const TensorDesc& md = s.desc(m);
        const TensorDesc& sd = s.desc(add.inputs[static_cast<size_t>(side)]);
        if (sd.ndim != 4 || md.dtype != DType::kF32 || md.ndim < 2 || md.dim(-1) != sd.dim(-1))
          continue;
        // A key mask (one row broadcast over the queries: padding from lengths) is passed as
        // that row repeated by an Expand view (stride 0, no copy), when Sq is not symbolic.
        const TensorId sc = add.inputs[static_cast<size_t>(side)];
        const bool rows = md.dim(-2) == sd.dim(-2) && s.d2[static_cast<size_t>(m)].dim(-2) ==
                                                          s.d2[static_cast<size_t>(sc)].dim(-2);
        const bool key_row = md.dim(-2) == 1 && s.d2[static_cast<size_t>(sc)].dim(-2) == sd.dim(-2);
        if (!rows && !key_row) continue;
        const bool batchless = md.ndim == 2 || (md.ndim == 4 && md.dim(0) == 1 && md.dim(1) == 1);
        const bool per_batch = md.ndim == 4 && md.dim(1) == 1 && md.dim(0) == sd.dim(0);
        if (!batchless && !per_batch) continue;
        const Tensor* mw = s.weight(m);
        bool all_inf = false;
        // A finite "hidden" value stays hidden only if nothing scales it toward 0.
        if (rows && mw && causal_mask(*mw, &all_inf) && (all_inf || scale == 1.0)) {
          causal = true;
        } else {
          if (scale != 1.0) continue;  // softmax's scale would scale the mask too
          mask = m;
          if (!rows) {
            mask_rows = sd.dim(-2);
            mask_shape = md.shape();
          }
        }
        t = add.inputs[static_cast<size_t>(side)];
        used.push_back(ka);
        break;
      }
      if (!causal && mask < 0) continue;
    }
    // Optional scale.
    for (const ElementwiseType et : {ElementwiseType::kMul, ElementwiseType::kDiv}) {
      const int ks = s.ew_of(t, et);
      if (ks < 0) continue;
      const Node& sn = s.node(ks);
      double c = 0;
      if (s.scalar(sn.inputs[1], &c) && c != 0.0) {
        scale *= et == ElementwiseType::kMul ? c : 1.0 / c;
        t = sn.inputs[0];
      } else if (et == ElementwiseType::kMul && s.scalar(sn.inputs[0], &c)) {
        scale *= c;
        t = sn.inputs[1];
      } else {
        continue;
      }
      used.push_back(ks);
      break;
    }
    const int k_qk = s.producer(t);
    const auto* qk = s.param<ops::MatMulParam>(k_qk);
    if (!qk || !s.free(k_qk) || !s.single(t) || qk->transpose_a) continue;
    used.push_back(k_qk);
    scale *= qk->alpha;
    const Node& n_qk = s.node(k_qk);
    // Sources of q, k (as (B, H, S, D) = permute(src, perm)) and v.
    std::vector<int> pq, pk, pvv;
    std::vector<int> tused;
    const TensorId q_src = transpose_source(s, n_qk.inputs[0], &pq, &tused);
    TensorId k_src;
    if (qk->transpose_b) {
      k_src = transpose_source(s, n_qk.inputs[1], &pk, &tused);
    } else {
      k_src = transpose_source(s, n_qk.inputs[1], &pk, &tused);
      if (pk.size() != 4) continue;
      std::swap(pk[2], pk[3]);  // Kᵀ = permute(src, pk) -> K = permute(src, pk with 2, 3 swapped)
    }
    TensorId v_src = transpose_source(s, v, &pvv, &tused);
    if (pq.size() != 4 || pk.size() != 4 || pvv.size() != 4) continue;
    // GQA written as repeat_kv: read the un-repeated K and V.
    auto through_repeat = [&](TensorId* src, std::vector<int>* perm) {
      if (*perm != std::vector<int>{0, 1, 2, 3}) return;
      const TensorId base = repeat_kv_base(s, *src, &tused);
      if (base >= 0) *src = transpose_source(s, base, perm, &tused);
    };
    through_repeat(&k_src, &pk);
    through_repeat(&v_src, &pvv);
    const int lq = layout_of(pq), lk = layout_of(pk), lv = layout_of(pvv);
    if (lq < 0 || lq != lk || lq != lv) continue;
    const auto layout = static_cast<ops::QkvLayout>(lq);
    // Dims: (B, H, S, D) order from the q tensor the MatMul saw.
    const TensorDesc& qd = s.desc(n_qk.inputs[0]);
    const int ha = layout == ops::QkvLayout::kBSND ? 2 : 1;  // the heads axis of the sources
    const int64_t hkv = s.desc(k_src).dim(ha);
    if (qd.dim(1) % std::max<int64_t>(1, hkv) != 0 || s.desc(v_src).dim(ha) != hkv) continue;
    // The output: (B, H, Sq, Dv). With BSND, a reader transposing it back to (B, S, H, Dv)
    // gets the attention output directly.
    const TensorId o = n_pv.outputs[0];
    int k_ot = -1;
    if (layout == ops::QkvLayout::kBSND && s.single(o)) {
      for (int r = 0; r < static_cast<int>(s.g.nodes().size()); ++r) {
        const auto* tp = s.param<ops::TransposeParam>(r);
        if (tp && s.free(r) && s.node(r).inputs[0] == o) {
          std::vector<int> p4;
          for (int64_t a : tp->perm) p4.push_back(norm_axis(a, 4));
          if (p4 == std::vector<int>{0, 2, 1, 3}) k_ot = r;
        }
      }
    }
    if (layout == ops::QkvLayout::kBSND && k_ot < 0) continue;  // would need a transpose back
    // The op reads scale 0 as "1/sqrt(D)"; a real zero (or a non-finite scale) stays unfused.
    if (!(std::isfinite(scale) && scale != 0.0)) continue;
    ops::AttentionParam ap;
    ap.layout = layout;
    ap.scale = static_cast<float>(scale);
    ap.causal = causal;
    ap.custom_mask = mask >= 0;
    std::vector<TensorId> in = {q_src, k_src, v_src};
    if (mask >= 0 && mask_rows > 0) {
      std::vector<int64_t> full(mask_shape.begin(), mask_shape.end());
      full[full.size() - 2] = mask_rows;
      mask = s.g.add1(s.node(k).name + ".mask_rows", Expand{.shape = full}, {mask});
      s.dirty.push_back(1);
    }
    if (mask >= 0) in.push_back(mask);
    for (int u : used) s.mark({u});
    for (int u : tused) s.mark({u});
    const std::string name = s.node(k).name + ".attention";
    // The attention node replaces the output transpose (BSND) or the PV MatMul (BNSD); the
    // lse output is new and unread.
    const int target = k_ot >= 0 ? k_ot : k;
    if (k_ot >= 0) s.mark({k});
    s.set_op(target, ap, in);
    s.mnode(target).outputs.push_back(s.g.new_tensor(name + ".lse"));
    ++fired;
  }
  return fired;
}

// ---- rope_cache_write: Rope(k) -> ReshapeAndCache(k, ...) -> one ReshapeAndCache that
// rotates k as it writes the cache (the rotated k never exists outside the cache).
int rope_cache_write(State& s) {
  int fired = 0;
  for (int k = 0; k < static_cast<int>(s.g.nodes().size()); ++k) {
    const auto* rc = s.param<ops::ReshapeAndCacheParam>(k);
    if (!rc || !s.free(k) || rc->apply_rope) continue;
    const Node& n = s.node(k);
    const int kr = s.producer(n.inputs[0]);
    const auto* rp = s.param<ops::RopeParam>(kr);
    if (!rp || !s.free(kr) || !s.single(n.inputs[0]) || s.desc(s.node(kr).inputs[0]).ndim != 3)
      continue;
    ops::ReshapeAndCacheParam p;
    p.apply_rope = true;
    p.rope = *rp;
    const Node& rn = s.node(kr);
    std::vector<TensorId> in = {rn.inputs[0], n.inputs[1], n.inputs[2],
                                n.inputs[3],  n.inputs[4], rn.inputs[1]};
    s.mark({kr});
    s.set_op(k, p, in);
    ++fired;
  }
  return fired;
}

int dead_nodes(State& s) { return s.g.prune(); }

struct Pattern {
  const char* name;
  int (*run)(State&);
};

// The patterns, in the order they run each round. Order matters where two patterns compete
// for a node: merge_linears and gated_mlp run before linear_activation, so a gate projection
// joins its up projection before its SiLU could be folded into it alone; linear_residual runs
// before prenorm, because a residual in the GEMM's epilogue moves fewer bytes than a norm that
// also writes the sum.
constexpr Pattern kPatterns[] = {
    {"remove_noop", remove_noop},
    {"fold_constants", fold_constants},
    {"silu", silu},
    {"gelu", gelu},
    {"norms", norms},
    {"norm_bias", norm_bias},
    {"linear", linear},
    {"linear_bias", linear_bias},
    {"merge_linears", merge_linears},
    {"gated_mlp", gated_mlp},
    {"linear_activation", linear_activation},
    {"linear_residual", linear_residual},
    {"attention", attention},
    {"prenorm", prenorm},
    {"rope_cache_write", rope_cache_write},
    {"dead_nodes", dead_nodes},
};

}  // namespace

std::vector<std::string> pattern_names() {
  std::vector<std::string> v;
  for (const Pattern& p : kPatterns) v.emplace_back(p.name);
  return v;
}

OptimizeResult optimize(Graph& g, const std::vector<TensorDesc>& example_inputs,
                        const OptimizeOptions& options) {
  for (const std::string& d : options.disabled) {
    const auto names = pattern_names();
    TBOOST_CHECK_CODE(std::find(names.begin(), names.end(), d) != names.end(),
                      ErrorCode::kInvalidArgument, "optimize: unknown pattern '", d, "'");
  }
  OptimizeResult r;
  for (const Pattern& p : kPatterns) r.fired[p.name] = 0;
  State s{g, example_inputs, {}, {}, {}, {}, {}, {}, {}};
  if (Bindings b = g.bind(example_inputs); !b.empty()) {
    for (auto& [name, v] : b) ++v;
    s.example2 = g.input_descs(b);
  }
  s.refresh();
  r.ops_before = g.op_count();
  for (int round = 0; round < 64; ++round) {
    int total = 0;
    for (const Pattern& p : kPatterns) {
      if (options.disabled.count(p.name)) continue;
      const int n = p.run(s);
      if (n > 0) {
        if (std::string(p.name) != "dead_nodes") total += n;
        r.fired[p.name] += n;
        // What a rewrite left unread is removed now (so use counts are right for the next
        // pattern), and counted as dead nodes.
        r.fired["dead_nodes"] += g.prune();
        s.refresh();
      }
    }
    if (total == 0) break;
  }
  r.ops_after = g.op_count();
  return r;
}

}  // namespace tboost::graph
