// OptimizedTransformer: weights, the fused graphs of each family, the KV cache and sessions.
#include "tboost/model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "src/kernels/cpu/kernels.h"
#include "src/model/step_ways.h"
#include "tboost/core/cpu_features.h"
#include "tboost/core/error.h"
#include "tboost/graph/executor.h"
#include "tboost/graph/graph.h"
#include "tboost/ops/activation.h"
#include "tboost/ops/attention.h"
#include "tboost/ops/elementwise.h"
#include "tboost/ops/embedding.h"
#include "tboost/ops/linear.h"
#include "tboost/ops/norm.h"
#include "tboost/ops/rope.h"
#include "tboost/ops/select.h"

namespace tboost::model {
namespace {

using graph::Graph;
using graph::TensorId;

[[noreturn]] void fail(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

// ---- weights ---------------------------------------------------------------------------------

// Weights the model makes itself (read from a checkpoint, converted, transposed, random) are
// carved one after another from large chunks: chunks of 4 MiB and more sit on 2 MiB pages
// (aligned_buffer, zeroed_buffer), and decode streams every weight once per token. Measured:
// llama-110m bf16 with one small-page buffer per tensor decoded 84-88 tok/s against 98-103 from a
// checkpoint read into one buffer.
class WeightArena {
 public:
  // One chunk of `bytes` up front, taking memory only as tensors are written into it: a model
  // read from its checkpoint lies in one region. With 64 MiB chunks, each chunk's last huge
  // page was resident and the rest of it unused (llama-1b bf16: 31 MB more than the weights).
  void reserve(size_t bytes) {
    chunks_.push_back(zeroed_buffer(bytes));
    cur_ = static_cast<char*>(chunks_.back().get());
    left_ = bytes;
  }
  Tensor alloc(DType dt, const Shape& shape) {
    const size_t bytes =
        (static_cast<size_t>(TensorDesc::contiguous(dt, shape).numel()) * dtype_size(dt) + 63) /
        64 * 64;
    if (bytes > left_) {
      const size_t chunk = std::max<size_t>(bytes, size_t{64} << 20);  // untouched tail: no RSS
      chunks_.push_back(aligned_buffer(chunk));
      cur_ = static_cast<char*>(chunks_.back().get());
      left_ = chunk;
    }
    Tensor t = Tensor::view(cur_, dt, shape);
    cur_ += bytes;
    left_ -= bytes;
    return t;
  }

 private:
  std::vector<std::shared_ptr<void>> chunks_;
  char* cur_ = nullptr;
  size_t left_ = 0;
};

// Where weights come from: a checkpoint, or tensors made here (random init).
struct Source {
  std::shared_ptr<SafeTensors> st;
  std::map<std::string, Tensor> made;
  std::string prefix;  // "model.", "transformer.", "bert.", or ""
  bool has(const std::string& n) const {
    return st ? st->has(prefix + n) : made.count(prefix + n) != 0;
  }
  Tensor raw(const std::string& n) const {
    if (st) return st->tensor(prefix + n);
    auto it = made.find(prefix + n);
    if (it == made.end()) fail("missing tensor \"" + prefix + n + "\"");
    return it->second;
  }
  std::string where() const { return st ? st->path() : std::string("random weights"); }
};

// One weight in the model's dtype and layout. From a checkpoint read on demand: read into the
// arena (converted, and for GPT-2's Conv1D transposed, where needed). From a mapped checkpoint
// or random weights: a view of the source when nothing changes, otherwise a converted
// (transposed) copy, its source released.
struct Loader {
  const Source& src;
  DType dtype;
  WeightArena& arena;
  bool any_view = false;
  size_t bytes = 0;
  // Checks the source tensor `name`: present, a floating dtype, of shape `want`. Only the
  // checkpoint's header is looked at: nothing is read.
  void check(const std::string& name, const Shape& want) const {
    if (!src.has(name)) fail(src.where() + ": missing tensor \"" + src.prefix + name + "\"");
    Shape have;
    if (src.st) {
      const auto& e = src.st->entry(src.prefix + name);
      if (!e.supported || !is_floating(e.dtype))
        throw Error(ErrorCode::kDTypeMismatch, src.where() + ": tensor \"" + src.prefix + name +
                                                   "\" has dtype " + e.dtype_name +
                                                   " (expected F32, F16 or BF16)");
      have = e.shape;
    } else {
      have = src.raw(name).shape();
    }
    if (have != want)
      fail(src.where() + ": tensor \"" + src.prefix + name + "\" has shape " +
           shape_to_string(have) + ", expected " + shape_to_string(want) + " from the config");
  }
  // A checkpoint read on demand (SafeTensors::Load::kRead): each weight is read from the file
  // straight into the arena (converted on the way where the dtypes differ), so the model never
  // holds a tensor twice. Otherwise (mapped, or made here) weights are views where they can be.
  bool reads() const { return src.st && src.st->load() == SafeTensors::Load::kRead; }
  Tensor get(const std::string& name, const Shape& expect, bool transpose = false) {
    Shape want = expect;
    if (transpose) std::swap(want[0], want[1]);
    check(name, want);
    Tensor out;
    if (transpose) {
      // (K, N) -> (N, K) in 64 x 64 tiles through f32.
      const int64_t R = expect[0], K = expect[1];
      std::vector<float> src32(static_cast<size_t>(R * K)), dst(src32.size());
      if (src.st)
        src.st->read_into(src.prefix + name, src32.data(), DType::kF32);
      else
        convert(src32.data(), DType::kF32, src.raw(name).data(), src.raw(name).dtype(), R * K);
      for (int64_t k0 = 0; k0 < K; k0 += 64)
        for (int64_t r0 = 0; r0 < R; r0 += 64)
          for (int64_t k = k0; k < std::min(K, k0 + 64); ++k)
            for (int64_t r = r0; r < std::min(R, r0 + 64); ++r)
              dst[static_cast<size_t>(r * K + k)] = src32[static_cast<size_t>(k * R + r)];
      out = arena.alloc(dtype, expect);
      convert(out.data(), dtype, dst.data(), DType::kF32, R * K);
      release_source(name);
    } else if (reads()) {
      out = arena.alloc(dtype, expect);
      src.st->read_into(src.prefix + name, out.data(), dtype);
      release_source(name);
    } else {
      const Tensor t = src.raw(name);
      if (t.dtype() != dtype) {
        out = arena.alloc(dtype, expect);
        convert(out.data(), dtype, t.data(), t.dtype(), t.numel());
        release_source(name);
      } else {
        out = t;
        any_view = true;
      }
    }
    bytes += out.nbytes();
    return out;
  }
  // A checkpoint tensor that was copied out is not read again: its memory goes back (a bf16
  // model from an f32 file holds the bf16 weights, not both).
  void release_source(const std::string& name) {
    if (src.st) src.st->release(src.prefix + name);
  }
  // Several weights stacked along their first dim into one tensor in the model's dtype (a
  // LLaMA layer's q, k, v projections; its gate and up projections), so one GEMV streams them
  // all. parts: (name, shape); the shapes agree past dim 0. A checkpoint read on demand reads
  // the parts into their places in the arena. Otherwise a view where the parts already lie one
  // after another in the model's dtype (gate and up do in a checkpoint stored in name order;
  // random weights are made so), else a copy, each source released.
  Tensor get_stacked(const std::vector<std::pair<std::string, Shape>>& parts) {
    Shape shape = parts.at(0).second;
    shape[0] = 0;
    for (const auto& [name, want] : parts) {
      check(name, want);
      shape[0] += want[0];
    }
    std::vector<Tensor> ts;
    bool adjacent = !reads();
    const char* end = nullptr;  // just past the previous part's bytes
    for (size_t i = 0; i < parts.size() && adjacent; ++i) {
      const Tensor& t = ts.emplace_back(src.raw(parts[i].first));
      adjacent = t.dtype() == dtype && (!end || end == t.data());
      end = static_cast<const char*>(t.data()) + t.nbytes();
    }
    Tensor out;
    if (adjacent) {
      out = Tensor::view(ts[0].data(), dtype, shape);
      any_view = true;
    } else {
      out = arena.alloc(dtype, shape);
      char* at = static_cast<char*>(out.data());
      for (const auto& [name, want] : parts) {
        const int64_t n = TensorDesc::contiguous(dtype, want).numel();
        if (src.st) {
          src.st->read_into(src.prefix + name, at, dtype);
        } else {
          const Tensor t = src.raw(name);
          convert(at, dtype, t.data(), t.dtype(), n);
        }
        at += static_cast<size_t>(n) * dtype_size(dtype);
        release_source(name);
      }
    }
    bytes += out.nbytes();
    return out;
  }
};

struct LayerW {
  Tensor ln1_w, ln1_b, ln2_w, ln2_b;
  // q, k and v stacked (q + 2·kv rows) and their biases: GPT-2's fused c_attn; LLaMA's and
  // BERT's separate projections through Loader::get_stacked.
  Tensor wq, bq;
  Tensor wo, bo;
  // GPT-2/BERT: up = fc, down = proj. LLaMA: w_gate holds gate and up stacked (2F rows), read by
  // one GEMV whose output a SwiGLU activation takes; w_up is empty.
  Tensor w_up, b_up, w_gate, w_down, b_down;
};

struct Weights {
  Tensor tok, pos, type;      // embeddings (pos: GPT-2/BERT; type: BERT)
  Tensor emb_ln_w, emb_ln_b;  // BERT embedding LayerNorm
  std::vector<LayerW> layers;
  Tensor norm_w, norm_b, lm_head;  // final norm (GPT-2, LLaMA), output head
};

// Uniform noise with standard deviation `std` (a cheap generator: 1B values take seconds).
void fill_random(Tensor& t, uint64_t seed, float std, float mean = 0.0f) {
  const int64_t n = t.numel();
  const float a = std * 1.7320508f;
  std::vector<float> buf(static_cast<size_t>(std::min<int64_t>(n, 1 << 16)));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (int64_t i = 0; i < n; i += static_cast<int64_t>(buf.size())) {
    const int64_t m = std::min<int64_t>(static_cast<int64_t>(buf.size()), n - i);
    for (int64_t j = 0; j < m; ++j) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      buf[static_cast<size_t>(j)] =
          mean + a * (static_cast<float>(s >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
    convert(static_cast<char*>(t.data()) + i * static_cast<int64_t>(dtype_size(t.dtype())),
            t.dtype(), buf.data(), DType::kF32, m);
  }
}

// The Hugging Face tensor names and shapes of a family, made with random values.
std::map<std::string, Tensor> random_checkpoint(const ModelConfig& c, DType dt, uint64_t seed,
                                                WeightArena& arena) {
  std::map<std::string, Tensor> m;
  uint64_t k = seed * 1000;
  auto add = [&](const std::string& n, const Shape& s, float std, float mean = 0.0f) {
    Tensor t = arena.alloc(dt, s);
    fill_random(t, ++k, std, mean);
    m[n] = t;
  };
  const int64_t C = c.hidden, F = c.ffn, V = c.vocab, q = c.heads * c.head_dim,
                kv = c.kv_heads * c.head_dim;
  const float s = 0.02f;
  if (c.family == Family::kLlama) {
    add("model.embed_tokens.weight", {V, C}, s);
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {C}, 0.1f, 1.0f);
      add(p + "post_attention_layernorm.weight", {C}, 0.1f, 1.0f);
      add(p + "self_attn.q_proj.weight", {q, C}, s);
      add(p + "self_attn.k_proj.weight", {kv, C}, s);
      add(p + "self_attn.v_proj.weight", {kv, C}, s);
      add(p + "self_attn.o_proj.weight", {C, q}, s);
      if (c.qkv_bias) {
        add(p + "self_attn.q_proj.bias", {q}, s);
        add(p + "self_attn.k_proj.bias", {kv}, s);
        add(p + "self_attn.v_proj.bias", {kv}, s);
      }
      add(p + "mlp.gate_proj.weight", {F, C}, s);
      add(p + "mlp.up_proj.weight", {F, C}, s);
      add(p + "mlp.down_proj.weight", {C, F}, s);
    }
    add("model.norm.weight", {C}, 0.1f, 1.0f);
    if (!c.tie_embeddings) add("lm_head.weight", {V, C}, s);
  } else if (c.family == Family::kGpt2) {
    add("transformer.wte.weight", {V, C}, s);
    add("transformer.wpe.weight", {c.max_positions, C}, 0.01f);
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      add(p + "ln_1.weight", {C}, 0.1f, 1.0f), add(p + "ln_1.bias", {C}, s);
      add(p + "ln_2.weight", {C}, 0.1f, 1.0f), add(p + "ln_2.bias", {C}, s);
      add(p + "attn.c_attn.weight", {C, 3 * C}, s), add(p + "attn.c_attn.bias", {3 * C}, s);
      add(p + "attn.c_proj.weight", {C, C}, s), add(p + "attn.c_proj.bias", {C}, s);
      add(p + "mlp.c_fc.weight", {C, F}, s), add(p + "mlp.c_fc.bias", {F}, s);
      add(p + "mlp.c_proj.weight", {F, C}, s), add(p + "mlp.c_proj.bias", {C}, s);
    }
    add("transformer.ln_f.weight", {C}, 0.1f, 1.0f), add("transformer.ln_f.bias", {C}, s);
  } else {
    add("embeddings.word_embeddings.weight", {V, C}, s);
    add("embeddings.position_embeddings.weight", {c.max_positions, C}, s);
    add("embeddings.token_type_embeddings.weight", {c.type_vocab, C}, s);
    add("embeddings.LayerNorm.weight", {C}, 0.1f, 1.0f), add("embeddings.LayerNorm.bias", {C}, s);
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "encoder.layer." + std::to_string(l) + ".";
      for (const char* n : {"query", "key", "value"}) {
        add(p + "attention.self." + n + ".weight", {C, C}, s);
        add(p + "attention.self." + n + ".bias", {C}, s);
      }
      add(p + "attention.output.dense.weight", {C, C}, s);
      add(p + "attention.output.dense.bias", {C}, s);
      add(p + "attention.output.LayerNorm.weight", {C}, 0.1f, 1.0f);
      add(p + "attention.output.LayerNorm.bias", {C}, s);
      add(p + "intermediate.dense.weight", {F, C}, s), add(p + "intermediate.dense.bias", {F}, s);
      add(p + "output.dense.weight", {C, F}, s), add(p + "output.dense.bias", {C}, s);
      add(p + "output.LayerNorm.weight", {C}, 0.1f, 1.0f), add(p + "output.LayerNorm.bias", {C}, s);
    }
  }
  return m;
}

// The prefix a checkpoint puts before the family's names (task heads add "bert.", causal LMs
// "model." / "transformer.", bare models none).
std::string find_prefix(const Source& s, const ModelConfig& c) {
  const char* probe = c.family == Family::kLlama  ? "embed_tokens.weight"
                      : c.family == Family::kGpt2 ? "wte.weight"
                                                  : "embeddings.word_embeddings.weight";
  for (const char* p : {"model.", "transformer.", "bert.", ""}) {
    Source t = s;
    t.prefix = p;
    if (t.has(probe)) return p;
  }
  fail(s.where() + ": no embedding table (\"" + std::string(probe) +
       "\" under any of the prefixes model., transformer., bert. or none): not a " +
       family_name(c.family) + " checkpoint?");
}

Weights load_weights(const ModelConfig& c, Source& src, DType dt, Loader& L) {
  src.prefix = find_prefix(src, c);
  Weights w;
  const int64_t C = c.hidden, F = c.ffn, V = c.vocab, q = c.heads * c.head_dim,
                kv = c.kv_heads * c.head_dim;
  if (c.family == Family::kLlama) {
    w.tok = L.get("embed_tokens.weight", {V, C});
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      LayerW lw;
      lw.ln1_w = L.get(p + "input_layernorm.weight", {C});
      lw.ln2_w = L.get(p + "post_attention_layernorm.weight", {C});
      // q, k, v as one weight, gate and up as another: each one GEMV in decode, rather than
      // three and two calls on shorter streams (bench/RESULTS.md, "Zen 5, twenty-sixth session").
      const std::string a = p + "self_attn.";
      lw.wq = L.get_stacked({{a + "q_proj.weight", {q, C}},
                             {a + "k_proj.weight", {kv, C}},
                             {a + "v_proj.weight", {kv, C}}});
      lw.wo = L.get(a + "o_proj.weight", {C, q});
      if (c.qkv_bias)
        lw.bq = L.get_stacked(
            {{a + "q_proj.bias", {q}}, {a + "k_proj.bias", {kv}}, {a + "v_proj.bias", {kv}}});
      if (c.o_bias) lw.bo = L.get(a + "o_proj.bias", {C});
      lw.w_gate =
          L.get_stacked({{p + "mlp.gate_proj.weight", {F, C}}, {p + "mlp.up_proj.weight", {F, C}}});
      lw.w_down = L.get(p + "mlp.down_proj.weight", {C, F});
      if (c.mlp_bias) fail(src.where() + ": mlp_bias is not supported for LLaMA-family models");
      w.layers.push_back(lw);
    }
    w.norm_w = L.get("norm.weight", {C});
    // The output head is a top-level tensor (no "model." prefix); tied models may omit it.
    Source top = src;
    top.prefix = "";
    Loader LT{top, dt, L.arena};
    if (!c.tie_embeddings && top.has("lm_head.weight")) {
      w.lm_head = LT.get("lm_head.weight", {V, C});
      L.any_view |= LT.any_view, L.bytes += LT.bytes;
    } else if (!c.tie_embeddings) {
      fail(src.where() +
           ": missing tensor \"lm_head.weight\" (the config says the output "
           "embedding is not tied)");
    } else {
      w.lm_head = w.tok;
    }
  } else if (c.family == Family::kGpt2) {
    w.tok = L.get("wte.weight", {V, C});
    w.pos = L.get("wpe.weight", {c.max_positions, C});
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      LayerW lw;
      lw.ln1_w = L.get(p + "ln_1.weight", {C}), lw.ln1_b = L.get(p + "ln_1.bias", {C});
      lw.ln2_w = L.get(p + "ln_2.weight", {C}), lw.ln2_b = L.get(p + "ln_2.bias", {C});
      lw.wq = L.get(p + "attn.c_attn.weight", {3 * C, C}, true);
      lw.bq = L.get(p + "attn.c_attn.bias", {3 * C});
      lw.wo = L.get(p + "attn.c_proj.weight", {C, C}, true);
      lw.bo = L.get(p + "attn.c_proj.bias", {C});
      lw.w_up = L.get(p + "mlp.c_fc.weight", {F, C}, true);
      lw.b_up = L.get(p + "mlp.c_fc.bias", {F});
      lw.w_down = L.get(p + "mlp.c_proj.weight", {C, F}, true);
      lw.b_down = L.get(p + "mlp.c_proj.bias", {C});
      w.layers.push_back(lw);
    }
    w.norm_w = L.get("ln_f.weight", {C}), w.norm_b = L.get("ln_f.bias", {C});
    w.lm_head = w.tok;
  } else {
    w.tok = L.get("embeddings.word_embeddings.weight", {V, C});
    w.pos = L.get("embeddings.position_embeddings.weight", {c.max_positions, C});
    w.type = L.get("embeddings.token_type_embeddings.weight", {c.type_vocab, C});
    w.emb_ln_w = L.get("embeddings.LayerNorm.weight", {C});
    w.emb_ln_b = L.get("embeddings.LayerNorm.bias", {C});
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "encoder.layer." + std::to_string(l) + ".";
      LayerW lw;
      const std::string a = p + "attention.self.";
      lw.wq = L.get_stacked(
          {{a + "query.weight", {C, C}}, {a + "key.weight", {C, C}}, {a + "value.weight", {C, C}}});
      lw.bq =
          L.get_stacked({{a + "query.bias", {C}}, {a + "key.bias", {C}}, {a + "value.bias", {C}}});
      lw.wo = L.get(p + "attention.output.dense.weight", {C, C});
      lw.bo = L.get(p + "attention.output.dense.bias", {C});
      lw.ln1_w = L.get(p + "attention.output.LayerNorm.weight", {C});
      lw.ln1_b = L.get(p + "attention.output.LayerNorm.bias", {C});
      lw.w_up = L.get(p + "intermediate.dense.weight", {F, C});
      lw.b_up = L.get(p + "intermediate.dense.bias", {F});
      lw.w_down = L.get(p + "output.dense.weight", {C, F});
      lw.b_down = L.get(p + "output.dense.bias", {C});
      lw.ln2_w = L.get(p + "output.LayerNorm.weight", {C});
      lw.ln2_b = L.get(p + "output.LayerNorm.bias", {C});
      w.layers.push_back(lw);
    }
  }
  return w;
}

