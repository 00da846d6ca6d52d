// `tboost train` and `tboost bench --train` (train_cmd.h).
//
// Data: the text file as byte tokens (id = byte; the checkpoint then carries a byte-level
// tokenizer.json with no merges, so `tboost generate` reads and writes text), or through the
// model directory's own tokenizer. Step s (0-based) trains on windows w = s·B + b (b < B) of
// T + 1 tokens starting at (w·T) mod (N - T): a pure function of the step, so --resume needs
// only the step count to continue on the same data, and the same loss curve.
//
// Checkpoints: OUT/checkpoint, replaced atomically (Trainer::save: a temp dir renamed into
// place, the previous one kept as OUT/checkpoint.old until the new one is whole); a kill at any
// moment leaves a loadable checkpoint, and --resume takes OUT/checkpoint, else
// OUT/checkpoint.old.
#include "tools/tboost/train_cmd.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "src/core/file_io.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/context.h"
#include "tboost/core/error.h"
#include "tboost/model/tokenizer.h"
#include "tboost/train/trainer.h"
#include "tools/tboost/model_bench.h"

namespace tboost::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using train::Trainer;
using train::TrainOptions;

void append_utf8(std::string& s, uint32_t c) {
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6)), s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (c >> 12)), s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// A byte-level BPE tokenizer.json without merges whose token for byte b has id b (the usual
// byte-to-unicode map: printable Latin-1 bytes stand for themselves, the rest for 256 + n).
std::string byte_tokenizer_json() {
  json vocab = json::object();
  uint32_t extra = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    std::string u;
    append_utf8(u, self ? b : 256 + extra++);
    vocab[u] = b;
  }
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  return j.dump() + "\n";
}

const char* kTokenizerFiles[] = {"tokenizer.json",  "tokenizer_config.json",
                                 "tokenizer.model", "special_tokens_map.json",
                                 "vocab.json",      "merges.txt",
                                 "vocab.txt",       "generation_config.json"};

std::string fmt_duration(double s) {
  char b[32];
  if (s >= 3600)
    std::snprintf(b, sizeof b, "%dh%02dm", static_cast<int>(s / 3600),
                  static_cast<int>(s / 60) % 60);
  else if (s >= 60)
    std::snprintf(b, sizeof b, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else
    std::snprintf(b, sizeof b, "%.0fs", s);
  return b;
}

// The batch of step s: ids and next-token labels.
void batch_at(const std::vector<int32_t>& tok, int64_t s, int64_t B, int64_t T,
              std::vector<int32_t>& ids, std::vector<int32_t>& labels) {
  const int64_t N = static_cast<int64_t>(tok.size());
  ids.resize(static_cast<size_t>(B * T)), labels.resize(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = ((s * B + b) * T) % (N - T);
    for (int64_t t = 0; t < T; ++t) {
      ids[static_cast<size_t>(b * T + t)] = tok[static_cast<size_t>(start + t)];
      labels[static_cast<size_t>(b * T + t)] = tok[static_cast<size_t>(start + t + 1)];
    }
  }
}

TrainOptions options_of(const TrainArgs& a) {
  TrainOptions o;
  o.compute = parse_dtype(a.dtype);
  o.micro_batch = a.micro_batch, o.checkpointing = a.checkpointing;
  o.lr = a.lr, o.weight_decay = a.weight_decay, o.clip_norm = a.clip;
  o.warmup_steps = a.warmup, o.total_steps = a.steps, o.min_lr_ratio = a.min_lr_ratio;
  // f16 activation gradients underflow without it, so f16 storage always scales the loss.
  o.loss_scaling = a.loss_scaling || o.compute == DType::kF16, o.threads = a.threads;
  return o;
}

}  // namespace

