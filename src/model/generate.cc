// Sampling and the generate loop (include/tboost/model/generate.h).
#include "tboost/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "tboost/core/error.h"

namespace tboost::model {

Sampler::Sampler(const SamplingParams& p, uint64_t stream) : p_(p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    throw Error(ErrorCode::kInvalidArgument, "temperature must be >= 0");
  if (p.top_k < 0) throw Error(ErrorCode::kInvalidArgument, "top_k must be >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    throw Error(ErrorCode::kInvalidArgument, "top_p must be in (0, 1]");
  if (!(p.repetition_penalty > 0.0f))
    throw Error(ErrorCode::kInvalidArgument, "repetition_penalty must be > 0");
  std::seed_seq seq{static_cast<uint32_t>(p.seed), static_cast<uint32_t>(p.seed >> 32),
                    static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  rng_.seed(seq);
}

int32_t Sampler::next(const float* logits, int64_t V, const std::vector<int32_t>& history) {
  work_.assign(logits, logits + V);
  if (p_.repetition_penalty != 1.0f) {
    // Once per distinct token seen, however often it occurred (as Hugging Face does).
    std::vector<int32_t> seen(history);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen)
      if (id >= 0 && id < V) {
        float& l = work_[static_cast<size_t>(id)];
        l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
      }
  }
  if (p_.temperature == 0.0f)
    return static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  // Candidates sorted by logit (descending, ties by id), cut by top-k.
  idx_.resize(static_cast<size_t>(V));
  std::iota(idx_.begin(), idx_.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) {
    const float la = work_[static_cast<size_t>(a)], lb = work_[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  int64_t n = V;
  if (p_.top_k > 0 && p_.top_k < V) {
    n = p_.top_k;
    std::partial_sort(idx_.begin(), idx_.begin() + n, idx_.end(), by_logit);
  } else {
    std::sort(idx_.begin(), idx_.end(), by_logit);
  }
  // Softmax of logit / temperature over the candidates, in double.
  const double mx = work_[static_cast<size_t>(idx_[0])];
  std::vector<double> prob(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    prob[static_cast<size_t>(i)] =
        std::exp((work_[static_cast<size_t>(idx_[static_cast<size_t>(i)])] - mx) / p_.temperature);
    sum += prob[static_cast<size_t>(i)];
  }
  // Top-p: keep the shortest prefix whose probability reaches top_p (at least one token).
  if (p_.top_p < 1.0f) {
    double acc = 0.0;
    int64_t keep = 0;
    while (keep < n) {
      acc += prob[static_cast<size_t>(keep)] / sum;
      ++keep;
      if (acc >= p_.top_p) break;
    }
    n = keep;
    sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += prob[static_cast<size_t>(i)];
  }
  const double u = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    acc += prob[static_cast<size_t>(i)];
    if (u < acc) return idx_[static_cast<size_t>(i)];
  }
  return idx_[static_cast<size_t>(n - 1)];
}

std::vector<std::vector<int32_t>> generate(OptimizedTransformer& model,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerationConfig& cfg,
                                           const std::function<void(size_t, int32_t)>& on_token,
                                           GenerationStats* stats) {
  using clock = std::chrono::steady_clock;
  if (prompts.empty()) throw Error(ErrorCode::kInvalidArgument, "generate: no prompts");
  if (cfg.max_new_tokens < 0)
    throw Error(ErrorCode::kInvalidArgument, "generate: max_new_tokens must be >= 0");
  const size_t B = prompts.size();
  const int64_t V = model.config().vocab;
  auto session = model.new_session(static_cast<int64_t>(B));
  std::vector<int> seqs;
  std::vector<Sampler> samplers;
  std::vector<std::vector<int32_t>> hist(prompts), out(B);
  GenerationStats st;
  for (size_t i = 0; i < B; ++i) {
    seqs.push_back(session->add_sequence());
    samplers.emplace_back(cfg.sampling, i);
    st.prompt_tokens += static_cast<int64_t>(prompts[i].size());
  }
  if (cfg.max_new_tokens == 0) {
    if (stats) *stats = st;
    return out;
  }
  // Context check up front: a prompt plus its new tokens must fit.
  const int64_t cap =
      model.tuning_params().max_seq_length > 0
          ? std::min(model.tuning_params().max_seq_length, model.config().max_positions)
          : model.config().max_positions;
  for (size_t i = 0; i < B; ++i)
    if (static_cast<int64_t>(prompts[i].size()) + cfg.max_new_tokens > cap + 1)
      throw Error(ErrorCode::kInvalidArgument,
                  "generate: prompt " + std::to_string(i) + " has " +
                      std::to_string(prompts[i].size()) + " tokens; with " +
                      std::to_string(cfg.max_new_tokens) +
                      " new tokens that is longer than the context (" + std::to_string(cap) + ")");
  auto t0 = clock::now();
  Tensor logits = session->forward(seqs, prompts);
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  std::vector<char> live(B, 1);
  std::vector<size_t> rows(B);
  for (size_t i = 0; i < B; ++i) rows[i] = i;
  t0 = clock::now();
  for (int64_t step = 0;; ++step) {
    std::vector<int> next_seqs;
    std::vector<std::vector<int32_t>> next_toks;
    std::vector<size_t> next_rows;
    for (size_t i = 0; i < B; ++i) {
      if (!live[i]) continue;
      const int32_t id =
          samplers[i].next(logits.data_as<float>() + static_cast<int64_t>(rows[i]) * V, V, hist[i]);
      out[i].push_back(id);
      hist[i].push_back(id);
      ++st.generated_tokens;
      if (on_token) on_token(i, id);
      const bool stop =
          std::find(cfg.stop_ids.begin(), cfg.stop_ids.end(), id) != cfg.stop_ids.end();
      if (stop || static_cast<int64_t>(out[i].size()) >= cfg.max_new_tokens) {
        live[i] = 0;
        continue;
      }
      next_rows.push_back(i);
      next_seqs.push_back(seqs[i]);
      next_toks.push_back({id});
    }
    if (next_seqs.empty()) break;
    logits = session->forward(next_seqs, next_toks);
    for (size_t j = 0; j < next_rows.size(); ++j) rows[next_rows[j]] = j;
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (stats) *stats = st;
  return out;
}

}  // namespace tboost::model