// ---- graphs ----------------------------------------------------------------------------------

enum class Mode { kPrefill, kExtend, kEncode };

struct Builder {
  Graph g;
  bool pack = false;  // LoadOptions::pack_weights
  int n = 0;
  std::map<const void*, TensorId> weight_ids;
  std::string nm(const std::string& s) { return s + "." + std::to_string(n++); }
  TensorId w(const Tensor& t) {
    auto it = weight_ids.find(t.data());
    if (it != weight_ids.end() &&
        g.tensor(it->second).shape.size() == static_cast<size_t>(t.ndim()))
      return it->second;
    const TensorId id = g.weight(nm("w"), t);
    weight_ids[t.data()] = id;
    return id;
  }
  TensorId linear(TensorId x, const Tensor& wt, const Tensor& b = {},
                  ops::Activation act = ops::Activation::kNone, TensorId res = -1,
                  bool mul = false) {
    ops::LinearParam p;
    p.has_bias = b.data() != nullptr;
    p.activation = act;
    p.has_residual = res >= 0;
    p.residual_is_multiplier = mul;
    p.constant_weight = pack;
    std::vector<TensorId> in = {x, w(wt)};
    if (p.has_bias) in.push_back(w(b));
    if (res >= 0) in.push_back(res);
    return g.add1(nm("linear"), p, in);
  }
  // Norm of x (kNorm), of x + res (kPostNorm), or (norm(x + res), x + res) (kPreNorm).
  std::vector<TensorId> norm(const ModelConfig& c, TensorId x, const Tensor& wt, const Tensor& b,
                             ops::NormLayer layer = ops::NormLayer::kNorm, TensorId res = -1) {
    std::vector<TensorId> in = {x};
    if (res >= 0) in.push_back(res);
    in.push_back(w(wt));
    const int outs = layer == ops::NormLayer::kPreNorm ? 2 : 1;
    if (c.family == Family::kLlama) {
      ops::RmsNormParam p;
      p.epsilon = c.norm_eps;
      p.layer = layer;
      return g.add(nm("rmsnorm"), p, in, outs);
    }
    in.push_back(w(b));
    ops::LayerNormParam p;
    p.epsilon = c.norm_eps;
    p.layer = layer;
    return g.add(nm("layernorm"), p, in, outs);
  }
  TensorId view(const graph::NodeOp& op, TensorId x) { return g.add1(nm("view"), op, {x}); }
};

