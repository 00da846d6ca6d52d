// Trainer: explicit forward and backward of the GPT-2 and LLaMA layer stacks through the fused
// training kernels (include/tboost/train/trainer.h).
//
// Per layer, forward (A: the activation dtype, f32, bf16 or f16; WT: the matmuls' weight dtype,
// A for f32 and bf16, the f32 master weights for f16 storage):
//   h1 = norm1(x)                          stats kept (mean, rstd)
//   qkv = h1 · Wqkvᵀ (+ b)                 one (M, (H + 2·Hkv)·D) buffer; LLaMA: three GEMMs
//   rope(q, k) in place                    LLaMA
//   o, lse = flash_attention(q, k, v)      causal, per sequence
//   x2 = x + o · Woᵀ (+ b)
//   h2 = norm2(x2)
//   u = h2 · W1ᵀ (+ b)                     LLaMA: [gate | up] (M, 2F)
//   a = act(u)                             SwiGLU / GELU
//   x' = x2 + a · W2ᵀ (+ b)
// and backward in reverse, the residual gradient flowing through the norms' dsum input.
// Everything a layer keeps lives in one arena carved once per micro-batch shape: all layers'
// activations, or (checkpointing) only each layer's input plus one layer's working set that the
// backward refills by recomputing the layer.
#include "tboost/train/trainer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "src/core/file_io.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/context.h"
#include "tboost/core/error.h"
#include "tboost/core/tensor.h"
#include "tboost/model/safetensors.h"

namespace tboost::train {

namespace k = kernels;
using model::Family;
using model::ModelConfig;

bool LossScaler::update(bool found_nonfinite) {
  if (found_nonfinite) {
    scale_ = std::max(scale_ * 0.5f, 1.0f / 65536.0f);
    clean_ = 0;
    return false;
  }
  if (++clean_ >= interval_) {
    scale_ = std::min(scale_ * 2.0f, 4294967296.0f);  // capped at 2^32
    clean_ = 0;
  }
  return true;
}

double scheduled_lr(const TrainOptions& o, int64_t step) {
  const double lr = o.lr;
  if (o.warmup_steps > 0 && step <= o.warmup_steps)
    return lr * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  if (o.total_steps <= 0) return lr;
  const double lo = lr * o.min_lr_ratio;
  if (step >= o.total_steps) return lo;
  const double span = static_cast<double>(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  const double t = static_cast<double>(step - o.warmup_steps) / span;
  return lo + 0.5 * (lr - lo) * (1.0 + std::cos(M_PI * t));
}

namespace {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;  // as in a checkpoint
  int64_t rows = 0, cols = 0;  // as stored here (GPT-2 Conv1D transposed to (out, in))
  bool transposed = false;
  bool decay = false;  // matrices and embeddings; not norms or biases
  bool gain = false;   // norm weight (init 1)
  int64_t off = 0, n = 0;
};

struct LayerParams {
  int ln1_w = -1, ln1_b = -1, ln2_w = -1, ln2_b = -1;
  // Projections into qkv columns: (weight, bias, first column).
  struct Proj {
    int w = -1, b = -1;
    int64_t col = 0;
  };
  std::vector<Proj> qkv, up;  // up: LLaMA gate (col 0) and up (col F); GPT-2 c_fc
  int wo = -1, bo = -1, wd = -1, bd = -1;
};

ops::ActivationType activation_of(const ModelConfig& c) {
  if (c.family == Family::kLlama) return ops::ActivationType::kSwiGlu;
  const std::string& a = c.hidden_act;
  if (a == "gelu" || a == "gelu_erf" || a == "gelu_python") return ops::ActivationType::kGeluErf;
  if (a == "relu") return ops::ActivationType::kRelu;
  if (a == "silu" || a == "swish") return ops::ActivationType::kSilu;
  return ops::ActivationType::kGeluTanh;  // gelu_new, gelu_pytorch_tanh, gelu_fast, gelu_tanh
}

size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

// config.json for a config made here (a built-in name): the Hugging Face keys our loader reads.
std::string config_json(const ModelConfig& c) {
  nlohmann::json j;
  j["vocab_size"] = c.vocab;
  if (c.family == Family::kGpt2) {
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
    j["n_embd"] = c.hidden, j["n_layer"] = c.layers, j["n_head"] = c.heads;
    j["n_inner"] = c.ffn, j["n_positions"] = c.max_positions;
    j["layer_norm_epsilon"] = c.norm_eps;
    // Hugging Face's names (the config keeps ours: gelu_tanh, gelu_erf).
    j["activation_function"] = c.hidden_act == "gelu_tanh"  ? "gelu_new"
                               : c.hidden_act == "gelu_erf" ? "gelu"
                                                            : c.hidden_act;
    j["tie_word_embeddings"] = true;
  } else {
    j["model_type"] = c.model_type;
    j["architectures"] = {"LlamaForCausalLM"};
    j["hidden_size"] = c.hidden, j["num_hidden_layers"] = c.layers;
    j["num_attention_heads"] = c.heads, j["num_key_value_heads"] = c.kv_heads;
    j["head_dim"] = c.head_dim, j["intermediate_size"] = c.ffn;
    j["max_position_embeddings"] = c.max_positions;
    j["rms_norm_eps"] = c.norm_eps, j["rope_theta"] = c.rope.theta;
    j["hidden_act"] = "silu", j["tie_word_embeddings"] = c.tie_embeddings;
    j["attention_bias"] = c.qkv_bias;
  }
  if (c.bos_id >= 0) j["bos_token_id"] = c.bos_id;
  if (!c.eos_ids.empty()) j["eos_token_id"] = c.eos_ids.front();
  return j.dump(2) + "\n";
}

}  // namespace

struct Trainer::Impl {
  ModelConfig cfg;
  TrainOptions opt;
  std::string config_text;  // config.json as loaded, or made from cfg
  int threads = 1;
  DType A = DType::kF32;   // activations and their gradients
  DType WT = DType::kF32;  // the matmuls' weights: A, or the f32 master under f16 storage
  bool gpt2 = false;
  int64_t C = 0, H = 0, Hkv = 0, D = 0, F = 0, V = 0, L = 0, QW = 0, UW = 0;
  ops::ActivationType act = ops::ActivationType::kSwiGlu;
  std::vector<double> inv_freq;

