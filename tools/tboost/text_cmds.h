// `tboost generate`, `tboost embed`, `tboost perplexity`, `tboost tokenize`: a real checkpoint end
// to end (tokenizer, model, sampling), see text_cmds.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tboost/model/generate.h"

namespace tboost::tools {

struct CommonModelArgs {
  std::string model;  // checkpoint directory (config.json, safetensors, tokenizer)
  std::string dtype = "f32";
  int threads = 0;
  bool mmap = false;
  bool pack = false;  // LoadOptions::pack_weights
};

struct GenerateArgs {
  CommonModelArgs m;
  std::vector<std::string> prompts;  // --prompt (repeatable: a batch)
  int64_t max_new_tokens = 64;
  model::SamplingParams sampling;
  bool chat = false;  // wrap the prompt in the model's chat turn markers, when it has them
  int64_t max_seq_length = 0, block_size = model::TuningParams{}.block_size,
          prefill_chunk = model::TuningParams{}.prefill_chunk;
  bool no_dynamic_chunk = false, contiguous_cache = false;
  std::string cache_dtype;  // "" (the model's dtype), f32 or bf16
};
int run_generate(const GenerateArgs& a);

struct EmbedArgs {
  CommonModelArgs m;
  std::vector<std::string> texts;
  bool json = false;
};
int run_embed(const EmbedArgs& a);

struct PerplexityArgs {
  CommonModelArgs m;
  std::string text_file;    // --text: tokenized with the model's tokenizer
  std::string ids_file;     // --ids: comma-separated token ids (no tokenizer)
  std::string dump_logits;  // --dump-logits OUT.npy: (tokens, vocab) f32
  int64_t max_seq_length = 0;
};
int run_perplexity(const PerplexityArgs& a);

struct TokenizeArgs {
  std::string model;  // a checkpoint directory or a tokenizer file (.json, .model, .txt)
  std::vector<std::string> texts;
  bool no_special = false;  // without the tokens the post-processor adds (BOS, [CLS] ...)
};
int run_tokenize(const TokenizeArgs& a);

}  // namespace tboost::tools
