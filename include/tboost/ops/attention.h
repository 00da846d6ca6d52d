// The attention family: SelfAttention (flash style), PagedAttention (decode against a KV
// cache, paged or contiguous) and ReshapeAndCache (writes new k/v rows into a cache).
//
// Numerics (all three): f32, bf16 or f16 storage, f32 accumulation and f32 softmax statistics.
// k and v (and the caches) share a dtype, which may differ from q's (a bf16 KV cache under
// f32 activations, say); o has q's dtype. The T x T score matrix never exists: scores live in
// per-thread tiles (see src/kernels/cpu/attention.cc), so working memory is O(threads * tile * D).
//
// ---- SelfAttention ------------------------------------------------------------------------
// Inputs, in this order (the optional ones only when their param is set):
//   0 q  kBSND (B, Sq, Hq, D) | kBNSD (B, Hq, Sq, D) | varlen (Tq, Hq, D)
//   1 k  kBSND (B, Sk, Hkv, D) | kBNSD (B, Hkv, Sk, D) | varlen (Tk, Hkv, D)
//   2 v  as k, with head dim Dv (may differ from D)
//   varlen:      cu_seqlens_q (B+1) i32, cu_seqlens_k (B+1) i32: sequence b owns tokens
//                [cu[b], cu[b+1]) of the packed q / k, v (no padding is computed)
//   alibi:       slopes (Hq) f32
//   custom_mask: additive f32 mask (Sq, Sk) or (B or 1, 1, Sq, Sk), broadcast over heads
//                (prefix-LM, cross-modal, padding masks); -inf entries hide a key (a finite
//                entry, even -FLT_MAX, only makes it improbable, as in exact arithmetic)
// Outputs: 0 o with q's layout and dtype and head dim Dv;
//          1 lse f32, the natural-log log-sum-exp of each row's scaled, biased scores:
//            (B, Hq, Sq), or (Hq, Tq) for varlen. Kept for the backward pass.
// Hq must be a multiple of Hkv (GQA / MQA: q head h reads kv head h / (Hq / Hkv)).
// Query i of a sequence of Sq queries and Sk keys sits at position i + (Sk - Sq) on the key
// axis (bottom-right alignment: prefill after a cached prefix, chunked prefill).
// A key j is visible to query i when
//   causal:            j <= i + Sk - Sq
//   window_left  >= 0: j >= i + Sk - Sq - window_left    (sliding window)
//   window_right >= 0: j <= i + Sk - Sq + window_right
// (a window of 2^30 or more, e.g. INT32_MAX, is the same as -1: no sequence is that long)
// Score of a visible key: scale * q.k  - slope * |i + Sk - Sq - j| (alibi)  + mask[i][j].
// A row with no visible key (or only -inf ones) outputs zeros and lse = -inf, never NaN.
//
// ---- KV caches ----------------------------------------------------------------------------
// One layout for both kinds: key_cache (num_blocks, Hkv, block_size, D), value_cache
// (num_blocks, Hkv, block_size, Dv), f32, bf16 or f16 whatever the activation dtype. A paged cache
// maps token t of sequence b to block block_tables[b][t / block_size], row t % block_size
// (the vLLM scheme); a contiguous cache is the same tensor with num_blocks = B and
// block_size = capacity, sequence b owning block b.
//
// ---- PagedAttention -----------------------------------------------------------------------
// Decode (and chunked prefill) against a cache that already holds the new tokens' k and v.
// Inputs: 0 q (B, Sq, Hq, D); 1 key_cache; 2 value_cache; 3 context_lens (B) i32, the number
// of valid tokens of each sequence (its Sq new tokens included); 4 block_tables
// (B, max_blocks) i32 (paged only). Outputs: 0 o (B, Sq, Hq, Dv) in q's dtype; 1 lse
// (B, Hq, Sq) f32. Query i of sequence b sits at position context_lens[b] - Sq + i and sees
// keys [max(0, pos - window_left), pos] (causal; window_left -1: unbounded). Each sequence
// may have its own length. The cache is split along the tokens and the pieces are merged by
// log-sum-exp (flash-decoding), so all threads stay busy at batch 1.
//
// ---- ReshapeAndCache ----------------------------------------------------------------------
// Inputs: 0 k (T, Hkv, D); 1 v (T, Hkv, Dv); 2 slot_mapping (T) i32 or i64; 3 key_cache;
// 4 value_cache. Outputs: 0 key_cache, 1 value_cache: the very same views as inputs 3 and 4
// (the caches are updated in place). Token t goes to slot s = slot_mapping[t]: block
// s / block_size, row s % block_size (contiguous cache: s = b * capacity + position); a
// negative slot skips the token (padding). Converts to the cache dtype with rounding to
// nearest even. With apply_rope, input 5 holds each token's position and k is rotated (Rope's
// formula) as it is written; the new tokens' k then never exists unrotated in the cache.
#pragma once

#include <cstdint>

#include "tboost/ops/rope.h"  // QkvLayout

namespace tboost::ops {

struct AttentionParam {
  QkvLayout layout = QkvLayout::kBSND;  // ignored when varlen (packed (T, H, D))
  float scale = 0.0f;                   // 0: 1 / sqrt(D)
  bool causal = false;
  int64_t window_left = -1;   // -1: unbounded
  int64_t window_right = -1;  // -1: unbounded
  bool alibi = false;
  bool custom_mask = false;
  bool varlen = false;
  bool operator==(const AttentionParam&) const = default;
};

struct PagedAttentionParam {
  float scale = 0.0f;  // 0: 1 / sqrt(D)
  bool paged = true;   // false: contiguous cache, no block_tables input
  int64_t window_left = -1;
  bool operator==(const PagedAttentionParam&) const = default;
};

struct ReshapeAndCacheParam {
  // Rope fused into the cache write: k is rotated on its way into the cache (v is not), with
  // input 5 = positions (T) i32 or i64 and these rope params (layout ignored: k is (T, Hkv, D)).
  // The rotated k never exists outside the cache (the graph pass rope_cache_write makes this).
  bool apply_rope = false;
  RopeParam rope{};
  bool operator==(const ReshapeAndCacheParam&) const = default;
};

}  // namespace tboost::ops
