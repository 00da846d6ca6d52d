// Timing, alternation, and output formatting for the benchmarks.
#include "bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace tboost::bench {

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static Timing summarize(std::vector<double> t) {
  Timing r;
  std::sort(t.begin(), t.end());
  r.runs = static_cast<int>(t.size());
  r.min = t.front();
  r.max = t.back();
  r.median = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
  return r;
}

Timing time_fn(const std::function<void()>& fn, double budget_s, int max_runs) {
  fn();  // warm-up: caches, page faults, primitive creation
  std::vector<double> t;
  const double start = now();
  while (static_cast<int>(t.size()) < max_runs && (t.size() < 3 || now() - start < budget_s)) {
    const double t0 = now();
    fn();
    t.push_back(now() - t0);
  }
  return summarize(t);
}

std::vector<Timing> time_alternating(const std::vector<std::function<void()>>& fns, double budget_s,
                                     int max_runs) {
  for (const auto& f : fns) f();
  std::vector<std::vector<double>> t(fns.size());
  const double start = now();
  while (static_cast<int>(t[0].size()) < max_runs &&
         (t[0].size() < 5 || now() - start < budget_s)) {
    for (size_t i = 0; i < fns.size(); ++i) {
      const double t0 = now();
      fns[i]();
      t[i].push_back(now() - t0);
    }
  }
  std::vector<Timing> out;
  for (const auto& v : t) out.push_back(summarize(v));
  return out;
}

std::pair<Timing, Timing> time_pair(const std::function<void()>& a, const std::function<void()>& b,
                                    double budget_s, int max_runs) {
  const std::vector<Timing> t = time_alternating({a, b}, budget_s, max_runs);
  return {t[0], t[1]};
}

static nlohmann::json opt(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::string results_json(const std::vector<Result>& rows) {
  nlohmann::json arr = nlohmann::json::array();
  for (const Result& r : rows) {
    nlohmann::json j;
    j["case"] = r.name;
    j["dtype"] = r.dtype;
    j["threads"] = r.threads;
    j["seconds"] = r.seconds;
    j["spread"] = r.spread;
    j["bytes"] = r.bytes;
    j["flops"] = r.flops;
    j["gbps"] = opt(r.gbps);
    j["gflops"] = opt(r.gflops);
    j["floor_fraction"] = r.floor_fraction;
    if (!r.baseline.empty()) {
      j["baseline"] = r.baseline;
      j["speedup_vs_baseline"] = opt(r.speedup_vs_baseline);
      j["bytes_ratio_vs_baseline"] = opt(r.bytes_ratio_vs_baseline);
    }
    if (r.working_bytes) j["working_bytes"] = *r.working_bytes;
    if (!r.note.empty()) j["note"] = r.note;
    arr.push_back(j);
  }
  return arr.dump(2);
}

std::string results_table(const std::vector<Result>& rows) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "| %-44s | %-5s | %3s | %10s | %8s | %8s | %6s | %-8s | %7s | %6s | %9s |\n",
                "case", "dtype", "thr", "time", "GB/s", "GFLOP/s", "floor", "baseline", "speedup",
                "bytes", "work mem");
  s += line;
  s += "|" + std::string(46, '-') + "|" + std::string(7, '-') + "|" + std::string(5, '-') + "|" +
       std::string(12, '-') + "|" + std::string(10, '-') + "|" + std::string(10, '-') + "|" +
       std::string(8, '-') + "|" + std::string(10, '-') + "|" + std::string(9, '-') + "|" +
       std::string(8, '-') + "|" + std::string(11, '-') + "|\n";
  auto num = [](const std::optional<double>& v, const char* fmt) {
    char b[32];
    if (!v) return std::string("-");
    std::snprintf(b, sizeof b, fmt, *v);
    return std::string(b);
  };
  auto mib = [](const std::optional<double>& v) {
    char b[32];
    if (!v) return std::string("-");
    std::snprintf(b, sizeof b, "%.2f MiB", *v / 1048576.0);
    return std::string(b);
  };
  for (const Result& r : rows) {
    char t[32];
    if (r.seconds <= 0)
      std::snprintf(t, sizeof t, "-");
    else if (r.seconds >= 1e-3)
      std::snprintf(t, sizeof t, "%.3f ms", r.seconds * 1e3);
    else
      std::snprintf(t, sizeof t, "%.1f us", r.seconds * 1e6);
    std::snprintf(line, sizeof line,
                  "| %-44s | %-5s | %3d | %10s | %8s | %8s | %5.0f%% | %-8s | %7s | %6s | %9s |\n",
                  r.name.c_str(), r.dtype.c_str(), r.threads, t, num(r.gbps, "%.1f").c_str(),
                  num(r.gflops, "%.1f").c_str(), 100.0 * r.floor_fraction, r.baseline.c_str(),
                  num(r.speedup_vs_baseline, "%.2fx").c_str(),
                  num(r.bytes_ratio_vs_baseline, "%.2f").c_str(), mib(r.working_bytes).c_str());
    s += line;
  }
  return s;
}

}  // namespace tboost::bench
