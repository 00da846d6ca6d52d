// generate / embed / perplexity on a checkpoint directory.
#include "tools/tboost/text_cmds.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "src/core/file_io.h"
#include "tboost/core/error.h"
#include "tboost/model/model.h"
#include "tboost/model/tokenizer.h"
#include "tools/tboost/npy.h"

namespace tboost::tools {
namespace {

using model::OptimizedTransformer;
using model::Tokenizer;

std::unique_ptr<OptimizedTransformer> load(const CommonModelArgs& a) {
  model::LoadOptions lo;
  lo.dtype = parse_dtype(a.dtype);
  lo.threads = a.threads;
  lo.load = a.mmap ? model::SafeTensors::Load::kMmap : model::SafeTensors::Load::kRead;
  if (a.pack) lo.pack_weights = true;
  return OptimizedTransformer::from_pretrained(a.model, lo);
}

}  // namespace

int run_generate(const GenerateArgs& a) {
  if (a.prompts.empty()) throw Error(ErrorCode::kInvalidArgument, "generate needs --prompt TEXT");
  auto tok = Tokenizer::from_dir(a.m.model);
  auto m = load(a.m);
  model::TuningParams tp;
  tp.max_seq_length = a.max_seq_length;
  tp.block_size = a.block_size;
  tp.prefill_chunk = a.prefill_chunk;
  tp.enable_dynamic_chunk = !a.no_dynamic_chunk;
  tp.paged = !a.contiguous_cache;
  if (!a.cache_dtype.empty()) tp.cache_dtype = parse_dtype(a.cache_dtype);
  m->set_tuning_params(tp);
  const int32_t im_start = tok->token_id("<|im_start|>"), im_end = tok->token_id("<|im_end|>");
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : a.prompts) {
    std::string text = p;
    if (a.chat && im_start >= 0)
      text = "<|im_start|>user\n" + p + "<|im_end|>\n<|im_start|>assistant\n";
    prompts.push_back(tok->encode(text, true));
    if (prompts.back().empty())
      throw Error(ErrorCode::kInvalidArgument, "prompt \"" + p + "\" has no tokens");
  }
  model::GenerationConfig gc;
  gc.max_new_tokens = a.max_new_tokens;
  gc.sampling = a.sampling;
  for (int64_t e : m->config().eos_ids) gc.stop_ids.push_back(static_cast<int32_t>(e));
  if (tok->eos_id() >= 0) gc.stop_ids.push_back(tok->eos_id());
  if (im_end >= 0) gc.stop_ids.push_back(im_end);
  model::GenerationStats st;
  const bool stream = prompts.size() == 1;
  model::StreamDecoder dec(*tok);
  if (stream) {
    std::cout << a.prompts[0];
    if (a.chat) std::cout << "\n";
    std::cout.flush();
  }
  const auto out = model::generate(
      *m, prompts, gc,
      [&](size_t, int32_t id) {
        if (!stream) return;
        if (std::find(gc.stop_ids.begin(), gc.stop_ids.end(), id) != gc.stop_ids.end()) return;
        std::cout << dec.push(id);
        std::cout.flush();
      },
      &st);
  if (stream) {
    std::cout << dec.flush() << "\n";
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      std::vector<int32_t> ids;
      for (int32_t id : out[i])
        if (std::find(gc.stop_ids.begin(), gc.stop_ids.end(), id) == gc.stop_ids.end())
          ids.push_back(id);
      std::cout << "[" << i << "] " << a.prompts[i] << tok->decode(ids) << "\n";
    }
  }
  const double pps = st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0;
  const int64_t dec_tokens =
      std::max<int64_t>(0, st.generated_tokens - static_cast<int64_t>(prompts.size()));
  const double dps = st.decode_seconds > 0 ? dec_tokens / st.decode_seconds : 0;
  std::fprintf(stderr,
               "\nprefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld tokens in %.3f s "
               "(%.1f tokens/s); %s, %s, %d threads\n",
               static_cast<long long>(st.prompt_tokens), st.prefill_seconds, pps,
               static_cast<long long>(dec_tokens), st.decode_seconds, dps,
               m->config().model_type.c_str(), a.m.dtype.c_str(), m->context().num_threads());
  return 0;
}

