// OptimizedTransformer against Hugging Face transformers (goldens made by
// scripts/make_model_goldens.py from random-weight checkpoints, float64 references), and
// against itself: prefill vs decode vs chunked prefill, paged vs contiguous caches, batches of
// different lengths vs sequences alone. Bad checkpoints and requests give named errors.
#include "tboost/model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "src/model/step_ways.h"
#include "tboost/core/error.h"
#include "tools/tboost/npy.h"

namespace tboost::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string data_dir(const std::string& name) {
  return std::string(TBOOST_SOURCE_DIR) + "/tests/data/models/" + name;
}
json golden(const std::string& name) {
  std::ifstream f(data_dir(name) + "/golden.json");
  return json::parse(f);
}
std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

// max |a - b| / max |b| over rows [0, rows) of a (rows x V) f32 and b's matching rows.
double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / std::max(den, 1e-30);
}

int32_t argmax(const float* p, int64_t n) {
  return static_cast<int32_t>(std::max_element(p, p + n) - p);
}

// Tolerances relative to the largest logit: f32 accumulates over a few hundred terms per
// layer (~1e-6 relative each); bf16 rounds every activation to 8 bits (2^-8).
double tol(DType dt) { return dt == DType::kF32 ? 2e-5 : 6e-2; }

class CausalGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CausalGolden, LogitsMatchTransformers) {
  const std::string name = GetParam();
  const json g = golden(name);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto m = OptimizedTransformer::from_pretrained(data_dir(name), {.dtype = dt, .threads = 2});
    const int64_t V = m->config().vocab;
    // Batch 1, all positions.
    const auto ids = ids_of(g["single"]["input_ids"][0]);
    const Tensor ref = npy::load(data_dir(name) + "/logits_single.npy");
    auto s = m->new_session(2);
    const int a = s->add_sequence();
    const Tensor out = s->forward({a}, {ids}, true);
    ASSERT_EQ(out.dim(0), static_cast<int64_t>(ids.size()));
    EXPECT_LE(rel_err(out.data_as<float>(), ref.data_as<float>(), out.numel()), tol(dt));
    // Two sequences of different lengths in one call (the golden is left padded: row 1's
    // real tokens are its last ones).
    const json& b2 = g["batch2_left_padded"];
    const Tensor ref2 = npy::load(data_dir(name) + "/logits_batch2.npy");
    const auto row0 = ids_of(b2["input_ids"][0]);
    std::vector<int32_t> row1;
    const auto mask1 = b2["attention_mask"][1].get<std::vector<int>>();
    const auto all1 = ids_of(b2["input_ids"][1]);
    for (size_t t = 0; t < all1.size(); ++t)
      if (mask1[t]) row1.push_back(all1[t]);
    auto s2 = m->new_session(2);
    const int x = s2->add_sequence(), y = s2->add_sequence();
    const Tensor o2 = s2->forward({x, y}, {row0, row1}, true);
    const int64_t L = static_cast<int64_t>(row0.size()),
                  pad = L - static_cast<int64_t>(row1.size());
    EXPECT_LE(rel_err(o2.data_as<float>(), ref2.data_as<float>(), L * V), tol(dt)) << "row 0";
    EXPECT_LE(rel_err(o2.data_as<float>() + L * V, ref2.data_as<float>() + (L + pad) * V,
                      static_cast<int64_t>(row1.size()) * V),
              tol(dt))
        << "row 1";
  }
}

TEST_P(CausalGolden, GreedyGenerationMatchesTransformers) {
  const std::string name = GetParam();
  const json g = golden(name)["greedy"];
  auto m = OptimizedTransformer::from_pretrained(data_dir(name), {.threads = 2});
  const auto prompt = ids_of(g["prompt_ids"]);
  const auto want = ids_of(g["generated_ids"]);
  for (bool paged : {true, false}) {
    TuningParams tp;
    tp.paged = paged;
    tp.block_size = 4;
    m->set_tuning_params(tp);
    auto s = m->new_session(1);
    const int q = s->add_sequence();
    Tensor l = s->forward({q}, {prompt});
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      got.push_back(argmax(l.data_as<float>(), m->config().vocab));
      l = s->forward({q}, {{got.back()}});
    }
    EXPECT_EQ(got, want) << (paged ? "paged" : "contiguous");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CausalGolden,
                         ::testing::Values("gpt2_tiny", "llama_tiny", "llama3_scaled_tiny",
                                           "qwen2_tiny"));

