// Whole-model benchmark, llama-bench style: pp = one prompt of `prompt` tokens; tg = `gen`
// single-token decode steps; each from a cache holding `depth` tokens (-d, prefilled untimed;
// 0: empty), repeated `reps` times after one untimed warm-up (graph plans, packed weights),
// medians and standard deviations.
// The decode floor is measured in turn with the decode: every kReadEvery tokens of each tg
// run, the clock stops and a plain read of the very weights a step streams (every matrix once;
// OptimizedTransformer::decode_weights) is timed on the same threads. Each run's floor is its
// own reads' median, so a change in the host's memory speed (PERF.md: 2x within minutes on
// some hosts) hits the decode and its floor alike; a read taken once before or after the runs
// had put the floor fraction anywhere from 0.47 to 1.24 for one build.
#include "tools/tboost/model_bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/bench.h"
#include "tboost/core/error.h"
#include "tboost/model/model.h"

namespace tboost::tools {
namespace {

using model::OptimizedTransformer;

struct Stat {
  double median = 0, sd = 0;
};
Stat stats(std::vector<double> v) {
  Stat s;
  if (v.empty()) return s;
  s.median = median(v);
  double mean = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  s.sd = v.size() > 1 ? std::sqrt(var / static_cast<double>(v.size() - 1)) : 0.0;
  return s;
}

}  // namespace

std::vector<int32_t> random_ids(int64_t n, int64_t V, uint32_t seed) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v.push_back(static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(V)));
  }
  return v;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_model_bench(const ModelBenchArgs& a) {
  model::LoadOptions lo;
  lo.dtype = parse_dtype(a.dtype);
  lo.threads = a.threads;
  lo.load = a.mmap ? model::SafeTensors::Load::kMmap : model::SafeTensors::Load::kRead;
  if (a.pack) lo.pack_weights = true;
  std::unique_ptr<OptimizedTransformer> m =
      a.model.empty() ? OptimizedTransformer::from_config(model::ModelConfig::builtin(a.config), lo)
                      : OptimizedTransformer::from_pretrained(a.model, lo);
  const model::ModelConfig& c = m->config();
  if (!c.causal()) throw Error(ErrorCode::kInvalidArgument, "bench needs a causal LM");
  const int threads = m->context().num_threads();
  const int64_t need = a.depth + std::max(a.prompt, a.gen);
  model::TuningParams tp = m->tuning_params();
  tp.max_seq_length = std::max<int64_t>(need, 1);
  if (need > c.max_positions)
    throw Error(ErrorCode::kInvalidArgument, "-d + max(-p, -n) = " + std::to_string(need) +
                                                 " tokens, longer than the context (" +
                                                 std::to_string(c.max_positions) + ")");
  tp.prefill_chunk = std::max<int64_t>(a.prompt, 512);  // pp in one chunk; depth in chunks
  if (!a.cache_dtype.empty()) tp.cache_dtype = parse_dtype(a.cache_dtype);
  m->set_tuning_params(tp);
  const int64_t V = c.vocab;
  const std::vector<Tensor> dw = m->decode_weights();
  double streamed = 0;  // bytes the floor reads: weight_bytes_per_token less one embedding row
  for (const Tensor& t : dw) streamed += static_cast<double>(t.nbytes());
  auto read_weights = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    bench::read_tensors(dw, threads);
    return seconds_since(t0);
  };
  const double bpt = static_cast<double>(m->weight_bytes_per_token());
  // KV bytes a decode step reads, on average over the tg run: every layer's k and v rows of
  // the context (depth + the step's position).
  const DType cache_dt = tp.cache_dtype.value_or(m->dtype());
  const double kv_bpt = (static_cast<double>(a.depth) + static_cast<double>(a.gen + 1) / 2.0) *
                        static_cast<double>(c.layers * 2 * c.kv_heads * c.head_dim) *
                        static_cast<double>(dtype_size(cache_dt));
  // A session whose sequence holds `depth` tokens already (untimed): prefilled in prompt-sized
  // chunks, as a long prompt would be.
  auto session_at_depth = [&](uint32_t seed, int* q) {
    auto s = m->new_session(1);
    *q = s->add_sequence();
    if (a.depth > 0) s->forward({*q}, {random_ids(a.depth, V, seed)});
    return s;
  };
  constexpr int64_t kReadEvery = 16;
  std::vector<double> pp, tg, frac, frac_kv, reads_all;
  for (int r = 0; r <= a.reps; ++r) {  // r = 0: warm-up
    if (a.prompt > 0) {
      int q = 0;
      auto s = session_at_depth(static_cast<uint32_t>(r + 500), &q);
      const auto p = random_ids(a.prompt, V, static_cast<uint32_t>(r + 1));
      const auto t0 = std::chrono::steady_clock::now();
      s->forward({q}, {p});
      const double t = seconds_since(t0);
      if (r > 0) pp.push_back(static_cast<double>(a.prompt) / t);
    }
    if (a.gen > 0) {
      int q = 0;
      auto s = session_at_depth(static_cast<uint32_t>(r + 700), &q);
      const auto g = random_ids(a.gen, V, static_cast<uint32_t>(100 + r));
      double t = 0;
      std::vector<double> reads;
      for (int64_t i = 0; i < a.gen; ++i) {
        if (r > 0 && i % kReadEvery == 0) reads.push_back(read_weights());
        const auto t0 = std::chrono::steady_clock::now();
        s->forward({q}, {{g[static_cast<size_t>(i)]}});
        t += seconds_since(t0);
      }
      if (r > 0) {
        const double tps = static_cast<double>(a.gen) / t, read_s = median(reads);
        tg.push_back(tps);
        // Floor tokens/s = (streamed / read_s) / bytes per token.
        frac.push_back(tps * read_s * bpt / streamed);
        frac_kv.push_back(tps * read_s * (bpt + kv_bpt) / streamed);
        reads_all.insert(reads_all.end(), reads.begin(), reads.end());
      }
    }
  }
  if (reads_all.empty())  // no decode runs: the read alone, for the report
    for (int i = 0; i < 5; ++i) reads_all.push_back(read_weights());
  // Peak RSS (the floor reads the model's own weights: no buffer of its own).
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double rss = static_cast<double>(ru.ru_maxrss) * 1024.0;
  const Stat sp = stats(pp), sg = stats(tg);
  const double read_gbps = streamed / median(reads_all) / 1e9;
  const double floor_tps = read_gbps * 1e9 / bpt;
  // The median over runs of each run's tokens/s against its own in-turn floor.
  const double floor_frac = median(frac);
  const std::string name = a.model.empty() ? a.config : a.model;
  if (a.json) {
    nlohmann::json j;
    j["model"] = name;
    j["dtype"] = a.dtype;
    j["cache_dtype"] = dtype_name(tp.cache_dtype.value_or(m->dtype()));
    j["threads"] = threads;
    j["pp_tokens_per_s"] = sp.median;
    j["pp_sd"] = sp.sd;
    j["tg_tokens_per_s"] = sg.median;
    j["tg_sd"] = sg.sd;
    j["weight_bytes_per_token"] = bpt;
    j["tg_floor_fraction"] = floor_frac;
    j["pp_runs"] = pp;  // each run's figure, as the peers' scripts print them
    j["tg_runs"] = tg;
    j["tg_floor_fractions"] = frac;
    j["depth"] = a.depth;
    // The KV rows a step reads (mean over the run) and the floor fraction counting them with
    // the weights: at depth the cache is a real part of a step's bytes.
    j["kv_bytes_per_token"] = kv_bpt;
    j["tg_floor_fraction_with_kv"] = median(frac_kv);
    j["peak_rss_bytes"] = rss;
    j["dram_read_gbps"] = read_gbps;
    j["prompt_tokens"] = a.prompt;
    j["gen_tokens"] = a.gen;
    j["reps"] = a.reps;
    j["weights"] = a.mmap ? "mmap" : "read into memory";
    j["pack_weights"] = m->packs_weights();
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s\n", m->describe(a.prompt).c_str());
    std::printf("| model | dtype | threads | test | t/s |\n|---|---|---|---|---|\n");
    const std::string at =
        a.depth > 0 ? " @ d" + std::to_string(static_cast<long long>(a.depth)) : "";
    if (a.prompt > 0)
      std::printf("| %s | %s | %d | pp%lld%s | %.2f ± %.2f |\n", name.c_str(), a.dtype.c_str(),
                  threads, static_cast<long long>(a.prompt), at.c_str(), sp.median, sp.sd);
    if (a.gen > 0)
      std::printf("| %s | %s | %d | tg%lld%s | %.2f ± %.2f |\n", name.c_str(), a.dtype.c_str(),
                  threads, static_cast<long long>(a.gen), at.c_str(), sg.median, sg.sd);
    std::printf(
        "decode floor: %.1f MB of weights per token / %.1f GB/s (a plain read of those weights, "
        "in turn with the decode) = %.1f tok/s; tg at %.0f%% of it (median over runs, each "
        "against its own reads). Peak RSS %.0f MB. Weights %s.\n",
        bpt / 1e6, read_gbps, floor_tps, 100.0 * floor_frac, rss / 1e6,
        a.mmap ? "memory-mapped" : "read into memory");
    if (a.depth > 0 && a.gen > 0)
      std::printf(
          "At depth %lld a step also reads %.1f MB of KV cache (mean over the run): tg at %.0f%% "
          "of the floor counting weights and cache.\n",
          static_cast<long long>(a.depth), kv_bpt / 1e6, 100.0 * median(frac_kv));
  }
  return 0;
}

}  // namespace tboost::tools