  std::vector<ParamInfo> params;
  std::map<std::string, int> by_name;
  std::vector<LayerParams> layers;
  int tok = -1, pos = -1, lnf_w = -1, lnf_b = -1, head = -1;
  int64_t total = 0;  // f32 elements of the flat buffers
  Tensor master, grad, m, v, p16;
  int64_t step = 0, adam_t = 0;
  LossScaler scaler;

  // ---- the activation arena, carved for (rows per micro-batch Mb, seq T)
  Tensor arena;
  int64_t arena_M = -1, arena_T = -1;
  bool arena_ckpt = false;
  size_t arena_bytes = 0, scratch_bytes = 0;
  struct Set {  // what one layer keeps
    char *h1, *qkv, *o, *x2, *h2, *u, *a;
    float *mean1, *rstd1, *mean2, *rstd2, *lse;
  };
  std::vector<char*> xs;  // layer inputs x_0 .. x_L
  std::vector<Set> sets;  // one per layer, or one (checkpointing)
  char *hf, *dx, *dx2, *dh, *dqkv, *dout, *du, *da;
  float *meanf, *rstdf, *colsum;
  int32_t* positions;
  char* attn_ws;

  size_t es() const { return dtype_size(A); }
  float* P(int i) const { return master.data_as<float>() + params[i].off; }
  float* G(int i) const { return grad.data_as<float>() + params[i].off; }
  // The matmul copy of parameter i (dtype WT).
  const void* W(int i) const {
    return WT == DType::kF32 ? static_cast<const void*>(P(i))
                             : static_cast<const void*>(p16.data_as<bf16_t>() + params[i].off);
  }

  int add(const std::string& name, std::vector<int64_t> shape, bool transposed = false) {
    ParamInfo p;
    p.name = name;
    p.shape = shape;
    p.transposed = transposed;
    p.rows = transposed ? shape[1] : shape[0];
    p.cols = shape.size() > 1 ? (transposed ? shape[0] : shape[1]) : 1;
    p.decay = shape.size() > 1;
    p.gain = shape.size() == 1 && name.size() > 7 && name.substr(name.size() - 7) == ".weight";
    p.n = p.rows * p.cols;
    p.off = total;
    total += static_cast<int64_t>(align64(static_cast<size_t>(p.n) * 4) / 4);
    params.push_back(p);
    by_name[name] = static_cast<int>(params.size()) - 1;
    return static_cast<int>(params.size()) - 1;
  }

  void build_params() {
    const ModelConfig& c = cfg;
    C = c.hidden, H = c.heads, Hkv = c.kv_heads, D = c.head_dim, F = c.ffn, V = c.vocab;
    L = c.layers;
    gpt2 = c.family == Family::kGpt2;
    if (c.family != Family::kGpt2 && c.family != Family::kLlama)
      throw Error(ErrorCode::kUnsupported, std::string("training: the ") +
                                               model::family_name(c.family) +
                                               " family is not a causal LM we train");
    if (c.family == Family::kLlama && c.mlp_bias)
      throw Error(ErrorCode::kUnsupported,
                  "training: LLaMA-family MLP biases (mlp_bias) are not supported");
    act = activation_of(c);
    QW = (H + 2 * Hkv) * D;
    UW = gpt2 ? F : 2 * F;
    layers.assign(static_cast<size_t>(L), {});
    if (gpt2) {
      tok = add("transformer.wte.weight", {V, C});
      pos = add("transformer.wpe.weight", {c.max_positions, C});
      for (int64_t l = 0; l < L; ++l) {
        const std::string p = "transformer.h." + std::to_string(l) + ".";
        LayerParams& lp = layers[static_cast<size_t>(l)];
        lp.ln1_w = add(p + "ln_1.weight", {C}), lp.ln1_b = add(p + "ln_1.bias", {C});
        lp.qkv.push_back({add(p + "attn.c_attn.weight", {C, 3 * C}, true),
                          add(p + "attn.c_attn.bias", {3 * C}), 0});
        lp.wo = add(p + "attn.c_proj.weight", {C, C}, true);
        lp.bo = add(p + "attn.c_proj.bias", {C});
        lp.ln2_w = add(p + "ln_2.weight", {C}), lp.ln2_b = add(p + "ln_2.bias", {C});
        lp.up.push_back(
            {add(p + "mlp.c_fc.weight", {C, F}, true), add(p + "mlp.c_fc.bias", {F}), 0});
        lp.wd = add(p + "mlp.c_proj.weight", {F, C}, true);
        lp.bd = add(p + "mlp.c_proj.bias", {C});
      }
      lnf_w = add("transformer.ln_f.weight", {C}), lnf_b = add("transformer.ln_f.bias", {C});
      head = tok;
    } else {
      tok = add("model.embed_tokens.weight", {V, C});
      for (int64_t l = 0; l < L; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        LayerParams& lp = layers[static_cast<size_t>(l)];
        lp.ln1_w = add(p + "input_layernorm.weight", {C});
        const char* n[3] = {"q", "k", "v"};
        const int64_t rows[3] = {H * D, Hkv * D, Hkv * D}, col[3] = {0, H * D, (H + Hkv) * D};
        for (int i = 0; i < 3; ++i) {
          const std::string base = p + "self_attn." + n[i] + "_proj.";
          const int w = add(base + "weight", {rows[i], C});
          const int b = c.qkv_bias ? add(base + "bias", {rows[i]}) : -1;
          lp.qkv.push_back({w, b, col[i]});
        }
        lp.wo = add(p + "self_attn.o_proj.weight", {C, H * D});
        if (c.o_bias) lp.bo = add(p + "self_attn.o_proj.bias", {C});
        lp.ln2_w = add(p + "post_attention_layernorm.weight", {C});
        lp.up.push_back({add(p + "mlp.gate_proj.weight", {F, C}), -1, 0});
        lp.up.push_back({add(p + "mlp.up_proj.weight", {F, C}), -1, F});
        lp.wd = add(p + "mlp.down_proj.weight", {C, F});
      }
      lnf_w = add("model.norm.weight", {C});
      head = c.tie_embeddings ? tok : add("lm_head.weight", {V, C});
      ops::RopeParam rp = c.rope;
      inv_freq = ops::rope_inv_freq(rp, rp.rotary_dim > 0 ? rp.rotary_dim : D);
    }
    const size_t bytes = static_cast<size_t>(total) * 4;
    master = Tensor::zeros(DType::kU8, {static_cast<int64_t>(bytes)});
    grad = Tensor::zeros(DType::kU8, {static_cast<int64_t>(bytes)});
    m = Tensor::zeros(DType::kU8, {static_cast<int64_t>(bytes)});
    v = Tensor::zeros(DType::kU8, {static_cast<int64_t>(bytes)});
    if (WT != DType::kF32) p16 = Tensor::zeros(DType::kU8, {static_cast<int64_t>(bytes / 2 + 64)});
  }