TEST(Config, Transformers4And5SpellingsAgree) {
  const ModelConfig a = ModelConfig::from_file(data_dir("llama3_scaled_tiny") + "/config.json");
  const ModelConfig b = ModelConfig::from_file(data_dir("llama3_scaled_tiny") + "/config.v4.json");
  EXPECT_EQ(a.rope, b.rope);
  EXPECT_EQ(a.rope.scaling, ops::RopeScaling::kLlama3);
  EXPECT_FLOAT_EQ(a.rope.scaling_factor, 8.0f);
}

TEST(Encoder, BertMatchesTransformers) {
  const json g = golden("bert_tiny");
  auto m = OptimizedTransformer::from_pretrained(data_dir("bert_tiny"), {.threads = 2});
  const int64_t C = m->config().hidden;
  std::vector<std::vector<int32_t>> ids, types;
  for (int r = 0; r < 2; ++r) {
    const auto mask = g["attention_mask"][r].get<std::vector<int>>();
    std::vector<int32_t> i, t;
    for (size_t k = 0; k < mask.size(); ++k)
      if (mask[k])
        i.push_back(g["input_ids"][r][k].get<int32_t>()),
            t.push_back(g["token_type_ids"][r][k].get<int32_t>());
    ids.push_back(i), types.push_back(t);
  }
  const auto h = m->encode(ids, types);
  const Tensor ref = npy::load(data_dir("bert_tiny") + "/last_hidden_state.npy");
  const int64_t L = ref.dim(1);
  for (int r = 0; r < 2; ++r)
    EXPECT_LE(rel_err(h[static_cast<size_t>(r)].data_as<float>(), ref.data_as<float>() + r * L * C,
                      h[static_cast<size_t>(r)].numel()),
              2e-5)
        << "row " << r;
  // Mean pooling, normalized (sentence-transformers' embedding).
  const Tensor pooled = npy::load(data_dir("bert_tiny") + "/mean_pooled_normalized.npy");
  const auto e = m->embed(ids, types);
  for (int r = 0; r < 2; ++r) {
    double dot = 0, na = 0, nb = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double a = e[static_cast<size_t>(r)][static_cast<size_t>(c)],
                   b = pooled.data_as<float>()[r * C + c];
      dot += a * b, na += a * a, nb += b * b;
    }
    EXPECT_GE(dot / std::sqrt(na * nb), 0.99999) << "row " << r;
  }
}

// ---- self-consistency on random models ---------------------------------------------------------

std::vector<int32_t> random_ids(int64_t n, int64_t V, uint32_t seed) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v.push_back(static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(V)));
  }
  return v;
}

// Prefill of a whole prompt = the prompt fed token by token = fed in chunks (cache paged or
// contiguous) = the prompt batched with others of different lengths.
TEST(Session, PrefillDecodeChunksAndBatchesAgree) {
  for (const char* name : {"llama-tiny", "gpt2-tiny"}) {
    SCOPED_TRACE(name);
    auto m = OptimizedTransformer::from_config(ModelConfig::builtin(name), {.threads = 2}, 7);
    const int64_t V = m->config().vocab;
    const auto p = random_ids(23, V, 1), p2 = random_ids(9, V, 2), p3 = random_ids(1, V, 3);
    auto s = m->new_session(1);
    const Tensor whole = s->forward({s->add_sequence()}, {p}, true);
    auto expect_rows = [&](const Tensor& got, int64_t row0, const char* what) {
      EXPECT_LE(rel_err(got.data_as<float>(), whole.data_as<float>() + row0 * V, got.numel()), 2e-5)
          << what;
    };
    for (bool paged : {true, false})
      for (int64_t chunk : {1, 5, 64}) {
        TuningParams tp;
        tp.paged = paged, tp.block_size = 4, tp.prefill_chunk = chunk;
        m->set_tuning_params(tp);
        auto s1 = m->new_session(1);
        const Tensor c = s1->forward({s1->add_sequence()}, {p}, true);
        expect_rows(c, 0, paged ? "chunked, paged" : "chunked, contiguous");
        // Token by token.
        auto s2 = m->new_session(1);
        const int q = s2->add_sequence();
        for (int64_t t = 0; t < static_cast<int64_t>(p.size()); ++t) {
          const Tensor l = s2->forward({q}, {{p[static_cast<size_t>(t)]}});
          expect_rows(l, t, "one token at a time");
        }
      }
    // Batched with other sequences (fresh and decoding at once).
    m->set_tuning_params({});
    auto sb = m->new_session(3);
    const int a = sb->add_sequence(), b = sb->add_sequence(), c = sb->add_sequence();
    sb->forward({b, c}, {p2, p3});
    const Tensor l = sb->forward({b, a, c}, {{p2[0]}, p, {p3[0]}}, true);
    const Tensor la = Tensor::view(l.data_as<float>() + V, DType::kF32, {23, V});
    expect_rows(la, 0, "batched with decoding sequences");
    EXPECT_EQ(sb->length(a), 23);
    EXPECT_EQ(sb->length(b), 10);
  }
}

