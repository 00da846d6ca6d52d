// Op-by-op GPT-2 and LLaMA layers (the unfused form the passes start from).
#include "tboost/graph/layers.h"

#include <cmath>
#include <limits>
#include <random>

#include "tboost/core/error.h"

namespace tboost::graph {
namespace {

using ops::ElementwiseParam;
using ops::ElementwiseType;

struct Builder {
  Graph g;
  std::mt19937_64 rng;
  int counter = 0;

  explicit Builder(uint64_t seed) : rng(seed) {}

  TensorId rand_weight(const std::string& name, const Shape& shape, double scale) {
    Tensor t = Tensor::empty(DType::kF32, shape);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    float* p = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(scale) * u(rng);
    return g.weight(name, t);
  }
  TensorId ones_ish(const std::string& name, int64_t n) {  // norm gains near 1
    Tensor t = Tensor::empty(DType::kF32, {n});
    std::uniform_real_distribution<float> u(0.8f, 1.2f);
    for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = u(rng);
    return g.weight(name, t);
  }
  TensorId scalar(float v) {
    Tensor t = Tensor::empty(DType::kF32, {1});
    t.data_as<float>()[0] = v;
    return g.weight("const" + std::to_string(counter++), t);
  }
  TensorId ew(ElementwiseType t, TensorId a, TensorId b = -1) {
    const std::string n = std::string(ops::elementwise_type_name(t)) + std::to_string(counter++);
    if (b < 0) return g.add1(n, ElementwiseParam{.type = t}, {a});
    return g.add1(n, ElementwiseParam{.type = t}, {a, b});
  }
  TensorId mean_last(TensorId x) {
    return g.add1("mean" + std::to_string(counter++), ops::ReduceParam{.axes = {-1}}, {x});
  }
  TensorId matmul(TensorId a, TensorId b, bool tb = false) {
    return g.add1("matmul" + std::to_string(counter++), ops::MatMulParam{.transpose_b = tb},
                  {a, b});
  }
  TensorId transpose(TensorId x, std::vector<int64_t> perm) {
    return g.add1("transpose" + std::to_string(counter++), ops::TransposeParam{.perm = perm}, {x});
  }
  TensorId reshape(TensorId x, std::vector<int64_t> shape) {
    return g.add1("reshape" + std::to_string(counter++), Reshape{.shape = shape}, {x});
  }
  TensorId linear(const std::string& name, TensorId x, int64_t k, int64_t n, bool bias) {
    const TensorId w = rand_weight(name + ".weight", {k, n}, 1.0 / std::sqrt(double(k)));
    TensorId y = matmul(x, w);
    if (bias) y = ew(ElementwiseType::kAdd, y, rand_weight(name + ".bias", {n}, 0.1));
    return y;
  }
  TensorId layer_norm(const std::string& name, TensorId x, int64_t c) {
    const TensorId mu = mean_last(x);
    const TensorId d = ew(ElementwiseType::kSub, x, mu);
    const TensorId var = mean_last(ew(ElementwiseType::kPow, d, scalar(2.0f)));
    const TensorId sd = ew(ElementwiseType::kSqrt, ew(ElementwiseType::kAdd, var, scalar(1e-5f)));
    const TensorId n = ew(ElementwiseType::kDiv, d, sd);
    return ew(ElementwiseType::kAdd, ew(ElementwiseType::kMul, n, ones_ish(name + ".weight", c)),
              rand_weight(name + ".bias", {c}, 0.1));
  }
  TensorId rms_norm(const std::string& name, TensorId x, int64_t c) {
    const TensorId ms = mean_last(ew(ElementwiseType::kPow, x, scalar(2.0f)));
    const TensorId r = ew(ElementwiseType::kRsqrt, ew(ElementwiseType::kAdd, ms, scalar(1e-6f)));
    return ew(ElementwiseType::kMul, ones_ish(name + ".weight", c),
              ew(ElementwiseType::kMul, x, r));
  }
  // (B, T, C) -> (B, H, T, D)
  TensorId heads(TensorId x, int64_t h, int64_t d) {
    return transpose(reshape(x, {0, 0, h, d}), {0, 2, 1, 3});
  }
  TensorId causal_mask(int64_t t) {
    Tensor m = Tensor::empty(DType::kF32, {t, t});
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j)
        m.data_as<float>()[i * t + j] = j <= i ? 0.0f : -std::numeric_limits<float>::infinity();
    return g.weight("causal_mask", m);
  }
  // q, k, v: (B, H, T, D) -> (B, T, C)
  TensorId attention(TensorId q, TensorId k, TensorId v, const LayerShape& s) {
    const int64_t d = s.hidden / s.heads;
    TensorId sc = matmul(q, transpose(k, {0, 1, 3, 2}));
    sc = ew(ElementwiseType::kDiv, sc, scalar(static_cast<float>(std::sqrt(double(d)))));
    if (s.causal) sc = ew(ElementwiseType::kAdd, sc, causal_mask(s.seq));
    const TensorId p = g.add1("softmax" + std::to_string(counter++), ops::SoftmaxParam{}, {sc});
    const TensorId o = transpose(matmul(p, v), {0, 2, 1, 3});
    return reshape(o, {0, 0, s.hidden});
  }
};

void check_shape(const LayerShape& s) {
  TBOOST_CHECK_CODE(s.kv_heads >= 0 && (s.kv_heads == 0 || s.heads % s.kv_heads == 0),
                    ErrorCode::kInvalidArgument, "layer shape: kv_heads ", s.kv_heads,
                    " must divide heads ", s.heads);
  TBOOST_CHECK_CODE(
      s.hidden > 0 && s.heads > 0 && s.hidden % s.heads == 0 && s.ffn > 0 && s.seq > 0,
      ErrorCode::kInvalidArgument, "layer shape: hidden ", s.hidden,
      " must be a positive multiple of heads ", s.heads, "; ffn ", s.ffn, ", seq ", s.seq,
      " positive");
}

}  // namespace