int run_tokenize(const TokenizeArgs& a) {
  struct stat st {};
  const bool is_dir = stat(a.model.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  auto tok = is_dir ? Tokenizer::from_dir(a.model) : Tokenizer::from_file(a.model);
  for (const auto& t : a.texts) {
    const auto ids = tok->encode(t, !a.no_special);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
    // ids, then the decoded text: a round trip anyone can compare with another tokenizer.
    std::cout << line << "\n" << tok->decode(ids, true) << "\n";
  }
  return 0;
}

int run_embed(const EmbedArgs& a) {
  if (a.texts.empty()) throw Error(ErrorCode::kInvalidArgument, "embed needs at least one TEXT");
  auto tok = Tokenizer::from_dir(a.m.model);
  auto m = load(a.m);
  std::vector<std::vector<int32_t>> ids;
  for (const auto& t : a.texts) {
    auto v = tok->encode(t, true);
    if (static_cast<int64_t>(v.size()) > m->config().max_positions)
      throw Error(ErrorCode::kInvalidArgument, "text \"" + t.substr(0, 40) + "...\" has " +
                                                   std::to_string(v.size()) +
                                                   " tokens, longer than the context (" +
                                                   std::to_string(m->config().max_positions) + ")");
    ids.push_back(std::move(v));
  }
  const auto e = m->embed(ids);
  const size_t n = e.size();
  std::vector<std::vector<double>> cos(n, std::vector<double>(n));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      double d = 0;
      for (size_t k = 0; k < e[i].size(); ++k) d += static_cast<double>(e[i][k]) * e[j][k];
      cos[i][j] = d;  // embeddings are L2-normalized
    }
  if (a.json) {
    nlohmann::json j;
    j["embeddings"] = e;
    j["cosine"] = cos;
    j["dim"] = e.empty() ? 0 : e[0].size();
    std::cout << j.dump() << "\n";
    return 0;
  }
  for (size_t i = 0; i < n; ++i) {
    std::printf("[%zu] %s\n    (%zu dims) ", i, a.texts[i].c_str(), e[i].size());
    for (size_t k = 0; k < std::min<size_t>(6, e[i].size()); ++k) std::printf("%+.4f ", e[i][k]);
    std::printf("...\n");
  }
  std::printf("\ncosine similarity\n      ");
  for (size_t j = 0; j < n; ++j) std::printf("  [%zu]  ", j);
  std::printf("\n");
  for (size_t i = 0; i < n; ++i) {
    std::printf("[%zu]  ", i);
    for (size_t j = 0; j < n; ++j) std::printf(" %.4f ", cos[i][j]);
    std::printf("\n");
  }
  return 0;
}

int run_perplexity(const PerplexityArgs& a) {
  if (a.text_file.empty() == a.ids_file.empty())
    throw Error(ErrorCode::kInvalidArgument, "perplexity needs --text FILE or --ids FILE (one)");
  auto m = load(a.m);
  std::vector<int32_t> ids;
  if (!a.ids_file.empty()) {
    const std::string s = read_file(a.ids_file);
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const auto b = item.find_first_not_of(" \t\r\n");
      if (b == std::string::npos) continue;
      const auto e = item.find_last_not_of(" \t\r\n");
      const std::string v = item.substr(b, e - b + 1);
      size_t used = 0;
      long long x = 0;
      try {
        x = std::stoll(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size())
        throw Error(ErrorCode::kInvalidArgument,
                    a.ids_file + ": \"" + v + "\" is not a token id (comma-separated integers)");
      if (x < 0 || x >= m->config().vocab)
        throw Error(ErrorCode::kInvalidArgument, a.ids_file + ": token id " + v +
                                                     " is outside the vocabulary [0, " +
                                                     std::to_string(m->config().vocab) + ")");
      ids.push_back(static_cast<int32_t>(x));
    }
  } else {
    auto tok = Tokenizer::from_dir(a.m.model);
    ids = tok->encode(read_file(a.text_file), true);
  }
  if (ids.size() < 2)
    throw Error(ErrorCode::kInvalidArgument,
                "perplexity needs at least 2 tokens, got " + std::to_string(ids.size()));
  model::TuningParams tp;
  tp.max_seq_length = a.max_seq_length;
  m->set_tuning_params(tp);
  auto s = m->new_session(1);
  const Tensor logits = s->forward({s->add_sequence()}, {ids}, true);
  const int64_t V = m->config().vocab;
  double nll = 0.0;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const float* row = logits.data_as<float>() + static_cast<int64_t>(i) * V;
    const double mx = *std::max_element(row, row + V);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    nll -= static_cast<double>(row[ids[i + 1]]) - mx - std::log(sum);
  }
  const double ppl = std::exp(nll / static_cast<double>(ids.size() - 1));
  if (!a.dump_logits.empty()) npy::save_f32(a.dump_logits, logits);
  std::printf("tokens %zu  perplexity %.4f  (mean NLL %.6f nats over %zu predictions)\n",
              ids.size(), ppl, nll / static_cast<double>(ids.size() - 1), ids.size() - 1);
  return 0;
}

}  // namespace tboost::tools