// An f32 model with a bf16 KV cache: keys and values are rounded to bf16 once, when written,
// so the logits stay within bf16's error of the f32 cache's, for the whole prompt (the rows
// after the first chunk read the cache) and for decoding; the cache takes half the memory.
TEST(Session, Bf16CacheTracksTheF32Cache) {
  for (const char* name : {"llama-tiny", "gpt2-tiny"}) {
    SCOPED_TRACE(name);
    auto m = OptimizedTransformer::from_config(ModelConfig::builtin(name), {.threads = 2}, 7);
    const int64_t V = m->config().vocab;
    const auto p = random_ids(23, V, 1);
    TuningParams tp;
    tp.prefill_chunk = 8;
    tp.block_size = 8;  // the 23 tokens across pages
    m->set_tuning_params(tp);
    auto s = m->new_session(1);
    const int qa = s->add_sequence();
    const Tensor want = s->forward({qa}, {p}, true);
    const Tensor want_next = s->forward({qa}, {{p[0]}});
    tp.cache_dtype = DType::kBF16;
    m->set_tuning_params(tp);
    auto sb = m->new_session(1);
    const int qb = sb->add_sequence();
    const Tensor got = sb->forward({qb}, {p}, true);
    const Tensor got_next = sb->forward({qb}, {{p[0]}});
    const double e = rel_err(got.data_as<float>(), want.data_as<float>(), got.numel());
    EXPECT_LE(e, 1e-2);
    EXPECT_GT(e, 0.0) << "the bf16 cache was not used";
    EXPECT_LE(rel_err(got_next.data_as<float>(), want_next.data_as<float>(), V), 1e-2);
  }
  auto m = OptimizedTransformer::from_config(ModelConfig::builtin("llama-tiny"), {}, 7);
  TuningParams bad;
  bad.cache_dtype = DType::kI8;
  try {
    m->set_tuning_params(bad);
    ADD_FAILURE() << "accepted an i8 cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache_dtype"), std::string::npos) << e.what();
  }
}

// The weights a decode step streams (the bandwidth floor of `tboost bench`): every matrix,
// bias and norm once, one row of the embedding table, counted from the config.
TEST(Model, DecodeWeightsAreWhatAStepStreams) {
  for (const std::string name : {"llama-tiny", "gpt2-tiny"}) {
    SCOPED_TRACE(name);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      auto m = OptimizedTransformer::from_config(ModelConfig::builtin(name), {.dtype = dt}, 7);
      const ModelConfig& c = m->config();
      const int64_t C = c.hidden, F = c.ffn, kv = c.kv_heads * c.head_dim;
      const bool gpt2 = name == "gpt2-tiny";
      const int64_t layer =
          gpt2 ? 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C
               : C + C * C + 2 * C * kv + C * C + C + 3 * F * C;
      const int64_t elems = c.layers * layer + (gpt2 ? 2 * C : C) + c.vocab * C;
      int64_t got = 0;
      for (const Tensor& t : m->decode_weights()) {
        EXPECT_EQ(t.dtype(), dt);
        got += t.numel();
      }
      EXPECT_EQ(got, elems);
      EXPECT_EQ(m->weight_bytes_per_token(), static_cast<size_t>(elems + C) * dtype_size(dt));
    }
  }
}