ops::Activation linear_act(const std::string& a) {
  if (a == "gelu_tanh") return ops::Activation::kGeluTanh;
  if (a == "gelu_erf") return ops::Activation::kGeluErf;
  if (a == "relu") return ops::Activation::kRelu;
  return ops::Activation::kSilu;
}

struct GraphSpec {
  bool paged = true;
};

// The causal LM graphs. Inputs:
//   prefill: ids (T), positions (T), slots (T), cu_seqlens (B+1), rows (R), caches
//   extend:  ids (B, Sq), positions (B, Sq), slots (T = B*Sq), context_lens (B),
//            [block_tables (B, MB)], rows (R), caches
// caches: key_l, value_l for every layer, (blocks, Hkv, block_size, D). Output: logits (R, V).
Graph build_lm(const ModelConfig& c, const Weights& W, DType dt, Mode mode, bool paged,
               DType cache_dt, bool pack) {
  Builder b;
  b.pack = pack;
  Graph& g = b.g;
  const int64_t C = c.hidden, Hkv = c.kv_heads, D = c.head_dim;
  const bool pre = mode == Mode::kPrefill;
  const TensorId ids =
      pre ? g.input("ids", DType::kI32, {"T"}) : g.input("ids", DType::kI32, {"B", "Sq"});
  const TensorId pos = pre ? g.input("positions", DType::kI32, {"T"})
                           : g.input("positions", DType::kI32, {"B", "Sq"});
  const TensorId slots = g.input("slots", DType::kI32, {"T"});
  TensorId cu = -1, lens = -1, tables = -1;
  if (pre) {
    cu = g.input("cu_seqlens", DType::kI32, {"B1"});
  } else {
    lens = g.input("context_lens", DType::kI32, {"B"});
    if (paged) tables = g.input("block_tables", DType::kI32, {"B", "MB"});
  }
  const TensorId rows = g.input("rows", DType::kI32, {"R"});
  std::vector<TensorId> kc, vc;
  for (int64_t l = 0; l < c.layers; ++l) {
    kc.push_back(g.input("key_cache." + std::to_string(l), cache_dt, {"NB", Hkv, "BS", D}));
    vc.push_back(g.input("value_cache." + std::to_string(l), cache_dt, {"NB", Hkv, "BS", D}));
  }
  const bool gpt2 = c.family == Family::kGpt2;
  const std::vector<int64_t> head_shape =
      pre ? std::vector<int64_t>{0, -1, D} : std::vector<int64_t>{0, 0, -1, D};
  const std::vector<int64_t> flat_shape =
      pre ? std::vector<int64_t>{0, -1} : std::vector<int64_t>{0, 0, -1};
  const int last_axis = pre ? 1 : 2;

  TensorId h = g.add1(b.nm("embed"), ops::EmbeddingParam{}, {b.w(W.tok), ids});
  TensorId pe = -1;
  if (gpt2) pe = g.add1(b.nm("embed_pos"), ops::EmbeddingParam{}, {b.w(W.pos), pos});
  ops::RopeParam rope = c.rope;
  rope.rotary_dim = D;
  rope.layout = ops::QkvLayout::kBSND;
  for (int64_t l = 0; l < c.layers; ++l) {
    const LayerW& L = W.layers[static_cast<size_t>(l)];
    TensorId n;
    if (gpt2 && l == 0) {
      auto r = b.norm(c, h, L.ln1_w, L.ln1_b, ops::NormLayer::kPreNorm, pe);
      n = r[0], h = r[1];
    } else {
      n = b.norm(c, h, L.ln1_w, L.ln1_b)[0];
    }
    TensorId q, k, v;
    {  // q, k, v: slices of one projection (GPT-2's c_attn; LLaMA's stacked weights)
      const int64_t qw = c.heads * D, kw = Hkv * D;
      const TensorId qkv = b.linear(n, L.wq, L.bq);
      q = b.view(graph::Slice{last_axis, 0, qw}, qkv);
      k = b.view(graph::Slice{last_axis, qw, qw + kw}, qkv);
      v = b.view(graph::Slice{last_axis, qw + kw, qw + 2 * kw}, qkv);
    }
    q = b.view(graph::Reshape{head_shape}, q);
    k = b.view(graph::Reshape{{-1, Hkv, D}}, k);
    v = b.view(graph::Reshape{{-1, Hkv, D}}, v);
    if (!gpt2) q = g.add1(b.nm("rope_q"), rope, {q, pos});
    TensorId o;
    const std::string ls = std::to_string(l);
    if (pre) {
      if (!gpt2) k = g.add1(b.nm("rope_k"), rope, {k, pos});
      g.add(b.nm("cache_write"), ops::ReshapeAndCacheParam{},
            {k, v, slots, kc[static_cast<size_t>(l)], vc[static_cast<size_t>(l)]}, 2);
      ops::AttentionParam ap;
      ap.causal = true;
      ap.varlen = true;
      o = g.add(b.nm("attention"), ap, {q, k, v, cu, cu}, 2)[0];
    } else {
      ops::ReshapeAndCacheParam cp;
      std::vector<TensorId> in = {k, v, slots, kc[static_cast<size_t>(l)],
                                  vc[static_cast<size_t>(l)]};
      if (!gpt2) {
        cp.apply_rope = true;
        cp.rope = rope;
        in.push_back(b.view(graph::Reshape{{-1}}, pos));
      }
      const auto caches = g.add(b.nm("cache_write"), cp, in, 2);
      ops::PagedAttentionParam pp;
      pp.paged = paged;
      std::vector<TensorId> ain = {q, caches[0], caches[1], lens};
      if (paged) ain.push_back(tables);
      o = g.add(b.nm("paged_attention"), pp, ain, 2)[0];
    }
    o = b.view(graph::Reshape{flat_shape}, o);
    const TensorId h1 = b.linear(o, L.wo, L.bo, ops::Activation::kNone, h);
    const TensorId n2 = b.norm(c, h1, L.ln2_w, L.ln2_b)[0];
    TensorId a;
    if (gpt2) {
      a = b.linear(n2, L.w_up, L.b_up, linear_act(c.hidden_act));
    } else {
      // One GEMV for gate and up (stacked), then silu(gate) * up over its output (2F values a
      // row). The SwiGLU had been the gate GEMV's epilogue over a separate up GEMV's output:
      // that saved the small pass but cost a second fork/join and a shorter weight stream.
      a = g.add1(b.nm("swiglu"), ops::ActivationParam{ops::ActivationType::kSwiGlu, true},
                 {b.linear(n2, L.w_gate)});
    }
    h = b.linear(a, L.w_down, L.b_down, ops::Activation::kNone, h1);
  }
  const TensorId flat = b.view(graph::Reshape{{-1, C}}, h);
  const TensorId picked = g.add1(b.nm("rows"), ops::GatherParam{}, {flat, rows});
  const TensorId nf = b.norm(c, picked, W.norm_w, W.norm_b)[0];
  g.output(b.linear(nf, W.lm_head), "logits");
  return g;
}