int run_train(const TrainArgs& a) {
  const TrainOptions o = options_of(a);
  const std::string ck = a.out + "/checkpoint";
  std::string resume_from;
  if (a.resume) {
    if (fs::exists(ck + "/trainer_state.json"))
      resume_from = ck;
    else if (fs::exists(ck + ".old/trainer_state.json"))
      resume_from = ck + ".old";
  }
  std::unique_ptr<Trainer> tr;
  if (!resume_from.empty())
    tr = Trainer::from_pretrained(resume_from, o);
  else if (!a.model.empty())
    tr = Trainer::from_pretrained(a.model, o);
  else
    tr = Trainer::from_config(model::ModelConfig::builtin(a.config), o, a.seed);
  const model::ModelConfig& c = tr->config();

  // Tokens: bytes, or the model directory's tokenizer.
  const std::string tok_dir = !resume_from.empty() ? resume_from : a.model;
  const bool has_tok = !tok_dir.empty() && (fs::exists(tok_dir + "/tokenizer.json") ||
                                            fs::exists(tok_dir + "/tokenizer.model") ||
                                            fs::exists(tok_dir + "/vocab.txt"));
  // A resumed run keeps the tokens it started with.
  std::string mode = a.tokens;
  if (!resume_from.empty())
    mode =
        json::parse(read_file(resume_from + "/trainer_state.json"))["extra"].value("tokens", mode);
  const bool bytes = mode == "byte" || (mode == "auto" && !has_tok);
  if (!bytes && !has_tok)
    throw Error(ErrorCode::kInvalidArgument, "--tokens model: no tokenizer in " + tok_dir);
  if (bytes && c.vocab < 256)
    throw Error(
        ErrorCode::kInvalidArgument,
        "byte tokens need a vocabulary of at least 256, the model has " + std::to_string(c.vocab));
  const std::string text = read_file(a.data);
  std::vector<int32_t> tok;
  std::map<std::string, std::string> files;
  if (bytes) {
    tok.reserve(text.size());
    for (unsigned char ch : text) tok.push_back(ch);
    files["tokenizer.json"] = byte_tokenizer_json();
  } else {
    tok = model::Tokenizer::from_dir(tok_dir)->encode(text, false);
    for (const char* f : kTokenizerFiles)
      if (fs::exists(tok_dir + "/" + f)) files[f] = read_file(tok_dir + "/" + f);
  }
  const int64_t N = static_cast<int64_t>(tok.size());
  for (int64_t i = 0; i < N; ++i)
    if (tok[static_cast<size_t>(i)] < 0 || tok[static_cast<size_t>(i)] >= c.vocab)
      throw Error(ErrorCode::kInvalidArgument,
                  a.data + ": token " + std::to_string(i) + " has id " +
                      std::to_string(tok[static_cast<size_t>(i)]) + ", outside the model's " +
                      std::to_string(c.vocab) + "-token vocabulary");
  // What the data windows and the schedule depend on: a resumed run must match it exactly.
  uint64_t hash = 1469598103934665603ull;
  for (int32_t t : tok) hash = (hash ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  json run;
  run["data_tokens"] = N, run["data_hash"] = std::to_string(hash);
  run["batch"] = a.batch, run["seq"] = a.seq, run["steps"] = a.steps, run["warmup"] = a.warmup;
  run["lr"] = a.lr, run["min_lr_ratio"] = a.min_lr_ratio, run["dtype"] = a.dtype;
  if (N < a.seq + 2)
    throw Error(ErrorCode::kInvalidArgument, a.data + ": " + std::to_string(N) +
                                                 " tokens, fewer than --seq + 2 (" +
                                                 std::to_string(a.seq + 2) + ")");

  int64_t start = 0;
  if (!resume_from.empty()) {
    const json extra = json::parse(tr->load_state(resume_from));
    for (const auto& [key, want] : run.items())
      if (!extra.contains(key) || extra[key] != want)
        throw Error(ErrorCode::kInvalidArgument,
                    "--resume: " + key + " is " + want.dump() + " but the checkpoint's run had " +
                        (extra.contains(key) ? extra[key].dump() : std::string("none")) +
                        " (the same data and options continue the same loss curve)");
    start = tr->steps_done();
    std::fprintf(stderr, "resuming from %s at step %lld\n", resume_from.c_str(),
                 static_cast<long long>(start));
  }
  if (a.resume && resume_from.empty())
    std::fprintf(stderr, "--resume: no checkpoint in %s yet, starting at step 0\n", a.out.c_str());
  fs::create_directories(a.out);
  std::ofstream log;
  if (!a.log.empty()) {
    // A resumed run drops the log lines of steps it will redo (those after the checkpoint).
    std::string kept;
    if (fs::exists(a.log)) {
      std::istringstream in(read_file(a.log));
      for (std::string line; std::getline(in, line);) {
        const json j = json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.value("step", int64_t{0}) <= start) kept += line + "\n";
      }
    }
    log.open(a.log, std::ios::trunc);
    if (!log) throw Error(ErrorCode::kIo, "cannot write the log " + a.log);
    log << kept << std::flush;
  }
  const bool tty = isatty(2);
  auto save = [&]() {
    json extra = run;
    extra["tokens"] = bytes ? "byte" : "model";
    tr->save(ck, extra.dump(), files);
  };
  std::vector<int32_t> ids, labels;
  const auto t0 = std::chrono::steady_clock::now();
  double last_loss = 0.0;
  const int64_t end = a.stop_after > 0 ? std::min(a.steps, start + a.stop_after) : a.steps;
  for (int64_t s = start; s < end; ++s) {
    batch_at(tok, s, a.batch, a.seq, ids, labels);
    const auto ts = std::chrono::steady_clock::now();
    const train::StepStats st = tr->step(ids.data(), labels.data(), a.batch, a.seq);
    const double dt = seconds_since(ts), el = seconds_since(t0);
    last_loss = st.loss;
    const double tps = static_cast<double>(a.batch * a.seq) / dt;
    const double eta =
        el / static_cast<double>(s + 1 - start) * static_cast<double>(a.steps - s - 1);
    if (log) {
      json j;
      j["step"] = s + 1, j["loss"] = st.loss, j["lr"] = st.lr, j["grad_norm"] = st.grad_norm;
      j["skipped"] = st.skipped, j["loss_scale"] = st.loss_scale, j["tokens_per_s"] = tps;
      log << j.dump() << "\n" << std::flush;
    }
    const bool saving = a.save_every > 0 && (s + 1) % a.save_every == 0;
    if (saving || s + 1 == end) save();
    const int width = 30;
    const int done = static_cast<int>(width * (s + 1) / a.steps);
    char line[256];
    std::snprintf(
        line, sizeof line, "[%s%s] step %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s%s",
        std::string(static_cast<size_t>(done), '=').c_str(),
        std::string(static_cast<size_t>(width - done), ' ').c_str(), static_cast<long long>(s + 1),
        static_cast<long long>(a.steps), st.loss, st.lr, tps, fmt_duration(eta).c_str(),
        st.skipped ? "  (skipped: inf/NaN gradients)"
        : saving   ? "  (saved)"
                   : "");
    if (tty)
      std::fprintf(stderr, "\r%s", line);
    else if ((s + 1) % std::max<int64_t>(1, a.steps / 20) == 0 || s + 1 == a.steps || saving)
      std::fprintf(stderr, "%s\n", line);
  }
  if (tty) std::fprintf(stderr, "\n");
  if (start >= a.steps) save();
  std::printf("trained to step %lld of %lld (%s, %s tokens), last loss %.4f; checkpoint %s\n",
              static_cast<long long>(std::max(start, end)), static_cast<long long>(a.steps),
              dtype_name(o.compute), bytes ? "byte" : "model", last_loss, ck.c_str());
  return 0;
}

