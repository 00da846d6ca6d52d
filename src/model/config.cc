// ModelConfig: config.json parsing (nlohmann-json), validation and the built-in shapes.
#include "tboost/model/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tboost/core/error.h"

namespace tboost::model {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, where + ": " + what);
}

int64_t get_int(const json& j, const char* key, const std::string& where, bool required,
                int64_t dflt = 0) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) fail(where, std::string("missing field \"") + key + "\"");
    return dflt;
  }
  if (!it->is_number_integer())
    fail(where, std::string("field \"") + key + "\" must be an integer, got " + it->dump());
  return it->get<int64_t>();
}

double get_num(const json& j, const char* key, const std::string& where, double dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number())
    fail(where, std::string("field \"") + key + "\" must be a number, got " + it->dump());
  return it->get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& where, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean())
    fail(where, std::string("field \"") + key + "\" must be true or false, got " + it->dump());
  return it->get<bool>();
}

std::vector<int64_t> get_ids(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (it->is_number_integer()) return {it->get<int64_t>()};
  std::vector<int64_t> v;
  if (it->is_array())
    for (const auto& e : *it)
      if (e.is_number_integer()) v.push_back(e.get<int64_t>());
  return v;
}

// Rope scaling: transformers 4 writes "rope_scaling" {"rope_type" | "type", "factor", ...} and
// "rope_theta"; transformers 5 may nest both in "rope_parameters".
void parse_rope(const json& j, ModelConfig& c, const std::string& where) {
  c.rope.theta = static_cast<float>(get_num(j, "rope_theta", where, 10000.0));
  const json* rs = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_object()) {
      rs = &*it;
      break;
    }
  }
  if (!rs) return;
  c.rope.theta = static_cast<float>(get_num(*rs, "rope_theta", where, c.rope.theta));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (rs->contains(key) && (*rs)[key].is_string()) type = (*rs)[key].get<std::string>();
  if (type == "default") return;
  const double factor = get_num(*rs, "factor", where, 1.0);
  c.rope.scaling_factor = static_cast<float>(factor);
  if (type == "linear") {
    c.rope.scaling = ops::RopeScaling::kLinear;
  } else if (type == "llama3") {
    c.rope.scaling = ops::RopeScaling::kLlama3;
    c.rope.low_freq_factor = static_cast<float>(get_num(*rs, "low_freq_factor", where, 1.0));
    c.rope.high_freq_factor = static_cast<float>(get_num(*rs, "high_freq_factor", where, 4.0));
    c.rope.original_max_position =
        static_cast<float>(get_num(*rs, "original_max_position_embeddings", where, 8192.0));
  } else {
    fail(where, "rope scaling type \"" + type +
                    "\" is not supported (supported: default, linear, llama3)");
  }
}

}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::kGpt2:
      return "gpt2";
    case Family::kLlama:
      return "llama";
    case Family::kBert:
      return "bert";
  }
  return "?";
}

int64_t ModelConfig::num_params_without_embeddings() const {
  const int64_t C = hidden, D = head_dim, q = heads * D, kv = kv_heads * D;
  int64_t per = C * q + 2 * C * kv + q * C;  // q, k, v, o
  if (qkv_bias) per += q + 2 * kv;
  if (o_bias) per += C;
  if (family == Family::kLlama) {
    per += 3 * C * ffn + 2 * C;  // gate, up, down; two RMSNorm weights
    if (mlp_bias) per += 2 * ffn + C;
  } else {
    per += 2 * C * ffn + 4 * C;  // fc, proj; two LayerNorms
    if (mlp_bias) per += ffn + C;
  }
  int64_t n = layers * per;
  n += family == Family::kLlama ? C : 2 * C;  // final norm (GPT-2: ln_f; BERT: embedding LN)
  if (!tie_embeddings && family != Family::kBert) n += vocab * C;  // separate output head
  return n;
}

int64_t ModelConfig::num_params() const {
  int64_t n = num_params_without_embeddings() + vocab * hidden;
  if (family != Family::kLlama) n += max_positions * hidden;
  if (family == Family::kBert) n += type_vocab * hidden;
  return n;
}

