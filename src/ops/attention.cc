// The attention ops: SelfAttention, PagedAttention and ReshapeAndCache
// (include/tboost/ops/attention.h). Shapes, dtypes and params are checked in setup; values
// that only the data tells (cu_seqlens, context lengths, block table entries, slots) are
// checked at execute, all of them before the kernel writes a byte.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/core/parallel.h"
#include "src/kernels/cpu/kernels.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"
#include "src/ops/registry.h"

namespace tboost::ops_internal {
namespace {

using std::to_string;

// Lengths travel as int32 lanes inside the mask arithmetic.
constexpr int64_t kMaxLen = int64_t{1} << 30;

// Copies an i32 tensor of any view (validated by the caller) into a vector.
std::vector<int32_t> read_i32(const Tensor& t) {
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  const RowView ev = element_view(t.desc());
  for (int64_t i = 0; i < t.numel(); ++i)
    out[static_cast<size_t>(i)] = t.data_as<const int32_t>()[ev.offset(i)];
  return out;
}

float default_scale(float scale, int64_t d) {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
}

void check_scale(const Checker& chk, float scale) {
  chk.param(std::isfinite(scale),
            "scale must be finite (0 means 1/sqrt(head_dim)), got " + to_string(scale));
}

// q (input 0) against the kv heads of input kv_input (k or the key cache).
void check_heads(const Checker& chk, const TensorDesc& q, int64_t hq, int kv_input,
                 const char* kv_role, const TensorDesc& kv, int64_t hkv) {
  if (hkv < 1 || hq % hkv != 0)
    chk.fail(ErrorCode::kShapeMismatch,
             "q heads (" + to_string(hq) + ", input 0 (q) " + q.shape_string() +
                 ") must be a multiple of kv heads (" + to_string(hkv) + ", input " +
                 to_string(kv_input) + " (" + kv_role + ") " + kv.shape_string() +
                 "): kv heads must divide heads");
}

// A window at least as long as any sequence can be is no window: the kernels' mask arithmetic
// then stays within int32 (INT32_MAX or INT64_MAX is a common way to say "unbounded").
int64_t unbounded_if_huge(int64_t window) { return window >= kMaxLen ? -1 : window; }

void check_len(const Checker& chk, const char* what, int64_t n) {
  if (n >= kMaxLen)
    chk.fail(ErrorCode::kShapeMismatch, std::string(what) + " " + to_string(n) +
                                            " is too long (at most " + to_string(kMaxLen - 1) +
                                            ")");
}

// What SelfAttention and PagedAttention share: both run kernels::attention_forward; setup
// picks the kernel and the key block and sizes the workspace for its thread count, and
// execute starts from the same planned arguments. Each op says how its pack maps onto the
// kernel's arguments (args_of) and adds what only the data tells at execute.
template <class P>
class AttentionOpBase : public OpBase<P> {
 public:
  using OpBase<P>::OpBase;

 protected:
  virtual kernels::AttentionArgs args_of(const VariantPack& pack) const = 0;

  // args_of plus the plan of the last setup; threads never above setup's (the workspace was
  // sized for them).
  kernels::AttentionArgs planned(const VariantPack& pack, const Context& ctx) const {
    kernels::AttentionArgs a = args_of(pack);
    a.kv_block = kv_block_;
    a.threads = std::min(threads_, ctx.num_threads());
    a.ftz = ctx.flush_denormals();
    a.force_bf16_pairs = force_bf16_pairs_;
    a.allow_amx = allow_amx_;
    return a;
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    chk.last_dim_contiguous(0, "o", pack.outputs[0].desc());
    kernel_ = get_kernel<decltype(kernels::attention_forward)>(
        this->name(), ctx.device(), pack.inputs[0].dtype(), &this->impl_);
    kv_block_ = kernels::attention_kv_block(pack.inputs[0].dim(-1), pack.inputs[2].dim(-1));
    this->impl_ += ", key block " + to_string(kv_block_);
    threads_ = ctx.num_threads();
    force_bf16_pairs_ = std::getenv("TBOOST_ATTN_BF16_PAIRS") != nullptr;
    allow_amx_ = kernels::attention_amx_allowed();
    return kernels::attention_workspace(planned(pack, ctx));
  }

  void run(const kernels::AttentionArgs& a, void* ws) const { kernel_(a, ws); }

