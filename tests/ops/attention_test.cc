// SelfAttention, PagedAttention and ReshapeAndCache (include/tboost/ops/attention.h) against the
// float64 naive attention of kernels::ref::attention, one (sequence, head) at a time: every
// mask kind (causal, sliding windows, ALiBi, additive masks with -inf entries and fully masked
// rows), GQA/MQA ratios, head dims that are not vector multiples, Dv != D, both layouts, cross
// attention with rows that see nothing, packed variable-length batches with empty sequences,
// every dtype, strided views, one and two threads, lengths that are not tile multiples, decode
// shapes and one 8192-token sequence. Both outputs are checked: o element by element against
// sum_j p_ij |v_jd| (the terms of its reduction), lse absolutely, scaled by max(1, |lse|), and
// -inf exactly. Paged caches are scattered over permuted blocks whose unused rows hold NaN (a
// kernel must never read a row past a sequence's context length). ReshapeAndCache updates its
// caches in place, which the poisoning harness cannot express: plain tests check that the
// mapped rows hold the rounded k/v and every other byte is unchanged.
//
// Error messages (tboost::Error; the harness checks each substring verbatim). Per case: what
// is wrong, then the substring the message must contain.
//   SelfAttention (inputs q, k, v, [cu_seqlens_q, cu_seqlens_k], [alibi_slopes], [mask];
//   outputs o, lse):
//     Hq % Hkv != 0:                 "multiple of kv heads"
//     k, v lengths differ:           "input 2 (v) expected dim 1 = 7"
//     v heads differ from k's:       "input 2 (v) expected dim 2 = 2"
//     q, k head dims differ:         "input 1 (k) expected dim -1 = 32"
//     q, k batches differ:           "input 1 (k) expected dim 0 = 2"
//     k bf16, v f32 (q's dtype may differ from k/v's, k and v must agree):
//                                    "input 2 (v) expected dtype bf16"
//     q integer:                     "input 0 (q) expected dtype one of {f32, bf16, f16}"
//     q rank 3 without varlen:       "input 0 (q) expected rank 4"
//     q rank 4 with varlen:          "input 0 (q) expected rank 3"
//     q last dim strided:            "input 0 (q) needs a contiguous last dim"
//     mask (Sq,Sk+1), (Sq+2,Sk), (B+1,1,Sq,Sk), (B,Hq,Sq,Sk):
//                                    "input 3 (mask) expected (5, 7) or (2 or 1, 1, 5, 7)"
//     mask bf16:                     "input 3 (mask) expected dtype f32"
//     custom_mask but no mask:       "expected 4 inputs"
//     slopes for Hq - 1 heads:       "input 3 (alibi_slopes) expected shape [6]"
//     slopes bf16:                   "input 3 (alibi_slopes) expected dtype f32"
//     cu_seqlens_q i64:              "input 3 (cu_seqlens_q) expected dtype i32"
//     cu_seqlens_k of B + 2 entries: "input 4 (cu_seqlens_k) expected dim 0 = 4"
//     cu_seqlens_k 0,7,5,15 (data):
//       "input 4 (cu_seqlens_k) must be non-decreasing (cu_seqlens), but entry 2 = 5 < entry 1 = 7"
//     cu_seqlens_q ends at 11 of 12 tokens (data):
//       "input 3 (cu_seqlens_q) last entry 11 must equal the packed token count 12"
//     cu_seqlens_k starts at 1 (data): "input 4 (cu_seqlens_k) must start at 0, got 1"
//     window_left = -2:              "invalid param: window_left"
//     window_right = -5:             "invalid param: window_right"
//     scale NaN:                     "invalid param: scale"
//     o f32 for bf16 q:              "output 0 (o) expected bf16"
//     lse (B,Sq,Hq), lse bf16:       "output 1 (lse) expected f32[2,6,5]"
//   PagedAttention (inputs q, key_cache, value_cache, context_lens, [block_tables]; outputs
//   o, lse). (data): found in the data, at execute at the latest, before anything is written.
//     block table entry 10 of 10 blocks (data):
//       "input 4 (block_tables) entry [1][2] = 10 is out of range [0, 10)"
//     block table entry -1 (data):
//       "input 4 (block_tables) entry [0][0] = -1 is out of range [0, 10)"
//     context 49 beyond 3 blocks of 16 (data):
//       "input 3 (context_lens) entry 1 = 49 exceeds the cache capacity of 48 tokens"
//     contiguous, context 41 beyond 40 (data):
//       "input 3 (context_lens) entry 1 = 41 exceeds the cache capacity of 40 tokens"
//     context 2 < Sq 3 (data):       "input 3 (context_lens) entry 0 = 2 is less than the 3 new
//                                     tokens of q" (one line)
//     context 0, Sq 1 (data):        "input 3 (context_lens) entry 0 = 0 is less than the 1 new
//                                     tokens of q" (one line)
//     Hq % Hkv != 0:                 "multiple of kv heads"
//     cache head dim != q's:         "input 1 (key_cache) expected dim 3 = 32"
//     value cache blocks != key's:   "input 2 (value_cache) expected dim 0 = 10"
//     value cache dtype != key's:    "input 2 (value_cache) expected dtype f32"
//     caches f16:                    "input 1 (key_cache) expected dtype one of {f32, bf16}"
//     block_tables i64:              "input 4 (block_tables) expected dtype i32"
//     block_tables of B + 1 rows:    "input 4 (block_tables) expected dim 0 = 2"
//     context_lens i64:              "input 3 (context_lens) expected dtype i32"
//     context_lens of B + 1:         "input 3 (context_lens) expected shape [2]"
//     paged without block_tables:    "expected 5 inputs"
//     contiguous with block_tables:  "expected 4 inputs"
//     q rank 3:                      "input 0 (q) expected rank 4"
//     window_left = -2:              "invalid param: window_left"
//     lse (B,Sq,Hq):                 "output 1 (lse) expected f32[2,4,3]"
//   ReshapeAndCache (inputs k, v, slot_mapping, key_cache, value_cache; outputs key_cache,
//   value_cache):
//     outputs not inputs 3, 4:       "output 0 (key_cache) must be the very same view as input 3"
//     slot 320 of 320 (data):        "input 2 (slot_mapping) entry 5 = 320 is out of range"
//     slot 2^40, i64 (data):
//       "input 2 (slot_mapping) entry 3 = 1099511627776 is out of range"
//     k, v token counts differ:      "input 1 (v) expected dim 0 = 7"
//     slot_mapping f32:              "input 2 (slot_mapping) expected dtype one of {i32, i64}"
//     slot_mapping of T + 1:         "input 2 (slot_mapping) expected dim 0 = 7"
//     k heads != cache heads:        "input 3 (key_cache) expected dim 1 = 3"
//     k head dim != cache's:         "input 3 (key_cache) expected dim 3 = 32"
//     caches f16:                    "input 3 (key_cache) expected dtype one of {f32, bf16}"
//     k integer:                     "input 0 (k) expected dtype one of {f32, bf16, f16}"
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using kernels::ref::AttentionMask;
using ops::AttentionParam;
using ops::PagedAttentionParam;
using ops::QkvLayout;
using ops::ReshapeAndCacheParam;

constexpr double kInf = std::numeric_limits<double>::infinity();

Buffer int_buffer(Tensor t) {
  Buffer b;
  b.view = t;
  b.storage = t;
  return b;
}

Tensor int_tensor(DType dt, const std::vector<int64_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(dt, shape);
  for (size_t i = 0; i < v.size(); ++i)
    store_from_f64(t.data(), dt, static_cast<int64_t>(i), static_cast<double>(v[i]));
  return t;
}

std::vector<int64_t> ints_of(const Tensor& t) {
  const Vec v = to_f64(t);
  return std::vector<int64_t>(v.begin(), v.end());
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "." : "") + std::to_string(v[i]);
  return s;
}

const char* layout_name(QkvLayout l) { return l == QkvLayout::kBSND ? "BSND" : "BNSD"; }

// lse is checked absolutely, relative to max(1, |lse|); -inf (no visible key) exactly. An
// infinite reference gets scale 1 so that a finite result cannot hide under an infinite bound.
RefOut lse_ref(const Vec& lse) {
  RefOut r;
  r.value = lse;
  r.scale.resize(lse.size());
  for (size_t i = 0; i < lse.size(); ++i)
    r.scale[i] = std::isfinite(lse[i]) ? std::max(1.0, std::abs(lse[i])) : 1.0;
  return r;
}

// Gives every case a distinct gtest name.
struct CaseList {
  std::vector<CaseSpec> cases;
  std::set<std::string> names;
  void add(std::string name, std::function<OpCase(Rng&)> build) {
    const std::string base = name;
    for (int n = 2; !names.insert(test_name(name)).second; ++n)
      name = base + "_" + std::to_string(n);
    cases.push_back({name, std::move(build)});
  }
};

// ---- SelfAttention ----------------------------------------------------------------------------

enum class MaskKind { kNone, kSqSk, kBatch, kOne };  // (Sq,Sk), (B,1,Sq,Sk), (1,1,Sq,Sk)

struct AttnCfg {
  DType dtype = DType::kF32;
  QkvLayout layout = QkvLayout::kBSND;
  int64_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, D = 64, Dv = 0;  // Dv 0: D
  std::vector<int64_t> q_lens = {}, k_lens = {};  // varlen (packed) when given; B: their count
  bool causal = false;
  int64_t wl = -1, wr = -1;
  bool alibi = false;
  MaskKind mask = MaskKind::kNone;
  float scale = 0.0f;
  bool strided = false;  // q, k, v, mask and the outputs as strided views
  int threads = 1;
};

bool is_varlen(const AttnCfg& c) { return !c.q_lens.empty(); }
int64_t dv_of(const AttnCfg& c) { return c.Dv ? c.Dv : c.D; }
int64_t batch_of(const AttnCfg& c) {
  return is_varlen(c) ? static_cast<int64_t>(c.q_lens.size()) : c.B;
}

std::string cfg_name(const AttnCfg& c) {
  std::string s = std::string(dtype_name(c.dtype)) + "_";
  if (is_varlen(c))
    s += "varlen_q" + join(c.q_lens) + "_k" + join(c.k_lens);
  else
    s += std::string(layout_name(c.layout)) + "_B" + std::to_string(c.B) + "_q" +
         std::to_string(c.Sq) + "k" + std::to_string(c.Sk);
  s += "_h" + std::to_string(c.Hq) + "kv" + std::to_string(c.Hkv) + "_d" + std::to_string(c.D);
  if (c.Dv) s += "v" + std::to_string(c.Dv);
  if (c.causal) s += "_causal";
  if (c.wl >= 0) s += "_wl" + std::to_string(c.wl);
  if (c.wr >= 0) s += "_wr" + std::to_string(c.wr);
  if (c.alibi) s += "_alibi";
  if (c.mask == MaskKind::kSqSk) s += "_mask2d";
  if (c.mask == MaskKind::kBatch) s += "_maskB";
  if (c.mask == MaskKind::kOne) s += "_mask1";
  if (c.scale != 0.0f)
    s += std::string(c.scale < 0.0f ? "_scalem" : "_scale") +
         std::to_string(static_cast<int>(std::abs(c.scale) * 1000));
  if (c.strided) s += "_strided";
  s += "_t" + std::to_string(c.threads);
  return s;
}

// Additive mask: random values, about one -inf in seven, and one fully masked row (of batch
// B-1 for a per-batch mask): that row must give zeros and lse -inf, never NaN.
Buffer make_mask(Rng& rng, const AttnCfg& c) {
  Shape ms;
  if (c.mask == MaskKind::kSqSk) ms = {c.Sq, c.Sk};
  if (c.mask == MaskKind::kBatch) ms = {c.B, 1, c.Sq, c.Sk};
  if (c.mask == MaskKind::kOne) ms = {1, 1, c.Sq, c.Sk};
  Buffer m = random_tensor(rng, DType::kF32, ms, c.strided, -2.0, 1.0);
  const int64_t lead = ms.size() == 4 ? ms[0] : 1;
  const int64_t full_row = c.Sq / 2;
  for (int64_t b = 0; b < lead; ++b)
    for (int64_t i = 0; i < c.Sq; ++i)
      for (int64_t j = 0; j < c.Sk; ++j) {
        const bool hide = rng.integer(0, 6) == 0 || (b == lead - 1 && i == full_row);
        if (!hide) continue;
        if (ms.size() == 4)
          m.view.set({b, 0, i, j}, -kInf);
        else
          m.view.set({i, j}, -kInf);
      }
  return m;
}