// The encoder (BERT): ids, type_ids, positions (T), cu_seqlens (B+1) -> hidden (T, C).
Graph build_encoder(const ModelConfig& c, const Weights& W, bool pack) {
  Builder b;
  b.pack = pack;
  Graph& g = b.g;
  const int64_t H = c.heads, D = c.head_dim;
  const TensorId ids = g.input("ids", DType::kI32, {"T"});
  const TensorId types = g.input("type_ids", DType::kI32, {"T"});
  const TensorId pos = g.input("positions", DType::kI32, {"T"});
  const TensorId cu = g.input("cu_seqlens", DType::kI32, {"B1"});
  const TensorId tok = g.add1(b.nm("embed"), ops::EmbeddingParam{}, {b.w(W.tok), ids});
  const TensorId pe = g.add1(b.nm("embed_pos"), ops::EmbeddingParam{}, {b.w(W.pos), pos});
  const TensorId te = g.add1(b.nm("embed_type"), ops::EmbeddingParam{}, {b.w(W.type), types});
  const TensorId e = g.add1(b.nm("add"), ops::ElementwiseParam{}, {tok, pe});
  TensorId h = b.norm(c, e, W.emb_ln_w, W.emb_ln_b, ops::NormLayer::kPostNorm, te)[0];
  for (const LayerW& L : W.layers) {
    const TensorId qkv = b.linear(h, L.wq, L.bq);  // (T, 3C): one GEMM for q, k and v
    auto part = [&](int64_t i) {
      return b.view(graph::Reshape{{0, H, D}},
                    b.view(graph::Slice{1, i * H * D, (i + 1) * H * D}, qkv));
    };
    const TensorId q = part(0), k = part(1), v = part(2);
    ops::AttentionParam ap;
    ap.varlen = true;
    const TensorId o = g.add(b.nm("attention"), ap, {q, k, v, cu, cu}, 2)[0];
    const TensorId a = b.linear(b.view(graph::Reshape{{0, -1}}, o), L.wo, L.bo);
    const TensorId h1 = b.norm(c, a, L.ln1_w, L.ln1_b, ops::NormLayer::kPostNorm, h)[0];
    const TensorId f = b.linear(h1, L.w_up, L.b_up, linear_act(c.hidden_act));
    const TensorId f2 = b.linear(f, L.w_down, L.b_down);
    h = b.norm(c, f2, L.ln2_w, L.ln2_b, ops::NormLayer::kPostNorm, h1)[0];
  }
  g.output(h, "hidden");
  return g;
}