 private:
  decltype(kernels::attention_forward)* kernel_ = nullptr;
  int64_t kv_block_ = 0;
  int threads_ = 1;
  bool force_bf16_pairs_ = false;
  bool allow_amx_ = true;
};

// ---- SelfAttention ----------------------------------------------------------------------

class SelfAttentionOp : public AttentionOpBase<ops::AttentionParam> {
 public:
  using AttentionOpBase::AttentionOpBase;
  const char* name() const override { return "SelfAttention"; }
  bool checks_input_values() const override { return param_.varlen; }  // cu_seqlens

  int idx_cu() const { return 3; }
  int idx_alibi() const { return 3 + (param_.varlen ? 2 : 0); }
  int idx_mask() const { return idx_alibi() + (param_.alibi ? 1 : 0); }
  size_t n_inputs() const { return static_cast<size_t>(idx_mask() + (param_.custom_mask ? 1 : 0)); }

  std::string input_role(size_t i) const override {
    const int n = static_cast<int>(i);
    if (n < 3) return n == 0 ? "q" : n == 1 ? "k" : "v";
    if (param_.varlen && n == idx_cu()) return "cu_seqlens_q";
    if (param_.varlen && n == idx_cu() + 1) return "cu_seqlens_k";
    if (param_.alibi && n == idx_alibi()) return "alibi_slopes";
    if (param_.custom_mask && n == idx_mask()) return "mask";
    return "extra";
  }
  std::string output_role(size_t i) const override { return i == 0 ? "o" : "lse"; }
  Overlap input_overlap(size_t) const override { return Overlap::kNone; }

  bool bnsd() const { return !param_.varlen && param_.layout == ops::QkvLayout::kBNSD; }
  // Axis of heads and of the sequence in q/k/v.
  int head_axis() const { return param_.varlen ? 1 : bnsd() ? 1 : 2; }
  int seq_axis() const { return param_.varlen ? 0 : bnsd() ? 2 : 1; }