OpCase build_attention(const AttnCfg& c, Rng& rng) {
  const bool varlen = is_varlen(c);
  const int64_t Dv = dv_of(c), B = batch_of(c);
  OpCase oc;
  oc.param = AttentionParam{.layout = c.layout,
                            .scale = c.scale,
                            .causal = c.causal,
                            .window_left = c.wl,
                            .window_right = c.wr,
                            .alibi = c.alibi,
                            .custom_mask = c.mask != MaskKind::kNone,
                            .varlen = varlen};
  std::vector<int64_t> cq(1, 0), ck(1, 0);  // sequence starts, then the totals
  if (varlen)
    for (size_t b = 0; b < c.q_lens.size(); ++b) {
      cq.push_back(cq.back() + c.q_lens[b]);
      ck.push_back(ck.back() + c.k_lens[b]);
    }
  Shape qs, ks, vs;
  if (varlen) {
    qs = {cq.back(), c.Hq, c.D};
    ks = {ck.back(), c.Hkv, c.D};
    vs = {ck.back(), c.Hkv, Dv};
  } else if (c.layout == QkvLayout::kBSND) {
    qs = {c.B, c.Sq, c.Hq, c.D};
    ks = {c.B, c.Sk, c.Hkv, c.D};
    vs = {c.B, c.Sk, c.Hkv, Dv};
  } else {
    qs = {c.B, c.Hq, c.Sq, c.D};
    ks = {c.B, c.Hkv, c.Sk, c.D};
    vs = {c.B, c.Hkv, c.Sk, Dv};
  }
  oc.inputs.push_back(random_tensor(rng, c.dtype, qs, c.strided));
  oc.inputs.push_back(random_tensor(rng, c.dtype, ks, c.strided));
  oc.inputs.push_back(random_tensor(rng, c.dtype, vs, c.strided));
  if (varlen) {
    oc.inputs.push_back(int_buffer(int_tensor(DType::kI32, cq, {B + 1})));
    oc.inputs.push_back(int_buffer(int_tensor(DType::kI32, ck, {B + 1})));
  }
  if (c.alibi) oc.inputs.push_back(random_tensor(rng, DType::kF32, {c.Hq}, false, 0.01, 0.3));
  if (c.mask != MaskKind::kNone) oc.inputs.push_back(make_mask(rng, c));
  oc.strided_outputs = c.strided;
  oc.threads = c.threads;
  oc.reference = [c, Dv, B, varlen](const std::vector<Tensor>& in) {
    const Vec q = to_f64(in[0]), k = to_f64(in[1]), v = to_f64(in[2]);
    size_t next = 3;
    std::vector<int64_t> cq, ck;
    if (varlen) {
      cq = ints_of(in[next++]);
      ck = ints_of(in[next++]);
    }
    Vec slopes, mask;
    if (c.alibi) slopes = to_f64(in[next++]);
    if (c.mask != MaskKind::kNone) mask = to_f64(in[next++]);
    const int64_t D = c.D, Hq = c.Hq, Hkv = c.Hkv, group = c.Hq / c.Hkv;
    const int64_t Tq = varlen ? cq.back() : 0;
    // Element offset of row (b, i, head h) of a tensor with H heads and S rows per sequence.
    auto row = [&](int64_t b, int64_t i, int64_t h, int64_t H, int64_t S, int64_t start) {
      if (varlen) return (start + i) * H + h;
      if (c.layout == QkvLayout::kBSND) return (b * S + i) * H + h;
      return (b * H + h) * S + i;
    };
    RefOut o, lse_all;
    o.value.assign(q.size() / static_cast<size_t>(D) * static_cast<size_t>(Dv), 0.0);
    o.scale.assign(o.value.size(), 0.0);
    Vec lse(varlen ? static_cast<size_t>(Hq * Tq) : static_cast<size_t>(B * Hq * c.Sq), 0.0);
    const double scale =
        c.scale != 0.0f ? static_cast<double>(c.scale) : 1.0 / std::sqrt(static_cast<double>(D));
    int64_t max_sk = 1;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t Sq = varlen ? cq[b + 1] - cq[b] : c.Sq;
      const int64_t Sk = varlen ? ck[b + 1] - ck[b] : c.Sk;
      const int64_t q0 = varlen ? cq[b] : 0, k0 = varlen ? ck[b] : 0;
      max_sk = std::max(max_sk, Sk);
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t g = h / group;
        Vec qh(static_cast<size_t>(Sq * D)), kh(static_cast<size_t>(Sk * D)),
            vh(static_cast<size_t>(Sk * Dv));
        for (int64_t i = 0; i < Sq; ++i)
          std::copy_n(q.begin() + row(b, i, h, Hq, c.Sq, q0) * D, D, qh.begin() + i * D);
        for (int64_t j = 0; j < Sk; ++j) {
          std::copy_n(k.begin() + row(b, j, g, Hkv, c.Sk, k0) * D, D, kh.begin() + j * D);
          std::copy_n(v.begin() + row(b, j, g, Hkv, c.Sk, k0) * Dv, Dv, vh.begin() + j * Dv);
        }
        AttentionMask m{.causal = c.causal, .window_left = c.wl, .window_right = c.wr};
        if (c.alibi) m.alibi_slope = slopes[static_cast<size_t>(h)];
        if (c.mask != MaskKind::kNone)
          m.mask = mask.data() + (c.mask == MaskKind::kBatch ? b * Sq * Sk : 0);
        RefOut oh;
        Vec lh;
        kernels::ref::attention(&oh, &lh, qh, kh, vh, Sq, Sk, D, Dv, scale, m);
        for (int64_t i = 0; i < Sq; ++i) {
          const int64_t r = row(b, i, h, Hq, c.Sq, q0) * Dv;
          std::copy_n(oh.value.begin() + i * Dv, Dv, o.value.begin() + r);
          std::copy_n(oh.scale.begin() + i * Dv, Dv, o.scale.begin() + r);
          const int64_t li = varlen ? h * Tq + q0 + i : (b * Hq + h) * c.Sq + i;
          lse[static_cast<size_t>(li)] = lh[static_cast<size_t>(i)];
        }
      }
    }
    // o: every term p_ij v_jd carries the relative error of its score and of p (f32 scores;
    // p may be rounded to the dtype for the P·V product), so the dtype's tolerance for a
    // reduction of Sk terms bounds it against sum_j p_ij |v_jd|. lse: the same score errors,
    // absolute, relative to max(1, |lse|).
    const double tol = tolerance(c.dtype, max_sk);
    return std::vector<Expected>{{o, tol}, {lse_ref(lse), tol}};
  };
  return oc;
}

std::vector<CaseSpec> self_attention_cases() {
  CaseList list;
  auto add = [&](const AttnCfg& c) {
    list.add(cfg_name(c), [c](Rng& rng) { return build_attention(c, rng); });
  };
  using L = QkvLayout;
  const DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16;
  // clang-format off
  for (DType dt : {f32, bf16, f16}) {
    // Plain, GQA 2, odd length (not a tile multiple).
    add({.dtype = dt, .B = 2, .Sq = 37, .Sk = 37, .Hq = 4, .Hkv = 2, .D = 64, .threads = 2});
    // BNSD causal MQA, D = 40, strided in and out.
    add({.dtype = dt, .layout = L::kBNSD, .Sq = 77, .Sk = 77, .Hq = 2, .Hkv = 1, .D = 40,
         .causal = true, .strided = true});
    // Packed batch with a length-1 and an empty sequence.
    add({.dtype = dt, .Hq = 4, .Hkv = 1, .D = 80, .q_lens = {5, 1, 0, 70},
         .k_lens = {5, 1, 0, 70}, .causal = true, .threads = 2});
    // Cross attention with a per-batch additive mask (with -inf entries and a dead row).
    add({.dtype = dt, .B = 2, .Sq = 19, .Sk = 50, .Hq = 2, .Hkv = 2, .D = 72,
         .mask = MaskKind::kBatch, .threads = 2});
    // Sliding window over more than one key tile.
    add({.dtype = dt, .layout = L::kBNSD, .Sq = 130, .Sk = 130, .Hq = 2, .Hkv = 2, .D = 96,
         .causal = true, .wl = 20, .threads = 2});
  }
  // Windows: left with causal, left and right, right only (0: the diagonal is the last key),
  // left only (0: the diagonal is the first key).
  add({.Sq = 100, .Sk = 100, .Hq = 4, .Hkv = 4, .D = 32, .causal = true, .wl = 16});
  add({.layout = L::kBNSD, .B = 2, .Sq = 60, .Sk = 60, .Hq = 2, .Hkv = 1, .D = 96, .wl = 5,
       .wr = 7, .threads = 2});
  add({.Sq = 20, .Sk = 45, .Hq = 2, .Hkv = 2, .D = 48, .wr = 0});
  add({.Sq = 70, .Sk = 70, .Hq = 3, .Hkv = 3, .D = 64, .wl = 0, .threads = 2});
  add({.dtype = bf16, .Sq = 90, .Sk = 300, .Hq = 2, .Hkv = 1, .D = 64, .wl = 40, .wr = 3,
       .strided = true, .threads = 2});
  // ALiBi: causal, non-causal cross (bias on both sides of the diagonal), with a window.
  add({.B = 2, .Sq = 70, .Sk = 70, .Hq = 4, .Hkv = 2, .D = 64, .causal = true, .alibi = true,
       .threads = 2});
  add({.dtype = bf16, .layout = L::kBNSD, .Sq = 33, .Sk = 65, .Hq = 4, .Hkv = 1, .D = 128,
       .alibi = true});
  add({.Hq = 2, .Hkv = 2, .D = 32, .q_lens = {7, 30}, .k_lens = {7, 30}, .causal = true,
       .wl = 9, .alibi = true, .threads = 2});
  // Additive masks: (Sq, Sk) strided, (1, 1, Sq, Sk) with causal and ALiBi, (B, 1, Sq, Sk)
  // strided bf16, f16.
  add({.layout = L::kBNSD, .B = 2, .Sq = 17, .Sk = 130, .Hq = 2, .Hkv = 1, .D = 40,
       .mask = MaskKind::kSqSk, .strided = true});
  add({.B = 2, .Sq = 29, .Sk = 29, .Hq = 4, .Hkv = 2, .D = 32, .causal = true, .alibi = true,
       .mask = MaskKind::kOne, .threads = 2});
  add({.dtype = bf16, .B = 3, .Sq = 9, .Sk = 70, .Hq = 2, .Hkv = 1, .D = 64,
       .mask = MaskKind::kBatch, .strided = true, .threads = 2});
  add({.dtype = f16, .layout = L::kBNSD, .Sq = 40, .Sk = 40, .Hq = 2, .Hkv = 2, .D = 48,
       .causal = true, .mask = MaskKind::kSqSk});
  // GQA ratios 1, 2, 4 and MQA.
  for (int64_t hkv : {8, 4, 2, 1})
    add({.Sq = 49, .Sk = 49, .Hq = 8, .Hkv = hkv, .D = 128, .causal = true,
         .threads = hkv % 4 == 0 ? 1 : 2});
  add({.dtype = bf16, .layout = L::kBNSD, .B = 2, .Sq = 21, .Sk = 21, .Hq = 8, .Hkv = 2,
       .D = 64, .threads = 2});
  // Head dims, vector multiples or not.
  for (int64_t d : {5, 32, 33, 72, 80, 96, 128, 256})
    add({.Sq = 41, .Sk = 41, .Hq = 2, .Hkv = 1, .D = d, .causal = d % 2 == 0,
         .threads = d % 3 == 0 ? 1 : 2});
  add({.dtype = bf16, .Sq = 40, .Sk = 40, .Hq = 2, .Hkv = 2, .D = 256, .causal = true,
       .threads = 2});
  add({.dtype = f16, .layout = L::kBNSD, .Sq = 25, .Sk = 25, .Hq = 2, .Hkv = 1, .D = 72,
       .strided = true});
  // Dv != D.
  add({.B = 2, .Sq = 31, .Sk = 31, .Hq = 4, .Hkv = 2, .D = 64, .Dv = 40, .causal = true,
       .threads = 2});
  add({.dtype = bf16, .layout = L::kBNSD, .Sq = 24, .Sk = 70, .Hq = 2, .Hkv = 1, .D = 33,
       .Dv = 96});
  // Non-default scales.
  add({.Sq = 50, .Sk = 50, .Hq = 2, .Hkv = 2, .D = 64, .causal = true, .scale = 0.3f});
  add({.dtype = bf16, .Sq = 50, .Sk = 50, .Hq = 2, .Hkv = 1, .D = 32, .scale = 0.75f,
       .threads = 2});
  add({.dtype = bf16, .Sq = 70, .Sk = 70, .Hq = 2, .Hkv = 2, .D = 64, .causal = true,
       .scale = -12.0f});  // a negative scale, large enough that a max taken as if
                            // it were positive would overflow 2^x
  // Cross attention. Sq > Sk with causal: the first Sq - Sk queries see no key.
  add({.B = 2, .Sq = 50, .Sk = 20, .Hq = 2, .Hkv = 1, .D = 64, .causal = true, .threads = 2});
  add({.dtype = bf16, .layout = L::kBNSD, .Sq = 40, .Sk = 16, .Hq = 4, .Hkv = 2, .D = 40,
       .causal = true, .strided = true});
  add({.Sq = 30, .Sk = 12, .Hq = 2, .Hkv = 2, .D = 32, .causal = true, .wl = 4});
  add({.Sq = 50, .Sk = 20, .Hq = 2, .Hkv = 1, .D = 64});
  add({.layout = L::kBNSD, .Sq = 20, .Sk = 130, .Hq = 2, .Hkv = 2, .D = 64, .causal = true,
       .threads = 2});
  // Packed batches: chunked prefill (q shorter than k), a sequence with queries but no keys,
  // strided bf16 non-causal, f16 with a window.
  add({.Hq = 4, .Hkv = 2, .D = 64, .q_lens = {3, 1, 0, 20, 2}, .k_lens = {40, 1, 0, 20, 0},
       .causal = true, .threads = 2});
  add({.dtype = bf16, .Hq = 2, .Hkv = 2, .D = 96, .q_lens = {1, 17, 64}, .k_lens = {1, 17, 64},
       .strided = true});
  add({.dtype = f16, .Hq = 2, .Hkv = 1, .D = 40, .q_lens = {33, 1}, .k_lens = {100, 1},
       .causal = true, .wl = 10, .threads = 2});
  // Tile edges: exact tile multiples, one past, a single token.
  add({.Sq = 16, .Sk = 64, .Hq = 2, .Hkv = 1, .D = 64});
  add({.Sq = 48, .Sk = 512, .Hq = 2, .Hkv = 1, .D = 64, .causal = true, .threads = 2});
  add({.Sq = 49, .Sk = 513, .Hq = 2, .Hkv = 1, .D = 64, .causal = true});
  add({.Sq = 1, .Sk = 1, .Hq = 2, .Hkv = 1, .D = 64, .causal = true});
  add({.layout = L::kBNSD, .B = 3, .Sq = 1, .Sk = 1, .Hq = 1, .Hkv = 1, .D = 32, .threads = 2});
  // Decode shapes: a few queries against a long context.
  add({.dtype = bf16, .B = 2, .Sq = 1, .Sk = 3001, .Hq = 8, .Hkv = 2, .D = 64, .threads = 2});
  add({.layout = L::kBNSD, .Sq = 4, .Sk = 3100, .Hq = 4, .Hkv = 1, .D = 128, .causal = true,
       .threads = 2});
  add({.dtype = f16, .Sq = 2, .Sk = 3333, .Hq = 2, .Hkv = 2, .D = 80, .causal = true,
       .strided = true});
  // Few query rows per kv head (up to 8 query tokens take the split-KV decode path in the CPU
  // kernel): every mask kind there too, chunk-sized and odd key counts, rows with no key.
  add({.B = 2, .Sq = 2, .Sk = 700, .Hq = 4, .Hkv = 2, .D = 64, .causal = true, .alibi = true,
       .threads = 2});
  add({.dtype = bf16, .layout = L::kBNSD, .B = 2, .Sq = 3, .Sk = 300, .Hq = 2, .Hkv = 1,
       .D = 72, .mask = MaskKind::kBatch, .threads = 2});
  add({.Sq = 4, .Sk = 2, .Hq = 2, .Hkv = 1, .D = 32, .causal = true});
  add({.Sq = 8, .Sk = 600, .Hq = 1, .Hkv = 1, .D = 40, .causal = true, .wl = 100,
       .strided = true, .threads = 2});
  add({.dtype = f16, .Sq = 1, .Sk = 1000, .Hq = 8, .Hkv = 1, .D = 128, .wl = 300, .threads = 2});
  add({.Sq = 2, .Sk = 257, .Hq = 2, .Hkv = 1, .D = 33, .Dv = 17, .wr = 0, .alibi = true});
  add({.layout = L::kBNSD, .Sq = 1, .Sk = 512, .Hq = 2, .Hkv = 2, .D = 64,
       .mask = MaskKind::kSqSk, .scale = 0.4f, .threads = 2});
  // No query token in any sequence (a varlen batch's maximum query length is then 0): the
  // decode path sized its multi-head tasks by dividing by the row count and raised SIGFPE.
  add({.dtype = bf16, .Hq = 2, .Hkv = 1, .D = 16, .q_lens = {0, 0}, .k_lens = {0, 5}});
  add({.Hq = 4, .Hkv = 2, .D = 8, .q_lens = {0}, .k_lens = {3}, .causal = true});
  add({.Hq = 4, .Hkv = 1, .D = 64, .q_lens = {1, 1, 0, 1}, .k_lens = {1, 513, 0, 256},
       .causal = true, .threads = 2});
  add({.dtype = bf16, .Hq = 2, .Hkv = 2, .D = 96, .q_lens = {1, 2}, .k_lens = {0, 300},
       .causal = true, .alibi = true});
  // More query rows per kv head than a decode task takes (8): the rows go in groups, each a
  // task of its own (MQA with 32 q heads; 3 tokens of GQA-4, groups of 8 and 4; a varlen batch
  // whose sequences have 1, 2 or 3 groups). Group sizes the dots pad (3 -> 4, 5-7 -> 8 rows on
  // AVX-512): GQA-7 as in Qwen2-0.5B (14 q / 2 kv heads), GQA-3, GQA-5 with a mask.
  add({.Sq = 1, .Sk = 1500, .Hq = 32, .Hkv = 1, .D = 64, .causal = true, .threads = 2});
  add({.dtype = bf16, .Sq = 1, .Sk = 1030, .Hq = 16, .Hkv = 1, .D = 128, .alibi = true});
  add({.dtype = bf16, .Sq = 3, .Sk = 900, .Hq = 8, .Hkv = 2, .D = 128, .causal = true,
       .threads = 2});
  add({.Hq = 8, .Hkv = 1, .D = 64, .q_lens = {1, 3, 2}, .k_lens = {600, 40, 2}, .causal = true,
       .threads = 2});
  add({.dtype = bf16, .Sq = 1, .Sk = 1100, .Hq = 14, .Hkv = 2, .D = 64, .threads = 2});
  // 5-8 bf16 rows at head dims up to 64 in row octets (DotSpansBf16RowOctets; the last n % 8 keys
  // of a span two and one at a time): GQA-6 at head dim 48 (an odd multiple of 16) with a span of
  // 5 keys alone and one of 37 blocks and 5 keys, 2 causal tokens of GQA-4 at 32.
  add({.dtype = bf16, .Sq = 1, .Sk = 517, .Hq = 12, .Hkv = 2, .D = 48, .threads = 2});
  add({.dtype = bf16, .Sq = 2, .Sk = 301, .Hq = 8, .Hkv = 2, .D = 32, .causal = true});
  add({.dtype = bf16, .Sq = 1, .Sk = 301, .Hq = 6, .Hkv = 1, .D = 48, .threads = 2});
  // bf16 with 20 q heads per kv head in a varlen batch of 1 and 2 tokens, ALiBi: 20 and 40
  // rows, in groups of 16 where decode runs on AMX (16 + 4, 16 + 16 + 8), else of 8.
  add({.dtype = bf16, .Hq = 20, .Hkv = 1, .D = 64, .q_lens = {1, 2}, .k_lens = {333, 50},
       .causal = true, .alibi = true, .threads = 2});
  // bf16 with 24 rows per kv head (2 tokens x 12 heads) and a custom mask: rows in lanes on
  // AVX512_BF16 without AMX (two lane groups, 8 lanes unused), the mask applied per row.
  add({.dtype = bf16, .Sq = 2, .Sk = 1300, .Hq = 12, .Hkv = 1, .D = 64, .mask = MaskKind::kSqSk,
       .threads = 2});
  // 9-16 query tokens take the decode path on AVX-512 without AMX prefill (flash tiles
  // elsewhere): 12 causal tokens of GQA-4 (48 rows: 32 + 16 in lanes), 16 tokens of MHA in f32
  // with a window, 9 tokens of MQA-8 in f16 (row-by-row kernels, 9 groups of 8).
  add({.dtype = bf16, .Sq = 12, .Sk = 2100, .Hq = 8, .Hkv = 2, .D = 64, .causal = true,
       .threads = 2});
  add({.Sq = 16, .Sk = 1300, .Hq = 2, .Hkv = 2, .D = 96, .causal = true, .wl = 700,
       .threads = 2});
  add({.dtype = f16, .Sq = 9, .Sk = 600, .Hq = 8, .Hkv = 1, .D = 64, .causal = true});
  // Up to 32 tokens there for a bf16 model: 24 causal tokens of GQA-4 (96 rows, 3 groups).
  add({.dtype = bf16, .Sq = 24, .Sk = 1500, .Hq = 8, .Hkv = 2, .D = 64, .causal = true,
       .threads = 2});
  // f32 with 20 rows per kv head over several chunks (their merge), ALiBi: rows in lanes on
  // AVX-512, Oᵀ kept per task; a custom mask with 2 tokens x 9 heads.
  add({.Sq = 1, .Sk = 2500, .Hq = 20, .Hkv = 1, .D = 128, .alibi = true, .threads = 2});
  add({.Sq = 2, .Sk = 900, .Hq = 9, .Hkv = 1, .D = 48, .mask = MaskKind::kSqSk, .threads = 2});
  add({.Sq = 1, .Sk = 700, .Hq = 14, .Hkv = 2, .D = 64, .alibi = true});
  add({.dtype = bf16, .B = 2, .Sq = 1, .Sk = 600, .Hq = 6, .Hkv = 2, .D = 128, .threads = 2});
  add({.dtype = f16, .Sq = 1, .Sk = 530, .Hq = 10, .Hkv = 2, .D = 96, .mask = MaskKind::kSqSk,
       .threads = 2});
  // The P·V's register tiles for 5+ rows on AVX-512 (4 rows x 4 vectors, then what is left):
  // GQA-6 is 4 + 2 rows, Dv = 112 is 4 + 3 vectors.
  add({.Sq = 1, .Sk = 777, .Hq = 12, .Hkv = 2, .D = 112, .causal = true, .wl = 500,
       .threads = 2});
  // Long: many query and key tiles per thread; the f64 reference costs O(Sq * Sk * D).
  add({.Sq = 8192, .Sk = 8192, .Hq = 1, .Hkv = 1, .D = 32, .causal = true, .threads = 2});
  add({.dtype = bf16, .layout = L::kBNSD, .Sq = 1100, .Sk = 1100, .Hq = 2, .Hkv = 1, .D = 64,
       .threads = 2});
  // clang-format on
  // Random configurations, drawn from the case's seed (a failure prints the seed and the output
  // shapes; TBOOST_TEST_SEED reproduces it): any head dim, any mix of masks.
  for (int n = 0; n < 12; ++n) {
    const DType dt = n % 3 == 0 ? f32 : n % 3 == 1 ? bf16 : f16;
    list.add("random_" + std::string(dtype_name(dt)) + "_" + std::to_string(n), [dt](Rng& rng) {
      AttnCfg c;
      c.dtype = dt;
      c.layout = rng.integer(0, 1) ? L::kBSND : L::kBNSD;
      c.Hkv = rng.integer(1, 3);
      c.Hq = c.Hkv * (int64_t{1} << rng.integer(0, 2));
      c.D = rng.integer(1, 160);
      if (rng.integer(0, 3) == 0) c.Dv = rng.integer(1, 160);
      c.causal = rng.integer(0, 1);
      if (rng.integer(0, 2) == 0) c.wl = rng.integer(0, 40);
      if (rng.integer(0, 3) == 0) c.wr = rng.integer(0, 40);
      c.alibi = rng.integer(0, 3) == 0;
      if (rng.integer(0, 2) == 0) c.scale = static_cast<float>(rng.uniform(0.05, 0.5));
      c.strided = rng.integer(0, 1);
      c.threads = static_cast<int>(rng.integer(1, 2));
      if (rng.integer(0, 2) == 0) {
        for (int64_t b = rng.integer(1, 4); b > 0; --b) {
          c.k_lens.push_back(rng.integer(0, 200));
          c.q_lens.push_back(rng.integer(0, 2) ? c.k_lens.back() : rng.integer(0, 60));
        }
      } else {
        c.B = rng.integer(1, 3);
        c.Sk = rng.integer(1, 300);
        c.Sq = rng.integer(0, 1) ? c.Sk : rng.integer(1, 150);
        const int64_t m = rng.integer(0, 5);
        c.mask = m == 1 ? MaskKind::kSqSk : m == 2 ? MaskKind::kBatch : MaskKind::kNone;
      }
      return build_attention(c, rng);
    });
  }
  return list.cases;
}