  void sync_compute_copy() {
    if (WT == DType::kF32) return;
    convert(p16.data(), WT, master.data(), DType::kF32, total);
  }

  // ---- arena ---------------------------------------------------------------------------------

  void plan(int64_t Mb, int64_t T) {
    // The arena of a larger micro-batch serves a smaller one (every stride depends on T only),
    // so an uneven last micro-batch does not re-plan.
    if (Mb <= arena_M && T == arena_T && opt.checkpointing == arena_ckpt) return;
    const int64_t M = Mb * T, e = static_cast<int64_t>(es());
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t o = off;
      off += align64(bytes);
      return o;
    };
    const size_t row = static_cast<size_t>(M * C * e), stat = static_cast<size_t>(M) * 4;
    std::vector<size_t> x_off(static_cast<size_t>(L + 1));
    for (auto& o : x_off) o = take(row);
    const int64_t nsets = opt.checkpointing ? 1 : L;
    struct SetOff {
      size_t h1, qkv, o, x2, h2, u, a, mean1, rstd1, mean2, rstd2, lse;
    };
    std::vector<SetOff> so(static_cast<size_t>(nsets));
    for (auto& s : so) {
      s.h1 = take(row), s.qkv = take(static_cast<size_t>(M * QW * e));
      s.o = take(static_cast<size_t>(M * H * D * e)), s.x2 = take(row), s.h2 = take(row);
      s.u = take(static_cast<size_t>(M * UW * e)), s.a = take(static_cast<size_t>(M * F * e));
      s.mean1 = take(stat), s.rstd1 = take(stat), s.mean2 = take(stat), s.rstd2 = take(stat);
      s.lse = take(static_cast<size_t>(M * H) * 4);
    }
    const size_t hf_o = take(row), dx_o = take(row), dx2_o = take(row), dh_o = take(row);
    const size_t dqkv_o = take(static_cast<size_t>(M * QW * e));
    const size_t dout_o = take(static_cast<size_t>(M * H * D * e));
    const size_t du_o = take(static_cast<size_t>(M * UW * e)),
                 da_o = take(static_cast<size_t>(M * F * e));
    const size_t meanf_o = take(stat), rstdf_o = take(stat);
    const size_t colsum_o = take(static_cast<size_t>(std::max(QW, UW)) * 4);
    const size_t pos_o = take(static_cast<size_t>(M) * 4);
    // Attention workspace: the larger of forward and backward for this shape.
    k::AttentionBackwardArgs ab;
    ab.f = attn_args(nullptr, Mb, T);
    const size_t aws = std::max(k::attention_workspace(ab.f), k::attention_backward_workspace(ab));
    const size_t ws_o = take(aws + 64);
    arena_M = -1;  // no stale plan if the allocation below throws
    arena = Tensor();
    arena = Tensor::empty(DType::kU8, {static_cast<int64_t>(off)});
    char* base = static_cast<char*>(arena.data());
    xs.resize(static_cast<size_t>(L + 1));
    for (size_t i = 0; i < x_off.size(); ++i) xs[i] = base + x_off[i];
    sets.resize(static_cast<size_t>(nsets));
    for (size_t i = 0; i < so.size(); ++i) {
      const SetOff& s = so[i];
      sets[i] = {base + s.h1,
                 base + s.qkv,
                 base + s.o,
                 base + s.x2,
                 base + s.h2,
                 base + s.u,
                 base + s.a,
                 reinterpret_cast<float*>(base + s.mean1),
                 reinterpret_cast<float*>(base + s.rstd1),
                 reinterpret_cast<float*>(base + s.mean2),
                 reinterpret_cast<float*>(base + s.rstd2),
                 reinterpret_cast<float*>(base + s.lse)};
    }
    hf = base + hf_o, dx = base + dx_o, dx2 = base + dx2_o, dh = base + dh_o;
    dqkv = base + dqkv_o, dout = base + dout_o, du = base + du_o, da = base + da_o;
    meanf = reinterpret_cast<float*>(base + meanf_o),
    rstdf = reinterpret_cast<float*>(base + rstdf_o);
    colsum = reinterpret_cast<float*>(base + colsum_o);
    positions = reinterpret_cast<int32_t*>(base + pos_o);
    for (int64_t r = 0; r < M; ++r) positions[r] = static_cast<int32_t>(r % T);
    attn_ws = base + ws_o;
    arena_M = Mb, arena_T = T, arena_ckpt = opt.checkpointing;
    arena_bytes = off;
    // The fused loss's transient block (~40 MiB of f32 logits, and the head widened to f32 when
    // oneDNN has no matmul for WT) is not in the arena but counts as activation memory.
    // The largest block any micro-batch's call allocates: the plan is made once, for the
    // largest micro-batch, and a smaller one can get a larger chunk (fewer rows, fewer chunks).
    const int64_t chunk = std::min(M, k::cross_entropy_max_chunk_rows(V));
    const bool widened_head = WT != DType::kF32 && !k::gemm_has_native(WT);
    scratch_bytes =
        static_cast<size_t>(chunk * V) * 4 + (widened_head ? static_cast<size_t>(V * C) * 4 : 0);
    // Without a native matmul for A, k::gemm widens each 16-bit operand (and a 16-bit output)
    // into per-thread f32 scratch that grows to the largest one: count those three blocks.
    if (A != DType::kF32 && !k::gemm_has_native(A)) {
      const int64_t widest = std::max({QW, UW, F, H * D, C});
      scratch_bytes += 3 * static_cast<size_t>(M * widest) * 4;
    }
  }