  void validate_param(const Checker& chk) const override {
    chk.param(param_.layout == ops::QkvLayout::kBSND || param_.layout == ops::QkvLayout::kBNSD,
              "unknown layout " + to_string(static_cast<int>(param_.layout)));
    check_scale(chk, param_.scale);
    chk.param(param_.window_left >= -1,
              "window_left must be >= 0 or -1 (unbounded), got " + to_string(param_.window_left));
    chk.param(param_.window_right >= -1,
              "window_right must be >= 0 or -1 (unbounded), got " + to_string(param_.window_right));
    chk.param(!(param_.varlen && param_.custom_mask),
              "custom_mask is not supported with varlen (packed sequences have no common "
              "(Sq, Sk) mask); use causal/window masks or a padded batch");
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    validate_param(chk);
    std::string names = "q, k, v";
    if (param_.varlen) names += ", cu_seqlens_q, cu_seqlens_k";
    if (param_.alibi) names += ", alibi_slopes";
    if (param_.custom_mask) names += ", mask";
    chk.count(in, n_inputs(), names);
    const int rank = param_.varlen ? 3 : 4;
    const char* roles[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i) {
      chk.rank(i, roles[i], in[static_cast<size_t>(i)], rank, rank);
      chk.dtype_in(i, roles[i], in[static_cast<size_t>(i)],
                   {DType::kF32, DType::kBF16, DType::kF16});
      chk.last_dim_contiguous(i, roles[i], in[static_cast<size_t>(i)]);
    }
    const TensorDesc &q = in[0], &k = in[1], &v = in[2];
    chk.dtype_eq(2, "v", v, k.dtype, "v must have k's dtype");
    const int ha = head_axis(), sa = seq_axis();
    check_heads(chk, q, q.dim(ha), 1, "k", k, k.dim(ha));
    chk.dim_eq(1, "k", k, -1, q.dim(-1), "head dim (q's)");
    chk.dim_eq(2, "v", v, ha, k.dim(ha), "kv heads (k's)");
    chk.dim_eq(2, "v", v, sa, k.dim(sa), "keys (k's length)");
    if (!param_.varlen) chk.dim_eq(1, "k", k, 0, q.dim(0), "batch (q's)");
    if (!param_.varlen) chk.dim_eq(2, "v", v, 0, q.dim(0), "batch (q's)");
    if (q.dim(-1) < 1 || v.dim(-1) < 1)
      chk.fail(ErrorCode::kShapeMismatch,
               "head dims must be >= 1, got q " + q.shape_string() + ", v " + v.shape_string());
    check_len(chk, "q length", q.dim(sa));
    check_len(chk, "k length", k.dim(sa));
    const int64_t hq = q.dim(ha), dv = v.dim(-1);
    int64_t batch = param_.varlen ? 0 : q.dim(0);
    if (param_.varlen) {
      for (int i = idx_cu(); i < idx_cu() + 2; ++i) {
        const std::string role = input_role(static_cast<size_t>(i));
        chk.rank(i, role.c_str(), in[static_cast<size_t>(i)], 1, 1);
        chk.dtype_eq(i, role.c_str(), in[static_cast<size_t>(i)], DType::kI32);
        if (in[static_cast<size_t>(i)].numel() < 1)
          chk.fail(ErrorCode::kShapeMismatch,
                   "input " + to_string(i) + " (" + role +
                       ") needs batch + 1 >= 1 entries (cu_seqlens), got " +
                       in[static_cast<size_t>(i)].shape_string());
      }
      batch = in[static_cast<size_t>(idx_cu())].numel() - 1;
      chk.dim_eq(idx_cu() + 1, "cu_seqlens_k", in[static_cast<size_t>(idx_cu() + 1)], 0, batch + 1,
                 "entries (cu_seqlens_q's)");
    }
    if (param_.alibi) {
      const TensorDesc& s = in[static_cast<size_t>(idx_alibi())];
      chk.dtype_eq(idx_alibi(), "alibi_slopes", s, DType::kF32);
      chk.shape_eq(idx_alibi(), "alibi_slopes", s, {hq});
    }
    if (param_.custom_mask) {
      const TensorDesc& m = in[static_cast<size_t>(idx_mask())];
      const int mi = idx_mask();
      chk.dtype_eq(mi, "mask", m, DType::kF32);
      const int64_t sq = q.dim(sa), sk = k.dim(sa);
      const bool ok2 = m.ndim == 2 && m.dim(0) == sq && m.dim(1) == sk;
      const bool ok4 = m.ndim == 4 && (m.dim(0) == 1 || m.dim(0) == batch) && m.dim(1) == 1 &&
                       m.dim(2) == sq && m.dim(3) == sk;
      if (!ok2 && !ok4)
        chk.fail(ErrorCode::kShapeMismatch,
                 "input " + to_string(mi) + " (mask) expected (" + to_string(sq) + ", " +
                     to_string(sk) + ") or (" + to_string(batch) + " or 1, 1, " + to_string(sq) +
                     ", " + to_string(sk) + "), got " + m.shape_string());
      chk.last_dim_contiguous(mi, "mask", m);
    }
    Shape o = q.shape();
    o.back() = dv;
    const Shape lse = param_.varlen ? Shape{hq, q.dim(0)} : Shape{batch, hq, q.dim(sa)};
    return {TensorDesc::contiguous(q.dtype, o), TensorDesc::contiguous(DType::kF32, lse)};
  }

  kernels::AttentionArgs args_of(const VariantPack& pack) const override {
    const Tensor &q = pack.inputs[0], &k = pack.inputs[1], &v = pack.inputs[2];
    const Tensor &o = pack.outputs[0], &lse = pack.outputs[1];
    const int ha = head_axis(), sa = seq_axis();
    kernels::AttentionArgs a;
    auto strides3 = [&](const Tensor& t, int64_t* sb, int64_t* sh, int64_t* ss) {
      *sb = param_.varlen ? 0 : t.stride(0);
      *sh = t.stride(ha);
      *ss = t.stride(sa);
    };
    a.q = q.data();
    strides3(q, &a.q_sb, &a.q_sh, &a.q_ss);
    a.k = k.data();
    strides3(k, &a.k_sb, &a.k_sh, &a.k_ss);
    a.v = v.data();
    strides3(v, &a.v_sb, &a.v_sh, &a.v_ss);
    a.o = o.data();
    strides3(o, &a.o_sb, &a.o_sh, &a.o_ss);
    a.lse = lse.data_as<float>();
    if (param_.varlen) {
      a.lse_sh = lse.stride(0);
      a.lse_ss = lse.stride(1);
    } else {
      a.lse_sb = lse.stride(0);
      a.lse_sh = lse.stride(1);
      a.lse_ss = lse.stride(2);
    }
    a.dtype = q.dtype();
    a.kv_dtype = k.dtype();
    a.heads = q.dim(ha);
    a.kv_heads = k.dim(ha);
    a.head_dim = q.dim(-1);
    a.v_head_dim = v.dim(-1);
    a.batch = param_.varlen ? pack.inputs[static_cast<size_t>(idx_cu())].numel() - 1 : q.dim(0);
    a.sq = q.dim(sa);  // varlen: total tokens, an upper bound of every sequence's length
    a.sq_is_bound = param_.varlen;
    a.sk = k.dim(sa);
    a.scale = default_scale(param_.scale, a.head_dim);
    a.causal = param_.causal;
    a.window_left = unbounded_if_huge(param_.window_left);
    a.window_right = unbounded_if_huge(param_.window_right);
    if (param_.custom_mask) {
      const Tensor& m = pack.inputs[static_cast<size_t>(idx_mask())];
      a.mask = m.data_as<const float>();
      a.mask_sb = m.ndim() == 4 && m.dim(0) > 1 ? m.stride(0) : 0;
      a.mask_si = m.stride(-2);
    }
    return a;
  }

