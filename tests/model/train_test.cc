// Trainer: loss and every parameter gradient against PyTorch autograd in float64 (goldens from
// scripts/make_train_goldens.py), 20 AdamW steps against PyTorch's loss curve, micro-batching
// and checkpointing against the plain run, bitwise reproducibility, save/resume, loss scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tboost/core/error.h"
#include "tboost/model/safetensors.h"
#include "tboost/train/trainer.h"

namespace tboost::train {
namespace {

using json = nlohmann::json;

std::string train_dir(const std::string& name) {
  return std::string(TBOOST_SOURCE_DIR) + "/tests/data/train/" + name;
}
std::string model_dir(const std::string& name) {
  return std::string(TBOOST_SOURCE_DIR) + "/tests/data/models/" + name;
}
json golden(const std::string& name) {
  std::ifstream f(train_dir(name) + "/golden.json");
  return json::parse(f);
}

struct Batch {
  std::vector<int32_t> ids, labels;
};
Batch batch_of(const json& g, int step) {
  Batch b;
  for (const auto& row : g["ids"][step])
    for (const auto& v : row) b.ids.push_back(v.get<int32_t>());
  for (const auto& row : g["labels"][step])
    for (const auto& v : row) b.labels.push_back(v.get<int32_t>());
  return b;
}

TrainOptions golden_options(const json& g, int threads = 2) {
  TrainOptions o;
  const json& h = g["hyper"];
  o.lr = h["lr"], o.beta1 = h["beta1"], o.beta2 = h["beta2"], o.eps = h["eps"];
  o.weight_decay = h["weight_decay"], o.clip_norm = h["clip_norm"];
  o.warmup_steps = h["warmup_steps"], o.total_steps = h["total_steps"];
  o.min_lr_ratio = h["min_lr_ratio"];
  o.threads = threads;
  return o;
}

class TrainGoldens : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainGoldens, LossAndEveryGradientMatchPyTorch) {
  const std::string name = GetParam();
  const json g = golden(name);
  auto tr = Trainer::from_pretrained(model_dir(name), golden_options(g));
  const Batch b = batch_of(g, 0);
  const int64_t B = g["batch"], T = g["seq"];
  const double want = g["loss_f64"];
  EXPECT_NEAR(tr->loss(b.ids.data(), b.labels.data(), B, T), want, 2e-6 * std::abs(want));
  const double loss = tr->forward_backward(b.ids.data(), b.labels.data(), B, T);
  EXPECT_NEAR(loss, want, 2e-6 * std::abs(want));
  auto st = model::SafeTensors::open(train_dir(name) + "/grads.safetensors");
  EXPECT_EQ(st->names().size(), tr->parameter_names().size());
  for (const std::string& p : tr->parameter_names()) {
    ASSERT_TRUE(st->has(p)) << p;
    const Tensor t = st->tensor(p);
    const float* w = static_cast<const float*>(t.data());
    const std::vector<float> got = tr->gradient(p);
    ASSERT_EQ(static_cast<int64_t>(got.size()), t.numel()) << p;
    double mx = 0, err = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      mx = std::max(mx, std::abs(static_cast<double>(w[i])));
      err = std::max(err, std::abs(static_cast<double>(got[i]) - w[i]));
    }
    // f32 against f64: a few ulp of the tensor's largest gradient.
    EXPECT_LE(err, 2e-5 * mx + 1e-9) << p << ": max error " << err << ", max |grad| " << mx;
  }
}

