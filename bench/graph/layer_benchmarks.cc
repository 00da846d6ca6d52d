// Graph benchmarks: one GPT-2 and one LLaMA layer written op by op (the exporter's form), run
// as is ("unfused") and after the fusion passes, in the same run, alternating; and the
// two-stage executor (TUNE_OP_EXE_ASYNC) against the synchronous one.
//
// Rows "layer_{gpt2,llama}[C=..,T=..]": speedup_vs_baseline = unfused time / fused time,
// bytes_ratio_vs_baseline = fused / unfused bytes moved (each op's reads + writes), working
// bytes = the fused graph's planned activation arena. Rows "graph_exec_two_stage[...]":
// baseline "sync", the same fused graph with every call at a new shape (so every node is set
// up again each call, as in decode where the KV length grows) or at a repeated shape.
#include <omp.h>

#include <cmath>
#include <cstdio>

#include "bench/ops/runner.h"
#include "tboost/graph/executor.h"
#include "tboost/graph/layers.h"
#include "tboost/graph/passes.h"

namespace tboost::bench {
namespace {

struct GraphCall {
  std::unique_ptr<graph::GraphExecutor> ex;
  VariantPack pack;
  GraphCall(const graph::Graph& g, std::vector<Tensor> in, Context& ctx,
            graph::ExecOptions opt = {})
      : ex(graph::make_graph_executor(std::make_shared<graph::Graph>(g), opt)) {
    pack.inputs = std::move(in);
    std::vector<TensorDesc> d;
    for (const Tensor& t : pack.inputs) d.push_back(t.desc());
    for (const TensorDesc& o : ex->infer_shape(d))
      pack.outputs.push_back(Tensor::empty(o.dtype, o.shape()));
    ex->setup(pack, ctx);
  }
  void operator()(Context& ctx) { ex->execute(pack, nullptr, 0, ctx); }
};

double max_rel_diff(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  const float* x = a.data_as<float>();
  const float* y = b.data_as<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    num = std::max(num, std::abs(double(x[i]) - double(y[i])));
    den = std::max(den, std::abs(double(y[i])));
  }
  return num / std::max(den, 1e-30);
}

std::vector<Tensor> layer_inputs(bool llama, int64_t batch, int64_t t, int64_t c) {
  std::vector<Tensor> in = {filled(DType::kF32, {batch, t, c}, 7)};
  if (llama) {
    Tensor p = Tensor::empty(DType::kI32, {batch, t});
    for (int64_t i = 0; i < batch * t; ++i) p.data_as<int32_t>()[i] = static_cast<int32_t>(i % t);
    in.push_back(p);
  }
  return in;
}

void layer_cases(Runner& R) {
  struct Case {
    bool llama;
    int64_t hidden, heads, ffn, kv_heads;
  };
  // LLaMA at hidden 2048 is the ~1B shape: 32 heads of 64, 8 K/V heads (written as repeat_kv).
  const Case cases[] = {{false, 768, 12, 3072, 0},
                        {true, 768, 12, 2048, 0},
                        {false, 2048, 16, 8192, 0},
                        {true, 2048, 32, 5632, 8}};
  for (const Case& c : cases) {
    const int64_t T = R.opt.quick ? 256 : 2048;
    if (R.opt.quick && c.hidden > 768) continue;
    char name[96];
    if (c.kv_heads)
      std::snprintf(name, sizeof name, "layer_%s[C=%lld,Hkv=%lld,T=%lld]",
                    c.llama ? "llama" : "gpt2", static_cast<long long>(c.hidden),
                    static_cast<long long>(c.kv_heads), static_cast<long long>(T));
    else
      std::snprintf(name, sizeof name, "layer_%s[C=%lld,T=%lld]", c.llama ? "llama" : "gpt2",
                    static_cast<long long>(c.hidden), static_cast<long long>(T));
    if (!R.want(name)) continue;
    const graph::LayerShape shp{
        .hidden = c.hidden, .heads = c.heads, .kv_heads = c.kv_heads, .ffn = c.ffn, .seq = T};
    const graph::Graph unfused = c.llama ? graph::llama_layer(shp) : graph::gpt2_layer(shp);
    const std::vector<Tensor> in = layer_inputs(c.llama, 1, T, c.hidden);
    std::vector<TensorDesc> d;
    for (const Tensor& t : in) d.push_back(t.desc());
    graph::Graph fused = unfused;
    const graph::OptimizeResult opt = graph::optimize(fused, d);
    const graph::GraphReport ru = graph::report(unfused, d), rf = graph::report(fused, d);
    GraphCall fu(fused, in, R.ctx), un(unfused, in, R.ctx);
    const auto [tf, tu] = time_pair([&] { fu(R.ctx); }, [&] { un(R.ctx); }, 2.0 * R.budget(), 10);
    Result r;
    r.name = name;
    r.dtype = "f32";
    r.seconds = tf.median;
    r.spread = spread(tf);
    r.flops = static_cast<double>(rf.flops);
    r.bytes = static_cast<double>(rf.bytes_moved);
    r.gflops = r.flops / tf.median / 1e9;
    r.floor_fraction =
        std::max(r.flops / (R.lim.fma_gflops * 1e9), r.bytes / (R.lim.copy_gbps * 1e9)) / tf.median;
    r.baseline = "unfused";
    r.speedup_vs_baseline = tu.median / tf.median;
    r.bytes_ratio_vs_baseline =
        static_cast<double>(rf.bytes_moved) / static_cast<double>(ru.bytes_moved);
    r.working_bytes = static_cast<double>(rf.memory.arena_bytes);
    std::string fired;
    for (const auto& [p, n] : opt.fired)
      if (n > 0 && p != "dead_nodes")
        fired += (fired.empty() ? "" : " ") + p + "x" + std::to_string(n);
    char note[512];
    std::snprintf(note, sizeof note,
                  "ops %lld -> %lld; bytes %.2f -> %.2f GB; arena %.1f -> %.1f MiB (naive %.1f -> "
                  "%.1f, fragmentation %.3f); unfused %.1f ms; max |fused - unfused| / max|y| "
                  "%.1e; fired: %s",
                  static_cast<long long>(ru.ops), static_cast<long long>(rf.ops),
                  ru.bytes_moved / 1e9, rf.bytes_moved / 1e9, ru.memory.arena_bytes / 1048576.0,
                  rf.memory.arena_bytes / 1048576.0, ru.memory.naive_bytes / 1048576.0,
                  rf.memory.naive_bytes / 1048576.0, rf.memory.fragmentation(), tu.median * 1e3,
                  max_rel_diff(fu.pack.outputs[0], un.pack.outputs[0]), fired.c_str());
    r.note = note;
    R.emit(r);
  }
}

// Two-stage vs sync executor on a fused LLaMA layer. "new shape every call": the batch
// alternates 1, 2, 1, 2 at T = 1 (decode-sized), so every node is set up on every call;
// "repeated shape": the steady state, where setups are skipped and two-stage has nothing to
// overlap.
void executor_cases(Runner& R) {
  struct Case {
    int64_t hidden, heads, ffn, T;
    bool alternate;
  };
  const Case cases[] = {{256, 4, 688, 1, true},
                        {768, 12, 2048, 1, true},
                        {768, 12, 2048, 1, false},
                        {768, 12, 2048, 512, true}};
  for (const Case& c : cases) {
    char name[128];
    std::snprintf(name, sizeof name, "graph_exec_two_stage[C=%lld,T=%lld,%s]",
                  static_cast<long long>(c.hidden), static_cast<long long>(c.T),
                  c.alternate ? "new_shape_every_call" : "repeated_shape");
    if (!R.want(name)) continue;
    const graph::LayerShape shp{
        .hidden = c.hidden, .heads = c.heads, .ffn = c.ffn, .seq = c.T, .causal = c.T > 1};
    graph::Graph g = graph::llama_layer(shp);
    const std::vector<Tensor> in1 = layer_inputs(true, 1, c.T, c.hidden),
                              in2 = layer_inputs(true, 2, c.T, c.hidden);
    std::vector<TensorDesc> d;
    for (const Tensor& t : in1) d.push_back(t.desc());
    graph::optimize(g, d);
    GraphCall sync(g, in1, R.ctx, {.async = 0}), two(g, in1, R.ctx, {.async = 1});
    GraphCall sync2(g, in2, R.ctx, {.async = 0}), two2(g, in2, R.ctx, {.async = 1});
    // Both shapes through one executor: sync2 / two2 only provide the batch-2 packs.
    // Each side flips its own batch: every call of a side differs in shape from its previous.
    int flip_two = 0, flip_sync = 0;
    auto step = [&](GraphCall& a, GraphCall& b, int& flip) {
      GraphCall& p = (c.alternate && (flip++ & 1)) ? b : a;
      a.ex->execute(p.pack, nullptr, 0, R.ctx);
    };
    const auto [tt, ts] = time_pair([&] { step(two, two2, flip_two); },
                                    [&] { step(sync, sync2, flip_sync); }, R.budget(), 200);
    Result r;
    r.name = name;
    r.dtype = "f32";
    r.seconds = tt.median;
    r.spread = spread(tt);
    r.baseline = "sync";
    r.speedup_vs_baseline = ts.median / tt.median;
    char note[256];
    std::snprintf(note, sizeof note,
                  "sync %.3f ms per call, two-stage %.3f ms (medians; a changing shape alternates "
                  "batch 1 and 2 per side); %lld ops; %d threads",
                  ts.median * 1e3, tt.median * 1e3, static_cast<long long>(g.op_count()),
                  R.ctx.num_threads());
    r.note = note;
    R.emit(r);
  }
}

}  // namespace

void graph_benchmarks(Runner& R) {
  omp_set_num_threads(R.ctx.num_threads());
  layer_cases(R);
  executor_cases(R);
}

}  // namespace tboost::bench