// Valid base: q (2,5,6,32) kBSND, k and v (2,7,2,32); o (2,5,6,32), lse (2,6,5).
BadCase attn_bad_base(Rng& rng, AttentionParam p = {}, DType dt = DType::kF32) {
  BadCase b;
  b.param = p;
  b.inputs.push_back(random_tensor(rng, dt, {2, 5, 6, 32}, false));
  b.inputs.push_back(random_tensor(rng, dt, {2, 7, 2, 32}, false));
  b.inputs.push_back(random_tensor(rng, dt, {2, 7, 2, 32}, false));
  if (p.alibi) b.inputs.push_back(random_tensor(rng, DType::kF32, {6}, false, 0.01, 0.3));
  if (p.custom_mask) b.inputs.push_back(random_tensor(rng, DType::kF32, {5, 7}, false));
  b.outputs.push_back(TensorDesc::contiguous(dt, {2, 5, 6, 32}));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {2, 6, 5}));
  return b;
}

// Valid packed base: 3 sequences, q (12,6,32), k and v (15,2,32); o (12,6,32), lse (6,12).
BadCase varlen_bad_base(Rng& rng, std::vector<int64_t> cq = {0, 5, 5, 12},
                        std::vector<int64_t> ck = {0, 7, 8, 15}) {
  BadCase b;
  b.param = AttentionParam{.causal = true, .varlen = true};
  b.inputs.push_back(random_tensor(rng, DType::kF32, {12, 6, 32}, false));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {15, 2, 32}, false));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {15, 2, 32}, false));
  b.inputs.push_back(int_buffer(int_tensor(DType::kI32, cq, {static_cast<int64_t>(cq.size())})));
  b.inputs.push_back(int_buffer(int_tensor(DType::kI32, ck, {static_cast<int64_t>(ck.size())})));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {12, 6, 32}));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {6, 12}));
  return b;
}

std::vector<BadSpec> self_attention_bad() {
  return {
      {"heads_not_multiple_of_kv_heads",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {2, 7, 4, 32}, false);
         b.inputs[2] = random_tensor(rng, DType::kF32, {2, 7, 4, 32}, false);
         b.expect_substring = "multiple of kv heads";
         return b;
       }},
      {"k_v_lengths_differ",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[2] = random_tensor(rng, DType::kF32, {2, 6, 2, 32}, false);
         b.expect_substring = "input 2 (v) expected dim 1 = 7";
         return b;
       }},
      {"k_v_heads_differ",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[2] = random_tensor(rng, DType::kF32, {2, 7, 1, 32}, false);
         b.expect_substring = "input 2 (v) expected dim 2 = 2";
         return b;
       }},
      {"q_k_head_dims_differ",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {2, 7, 2, 40}, false);
         b.expect_substring = "input 1 (k) expected dim -1 = 32";
         return b;
       }},
      {"q_k_batches_differ",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {3, 7, 2, 32}, false);
         b.inputs[2] = random_tensor(rng, DType::kF32, {3, 7, 2, 32}, false);
         b.expect_substring = "input 1 (k) expected dim 0 = 2";
         return b;
       }},
      {"k_dtype_differs",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kBF16, {2, 7, 2, 32}, false);
         b.expect_substring = "input 2 (v) expected dtype bf16";
         return b;
       }},
      {"q_integer",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[0] = int_buffer(random_ints(rng, DType::kI32, {2, 5, 6, 32}, 1, 5));
         b.expect_substring = "input 0 (q) expected dtype one of {f32, bf16, f16}";
         return b;
       }},
      {"q_rank3_without_varlen",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {10, 6, 32}, false);
         b.inputs[1] = random_tensor(rng, DType::kF32, {14, 2, 32}, false);
         b.inputs[2] = random_tensor(rng, DType::kF32, {14, 2, 32}, false);
         b.outputs = {TensorDesc::contiguous(DType::kF32, {10, 6, 32}),
                      TensorDesc::contiguous(DType::kF32, {6, 10})};
         b.expect_substring = "input 0 (q) expected rank 4";
         return b;
       }},
      {"q_last_dim_strided",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {2, 5, 32, 6}, false);
         b.inputs[0].view = b.inputs[0].view.transpose(2, 3);
         b.expect_substring = "input 0 (q) needs a contiguous last dim";
         return b;
       }},
      {"mask_wrong_key_count",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.custom_mask = true});
         b.inputs[3] = random_tensor(rng, DType::kF32, {5, 8}, false);
         b.expect_substring = "input 3 (mask) expected (5, 7) or (2 or 1, 1, 5, 7)";
         return b;
       }},
      {"mask_wrong_query_count",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.custom_mask = true});
         b.inputs[3] = random_tensor(rng, DType::kF32, {7, 7}, false);
         b.expect_substring = "input 3 (mask) expected (5, 7) or (2 or 1, 1, 5, 7)";
         return b;
       }},
      {"mask_wrong_batch",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.custom_mask = true});
         b.inputs[3] = random_tensor(rng, DType::kF32, {3, 1, 5, 7}, false);
         b.expect_substring = "input 3 (mask) expected (5, 7) or (2 or 1, 1, 5, 7)";
         return b;
       }},
      {"mask_per_head",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.custom_mask = true});
         b.inputs[3] = random_tensor(rng, DType::kF32, {2, 6, 5, 7}, false);
         b.expect_substring = "input 3 (mask) expected (5, 7) or (2 or 1, 1, 5, 7)";
         return b;
       }},
      {"mask_dtype",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.custom_mask = true});
         b.inputs[3] = random_tensor(rng, DType::kBF16, {5, 7}, false);
         b.expect_substring = "input 3 (mask) expected dtype f32";
         return b;
       }},
      {"mask_missing",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.param = AttentionParam{.custom_mask = true};
         b.expect_substring = "expected 4 inputs";
         return b;
       }},
      {"alibi_slopes_count",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.alibi = true});
         b.inputs[3] = random_tensor(rng, DType::kF32, {5}, false, 0.01, 0.3);
         b.expect_substring = "input 3 (alibi_slopes) expected shape [6]";
         return b;
       }},
      {"alibi_slopes_dtype",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.alibi = true});
         b.inputs[3] = random_tensor(rng, DType::kBF16, {6}, false, 0.01, 0.3);
         b.expect_substring = "input 3 (alibi_slopes) expected dtype f32";
         return b;
       }},
      {"cu_seqlens_dtype",
       [](Rng& rng) {
         BadCase b = varlen_bad_base(rng);
         b.inputs[3] = int_buffer(int_tensor(DType::kI64, {0, 5, 5, 12}, {4}));
         b.expect_substring = "input 3 (cu_seqlens_q) expected dtype i32";
         return b;
       }},
      {"cu_seqlens_k_length",
       [](Rng& rng) {
         BadCase b = varlen_bad_base(rng, {0, 5, 5, 12}, {0, 7, 8, 10, 15});
         b.expect_substring = "input 4 (cu_seqlens_k) expected dim 0 = 4";
         return b;
       }},
      {"cu_seqlens_not_monotonic",
       [](Rng& rng) {
         BadCase b = varlen_bad_base(rng, {0, 5, 5, 12}, {0, 7, 5, 15});
         b.error_at_execute_only = true;
         b.expect_substring =
             "input 4 (cu_seqlens_k) must be non-decreasing (cu_seqlens), but entry 2 = 5 < entry "
             "1 = 7";
         return b;
       }},
      {"cu_seqlens_last_not_total",
       [](Rng& rng) {
         BadCase b = varlen_bad_base(rng, {0, 5, 5, 11});
         b.error_at_execute_only = true;
         b.expect_substring =
             "input 3 (cu_seqlens_q) last entry 11 must equal the packed token count 12";
         return b;
       }},
      {"cu_seqlens_first_not_zero",
       [](Rng& rng) {
         BadCase b = varlen_bad_base(rng, {0, 5, 5, 12}, {1, 7, 8, 15});
         b.error_at_execute_only = true;
         b.expect_substring = "input 4 (cu_seqlens_k) must start at 0, got 1";
         return b;
       }},
      {"varlen_q_rank4",
       [](Rng& rng) {
         BadCase b = varlen_bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {1, 12, 6, 32}, false);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {1, 12, 6, 32});
         b.expect_substring = "input 0 (q) expected rank 3";
         return b;
       }},
      {"window_left_invalid",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.causal = true, .window_left = -2});
         b.expect_substring = "invalid param: window_left";
         return b;
       }},
      {"window_right_invalid",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.window_right = -5});
         b.expect_substring = "invalid param: window_right";
         return b;
       }},
      {"scale_nan",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {.scale = std::numeric_limits<float>::quiet_NaN()});
         b.expect_substring = "invalid param: scale";
         return b;
       }},
      {"o_dtype_not_q_dtype",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {}, DType::kBF16);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {2, 5, 6, 32});
         b.expect_substring = "output 0 (o) expected bf16";
         return b;
       }},
      {"lse_shape_bsnd",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng);
         b.outputs[1] = TensorDesc::contiguous(DType::kF32, {2, 5, 6});
         b.expect_substring = "output 1 (lse) expected f32[2,6,5]";
         return b;
       }},
      {"lse_dtype",
       [](Rng& rng) {
         BadCase b = attn_bad_base(rng, {}, DType::kBF16);
         b.outputs[1] = TensorDesc::contiguous(DType::kBF16, {2, 6, 5});
         b.expect_substring = "output 1 (lse) expected f32[2,6,5]";
         return b;
       }},
  };
}