  void do_execute(const VariantPack& pack, void* ws, Context& ctx) override {
    const Checker chk(name());
    kernels::AttentionArgs a = planned(pack, ctx);
    std::vector<int32_t> cu_q, cu_k;
    std::vector<float> slopes;
    if (param_.varlen) {
      const int64_t totals[2] = {pack.inputs[0].dim(0), pack.inputs[1].dim(0)};
      int64_t longest[2] = {0, 0};
      for (int w = 0; w < 2; ++w) {
        std::vector<int32_t> cu = read_i32(pack.inputs[static_cast<size_t>(idx_cu() + w)]);
        const std::string role = input_role(static_cast<size_t>(idx_cu() + w));
        if (cu[0] != 0)
          chk.fail(ErrorCode::kInvalidArgument, "input " + to_string(idx_cu() + w) + " (" + role +
                                                    ") must start at 0, got " + to_string(cu[0]) +
                                                    " (cu_seqlens)");
        for (size_t b = 1; b < cu.size(); ++b) {
          if (cu[b] < cu[b - 1])
            chk.fail(ErrorCode::kInvalidArgument,
                     "input " + to_string(idx_cu() + w) + " (" + role +
                         ") must be non-decreasing (cu_seqlens), but entry " + to_string(b) +
                         " = " + to_string(cu[b]) + " < entry " + to_string(b - 1) + " = " +
                         to_string(cu[b - 1]));
          longest[w] = std::max<int64_t>(longest[w], cu[b] - cu[b - 1]);
        }
        if (cu.back() != totals[w])
          chk.fail(ErrorCode::kShapeMismatch, "input " + to_string(idx_cu() + w) + " (" + role +
                                                  ") last entry " + to_string(cu.back()) +
                                                  " must equal the packed token count " +
                                                  to_string(totals[w]) + " (cu_seqlens)");
        (w == 0 ? cu_q : cu_k) = std::move(cu);
      }
      a.cu_q = cu_q.data();
      a.cu_k = cu_k.data();
      a.sq = longest[0];
      a.sk = longest[1];
    }
    if (param_.alibi) {
      const Tensor& s = pack.inputs[static_cast<size_t>(idx_alibi())];
      slopes.resize(static_cast<size_t>(s.numel()));
      const RowView ev = element_view(s.desc());
      for (int64_t i = 0; i < s.numel(); ++i)
        slopes[static_cast<size_t>(i)] = s.data_as<const float>()[ev.offset(i)];
      a.alibi = slopes.data();
    }
    run(a, ws);
  }
};

// ---- PagedAttention ---------------------------------------------------------------------

class PagedAttentionOp : public AttentionOpBase<ops::PagedAttentionParam> {
 public:
  using AttentionOpBase::AttentionOpBase;
  const char* name() const override { return "PagedAttention"; }
  bool checks_input_values() const override { return true; }  // context_lens, block_tables
  std::string input_role(size_t i) const override {
    static const char* r[] = {"q", "key_cache", "value_cache", "context_lens", "block_tables"};
    return i < 5 ? r[i] : "extra";
  }
  std::string output_role(size_t i) const override { return i == 0 ? "o" : "lse"; }
  Overlap input_overlap(size_t) const override { return Overlap::kNone; }

