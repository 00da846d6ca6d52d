// Shared pieces of the op benchmarks: the runner (options, context, limits, output), input
// filling and prepared op calls. Each benchmark family lives in its own file.
#pragma once

#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "tboost/tboost.h"

namespace tboost::bench {

struct Runner {
  const Options& opt;
  Context& ctx;
  Limits lim;
  std::vector<Result>& rows;
  const std::function<void(const Result&)>& progress;
  std::regex re;

  bool want(const std::string& name) const {
    return opt.filter.empty() || std::regex_search(name, re);
  }
  void emit(Result r) {
    r.threads = ctx.num_threads();
    if (progress) progress(r);
    rows.push_back(std::move(r));
  }
  double budget() const { return opt.quick ? 0.3 : 1.0; }
};

// Fills a tensor with values in [lo, hi) from a cheap LCG (never all zeros).
inline Tensor filled(DType dt, const Shape& shape, uint32_t seed, float lo = -1.0f,
                     float hi = 1.0f) {
  Tensor t = Tensor::empty(dt, shape);
  const int64_t n = t.numel();
  std::vector<float> tmp(static_cast<size_t>(std::max<int64_t>(1, std::min<int64_t>(n, 1 << 20))));
  uint32_t s = seed * 2654435761u + 12345u;
  // One stream over the whole tensor (fill_random); a repeated 4 MiB block had made the "copy"
  // baseline read from cache at 80-99 GB/s on a 50 GB/s machine.
  for (int64_t i = 0; i < n; i += static_cast<int64_t>(tmp.size())) {
    fill_random(tmp.data(), static_cast<int64_t>(tmp.size()), &s, lo, hi);
    const int64_t m = std::min<int64_t>(static_cast<int64_t>(tmp.size()), n - i);
    convert(static_cast<char*>(t.data()) + i * static_cast<int64_t>(dtype_size(dt)), dt, tmp.data(),
            DType::kF32, m);
  }
  return t;
}

// A prepared op call: create + setup once; the timed loop only executes.
struct Call {
  std::unique_ptr<Operation> op;
  VariantPack pack;
  std::shared_ptr<void> ws;
  size_t ws_size = 0;
  Call(const AnyParam& p, std::vector<Tensor> in, std::vector<Tensor> out, Context& ctx)
      : op(create_operation(p)), pack{std::move(in), std::move(out)} {
    ws_size = op->setup(pack, ctx);
    if (ws_size) ws = aligned_buffer(ws_size);
  }
  void operator()(Context& ctx) { op->execute(pack, ws.get(), ws_size, ctx); }
};

inline double spread(const Timing& t) { return (t.max - t.min) / t.median; }

// The attention family (bench/ops/attention_benchmarks.cc).
void attention_benchmarks(Runner& R);
// The graph layer: op-by-op layers fused vs unfused, two-stage executor (bench/graph/).
void graph_benchmarks(Runner& R);

}  // namespace tboost::bench