TBOOST_OP_TESTS(SelfAttention, self_attention_cases, self_attention_bad);

// ---- Paged caches -----------------------------------------------------------------------------

// A cache pair and the map from (sequence, token) to (block, row).
struct CacheLayout {
  int64_t num_blocks = 0, block_size = 0, max_blocks = 0;
  std::vector<std::vector<int64_t>> table;  // [b][i]: block of tokens i*bs .. (paged)
  bool paged = true;
  int64_t block(int64_t b, int64_t t) const {
    return paged ? table[static_cast<size_t>(b)][static_cast<size_t>(t / block_size)] : b;
  }
  int64_t row(int64_t t) const { return t % block_size; }
};

// Paged: each sequence gets ceil(ctx / bs) blocks drawn from a random permutation of
// num_blocks = needed + spare blocks, and one more table column holding some valid block (it
// must not be read). Contiguous: block b of size capacity.
CacheLayout make_layout(Rng& rng, const std::vector<int64_t>& ctx, int64_t block_size, bool paged,
                        int64_t spare = 5) {
  CacheLayout L;
  L.paged = paged;
  L.block_size = block_size;
  const int64_t B = static_cast<int64_t>(ctx.size());
  if (!paged) {
    L.num_blocks = B;
    return L;
  }
  int64_t needed = 0, widest = 0;
  for (int64_t n : ctx) {
    needed += (n + block_size - 1) / block_size;
    widest = std::max(widest, (n + block_size - 1) / block_size);
  }
  L.num_blocks = needed + spare;
  L.max_blocks = widest + 1;
  std::vector<int64_t> perm(static_cast<size_t>(L.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i)
    std::swap(perm[i - 1], perm[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(i) - 1))]);
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> row(static_cast<size_t>(L.max_blocks));
    const int64_t nb = (ctx[static_cast<size_t>(b)] + block_size - 1) / block_size;
    for (int64_t i = 0; i < L.max_blocks; ++i)
      row[static_cast<size_t>(i)] = i < nb ? perm[next++] : rng.integer(0, L.num_blocks - 1);
    L.table.push_back(row);
  }
  return L;
}

Tensor block_tables_tensor(const CacheLayout& L) {
  std::vector<int64_t> flat;
  for (const auto& r : L.table) flat.insert(flat.end(), r.begin(), r.end());
  return int_tensor(DType::kI32, flat, {static_cast<int64_t>(L.table.size()), L.max_blocks});
}

// Every cache row that holds no valid token becomes NaN: reading it would show.
void poison_unused_rows(Tensor& cache, const CacheLayout& L, const std::vector<int64_t>& ctx) {
  const int64_t NB = cache.dim(0), H = cache.dim(1), bs = cache.dim(2), D = cache.dim(3);
  std::vector<char> used(static_cast<size_t>(NB * bs), 0);
  for (size_t b = 0; b < ctx.size(); ++b)
    for (int64_t t = 0; t < ctx[b]; ++t)
      used[static_cast<size_t>(L.block(static_cast<int64_t>(b), t) * bs + L.row(t))] = 1;
  for (int64_t blk = 0; blk < NB; ++blk)
    for (int64_t r = 0; r < bs; ++r)
      if (!used[static_cast<size_t>(blk * bs + r)])
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) cache.set({blk, h, r, d}, std::nan(""));
}

// ---- PagedAttention ---------------------------------------------------------------------------

struct PagedCfg {
  DType q_dtype = DType::kF32, cache_dtype = DType::kF32;
  std::vector<int64_t> ctx = {};
  int64_t Sq = 1, Hq = 4, Hkv = 2, D = 64, Dv = 0;
  int64_t block_size = 16;  // contiguous: the capacity
  bool paged = true;
  int64_t wl = -1;
  float scale = 0.0f;
  bool strided = false;        // q and the outputs
  bool strided_cache = false;  // caches as strided views
  int threads = 1;
};

std::string cfg_name(const PagedCfg& c) {
  std::string s = std::string(c.paged ? "paged" : "contiguous") + "_q" + dtype_name(c.q_dtype) +
                  "_cache" + dtype_name(c.cache_dtype) + "_ctx" + join(c.ctx) + "_sq" +
                  std::to_string(c.Sq) + "_h" + std::to_string(c.Hq) + "kv" +
                  std::to_string(c.Hkv) + "_d" + std::to_string(c.D);
  if (c.Dv) s += "v" + std::to_string(c.Dv);
  s += (c.paged ? "_bs" : "_cap") + std::to_string(c.block_size);
  if (c.wl >= 0) s += "_wl" + std::to_string(c.wl);
  if (c.scale != 0.0f)
    s += std::string(c.scale < 0.0f ? "_scalem" : "_scale") +
         std::to_string(static_cast<int>(std::abs(c.scale) * 1000));
  if (c.strided) s += "_strided";
  if (c.strided_cache) s += "_stridedcache";
  s += "_t" + std::to_string(c.threads);
  return s;
}

OpCase build_paged(const PagedCfg& c, Rng& rng) {
  const int64_t B = static_cast<int64_t>(c.ctx.size()), Dv = c.Dv ? c.Dv : c.D;
  OpCase oc;
  oc.param = PagedAttentionParam{.scale = c.scale, .paged = c.paged, .window_left = c.wl};
  const CacheLayout L = make_layout(rng, c.ctx, c.block_size, c.paged);
  Buffer kc =
      random_tensor(rng, c.cache_dtype, {L.num_blocks, c.Hkv, c.block_size, c.D}, c.strided_cache);
  Buffer vc =
      random_tensor(rng, c.cache_dtype, {L.num_blocks, c.Hkv, c.block_size, Dv}, c.strided_cache);
  poison_unused_rows(kc.view, L, c.ctx);
  poison_unused_rows(vc.view, L, c.ctx);
  oc.inputs.push_back(random_tensor(rng, c.q_dtype, {B, c.Sq, c.Hq, c.D}, c.strided));
  oc.inputs.push_back(kc);
  oc.inputs.push_back(vc);
  oc.inputs.push_back(int_buffer(int_tensor(DType::kI32, c.ctx, {B})));
  if (c.paged) oc.inputs.push_back(int_buffer(block_tables_tensor(L)));
  oc.strided_outputs = c.strided;
  oc.threads = c.threads;
  oc.reference = [c, L, B, Dv](const std::vector<Tensor>& in) {
    const Vec q = to_f64(in[0]), kc = to_f64(in[1]), vc = to_f64(in[2]);
    const int64_t D = c.D, Hq = c.Hq, Hkv = c.Hkv, Sq = c.Sq, bs = c.block_size;
    const int64_t group = Hq / Hkv;
    RefOut o;
    o.value.assign(static_cast<size_t>(B * Sq * Hq * Dv), 0.0);
    o.scale.assign(o.value.size(), 0.0);
    Vec lse(static_cast<size_t>(B * Hq * Sq));
    const double scale =
        c.scale != 0.0f ? static_cast<double>(c.scale) : 1.0 / std::sqrt(static_cast<double>(D));
    int64_t max_ctx = 1;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t Sk = c.ctx[static_cast<size_t>(b)];
      max_ctx = std::max(max_ctx, Sk);
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t g = h / group;
        Vec qh(static_cast<size_t>(Sq * D)), kh(static_cast<size_t>(Sk * D)),
            vh(static_cast<size_t>(Sk * Dv));
        for (int64_t i = 0; i < Sq; ++i)
          std::copy_n(q.begin() + ((b * Sq + i) * Hq + h) * D, D, qh.begin() + i * D);
        for (int64_t t = 0; t < Sk; ++t) {
          const int64_t r = (L.block(b, t) * Hkv + g) * bs + L.row(t);
          std::copy_n(kc.begin() + r * D, D, kh.begin() + t * D);
          std::copy_n(vc.begin() + r * Dv, Dv, vh.begin() + t * Dv);
        }
        RefOut oh;
        Vec lh;
        kernels::ref::attention(&oh, &lh, qh, kh, vh, Sq, Sk, D, Dv, scale,
                                AttentionMask{.causal = true, .window_left = c.wl});
        for (int64_t i = 0; i < Sq; ++i) {
          const int64_t r = ((b * Sq + i) * Hq + h) * Dv;
          std::copy_n(oh.value.begin() + i * Dv, Dv, o.value.begin() + r);
          std::copy_n(oh.scale.begin() + i * Dv, Dv, o.scale.begin() + r);
          lse[static_cast<size_t>((b * Hq + h) * Sq + i)] = lh[static_cast<size_t>(i)];
        }
      }
    }
    // The looser of the activation and cache dtypes (the cache rows are exact inputs either
    // way; p and the output are rounded at most to the coarser one).
    const double tol = std::max(tolerance(c.q_dtype, max_ctx), tolerance(c.cache_dtype, max_ctx));
    return std::vector<Expected>{{o, tol}, {lse_ref(lse), tol}};
  };
  return oc;
}