Tensor i32_tensor(const std::vector<int32_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(DType::kI32, shape);
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

}  // namespace

// ---- the model ---------------------------------------------------------------------------------

struct OptimizedTransformer::Impl {
  ModelConfig cfg;
  DType dt = DType::kF32;
  bool pack = false;  // LoadOptions::pack_weights
  std::unique_ptr<Context> ctx;
  WeightArena arena;  // before src and W: their views point into it
  Source src;
  Weights W;
  size_t bytes = 0;
  TuningParams tune;
  StepWays ways;  // how decode steps' weight streams read, learned across sessions
  // Executors per (mode, paged, cache dtype), made on first use.
  std::map<std::tuple<int, bool, DType>, std::unique_ptr<graph::GraphExecutor>> exec;

  graph::GraphExecutor& executor(Mode m, bool paged, DType cache_dt) {
    auto key = std::make_tuple(static_cast<int>(m), paged, cache_dt);
    auto& e = exec[key];
    if (!e) {
      auto g = std::make_shared<Graph>(m == Mode::kEncode
                                           ? build_encoder(cfg, W, pack)
                                           : build_lm(cfg, W, dt, m, paged, cache_dt, pack));
      e = graph::make_graph_executor(g);
    }
    return *e;
  }
  int64_t max_seq() const {
    return tune.max_seq_length > 0 ? std::min(tune.max_seq_length, cfg.max_positions)
                                   : cfg.max_positions;
  }
  void check_ids(const std::vector<int32_t>& ids, const char* what) const {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= cfg.vocab)
        fail(std::string(what) + ": token id " + std::to_string(ids[i]) + " at position " +
             std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(cfg.vocab) +
             ")");
  }
};

OptimizedTransformer::OptimizedTransformer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OptimizedTransformer::~OptimizedTransformer() = default;

std::unique_ptr<OptimizedTransformer::Impl> OptimizedTransformer::make_impl(
    const ModelConfig& cfg, const LoadOptions& opt) {
  if (opt.dtype != DType::kF32 && opt.dtype != DType::kBF16)
    fail(std::string("model dtype must be f32 or bf16, got ") + dtype_name(opt.dtype));
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  impl->dt = opt.dtype;
  impl->pack = opt.pack_weights.value_or(cpu_features().amx_tile);
  ContextOptions co;
  co.num_threads = opt.threads;
  impl->ctx = std::make_unique<Context>(co);
  return impl;
}

std::unique_ptr<OptimizedTransformer> OptimizedTransformer::from_pretrained(
    const std::string& dir, const LoadOptions& opt) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw Error(ErrorCode::kIo, "model directory not found: " + dir);
  const ModelConfig cfg = ModelConfig::from_file((fs::path(dir) / "config.json").string());
  auto impl = make_impl(cfg, opt);
  impl->src.st = SafeTensors::open(dir, opt.load);
  if (opt.load == SafeTensors::Load::kRead) {  // every weight is read into the arena
    size_t need = 0;  // the floating tensors in the model's dtype (the arena's 64-byte steps)
    for (const auto& n : impl->src.st->names()) {
      const auto& e = impl->src.st->entry(n);
      if (e.supported && is_floating(e.dtype))
        need += (e.bytes / dtype_size(e.dtype) * dtype_size(impl->dt) + 63) / 64 * 64;
    }
    impl->arena.reserve(need);
  }
  Loader L{impl->src, impl->dt, impl->arena};
  impl->W = load_weights(impl->cfg, impl->src, impl->dt, L);
  impl->bytes = L.bytes;
  if (!L.any_view) impl->src.st.reset();  // every weight was converted: drop the file's memory
  return std::unique_ptr<OptimizedTransformer>(new OptimizedTransformer(std::move(impl)));
}