  // Attention over set s's qkv (rows of QW) for Mb sequences of T tokens.
  k::AttentionArgs attn_args(const Set* s, int64_t Mb, int64_t T) const {
    k::AttentionArgs a;
    const char* qkv = s ? s->qkv : nullptr;
    const int64_t e = static_cast<int64_t>(es());
    a.q = qkv, a.k = qkv ? qkv + H * D * e : nullptr, a.v = qkv ? qkv + (H + Hkv) * D * e : nullptr;
    a.q_ss = a.k_ss = a.v_ss = QW, a.q_sh = a.k_sh = a.v_sh = D;
    a.q_sb = a.k_sb = a.v_sb = T * QW;
    a.o = s ? s->o : nullptr;
    a.o_ss = H * D, a.o_sh = D, a.o_sb = T * H * D;
    a.lse = s ? s->lse : nullptr;
    a.lse_ss = 1, a.lse_sh = T, a.lse_sb = H * T;
    a.dtype = a.kv_dtype = A;
    a.batch = Mb, a.heads = H, a.kv_heads = Hkv, a.head_dim = D, a.v_head_dim = D;
    a.sq = a.sk = T;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.causal = true;
    a.threads = threads;
    return a;
  }

  // ---- building blocks -------------------------------------------------------------------------

  // y = op(a) · op(b) (+ y); a in A, b in bt (A, or WT for a weight).
  void mm(void* y, int64_t ldy, DType yt, const void* a, int64_t lda, bool ta, const void* b,
          DType bt, int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, bool acc) const {
    k::GemmArgs g;
    g.y = y, g.ldy = ldy, g.y_dtype = yt;
    g.a = a, g.lda = lda, g.a_dtype = A, g.trans_a = ta;
    g.b = b, g.ldb = ldb, g.b_dtype = bt, g.trans_b = tb;
    g.M = M, g.N = N, g.K = K, g.accumulate = acc, g.threads = threads;
    k::gemm(g);
  }