void ModelConfig::validate(const std::string& where) const {
  auto pos = [&](int64_t v, const char* name) {
    if (v <= 0) fail(where, std::string(name) + " must be > 0, got " + std::to_string(v));
  };
  pos(vocab, "vocab size");
  pos(hidden, "hidden size");
  pos(layers, "number of layers");
  pos(heads, "attention heads");
  pos(kv_heads, "key/value heads");
  pos(head_dim, "head_dim");
  pos(ffn, "intermediate (FFN) size");
  pos(max_positions, "max positions");
  if (heads % kv_heads != 0)
    fail(where, "attention heads (" + std::to_string(heads) +
                    ") must be a multiple of key/value heads (" + std::to_string(kv_heads) + ")");
  if (head_dim % 2 != 0 && family == Family::kLlama)
    fail(where, "head_dim must be even for rope, got " + std::to_string(head_dim));
  if (family != Family::kLlama && head_dim * heads != hidden)
    fail(where, "hidden size (" + std::to_string(hidden) + ") must equal heads x head_dim (" +
                    std::to_string(heads) + " x " + std::to_string(head_dim) + ")");
  if (family == Family::kBert) pos(type_vocab, "type_vocab_size");
  if (!(norm_eps > 0.0f)) fail(where, "norm epsilon must be > 0");
  if (!(rope.theta > 0.0f) || !(rope.scaling_factor > 0.0f))
    fail(where, "rope theta and scaling factor must be > 0");
  if (hidden_act != "silu" && hidden_act != "gelu_tanh" && hidden_act != "gelu_erf" &&
      hidden_act != "relu")
    fail(where, "hidden_act \"" + hidden_act + "\" is not supported");
}

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    fail(where, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(where, "expected a JSON object");
  ModelConfig c;
  c.model_type = j.value("model_type", std::string());
  const std::string& mt = c.model_type;
  auto act_name = [&](const std::string& a) -> std::string {
    if (a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast") return "gelu_tanh";
    if (a == "gelu" || a == "gelu_python") return "gelu_erf";
    if (a == "silu" || a == "swish") return "silu";
    if (a == "relu") return "relu";
    fail(where, "hidden activation \"" + a + "\" is not supported");
  };
  if (mt == "gpt2") {
    c.family = Family::kGpt2;
    c.vocab = get_int(j, "vocab_size", where, true);
    c.hidden = get_int(j, "n_embd", where, true);
    c.layers = get_int(j, "n_layer", where, true);
    c.heads = get_int(j, "n_head", where, true);
    c.kv_heads = c.heads;
    c.head_dim = c.heads > 0 ? c.hidden / c.heads : 0;
    c.ffn = get_int(j, "n_inner", where, false, 4 * c.hidden);
    c.max_positions = get_int(j, "n_positions", where, true);
    c.norm_eps = static_cast<float>(get_num(j, "layer_norm_epsilon", where, 1e-5));
    c.hidden_act = act_name(j.value("activation_function", std::string("gelu_new")));
    c.tie_embeddings = get_bool(j, "tie_word_embeddings", where, true);
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    if (c.heads > 0 && c.hidden % c.heads != 0) fail(where, "n_embd must be a multiple of n_head");
  } else if (mt == "llama" || mt == "qwen2" || mt == "smollm" || mt == "smollm3" ||
             mt == "mistral") {
    c.family = Family::kLlama;
    c.vocab = get_int(j, "vocab_size", where, true);
    c.hidden = get_int(j, "hidden_size", where, true);
    c.layers = get_int(j, "num_hidden_layers", where, true);
    c.heads = get_int(j, "num_attention_heads", where, true);
    c.kv_heads = get_int(j, "num_key_value_heads", where, false, c.heads);
    c.head_dim = get_int(j, "head_dim", where, false, c.heads > 0 ? c.hidden / c.heads : 0);
    c.ffn = get_int(j, "intermediate_size", where, true);
    c.max_positions = get_int(j, "max_position_embeddings", where, false, 2048);
    c.norm_eps = static_cast<float>(get_num(j, "rms_norm_eps", where, 1e-6));
    c.hidden_act = act_name(j.value("hidden_act", std::string("silu")));
    if (c.hidden_act != "silu") fail(where, "LLaMA-family models need hidden_act silu");
    c.tie_embeddings = get_bool(j, "tie_word_embeddings", where, false);
    c.qkv_bias = mt == "qwen2" ? true : get_bool(j, "attention_bias", where, false);
    c.o_bias = mt == "qwen2" ? false : get_bool(j, "attention_bias", where, false);
    c.mlp_bias = get_bool(j, "mlp_bias", where, false);
    if (mt == "mistral" || mt == "qwen2") {
      const int64_t sw = get_int(j, "sliding_window", where, false, 0);
      const bool use_sw = get_bool(j, "use_sliding_window", where, mt == "mistral");
      if (use_sw && sw > 0 && sw < c.max_positions)
        fail(where, "sliding-window attention (sliding_window " + std::to_string(sw) +
                        ") is not supported yet");
    }
    parse_rope(j, c, where);
    c.rope.rotary_dim = c.head_dim;
  } else if (mt == "bert") {
    c.family = Family::kBert;
    c.vocab = get_int(j, "vocab_size", where, true);
    c.hidden = get_int(j, "hidden_size", where, true);
    c.layers = get_int(j, "num_hidden_layers", where, true);
    c.heads = get_int(j, "num_attention_heads", where, true);
    c.kv_heads = c.heads;
    c.head_dim = c.heads > 0 ? c.hidden / c.heads : 0;
    c.ffn = get_int(j, "intermediate_size", where, true);
    c.max_positions = get_int(j, "max_position_embeddings", where, true);
    c.type_vocab = get_int(j, "type_vocab_size", where, false, 2);
    c.norm_eps = static_cast<float>(get_num(j, "layer_norm_eps", where, 1e-12));
    c.hidden_act = act_name(j.value("hidden_act", std::string("gelu")));
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    const std::string pe = j.value("position_embedding_type", std::string("absolute"));
    if (pe != "absolute")
      fail(where, "BERT position_embedding_type \"" + pe + "\" is not supported");
  } else {
    fail(where, "unknown architecture: model_type \"" + mt +
                    "\" (supported: gpt2, llama, qwen2, smollm, mistral, bert)");
  }
  auto bos = get_ids(j, "bos_token_id");
  c.bos_id = bos.empty() ? -1 : bos[0];
  c.eos_ids = get_ids(j, "eos_token_id");
  auto pad = get_ids(j, "pad_token_id");
  c.pad_id = pad.empty() ? -1 : pad[0];
  c.validate(where);
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(ErrorCode::kIo, "cannot open model config " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json(ss.str(), path);
}

std::vector<std::string> ModelConfig::builtin_names() {
  return {"gpt2-small", "llama-110m", "llama-1b", "bert-base",
          "llama-tiny", "gpt2-tiny",  "bert-tiny"};
}

ModelConfig ModelConfig::builtin(const std::string& name) {
  ModelConfig c;
  auto llama = [&](int64_t L, int64_t C, int64_t H, int64_t Hkv, int64_t F, int64_t V) {
    c.family = Family::kLlama;
    c.model_type = "llama";
    c.layers = L, c.hidden = C, c.heads = H, c.kv_heads = Hkv, c.head_dim = C / H, c.ffn = F;
    c.vocab = V, c.max_positions = 4096, c.norm_eps = 1e-5f, c.hidden_act = "silu";
    c.rope.rotary_dim = c.head_dim;
    c.bos_id = 1, c.eos_ids = {2};
  };
  auto gpt2 = [&](int64_t L, int64_t C, int64_t H, int64_t V, int64_t P) {
    c.family = Family::kGpt2;
    c.model_type = "gpt2";
    c.layers = L, c.hidden = C, c.heads = H, c.kv_heads = H, c.head_dim = C / H, c.ffn = 4 * C;
    c.vocab = V, c.max_positions = P, c.norm_eps = 1e-5f, c.hidden_act = "gelu_tanh";
    c.tie_embeddings = c.qkv_bias = c.o_bias = c.mlp_bias = true;
    c.bos_id = V - 1, c.eos_ids = {V - 1};
  };
  auto bert = [&](int64_t L, int64_t C, int64_t H, int64_t F, int64_t V) {
    c.family = Family::kBert;
    c.model_type = "bert";
    c.layers = L, c.hidden = C, c.heads = H, c.kv_heads = H, c.head_dim = C / H, c.ffn = F;
    c.vocab = V, c.max_positions = 512, c.type_vocab = 2, c.norm_eps = 1e-12f;
    c.hidden_act = "gelu_erf";
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
  };
  if (name == "gpt2-small")
    gpt2(12, 768, 12, 50257, 1024);
  else if (name == "gpt2-tiny")
    gpt2(2, 48, 4, 211, 128);
  else if (name == "llama-110m")
    llama(12, 768, 12, 12, 2048, 32000);
  else if (name == "llama-1b")
    llama(16, 2048, 32, 8, 5632, 32000);
  else if (name == "llama-tiny")
    llama(2, 64, 4, 2, 96, 257);
  else if (name == "bert-base")
    bert(12, 768, 12, 3072, 30522);
  else if (name == "bert-tiny")
    bert(2, 48, 4, 80, 199);
  else {
    std::string names;
    for (const auto& n : builtin_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error(ErrorCode::kInvalidArgument,
                "unknown built-in config \"" + name + "\" (known: " + names + ")");
  }
  c.validate("built-in config " + name);
  return c;
}

}  // namespace tboost::model