TEST_P(TrainGoldens, TwentyAdamWStepsFollowPyTorchsLossCurve) {
  const std::string name = GetParam();
  const json g = golden(name);
  auto tr = Trainer::from_pretrained(model_dir(name), golden_options(g));
  const int64_t B = g["batch"], T = g["seq"];
  for (int s = 0; s < g["steps"].get<int>(); ++s) {
    const Batch b = batch_of(g, s);
    const StepStats st = tr->step(b.ids.data(), b.labels.data(), B, T);
    const double want = g["curve_f64"][s];
    EXPECT_NEAR(st.loss, want, 1e-4 * std::abs(want)) << "step " << s + 1;
    EXPECT_FALSE(st.skipped);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TrainGoldens,
                         ::testing::Values("gpt2_tiny", "llama_tiny", "qwen2_tiny"));

// All gradients of a trainer, concatenated.
std::vector<float> all_grads(const Trainer& t) {
  std::vector<float> out;
  for (const auto& n : t.parameter_names()) {
    auto g = t.gradient(n);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

TEST(Trainer, MicroBatchesAndCheckpointingGiveTheSameGradients) {
  for (const char* name : {"gpt2_tiny", "llama_tiny"}) {
    SCOPED_TRACE(name);
    const json g = golden(name);
    const Batch b = batch_of(g, 0);
    const int64_t B = g["batch"], T = g["seq"];
    TrainOptions o = golden_options(g);
    auto base = Trainer::from_pretrained(model_dir(name), o);
    const double l0 = base->forward_backward(b.ids.data(), b.labels.data(), B, T);
    const std::vector<float> g0 = all_grads(*base);
    for (int variant = 0; variant < 3; ++variant) {
      TrainOptions v = o;
      v.micro_batch = variant != 1 ? 1 : 0;
      v.checkpointing = variant >= 1;
      auto tr = Trainer::from_pretrained(model_dir(name), v);
      const double l = tr->forward_backward(b.ids.data(), b.labels.data(), B, T);
      EXPECT_NEAR(l, l0, 1e-6 * std::abs(l0)) << "variant " << variant;
      const std::vector<float> gv = all_grads(*tr);
      double mx = 0, err = 0;
      for (size_t i = 0; i < gv.size(); ++i) {
        mx = std::max(mx, std::abs(static_cast<double>(g0[i])));
        err = std::max(err, std::abs(static_cast<double>(gv[i]) - g0[i]));
      }
      EXPECT_LE(err, 1e-5 * mx) << "variant " << variant;
      if (variant == 1) {  // checkpointing alone recomputes the same ops: bitwise the same
        EXPECT_EQ(std::memcmp(gv.data(), g0.data(), gv.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST(Trainer, SameSeedAndThreadsGiveBitwiseTheSameWeights) {
  const json g = golden("llama_tiny");
  auto run = [&](int threads) {
    auto tr = Trainer::from_config(model::ModelConfig::builtin("llama-tiny"),
                                   golden_options(g, threads), 7);
    std::vector<int32_t> ids(3 * 20), labels(3 * 20);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int32_t>((i * 37 + 11) % 257);
      labels[i] = static_cast<int32_t>((i * 53 + 5) % 257);
    }
    for (int s = 0; s < 3; ++s) tr->step(ids.data(), labels.data(), 3, 20);
    std::vector<float> w;
    for (const auto& n : tr->parameter_names()) {
      auto p = tr->parameter(n);
      w.insert(w.end(), p.begin(), p.end());
    }
    return w;
  };
  const auto a = run(2), b = run(2);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(Trainer, ResumeContinuesTheExactLossCurve) {
  const json g = golden("gpt2_tiny");
  const int64_t B = g["batch"], T = g["seq"];
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("tboost_resume_" + std::to_string(getpid())))
          .string();
  auto tr = Trainer::from_pretrained(model_dir("gpt2_tiny"), golden_options(g));
  for (int s = 0; s < 4; ++s) {
    const Batch b = batch_of(g, s);
    tr->step(b.ids.data(), b.labels.data(), B, T);
  }
  tr->save(dir, R"({"position": 4})");
  std::vector<double> cont;
  for (int s = 4; s < 8; ++s) {
    const Batch b = batch_of(g, s);
    cont.push_back(tr->step(b.ids.data(), b.labels.data(), B, T).loss);
  }
  auto back = Trainer::from_pretrained(dir, golden_options(g));
  const json extra = json::parse(back->load_state(dir));
  EXPECT_EQ(extra["position"], 4);
  EXPECT_EQ(back->steps_done(), 4);
  for (int s = 4; s < 8; ++s) {
    const Batch b = batch_of(g, s);
    EXPECT_EQ(back->step(b.ids.data(), b.labels.data(), B, T).loss,
              cont[static_cast<size_t>(s - 4)])
        << "step " << s + 1;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + ".tmp"));
  std::filesystem::remove_all(dir);
}

TEST(Trainer, BuiltInConfigsSaveLoadableCheckpoints) {
  const std::string base =
      (std::filesystem::temp_directory_path() / ("tboost_cfg_" + std::to_string(getpid())))
          .string();
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(name);
    auto tr = Trainer::from_config(model::ModelConfig::builtin(name), TrainOptions{}, 3);
    const std::string dir = base + "/" + name + "/";  // a trailing slash is fine
    tr->save(dir);
    auto back = Trainer::from_pretrained(dir, TrainOptions{});
    for (const auto& n : tr->parameter_names())
      EXPECT_EQ(back->parameter(n), tr->parameter(n)) << n;
    EXPECT_EQ(back->config().hidden_act, tr->config().hidden_act);
  }
  std::filesystem::remove_all(base);
}

TEST(Trainer, BadCheckpointLeavesTheTrainerAsItWas) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("tboost_bad_" + std::to_string(getpid())))
          .string();
  auto gpt = Trainer::from_config(model::ModelConfig::builtin("gpt2-tiny"), TrainOptions{}, 1);
  gpt->save(dir);
  auto tr = Trainer::from_pretrained(model_dir("llama_tiny"), TrainOptions{});
  const auto before = tr->parameter("model.embed_tokens.weight");
  EXPECT_THROW(tr->load_state(dir), Error);
  EXPECT_EQ(tr->parameter("model.embed_tokens.weight"), before);
  EXPECT_EQ(tr->steps_done(), 0);
  std::filesystem::remove_all(dir);
}

TEST(Trainer, UnevenMicroBatchesGiveTheSameGradients) {
  const auto cfg = model::ModelConfig::builtin("llama-tiny");
  const int64_t B = 3, T = 17;
  std::vector<int32_t> ids(B * T), labels(B * T);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 31 + 7) % 257);
    labels[i] = i % 5 == 0 ? -100 : static_cast<int32_t>((i * 17 + 3) % 257);
  }
  TrainOptions o;
  o.threads = 2;
  auto full = Trainer::from_config(cfg, o, 5);
  const double l0 = full->forward_backward(ids.data(), labels.data(), B, T);
  o.micro_batch = 2;
  auto mb = Trainer::from_config(cfg, o, 5);
  const double l1 = mb->forward_backward(ids.data(), labels.data(), B, T);
  const size_t arena = mb->activation_bytes();
  mb->forward_backward(ids.data(), labels.data(), B, T);
  EXPECT_EQ(mb->activation_bytes(), arena);  // planned once, for the larger micro-batch
  EXPECT_NEAR(l1, l0, 1e-6 * l0);
  const auto g0 = all_grads(*full), g1 = all_grads(*mb);
  double mx = 0, err = 0;
  for (size_t i = 0; i < g0.size(); ++i)
    mx = std::max(mx, std::abs(static_cast<double>(g0[i]))),
    err = std::max(err, std::abs(static_cast<double>(g1[i]) - g0[i]));
  EXPECT_LE(err, 1e-5 * mx);
}

TEST(Trainer, AllLabelsIgnoredSkipsTheUpdate) {
  auto tr = Trainer::from_config(model::ModelConfig::builtin("llama-tiny"), TrainOptions{}, 1);
  std::vector<int32_t> ids(8, 3), labels(8, -100);
  const auto before = tr->parameter("model.layers.0.mlp.up_proj.weight");
  const StepStats st = tr->step(ids.data(), labels.data(), 1, 8);
  EXPECT_TRUE(st.skipped);
  EXPECT_EQ(tr->parameter("model.layers.0.mlp.up_proj.weight"), before);
}

// Every parameter gradient of `tr` (divided by `scale`) against the float64 goldens: cosine
// above min_cos, and (max_norm_err > 0) the norm within that relative error. A non-finite
// gradient fails.
void expect_grads_track(const Trainer& tr, float scale, double min_cos, double max_norm_err) {
  auto st = model::SafeTensors::open(train_dir("llama_tiny") + "/grads.safetensors");
  for (const std::string& p : tr.parameter_names()) {
    const float* w = static_cast<const float*>(st->tensor(p).data());
    const std::vector<float> got = tr.gradient(p);
    double dot = 0, n1 = 0, n2 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double x = got[i] / static_cast<double>(scale);
      ASSERT_TRUE(std::isfinite(x)) << p << " [" << i << "] at scale " << scale;
      dot += x * w[i], n1 += x * x, n2 += w[i] * static_cast<double>(w[i]);
    }
    EXPECT_GT(dot / std::sqrt(n1 * n2 + 1e-300), min_cos) << p << " at scale " << scale;
    if (max_norm_err > 0) {
      EXPECT_NEAR(std::sqrt(n1 / (n2 + 1e-300)), 1.0, max_norm_err) << p << " at scale " << scale;
    }
  }
}