  // y (M, N at ldy) += bias (N, f32 master) row by row.
  void add_bias(char* y, int64_t ldy, int b, int64_t M, int64_t N) const {
    const float* bias = P(b);
    const int64_t e = static_cast<int64_t>(es());
    parallel_for(threads, M, 64, true, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(static_cast<size_t>(N));
      for (int64_t r = r0; r < r1; ++r) {
        char* yr = y + r * ldy * e;
        convert(row.data(), DType::kF32, yr, A, N);
        for (int64_t c = 0; c < N; ++c) row[static_cast<size_t>(c)] += bias[c];
        convert(yr, A, row.data(), DType::kF32, N);
      }
    });
  }

  // y (M, N) at ldy (=, or += when acc) x (M, K at ldx) · Wᵀ + b.
  void linear(char* y, int64_t ldy, const char* x, int64_t ldx, int w, int b, int64_t M,
              bool acc) const {
    const ParamInfo& p = params[static_cast<size_t>(w)];
    const int64_t N = p.rows, K = p.cols;
    if (b >= 0 && !acc) {
      // Bias rows first, then the product accumulates onto them.
      parallel_for(threads, M, 64, true, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          convert(y + r * ldy * static_cast<int64_t>(es()), A, P(b), DType::kF32, N);
      });
      acc = true;
    } else if (b >= 0) {
      add_bias(y, ldy, b, M, N);
    }
    mm(y, ldy, A, x, ldx, false, W(w), WT, K, true, M, N, K, acc);
  }

  // dx (M, K at ldx) (=, or += when acc_dx) dy · W; dW += dyᵀ · x; db += column sums of dy.
  void linear_bwd(char* dxp, int64_t ldx, bool acc_dx, const char* dy, int64_t ldy, const char* x,
                  int64_t ldxin, int w, int b, int64_t M) const {
    const ParamInfo& p = params[static_cast<size_t>(w)];
    const int64_t N = p.rows, K = p.cols;
    if (dxp) mm(dxp, ldx, A, dy, ldy, false, W(w), WT, K, false, M, K, N, acc_dx);
    mm(G(w), K, DType::kF32, dy, ldy, true, x, A, ldxin, false, N, K, M, true);
    if (b >= 0) {
      // Callers pass a bias only for a whole (unsliced) output: column sums of contiguous rows.
      if (ldy != N) throw Error(ErrorCode::kInternal, "linear_bwd: bias of a column slice");
      k::column_sum_accumulate(G(b), dy, A, M, N, threads);
    }
  }

  void norm(char* y, float* mean, float* rstd, const char* x, int w, int b, int64_t M) const {
    k::NormArgs a;
    const k::RowView rv = k::RowView::contiguous(M, C);
    a.y = y, a.y_rows = rv, a.x = x, a.x_rows = rv;
    a.weight = P(w), a.bias = b >= 0 ? P(b) : nullptr, a.wdtype = DType::kF32;
    a.mean = gpt2 ? mean : nullptr, a.rstd = rstd;
    a.stats_rows = k::RowView::contiguous(M, 1);
    a.dtype = A, a.eps = cfg.norm_eps, a.rms = !gpt2, a.threads = threads;
    k::norm_forward(a);
  }

  void norm_bwd(char* dxp, const char* dy, const char* x, const char* dsum, int w, int b,
                const float* mean, const float* rstd, int64_t M) const {
    k::NormBackwardArgs a;
    a.dx = dxp, a.dy = dy, a.x = x, a.dsum = dsum, a.weight = P(w), a.wdtype = DType::kF32;
    a.dw = G(w), a.db = b >= 0 ? G(b) : nullptr, a.mean = gpt2 ? mean : nullptr, a.rstd = rstd;
    a.dtype = A, a.rows = M, a.cols = C, a.rms = !gpt2, a.threads = threads;
    k::norm_backward(a);
  }

  void rope(char* qkv, int64_t M, bool inverse) const {
    const int64_t e = static_cast<int64_t>(es());
    for (int part = 0; part < 2; ++part) {
      const int64_t heads = part == 0 ? H : Hkv;
      char* base = qkv + (part == 0 ? 0 : H * D) * e;
      k::RowView rv;
      rv.count = M * heads, rv.cols = D, rv.outer = 2;
      rv.dims[0] = M, rv.dims[1] = heads, rv.strides[0] = QW, rv.strides[1] = D;
      k::RopeArgs a;
      a.y = base, a.x = base, a.y_rows = a.x_rows = rv;
      a.positions = positions, a.pos_rows = k::RowView::contiguous(M, 1);
      a.pos_dtype = DType::kI32, a.dtype = A, a.rotation = cfg.rope.rotation;
      a.layout = ops::QkvLayout::kBSND, a.heads = heads, a.seq = 1, a.head_dim = D;
      a.rotary_dim = cfg.rope.rotary_dim > 0 ? cfg.rope.rotary_dim : D;
      a.inv_freq = inv_freq.data(), a.inverse = inverse, a.threads = threads;
      k::rope_forward(a);
    }
  }

  // x_0 = tok[ids] (+ pos[t]).
  void embed(char* x, const int32_t* ids, int64_t M) const {
    const int64_t e = static_cast<int64_t>(es());
    parallel_for(threads, M, 16, true, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(static_cast<size_t>(C));
      for (int64_t r = r0; r < r1; ++r) {
        const float* t = P(tok) + static_cast<int64_t>(ids[r]) * C;
        if (pos >= 0) {
          const float* p = P(pos) + static_cast<int64_t>(positions[r]) * C;
          for (int64_t c = 0; c < C; ++c) row[static_cast<size_t>(c)] = t[c] + p[c];
          convert(x + r * C * e, A, row.data(), DType::kF32, C);
        } else {
          convert(x + r * C * e, A, t, DType::kF32, C);
        }
      }
    });
  }

  // ---- layers --------------------------------------------------------------------------------

  void layer_forward(int64_t l, const Set& s, const char* x, char* xo, int64_t Mb, int64_t T) {
    const LayerParams& lp = layers[static_cast<size_t>(l)];
    const int64_t M = Mb * T, e = static_cast<int64_t>(es());
    norm(s.h1, s.mean1, s.rstd1, x, lp.ln1_w, lp.ln1_b, M);
    for (const auto& pj : lp.qkv) linear(s.qkv + pj.col * e, QW, s.h1, C, pj.w, pj.b, M, false);
    if (!gpt2) rope(s.qkv, M, false);
    const k::AttentionArgs a = attn_args(&s, Mb, T);
    k::attention_forward(a, attn_ws);
    std::memcpy(s.x2, x, static_cast<size_t>(M * C * e));
    linear(s.x2, C, s.o, H * D, lp.wo, lp.bo, M, true);
    norm(s.h2, s.mean2, s.rstd2, s.x2, lp.ln2_w, lp.ln2_b, M);
    for (const auto& pj : lp.up) linear(s.u + pj.col * e, UW, s.h2, C, pj.w, pj.b, M, false);
    k::ActivationArgs aa;
    aa.y = s.a, aa.y_rows = k::RowView::contiguous(M, F);
    aa.x = s.u, aa.x_rows = k::RowView::contiguous(M, UW);
    aa.dtype = A, aa.type = act, aa.threads = threads;
    k::activation_forward(aa);
    std::memcpy(xo, s.x2, static_cast<size_t>(M * C * e));
    linear(xo, C, s.a, F, lp.wd, lp.bd, M, true);
  }

  // dx: in, the gradient at the layer's output; out, at its input x.
  void layer_backward(int64_t l, const Set& s, const char* x, int64_t Mb, int64_t T) {
    const LayerParams& lp = layers[static_cast<size_t>(l)];
    const int64_t M = Mb * T, e = static_cast<int64_t>(es());
    // MLP: da = dx · Wd, then the activation, then dh = du · W1.
    linear_bwd(da, F, false, dx, C, s.a, F, lp.wd, lp.bd, M);
    k::ActivationBackwardArgs ab;
    ab.dx = du, ab.dy = da, ab.x = s.u, ab.dtype = A, ab.type = act, ab.rows = M, ab.cols = F;
    ab.threads = threads;
    k::activation_backward(ab);
    for (size_t i = 0; i < lp.up.size(); ++i) {
      const auto& pj = lp.up[i];
      linear_bwd(dh, C, i > 0, du + pj.col * e, UW, s.h2, C, pj.w, pj.b, M);
    }
    norm_bwd(dx2, dh, s.x2, dx, lp.ln2_w, lp.ln2_b, s.mean2, s.rstd2, M);
    // Attention: do = dx2 · Wo, flash backward, rope backward, dh = dqkv · Wqkv.
    linear_bwd(dout, H * D, false, dx2, C, s.o, H * D, lp.wo, lp.bo, M);
    k::AttentionBackwardArgs b;
    b.f = attn_args(&s, Mb, T);
    b.dout = dout, b.do_sb = b.f.o_sb, b.do_sh = b.f.o_sh, b.do_ss = b.f.o_ss;
    b.dq = dqkv, b.dq_sb = b.f.q_sb, b.dq_sh = b.f.q_sh, b.dq_ss = b.f.q_ss;
    b.dk = dqkv + H * D * e, b.dk_sb = b.f.k_sb, b.dk_sh = b.f.k_sh, b.dk_ss = b.f.k_ss;
    b.dv = dqkv + (H + Hkv) * D * e, b.dv_sb = b.f.v_sb, b.dv_sh = b.f.v_sh, b.dv_ss = b.f.v_ss;
    k::attention_backward(b, attn_ws);
    if (!gpt2) rope(dqkv, M, true);
    bool any_bias = false;
    for (size_t i = 0; i < lp.qkv.size(); ++i) {
      const auto& pj = lp.qkv[i];
      linear_bwd(dh, C, i > 0, dqkv + pj.col * e, QW, s.h1, C, pj.w, lp.qkv.size() == 1 ? pj.b : -1,
                 M);
      any_bias |= lp.qkv.size() > 1 && pj.b >= 0;
    }
    if (any_bias) {  // separate q/k/v biases: one column sum over the whole qkv gradient
      std::fill(colsum, colsum + QW, 0.0f);
      k::column_sum_accumulate(colsum, dqkv, A, M, QW, threads);
      for (const auto& pj : lp.qkv) {
        if (pj.b < 0) continue;
        float* g = G(pj.b);
        for (int64_t c = 0; c < params[static_cast<size_t>(pj.b)].n; ++c)
          g[c] += colsum[pj.col + c];
      }
    }
    norm_bwd(dx, dh, x, dx2, lp.ln1_w, lp.ln1_b, s.mean1, s.rstd1, M);
  }

  // Forward (and backward when grad_scale is set) of one micro-batch; returns its mean loss.
  double micro(const int32_t* ids, const int32_t* labels, int64_t Mb, int64_t T, bool backward,
               float grad_scale) {
    plan(Mb, T);
    const int64_t M = Mb * T;
    embed(xs[0], ids, M);
    for (int64_t l = 0; l < L; ++l)
      layer_forward(l, sets[static_cast<size_t>(opt.checkpointing ? 0 : l)],
                    xs[static_cast<size_t>(l)], xs[static_cast<size_t>(l + 1)], Mb, T);
    norm(hf, meanf, rstdf, xs[static_cast<size_t>(L)], lnf_w, lnf_b, M);
    k::LinearCrossEntropyArgs ce;
    ce.dx = backward ? dh : nullptr, ce.dw = backward ? G(head) : nullptr;
    ce.x = hf, ce.w = W(head), ce.labels = labels, ce.dtype = A, ce.w_dtype = WT;
    ce.M = M, ce.K = C, ce.V = V, ce.grad_scale = grad_scale, ce.threads = threads;
    const double loss = k::linear_cross_entropy(ce);
    if (!backward) return loss;
    norm_bwd(dx, dh, xs[static_cast<size_t>(L)], nullptr, lnf_w, lnf_b, meanf, rstdf, M);
    for (int64_t l = L - 1; l >= 0; --l) {
      const Set& s = sets[static_cast<size_t>(opt.checkpointing ? 0 : l)];
      if (opt.checkpointing)  // recompute the layer's activations from its input
        layer_forward(l, s, xs[static_cast<size_t>(l)], hf, Mb, T);
      layer_backward(l, s, xs[static_cast<size_t>(l)], Mb, T);
    }
    k::EmbeddingBackwardArgs eb;
    eb.dw = G(tok), eb.dy = dx, eb.ids = ids, eb.dtype = A, eb.tokens = M, eb.vocab = V;
    eb.cols = C, eb.threads = threads;
    k::embedding_backward(eb);
    if (pos >= 0) {
      eb.dw = G(pos), eb.ids = positions, eb.vocab = cfg.max_positions;
      k::embedding_backward(eb);
    }
    return loss;
  }

  void check_batch(const int32_t* ids, const int32_t* labels, int64_t B, int64_t T) const {
    if (B <= 0 || T <= 0)
      throw Error(ErrorCode::kInvalidArgument, "training: batch and seq must be positive, got " +
                                                   std::to_string(B) + " x " + std::to_string(T));
    if (gpt2 && T > cfg.max_positions)
      throw Error(ErrorCode::kInvalidArgument,
                  "training: seq " + std::to_string(T) + " exceeds the model's " +
                      std::to_string(cfg.max_positions) + " positions");
    for (int64_t i = 0; i < B * T; ++i) {
      if (ids[i] < 0 || ids[i] >= V)
        throw Error(ErrorCode::kInvalidArgument, "training: token id " + std::to_string(ids[i]) +
                                                     " at " + std::to_string(i) +
                                                     " is outside [0, " + std::to_string(V) + ")");
      if (labels[i] != -100 && (labels[i] < 0 || labels[i] >= V))
        throw Error(ErrorCode::kInvalidArgument,
                    "training: label " + std::to_string(labels[i]) + " at " + std::to_string(i) +
                        " is outside [0, " + std::to_string(V) + ") and is not -100");
    }
  }

  double run(const int32_t* ids, const int32_t* labels, int64_t B, int64_t T, bool backward,
             float scale) {
    check_batch(ids, labels, B, T);
    const int64_t mb = opt.micro_batch > 0 ? std::min(opt.micro_batch, B) : B;
    int64_t total_valid = 0;
    for (int64_t i = 0; i < B * T; ++i) total_valid += labels[i] != -100;
    if (backward) std::memset(grad.data(), 0, static_cast<size_t>(total) * 4);
    if (total_valid == 0) return 0.0;
    plan(mb, T);
    double loss = 0.0;
    for (int64_t b0 = 0; b0 < B; b0 += mb) {
      const int64_t n = std::min(mb, B - b0);
      int64_t valid = 0;
      for (int64_t i = b0 * T; i < (b0 + n) * T; ++i) valid += labels[i] != -100;
      if (valid == 0) continue;
      const float w =
          static_cast<float>(static_cast<double>(valid) / static_cast<double>(total_valid));
      loss += micro(ids + b0 * T, labels + b0 * T, n, T, backward, w * scale) *
              static_cast<double>(valid);
    }
    return loss / static_cast<double>(total_valid);
  }
};