  void validate_param(const Checker& chk) const override {
    check_scale(chk, param_.scale);
    chk.param(param_.window_left >= -1,
              "window_left must be >= 0 or -1 (unbounded), got " + to_string(param_.window_left));
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    validate_param(chk);
    chk.count(in, param_.paged ? 5 : 4,
              param_.paged ? "q, key_cache, value_cache, context_lens, block_tables"
                           : "q, key_cache, value_cache, context_lens");
    const TensorDesc &q = in[0], &kc = in[1], &vc = in[2], &cl = in[3];
    chk.rank(0, "q", q, 4, 4);
    chk.dtype_in(0, "q", q, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(0, "q", q);
    chk.rank(1, "key_cache", kc, 4, 4);
    chk.dtype_in(1, "key_cache", kc, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(1, "key_cache", kc);
    chk.rank(2, "value_cache", vc, 4, 4);
    chk.dtype_eq(2, "value_cache", vc, kc.dtype, "the caches share a dtype");
    chk.last_dim_contiguous(2, "value_cache", vc);
    const int64_t B = q.dim(0), hq = q.dim(2), hkv = kc.dim(1);
    check_heads(chk, q, hq, 1, "key_cache", kc, hkv);
    chk.dim_eq(1, "key_cache", kc, 3, q.dim(3), "head dim (q's)");
    for (int ax = 0; ax < 3; ++ax)
      chk.dim_eq(2, "value_cache", vc, ax, kc.dim(ax), "(key_cache's)");
    if (vc.dim(3) < 1 || q.dim(3) < 1)
      chk.fail(ErrorCode::kShapeMismatch, "head dims must be >= 1, got q " + q.shape_string() +
                                              ", value_cache " + vc.shape_string());
    check_len(chk, "block_size", kc.dim(2));
    if (kc.dim(2) < 1)
      chk.fail(ErrorCode::kShapeMismatch, "input 1 (key_cache) " + kc.shape_string() +
                                              " has block_size 0 (num_blocks, kv_heads, "
                                              "block_size, head_dim)");
    if (!param_.paged)
      chk.dim_eq(1, "key_cache", kc, 0, B,
                 "sequences (q's batch): a contiguous cache holds one block per sequence");
    chk.dtype_eq(3, "context_lens", cl, DType::kI32);
    chk.shape_eq(3, "context_lens", cl, {B});
    if (param_.paged) {
      const TensorDesc& bt = in[4];
      chk.dtype_eq(4, "block_tables", bt, DType::kI32);
      chk.rank(4, "block_tables", bt, 2, 2);
      chk.dim_eq(4, "block_tables", bt, 0, B, "sequences (q's batch)");
      check_len(chk, "max blocks per sequence", bt.dim(1));
      check_len(chk, "cache capacity", bt.dim(1) * kc.dim(2));
    } else {
      check_len(chk, "cache capacity", kc.dim(2));
    }
    check_len(chk, "q length", q.dim(1));
    return {TensorDesc::contiguous(q.dtype, {B, q.dim(1), hq, vc.dim(3)}),
            TensorDesc::contiguous(DType::kF32, {B, hq, q.dim(1)})};
  }

  int64_t capacity(const VariantPack& pack) const {
    const int64_t bs = pack.inputs[1].dim(2);
    return param_.paged ? pack.inputs[4].dim(1) * bs : bs;
  }

  kernels::AttentionArgs args_of(const VariantPack& pack) const override {
    const Tensor &q = pack.inputs[0], &kc = pack.inputs[1], &vc = pack.inputs[2];
    const Tensor &o = pack.outputs[0], &lse = pack.outputs[1];
    kernels::AttentionArgs a;
    a.q = q.data(), a.q_sb = q.stride(0), a.q_ss = q.stride(1), a.q_sh = q.stride(2);
    a.o = o.data(), a.o_sb = o.stride(0), a.o_ss = o.stride(1), a.o_sh = o.stride(2);
    a.lse = lse.data_as<float>();
    a.lse_sb = lse.stride(0), a.lse_sh = lse.stride(1), a.lse_ss = lse.stride(2);
    a.k = kc.data(), a.k_sb = kc.stride(0), a.k_sh = kc.stride(1), a.k_ss = kc.stride(2);
    a.v = vc.data(), a.v_sb = vc.stride(0), a.v_sh = vc.stride(1), a.v_ss = vc.stride(2);
    a.dtype = q.dtype();
    a.kv_dtype = kc.dtype();
    a.batch = q.dim(0);
    a.heads = q.dim(2);
    a.kv_heads = kc.dim(1);
    a.head_dim = q.dim(3);
    a.v_head_dim = vc.dim(3);
    a.sq = q.dim(1);
    a.sk = capacity(pack);  // execute narrows it to the longest context
    a.block_size = kc.dim(2);
    a.scale = default_scale(param_.scale, a.head_dim);
    a.causal = true;
    a.window_left = unbounded_if_huge(param_.window_left);
    return a;
  }

  void do_execute(const VariantPack& pack, void* ws, Context& ctx) override {
    const Checker chk(name());
    kernels::AttentionArgs a = planned(pack, ctx);
    const int64_t cap = capacity(pack), sq = a.sq, bs = a.block_size;
    const int64_t nblocks = pack.inputs[1].dim(0);
    const std::vector<int32_t> lens = read_i32(pack.inputs[3]);
    std::vector<int32_t> table;
    if (param_.paged) table = read_i32(pack.inputs[4]);
    int64_t longest = 0;
    for (size_t b = 0; b < lens.size(); ++b) {
      const int64_t n = lens[b];
      if (n > cap)
        chk.fail(ErrorCode::kInvalidArgument,
                 "input 3 (context_lens) entry " + to_string(b) + " = " + to_string(n) +
                     " exceeds the cache capacity of " + to_string(cap) + " tokens");
      if (n < sq)
        chk.fail(ErrorCode::kInvalidArgument,
                 "input 3 (context_lens) entry " + to_string(b) + " = " + to_string(n) +
                     " is less than the " + to_string(sq) +
                     " new tokens of q (the cache must already hold them)");
      longest = std::max(longest, n);
      if (!param_.paged) continue;
      const int64_t mb = pack.inputs[4].dim(1);
      for (int64_t i = 0; i < (n + bs - 1) / bs; ++i) {
        const int32_t e = table[static_cast<size_t>(static_cast<int64_t>(b) * mb + i)];
        if (e < 0 || e >= nblocks)
          chk.fail(ErrorCode::kInvalidArgument, "input 4 (block_tables) entry [" + to_string(b) +
                                                    "][" + to_string(i) + "] = " + to_string(e) +
                                                    " is out of range [0, " + to_string(nblocks) +
                                                    ") of the cache's blocks");
      }
    }
    a.context_lens = lens.data();
    a.sk = longest;
    if (param_.paged) {
      a.block_table = table.data();
      a.bt_stride = pack.inputs[4].dim(1);
    }
    run(a, ws);
  }
};

// ---- ReshapeAndCache ----------------------------------------------------------------------

class ReshapeAndCacheOp : public OpBase<ops::ReshapeAndCacheParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "ReshapeAndCache"; }
  std::string input_role(size_t i) const override {
    static const char* r[] = {"k", "v", "slot_mapping", "key_cache", "value_cache", "positions"};
    return i < 6 ? r[i] : "extra";
  }
  std::string output_role(size_t i) const override { return i == 0 ? "key_cache" : "value_cache"; }
  int inplace_input(size_t output) const override { return 3 + static_cast<int>(output); }
  bool checks_input_values() const override { return true; }  // slot_mapping
  Overlap input_overlap(size_t i) const override {
    return i >= 3 ? Overlap::kSameViewOnly : Overlap::kNone;
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, param_.apply_rope ? 6 : 5,
              param_.apply_rope ? "k, v, slot_mapping, key_cache, value_cache, positions"
                                : "k, v, slot_mapping, key_cache, value_cache");
    const TensorDesc &k = in[0], &v = in[1], &sm = in[2], &kc = in[3], &vc = in[4];
    chk.rank(0, "k", k, 3, 3);
    chk.dtype_in(0, "k", k, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(0, "k", k);
    chk.rank(1, "v", v, 3, 3);
    chk.dtype_eq(1, "v", v, k.dtype, "v must have k's dtype");
    chk.last_dim_contiguous(1, "v", v);
    chk.dim_eq(1, "v", v, 0, k.dim(0), "tokens (k's)");
    chk.dim_eq(1, "v", v, 1, k.dim(1), "kv heads (k's)");
    chk.rank(2, "slot_mapping", sm, 1, 1);
    chk.dtype_in(2, "slot_mapping", sm, {DType::kI32, DType::kI64});
    chk.dim_eq(2, "slot_mapping", sm, 0, k.dim(0), "tokens (k's)");
    chk.rank(3, "key_cache", kc, 4, 4);
    chk.dtype_in(3, "key_cache", kc, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(3, "key_cache", kc);
    chk.rank(4, "value_cache", vc, 4, 4);
    chk.dtype_eq(4, "value_cache", vc, kc.dtype, "the caches share a dtype");
    chk.last_dim_contiguous(4, "value_cache", vc);
    chk.dim_eq(3, "key_cache", kc, 1, k.dim(1), "kv heads (k's)");
    chk.dim_eq(3, "key_cache", kc, 3, k.dim(2), "head dim (k's)");
    for (int ax = 0; ax < 3; ++ax)
      chk.dim_eq(4, "value_cache", vc, ax, kc.dim(ax), "(key_cache's)");
    chk.dim_eq(4, "value_cache", vc, 3, v.dim(2), "head dim (v's)");
    if (param_.apply_rope) {
      const TensorDesc& pos = in[5];
      chk.dtype_in(5, "positions", pos, {DType::kI32, DType::kI64});
      if (pos.numel() != k.dim(0))
        chk.fail(ErrorCode::kShapeMismatch, "input 5 (positions) " + pos.shape_string() +
                                                " must hold one position per token (" +
                                                to_string(k.dim(0)) + ")");
      const int64_t r = param_.rope.rotary_dim ? param_.rope.rotary_dim : k.dim(2);
      chk.param(r > 0 && r % 2 == 0 && r <= k.dim(2),
                "rope rotary_dim " + to_string(r) + " must be even and at most the head dim " +
                    to_string(k.dim(2)));
      chk.param(param_.rope.theta > 0 && param_.rope.scaling_factor > 0,
                "rope theta and scaling must be positive");
    }
    return {TensorDesc::contiguous(kc.dtype, kc.shape()),
            TensorDesc::contiguous(vc.dtype, vc.shape())};
  }

  size_t do_setup(const VariantPack& pack, Context&, const Checker& chk) override {
    if (param_.apply_rope) {  // the frequencies, as the Rope op makes them
      const int64_t d = pack.inputs[0].dim(2);
      inv_freq_ =
          ops::rope_inv_freq(param_.rope, param_.rope.rotary_dim ? param_.rope.rotary_dim : d);
    }
    for (int i = 0; i < 2; ++i)
      if (!same_view(pack.outputs[static_cast<size_t>(i)], pack.inputs[static_cast<size_t>(3 + i)]))
        chk.fail(ErrorCode::kInvalidArgument,
                 "output " + to_string(i) + " (" + output_role(static_cast<size_t>(i)) +
                     ") must be the very same view as input " + to_string(3 + i) +
                     ": the cache is updated in place");
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Checker chk(name());
    const Tensor &k = pack.inputs[0], &v = pack.inputs[1], &kc = pack.outputs[0],
                 &vc = pack.outputs[1];
    const Tensor& sm = pack.inputs[2];
    const int64_t T = k.dim(0), H = k.dim(1), bs = kc.dim(2);
    const int64_t slots = kc.dim(0) * bs;
    const RowView ev = element_view(sm.desc());
    std::vector<int64_t> slot(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = sm.dtype() == DType::kI64 ? sm.data_as<const int64_t>()[ev.offset(t)]
                                                  : sm.data_as<const int32_t>()[ev.offset(t)];
      if (s >= slots)
        chk.fail(ErrorCode::kInvalidArgument,
                 "input 2 (slot_mapping) entry " + to_string(t) + " = " + to_string(s) +
                     " is out of range: the cache has " + to_string(slots) +
                     " slots (num_blocks x block_size); negative slots skip a token");
      slot[static_cast<size_t>(t)] = s;
    }
    // Two tokens for one slot would race (and make no sense): reject them.
    std::vector<int64_t> sorted(slot);
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i] >= 0 && sorted[i] == sorted[i - 1])
        chk.fail(ErrorCode::kInvalidArgument, "input 2 (slot_mapping) names slot " +
                                                  to_string(sorted[i]) +
                                                  " for two tokens; each slot takes one token");
    const int64_t kes = static_cast<int64_t>(dtype_size(k.dtype()));
    const int64_t ces = static_cast<int64_t>(dtype_size(kc.dtype()));
    // Rows are small (one head of one token); threads only pay off for long prompts.
    parallel_for(
        ctx.num_threads(), T * H, 4096 / std::max<int64_t>(1, k.dim(2)), ctx.flush_denormals(),
        [&](int64_t r0, int64_t r1) {
          // The rotation's cos / sin for the token of the rows at hand: rows run token by
          // token (r = t·H + h), so each token's table is made once for all its heads. Made
          // per row (12 heads), the cache write took 14.2 us per layer and token, 7.4 with the
          // table (llama-110m bf16 decode, TBOOST_PROFILE=1).
          std::vector<float> cs;
          int64_t cs_token = -1;
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t t = r / H, h = r % H, s = slot[static_cast<size_t>(t)];
            if (s < 0) continue;
            const int64_t blk = s / bs, off = s % bs;
            char* kdst = static_cast<char*>(kc.data()) +
                         (blk * kc.stride(0) + h * kc.stride(1) + off * kc.stride(2)) * ces;
            const char* ksrc =
                static_cast<const char*>(k.data()) + (t * k.stride(0) + h * k.stride(1)) * kes;
            if (param_.apply_rope) {
              if (cs_token != t) {
                rope_table(position(pack.inputs[5], t), cs);
                cs_token = t;
              }
              rotate_into(kdst, kc.dtype(), ksrc, k.dtype(), k.dim(2), cs.data());
            } else {
              convert(kdst, kc.dtype(), ksrc, k.dtype(), k.dim(2));
            }
            convert(static_cast<char*>(vc.data()) +
                        (blk * vc.stride(0) + h * vc.stride(1) + off * vc.stride(2)) * ces,
                    vc.dtype(),
                    static_cast<const char*>(v.data()) + (t * v.stride(0) + h * v.stride(1)) * kes,
                    v.dtype(), v.dim(2));
          }
        });
  }