std::vector<CaseSpec> paged_attention_cases() {
  CaseList list;
  auto add = [&](const PagedCfg& c) {
    list.add(cfg_name(c), [c](Rng& rng) { return build_paged(c, rng); });
  };
  const DType bf16 = DType::kBF16, f16 = DType::kF16;
  // clang-format off
  // Decode over sequences of very different lengths, block sizes 16 and 7 (odd).
  add({.ctx = {1, 37, 300, 1500}, .Sq = 1, .Hq = 8, .Hkv = 2, .D = 64, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1, 37, 300, 1500}, .Sq = 1, .Hq = 4,
       .Hkv = 4, .D = 128, .block_size = 7});
  // bf16 model, GQA: the bf16 P·V pairs in passes of query rows (D = 128: 2 rows per pass;
  // D = 256: 1) and an odd last key per span.
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1201, 33}, .Sq = 1, .Hq = 8, .Hkv = 2,
       .D = 128, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {77}, .Sq = 2, .Hq = 4, .Hkv = 2, .D = 256,
       .block_size = 16});
  // bf16 GQA in pages of 64 and 96 keys (the AMX products where the CPU has them: pages of
  // whole 16-key groups, a page cut at 32 + 2 keys, 2 query tokens per sequence).
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1000, 77}, .Sq = 1, .Hq = 12, .Hkv = 3,
       .D = 64, .block_size = 64, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {700, 90}, .Sq = 1, .Hq = 24, .Hkv = 2,
       .D = 64, .Dv = 128, .block_size = 64, .wl = 200, .threads = 2});  // 12 rows, Dv != D
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {700, 130, 2}, .Sq = 2, .Hq = 8, .Hkv = 2,
       .D = 128, .block_size = 96, .wl = 300});
  // bf16 GQA of up to 8 rows per kv head, whose AMX P·V reads the value rows in place
  // (AmxPvRows): head dim 256 (two groups of 4 column tiles) and an odd last 16-key step; 8
  // rows (2 tokens x 4 heads), Dv = 160 (a group of 4 column tiles and one of 1).
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1300, 45}, .Sq = 1, .Hq = 6, .Hkv = 2,
       .D = 256, .block_size = 1400, .paged = false, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {600, 71}, .Sq = 2, .Hq = 8, .Hkv = 2,
       .D = 64, .Dv = 160, .block_size = 64, .threads = 2});
  // One kv head per task in 64-key pages with a window: a window's first page cut anywhere, so
  // spans of fewer than 16 keys (the tail block alone) and tails at the pages' starts.
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {900, 70}, .Sq = 1, .Hq = 6, .Hkv = 1,
       .D = 64, .block_size = 64, .wl = 333, .threads = 2});
  // Chunks of 3 new tokens (causal among them); cache dtype independent of q's.
  add({.cache_dtype = bf16, .ctx = {3, 37, 300}, .Sq = 3, .Hq = 4, .Hkv = 1, .D = 80,
       .threads = 2});
  add({.q_dtype = bf16, .ctx = {5, 200}, .Sq = 3, .Hq = 6, .Hkv = 2, .D = 40, .block_size = 7,
       .strided = true, .threads = 2});
  add({.q_dtype = f16, .ctx = {1, 64, 65}, .Sq = 1, .Hq = 2, .Hkv = 2, .D = 33});
  // MQA decode with 16 q heads (two row groups), bf16 model; GQA-7 with a bf16 cache.
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {2000, 5}, .Sq = 1, .Hq = 16, .Hkv = 1,
       .D = 128, .threads = 2});
  add({.cache_dtype = bf16, .ctx = {700, 1}, .Sq = 1, .Hq = 14, .Hkv = 2, .D = 64,
       .block_size = 16});
  // 5-8 rows per kv head on the f32 register tiles over blocks of several pages
  // (AxpyPagesTiles): Qwen2-0.5B's 14 / 2 at head dim 64 in 16-key pages, two kv heads per task;
  // GQA-8 at 128 in 7-key pages (spans of odd length and start) with a window; an f16 cache at
  // head dim 48 (a tile of 3 vectors) at GQA-5; GQA-6 at head dim 32 (a tile of 2 vectors, a rest
  // of 2 rows) in 1-key pages, whose blocks end at kMaxPvSpans pages.
  add({.ctx = {1100, 40, 1}, .Sq = 1, .Hq = 14, .Hkv = 2, .D = 64, .block_size = 16,
       .threads = 2});
  add({.ctx = {900, 33}, .Sq = 1, .Hq = 16, .Hkv = 2, .D = 128, .block_size = 7, .wl = 500,
       .threads = 2});
  add({.cache_dtype = f16, .ctx = {300, 5}, .Sq = 1, .Hq = 10, .Hkv = 2, .D = 48,
       .block_size = 16});
  add({.ctx = {300, 70}, .Sq = 1, .Hq = 12, .Hkv = 2, .D = 32, .block_size = 1, .threads = 2});
  // bf16 GQA-8 at head dim 64 in 24-key pages (row octets: pages of whole 8-key blocks), each
  // sequence's last page 4 keys past a block of 8 (two keys at a time after the octets); in
  // 12-key pages the row pairs.
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {300, 20}, .Sq = 1, .Hq = 16, .Hkv = 2,
       .D = 64, .block_size = 24, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {100}, .Sq = 1, .Hq = 16, .Hkv = 2, .D = 64,
       .block_size = 12});
  // Rows in lanes (bf16 model, more than 8 rows per kv head, no AMX): 9 rows with Dv = 96 (one
  // 32-feature chunk per pass, 8 + 1 rows) in 7-key pages (spans of odd length and odd start);
  // 4 causal tokens x 8 heads = 32 rows (two lane groups) in 16-key pages with a window, so
  // some rows see no key of a span.
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {300, 2, 40}, .Sq = 1, .Hq = 9, .Hkv = 1,
       .D = 64, .Dv = 96, .block_size = 7, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1500, 40}, .Sq = 4, .Hq = 8, .Hkv = 1,
       .D = 128, .block_size = 16, .wl = 2, .threads = 2});
  // The same with an f32 cache, head dims of no whole vector (40, 100: a last pass of 4
  // features), 20 rows; and a bf16 q, 18 rows. Two kv heads per task in lanes (12 rows each,
  // enough chunks to keep both): bf16, 16-key pages.
  // 16 and 32 new tokens of a chunked prefill (decode path on AVX-512 without AMX prefill).
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {700, 16}, .Sq = 16, .Hq = 4, .Hkv = 1,
       .D = 64, .block_size = 16, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {900, 40}, .Sq = 32, .Hq = 2, .Hkv = 1,
       .D = 128, .block_size = 16, .wl = 500, .threads = 2});
  add({.ctx = {900, 3}, .Sq = 2, .Hq = 10, .Hkv = 1, .D = 40, .Dv = 100, .block_size = 16,
       .wl = 100, .threads = 2});
  add({.q_dtype = bf16, .ctx = {600}, .Sq = 1, .Hq = 18, .Hkv = 1, .D = 64, .block_size = 7});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {2000, 1500, 900}, .Sq = 1, .Hq = 24,
       .Hkv = 2, .D = 64, .threads = 2});
  // f32 caches with 16 rows per kv head in lanes, the dots in feature pairs: an odd head dim
  // (33: a last line of no whole pair, then the last feature alone) in 7-key pages with a
  // window; head dim 100 (a last line of 2 pairs) over 2048-key chunks with a large scale; a
  // bf16 q in 16-key pages.
  add({.ctx = {1300, 9}, .Sq = 4, .Hq = 4, .Hkv = 1, .D = 33, .Dv = 40, .block_size = 7,
       .wl = 900, .threads = 2});
  add({.ctx = {4500}, .Sq = 1, .Hq = 32, .Hkv = 2, .D = 100, .block_size = 4500, .paged = false,
       .scale = 1.5f, .threads = 2});
  add({.q_dtype = bf16, .ctx = {700, 30}, .Sq = 2, .Hq = 8, .Hkv = 1, .D = 64,
       .block_size = 16});
  // Several kv heads per decode task (their rows sit side by side in each page): MHA with 8
  // heads over 8 chunks, GQA-2 in tasks of 4 heads (8 at one thread), 5 kv heads in tasks of 5,
  // and of 3 and 2 at one chunk on two threads (DecodeTaskHeads).
  add({.ctx = {2100, 700, 1}, .Sq = 1, .Hq = 8, .Hkv = 8, .D = 64, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1500}, .Sq = 1, .Hq = 16, .Hkv = 8,
       .D = 128, .threads = 2});
  add({.cache_dtype = bf16, .ctx = {900, 50}, .Sq = 1, .Hq = 10, .Hkv = 5, .D = 40,
       .block_size = 7, .wl = 600});
  add({.cache_dtype = bf16, .ctx = {400}, .Sq = 1, .Hq = 10, .Hkv = 5, .D = 40, .block_size = 7,
       .wl = 300, .threads = 2});
  // Sliding window.
  add({.ctx = {37, 300, 1500}, .Sq = 3, .Hq = 4, .Hkv = 2, .D = 64, .wl = 50, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {3, 90}, .Sq = 3, .Hq = 2, .Hkv = 1,
       .D = 64, .block_size = 7, .wl = 7});
  // MQA, D = 256, scale, strided q and caches.
  add({.ctx = {50, 17}, .Sq = 3, .Hq = 8, .Hkv = 1, .D = 256, .scale = 0.2f, .strided = true,
       .strided_cache = true, .threads = 2});
  // One token per block.
  add({.ctx = {5, 9}, .Sq = 2, .Hq = 2, .Hkv = 1, .D = 32, .block_size = 1});
  // Contiguous caches (num_blocks = B, block_size = capacity).
  add({.ctx = {1, 37, 300}, .Sq = 1, .Hq = 4, .Hkv = 2, .D = 64, .block_size = 320,
       .paged = false, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {3, 100}, .Sq = 3, .Hq = 4, .Hkv = 2,
       .D = 64, .Dv = 40, .block_size = 101, .paged = false});
  // Batch 1, long context: the split over tokens (flash-decoding) and its merge.
  add({.cache_dtype = bf16, .ctx = {4000}, .Sq = 1, .Hq = 4, .Hkv = 1, .D = 128,
       .block_size = 4000, .paged = false, .threads = 2});
  add({.ctx = {2500}, .Sq = 2, .Hq = 2, .Hkv = 2, .D = 96, .Dv = 64, .wl = 1000, .threads = 2});
  // Contiguous caches with enough kv heads for the longer chunks (kDecodeChunkMax): 2048-key
  // chunks merged, single-chunk and length-1 sequences in one batch; 1024-key chunks with a
  // window that spans them.
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {4500, 2049, 1}, .Sq = 1, .Hq = 16,
       .Hkv = 8, .D = 64, .block_size = 4500, .paged = false, .threads = 2});
  add({.cache_dtype = bf16, .ctx = {3500}, .Sq = 1, .Hq = 4, .Hkv = 2, .D = 96,
       .block_size = 3600, .paged = false, .wl = 1500, .threads = 2});
  // 2048-key chunks of 20 (f32 cache) and 16 (bf16) rows per kv head in lanes: their 512-key
  // sub-blocks rescale Oᵀ or the rows' partials where a later one holds a larger score (a large
  // scale spreads the bf16 scores, so a missed rescale shows beyond bf16's tolerance).
  add({.ctx = {4200}, .Sq = 1, .Hq = 80, .Hkv = 4, .D = 64, .block_size = 4200, .paged = false,
       .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {4200}, .Sq = 1, .Hq = 64, .Hkv = 4,
       .D = 64, .block_size = 4200, .paged = false, .scale = 1.5f, .threads = 2});
  // bf16 pairs at head dims that are odd multiples of 16 (8 pairs of each row's dot and the
  // P·V's last 16 features loaded masked): GQA-4 at 80 in 16-key pages (the P·V over blocks of
  // pages, one chunk per pass); GQA-8 at 112 (two chunks per pass, the second a half one); MHA at 16
  // (nothing but the half vector) and 48; rows in lanes at 80 (16 heads) and 48 / 80 (24 rows,
  // a window, 7-key pages).
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1201, 33}, .Sq = 1, .Hq = 8, .Hkv = 2,
       .D = 80, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {900, 77}, .Sq = 1, .Hq = 16, .Hkv = 2,
       .D = 112, .block_size = 64, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {300, 1}, .Sq = 1, .Hq = 3, .Hkv = 3,
       .D = 16, .block_size = 7});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {2100, 5}, .Sq = 2, .Hq = 2, .Hkv = 2,
       .D = 48, .block_size = 2100, .paged = false, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {2000, 5}, .Sq = 1, .Hq = 16, .Hkv = 1,
       .D = 80, .block_size = 2000, .paged = false, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {700, 40}, .Sq = 3, .Hq = 8, .Hkv = 1,
       .D = 48, .Dv = 80, .block_size = 7, .wl = 100, .threads = 2});
  // The pair P·V over blocks of several pages (3 to 8 rows per kv head, pages shorter than its
  // blocks): 7- and 5-key pages (spans from odd keys on, each pairing its own keys, an odd last
  // one with weight 0), the second with the half chunk of head dim 80; a window from an odd key
  // in 16-key pages (a first span of 11 keys); 4 tokens x 2 heads (8 rows).
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {700, 61}, .Sq = 1, .Hq = 8, .Hkv = 2,
       .D = 64, .block_size = 7, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {300, 4}, .Sq = 1, .Hq = 12, .Hkv = 3,
       .D = 80, .block_size = 5});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {900, 70}, .Sq = 1, .Hq = 8, .Hkv = 2,
       .D = 128, .block_size = 16, .wl = 334, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1300}, .Sq = 4, .Hq = 4, .Hkv = 2,
       .D = 64, .block_size = 16, .threads = 2});
  // The same with 2 kv heads per task (5 chunks on 1 thread: the passes ask for the next
  // head's rows of a block), 1-key pages (blocks of 64 spans), GQA-7 (Qwen2-0.5B's 14 / 2),
  // GQA-5 and GQA-3 with half chunks (head dims 80 and 112: one chunk, and two, per pass).
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {2100}, .Sq = 4, .Hq = 4, .Hkv = 2,
       .D = 64, .block_size = 16});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {200, 3}, .Sq = 1, .Hq = 4, .Hkv = 1,
       .D = 64, .block_size = 1, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1000, 9}, .Sq = 1, .Hq = 14, .Hkv = 2,
       .D = 64, .block_size = 16, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {600, 20}, .Sq = 1, .Hq = 15, .Hkv = 3,
       .D = 80, .block_size = 16, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {500}, .Sq = 1, .Hq = 9, .Hkv = 3,
       .D = 112, .block_size = 8});
  // Half chunks elsewhere: GQA-4 at 80 on a contiguous cache (the P·V per span, one chunk per
  // pass); rows in lanes at 48 and 112 (two chunks per pass, the second a half one).
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {900, 33}, .Sq = 1, .Hq = 8, .Hkv = 2,
       .D = 80, .block_size = 900, .paged = false, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {700, 3}, .Sq = 1, .Hq = 16, .Hkv = 1,
       .D = 48, .block_size = 700, .paged = false, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {400, 30}, .Sq = 1, .Hq = 24, .Hkv = 2,
       .D = 112, .block_size = 16, .threads = 2});
  // The dots in row pairs (4 or 8 rows, 32 / rows keys at once, the last keys of a span one by
  // one): f32 caches at 5-8 rows with head dims of an odd count of 8-feature halves (40, 72) in
  // 7-key pages and on a contiguous cache, 6 rows (3 tokens x 2 heads) in 5-key pages, 5 rows;
  // bf16 pairs at 6 rows and head dim 48 in 5-key pages, 4 rows at head dim 16 (one half), 8
  // rows of 2 tokens at 144.
  add({.ctx = {700, 6}, .Sq = 1, .Hq = 14, .Hkv = 2, .D = 40, .block_size = 7, .threads = 2});
  add({.ctx = {1100, 3}, .Sq = 1, .Hq = 8, .Hkv = 1, .D = 72, .block_size = 1100, .paged = false,
       .threads = 2});
  add({.ctx = {300, 3}, .Sq = 3, .Hq = 2, .Hkv = 1, .D = 64, .Dv = 40, .block_size = 5});
  add({.ctx = {500, 9}, .Sq = 1, .Hq = 10, .Hkv = 2, .D = 64, .block_size = 7, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {500, 7}, .Sq = 1, .Hq = 6, .Hkv = 1,
       .D = 48, .block_size = 5, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {333}, .Sq = 1, .Hq = 8, .Hkv = 2, .D = 16,
       .block_size = 16});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {800, 31}, .Sq = 2, .Hq = 8, .Hkv = 2,
       .D = 144, .block_size = 800, .paged = false, .threads = 2});
  // The same with 4 kv heads per task (enough 512-key chunks: 9): f32 at 8 rows and head dim 256
  // (the packed q fills its scratch exactly), f32 at head dim 320 (it would not fit, so the dots
  // of one row per accumulator), bf16 at 4 rows and head dim 64 (8 keys at once).
  add({.ctx = {4100}, .Sq = 1, .Hq = 32, .Hkv = 4, .D = 256, .block_size = 16, .threads = 2});
  add({.ctx = {4100}, .Sq = 1, .Hq = 32, .Hkv = 4, .D = 320, .block_size = 16, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {4100}, .Sq = 1, .Hq = 16, .Hkv = 4,
       .D = 64, .block_size = 16, .threads = 2});
  // bf16 model, 1 or 2 rows per kv head at head dims 48-256, keys past the last 16 or 8 of a
  // span: the pair P·V in one pass over 3 chunks (80: the last a half one; 96), over 4 (112)
  // and 2 (48) with a half last one, in 7- and 5-key pages (odd spans) and on contiguous
  // caches.
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {1, 37, 301}, .Sq = 1, .Hq = 4, .Hkv = 4,
       .D = 80, .block_size = 7});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {333, 18}, .Sq = 2, .Hq = 2, .Hkv = 2,
       .D = 96, .block_size = 400, .paged = false, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {700, 21}, .Sq = 1, .Hq = 4, .Hkv = 2,
       .D = 112, .block_size = 16, .threads = 2});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {250, 3}, .Sq = 1, .Hq = 3, .Hkv = 3,
       .D = 48, .block_size = 5});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {95, 40}, .Sq = 1, .Hq = 2, .Hkv = 1,
       .D = 80, .block_size = 100, .paged = false});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {129, 7}, .Sq = 1, .Hq = 2, .Hkv = 2,
       .D = 256, .block_size = 16});
  add({.q_dtype = bf16, .cache_dtype = bf16, .ctx = {517}, .Sq = 1, .Hq = 3, .Hkv = 3, .D = 64,
       .block_size = 32, .threads = 2});
  // f32 and widened bf16 value rows of 2, 3, 5, 6 or 7 whole vectors read front to back
  // (AxpyKeysSeq) at 1-3 rows per kv head, keys past the last 8 one by one.
  add({.ctx = {1, 29, 301}, .Sq = 1, .Hq = 2, .Hkv = 2, .D = 80, .block_size = 7});
  add({.ctx = {260, 9}, .Sq = 1, .Hq = 6, .Hkv = 2, .D = 80, .block_size = 16, .threads = 2});
  add({.ctx = {333}, .Sq = 2, .Hq = 2, .Hkv = 2, .D = 112, .block_size = 400, .paged = false});
  add({.ctx = {150, 7}, .Sq = 1, .Hq = 12, .Hkv = 3, .D = 48, .block_size = 5});
  add({.cache_dtype = bf16, .ctx = {71}, .Sq = 1, .Hq = 8, .Hkv = 2, .D = 64, .Dv = 32,
       .block_size = 9});
  add({.cache_dtype = bf16, .ctx = {400, 31}, .Sq = 1, .Hq = 2, .Hkv = 2, .D = 96,
       .block_size = 16, .threads = 2});
  // The same at 1 row and 9-16 vectors (head dims 144-256).
  add({.ctx = {77, 300}, .Sq = 1, .Hq = 2, .Hkv = 2, .D = 256, .block_size = 7});
  add({.ctx = {129}, .Sq = 1, .Hq = 3, .Hkv = 3, .D = 160, .block_size = 200, .paged = false,
       .threads = 2});
  add({.cache_dtype = bf16, .ctx = {211, 9}, .Sq = 1, .Hq = 2, .Hkv = 2, .D = 64, .Dv = 144,
       .block_size = 16});
  // clang-format on
  // Random configurations from the case's seed.
  for (int n = 0; n < 6; ++n)
    list.add("random_" + std::to_string(n), [](Rng& rng) {
      PagedCfg c;
      const DType dts[] = {DType::kF32, DType::kBF16, DType::kF16};
      c.q_dtype = dts[rng.integer(0, 2)];
      c.cache_dtype = dts[rng.integer(0, 1)];
      c.Sq = rng.integer(1, 4);
      for (int64_t b = rng.integer(1, 4); b > 0; --b) c.ctx.push_back(rng.integer(c.Sq, 700));
      c.Hkv = rng.integer(1, 3);
      c.Hq = c.Hkv * (int64_t{1} << rng.integer(0, 3));
      c.D = rng.integer(1, 160);
      if (rng.integer(0, 3) == 0) c.Dv = rng.integer(1, 160);
      c.paged = rng.integer(0, 3) != 0;
      c.block_size = c.paged ? rng.integer(1, 40)
                             : *std::max_element(c.ctx.begin(), c.ctx.end()) + rng.integer(0, 9);
      if (rng.integer(0, 2) == 0) c.wl = rng.integer(0, 300);
      c.strided = rng.integer(0, 1);
      c.threads = static_cast<int>(rng.integer(1, 2));
      return build_paged(c, rng);
    });
  return list.cases;
}

