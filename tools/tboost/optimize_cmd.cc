// `tboost optimize`: a graph before and after the fusion passes, side by side: op count,
// bytes moved per forward (each op's reads + writes), planned activation memory and its
// fragmentation, measured time (the two alternating in one run), and how far the optimized
// outputs are from the original's.
#include "tools/tboost/optimize_cmd.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "tboost/core/error.h"
#include "tboost/graph/executor.h"
#include "tboost/graph/layers.h"
#include "tboost/graph/onnx.h"
#include "tboost/graph/passes.h"
#include "tools/tboost/npy.h"

namespace tboost::tools {
using tboost::Error;
using tboost::ErrorCode;
namespace {

// Inputs for a run: floats uniform in [-1, 1); integer inputs are token ids below the
// smallest table they index (or 1 for anything named like a mask).
std::vector<Tensor> make_inputs(const graph::Graph& g, const std::vector<TensorDesc>& d) {
  std::vector<Tensor> in;
  uint32_t s = 12345;
  auto next = [&s] {
    s = s * 1664525u + 1013904223u;
    return s >> 8;
  };
  for (size_t i = 0; i < d.size(); ++i) {
    Tensor t = Tensor::empty(d[i].dtype, d[i].shape());
    const std::string& name = g.tensor(g.inputs()[i]).name;
    if (d[i].dtype == DType::kF32) {
      for (int64_t k = 0; k < t.numel(); ++k)
        t.data_as<float>()[k] = static_cast<float>(next()) / 8388608.0f - 1.0f;
    } else {
      int64_t limit = 1 << 30;
      for (int c : g.consumers(g.inputs()[i])) {
        const graph::Node& n = g.nodes()[static_cast<size_t>(c)];
        if (n.inputs.size() >= 2 && n.inputs[1] == g.inputs()[i]) {
          const graph::TensorInfo& table = g.tensor(n.inputs[0]);
          if (table.kind == graph::TensorKind::kWeight && table.value.ndim() >= 1)
            limit = std::min(limit, table.value.dim(0));
        }
      }
      if (limit == (1 << 30)) limit = 2;
      const bool mask = name.find("mask") != std::string::npos;
      for (int64_t k = 0; k < t.numel(); ++k) {
        const int64_t v = mask ? 1 : static_cast<int64_t>(next() % static_cast<uint32_t>(limit));
        if (d[i].dtype == DType::kI64) {
          t.data_as<int64_t>()[k] = v;
        } else if (d[i].dtype == DType::kI32) {
          t.data_as<int32_t>()[k] = static_cast<int32_t>(v);
        } else {
          throw Error(ErrorCode::kUnsupported, "optimize: cannot make values for input '" + name +
                                                   "' of dtype " + dtype_name(d[i].dtype));
        }
      }
    }
    in.push_back(t);
  }
  return in;
}

struct Side {
  std::unique_ptr<graph::GraphExecutor> ex;
  VariantPack pack;
};

Side prepare(const graph::Graph& g, const std::vector<Tensor>& in, Context& ctx) {
  Side s;
  s.ex = graph::make_graph_executor(std::make_shared<graph::Graph>(g));
  s.pack.inputs = in;
  std::vector<TensorDesc> d;
  for (const Tensor& t : in) d.push_back(t.desc());
  for (const TensorDesc& o : s.ex->infer_shape(d))
    s.pack.outputs.push_back(Tensor::empty(o.dtype, o.shape()));
  s.ex->setup(s.pack, ctx);
  return s;
}

nlohmann::json side_json(const graph::GraphReport& r, double seconds) {
  return {{"ops", r.ops},
          {"bytes_moved", r.bytes_moved},
          {"activation_bytes", r.memory.arena_bytes},
          {"naive_activation_bytes", r.memory.naive_bytes},
          {"peak_live_bytes", r.memory.peak_live_bytes},
          {"fragmentation", r.memory.fragmentation()},
          {"flops", r.flops},
          {"seconds", seconds}};
}

}  // namespace

int run_optimize(const OptimizeArgs& a) {
  Context ctx(ContextOptions{.num_threads = a.threads});
  graph::Graph g;
  std::string what;
  graph::OnnxInfo info;
  if (!a.layer.empty()) {
    const graph::LayerShape shp{
        .hidden = a.hidden, .heads = a.heads, .kv_heads = a.kv_heads, .ffn = a.ffn, .seq = a.seq};
    if (a.layer == "gpt2") {
      g = graph::gpt2_layer(shp);
    } else if (a.layer == "llama") {
      g = graph::llama_layer(shp);
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  "optimize: --layer must be gpt2 or llama, got '" + a.layer + "'");
    }
    what = a.layer + " layer (op by op)";
  } else {
    g = graph::import_onnx(a.model, {{"batch", a.batch}, {"seq", a.seq}}, &info);
    what = a.model;
  }
  const std::vector<TensorDesc> d = g.input_descs({{"batch", a.batch}, {"seq", a.seq}});
  graph::Graph opt = g;
  const graph::OptimizeResult res = graph::optimize(opt, d);
  std::vector<Tensor> in = make_inputs(g, d);
  if (!a.inputs_dir.empty())
    for (size_t i = 0; i < in.size(); ++i) {
      const std::string& name = g.tensor(g.inputs()[i]).name;
      Tensor t = npy::load(a.inputs_dir + "/" + name + ".npy");
      if (!t.desc().same_shape(d[i]))
        throw Error(ErrorCode::kShapeMismatch, "optimize: " + a.inputs_dir + "/" + name +
                                                   ".npy has shape " + t.desc().shape_string() +
                                                   ", the graph is bound to " +
                                                   d[i].shape_string() + " (--batch/--seq)");
      if (t.dtype() != d[i].dtype) {
        Tensor c = Tensor::empty(d[i].dtype, d[i].shape());
        convert(c.data(), c.dtype(), t.data(), t.dtype(), t.numel());
        t = c;
      }
      in[i] = t;
    }
  Side orig = prepare(g, in, ctx), fast = prepare(opt, in, ctx);
  const auto [to, tf] =
      bench::time_pair([&] { orig.ex->execute(orig.pack, nullptr, 0, ctx); },
                       [&] { fast.ex->execute(fast.pack, nullptr, 0, ctx); }, a.budget_s, 10);
  double max_diff = 0, max_ref = 0;
  for (size_t j = 0; j < orig.pack.outputs.size(); ++j) {
    const Tensor& x = orig.pack.outputs[j];
    const Tensor& y = fast.pack.outputs[j];
    if (x.dtype() != DType::kF32) continue;
    for (int64_t k = 0; k < x.numel(); ++k) {
      max_diff =
          std::max(max_diff, std::abs(double(x.data_as<float>()[k]) - y.data_as<float>()[k]));
      max_ref = std::max(max_ref, std::abs(double(x.data_as<float>()[k])));
    }
  }
  const graph::GraphReport ro = orig.ex->last_report(), rf = fast.ex->last_report();
  // Against a reference output (onnxruntime's, say): max |diff| and the normwise error.
  auto vs_reference = [&](const Tensor& y, nlohmann::json& side) {
    if (a.reference.empty()) return;
    const Tensor ref = npy::load(a.reference);
    if (!ref.desc().same_shape(y.desc()) || ref.dtype() != DType::kF32 || y.dtype() != DType::kF32)
      throw Error(ErrorCode::kShapeMismatch, "optimize: reference " + a.reference + " is " +
                                                 ref.desc().to_string() + ", output 0 is " +
                                                 y.desc().to_string());
    double md = 0, num = 0, den = 0;
    for (int64_t k = 0; k < y.numel(); ++k) {
      const double e = double(y.data_as<float>()[k]) - ref.data_as<float>()[k];
      md = std::max(md, std::abs(e));
      num += e * e;
      den += double(ref.data_as<float>()[k]) * ref.data_as<float>()[k];
    }
    side["max_abs_diff_vs_reference"] = md;
    side["rel_error_vs_reference"] = std::sqrt(num / std::max(den, 1e-300));
  };
  nlohmann::json j;
  j["model"] = what;
  j["batch"] = a.batch;
  j["seq"] = a.seq;
  j["threads"] = ctx.num_threads();
  j["original"] = side_json(ro, to.median);
  j["optimized"] = side_json(rf, tf.median);
  if (info.nodes > 0) {
    // The file's own op count: every node a runtime executes (Constant nodes are data). Our
    // import already folds the shape arithmetic; that count is ops_after_import.
    j["original"]["ops"] = info.nodes - info.constants;
    j["original"]["ops_after_import"] = ro.ops;
    j["onnx"] = {{"nodes", info.nodes},
                 {"constant_nodes", info.constants},
                 {"opset", info.opset},
                 {"producer", info.producer}};
  }
  vs_reference(orig.pack.outputs[0], j["original"]);
  vs_reference(fast.pack.outputs[0], j["optimized"]);
  j["optimized"]["max_abs_diff_vs_original"] = max_diff;
  j["optimized"]["max_abs_original"] = max_ref;
  nlohmann::json passes = nlohmann::json::object();
  for (const auto& [p, n] : res.fired) passes[p] = n;
  j["passes"] = passes;
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  auto mib = [](double b) { return b / 1048576.0; };
  std::printf("%s, batch %lld x seq %lld, %d threads\n", what.c_str(),
              static_cast<long long>(a.batch), static_cast<long long>(a.seq), ctx.num_threads());
  std::printf("%-28s %14s %14s %8s\n", "", "original", "optimized", "ratio");
  const int64_t ops0 = j["original"]["ops"].get<int64_t>();
  if (info.nodes > 0)
    std::printf("%-28s %14lld %14s\n", "ops in the file", static_cast<long long>(ops0), "");
  std::printf("%-28s %14lld %14lld %7.2fx\n", info.nodes > 0 ? "ops (shape math folded)" : "ops",
              static_cast<long long>(ro.ops), static_cast<long long>(rf.ops),
              double(ro.ops) / std::max<double>(1, rf.ops));
  std::printf("%-28s %14.3f %14.3f %7.2fx\n", "bytes moved (GB)", ro.bytes_moved / 1e9,
              rf.bytes_moved / 1e9, double(ro.bytes_moved) / std::max<double>(1, rf.bytes_moved));
  std::printf("%-28s %14.1f %14.1f %7.2fx\n", "activation arena (MiB)", mib(ro.memory.arena_bytes),
              mib(rf.memory.arena_bytes),
              double(ro.memory.arena_bytes) / std::max<double>(1, rf.memory.arena_bytes));
  std::printf("%-28s %14.1f %14.1f\n", "naive activations (MiB)", mib(ro.memory.naive_bytes),
              mib(rf.memory.naive_bytes));
  std::printf("%-28s %14.4f %14.4f\n", "fragmentation", ro.memory.fragmentation(),
              rf.memory.fragmentation());
  std::printf("%-28s %14.2f %14.2f %7.2fx\n", "time (ms, median)", to.median * 1e3, tf.median * 1e3,
              to.median / tf.median);
  std::printf("max |optimized - original| = %.3g (max |original| = %.3g)\n", max_diff, max_ref);
  if (!a.reference.empty())
    std::printf(
        "vs %s: original max |diff| %.3g (rel %.2g), optimized max |diff| %.3g (rel %.2g)\n",
        a.reference.c_str(), j["original"]["max_abs_diff_vs_reference"].get<double>(),
        j["original"]["rel_error_vs_reference"].get<double>(),
        j["optimized"]["max_abs_diff_vs_reference"].get<double>(),
        j["optimized"]["rel_error_vs_reference"].get<double>());
  std::printf("passes fired:");
  for (const auto& [p, n] : res.fired)
    if (n) std::printf(" %s=%d", p.c_str(), n);
  std::printf("\n");
  return 0;
}

}  // namespace tboost::tools