// ---- Trainer -----------------------------------------------------------------------------------

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

namespace {
std::unique_ptr<Trainer::Impl> make_impl(const ModelConfig& c, const TrainOptions& o) {
  if (o.compute != DType::kF32 && o.compute != DType::kBF16 && o.compute != DType::kF16)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("training: compute dtype must be f32, bf16 or f16, got ") +
                    dtype_name(o.compute));
  c.validate("training config");
  auto impl = std::make_unique<Trainer::Impl>();
  impl->cfg = c;
  impl->opt = o;
  impl->A = o.compute;
  impl->WT = o.compute == DType::kF16 ? DType::kF32 : o.compute;
  impl->threads = o.threads > 0 ? o.threads : available_cores();
  impl->scaler = LossScaler(o.loss_scaling ? o.initial_loss_scale : 1.0f, o.growth_interval);
  impl->build_params();
  return impl;
}
}  // namespace

std::unique_ptr<Trainer> Trainer::from_config(const ModelConfig& c, const TrainOptions& o,
                                              uint64_t seed) {
  auto impl = make_impl(c, o);
  impl->config_text = config_json(c);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (const ParamInfo& p : impl->params) {
    float* d = impl->master.data_as<float>() + p.off;
    if (p.shape.size() == 1) {
      std::fill(d, d + p.n, p.gain ? 1.0f : 0.0f);
    } else {
      for (int64_t i = 0; i < p.n; ++i) d[i] = nd(gen);
    }
  }
  impl->sync_compute_copy();
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

std::unique_ptr<Trainer> Trainer::from_pretrained(const std::string& dir, const TrainOptions& o) {
  const std::string text = read_file(dir + "/config.json");
  auto impl = make_impl(ModelConfig::from_json(text, dir + "/config.json"), o);
  impl->config_text = text;
  auto st = model::SafeTensors::open(dir);
  for (const ParamInfo& p : impl->params) {
    std::string name = p.name;
    if (!st->has(name)) {  // checkpoints saved from the base model lack the prefix
      const size_t dot = name.find('.');
      if (dot != std::string::npos && st->has(name.substr(dot + 1))) name = name.substr(dot + 1);
    }
    if (!st->has(name))
      throw Error(ErrorCode::kInvalidArgument,
                  dir + ": missing tensor \"" + p.name + "\" needed for training");
    const Tensor t = st->tensor(name);
    const Shape want(p.shape.begin(), p.shape.end());
    if (t.shape() != want)
      throw Error(ErrorCode::kInvalidArgument,
                  dir + ": tensor \"" + name + "\" has shape " + t.desc().shape_string() +
                      ", the config needs " +
                      TensorDesc::contiguous(DType::kF32, want).shape_string());
    std::vector<float> tmp(static_cast<size_t>(p.n));
    convert(tmp.data(), DType::kF32, t.data(), t.dtype(), p.n);
    float* d = impl->master.data_as<float>() + p.off;
    if (p.transposed) {  // (in, out) -> (out, in)
      const int64_t in = p.shape[0], out = p.shape[1];
      for (int64_t i = 0; i < in; ++i)
        for (int64_t j = 0; j < out; ++j) d[j * in + i] = tmp[static_cast<size_t>(i * out + j)];
    } else {
      std::copy(tmp.begin(), tmp.end(), d);
    }
  }
  impl->sync_compute_copy();
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

const ModelConfig& Trainer::config() const { return impl_->cfg; }
const TrainOptions& Trainer::options() const { return impl_->opt; }
void Trainer::set_options(const TrainOptions& o) {
  if (o.compute != impl_->A)
    throw Error(ErrorCode::kInvalidArgument, "set_options: the compute dtype cannot change");
  const TrainOptions was = impl_->opt;
  impl_->opt = o;
  impl_->threads = o.threads > 0 ? o.threads : available_cores();
  if (o.loss_scaling != was.loss_scaling || o.initial_loss_scale != was.initial_loss_scale ||
      o.growth_interval != was.growth_interval)
    impl_->scaler = LossScaler(o.loss_scaling ? o.initial_loss_scale : 1.0f, o.growth_interval);
  impl_->arena_M = -1;  // threads or checkpointing may have changed the plan
}

double Trainer::forward_backward(const int32_t* ids, const int32_t* labels, int64_t batch,
                                 int64_t seq, float grad_scale) {
  return impl_->run(ids, labels, batch, seq, true, grad_scale);
}
double Trainer::loss(const int32_t* ids, const int32_t* labels, int64_t batch, int64_t seq) {
  return impl_->run(ids, labels, batch, seq, false, 1.0f);
}

StepStats Trainer::step(const int32_t* ids, const int32_t* labels, int64_t batch, int64_t seq) {
  Impl& s = *impl_;
  StepStats st;
  const float scale = s.opt.loss_scaling ? s.scaler.scale() : 1.0f;
  st.loss_scale = scale;
  st.loss = s.run(ids, labels, batch, seq, true, scale);
  for (int64_t i = 0; i < batch * seq; ++i) st.tokens += labels[i] != -100;
  if (st.tokens == 0) {  // nothing to learn from: no update, no decay, no moment change
    ++s.step;
    st.lr = scheduled_lr(s.opt, s.step);
    st.skipped = true;
    return st;
  }
  double ss = 0.0;
  for (const ParamInfo& p : s.params)
    ss += k::sum_squares(s.grad.data_as<float>() + p.off, p.n, s.threads);
  const bool finite = std::isfinite(ss);
  ++s.step;
  st.lr = scheduled_lr(s.opt, s.step);
  if (s.opt.loss_scaling) {
    if (!s.scaler.update(!finite)) {
      st.skipped = true;
      st.grad_norm = std::numeric_limits<double>::infinity();
      return st;
    }
  } else if (!finite) {
    st.skipped = true;
    st.grad_norm = std::numeric_limits<double>::infinity();
    return st;
  }
  st.grad_norm = std::sqrt(ss) / scale;
  double clip = 1.0;
  if (s.opt.clip_norm > 0.0f) clip = std::min(1.0, s.opt.clip_norm / (st.grad_norm + 1e-6));
  ++s.adam_t;
  for (const ParamInfo& p : s.params) {
    k::AdamWArgs a;
    a.p = s.master.data_as<float>() + p.off;
    a.m = s.m.data_as<float>() + p.off;
    a.v = s.v.data_as<float>() + p.off;
    a.g = s.grad.data_as<float>() + p.off;
    a.p16 = s.WT == DType::kF32 ? nullptr : s.p16.data_as<bf16_t>() + p.off;
    a.n = p.n, a.step = s.adam_t;
    a.lr = static_cast<float>(st.lr), a.beta1 = s.opt.beta1, a.beta2 = s.opt.beta2;
    a.eps = s.opt.eps, a.weight_decay = p.decay ? s.opt.weight_decay : 0.0f;
    a.grad_scale = static_cast<float>(clip / scale);
    a.threads = s.threads;
    k::adamw_step(a);
  }
  return st;
}

int64_t Trainer::steps_done() const { return impl_->step; }

std::vector<std::string> Trainer::parameter_names() const {
  std::vector<std::string> n;
  for (const ParamInfo& p : impl_->params) n.push_back(p.name);
  return n;
}

namespace {
const ParamInfo& info(const Trainer::Impl& s, const std::string& name) {
  auto it = s.by_name.find(name);
  if (it == s.by_name.end())
    throw Error(ErrorCode::kInvalidArgument, "no parameter named \"" + name + "\"");
  return s.params[static_cast<size_t>(it->second)];
}
// A flat buffer's slice of p, in the checkpoint's layout.
std::vector<float> checkpoint_layout(const ParamInfo& p, const float* d) {
  std::vector<float> out(static_cast<size_t>(p.n));
  if (p.transposed) {
    const int64_t in = p.shape[0], o = p.shape[1];
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < o; ++j) out[static_cast<size_t>(i * o + j)] = d[j * in + i];
  } else {
    std::copy(d, d + p.n, out.begin());
  }
  return out;
}
}  // namespace

std::vector<int64_t> Trainer::parameter_shape(const std::string& name) const {
  return info(*impl_, name).shape;
}
std::vector<float> Trainer::parameter(const std::string& name) const {
  const ParamInfo& p = info(*impl_, name);
  return checkpoint_layout(p, impl_->master.data_as<float>() + p.off);
}
std::vector<float> Trainer::gradient(const std::string& name) const {
  const ParamInfo& p = info(*impl_, name);
  return checkpoint_layout(p, impl_->grad.data_as<float>() + p.off);
}
int64_t Trainer::num_parameters() const {
  int64_t n = 0;
  for (const ParamInfo& p : impl_->params) n += p.n;
  return n;
}
size_t Trainer::activation_bytes() const { return impl_->arena_bytes + impl_->scratch_bytes; }
size_t Trainer::state_bytes() const {
  return static_cast<size_t>(impl_->total) * 4 * 4 + (impl_->p16.data() ? impl_->p16.nbytes() : 0);
}

void Trainer::save(const std::string& dir_in, const std::string& extra_json,
                   const std::map<std::string, std::string>& extra_files) const {
  namespace fs = std::filesystem;
  const Impl& s = *impl_;
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  std::map<std::string, Tensor> weights, state;
  std::vector<std::vector<float>> keep;
  for (const ParamInfo& p : s.params) {
    keep.push_back(checkpoint_layout(p, s.master.data_as<float>() + p.off));
    weights[p.name] =
        Tensor::view(keep.back().data(), DType::kF32, Shape(p.shape.begin(), p.shape.end()));
    state["m." + p.name] = Tensor::view(s.m.data_as<float>() + p.off, DType::kF32, {p.n});
    state["v." + p.name] = Tensor::view(s.v.data_as<float>() + p.off, DType::kF32, {p.n});
  }
  model::save_safetensors(tmp + "/model.safetensors", weights);
  model::save_safetensors(tmp + "/optimizer.safetensors", state);
  write_file_atomic(tmp + "/config.json", s.config_text);
  for (const auto& [name, text] : extra_files) write_file_atomic(tmp + "/" + name, text);
  nlohmann::json j;
  j["step"] = s.step, j["adam_step"] = s.adam_t;
  j["loss_scale"] = s.scaler.scale(), j["clean_steps"] = s.scaler.clean_steps();
  j["compute"] = dtype_name(s.A);
  j["extra"] = nlohmann::json::parse(extra_json);
  write_file_atomic(tmp + "/trainer_state.json", j.dump(2) + "\n");
  // Swap into place; at every moment dir or dir.old is a whole checkpoint.
  const std::string old = dir + ".old";
  if (fs::exists(dir)) {
    fs::remove_all(old, ec);
    fs::rename(dir, old);
  }
  fs::rename(tmp, dir);
  fs::remove_all(old, ec);
}

std::string Trainer::load_state(const std::string& dir) {
  Impl& s = *impl_;
  const nlohmann::json j = nlohmann::json::parse(read_file(dir + "/trainer_state.json"));
  auto w = model::SafeTensors::open(dir + "/model.safetensors");
  auto st = model::SafeTensors::open(dir + "/optimizer.safetensors");
  // Every tensor is checked before anything is overwritten: a bad checkpoint leaves the
  // trainer as it was.
  auto get = [&](model::SafeTensors& f, const std::string& name, const Shape& shape) {
    if (!f.has(name))
      throw Error(ErrorCode::kInvalidArgument, dir + ": missing tensor \"" + name + "\"");
    const Tensor t = f.tensor(name);
    if (t.shape() != shape || t.dtype() != DType::kF32)
      throw Error(ErrorCode::kInvalidArgument,
                  dir + ": tensor \"" + name + "\" is " + dtype_name(t.dtype()) + " " +
                      t.desc().shape_string() + ", the model needs F32 " +
                      TensorDesc::contiguous(DType::kF32, shape).shape_string());
    return static_cast<const float*>(t.data());
  };
  struct Src {
    const float *w, *m, *v;
  };
  std::vector<Src> src;
  for (const ParamInfo& p : s.params)
    src.push_back({get(*w, p.name, Shape(p.shape.begin(), p.shape.end())),
                   get(*st, "m." + p.name, {p.n}), get(*st, "v." + p.name, {p.n})});
  const int64_t step = j.at("step").get<int64_t>(), adam_step = j.at("adam_step").get<int64_t>();
  const float loss_scale = j.at("loss_scale").get<float>();
  const int64_t clean = j.at("clean_steps").get<int64_t>();
  for (size_t i = 0; i < s.params.size(); ++i) {
    const ParamInfo& p = s.params[i];
    float* d = s.master.data_as<float>() + p.off;
    if (p.transposed) {
      const int64_t in = p.shape[0], o = p.shape[1];
      for (int64_t r = 0; r < in; ++r)
        for (int64_t c = 0; c < o; ++c) d[c * in + r] = src[i].w[r * o + c];
    } else {
      std::copy(src[i].w, src[i].w + p.n, d);
    }
    std::copy(src[i].m, src[i].m + p.n, s.m.data_as<float>() + p.off);
    std::copy(src[i].v, src[i].v + p.n, s.v.data_as<float>() + p.off);
  }
  s.step = step, s.adam_t = adam_step;
  s.scaler.restore(loss_scale, clean);
  s.sync_compute_copy();
  return j.at("extra").dump();
}

}  // namespace tboost::train