// Valid base: q (2,Sq,4,32); caches (10,2,16,32); context_lens {20, 33}; block_tables (2,3)
// {{0,1,2},{3,4,5}} (capacity 48). Contiguous: caches (2,2,40,32), no block_tables.
BadCase paged_bad_base(Rng& rng, PagedAttentionParam p = {}, int64_t Sq = 1) {
  BadCase b;
  b.param = p;
  const int64_t NB = p.paged ? 10 : 2, bs = p.paged ? 16 : 40;
  b.inputs.push_back(random_tensor(rng, DType::kF32, {2, Sq, 4, 32}, false));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {NB, 2, bs, 32}, false));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {NB, 2, bs, 32}, false));
  b.inputs.push_back(int_buffer(int_tensor(DType::kI32, {20, 33}, {2})));
  if (p.paged) b.inputs.push_back(int_buffer(int_tensor(DType::kI32, {0, 1, 2, 3, 4, 5}, {2, 3})));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {2, Sq, 4, 32}));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {2, 4, Sq}));
  return b;
}

std::vector<BadSpec> paged_attention_bad() {
  return {
      {"block_table_entry_too_large",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[4].view.set({1, 2}, 10.0);
         b.error_at_execute_only = true;
         b.expect_substring = "input 4 (block_tables) entry [1][2] = 10 is out of range [0, 10)";
         return b;
       }},
      {"block_table_entry_negative",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[4].view.set({0, 0}, -1.0);
         b.error_at_execute_only = true;
         b.expect_substring = "input 4 (block_tables) entry [0][0] = -1 is out of range [0, 10)";
         return b;
       }},
      {"context_beyond_capacity",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[3].view.set({1}, 49.0);
         b.error_at_execute_only = true;
         b.expect_substring =
             "input 3 (context_lens) entry 1 = 49 exceeds the cache capacity of 48 tokens";
         return b;
       }},
      {"contiguous_context_beyond_capacity",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng, {.paged = false});
         b.inputs[3].view.set({1}, 41.0);
         b.error_at_execute_only = true;
         b.expect_substring =
             "input 3 (context_lens) entry 1 = 41 exceeds the cache capacity of 40 tokens";
         return b;
       }},
      {"context_shorter_than_queries",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng, {}, 3);
         b.inputs[3].view.set({0}, 2.0);
         b.error_at_execute_only = true;
         b.expect_substring =
             "input 3 (context_lens) entry 0 = 2 is less than the 3 new tokens of q";
         return b;
       }},
      {"context_zero",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng, {.paged = false});
         b.inputs[3].view.set({0}, 0.0);
         b.error_at_execute_only = true;
         b.expect_substring =
             "input 3 (context_lens) entry 0 = 0 is less than the 1 new tokens of q";
         return b;
       }},
      {"heads_not_multiple_of_kv_heads",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {2, 1, 5, 32}, false);
         b.outputs = {TensorDesc::contiguous(DType::kF32, {2, 1, 5, 32}),
                      TensorDesc::contiguous(DType::kF32, {2, 5, 1})};
         b.expect_substring = "multiple of kv heads";
         return b;
       }},
      {"cache_head_dim_differs",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {10, 2, 16, 40}, false);
         b.expect_substring = "input 1 (key_cache) expected dim 3 = 32";
         return b;
       }},
      {"value_cache_blocks_differ",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[2] = random_tensor(rng, DType::kF32, {9, 2, 16, 32}, false);
         b.expect_substring = "input 2 (value_cache) expected dim 0 = 10";
         return b;
       }},
      {"value_cache_dtype_differs",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[2] = random_tensor(rng, DType::kBF16, {10, 2, 16, 32}, false);
         b.expect_substring = "input 2 (value_cache) expected dtype f32";
         return b;
       }},
      {"block_tables_dtype",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[4] = int_buffer(int_tensor(DType::kI64, {0, 1, 2, 3, 4, 5}, {2, 3}));
         b.expect_substring = "input 4 (block_tables) expected dtype i32";
         return b;
       }},
      {"block_tables_rows",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[4] = int_buffer(int_tensor(DType::kI32, {0, 1, 2, 3, 4, 5, 6, 7, 8}, {3, 3}));
         b.expect_substring = "input 4 (block_tables) expected dim 0 = 2";
         return b;
       }},
      {"context_lens_dtype",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[3] = int_buffer(int_tensor(DType::kI64, {20, 33}, {2}));
         b.expect_substring = "input 3 (context_lens) expected dtype i32";
         return b;
       }},
      {"context_lens_count",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[3] = int_buffer(int_tensor(DType::kI32, {20, 33, 5}, {3}));
         b.expect_substring = "input 3 (context_lens) expected shape [2]";
         return b;
       }},
      {"paged_without_block_tables",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs.pop_back();
         b.expect_substring = "expected 5 inputs";
         return b;
       }},
      {"contiguous_with_block_tables",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng, {.paged = false});
         b.inputs.push_back(int_buffer(int_tensor(DType::kI32, {0, 1}, {2, 1})));
         b.expect_substring = "expected 4 inputs";
         return b;
       }},
      {"q_rank3",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {2, 4, 32}, false);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {2, 4, 32});
         b.expect_substring = "input 0 (q) expected rank 4";
         return b;
       }},
      {"window_left_invalid",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng, {.window_left = -2});
         b.expect_substring = "invalid param: window_left";
         return b;
       }},
      {"lse_shape",
       [](Rng& rng) {
         BadCase b = paged_bad_base(rng, {}, 3);
         b.outputs[1] = TensorDesc::contiguous(DType::kF32, {2, 3, 4});
         b.expect_substring = "output 1 (lse) expected f32[2,4,3]";
         return b;
       }},
  };
}

TBOOST_OP_TESTS(PagedAttention, paged_attention_cases, paged_attention_bad);

// ---- Cross-checks between the ops -------------------------------------------------------------

struct Compare {
  double max_err = 0.0;
  int64_t where = -1, nonfinite = 0;
};

// Largest |a - b| / max(1, |b|); -inf matching -inf counts as equal.
Compare compare(const Tensor& a, const Tensor& b) {
  const Vec x = to_f64(a), y = to_f64(b);
  Compare c;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) {
      ++c.nonfinite;
      continue;
    }
    const double e = std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i]));
    if (e > c.max_err) {
      c.max_err = e;
      c.where = static_cast<int64_t>(i);
    }
  }
  return c;
}

void expect_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const Compare c = compare(a, b);
  EXPECT_EQ(c.nonfinite, 0) << what << ": elements non-finite in one result only";
  EXPECT_LE(c.max_err, tol) << what << ": first worst element " << c.where;
}

// The same keys and values in a contiguous cache, scattered over permuted blocks of a paged
// cache, and packed for SelfAttention (varlen, causal: bottom-right alignment puts the Sq
// queries at the end of each sequence) give the same outputs.
// The bf16 pair path of the prefill kernel (bf16 q, k, v: vdpbf16ps where the CPU has
// AVX512_BF16, else an exact emulation of it, forced here) on every bf16 case of both ops.
TEST(SelfAttentionOp, Bf16PairPathMatchesFloat64Reference) {
  setenv("TBOOST_ATTN_BF16_PAIRS", "1", 1);
  int ran = 0;
  for (const auto& cases : {self_attention_cases(), paged_attention_cases()})
    for (const CaseSpec& c : cases) {
      if (c.name.find("bf16") == std::string::npos) continue;
      SCOPED_TRACE(c.name);
      run_case(c);
      ++ran;
    }
  unsetenv("TBOOST_ATTN_BF16_PAIRS");
  EXPECT_GT(ran, 10);
}

// TBOOST_ATTN_AMX=0: on a CPU with AMX, bf16 prefill then runs as it does without (vector
// products); elsewhere this repeats the default path.
TEST(SelfAttentionOp, Bf16WithoutAmxMatchesFloat64Reference) {
  setenv("TBOOST_ATTN_AMX", "0", 1);
  int ran = 0;
  for (const auto& cases : {self_attention_cases(), paged_attention_cases()})
    for (const CaseSpec& c : cases) {
      if (c.name.find("bf16") == std::string::npos) continue;
      SCOPED_TRACE(c.name);
      run_case(c);
      ++ran;
    }
  unsetenv("TBOOST_ATTN_AMX");
  EXPECT_GT(ran, 10);
}

// Tiny key blocks (MM_BLOCK_SIZE): every case then spans many blocks, so the online softmax's
// rescaling, partially visible blocks and block tails run on every shape, not only the long ones.
TEST(SelfAttentionOp, SmallKeyBlocksMatchFloat64Reference) {
  for (const char* block : {"7", "13"}) {
    setenv("MM_BLOCK_SIZE", block, 1);
    {  // the override reaches the op (else this test would only repeat the default cases)
      Tensor q = Tensor::zeros(DType::kF32, {1, 4, 1, 8});
      Tensor lse = Tensor::empty(DType::kF32, {1, 1, 4});
      auto op = create_operation(AttentionParam{});
      Context ctx;
      op->setup({{q, q, q}, {Tensor::empty(DType::kF32, {1, 4, 1, 8}), lse}}, ctx);
      EXPECT_NE(op->impl_info().find(std::string("key block ") + block), std::string::npos)
          << op->impl_info();
    }
    int ran = 0;
    for (const auto& cases : {self_attention_cases(), paged_attention_cases()})
      for (const CaseSpec& c : cases) {
        if (ran % 3 == 0 && c.name.find("8192") == std::string::npos) {  // a third of them
          SCOPED_TRACE(std::string("MM_BLOCK_SIZE=") + block + " " + c.name);
          run_case(c);
        }
        ++ran;
      }
    unsetenv("MM_BLOCK_SIZE");
  }
}

TEST(PagedAttentionOp, PagedContiguousAndSelfAttentionAgree) {
  for (DType cdt : {DType::kF32, DType::kBF16})
    for (int64_t wl : {int64_t{-1}, int64_t{100}}) {
      Rng rng;
      SCOPED_TRACE(std::string("cache ") + dtype_name(cdt) + " wl " + std::to_string(wl) +
                   " seed " + std::to_string(rng.seed()));
      const std::vector<int64_t> ctx = {5, 123, 700};
      const int64_t B = 3, Sq = 2, Hq = 4, Hkv = 2, D = 64, bs = 16, cap = 701;
      ContextOptions opt;
      opt.num_threads = 2;
      Context context(opt);
      Buffer kc = random_tensor(rng, cdt, {B, Hkv, cap, D}, false);
      Buffer vc = random_tensor(rng, cdt, {B, Hkv, cap, D}, false);
      const CacheLayout L = make_layout(rng, ctx, bs, true, 3);
      Buffer kp = random_tensor(rng, cdt, {L.num_blocks, Hkv, bs, D}, false);
      Buffer vp = random_tensor(rng, cdt, {L.num_blocks, Hkv, bs, D}, false);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < ctx[static_cast<size_t>(b)]; ++t)
          for (int64_t g = 0; g < Hkv; ++g)
            for (int64_t d = 0; d < D; ++d) {
              kp.view.set({L.block(b, t), g, L.row(t), d}, kc.view.get({b, g, t, d}));
              vp.view.set({L.block(b, t), g, L.row(t), d}, vc.view.get({b, g, t, d}));
            }
      Buffer q = random_tensor(rng, DType::kF32, {B, Sq, Hq, D}, false);
      const Tensor lens = int_tensor(DType::kI32, ctx, {B});
      const Tensor tables = block_tables_tensor(L);
      Tensor o1 = Tensor::empty(DType::kF32, {B, Sq, Hq, D});
      Tensor o2 = Tensor::empty(DType::kF32, {B, Sq, Hq, D});
      Tensor l1 = Tensor::empty(DType::kF32, {B, Hq, Sq});
      Tensor l2 = Tensor::empty(DType::kF32, {B, Hq, Sq});
      auto paged = create_operation(PagedAttentionParam{.paged = true, .window_left = wl});
      auto contiguous = create_operation(PagedAttentionParam{.paged = false, .window_left = wl});
      ASSERT_NO_THROW(
          run_operation(*paged, {{q.view, kp.view, vp.view, lens, tables}, {o1, l1}}, context));
      ASSERT_NO_THROW(
          run_operation(*contiguous, {{q.view, kc.view, vc.view, lens}, {o2, l2}}, context));
      // Only the order of the same f32 operations may differ.
      expect_close(o1, o2, 1e-6, "paged vs contiguous o");
      expect_close(l1, l2, 1e-6, "paged vs contiguous lse");
      if (cdt != DType::kF32) continue;  // SelfAttention takes k, v in q's dtype
      const int64_t Tk = std::accumulate(ctx.begin(), ctx.end(), int64_t{0});
      Tensor kk = Tensor::empty(DType::kF32, {Tk, Hkv, D});
      Tensor vv = Tensor::empty(DType::kF32, {Tk, Hkv, D});
      std::vector<int64_t> cu_k = {0}, cu_q = {0};
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < ctx[static_cast<size_t>(b)]; ++t)
          for (int64_t g = 0; g < Hkv; ++g)
            for (int64_t d = 0; d < D; ++d) {
              kk.set({cu_k.back() + t, g, d}, kc.view.get({b, g, t, d}));
              vv.set({cu_k.back() + t, g, d}, vc.view.get({b, g, t, d}));
            }
        cu_k.push_back(cu_k.back() + ctx[static_cast<size_t>(b)]);
        cu_q.push_back(cu_q.back() + Sq);
      }
      Tensor o3 = Tensor::empty(DType::kF32, {B * Sq, Hq, D});
      Tensor l3 = Tensor::empty(DType::kF32, {Hq, B * Sq});
      auto self =
          create_operation(AttentionParam{.causal = true, .window_left = wl, .varlen = true});
      ASSERT_NO_THROW(run_operation(
          *self,
          {{q.view.reshape({B * Sq, Hq, D}), kk, vv, int_tensor(DType::kI32, cu_q, {B + 1}),
            int_tensor(DType::kI32, cu_k, {B + 1})},
           {o3, l3}},
          context));
      // Two f32 kernels, each within a few ulp-sized score errors of the exact result.
      expect_close(o3.reshape({B, Sq, Hq, D}), o1, 1e-5, "SelfAttention vs paged o");
      // lse (Hq, B*Sq) vs (B, Hq, Sq).
      Tensor l3t = l3.reshape({Hq, B, Sq}).transpose(0, 1).contiguous_copy();
      expect_close(l3t, l1, 1e-5, "SelfAttention vs paged lse");
    }
}

// Runs op on 1, 2 and 3 threads and expects every output bitwise equal to the 1-thread one.
void expect_thread_independent(const AnyParam& param, const std::vector<Tensor>& inputs,
                               const std::string& what) {
  auto op = create_operation(param);
  std::vector<TensorDesc> in;
  for (const Tensor& t : inputs) in.push_back(t.desc());
  const std::vector<TensorDesc> out = op->infer_shape(in);
  std::vector<Tensor> first;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(what + ", " + std::to_string(threads) + " threads");
    std::vector<Tensor> outs;
    for (const TensorDesc& d : out) outs.push_back(Tensor::empty(d.dtype, d.shape()));
    ContextOptions opt;
    opt.num_threads = threads;
    Context ctx(opt);
    ASSERT_NO_THROW(run_operation(*op, {inputs, outs}, ctx));
    if (first.empty()) {
      first = outs;
      continue;
    }
    for (size_t o = 0; o < outs.size(); ++o) {
      const Compare c = compare(outs[o], first[o]);
      EXPECT_TRUE(c.max_err == 0.0 && c.nonfinite == 0)
          << "output " << o << " differs from the 1-thread result: relative " << c.max_err
          << " at element " << c.where;
    }
  }
}

