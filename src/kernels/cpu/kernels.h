// Internal kernel entry points of the CPU backend: one argument struct and one function per
// op family. The ops (src/ops) fill the structs after validation; the public free functions
// (include/tboost/kernels/cpu.h) fill them for contiguous data. Every pointer here has been
// validated by the caller: kernels do not check.
#pragma once

#include <cstdint>
#include <optional>

#include "tboost/core/dtype.h"
#include "tboost/ops/activation.h"
#include "tboost/ops/rope.h"

namespace tboost::kernels {

// Rows of a tensor whose last dim is contiguous: `count` rows; row r starts at element
// offset(r). Collapsible leading dims give one uniform stride (the fast path).
struct RowView {
  int64_t count = 0;
  int64_t cols = 0;
  int64_t uniform_stride = -1;  // >= 0 when offset(r) == r * uniform_stride
  int outer = 0;
  int64_t dims[8] = {};
  int64_t strides[8] = {};
  int64_t offset(int64_t r) const {
    if (uniform_stride >= 0) return r * uniform_stride;
    int64_t off = 0;
    for (int d = outer - 1; d >= 0; --d) {
      off += (r % dims[d]) * strides[d];
      r /= dims[d];
    }
    return off;
  }
  static RowView contiguous(int64_t rows, int64_t cols) {
    RowView v;
    v.count = rows;
    v.cols = cols;
    v.uniform_stride = cols;
    return v;
  }
};

struct NormArgs {
  void* y = nullptr;
  RowView y_rows;
  void* sum = nullptr;  // kPreNorm: x + residual (the new residual stream)
  RowView sum_rows;
  const void* x = nullptr;
  RowView x_rows;
  const void* residual = nullptr;  // null for kNorm
  RowView res_rows;
  const void* weight = nullptr;
  const void* bias = nullptr;  // LayerNorm only; null for none
  float* mean = nullptr;       // optional stats, one per row at stats_rows.offset(r)
  float* rstd = nullptr;
  RowView stats_rows;
  DType dtype = DType::kF32;   // x, residual, y, sum
  DType wdtype = DType::kF32;  // weight, bias
  float eps = 1e-6f;           // rows and cols: x_rows.count and x_rows.cols
  bool rms = true;
  bool plus_one = false;
  int threads = 1;
  bool ftz = true;
};
void norm_forward(const NormArgs& a);

// Backward of norm_forward over contiguous rows (training keeps activations contiguous).
// x is what was normalized (PRENORM: the sum x + residual). dx = dL/dx (+ dsum, the gradient
// arriving at PRENORM's sum output: then dx is also the residual's gradient); dx may alias dy
// or dsum. dw and db (LayerNorm) accumulate (+=, f32) and may be null; mean (LayerNorm) and
// rstd are the forward's statistics. Thread-count independent bits (fixed row chunks).
struct NormBackwardArgs {
  void* dx = nullptr;          // (rows, cols), dtype
  const void* dy = nullptr;    // (rows, cols), dtype
  const void* x = nullptr;     // (rows, cols), dtype
  const void* dsum = nullptr;  // (rows, cols), dtype, or null
  const void* weight = nullptr;
  float* dw = nullptr;
  float* db = nullptr;
  const float* mean = nullptr;  // (rows), LayerNorm
  const float* rstd = nullptr;  // (rows)
  DType dtype = DType::kF32;
  DType wdtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  bool rms = true;
  bool plus_one = false;
  int threads = 1;
  bool ftz = true;
};
void norm_backward(const NormBackwardArgs& a);

// Backward of activation_forward, contiguous rows. Plain types: dx (rows, F) = dy * act'(x), dx
// may alias dy. Gated types (kSwiGlu, kGeGlu*: y = act(gate) * up, x and dx (rows, 2F), halves
// as gate_first says): d gate = dy * up * act'(gate), d up = dy * act(gate).
struct ActivationBackwardArgs {
  void* dx = nullptr;
  const void* dy = nullptr;  // (rows, F)
  const void* x = nullptr;   // the forward input
  DType dtype = DType::kF32;
  ops::ActivationType type = ops::ActivationType::kSilu;
  bool gate_first = true;
  int64_t rows = 0, cols = 0;  // cols = F
  int threads = 1;
  bool ftz = true;
};
void activation_backward(const ActivationBackwardArgs& a);

// Embedding backward: dw[ids[t]] += dy[t] (dw (vocab, cols) f32). ids are in [0, vocab)
// (checked by the caller). Thread-count independent bits.
struct EmbeddingBackwardArgs {
  float* dw = nullptr;
  const void* dy = nullptr;  // (tokens, cols), dtype
  const void* ids = nullptr;
  DType dtype = DType::kF32;
  DType ids_dtype = DType::kI32;  // kI32 or kI64
  int64_t tokens = 0, vocab = 0, cols = 0;
  int threads = 1;
  bool ftz = true;
};
void embedding_backward(const EmbeddingBackwardArgs& a);

// y (M, N) = op(a) · op(b) (+ y when accumulate), one oneDNN matmul (src/kernels/cpu/gemm.cc).
// op(a) is (M, K): a row-major with leading dim lda, read transposed when trans_a (a stored
// (K, M)); op(b) is (K, N): b stored (K, N), or (N, K) when trans_b. y row-major, leading dim
// ldy. Dtypes f32 / bf16 / f16 each; 16-bit operands without a native oneDNN matmul are widened
// to f32. Throws tboost::Error on failure.
struct GemmArgs {
  void* y = nullptr;
  int64_t ldy = 0;
  DType y_dtype = DType::kF32;
  const void* a = nullptr;
  int64_t lda = 0;
  DType a_dtype = DType::kF32;
  bool trans_a = false;
  const void* b = nullptr;
  int64_t ldb = 0;
  DType b_dtype = DType::kF32;
  bool trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  bool accumulate = false;
  int threads = 1;
};
void gemm(const GemmArgs& g);
// Whether oneDNN has a matmul for 16-bit operands of dtype t here (f32 output).
bool gemm_has_native(DType t);

// Fused lm head + softmax + cross-entropy + gradients over row chunks (the (M, V) logits never
// exist): returns the mean loss over rows whose label is not ignore_index (0 when none),
// writes dx (M, K) = d loss / d x (may be null) and accumulates dw (V, K, f32) += d loss / d W
// (may be null). x, dx in dtype, w in w_dtype (unset: dtype); labels in [0, V) or ignore_index
// (else a tboost::Error before anything is written). chunk_rows: the most rows per chunk (0:
// ~40 MiB of f32 logits); the rows go in the fewest chunks of that size, each as small as that
// count allows (cross_entropy_chunk_rows). One f32 block of chunk x V is the call's working
// memory: the logits' gradient goes over it in the head's dtype.
struct LinearCrossEntropyArgs {
  void* dx = nullptr;
  float* dw = nullptr;
  const void* x = nullptr;  // (M, K)
  const void* w = nullptr;  // (V, K)
  const int32_t* labels = nullptr;
  DType dtype = DType::kF32;
  std::optional<DType> w_dtype;
  int64_t M = 0, K = 0, V = 0;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  int64_t chunk_rows = 0;
  // Multiplies the gradients (not the loss): a micro-batch's share of the global batch's
  // labels, times the loss scale.
  float grad_scale = 1.0f;
  int threads = 1;
  bool ftz = true;
};
double linear_cross_entropy(const LinearCrossEntropyArgs& a);
// The rows per chunk linear_cross_entropy uses for M rows at vocabulary V: ceil(M / n) for the
// fewest chunks n of at most cross_entropy_max_chunk_rows rows (the last chunk may be shorter).
// For any M it is at most min(M, cross_entropy_max_chunk_rows(V, requested)).
int64_t cross_entropy_chunk_rows(int64_t M, int64_t V, int64_t requested = 0);
int64_t cross_entropy_max_chunk_rows(int64_t V, int64_t requested = 0);
// linear_cross_entropy's per-chunk step: rows of f32 logits z (rows, V) -> loss[r] (f64) and
// d loss / d z = grad_scale · (softmax - target), written over z in grad_dtype (f32, bf16 or
// f16): an f32 row over itself, 16-bit rows packed at the start of the block (row r at element
// r·V of a grad_dtype array). Same label rules as linear_cross_entropy, unchecked here.
void cross_entropy_rows(float* z, DType grad_dtype, double* loss, const int32_t* labels,
                        int64_t rows, int64_t V, int64_t ignore_index, float label_smoothing,
                        float grad_scale, int threads, bool ftz = true);

// Column sums accumulated: out (cols, f32) += sum over rows of x (rows, cols, dtype), in fixed
// 32-row chunks added in order (thread-count independent bits). Linear's bias gradient.
void column_sum_accumulate(float* out, const void* x, DType dtype, int64_t rows, int64_t cols,
                           int threads, bool ftz = true);

// Sum of squares of g (n) in fixed 4096-element chunks, f64 partials added in order: the same
// bits for any thread count; inf or NaN when g holds them (src/kernels/cpu/optimizer.cc).
double sum_squares(const float* g, int64_t n, int threads);

// One AdamW step in place on f32 master weights (PyTorch's arithmetic): g is scaled by
// grad_scale first (clipping factor, 1 / loss scale); p16, if set, receives the new weights
// rounded to bf16.
struct AdamWArgs {
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* g = nullptr;
  bf16_t* p16 = nullptr;
  int64_t n = 0;
  int64_t step = 1;  // 1-based, for the bias corrections
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  float grad_scale = 1.0f;
  int threads = 1;
  bool ftz = true;
};
void adamw_step(const AdamWArgs& a);

struct RopeArgs {
  void* y = nullptr;
  RowView y_rows;  // rows of D features
  const void* x = nullptr;
  RowView x_rows;
  const void* positions = nullptr;
  RowView pos_rows;  // one element per token: positions[pos_rows.offset(token)]
  DType pos_dtype = DType::kI32;
  DType dtype = DType::kF32;
  ops::RopeRotation rotation = ops::RopeRotation::kRotateHalf;
  ops::QkvLayout layout = ops::QkvLayout::kBSND;
  int64_t heads = 1, seq = 1;  // H, and S for kBNSD: row (b,h,s) is token b*S+s; kBSND: row/H
  int64_t head_dim = 0, rotary_dim = 0;
  double scaling = 1.0;
  const double* inv_freq = nullptr;  // rotary_dim/2 values theta^(-2i/r), made once by the op
  // Rotate by -angle: the backward pass (dx = R(angle)^T dy = R(-angle) dy; the pass-through
  // dims beyond rotary_dim copy dy).
  bool inverse = false;
  int threads = 1;
  bool ftz = true;
};
void rope_forward(const RopeArgs& a);

struct ActivationArgs {
  void* y = nullptr;
  RowView y_rows;  // cols = F
  const void* x = nullptr;
  RowView x_rows;  // cols = F, or 2F for gated types
  DType dtype = DType::kF32;
  ops::ActivationType type = ops::ActivationType::kSilu;
  bool gate_first = true;
  int threads = 1;
  bool ftz = true;
};
void activation_forward(const ActivationArgs& a);

// Weight-streaming matrix-vector product for small M (decode): y (M, N) = epilogue(x (M, K) ·
// Wᵀ) with W (N, K) row-major as stored (Hugging Face layout), no packing. Every weight row is
// read once from memory per call, shared by all M rows of x (M <= kGemvMaxRows). Accumulation
// in f32; epilogue y = act(acc + bias) then (+ or ·) residual, rounded once to y's dtype.
constexpr int64_t kGemvMaxRows = 8;
struct GemvArgs {
  void* y = nullptr;
  int64_t ldy = 0;
  DType y_dtype = DType::kF32;
  const void* x = nullptr;
  int64_t ldx = 0;
  DType x_dtype = DType::kF32;
  const void* w = nullptr;
  int64_t ldw = 0;
  DType w_dtype = DType::kF32;
  const void* bias = nullptr;  // (N) or null
  DType bias_dtype = DType::kF32;
  const void* residual = nullptr;  // (M, N) with ldr, y's dtype, or null
  int64_t ldr = 0;
  bool residual_mul = false;
  bool has_act = false;
  ops::ActivationType act = ops::ActivationType::kSilu;  // kRelu, kGeluErf, kGeluTanh, kSilu
  int64_t M = 0, N = 0, K = 0;
  int threads = 1;
  bool ftz = true;
};
void gemv_forward(const GemvArgs& a);
// How the decode GEMVs' weight streams read, for GEMVs called from this thread. Where
// weight_stream_hint_applies() (AMD's AVX-512 cores, whose GEMVs of 1-2 x rows otherwise leave
// their lines to the hardware prefetchers), `true` asks for each weight line 1 KiB ahead with
// prefetchnta, which keeps the weights out of the outer caches; elsewhere the hint does nothing.
// Neither way wins on every host state (gemv.cc), so OptimizedTransformer picks one per decode
// step (src/model/step_ways.h). The outputs are bitwise the same either way.
void set_weight_stream_nta(bool on);
bool weight_stream_nta();
bool weight_stream_hint_applies();

struct SoftmaxArgs {
  void* y = nullptr;
  RowView y_rows;
  const void* x = nullptr;
  RowView x_rows;
  DType dtype = DType::kF32;
  float scale = 1.0f;
  int threads = 1;
  bool ftz = true;
};
void softmax_forward(const SoftmaxArgs& a);

// y = a op b over rows of the output; each input row is found through its own RowView (a
// broadcast dim has stride 0) and its last dim has stride 1 or 0 (scalar broadcast). kPow is
// std::pow per element (the op turns a scalar exponent of 2, 0.5, 1, -1, -0.5 into a unary).
// kMax / kMin propagate NaN.
enum class BinaryOp { kAdd, kMul, kSub, kDiv, kPow, kMax, kMin };
struct BinaryArgs {
  void* y = nullptr;
  RowView y_rows;
  const void* a = nullptr;
  RowView a_rows;
  int64_t a_col_stride = 1;
  const void* b = nullptr;
  RowView b_rows;
  int64_t b_col_stride = 1;
  DType dtype = DType::kF32;
  BinaryOp op = BinaryOp::kAdd;
  int threads = 1;
  bool ftz = true;
};
void binary_forward(const BinaryArgs& a);

// y = f(x) over rows (the last dims contiguous). kScale is alpha·x; kSquare and kIdentity
// serve pow with exponent 2 and 1. Division, sqrt and rsqrt are IEEE (exact rounding, rsqrt
// rounds twice); exp, tanh, erf and sigmoid are the fast vector math of hwy_util-inl.h.
enum class UnaryOp {
  kScale,
  kNeg,
  kSqrt,
  kRsqrt,
  kReciprocal,
  kExp,
  kTanh,
  kErf,
  kSigmoid,
  kAbs,
  kSquare,
  kIdentity
};
struct UnaryArgs {
  void* y = nullptr;
  RowView y_rows;
  const void* x = nullptr;
  RowView x_rows;
  DType dtype = DType::kF32;
  UnaryOp op = UnaryOp::kIdentity;
  float alpha = 1.0f;  // kScale
  int threads = 1;
  bool ftz = true;
};
void unary_forward(const UnaryArgs& a);

// Reduce (sum, mean, max, min; f32 accumulation) of x over the `red` dims, one output per
// index of the `kept` dims. Dims are listed outermost first; strides in elements. Work is split
// over outputs only, so each output's summation order never depends on the thread count.
// An empty reduction gives 0 (sum) or NaN (mean); the op rejects it for max/min.
enum class ReduceOp { kSum, kMean, kMax, kMin };
struct ReduceArgs {
  void* y = nullptr;
  const void* x = nullptr;
  DType dtype = DType::kF32;  // x and y
  int kept = 0;
  int64_t kept_dims[8] = {}, x_kept_strides[8] = {}, y_kept_strides[8] = {};
  int red = 0;
  int64_t red_dims[8] = {}, x_red_strides[8] = {};
  ReduceOp op = ReduceOp::kSum;
  int threads = 1;
  bool ftz = true;
};
void reduce_forward(const ReduceArgs& a);

// y = x element by element for two views of the same shape with any strides (a transpose is x
// viewed with permuted dims), converting when the dtypes differ (float types to and from f32;
// same-dtype copies take any dtype). Rows that are contiguous in both are copied with memcpy
// or convert; otherwise the two innermost dims are walked in cache-sized tiles.
struct CopyArgs {
  void* y = nullptr;
  DType y_dtype = DType::kF32;
  const void* x = nullptr;
  DType x_dtype = DType::kF32;
  int ndim = 0;
  int64_t dims[8] = {}, y_strides[8] = {}, x_strides[8] = {};
  int threads = 1;
};
void strided_copy(const CopyArgs& a);

// Drops size-1 dims and merges neighbours that every listed tensor walks as one
// (stride[i] == stride[i+1]·dim[i+1]), in place; returns the new rank. Fewer, longer dims mean
// longer inner loops and cheaper index arithmetic.
inline int coalesce_dims(int ndim, int64_t* dims, int64_t* const* strides, int count) {
  int n = 0;
  for (int i = 0; i < ndim; ++i) {
    if (dims[i] == 1) continue;
    bool merge = n > 0;
    for (int k = 0; k < count && merge; ++k) merge = strides[k][n - 1] == strides[k][i] * dims[i];
    if (merge) {
      dims[n - 1] *= dims[i];
      for (int k = 0; k < count; ++k) strides[k][n - 1] = strides[k][i];
    } else {
      dims[n] = dims[i];
      for (int k = 0; k < count; ++k) strides[k][n] = strides[k][i];
      ++n;
    }
  }
  return n;
}

// Attention (SelfAttention and PagedAttention). Strides are in elements; element (b, h, s, d)
// of q is at q + b*q_sb + h*q_sh + s*q_ss + d (the last dim is contiguous), likewise o and
// lse (no d). Keys and values: kv_seq_rows/paged addressing below.
struct AttentionArgs {
  void* o = nullptr;
  int64_t o_sb = 0, o_sh = 0, o_ss = 0;
  float* lse = nullptr;
  int64_t lse_sb = 0, lse_sh = 0, lse_ss = 0;
  const void* q = nullptr;
  int64_t q_sb = 0, q_sh = 0, q_ss = 0;
  // Non-paged: row s of kv head h of sequence b at k + b*k_sb + h*k_sh + s*k_ss.
  // Paged (block_table set): token t of sequence b lives in block
  // p = block_table[b*bt_stride + t/block_size], at k + p*k_sb + h*k_sh + (t%block_size)*k_ss.
  const void* k = nullptr;
  int64_t k_sb = 0, k_sh = 0, k_ss = 0;
  const void* v = nullptr;
  int64_t v_sb = 0, v_sh = 0, v_ss = 0;
  DType dtype = DType::kF32;     // q and o
  DType kv_dtype = DType::kF32;  // k and v
  int64_t batch = 1, heads = 1, kv_heads = 1, head_dim = 0, v_head_dim = 0;
  int64_t sq = 0, sk = 0;  // per sequence; the maxima when cu_q/cu_k/context_lens vary them
  // Setup of a varlen op knows only an upper bound of sq: the workspace must then also cover
  // the decode path, which execute may take when every sequence turns out short.
  bool sq_is_bound = false;
  // Varlen: sequence b owns tokens [cu[b], cu[b+1]) (q_sb/k_sb/v_sb/o_sb/lse_sb unused).
  const int32_t* cu_q = nullptr;
  const int32_t* cu_k = nullptr;
  const int32_t* context_lens = nullptr;  // per-sequence key count (caches); null: sk
  const int32_t* block_table = nullptr;
  int64_t bt_stride = 0, block_size = 0;
  float scale = 1.0f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  const float* alibi = nullptr;  // (heads) slopes, or null
  const float* mask = nullptr;   // additive: mask + b*mask_sb + i*mask_si + j, or null
  int64_t mask_sb = 0, mask_si = 0;
  int64_t kv_block = 0;  // keys per block (0: derived from the cache sizes)
  // bf16 q, k and v: run the prefill products as bf16 pair dots even without the instruction
  // (vdpbf16ps, AVX512_BF16), emulated; tests use it to check that path on any CPU.
  bool force_bf16_pairs = false;
  // bf16 q, k and v on a CPU with AMX: run the prefill products on the tile unit (the default;
  // TBOOST_ATTN_AMX=0 turns it off, as force_bf16_pairs does).
  bool allow_amx = true;
  int threads = 1;
  bool ftz = true;
};
// Workspace bytes attention_forward needs for these args (any context lengths up to sk).
size_t attention_workspace(const AttentionArgs& a);
void attention_forward(const AttentionArgs& a, void* workspace);
// Keys per tile chosen for these sizes: MM_BLOCK_SIZE if set, else from the cache sizes.
int64_t attention_kv_block(int64_t head_dim, int64_t v_head_dim);
// Whether bf16 prefill (attention_forward outside decode) dots bf16 pairs with vdpbf16ps on
// this CPU (attention.cc says when) rather than widening bf16 K/V to f32 for FMAs.
bool attention_prefill_bf16_dot();
// Whether bf16 prefill runs its two products on AMX tiles on this CPU (attention.cc).
bool attention_prefill_bf16_amx();
// Whether a bf16 decode (bf16 q and cache, head dims multiples of 32, allow_amx) runs its
// products on AMX tiles on this CPU, for `rows` query rows per kv head and task (the q heads of
// a kv head times the new tokens, in tasks of at most 16) and pages of block_size keys (0:
// contiguous).
bool attention_decode_bf16_amx(int64_t rows, int64_t block_size);
// AttentionArgs::allow_amx as the environment sets it: false when TBOOST_ATTN_AMX is "0".
bool attention_amx_allowed();
// Whether decode attention asks for its K/V lines into L2 rather than L1 (Zen 4: AMD family 19h
// with AVX-512; attention_decode.cc says why). cpuid alone (cpu_isa): safe while the library
// loads, and compiled for no particular ISA (attention.cc's HWY_ONCE part).
bool attention_decode_streams_into_l2();

// Attention backward (src/kernels/cpu/attention_backward.cc). f: the forward's arguments with
// its outputs o and lse as inputs (not paged, no context_lens); dout like o; dq like q (dtype),
// dk and dv like k and v (kv_dtype), written whole (GQA: dk, dv summed over each group's q heads).
// Bitwise the same for any thread count.
struct AttentionBackwardArgs {
  AttentionArgs f;
  const void* dout = nullptr;
  int64_t do_sb = 0, do_sh = 0, do_ss = 0;
  void* dq = nullptr;
  int64_t dq_sb = 0, dq_sh = 0, dq_ss = 0;
  void* dk = nullptr;
  int64_t dk_sb = 0, dk_sh = 0, dk_ss = 0;
  void* dv = nullptr;
  int64_t dv_sb = 0, dv_sh = 0, dv_ss = 0;
};
size_t attention_backward_workspace(const AttentionBackwardArgs& a);
void attention_backward(const AttentionBackwardArgs& a, void* workspace);

namespace cpu {
// Registers every CPU kernel with the op registry (called once, on first lookup).
void register_cpu_kernels();
}  // namespace cpu

}  // namespace tboost::kernels
