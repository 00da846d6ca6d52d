// OptimizedTransformer: a Hugging Face checkpoint (GPT-2, LLaMA family, BERT) run through the
// graph layer.
//
// The model is compiled into fused graphs (graph/graph.h): every layer is a handful of fused
// ops (norms with the residual add, Linear with bias / activation / residual epilogues,
// SwiGLU as the gate projection's epilogue, rope, flash attention or paged decode attention,
// the rope-fused KV-cache write), planned into one arena per input shape (graph/executor.h).
// A causal LM has two graphs sharing the weights:
//   prefill  fresh sequences packed without padding (varlen flash attention over the prompt;
//            k and v are written into the cache);
//   extend   B sequences with Sq new tokens each against what the cache holds (decode: Sq = 1;
//            later chunks of a chunked prefill: B = 1, Sq = chunk), paged decode attention.
// Logits are computed only for the rows asked for (the last token of each sequence when
// generating, all of them for perplexity).
//
// Weights: the checkpoint's own memory when its dtype is the model's (zero copy); converted
// once at load otherwise (and GPT-2's Conv1D (in, out) matrices transposed to (out, in)).
// Every tensor is checked against the config (present, shape, dtype); errors name the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tboost/core/context.h"
#include "tboost/core/tensor.h"
#include "tboost/model/config.h"
#include "tboost/model/safetensors.h"

namespace tboost::model {

// set_tuning_params: how the KV cache and prefill are laid out.
struct TuningParams {
  int64_t max_seq_length = 0;  // context limit per sequence (KV capacity); 0: config's max
  // KV-cache page, tokens. 64 rather than vLLM's 16: a decode task reads a page's rows of its
  // kv heads in one run, and each page costs every head a call of the dots and of the P·V. From
  // L3 (bf16), the dots and the P·V took 15-20% more cycles with 16-key pages than with 256-key
  // ones at GQA-4, head dim 128, and 40-50% more than with 64-key ones at MHA, head dim 64. In
  // the models, sessions alternated in one process at depth 1024: llama-110m bf16 decoded 1.8%
  // faster (median of 12 pairs in the fast mode, 10 faster), SmolLM2-135M bf16 2.5-6.3% (7 of 8
  // pairs, one -7%), llama-1b bf16 and llama-110m f32 even; at depth 0 the two were even
  // (bench/RESULTS.md, twenty-eighth session). On AMX CPUs bf16 GQA decode takes the tile path
  // from 64-key pages on (kAmxPiece); not re-measured there with this default.
  int64_t block_size = 64;
  bool paged = true;  // false: one contiguous cache block per sequence
  // Prompts longer than prefill_chunk tokens are prefilled in chunks of that many tokens (the
  // first through flash attention, the rest against the cache): activation memory stays
  // bounded by the chunk, not the prompt.
  bool enable_dynamic_chunk = true;
  int64_t prefill_chunk = 512;
  // KV-cache storage, f32 or bf16; unset: the model's dtype. A bf16 cache for an f32 model
  // halves the cache's memory and the bytes each decode step reads from it (llama.cpp keeps
  // f16 caches by default); keys and values are rounded to bf16 once, when written. Applies to
  // sessions made after the call.
  std::optional<DType> cache_dtype;
};

struct LoadOptions {
  DType dtype = DType::kF32;  // weights and activations (f32 or bf16)
  SafeTensors::Load load = SafeTensors::Load::kRead;
  int threads = 0;  // 0: all cores
  // Prefill's GEMMs (oneDNN) read each linear weight from a second copy in oneDNN's blocked
  // layout: twice the weight memory. On Zen 5 that bought 3-15% faster prefill (llama-110m
  // and llama-1b, bench/RESULTS.md, "Zen 5, twenty-sixth session"), at 1.5-1.8x the peak RSS.
  // false: weights are held once, as loaded, and read in place. Unset: packed only on CPUs with
  // AMX, whose tile kernels read blocked weights (in place there is not measured). Decode (the
  // GEMV) reads the weights in place either way.
  std::optional<bool> pack_weights = std::nullopt;
};

class OptimizedTransformer {
 public:
  // config.json + safetensors in `dir`.
  static std::unique_ptr<OptimizedTransformer> from_pretrained(const std::string& dir,
                                                               const LoadOptions& opt = {});
  // Random weights (normal, std 0.02; norms 1) from a fixed seed: benchmarks and tests.
  static std::unique_ptr<OptimizedTransformer> from_config(const ModelConfig& config,
                                                           const LoadOptions& opt = {},
                                                           uint64_t seed = 1);
  ~OptimizedTransformer();

  const ModelConfig& config() const;
  DType dtype() const;
  Context& context();
  void set_tuning_params(const TuningParams& p);
  const TuningParams& tuning_params() const;
  // Bytes of weight memory the model reads: all weights, and those one decode step streams
  // (every matrix once, one embedding row).
  size_t weight_bytes() const;
  size_t weight_bytes_per_token() const;
  // Whether prefill reads packed copies of the weights (LoadOptions::pack_weights, resolved).
  bool packs_weights() const;
  // The weight tensors one decode step streams in full (every matrix, bias and norm once; the
  // embedding table, of which a step reads one row, is left out): a benchmark reads them in
  // turn with the decode as its bandwidth floor.
  std::vector<Tensor> decode_weights() const;
  // Fused-graph report of one layer stack at `tokens` prefill tokens (ops, bytes, arena).
  std::string describe(int64_t tokens) const;

  // ---- causal LMs: sequences in a KV cache (at most max_batch at once)
  class Session {
   public:
    ~Session();
    // A new, empty sequence; returns its handle. Throws when max_batch are live.
    int add_sequence();
    void remove_sequence(int seq);
    int64_t length(int seq) const;  // tokens in the cache
    // Appends tokens to each listed sequence (prefill or decode; sequences may differ in
    // length) and returns f32 logits: one row per sequence (its last new token), or, with
    // all_logits, one row per new token (sequence after sequence). Throws (and leaves every
    // sequence as it was) when a sequence would outgrow max_seq_length or an id is out of range.
    Tensor forward(const std::vector<int>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                   bool all_logits = false);

   private:
    friend class OptimizedTransformer;
    struct Impl;
    explicit Session(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
  };
  std::unique_ptr<Session> new_session(int64_t max_batch = 1);

  // ---- encoders (BERT): last hidden states (f32, one (len, hidden) tensor per sequence) and
  // mean-pooled embeddings. type_ids may be empty (all 0).
  std::vector<Tensor> encode(const std::vector<std::vector<int32_t>>& ids,
                             const std::vector<std::vector<int32_t>>& type_ids = {});
  std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>>& ids,
                                        const std::vector<std::vector<int32_t>>& type_ids = {},
                                        bool normalize = true);

 private:
  struct Impl;
  explicit OptimizedTransformer(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Impl> make_impl(const ModelConfig& cfg, const LoadOptions& opt);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tboost::model