std::unique_ptr<OptimizedTransformer> OptimizedTransformer::from_config(const ModelConfig& cfg,
                                                                        const LoadOptions& opt,
                                                                        uint64_t seed) {
  cfg.validate("model config");
  auto impl = make_impl(cfg, opt);
  impl->src.made = random_checkpoint(cfg, impl->dt, seed, impl->arena);
  Loader L{impl->src, impl->dt, impl->arena};
  impl->W = load_weights(impl->cfg, impl->src, impl->dt, L);
  impl->bytes = L.bytes;
  return std::unique_ptr<OptimizedTransformer>(new OptimizedTransformer(std::move(impl)));
}

const ModelConfig& OptimizedTransformer::config() const { return impl_->cfg; }
DType OptimizedTransformer::dtype() const { return impl_->dt; }
Context& OptimizedTransformer::context() { return *impl_->ctx; }
const TuningParams& OptimizedTransformer::tuning_params() const { return impl_->tune; }
void OptimizedTransformer::set_tuning_params(const TuningParams& p) {
  if (p.max_seq_length < 0) fail("max_seq_length must be >= 0 (0: the model's maximum)");
  if (p.block_size <= 0) fail("block_size must be > 0, got " + std::to_string(p.block_size));
  if (p.prefill_chunk <= 0) fail("prefill_chunk must be > 0");
  if (p.cache_dtype && *p.cache_dtype != DType::kF32 && *p.cache_dtype != DType::kBF16)
    fail(std::string("cache_dtype must be f32 or bf16, got ") + dtype_name(*p.cache_dtype));
  impl_->tune = p;
}
size_t OptimizedTransformer::weight_bytes() const { return impl_->bytes; }
std::vector<Tensor> OptimizedTransformer::decode_weights() const {
  const Weights& W = impl_->W;
  std::vector<Tensor> v;
  for (const LayerW& L : W.layers)
    for (const Tensor* t : {&L.ln1_w, &L.ln1_b, &L.wq, &L.bq, &L.wo, &L.bo, &L.ln2_w, &L.ln2_b,
                            &L.w_up, &L.b_up, &L.w_gate, &L.w_down, &L.b_down})
      if (t->data()) v.push_back(*t);
  for (const Tensor* t : {&W.norm_w, &W.norm_b, &W.lm_head})
    if (t->data()) v.push_back(*t);
  return v;
}

bool OptimizedTransformer::packs_weights() const { return impl_->pack; }

size_t OptimizedTransformer::weight_bytes_per_token() const {
  size_t b = 0;
  for (const Tensor& t : decode_weights()) b += t.nbytes();
  return b + static_cast<size_t>(impl_->cfg.hidden) * dtype_size(impl_->dt);
}

std::string OptimizedTransformer::describe(int64_t tokens) const {
  std::ostringstream os;
  const ModelConfig& c = impl_->cfg;
  os << family_name(c.family) << " (" << c.model_type << "): " << c.layers << " layers, hidden "
     << c.hidden << ", heads " << c.heads << "/" << c.kv_heads << ", ffn " << c.ffn << ", vocab "
     << c.vocab << ", " << dtype_name(impl_->dt) << ", weights "
     << static_cast<double>(impl_->bytes) / 1e6 << " MB";
  (void)tokens;
  return os.str();
}

// ---- sessions ----------------------------------------------------------------------------------

struct OptimizedTransformer::Session::Impl {
  OptimizedTransformer::Impl* m = nullptr;
  int64_t max_batch = 1, capacity = 0, bs = 0, blocks_per_seq = 0;
  bool paged = true;
  DType cache_dt = DType::kF32;
  std::vector<Tensor> kcache, vcache;
  std::vector<char> live;
  std::vector<int64_t> len;
  std::vector<std::vector<int32_t>> blocks;  // paged: the blocks of each sequence
  std::vector<int32_t> free_blocks;

