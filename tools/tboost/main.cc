// The tboost command line: subcommands over the library. Errors become a message on stderr
// and a non-zero exit code, never a crash.
#include <limits.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <regex>
#include <string>

#include "bench/bench.h"
#include "tboost/graph/onnx.h"
#include "tboost/tboost.h"
#include "tools/tboost/model_bench.h"
#include "tools/tboost/optimize_cmd.h"
#include "tools/tboost/text_cmds.h"
#include "tools/tboost/train_cmd.h"

namespace {

constexpr const char* kPackWeightsHelp =
    "Keep a second copy of each linear weight in oneDNN's blocked layout for prefill: faster "
    "prefill at large shapes, twice the weight memory";

// `tboost` is built without ONNX import (its protobuf runtime breaks libsentencepiece's, see
// src/CMakeLists.txt); `optimize` runs in the sibling binary tboost-onnx, which has it. When
// the sibling is missing, this binary goes on: --layer works, a model file is a clear error.
void run_optimize_in_onnx_binary(char** argv) {
  if (tboost::graph::onnx_import_available()) return;
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return;
  self[n] = '\0';
  std::string path(self);
  path = path.substr(0, path.rfind('/') + 1) + "tboost-onnx";
  if (access(path.c_str(), X_OK) != 0) return;
  execv(path.c_str(), argv);  // returns only on failure
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "optimize") == 0) run_optimize_in_onnx_binary(argv);
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

  tboost::tools::ModelBenchArgs margs;
  auto* bench = app.add_subcommand(
      "bench", "Prefill (pp) and decode (tg) tokens/s of a model, llama-bench style");
  auto* bcfg = bench->add_option("--config", margs.config,
                                 "Built-in config with random weights (gpt2-small, llama-110m, "
                                 "llama-1b, ...)");
  auto* bmodel = bench->add_option("--model", margs.model, "Checkpoint directory");
  bcfg->excludes(bmodel);
  bench
      ->add_option("--dtype", margs.dtype,
                   "f32 or bf16; with --train also f16 (f16 storage, f32 compute, loss scaling)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  bench->add_option("--threads,-t", margs.threads, "Threads (0 = all cores)")
      ->check(CLI::Range(0, 4096));
  bench->add_option("-p,--prompt", margs.prompt, "Prefill tokens")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  bench->add_option("-n,--gen", margs.gen, "Decode tokens")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  bench
      ->add_option("-d,--depth", margs.depth,
                   "Tokens already in the KV cache before each pp and tg run (prefilled, "
                   "untimed), as llama-bench's -d")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  bench->add_option("-r,--reps", margs.reps, "Repetitions after one warm-up")
      ->check(CLI::Range(1, 1000));
  bench->add_flag("--json", margs.json, "Print one JSON object");
  bench->add_flag("--mmap", margs.mmap, "Map the weights instead of reading them into memory");
  bench->add_flag("--pack-weights", margs.pack, kPackWeightsHelp);
  bench
      ->add_option("--cache-dtype", margs.cache_dtype,
                   "KV cache f32 or bf16 (default: the model's dtype)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  bool train_bench = false;
  tboost::tools::TrainBenchArgs targs_b;
  bench->add_flag("--train", train_bench,
                  "Time training steps instead (step time, tokens/s, memory, matmul floor)");
  bench->add_option("--batch", targs_b.batch, "--train: sequences per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  bench->add_option("--seq", targs_b.seq, "--train: tokens per sequence")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  bench
      ->add_option("--micro-batch", targs_b.micro_batch,
                   "--train: sequences per micro-batch (0 = the whole batch)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  bench->add_flag("--checkpointing", targs_b.checkpointing,
                  "--train: gradient checkpointing (recompute each layer in backward)");

  tboost::tools::TrainArgs trargs;
  auto* train =
      app.add_subcommand("train", "Train a causal LM on a text file (f32, bf16 or f16 storage)");
  auto* tcfg =
      train->add_option("--config", trargs.config,
                        "Built-in config with random weights (llama-110m, gpt2-small, ...)");
  auto* tmodel = train->add_option("--model", trargs.model, "Checkpoint directory to start from");
  tcfg->excludes(tmodel);
  train->add_option("--data", trargs.data, "Training text file")->required();
  train->add_option("--out", trargs.out, "Output directory (OUT/checkpoint)")->required();
  train->add_option("--steps", trargs.steps, "Optimizer steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  train->add_option("--batch", trargs.batch, "Sequences per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  train->add_option("--seq", trargs.seq, "Tokens per sequence")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  train->add_option("--micro-batch", trargs.micro_batch, "Sequences per micro-batch (0 = all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  train->add_flag("--checkpointing", trargs.checkpointing, "Gradient checkpointing");
  train
      ->add_option("--dtype", trargs.dtype,
                   "f32; bf16 (autocast, f32 master weights); or f16 (f16 activations and "
                   "gradients, f32 compute and master weights, always with dynamic loss scaling)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  train->add_option("--tokens", trargs.tokens, "auto, byte or model (the model's tokenizer)")
      ->check(CLI::IsMember({"auto", "byte", "model"}));
  train->add_option("--lr", trargs.lr, "Peak learning rate")->check(CLI::PositiveNumber);
  train->add_option("--warmup", trargs.warmup, "Warmup steps")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  train->add_option("--min-lr-ratio", trargs.min_lr_ratio, "Cosine floor as a fraction of --lr")
      ->check(CLI::Range(0.0, 1.0));
  train->add_option("--weight-decay", trargs.weight_decay, "AdamW weight decay")
      ->check(CLI::Range(0.0, 10.0));
  train->add_option("--clip", trargs.clip, "Clip by global gradient norm (0 = off)")
      ->check(CLI::Range(0.0, 1e9));
  train->add_option("--save-every", trargs.save_every, "Checkpoint every N steps (0 = at the end)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  train->add_flag("--resume", trargs.resume, "Continue from OUT/checkpoint");
  train
      ->add_option("--stop-after", trargs.stop_after,
                   "Stop after N steps of this run (with a checkpoint); --resume continues")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  train->add_flag("--loss-scaling", trargs.loss_scaling,
                  "Dynamic loss scaling (2^16 start, skip steps with inf/NaN gradients)");
  train->add_option("--log", trargs.log, "Append one JSON line per step to this file");
  train->add_option("--threads,-t", trargs.threads, "Threads (0 = all cores)")
      ->check(CLI::Range(0, 4096));
  train->add_option("--seed", trargs.seed, "Seed of the random initial weights (--config)");

  auto common = [](CLI::App* c, tboost::tools::CommonModelArgs& m) {
    c->add_option("--model,-m", m.model,
                  "Checkpoint directory (config.json, *.safetensors, tokenizer)")
        ->required();
    c->add_option("--dtype", m.dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
    c->add_option("--threads,-t", m.threads, "Threads (0 = all cores)")->check(CLI::Range(0, 4096));
    c->add_flag("--mmap", m.mmap, "Map the weights instead of reading them into memory");
    c->add_flag("--pack-weights", m.pack, kPackWeightsHelp);
  };
  tboost::tools::GenerateArgs gargs;
  auto* generate = app.add_subcommand("generate",
                                      "Generate text; streams tokens, then prefill "
                                      "and decode tokens/s");
  common(generate, gargs.m);
  generate
      ->add_option("--cache-dtype", gargs.cache_dtype,
                   "KV cache f32 or bf16 (default: the model's dtype; bf16 halves its memory)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  generate->add_option("--prompt,-p", gargs.prompts, "Prompt text (repeat for a batch)")
      ->required();
  generate->add_option("--max-new-tokens,-n", gargs.max_new_tokens, "Tokens to generate")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  generate->add_option("--temperature", gargs.sampling.temperature, "0 = greedy")
      ->check(CLI::Range(0.0, 100.0));
  generate->add_option("--top-k", gargs.sampling.top_k, "0 = off")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  generate->add_option("--top-p", gargs.sampling.top_p, "1 = off")->check(CLI::Range(0.0, 1.0));
  generate->add_option("--repetition-penalty", gargs.sampling.repetition_penalty, "1 = off")
      ->check(CLI::Range(0.01, 100.0));
  generate->add_option("--seed", gargs.sampling.seed, "Sampling seed (same seed, same text)");
  generate->add_flag("--chat", gargs.chat, "Wrap the prompt in the model's chat turn markers");
  generate->add_option("--max-seq-length", gargs.max_seq_length, "Context limit (0 = model's)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  generate->add_option("--block-size", gargs.block_size, "KV-cache page (tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  generate->add_option("--prefill-chunk", gargs.prefill_chunk, "Chunked prefill size (tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  generate->add_flag("--no-dynamic-chunk", gargs.no_dynamic_chunk, "Prefill prompts whole");
  generate->add_flag("--contiguous-cache", gargs.contiguous_cache, "One KV block per sequence");

  tboost::tools::EmbedArgs eargs;
  auto* embed = app.add_subcommand("embed", "Sentence embeddings and a cosine-similarity table");
  common(embed, eargs.m);
  embed->add_option("texts", eargs.texts, "Texts to embed")->required();
  embed->add_flag("--json", eargs.json, "Print JSON");

  tboost::tools::PerplexityArgs pargs;
  auto* perplexity = app.add_subcommand("perplexity", "Perplexity of a text (or token ids)");
  common(perplexity, pargs.m);
  perplexity->add_option("--text", pargs.text_file, "Text file");
  perplexity->add_option("--ids", pargs.ids_file, "File of comma-separated token ids");
  perplexity->add_option("--dump-logits", pargs.dump_logits,
                         "Write every position's logits as float32 .npy (tokens, vocab)");
  perplexity->add_option("--max-seq-length", pargs.max_seq_length, "Context limit (0 = model's)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));

  tboost::tools::TokenizeArgs targs;
  auto* tokenize = app.add_subcommand("tokenize", "Token ids of texts, and the ids decoded back");
  tokenize->add_option("-m,--model", targs.model, "Checkpoint directory or tokenizer file")
      ->required();
  tokenize->add_option("texts", targs.texts, "Texts")->required();
  tokenize->add_flag("--no-special", targs.no_special, "Without BOS / [CLS] ... [SEP]");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*info) {
      tboost::Context ctx;
      std::cout << ctx.report();
    } else if (*generate) {
      return tboost::tools::run_generate(gargs);
    } else if (*train) {
      if (trargs.config.empty() == trargs.model.empty()) {
        std::fprintf(stderr, "tboost: error: train needs --config NAME or --model DIR\n");
        return 2;
      }
      return tboost::tools::run_train(trargs);
    } else if (*embed) {
      return tboost::tools::run_embed(eargs);
    } else if (*tokenize) {
      return tboost::tools::run_tokenize(targs);
    } else if (*perplexity) {
      return tboost::tools::run_perplexity(pargs);
    } else if (*bench) {
      if (margs.config.empty() == margs.model.empty()) {
        std::fprintf(stderr, "tboost: error: bench needs --config NAME or --model DIR\n");
        return 2;
      }
      if (train_bench) {
        targs_b.config = margs.config, targs_b.model = margs.model, targs_b.dtype = margs.dtype;
        targs_b.threads = margs.threads, targs_b.json = margs.json;
        targs_b.reps = margs.reps;
        return tboost::tools::run_train_bench(targs_b);
      }
      if (margs.dtype == "f16") {
        std::fprintf(stderr,
                     "tboost: error: bench --dtype f16 is a training storage mode (add --train); "
                     "inference runs f32 or bf16\n");
        return 2;
      }
      return tboost::tools::run_model_bench(margs);
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