// Every task runs on one thread in a fixed order (src/kernels/cpu/attention.cc), so the thread
// count must not change a bit of the result: prefill tiles, split-KV decode, paged decode.
TEST(SelfAttentionOp, ThreadCountDoesNotChangeResults) {
  struct Cfg {
    int64_t Sq, Sk, Hq, Hkv;
    bool causal;
  };
  for (const Cfg& c : {Cfg{37, 300, 4, 2, true}, Cfg{1, 3000, 4, 1, false},
                       Cfg{2, 1000, 2, 2, true}, Cfg{5, 2100, 1, 1, true}}) {
    Rng rng;
    const std::string what = "Sq " + std::to_string(c.Sq) + " Sk " + std::to_string(c.Sk) + " Hq " +
                             std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) + " seed " +
                             std::to_string(rng.seed());
    Buffer q = random_tensor(rng, DType::kF32, {1, c.Sq, c.Hq, 64}, false);
    Buffer k = random_tensor(rng, DType::kF32, {1, c.Sk, c.Hkv, 64}, false);
    Buffer v = random_tensor(rng, DType::kF32, {1, c.Sk, c.Hkv, 64}, false);
    expect_thread_independent(AttentionParam{.causal = c.causal}, {q.view, k.view, v.view}, what);
  }
  // A varlen batch of 7 and 5 tokens x 4 q heads per kv head: 28 and 20 decode rows, in lanes
  // (f32 and bf16). With 2 or more threads the 28 rows go in groups of 16 and 12; the 20 must
  // stay one group (16 + 4 would put 4 rows on the row-by-row kernels).
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Rng rng;
    Buffer q = random_tensor(rng, dt, {12, 4, 64}, false);
    Buffer k = random_tensor(rng, dt, {500, 1, 64}, false);
    Buffer v = random_tensor(rng, dt, {500, 1, 64}, false);
    expect_thread_independent(AttentionParam{.causal = true, .varlen = true},
                              {q.view, k.view, v.view, int_tensor(DType::kI32, {0, 7, 12}, {3}),
                               int_tensor(DType::kI32, {0, 300, 500}, {3})},
                              std::string("varlen 7 and 5 tokens, ") + dtype_name(dt) + ", seed " +
                                  std::to_string(rng.seed()));
  }
}

// A sliding window makes each task's key range start mid-sequence; the block grid must not
// depend on where a task starts (the tiles per task follow the thread count).
TEST(SelfAttentionOp, WindowResultsDoNotDependOnThreads) {
  Rng rng;
  Buffer q = random_tensor(rng, DType::kF32, {1, 1500, 2, 64}, false);
  Buffer k = random_tensor(rng, DType::kF32, {1, 1500, 2, 64}, false);
  Buffer v = random_tensor(rng, DType::kF32, {1, 1500, 2, 64}, false);
  expect_thread_independent(AttentionParam{.causal = true, .window_left = 100},
                            {q.view, k.view, v.view}, "seed " + std::to_string(rng.seed()));
}

// Runs an op on inputs with fresh outputs and one context of `threads`.
std::vector<Tensor> run_fresh(const AnyParam& param, const std::vector<Tensor>& inputs,
                              size_t* workspace = nullptr) {
  auto op = create_operation(param);
  std::vector<TensorDesc> in;
  for (const Tensor& t : inputs) in.push_back(t.desc());
  std::vector<Tensor> outs;
  for (const TensorDesc& d : op->infer_shape(in)) outs.push_back(Tensor::empty(d.dtype, d.shape()));
  Context ctx;
  const size_t ws = op->setup({inputs, outs}, ctx);
  if (workspace) *workspace = ws;
  op->execute({inputs, outs}, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
  return outs;
}

// "No window" is often written as INT32_MAX or INT64_MAX: the same as -1, on the flash path
// (many queries) and the decode path (one query).
TEST(SelfAttentionOp, HugeWindowsMeanNoWindow) {
  for (int64_t sq : {64, 1}) {
    Rng rng;
    Buffer q = random_tensor(rng, DType::kF32, {1, sq, 2, 32}, false);
    Buffer k = random_tensor(rng, DType::kF32, {1, 64, 2, 32}, false);
    Buffer v = random_tensor(rng, DType::kF32, {1, 64, 2, 32}, false);
    const std::vector<Tensor> in = {q.view, k.view, v.view};
    for (bool causal : {true, false}) {
      const std::vector<Tensor> want = run_fresh(AttentionParam{.causal = causal}, in);
      for (int64_t w : {int64_t{2147483647}, int64_t{1} << 32, INT64_MAX}) {
        SCOPED_TRACE("sq " + std::to_string(sq) + " causal " + std::to_string(causal) + " window " +
                     std::to_string(w));
        const std::vector<Tensor> got =
            run_fresh(AttentionParam{.causal = causal, .window_left = w, .window_right = w}, in);
        for (size_t o = 0; o < got.size(); ++o) {
          const Compare c = compare(got[o], want[o]);
          EXPECT_TRUE(c.max_err == 0.0 && c.nonfinite == 0) << "output " << o;
        }
      }
    }
  }
}

// Frameworks mask with the most negative finite float, not -inf: such a key is merely
// improbable, so a row masked that way everywhere is a uniform average (as in float64), not 0.
TEST(SelfAttentionOp, LowestFloatMaskIsNotMinusInfinity) {
  for (int64_t sq : {16, 1}) {
    Rng rng;
    const int64_t sk = 16, D = 32;
    Buffer q = random_tensor(rng, DType::kF32, {1, sq, 1, D}, false);
    Buffer k = random_tensor(rng, DType::kF32, {1, sk, 1, D}, false);
    Buffer v = random_tensor(rng, DType::kF32, {1, sk, 1, D}, false);
    Tensor mask = Tensor::zeros(DType::kF32, {sq, sk});
    for (int64_t j = 0; j < sk; ++j)
      mask.data_as<float>()[j] = std::numeric_limits<float>::lowest();
    const std::vector<Tensor> got =
        run_fresh(AttentionParam{.custom_mask = true}, {q.view, k.view, v.view, mask});
    SCOPED_TRACE("sq " + std::to_string(sq));
    EXPECT_TRUE(std::isfinite(got[1].data_as<float>()[0])) << "lse of the masked row";
    for (int64_t d = 0; d < D; ++d) {
      double mean = 0.0;
      for (int64_t j = 0; j < sk; ++j) mean += v.view.data_as<float>()[j * D + d];
      EXPECT_NEAR(got[0].data_as<float>()[d], mean / sk, 1e-5) << "feature " << d;
    }
  }
}

// Varlen setup knows only the packed total; the decode partials it reserves must scale with the
// keys that exist, not with batch x total keys.
TEST(SelfAttentionOp, VarlenWorkspaceScalesWithTokensNotBatchTimesTokens) {
  Rng rng;
  const int64_t B = 64, len = 256, T = B * len;
  Buffer q = random_tensor(rng, DType::kF32, {T, 2, 32}, false);
  Buffer k = random_tensor(rng, DType::kF32, {T, 2, 32}, false);
  Buffer v = random_tensor(rng, DType::kF32, {T, 2, 32}, false);
  std::vector<int64_t> cu;
  for (int64_t b = 0; b <= B; ++b) cu.push_back(b * len);
  Tensor cq = int_tensor(DType::kI32, cu, {B + 1}), ck = int_tensor(DType::kI32, cu, {B + 1});
  size_t ws = 0;
  run_fresh(AttentionParam{.causal = true, .varlen = true}, {q.view, k.view, v.view, cq, ck}, &ws);
  EXPECT_LT(ws, size_t{2} << 20) << "workspace bytes for " << T << " packed tokens";
}

// One decode call (a query token per sequence) over a paged cache of 16-key pages, its outputs
// compared across 1, 2 and 3 threads: q of q_dt, caches of cache_dt, heads hq / hkv of dim d.
void expect_paged_thread_independent(Rng& rng, const std::vector<int64_t>& ctx, DType q_dt,
                                     DType cache_dt, int64_t hq, int64_t hkv, int64_t d,
                                     const std::string& what) {
  const int64_t B = static_cast<int64_t>(ctx.size());
  const CacheLayout L = make_layout(rng, ctx, 16, true);
  Buffer q = random_tensor(rng, q_dt, {B, 1, hq, d}, false);
  Buffer kc = random_tensor(rng, cache_dt, {L.num_blocks, hkv, 16, d}, false);
  Buffer vc = random_tensor(rng, cache_dt, {L.num_blocks, hkv, 16, d}, false);
  expect_thread_independent(
      PagedAttentionParam{},
      {q.view, kc.view, vc.view, int_tensor(DType::kI32, ctx, {B}), block_tables_tensor(L)},
      "paged, " + what + ", " + std::to_string(hq) + " / " + std::to_string(hkv) + " heads of " +
          std::to_string(d) + ", seed " + std::to_string(rng.seed()));
}

TEST(PagedAttentionOp, ThreadCountDoesNotChangeResults) {
  Rng rng;
  expect_paged_thread_independent(rng, {2900, 40}, DType::kF32, DType::kBF16, 4, 2, 64,
                                  "f32 q, bf16 cache");
  // Tasks of several kv heads of a page (DecodeTaskHeads): how many a task takes depends on the
  // threads and on how evenly the chunks split (here 512 + 88 keys and 512 x 3 + 64), bf16 q and
  // cache as in a bf16 model: MHA at head dim 64 and GQA-4 at 128 take 12 and 8 heads a task at
  // 1 and 2 threads, 6 and 4 at 3.
  expect_paged_thread_independent(rng, {600, 1600}, DType::kBF16, DType::kBF16, 12, 12, 64, "bf16");
  expect_paged_thread_independent(rng, {600, 1600}, DType::kBF16, DType::kBF16, 32, 8, 128, "bf16");
  // f32, 8 rows per kv head (32 / 4 heads) at head dim 320, one chunk: 4 heads a task at 1
  // thread, 2 at 2 and 3. The f32 row-pair dots (which sum in another order than the other
  // dots) must not follow the task's heads.
  expect_paged_thread_independent(rng, {100}, DType::kF32, DType::kF32, 32, 4, 320, "f32");
  // 28 query rows per kv head in lanes (bf16 model; f32 cache): one task of 28 rows per chunk at
  // 1 thread, two of 16 and 12 at 2 and 3 threads (too few chunks for a thread each).
  for (DType dt : {DType::kBF16, DType::kF32})
    expect_paged_thread_independent(rng, {1000}, dt, dt, 28, 1, 64, dtype_name(dt));
}

// ---- ReshapeAndCache --------------------------------------------------------------------------

struct CacheCfg {
  DType kv = DType::kF32, cache = DType::kF32, slot = DType::kI32;
  int64_t T = 45, Hkv = 3, D = 40, Dv = 40, NB = 9, bs = 7;
  bool strided = false;
  int threads = 1;
};

std::string cfg_name(const CacheCfg& c) {
  return std::string("kv ") + dtype_name(c.kv) + " cache " + dtype_name(c.cache) + " slots " +
         dtype_name(c.slot) + " T " + std::to_string(c.T) + " Hkv " + std::to_string(c.Hkv) +
         " D " + std::to_string(c.D) + "/" + std::to_string(c.Dv) + " blocks " +
         std::to_string(c.NB) + "x" + std::to_string(c.bs) + (c.strided ? " strided" : "") +
         " threads " + std::to_string(c.threads);
}

// Distinct random slots for the T tokens, about one in five -1 (padding, skipped).
std::vector<int64_t> random_slots(Rng& rng, int64_t T, int64_t num_slots) {
  std::vector<int64_t> all(static_cast<size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  for (size_t i = all.size(); i > 1; --i)
    std::swap(all[i - 1], all[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(i) - 1))]);
  all.resize(static_cast<size_t>(T));
  for (int64_t& s : all)
    if (rng.integer(0, 4) == 0) s = -1;
  return all;
}

// The cache as it must be after the op: `before` with the mapped rows replaced by x rounded to
// the cache dtype (store_from_f64 rounds to nearest even, as the op must).
Tensor expected_cache(const Tensor& before, const Tensor& x, const std::vector<int64_t>& slots,
                      int64_t bs) {
  Tensor want = before.contiguous_copy();
  for (size_t t = 0; t < slots.size(); ++t) {
    const int64_t s = slots[t];
    if (s < 0) continue;
    for (int64_t g = 0; g < x.dim(1); ++g)
      for (int64_t d = 0; d < x.dim(2); ++d)
        want.set({s / bs, g, s % bs, d}, x.get({static_cast<int64_t>(t), g, d}));
  }
  return want;
}

// Bitwise equality of two contiguous tensors, naming the first differing element.
void expect_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape());
  const size_t es = dtype_size(got.dtype());
  const auto* g = static_cast<const unsigned char*>(got.data());
  const auto* w = static_cast<const unsigned char*>(want.data());
  int64_t diff = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i)
    if (std::memcmp(g + static_cast<size_t>(i) * es, w + static_cast<size_t>(i) * es, es) != 0) {
      if (first < 0) first = i;
      ++diff;
    }
  if (diff == 0) return;
  const int64_t H = got.dim(1), bs = got.dim(2), D = got.dim(3);
  const int64_t blk = first / (H * bs * D), h = first / (bs * D) % H, r = first / D % bs,
                d = first % D;
  ADD_FAILURE() << what << ": " << diff << " elements differ; first [" << blk << "," << h << ","
                << r << "," << d << "] (slot " << blk * bs + r << "): got "
                << load_as_f64(got.data(), got.dtype(), first) << ", want "
                << load_as_f64(want.data(), want.dtype(), first);
}

void check_reshape_and_cache(const CacheCfg& c) {
  Rng rng;
  SCOPED_TRACE(cfg_name(c) + " seed " + std::to_string(rng.seed()));
  Buffer k = random_tensor(rng, c.kv, {c.T, c.Hkv, c.D}, c.strided);
  Buffer v = random_tensor(rng, c.kv, {c.T, c.Hkv, c.Dv}, c.strided);
  const std::vector<int64_t> slots = random_slots(rng, c.T, c.NB * c.bs);
  const Tensor slot_t = int_tensor(c.slot, slots, {c.T});
  Buffer kc = random_tensor(rng, c.cache, {c.NB, c.Hkv, c.bs, c.D}, false, -4.0, 4.0);
  Buffer vc = random_tensor(rng, c.cache, {c.NB, c.Hkv, c.bs, c.Dv}, false, -4.0, 4.0);
  const Tensor want_k = expected_cache(kc.view, k.view, slots, c.bs);
  const Tensor want_v = expected_cache(vc.view, v.view, slots, c.bs);
  ContextOptions opt;
  opt.num_threads = c.threads;
  Context ctx(opt);
  auto op = create_operation(ReshapeAndCacheParam{});
  ASSERT_NO_THROW(
      run_operation(*op, {{k.view, v.view, slot_t, kc.view, vc.view}, {kc.view, vc.view}}, ctx));
  expect_bitwise(kc.view, want_k, "key_cache");
  expect_bitwise(vc.view, want_v, "value_cache");
}

TEST(ReshapeAndCacheOp, WritesMappedRowsAndNothingElse) {
  const DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16;
  const DType i32 = DType::kI32, i64 = DType::kI64;
  // clang-format off
  check_reshape_and_cache({.kv = f32, .cache = f32, .slot = i32});
  check_reshape_and_cache({.kv = f32, .cache = bf16, .slot = i64, .Dv = 24, .strided = true});
  check_reshape_and_cache({.kv = bf16, .cache = bf16, .slot = i32, .threads = 2});
  check_reshape_and_cache({.kv = bf16, .cache = f32, .slot = i64, .D = 33, .Dv = 33,
                           .strided = true, .threads = 2});
  check_reshape_and_cache({.kv = f16, .cache = bf16, .slot = i32, .D = 64, .Dv = 64});
  check_reshape_and_cache({.kv = f16, .cache = f32, .slot = i64, .Hkv = 1, .D = 8, .Dv = 8});
  // Contiguous cache: num_blocks = B = 2, block_size = capacity.
  check_reshape_and_cache({.kv = f32, .cache = bf16, .slot = i32, .T = 50, .Hkv = 2, .D = 64,
                           .Dv = 64, .NB = 2, .bs = 64, .threads = 2});
  // Many tokens over two threads.
  check_reshape_and_cache({.kv = bf16, .cache = bf16, .slot = i64, .T = 300, .Hkv = 8,
                           .D = 128, .Dv = 128, .NB = 40, .bs = 16, .threads = 2});
  check_reshape_and_cache({.kv = f32, .cache = f32, .slot = i32, .T = 257, .Hkv = 4, .D = 96,
                           .Dv = 80, .NB = 23, .bs = 13, .strided = true, .threads = 2});
  // clang-format on
}