TEST(Trainer, Bf16AutocastTracksTheF64Gradients) {
  const json g = golden("llama_tiny");
  TrainOptions o = golden_options(g);
  o.compute = DType::kBF16;
  auto tr = Trainer::from_pretrained(model_dir("llama_tiny"), o);
  const Batch b = batch_of(g, 0);
  const double loss = tr->forward_backward(b.ids.data(), b.labels.data(), g["batch"], g["seq"]);
  EXPECT_NEAR(loss, g["loss_f64"].get<double>(), 2e-2);
  expect_grads_track(*tr, 1.0f, 0.99, 0.0);
}

// f16 storage: activations and their gradients in f16, products in f32 from the f32 master
// weights. f16 keeps 11 significant bits (bf16 8), so it tracks float64 closer than autocast.
// A gradient scale passes through the f16 backward and divides out exactly (a power of two).
TEST(Trainer, F16StorageTracksTheF64Gradients) {
  const json g = golden("llama_tiny");
  TrainOptions o = golden_options(g);
  o.compute = DType::kF16;
  auto tr = Trainer::from_pretrained(model_dir("llama_tiny"), o);
  const Batch b = batch_of(g, 0);
  for (const float scale : {1.0f, 1024.0f}) {
    const double loss =
        tr->forward_backward(b.ids.data(), b.labels.data(), g["batch"], g["seq"], scale);
    EXPECT_NEAR(loss, g["loss_f64"].get<double>(), 2e-3) << "scale " << scale;
    expect_grads_track(*tr, scale, 0.999, 2e-2);
  }
}