// ---- bad input
// -----------------------------------------------------------------------------------

void expect_error(const std::function<void()>& fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// A scratch copy of a golden checkpoint, edited by the test.
struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& from) {
    dir = fs::temp_directory_path() / ("tboost_model_test_" + std::to_string(::getpid()) + "_" +
                                       std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(data_dir(from)))
      fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  }
  ~Scratch() { fs::remove_all(dir); }
};

TEST(BadInput, CheckpointProblemsNameTheTensor) {
  {  // truncated file
    Scratch s("llama_tiny");
    fs::resize_file(s.dir / "model.safetensors", fs::file_size(s.dir / "model.safetensors") - 100);
    expect_error([&] { OptimizedTransformer::from_pretrained(s.dir.string()); }, "truncated");
  }
  {  // missing and misshaped tensors
    Scratch s("llama_tiny");
    auto st = SafeTensors::open((s.dir / "model.safetensors").string());
    std::map<std::string, Tensor> t;
    for (const auto& n : st->names()) t[n] = st->tensor(n).contiguous_copy();
    auto missing = t;
    missing.erase("model.layers.1.mlp.up_proj.weight");
    save_safetensors((s.dir / "model.safetensors").string(), missing);
    expect_error([&] { OptimizedTransformer::from_pretrained(s.dir.string()); },
                 "missing tensor \"model.layers.1.mlp.up_proj.weight\"");
    auto shaped = t;
    shaped["model.layers.0.self_attn.k_proj.weight"] = Tensor::zeros(DType::kF32, {12, 48});
    save_safetensors((s.dir / "model.safetensors").string(), shaped);
    expect_error([&] { OptimizedTransformer::from_pretrained(s.dir.string()); },
                 "\"model.layers.0.self_attn.k_proj.weight\" has shape [12,48]");
  }
  {  // unknown architecture
    Scratch s("llama_tiny");
    std::ofstream(s.dir / "config.json") << R"({"model_type": "mamba", "vocab_size": 10})";
    expect_error([&] { OptimizedTransformer::from_pretrained(s.dir.string()); },
                 "unknown architecture: model_type \"mamba\"");
  }
  expect_error([&] { OptimizedTransformer::from_pretrained("/nonexistent/model"); },
               "model directory not found");
}

TEST(BadInput, RequestsOutsideTheModel) {
  auto m = OptimizedTransformer::from_config(ModelConfig::builtin("llama-tiny"), {.threads = 1});
  TuningParams tp;
  tp.max_seq_length = 16;
  m->set_tuning_params(tp);
  auto s = m->new_session(1);
  const int q = s->add_sequence();
  expect_error([&] { s->forward({q}, {random_ids(17, 257, 1)}); },
               "longer than the context (max_seq_length 16)");
  expect_error([&] { s->forward({q}, {{1, 2, 300}}); }, "token id 300 at position 2");
  EXPECT_EQ(s->length(q), 0);  // nothing was written
  s->forward({q}, {random_ids(16, 257, 1)});
  expect_error([&] { s->forward({q}, {{1}}); }, "would hold 17 tokens");
  expect_error([&] { s->add_sequence(); }, "session is full");
}

// ---- stacked weights, released sources