// A slot beyond the cache is an error at execute at the latest, and nothing is written: not
// even the rows of the valid tokens before it.
TEST(ReshapeAndCacheOp, SlotOutOfRangeLeavesCachesUntouched) {
  struct Bad {
    DType slot_dtype;
    int64_t index;
    double value;
    const char* expect;
  };
  for (const Bad& bad :
       {Bad{DType::kI32, 5, 320.0, "input 2 (slot_mapping) entry 5 = 320 is out of range"},
        Bad{DType::kI64, 3, std::ldexp(1.0, 40),
            "input 2 (slot_mapping) entry 3 = 1099511627776 is out of range"}}) {
    Rng rng;
    SCOPED_TRACE(std::string(dtype_name(bad.slot_dtype)) + " seed " + std::to_string(rng.seed()));
    Buffer k = random_tensor(rng, DType::kF32, {7, 2, 32}, false);
    Buffer v = random_tensor(rng, DType::kF32, {7, 2, 32}, false);
    Tensor slots = int_tensor(bad.slot_dtype, random_slots(rng, 7, 320), {7});
    slots.set({bad.index}, bad.value);
    Buffer kc = random_tensor(rng, DType::kBF16, {20, 2, 16, 32}, false);
    Buffer vc = random_tensor(rng, DType::kBF16, {20, 2, 16, 32}, false);
    const Tensor k_before = kc.view.contiguous_copy(), v_before = vc.view.contiguous_copy();
    Context ctx;
    auto op = create_operation(ReshapeAndCacheParam{});
    const VariantPack pack{{k.view, v.view, slots, kc.view, vc.view}, {kc.view, vc.view}};
    try {
      const size_t ws = op->setup(pack, ctx);
      op->execute(pack, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
      ADD_FAILURE() << "expected a tboost::Error containing '" << bad.expect << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.expect), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << bad.expect << "'";
    }
    expect_bitwise(kc.view, k_before, "key_cache after the error");
    expect_bitwise(vc.view, v_before, "value_cache after the error");
  }
}

// Valid inputs k, v (7,2,32) f32, slots i32 in [0,320), caches (20,2,16,32) f32. The harness
// passes fresh outputs, so these only reach the op's checks of the inputs (or, with all inputs
// valid, its check that the outputs are the caches themselves).
BadCase cache_bad_base(Rng& rng) {
  BadCase b;
  b.param = ReshapeAndCacheParam{};
  b.inputs.push_back(random_tensor(rng, DType::kF32, {7, 2, 32}, false));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {7, 2, 32}, false));
  b.inputs.push_back(int_buffer(int_tensor(DType::kI32, random_slots(rng, 7, 320), {7})));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {20, 2, 16, 32}, false));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {20, 2, 16, 32}, false));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {20, 2, 16, 32}));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {20, 2, 16, 32}));
  return b;
}

std::vector<BadSpec> reshape_and_cache_bad() {
  return {
      {"outputs_not_the_cache_inputs",
       [](Rng& rng) {
         BadCase b = cache_bad_base(rng);
         b.expect_substring = "output 0 (key_cache) must be the very same view as input 3";
         return b;
       }},
      {"k_v_token_counts_differ",
       [](Rng& rng) {
         BadCase b = cache_bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {6, 2, 32}, false);
         b.expect_substring = "input 1 (v) expected dim 0 = 7";
         return b;
       }},
      {"slot_mapping_dtype",
       [](Rng& rng) {
         BadCase b = cache_bad_base(rng);
         b.inputs[2] = random_tensor(rng, DType::kF32, {7}, false, 0.0, 300.0);
         b.expect_substring = "input 2 (slot_mapping) expected dtype one of {i32, i64}";
         return b;
       }},
      {"slot_mapping_count",
       [](Rng& rng) {
         BadCase b = cache_bad_base(rng);
         b.inputs[2] = int_buffer(int_tensor(DType::kI32, random_slots(rng, 8, 320), {8}));
         b.expect_substring = "input 2 (slot_mapping) expected dim 0 = 7";
         return b;
       }},
      {"k_heads_differ_from_cache",
       [](Rng& rng) {
         BadCase b = cache_bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {7, 3, 32}, false);
         b.inputs[1] = random_tensor(rng, DType::kF32, {7, 3, 32}, false);
         b.expect_substring = "input 3 (key_cache) expected dim 1 = 3";
         return b;
       }},
      {"k_head_dim_differs_from_cache",
       [](Rng& rng) {
         BadCase b = cache_bad_base(rng);
         b.inputs[3] = random_tensor(rng, DType::kF32, {20, 2, 16, 40}, false);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {20, 2, 16, 40});
         b.expect_substring = "input 3 (key_cache) expected dim 3 = 32";
         return b;
       }},
      {"k_integer",
       [](Rng& rng) {
         BadCase b = cache_bad_base(rng);
         b.inputs[0] = int_buffer(random_ints(rng, DType::kI32, {7, 2, 32}, 1, 5));
         b.expect_substring = "input 0 (k) expected dtype one of {f32, bf16, f16}";
         return b;
       }},
  };
}

class ReshapeAndCacheBadTest : public ::testing::TestWithParam<BadSpec> {};
TEST_P(ReshapeAndCacheBadTest, RejectsWithClearError) { run_bad_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Bad, ReshapeAndCacheBadTest, ::testing::ValuesIn(reshape_and_cache_bad()),
                         [](const auto& info) { return test_name(info.param.name); });

// The serving loop: ReshapeAndCache writes each sequence's k, v into scattered blocks, then
// PagedAttention over that cache equals SelfAttention over the packed k, v.
TEST(ReshapeAndCacheOp, FeedsPagedAttention) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::vector<int64_t> ctx = {1, 30, 77};
  const int64_t B = 3, Sq = 1, Hq = 4, Hkv = 2, D = 48, bs = 8;
  const int64_t Tk = std::accumulate(ctx.begin(), ctx.end(), int64_t{0});
  ContextOptions opt;
  opt.num_threads = 2;
  Context context(opt);
  const CacheLayout L = make_layout(rng, ctx, bs, true, 4);
  Buffer k = random_tensor(rng, DType::kF32, {Tk, Hkv, D}, false);
  Buffer v = random_tensor(rng, DType::kF32, {Tk, Hkv, D}, false);
  std::vector<int64_t> slots, cu_k = {0}, cu_q = {0};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < ctx[static_cast<size_t>(b)]; ++t)
      slots.push_back(L.block(b, t) * bs + L.row(t));
    cu_k.push_back(cu_k.back() + ctx[static_cast<size_t>(b)]);
    cu_q.push_back(cu_q.back() + Sq);
  }
  Buffer kc = random_tensor(rng, DType::kF32, {L.num_blocks, Hkv, bs, D}, false);
  Buffer vc = random_tensor(rng, DType::kF32, {L.num_blocks, Hkv, bs, D}, false);
  poison_unused_rows(kc.view, L, ctx);  // every used row is written by the op
  poison_unused_rows(vc.view, L, ctx);
  auto cache = create_operation(ReshapeAndCacheParam{});
  ASSERT_NO_THROW(
      run_operation(*cache,
                    {{k.view, v.view, int_tensor(DType::kI64, slots, {Tk}), kc.view, vc.view},
                     {kc.view, vc.view}},
                    context));
  Buffer q = random_tensor(rng, DType::kF32, {B, Sq, Hq, D}, false);
  Tensor o1 = Tensor::empty(DType::kF32, {B, Sq, Hq, D});
  Tensor l1 = Tensor::empty(DType::kF32, {B, Hq, Sq});
  auto paged = create_operation(PagedAttentionParam{});
  ASSERT_NO_THROW(run_operation(
      *paged,
      {{q.view, kc.view, vc.view, int_tensor(DType::kI32, ctx, {B}), block_tables_tensor(L)},
       {o1, l1}},
      context));
  Tensor o2 = Tensor::empty(DType::kF32, {B * Sq, Hq, D});
  Tensor l2 = Tensor::empty(DType::kF32, {Hq, B * Sq});
  auto self = create_operation(AttentionParam{.causal = true, .varlen = true});
  ASSERT_NO_THROW(run_operation(
      *self,
      {{q.view.reshape({B * Sq, Hq, D}), k.view, v.view, int_tensor(DType::kI32, cu_q, {B + 1}),
        int_tensor(DType::kI32, cu_k, {B + 1})},
       {o2, l2}},
      context));
  expect_close(o2.reshape({B, Sq, Hq, D}), o1, 1e-5, "SelfAttention vs paged o");
  expect_close(l2.reshape({Hq, B, Sq}).transpose(0, 1).contiguous_copy(), l1, 1e-5,
               "SelfAttention vs paged lse");
}

}  // namespace
}  // namespace tboost::testing

namespace tboost::testing {
namespace {

// ReshapeAndCache with the rope fused in: bad positions and rotary dims are named errors and
// leave the caches untouched.
TEST(ReshapeAndCacheRope, BadInputsAreNamedAndCachesUntouched) {
  Rng rng;
  const int64_t T = 3, H = 2, D = 8;
  Tensor k = random_tensor(rng, DType::kF32, {T, H, D}, false).view;
  Tensor v = random_tensor(rng, DType::kF32, {T, H, D}, false).view;
  Tensor slots = Tensor::empty(DType::kI32, {T});
  for (int64_t t = 0; t < T; ++t) slots.data_as<int32_t>()[t] = static_cast<int32_t>(t);
  Tensor kc = Tensor::zeros(DType::kF32, {2, H, 4, D}),
         vc = Tensor::zeros(DType::kF32, {2, H, 4, D});
  auto fails = [&](const ops::ReshapeAndCacheParam& p, const Tensor& pos, const std::string& what) {
    auto op = create_operation(p);
    VariantPack pack{{k, v, slots, kc, vc, pos}, {kc, vc}};
    Context ctx;
    try {
      run_operation(*op, pack, ctx);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    for (int64_t i = 0; i < kc.numel(); ++i) ASSERT_EQ(kc.data_as<float>()[i], 0.0f);
  };
  ops::ReshapeAndCacheParam p{.apply_rope = true};
  fails(p, Tensor::zeros(DType::kI32, {T + 1}), "one position per token");
  fails(p, Tensor::zeros(DType::kF32, {T}), "positions");
  p.rope.rotary_dim = 5;
  fails(p, Tensor::zeros(DType::kI32, {T}), "must be even");
}

// The fused rope against a float64 rotation: several tokens (each with its own position, some
// far out) and kv heads, both rotations, a partial rotary dim, f32 and bf16 caches, one and two
// threads. Slots no token names stay as poisoned (NaN).
TEST(ReshapeAndCacheRope, MatchesFloat64Rotation) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t T = 5, H = 3, D = 40, bs = 5, blocks = 2;
  const std::vector<int64_t> pos = {0, 7, 3, 1000, 64001}, slot = {4, 0, 9, 2, 7};
  for (DType cdt : {DType::kF32, DType::kBF16})
    for (auto rot : {ops::RopeRotation::kRotateHalf, ops::RopeRotation::kInterleaved})
      for (int64_t rd : {int64_t{0}, int64_t{24}})
        for (int threads : {1, 2}) {
          SCOPED_TRACE(std::string(dtype_name(cdt)) + " rotary_dim " + std::to_string(rd) +
                       (rot == ops::RopeRotation::kInterleaved ? " interleaved" : " half") +
                       " threads " + std::to_string(threads));
          Buffer k = random_tensor(rng, DType::kF32, {T, H, D}, false);
          Buffer v = random_tensor(rng, DType::kF32, {T, H, D}, false);
          Tensor kc = Tensor::empty(cdt, {blocks, H, bs, D}),
                 vc = Tensor::empty(cdt, {blocks, H, bs, D});
          const std::vector<float> nan(static_cast<size_t>(kc.numel()), std::nanf(""));
          convert(kc.data(), cdt, nan.data(), DType::kF32, kc.numel());
          convert(vc.data(), cdt, nan.data(), DType::kF32, vc.numel());
          ops::ReshapeAndCacheParam p{.apply_rope = true};
          p.rope.rotation = rot;
          p.rope.rotary_dim = rd;
          p.rope.theta = 500000.0f;
          ContextOptions opt;
          opt.num_threads = threads;
          Context ctx(opt);
          auto op = create_operation(p);
          ASSERT_NO_THROW(run_operation(*op,
                                        {{k.view, v.view, int_tensor(DType::kI64, slot, {T}), kc,
                                          vc, int_tensor(DType::kI64, pos, {T})},
                                         {kc, vc}},
                                        ctx));
          const Vec kd = to_f64(k.view), vd = to_f64(v.view), kg = to_f64(kc), vg = to_f64(vc);
          const int64_t r = rd ? rd : D, half = r / 2;
          const double tol = cdt == DType::kF32 ? 2e-6 : 8e-3;
          std::vector<bool> used(static_cast<size_t>(blocks * bs), false);
          for (int64_t t = 0; t < T; ++t) {
            const int64_t s = slot[static_cast<size_t>(t)];
            used[static_cast<size_t>(s)] = true;
            for (int64_t h = 0; h < H; ++h) {
              const int64_t src = (t * H + h) * D, dst = ((s / bs * H + h) * bs + s % bs) * D;
              std::vector<double> want(kd.begin() + src, kd.begin() + src + D);
              for (int64_t i = 0; i < half; ++i) {
                const double a = static_cast<double>(pos[static_cast<size_t>(t)]) *
                                 std::pow(500000.0, -2.0 * static_cast<double>(i) / r);
                const int64_t i0 = rot == ops::RopeRotation::kInterleaved ? 2 * i : i;
                const int64_t i1 = rot == ops::RopeRotation::kInterleaved ? 2 * i + 1 : i + half;
                const double x0 = kd[static_cast<size_t>(src + i0)],
                             x1 = kd[static_cast<size_t>(src + i1)];
                want[static_cast<size_t>(i0)] = x0 * std::cos(a) - x1 * std::sin(a);
                want[static_cast<size_t>(i1)] = x1 * std::cos(a) + x0 * std::sin(a);
              }
              for (int64_t x = 0; x < D; ++x) {
                ASSERT_NEAR(kg[static_cast<size_t>(dst + x)], want[static_cast<size_t>(x)],
                            tol * (1.0 + std::abs(want[static_cast<size_t>(x)])))
                    << "k token " << t << " head " << h << " element " << x;
                ASSERT_NEAR(vg[static_cast<size_t>(dst + x)], vd[static_cast<size_t>(src + x)],
                            tol * (1.0 + std::abs(vd[static_cast<size_t>(src + x)])))
                    << "v token " << t << " head " << h << " element " << x;
              }
            }
          }
          for (int64_t s = 0; s < blocks * bs; ++s) {
            if (used[static_cast<size_t>(s)]) continue;
            for (int64_t h = 0; h < H; ++h)
              for (int64_t x = 0; x < D; ++x) {
                const size_t e = static_cast<size_t>(((s / bs * H + h) * bs + s % bs) * D + x);
                ASSERT_TRUE(std::isnan(kg[e]) && std::isnan(vg[e]))
                    << "slot " << s << " was written";
              }
          }
        }
}

}  // namespace
}  // namespace tboost::testing