int run_train_bench(const TrainBenchArgs& a) {
  TrainOptions o;
  o.compute = parse_dtype(a.dtype);
  o.micro_batch = a.micro_batch, o.checkpointing = a.checkpointing, o.threads = a.threads;
  o.loss_scaling = o.compute == DType::kF16;  // as `tboost train` runs f16
  auto tr = a.model.empty() ? Trainer::from_config(model::ModelConfig::builtin(a.config), o, 1)
                            : Trainer::from_pretrained(a.model, o);
  const model::ModelConfig& c = tr->config();
  const int threads = a.threads > 0 ? a.threads : available_cores();
  const int64_t B = a.batch, T = a.seq, M = B * T;
  const std::vector<int32_t> ids = random_ids(M, c.vocab, 12345);
  std::vector<int32_t> labels(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i)
    labels[static_cast<size_t>(i)] = (i + 1) % T == 0 ? -100 : ids[static_cast<size_t>(i + 1)];
  // Matmul FLOPs of the step: 6 per weight per token (forward 2, backward 4) over every
  // projection and the lm head, plus causal attention's QKᵀ and PV (forward 2, backward 4
  // products of T²/2 · D each, per head and layer and sequence).
  const int64_t C = c.hidden, D = c.head_dim, H = c.heads, Hkv = c.kv_heads, F = c.ffn;
  const bool llama = c.family == model::Family::kLlama;
  const double per_layer =
      static_cast<double>(C * (H + 2 * Hkv) * D + H * D * C + (llama ? 3 : 2) * C * F);
  const double linear_w =
      per_layer * static_cast<double>(c.layers) + static_cast<double>(c.vocab * C);
  const double attn = 6.0 * static_cast<double>(B) * static_cast<double>(c.layers * H) *
                      static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(D);
  const double flops = 6.0 * linear_w * static_cast<double>(M) + attn;
  // oneDNN's rate on this step's most common product, (M, C) x (C, F), in the step's compute
  // dtype where oneDNN has a matmul for it (bf16 on AVX-512 BF16), else in f32 (what bf16 runs
  // through there: its widening is then counted against the step, not the floor). Three calls
  // are timed after each step and the median of all of them is the rate: sampled across the
  // same minute as the steps, since the host's memory speed drifts within a run and moves both
  // (5 calls after the last step had given rates 20% apart from one run to the next).
  const DType gemm_dt = kernels::gemm_has_native(o.compute) ? o.compute : DType::kF32;
  const size_t es = dtype_size(gemm_dt);
  std::vector<char> gx(static_cast<size_t>(M * C) * es), gw(static_cast<size_t>(F * C) * es);
  std::vector<float> gy(static_cast<size_t>(M * F));
  {
    const std::vector<float> xf(static_cast<size_t>(M * C), 0.5f),
        wf(static_cast<size_t>(F * C), 0.25f);
    convert(gx.data(), gemm_dt, xf.data(), DType::kF32, M * C);
    convert(gw.data(), gemm_dt, wf.data(), DType::kF32, F * C);
  }
  kernels::GemmArgs g;
  g.y = gy.data(), g.ldy = F, g.a = gx.data(), g.lda = C, g.b = gw.data(), g.ldb = C;
  g.a_dtype = g.b_dtype = gemm_dt;
  g.trans_b = true, g.M = M, g.N = F, g.K = C, g.threads = threads;
  tr->step(ids.data(), labels.data(), B, T);  // warm-up: arena, primitives
  kernels::gemm(g);
  std::vector<double> times, rates;
  double loss = 0;
  for (int r = 0; r < a.reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    loss = tr->step(ids.data(), labels.data(), B, T).loss;
    times.push_back(seconds_since(t0));
    for (int k = 0; k < 3; ++k) {
      const auto t1 = std::chrono::steady_clock::now();
      kernels::gemm(g);
      rates.push_back(2.0 * static_cast<double>(M) * static_cast<double>(F) *
                      static_cast<double>(C) / seconds_since(t1) / 1e9);
    }
  }
  const double step = median(times), gflops = median(rates);
  const double floor_s = flops / (gflops * 1e9);
  const double fraction = floor_s / step;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double peak = static_cast<double>(ru.ru_maxrss) * 1024.0;
  json j;
  j["model"] = a.model.empty() ? a.config : a.model;
  j["dtype"] = a.dtype, j["threads"] = threads;
  j["batch"] = B, j["seq"] = T, j["micro_batch"] = a.micro_batch > 0 ? a.micro_batch : B;
  j["checkpointing"] = a.checkpointing;
  j["step_seconds"] = step, j["step_seconds_all"] = times;
  j["tokens_per_s"] = static_cast<double>(M) / step;
  j["peak_bytes"] = peak;
  j["activation_peak_bytes"] = tr->activation_bytes();
  j["state_bytes"] = tr->state_bytes();
  j["matmul_flops"] = flops, j["gemm_gflops"] = gflops, j["gemm_dtype"] = dtype_name(gemm_dt);
  j["gemm_floor_seconds"] = floor_s, j["gemm_floor_fraction"] = fraction;
  j["gemm_gflops_all"] = rates;
  j["loss"] = loss, j["params"] = tr->num_parameters();
  if (a.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s %s, batch %lld x %lld (micro %lld)%s, %d threads\n",
                j["model"].get<std::string>().c_str(), a.dtype.c_str(), static_cast<long long>(B),
                static_cast<long long>(T), static_cast<long long>(j["micro_batch"].get<int64_t>()),
                a.checkpointing ? ", checkpointing" : "", threads);
    std::printf("  step %.3f s  %.0f tokens/s  matmul floor %.3f s (%.0f GFLOP/s): %.2f\n", step,
                static_cast<double>(M) / step, floor_s, gflops, fraction);
    std::printf("  peak RSS %.0f MiB, activations %.0f MiB, parameter state %.0f MiB\n",
                peak / 1048576.0, static_cast<double>(tr->activation_bytes()) / 1048576.0,
                static_cast<double>(tr->state_bytes()) / 1048576.0);
  }
  return 0;
}

}  // namespace tboost::tools
