// The tboost command line: subcommands over the library. Errors become a message on stderr
// and a non-zero exit code, never a crash.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <regex>

#include "bench/bench.h"
#include "tboost/tboost.h"
#include "tools/tboost/optimize_cmd.h"

int main(int argc, char** argv) {
  CLI::App app{"tboost: fused transformer operators (transformer-boost)"};
  app.require_subcommand(1);

  auto* info = app.add_subcommand("info", "Print the CPU features, cache sizes and dispatched ISA");

  tboost::bench::Options bopt;
  bool json = false;
  auto* bench_ops = app.add_subcommand(
      "bench-ops", "Benchmark the ops: floors, copy/oneDNN baselines, fused vs unfused");
  bench_ops->add_option("--filter", bopt.filter, "Regex on case names");
  bench_ops->add_flag("--json", json, "Print one JSON array instead of a table");
  bench_ops->add_option("--threads", bopt.threads, "Threads (0 = all cores)")
      ->check(CLI::Range(0, 4096));
  bench_ops->add_flag("--quick", bopt.quick,
                      "Smaller tensors and shorter timing (smoke runs; tensors may be cache\n"
                      "resident, so floor fractions are not meaningful)");

  tboost::tools::OptimizeArgs oargs;
  auto* optimize = app.add_subcommand(
      "optimize",
      "Fuse and memory-plan a graph; print original vs optimized (ops, bytes, memory, time)");
  optimize->add_option("model", oargs.model,
                       "An .onnx model (symbolic dims bound by --batch/--seq)");
  optimize
      ->add_option("--layer", oargs.layer,
                   "Instead of a model: the op-by-op 'gpt2' or 'llama' layer")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  optimize->add_option("--batch", oargs.batch, "Batch size bound to the first symbolic dim")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  optimize->add_option("--seq", oargs.seq, "Sequence length bound to the second symbolic dim")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  optimize->add_option("--hidden", oargs.hidden, "--layer: hidden size")
      ->check(CLI::PositiveNumber);
  optimize->add_option("--heads", oargs.heads, "--layer: attention heads")
      ->check(CLI::PositiveNumber);
  optimize->add_option("--ffn", oargs.ffn, "--layer: MLP width")->check(CLI::PositiveNumber);
  optimize->add_option("--kv-heads", oargs.kv_heads, "--layer llama: K/V heads (GQA; 0 = heads)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  optimize->add_option("--threads", oargs.threads, "Threads (0 = all cores)")
      ->check(CLI::Range(0, 4096));
  optimize->add_option("--budget", oargs.budget_s, "Seconds of timing per side")
      ->check(CLI::Range(0.0, 600.0));
  optimize->add_flag("--json", oargs.json, "Print JSON");
  optimize->add_option("--inputs", oargs.inputs_dir,
                       "Directory with <input name>.npy for each graph input");
  optimize->add_option("--reference", oargs.reference, "A .npy the first output is compared with");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*info) {
      tboost::Context ctx;
      std::cout << ctx.report();
    } else if (*optimize) {
      if (oargs.model.empty() == oargs.layer.empty()) {
        std::fprintf(stderr,
                     "tboost: error: optimize needs a MODEL.onnx or --layer (one of them)\n");
        return 2;
      }
      return tboost::tools::run_optimize(oargs);
    } else if (*bench_ops) {
      try {
        std::regex check(bopt.filter);
      } catch (const std::regex_error& e) {
        std::fprintf(stderr, "tboost: error: --filter '%s' is not a valid regex: %s\n",
                     bopt.filter.c_str(), e.what());
        return 2;
      }
      tboost::Context ctx;
      if (!json) std::cout << ctx.report() << "\n";
      const auto rows = tboost::bench::run_op_benchmarks(bopt, [&](const tboost::bench::Result& r) {
        if (!json) std::cerr << "  measured " << r.name << "\n";
      });
      if (json) {
        std::cout << tboost::bench::results_json(rows) << "\n";
      } else {
        std::cout << tboost::bench::results_table(rows);
      }
    }
  } catch (const tboost::Error& e) {
    std::fprintf(stderr, "tboost: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tboost: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