// Under f16 storage a too-large loss scale overflows f16 (max 65504) in the backward: those
// steps are skipped and the scale halves until the gradients are finite; the first applied
// step then has the gradient norm of the same step in f32.
TEST(Trainer, F16LossScaleBacksOffBelowF16Overflow) {
  const json g = golden("llama_tiny");
  TrainOptions o = golden_options(g);
  o.warmup_steps = 0, o.total_steps = 0;  // one learning rate whatever the step
  auto ref = Trainer::from_pretrained(model_dir("llama_tiny"), o);
  o.compute = DType::kF16, o.loss_scaling = true, o.initial_loss_scale = 1099511627776.0f;  // 2^40
  auto tr = Trainer::from_pretrained(model_dir("llama_tiny"), o);
  const Batch b = batch_of(g, 0);
  const auto before = tr->parameter("model.layers.0.mlp.up_proj.weight");
  int skipped = 0;
  StepStats st;
  for (int i = 0; i < 40; ++i) {
    st = tr->step(b.ids.data(), b.labels.data(), g["batch"], g["seq"]);
    if (!st.skipped) break;
    ++skipped;
    EXPECT_EQ(tr->parameter("model.layers.0.mlp.up_proj.weight"), before) << "step " << i;
  }
  ASSERT_FALSE(st.skipped) << "no finite step in 40";
  EXPECT_GT(skipped, 0) << "2^40 should overflow f16";
  EXPECT_LT(st.loss_scale, 1099511627776.0f);
  EXPECT_EQ(st.loss_scale, std::ldexp(1.0f, 40 - skipped));
  const StepStats want = ref->step(b.ids.data(), b.labels.data(), g["batch"], g["seq"]);
  EXPECT_NEAR(st.grad_norm, want.grad_norm, 2e-2 * want.grad_norm);
  EXPECT_NEAR(st.loss, want.loss, 2e-3);
  EXPECT_NE(tr->parameter("model.layers.0.mlp.up_proj.weight"), before);
}

TEST(Trainer, LossScalerSkipsOverflowAndGrows) {
  LossScaler s(8.0f, 3);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 4.0f);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 4.0f);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 8.0f);
  // An overflowing scale: the step is skipped, the weights stay, the scale halves.
  const json g = golden("llama_tiny");
  TrainOptions o = golden_options(g);
  o.loss_scaling = true, o.initial_loss_scale = 3e38f;
  auto tr = Trainer::from_pretrained(model_dir("llama_tiny"), o);
  const Batch b = batch_of(g, 0);
  const auto before = tr->parameter("model.layers.0.mlp.up_proj.weight");
  const StepStats st = tr->step(b.ids.data(), b.labels.data(), g["batch"], g["seq"]);
  EXPECT_TRUE(st.skipped);
  EXPECT_EQ(tr->parameter("model.layers.0.mlp.up_proj.weight"), before);
  const StepStats st2 = tr->step(b.ids.data(), b.labels.data(), g["batch"], g["seq"]);
  EXPECT_EQ(st2.loss_scale, 1.5e38f);
}

TEST(Trainer, BadTokensAreNamed) {
  auto tr = Trainer::from_config(model::ModelConfig::builtin("llama-tiny"), TrainOptions{}, 1);
  std::vector<int32_t> ids(8, 3), labels(8, 4);
  ids[5] = 9999;
  try {
    tr->step(ids.data(), labels.data(), 1, 8);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("9999"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tr->steps_done(), 0);
}

}  // namespace
}  // namespace tboost::train