// Writes `names` of st to a .safetensors file in that order of their bytes (the format allows
// any order; save_safetensors writes name order).
void write_in_order(const std::string& path, const SafeTensors& st,
                    const std::vector<std::string>& names) {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& n : names) {
    const Tensor t = st.tensor(n);
    h[n] = {{"dtype", st.entry(n).dtype_name},
            {"shape", t.shape()},
            {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string hs = h.dump();
  hs.resize((hs.size() + 7) / 8 * 8, ' ');
  std::ofstream f(path, std::ios::binary);
  const uint64_t hl = hs.size();
  f.write(reinterpret_cast<const char*>(&hl), 8);  // little-endian hosts only, as the format
  f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  for (const auto& n : names) {
    const Tensor t = st.tensor(n);
    f.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  }
}

// A LLaMA layer's q, k, v (and their biases) and its gate and up projections are stacked into
// one weight each (Loader::get_stacked): read into place from a file read on demand; from a
// mapped file a view where the checkpoint stores them one after another, a copy otherwise. A
// file in name order has k, o, q, v (copied when mapped) and gate, up (a view); the same tensors
// reordered so that q, k, v lie together are taken as views. All give the same logits, bit for
// bit.
TEST(Model, StackedWeightsAsViewsOrCopiesGiveTheSameLogits) {
  for (const std::string name : {"llama_tiny", "qwen2_tiny"}) {
    SCOPED_TRACE(name);
    Scratch s(name);
    const std::string file = (s.dir / "model.safetensors").string();
    auto st = SafeTensors::open(file);
    auto names = st->names();
    auto key = [](std::string n) {
      for (const auto& [from, to] :
           std::vector<std::pair<std::string, std::string>>{{"q_proj.weight", "a0"},
                                                            {"k_proj.weight", "a1"},
                                                            {"v_proj.weight", "a2"},
                                                            {"q_proj.bias", "b0"},
                                                            {"k_proj.bias", "b1"},
                                                            {"v_proj.bias", "b2"},
                                                            {"gate_proj.weight", "c0"},
                                                            {"up_proj.weight", "c1"}})
        if (const size_t at = n.find(from); at != std::string::npos) n.replace(at, from.size(), to);
      return n;
    };
    std::sort(names.begin(), names.end(),
              [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
    const auto ids = random_ids(9, 100, 3);
    auto logits = [&](SafeTensors::Load load) {
      auto m = OptimizedTransformer::from_pretrained(s.dir.string(), {.load = load, .threads = 2});
      auto ses = m->new_session(1);
      const int q = ses->add_sequence();
      Tensor l = ses->forward({q}, {ids}, true);
      std::vector<float> v(l.data_as<float>(), l.data_as<float>() + l.numel());
      Tensor d = ses->forward({q}, {{7}});
      v.insert(v.end(), d.data_as<float>(), d.data_as<float>() + d.numel());
      return v;
    };
    const std::vector<float> in_name_order = logits(SafeTensors::Load::kRead);
    write_in_order(file, *st, names);
    st.reset();
    EXPECT_EQ(logits(SafeTensors::Load::kRead), in_name_order);
    EXPECT_EQ(logits(SafeTensors::Load::kMmap), in_name_order);
  }
}

// LoadOptions::pack_weights: prefill's GEMMs on oneDNN's blocked copy of each weight, or on
// the weights in place (the default). The same logits within f32 (bf16) rounding.
TEST(Model, PackedAndInPlaceWeightsAgree) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const auto ids = random_ids(37, 100, 5);
    auto logits = [&](bool pack) {
      auto m = OptimizedTransformer::from_pretrained(
          data_dir("llama_tiny"), {.dtype = dt, .threads = 2, .pack_weights = pack});
      EXPECT_EQ(m->packs_weights(), pack);
      auto s = m->new_session(1);
      const int q = s->add_sequence();
      return s->forward({q}, {ids}, true);
    };
    const Tensor a = logits(true), b = logits(false);
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_LE(rel_err(b.data_as<float>(), a.data_as<float>(), a.numel()), tol(dt) / 4);
  }
}

TEST(SafeTensorsRelease, DropsOnlyThatTensor) {
  const std::string file = data_dir("llama_tiny") + "/model.safetensors";
  for (auto load : {SafeTensors::Load::kRead, SafeTensors::Load::kMmap}) {
    auto st = SafeTensors::open(file, load), fresh = SafeTensors::open(file);
    const std::string gone = "model.layers.0.mlp.up_proj.weight";
    st->release(gone);
    st->release(gone);  // twice is fine
    expect_error([&] { st->tensor(gone); }, "\"" + gone + "\" was released");
    for (const auto& n : st->names()) {
      if (n == gone) continue;
      const Tensor a = st->tensor(n), b = fresh->tensor(n);
      ASSERT_EQ(a.nbytes(), b.nbytes()) << n;
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << n;
    }
    expect_error([&] { st->release("no.such.tensor"); }, "missing tensor \"no.such.tensor\"");
  }
}

// SafeTensors::read_into: the elements converted into the caller's memory, read from the file
// (kRead: a few MiB at a time where the dtypes differ, so a 6 MB tensor crosses pieces) or
// from the mapping, equal to tensor() converted. A file cut short after it was opened gives an
// error naming the tensor, not short data.
TEST(SafeTensorsReadInto, ConvertsWhileReadingAndNamesShortReads) {
  Scratch s("llama_tiny");
  const std::string file = (s.dir / "big.safetensors").string();
  const int64_t n = (int64_t{3} << 19) + 7;  // 6 MB of f32, odd
  Tensor a = Tensor::empty(DType::kF32, {n}), b = Tensor::empty(DType::kBF16, {n / 2 + 1});
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) a.data_as<float>()[i] = nd(rng);
  convert(b.data(), DType::kBF16, a.data(), DType::kF32, b.numel());
  save_safetensors(file, {{"a", a}, {"b", b}});
  for (auto load : {SafeTensors::Load::kRead, SafeTensors::Load::kMmap}) {
    auto st = SafeTensors::open(file, load), ref = SafeTensors::open(file, load);
    EXPECT_EQ(st->load(), load);
    for (const std::string name : {"a", "b"}) {
      const Tensor t = ref->tensor(name);
      for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
        SCOPED_TRACE(name + " to " + dtype_name(to));
        const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(to);
        std::vector<char> want(bytes), got(bytes + 64, 0x5a);  // poisoned, with a guard tail
        convert(want.data(), to, t.data(), t.dtype(), t.numel());
        st->read_into(name, got.data(), to);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), bytes), 0);
        for (size_t i = bytes; i < got.size(); ++i) ASSERT_EQ(got[i], 0x5a) << "wrote past the end";
      }
    }
    st->release("a");
    expect_error([&] { st->read_into("a", a.data(), DType::kF32); }, "\"a\" was released");
  }
  auto st = SafeTensors::open(file);  // kRead: headers only so far
  fs::resize_file(file, fs::file_size(file) - 4096);
  std::vector<float> out(static_cast<size_t>(n));
  expect_error([&] { st->read_into("b", out.data(), DType::kF32); }, "tensor \"b\": read failed");
  expect_error([&] { st->tensor("b"); }, "tensor \"b\": read failed");
}

