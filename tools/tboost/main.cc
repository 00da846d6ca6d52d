// The tboost command line: subcommands over the library. Errors become a message on stderr
// and a non-zero exit code, never a crash.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <regex>

#include "bench/bench.h"
#include "tboost/tboost.h"

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

  CLI11_PARSE(app, argc, argv);
  try {
    if (*info) {
      tboost::Context ctx;
      std::cout << ctx.report();
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