Graph gpt2_layer(const LayerShape& s) {
  check_shape(s);
  Builder b(s.seed);
  const int64_t c = s.hidden, h = s.heads, d = c / h;
  const TensorId x = b.g.input("x", DType::kF32, {"batch", s.seq, c});
  const TensorId y1 = b.layer_norm("ln_1", x, c);
  const TensorId qkv = b.linear("attn.c_attn", y1, c, 3 * c, true);
  auto part = [&](int i) {
    return b.g.add1("split" + std::to_string(i),
                    Slice{.axis = -1, .start = i * c, .end = (i + 1) * c}, {qkv});
  };
  const TensorId q = b.heads(part(0), h, d), k = b.heads(part(1), h, d), v = b.heads(part(2), h, d);
  const TensorId a = b.linear("attn.c_proj", b.attention(q, k, v, s), c, c, true);
  const TensorId h1 = b.ew(ElementwiseType::kAdd, x, a);
  const TensorId y2 = b.layer_norm("ln_2", h1, c);
  const TensorId f = b.linear("mlp.c_fc", y2, c, s.ffn, true);
  // gelu_new: 0.5 · f · (1 + tanh(√(2/π) · (f + 0.044715 · f³)))
  const TensorId f3 = b.ew(ElementwiseType::kPow, f, b.scalar(3.0f));
  const TensorId inner =
      b.ew(ElementwiseType::kAdd, f, b.ew(ElementwiseType::kMul, f3, b.scalar(0.044715f)));
  const TensorId th = b.ew(ElementwiseType::kTanh,
                           b.ew(ElementwiseType::kMul, inner, b.scalar(0.7978845608028654f)));
  const TensorId gl = b.ew(ElementwiseType::kMul, b.ew(ElementwiseType::kMul, b.scalar(0.5f), f),
                           b.ew(ElementwiseType::kAdd, th, b.scalar(1.0f)));
  const TensorId m = b.linear("mlp.c_proj", gl, s.ffn, c, true);
  b.g.output(b.ew(ElementwiseType::kAdd, h1, m), "y");
  return std::move(b.g);
}

Graph llama_layer(const LayerShape& s) {
  check_shape(s);
  Builder b(s.seed);
  const int64_t c = s.hidden, h = s.heads, d = c / h;
  const TensorId x = b.g.input("x", DType::kF32, {"batch", s.seq, c});
  const TensorId pos = b.g.input("positions", DType::kI32, {"batch", s.seq});
  const TensorId y1 = b.rms_norm("input_layernorm", x, c);
  const int64_t hkv = s.kv_heads ? s.kv_heads : h, rep = h / hkv;
  auto proj = [&](const char* n, int64_t out) {
    return b.linear(std::string("self_attn.") + n, y1, c, out, false);
  };
  const TensorId q0 = proj("q_proj", c), k0 = proj("k_proj", hkv * d), v0 = proj("v_proj", hkv * d);
  auto rope = [&](TensorId t, int64_t heads) {  // (B, T, heads·D) -> (B, T, heads, D) rotated
    return b.g.add1("rope" + std::to_string(b.counter++), ops::RopeParam{},
                    {b.reshape(t, {0, 0, heads, d}), pos});
  };
  // (B, Hkv, T, D) -> (B, H, T, D), each K/V head repeated for its group of query heads.
  auto repeat_kv = [&](TensorId t) {
    if (rep == 1) return t;
    const TensorId u = b.reshape(t, {0, hkv, 1, s.seq, d});
    const TensorId e = b.g.add1("expand" + std::to_string(b.counter++),
                                Expand{.shape = {1, hkv, rep, s.seq, d}}, {u});
    return b.reshape(e, {0, h, s.seq, d});
  };
  const TensorId q = b.transpose(rope(q0, h), {0, 2, 1, 3});
  const TensorId k = repeat_kv(b.transpose(rope(k0, hkv), {0, 2, 1, 3}));
  const TensorId v = repeat_kv(b.heads(v0, hkv, d));
  const TensorId a = b.linear("self_attn.o_proj", b.attention(q, k, v, s), c, c, false);
  const TensorId h1 = b.ew(ElementwiseType::kAdd, x, a);
  const TensorId y2 = b.rms_norm("post_attention_layernorm", h1, c);
  const TensorId gate = b.linear("mlp.gate_proj", y2, c, s.ffn, false);
  const TensorId up = b.linear("mlp.up_proj", y2, c, s.ffn, false);
  const TensorId act = b.ew(ElementwiseType::kMul, gate, b.ew(ElementwiseType::kSigmoid, gate));
  const TensorId m =
      b.linear("mlp.down_proj", b.ew(ElementwiseType::kMul, act, up), s.ffn, c, false);
  b.g.output(b.ew(ElementwiseType::kAdd, h1, m), "y");
  return std::move(b.g);
}

}  // namespace tboost::graph