  int32_t slot(int seq, int64_t p) const {
    if (!paged) return static_cast<int32_t>(seq * capacity + p);
    return blocks[static_cast<size_t>(seq)][static_cast<size_t>(p / bs)] *
               static_cast<int32_t>(bs) +
           static_cast<int32_t>(p % bs);
  }
  void reserve(int seq, int64_t new_len) {
    if (!paged) return;
    auto& bl = blocks[static_cast<size_t>(seq)];
    while (static_cast<int64_t>(bl.size()) * bs < new_len) {
      if (free_blocks.empty()) fail("KV cache is full");
      bl.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
  }
  std::vector<Tensor> cache_inputs() const {
    std::vector<Tensor> v;
    for (size_t l = 0; l < kcache.size(); ++l) v.push_back(kcache[l]), v.push_back(vcache[l]);
    return v;
  }
  // Runs a graph and appends its logits rows (converted to f32) at `out` row `at`.
  void run(graph::GraphExecutor& ex, std::vector<Tensor> in, int64_t R, Tensor& out, int64_t at) {
    Tensor logits = Tensor::empty(m->dt, {R, m->cfg.vocab});
    const VariantPack pack{std::move(in), {logits}};
    Context& ctx = *m->ctx;
    const size_t ws = ex.setup(pack, ctx);
    ex.execute(pack, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
    convert(static_cast<float*>(out.data()) + at * m->cfg.vocab, DType::kF32, logits.data(), m->dt,
            R * m->cfg.vocab);
  }
  // Fresh sequences, whole prompts (each seq's tokens), rows: per sequence all or last.
  void prefill(const std::vector<int>& seqs, const std::vector<const int32_t*>& toks,
               const std::vector<int64_t>& counts, bool all, Tensor& out, int64_t at) {
    std::vector<int32_t> ids, pos, slots, cu = {0}, rows;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int s = seqs[i];
      const int64_t base = len[static_cast<size_t>(s)];
      for (int64_t t = 0; t < counts[i]; ++t) {
        if (all || t == counts[i] - 1) rows.push_back(static_cast<int32_t>(ids.size()));
        ids.push_back(toks[i][t]);
        pos.push_back(static_cast<int32_t>(base + t));
        slots.push_back(slot(s, base + t));
      }
      cu.push_back(static_cast<int32_t>(ids.size()));
    }
    const auto T = static_cast<int64_t>(ids.size());
    const auto B1 = static_cast<int64_t>(cu.size());
    const auto R = static_cast<int64_t>(rows.size());
    std::vector<Tensor> in = {i32_tensor(ids, {T}), i32_tensor(pos, {T}), i32_tensor(slots, {T}),
                              i32_tensor(cu, {B1}), i32_tensor(rows, {R})};
    for (const Tensor& t : cache_inputs()) in.push_back(t);
    run(m->executor(Mode::kPrefill, paged, cache_dt), std::move(in), R, out, at);
  }
  // Sequences with cached tokens, Sq new tokens each.
  void extend(const std::vector<int>& seqs, const std::vector<const int32_t*>& toks, int64_t Sq,
              bool all, Tensor& out, int64_t at) {
    const auto B = static_cast<int64_t>(seqs.size());
    std::vector<int32_t> ids, pos, slots, lens, tables, rows;
    for (int64_t i = 0; i < B; ++i) {
      const int s = seqs[static_cast<size_t>(i)];
      const int64_t base = len[static_cast<size_t>(s)];
      for (int64_t t = 0; t < Sq; ++t) {
        if (all || t == Sq - 1) rows.push_back(static_cast<int32_t>(ids.size()));
        ids.push_back(toks[static_cast<size_t>(i)][t]);
        pos.push_back(static_cast<int32_t>(base + t));
        slots.push_back(slot(s, base + t));
      }
      lens.push_back(static_cast<int32_t>(base + Sq));
      if (paged) {
        const auto& bl = blocks[static_cast<size_t>(s)];
        for (int64_t j = 0; j < blocks_per_seq; ++j)
          tables.push_back(j < static_cast<int64_t>(bl.size()) ? bl[static_cast<size_t>(j)] : 0);
      }
    }
    const auto R = static_cast<int64_t>(rows.size());
    std::vector<Tensor> in = {i32_tensor(ids, {B, Sq}), i32_tensor(pos, {B, Sq}),
                              i32_tensor(slots, {B * Sq}), i32_tensor(lens, {B})};
    if (paged) in.push_back(i32_tensor(tables, {B, blocks_per_seq}));
    in.push_back(i32_tensor(rows, {R}));
    for (const Tensor& t : cache_inputs()) in.push_back(t);
    run(m->executor(Mode::kExtend, paged, cache_dt), std::move(in), R, out, at);
  }
};

OptimizedTransformer::Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OptimizedTransformer::Session::~Session() = default;

std::unique_ptr<OptimizedTransformer::Session> OptimizedTransformer::new_session(
    int64_t max_batch) {
  const ModelConfig& c = impl_->cfg;
  if (!c.causal()) fail(std::string(family_name(c.family)) + " is an encoder: use encode/embed");
  if (max_batch <= 0) fail("max_batch must be > 0");
  auto s = std::make_unique<Session::Impl>();
  s->m = impl_.get();
  s->max_batch = max_batch;
  s->capacity = impl_->max_seq();
  s->paged = impl_->tune.paged;
  s->cache_dt = impl_->tune.cache_dtype.value_or(impl_->dt);
  s->bs = s->paged ? std::min(impl_->tune.block_size, s->capacity) : s->capacity;
  s->blocks_per_seq = (s->capacity + s->bs - 1) / s->bs;
  const int64_t nb = s->paged ? max_batch * s->blocks_per_seq : max_batch;
  // Written a token at a time: 4 KiB pages, so that the first tokens do not pay for a 2 MiB
  // page per layer's k and v (ZeroPages).
  for (int64_t l = 0; l < c.layers; ++l) {
    s->kcache.push_back(
        Tensor::zeros(s->cache_dt, {nb, c.kv_heads, s->bs, c.head_dim}, ZeroPages::kAsWritten));
    s->vcache.push_back(
        Tensor::zeros(s->cache_dt, {nb, c.kv_heads, s->bs, c.head_dim}, ZeroPages::kAsWritten));
  }
  s->live.assign(static_cast<size_t>(max_batch), 0);
  s->len.assign(static_cast<size_t>(max_batch), 0);
  s->blocks.resize(static_cast<size_t>(max_batch));
  for (int64_t b = nb - 1; b >= 0; --b) s->free_blocks.push_back(static_cast<int32_t>(b));
  return std::unique_ptr<Session>(new Session(std::move(s)));
}

int OptimizedTransformer::Session::add_sequence() {
  for (size_t i = 0; i < impl_->live.size(); ++i)
    if (!impl_->live[i]) {
      impl_->live[i] = 1;
      impl_->len[i] = 0;
      return static_cast<int>(i);
    }
  fail("session is full: " + std::to_string(impl_->max_batch) + " sequences are live (max_batch)");
}

void OptimizedTransformer::Session::remove_sequence(int seq) {
  if (seq < 0 || seq >= static_cast<int>(impl_->live.size()) ||
      !impl_->live[static_cast<size_t>(seq)])
    fail("no live sequence " + std::to_string(seq));
  impl_->live[static_cast<size_t>(seq)] = 0;
  impl_->len[static_cast<size_t>(seq)] = 0;
  auto& bl = impl_->blocks[static_cast<size_t>(seq)];
  for (int32_t b : bl) impl_->free_blocks.push_back(b);
  bl.clear();
}

int64_t OptimizedTransformer::Session::length(int seq) const {
  if (seq < 0 || seq >= static_cast<int>(impl_->live.size()) ||
      !impl_->live[static_cast<size_t>(seq)])
    fail("no live sequence " + std::to_string(seq));
  return impl_->len[static_cast<size_t>(seq)];
}

Tensor OptimizedTransformer::Session::forward(const std::vector<int>& seqs,
                                              const std::vector<std::vector<int32_t>>& tokens,
                                              bool all_logits) {
  Impl& s = *impl_;
  if (seqs.size() != tokens.size())
    fail("forward: " + std::to_string(seqs.size()) + " sequences but " +
         std::to_string(tokens.size()) + " token lists");
  if (seqs.empty()) fail("forward: no sequences");
  std::set<int> seen;
  int64_t rows = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int q = seqs[i];
    if (q < 0 || q >= static_cast<int>(s.live.size()) || !s.live[static_cast<size_t>(q)])
      fail("forward: no live sequence " + std::to_string(q));
    if (!seen.insert(q).second) fail("forward: sequence " + std::to_string(q) + " listed twice");
    if (tokens[i].empty()) fail("forward: no tokens for sequence " + std::to_string(q));
    s.m->check_ids(tokens[i], "forward");
    const int64_t n = s.len[static_cast<size_t>(q)] + static_cast<int64_t>(tokens[i].size());
    if (n > s.capacity)
      fail("forward: sequence " + std::to_string(q) + " would hold " + std::to_string(n) +
           " tokens, longer than the context (max_seq_length " + std::to_string(s.capacity) + ")");
    rows += all_logits ? static_cast<int64_t>(tokens[i].size()) : 1;
  }
  for (size_t i = 0; i < seqs.size(); ++i)
    s.reserve(seqs[i],
              s.len[static_cast<size_t>(seqs[i])] + static_cast<int64_t>(tokens[i].size()));
  Tensor out = Tensor::empty(DType::kF32, {rows, s.m->cfg.vocab});
  // Row offset of each sequence's logits in `out`.
  std::vector<int64_t> at(seqs.size());
  int64_t acc = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    at[i] = acc;
    acc += all_logits ? static_cast<int64_t>(tokens[i].size()) : 1;
  }
  const TuningParams& tp = s.m->tune;
  const int64_t chunk = tp.enable_dynamic_chunk ? tp.prefill_chunk : INT64_MAX;
  // 1. Decode: every listed sequence with cached tokens and one new token, in one batch.
  std::vector<size_t> dec, fresh, other;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t cur = s.len[static_cast<size_t>(seqs[i])];
    if (cur > 0 && tokens[i].size() == 1)
      dec.push_back(i);
    else if (cur == 0)
      fresh.push_back(i);
    else
      other.push_back(i);
  }
  if (!dec.empty()) {
    // Decode rows are consecutive in `out` only in listing order; run, then scatter.
    std::vector<int> sq;
    std::vector<const int32_t*> tk;
    for (size_t i : dec) sq.push_back(seqs[i]), tk.push_back(tokens[i].data());
    Tensor tmp = Tensor::empty(DType::kF32, {static_cast<int64_t>(dec.size()), s.m->cfg.vocab});
    // The step's weight-stream way (StepWays), reset for whatever this thread runs next.
    const bool choose = kernels::weight_stream_hint_applies();
    struct WayGuard {
      explicit WayGuard(bool nta) { kernels::set_weight_stream_nta(nta); }
      ~WayGuard() { kernels::set_weight_stream_nta(false); }
    } guard(choose && s.m->ways.begin());
    const auto t0 = std::chrono::steady_clock::now();
    s.extend(sq, tk, 1, all_logits, tmp, 0);
    if (choose)
      s.m->ways.end(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (size_t j = 0; j < dec.size(); ++j)
      std::memcpy(static_cast<float*>(out.data()) + at[dec[j]] * s.m->cfg.vocab,
                  static_cast<float*>(tmp.data()) + static_cast<int64_t>(j) * s.m->cfg.vocab,
                  static_cast<size_t>(s.m->cfg.vocab) * sizeof(float));
    for (size_t i : dec) s.len[static_cast<size_t>(seqs[i])] += 1;
  }
  // 2. Fresh prompts: first chunks together through the prefill graph, one at a time when
  // their logits rows must land apart; the rest of each prompt chunk by chunk.
  for (size_t i : fresh) {
    const int q = seqs[i];
    const auto n = static_cast<int64_t>(tokens[i].size());
    const int64_t first = std::min(n, chunk);
    // Logits rows of a chunk: all its tokens (all_logits) or the prompt's last one.
    const bool last_in_first = first == n;
    Tensor tmp = Tensor::empty(DType::kF32, {all_logits ? first : 1, s.m->cfg.vocab});
    s.prefill({q}, {tokens[i].data()}, {first}, all_logits, tmp, 0);
    if (all_logits || last_in_first)
      std::memcpy(static_cast<float*>(out.data()) + at[i] * s.m->cfg.vocab, tmp.data(),
                  tmp.nbytes());
    s.len[static_cast<size_t>(q)] += first;
    other.push_back(i);  // the rest, if any
  }
  // 3. Everything else: chunks against the cache, one sequence at a time.
  for (size_t i : other) {
    const int q = seqs[i];
    const auto n = static_cast<int64_t>(tokens[i].size());
    // Tokens of this call already in the cache: those prefilled in step 2.
    int64_t done = 0;
    if (std::find(fresh.begin(), fresh.end(), i) != fresh.end()) done = std::min(n, chunk);
    while (done < n) {
      const int64_t cnt = std::min(chunk, n - done);
      Tensor tmp = Tensor::empty(DType::kF32, {all_logits ? cnt : 1, s.m->cfg.vocab});
      s.extend({q}, {tokens[i].data() + done}, cnt, all_logits, tmp, 0);
      if (all_logits)
        std::memcpy(static_cast<float*>(out.data()) + (at[i] + done) * s.m->cfg.vocab, tmp.data(),
                    tmp.nbytes());
      else if (done + cnt == n)
        std::memcpy(static_cast<float*>(out.data()) + at[i] * s.m->cfg.vocab, tmp.data(),
                    tmp.nbytes());
      s.len[static_cast<size_t>(q)] += cnt;
      done += cnt;
    }
  }
  return out;
}