 private:
  static double position(const Tensor& pos, int64_t t) {
    const int64_t off = element_view(pos.desc()).offset(t);
    return pos.dtype() == DType::kI64 ? static_cast<double>(pos.data_as<const int64_t>()[off])
                                      : pos.data_as<const int32_t>()[off];
  }

  // cs[2i], cs[2i + 1] = cos, sin of pair i's angle at position p (Rope's formula: p ·
  // inv_freq[i] in f64, reduced mod 2π, then rounded to f32).
  void rope_table(double p, std::vector<float>& cs) const {
    cs.resize(2 * inv_freq_.size());
    for (size_t i = 0; i < inv_freq_.size(); ++i) {
      const double a = std::remainder(p * inv_freq_[i], 2.0 * M_PI);
      cs[2 * i] = static_cast<float>(std::cos(a));
      cs[2 * i + 1] = static_cast<float>(std::sin(a));
    }
  }

  // One head row of k rotated by the table cs (rope_table; f32 products) and converted into
  // the cache row. Scalar: a decode step rotates a few rows.
  void rotate_into(char* dst, DType dt, const char* src, DType st, int64_t d,
                   const float* cs) const {
    float x[1024], y[1024];  // a head row on the stack; longer rows take the heap
    std::vector<float> xb, yb;
    float* xs = x;
    float* ys = y;
    if (d > 1024) {
      xb.resize(static_cast<size_t>(d)), yb.resize(static_cast<size_t>(d));
      xs = xb.data(), ys = yb.data();
    }
    convert(xs, DType::kF32, src, st, d);
    const int64_t half = static_cast<int64_t>(inv_freq_.size());
    const bool interleaved = param_.rope.rotation == ops::RopeRotation::kInterleaved;
    for (int64_t i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
      ys[i0] = xs[i0] * c - xs[i1] * s;
      ys[i1] = xs[i1] * c + xs[i0] * s;
    }
    for (int64_t i = 2 * half; i < d; ++i) ys[i] = xs[i];
    convert(dst, dt, ys, DType::kF32, d);
  }

  std::vector<double> inv_freq_;
};

}  // namespace

std::unique_ptr<Operation> make_self_attention(const ops::AttentionParam& p) {
  return std::make_unique<SelfAttentionOp>(p);
}
std::unique_ptr<Operation> make_paged_attention(const ops::PagedAttentionParam& p) {
  return std::make_unique<PagedAttentionOp>(p);
}
std::unique_ptr<Operation> make_reshape_and_cache(const ops::ReshapeAndCacheParam& p) {
  return std::make_unique<ReshapeAndCacheOp>(p);
}

}  // namespace tboost::ops_internal