// StepWays: one step in kEvery runs the other way and the step after it the current one; the
// current way changes once the other is kMargin faster on the average of a few such pairs, and
// not on noise below that, nor on a single outlier.
TEST(StepWays, SwitchesToTheFasterWayAndStaysOnNoise) {
  auto run = [](StepWays& w, int steps, double t0, double t1, int* ran_other = nullptr,
                uint32_t seed = 1) {
    for (int i = 0; i < steps; ++i) {
      const bool way = w.begin();
      if (ran_other && way != w.current()) ++*ran_other;
      seed = seed * 1664525u + 1013904223u;
      const double noise = 1.0 + 0.01 * (static_cast<double>(seed >> 8) / 16777216.0 - 0.5);
      w.end((way ? t1 : t0) * noise);
    }
  };
  {  // equal within +-0.5%: no switch in 4000 steps; the other way on one step in kEvery
    StepWays w;
    int other = 0;
    run(w, 4000, 1.0, 1.0, &other);
    EXPECT_FALSE(w.current());
    EXPECT_EQ(other, 4000 / static_cast<int>(StepWays::kEvery));
  }
  {  // the other way 4% faster: taken within a few explorations; then 4% slower: back
    StepWays w;
    run(w, 8 * static_cast<int>(StepWays::kEvery), 1.0, 0.96);
    EXPECT_TRUE(w.current());
    run(w, 8 * static_cast<int>(StepWays::kEvery), 1.0, 1.04);
    EXPECT_FALSE(w.current());
  }
  {  // one explored step 3x faster (a preempted reference step) among equal ones: no switch
    StepWays w;
    run(w, 3 * static_cast<int>(StepWays::kEvery), 1.0, 1.0);
    for (int i = 0; i < static_cast<int>(StepWays::kEvery); ++i) {
      const bool explore = w.begin() != w.current();
      w.end(explore ? 0.33 : 1.0);
    }
    run(w, 2 * static_cast<int>(StepWays::kEvery), 1.0, 1.0);
    EXPECT_FALSE(w.current());
  }
}

}  // namespace
}  // namespace tboost::model