// ---- encoders --------------------------------------------------------------------------------

std::vector<Tensor> OptimizedTransformer::encode(
    const std::vector<std::vector<int32_t>>& ids,
    const std::vector<std::vector<int32_t>>& type_ids) {
  Impl& m = *impl_;
  if (m.cfg.causal()) fail("encode: " + std::string(family_name(m.cfg.family)) + " is a causal LM");
  if (ids.empty()) fail("encode: no sequences");
  if (!type_ids.empty() && type_ids.size() != ids.size())
    fail("encode: type_ids must have one list per sequence");
  std::vector<int32_t> all, types, pos, cu = {0};
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i].empty()) fail("encode: sequence " + std::to_string(i) + " is empty");
    if (static_cast<int64_t>(ids[i].size()) > m.cfg.max_positions)
      fail("encode: sequence " + std::to_string(i) + " has " + std::to_string(ids[i].size()) +
           " tokens, longer than the context (" + std::to_string(m.cfg.max_positions) + ")");
    m.check_ids(ids[i], "encode");
    if (!type_ids.empty() && type_ids[i].size() != ids[i].size())
      fail("encode: type_ids of sequence " + std::to_string(i) + " differ in length from its ids");
    for (size_t t = 0; t < ids[i].size(); ++t) {
      all.push_back(ids[i][t]);
      const int32_t ty = type_ids.empty() ? 0 : type_ids[i][t];
      if (ty < 0 || ty >= m.cfg.type_vocab)
        fail("encode: token type " + std::to_string(ty) + " outside [0, " +
             std::to_string(m.cfg.type_vocab) + ")");
      types.push_back(ty);
      pos.push_back(static_cast<int32_t>(t));
    }
    cu.push_back(static_cast<int32_t>(all.size()));
  }
  const auto T = static_cast<int64_t>(all.size());
  Tensor hidden = Tensor::empty(m.dt, {T, m.cfg.hidden});
  const VariantPack pack{{i32_tensor(all, {T}), i32_tensor(types, {T}), i32_tensor(pos, {T}),
                          i32_tensor(cu, {static_cast<int64_t>(cu.size())})},
                         {hidden}};
  graph::GraphExecutor& ex = m.executor(Mode::kEncode, false, m.dt);
  const size_t ws = ex.setup(pack, *m.ctx);
  ex.execute(pack, ws ? m.ctx->workspace(ws) : nullptr, ws, *m.ctx);
  std::vector<Tensor> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto n = static_cast<int64_t>(ids[i].size());
    Tensor t = Tensor::empty(DType::kF32, {n, m.cfg.hidden});
    convert(t.data(), DType::kF32,
            static_cast<char*>(hidden.data()) +
                cu[i] * m.cfg.hidden * static_cast<int64_t>(dtype_size(m.dt)),
            m.dt, n * m.cfg.hidden);
    out.push_back(t);
  }
  return out;
}

std::vector<std::vector<float>> OptimizedTransformer::embed(
    const std::vector<std::vector<int32_t>>& ids, const std::vector<std::vector<int32_t>>& type_ids,
    bool normalize) {
  const std::vector<Tensor> h = encode(ids, type_ids);
  std::vector<std::vector<float>> out;
  const int64_t C = impl_->cfg.hidden;
  for (const Tensor& t : h) {
    std::vector<double> acc(static_cast<size_t>(C), 0.0);
    const int64_t n = t.dim(0);
    const float* p = t.data_as<const float>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(c)] += p[r * C + c];
    std::vector<float> e(static_cast<size_t>(C));
    double norm = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      acc[static_cast<size_t>(c)] /= static_cast<double>(n);
      norm += acc[static_cast<size_t>(c)] * acc[static_cast<size_t>(c)];
    }
    norm = normalize ? std::max(std::sqrt(norm), 1e-12) : 1.0;
    for (int64_t c = 0; c < C; ++c)
      e[static_cast<size_t>(c)] = static_cast<float>(acc[static_cast<size_t>(c)] / norm);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace tboost::model
