// Sampling and generation: greedy = argmax, the same seed gives the same tokens (whatever the
// batch), top-k / top-p cut the candidates, temperature spreads the distribution as
// softmax(l / T) says, the repetition penalty follows Hugging Face's rule; generate() over a
// batch equals each prompt alone; stop ids end a sequence.
#include "tboost/model/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "tboost/core/error.h"

namespace tboost::model {
namespace {

TEST(Sampler, GreedyIsArgmaxAndTopKOneIsGreedy) {
  const std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.9f};
  Sampler g({}, 0);
  EXPECT_EQ(g.next(l.data(), 4, {}), 1);
  Sampler k({.temperature = 1.0f, .top_k = 1, .seed = 3}, 0);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k.next(l.data(), 4, {}), 1);
  Sampler p({.temperature = 1.0f, .top_p = 0.01f, .seed = 3}, 0);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(p.next(l.data(), 4, {}), 1);
}

TEST(Sampler, FrequenciesFollowSoftmaxOfLogitsOverTemperature) {
  const std::vector<float> l = {0.0f, 1.0f, 2.0f};
  for (float T : {0.5f, 1.0f, 2.0f}) {
    Sampler s({.temperature = T, .seed = 11}, 0);
    std::map<int, int> n;
    const int N = 20000;
    for (int i = 0; i < N; ++i) ++n[s.next(l.data(), 3, {})];
    double z = 0;
    for (float v : l) z += std::exp(v / T);
    for (int i = 0; i < 3; ++i) {
      const double p = std::exp(l[static_cast<size_t>(i)] / T) / z;
      // 5 standard deviations of a binomial frequency.
      EXPECT_NEAR(n[i] / static_cast<double>(N), p, 5 * std::sqrt(p * (1 - p) / N)) << "T " << T;
    }
  }
}

TEST(Sampler, TopKAndTopPKeepOnlyTheBest) {
  const std::vector<float> l = {3.0f, 2.9f, 2.8f, -5.0f, 2.7f};
  Sampler k({.temperature = 1.0f, .top_k = 2, .seed = 5}, 0);
  Sampler p({.temperature = 1.0f, .top_p = 0.5f, .seed = 5}, 0);
  for (int i = 0; i < 500; ++i) {
    const int a = k.next(l.data(), 5, {});
    EXPECT_TRUE(a == 0 || a == 1) << a;
    const int b = p.next(l.data(), 5, {});  // probabilities ~.29,.26,.24,.21: 0 and 1 reach .5
    EXPECT_TRUE(b == 0 || b == 1) << b;
  }
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  // Token 0 (logit 2) seen twice: 2 / 4 = 0.5 < token 1's 1.0. Token 2 (logit -1) seen: -4.
  const std::vector<float> l = {2.0f, 1.0f, -1.0f};
  Sampler s({.repetition_penalty = 4.0f}, 0);
  EXPECT_EQ(s.next(l.data(), 3, {0, 0, 2}), 1);
  const std::vector<float> l2 = {-1.0f, -3.0f, -2.0f};  // seen 0: -4 < -3, -2
  EXPECT_EQ(s.next(l2.data(), 3, {0}), 2);
}

TEST(Sampler, SameSeedSameDrawsOtherSeedOtherDraws) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
  auto draw = [&](uint64_t seed, uint64_t stream) {
    Sampler s({.temperature = 1.0f, .seed = seed}, stream);
    std::vector<int32_t> v;
    for (int i = 0; i < 40; ++i) v.push_back(s.next(l.data(), 50, {}));
    return v;
  };
  EXPECT_EQ(draw(1, 0), draw(1, 0));
  EXPECT_NE(draw(1, 0), draw(2, 0));
  EXPECT_NE(draw(1, 0), draw(1, 1));
}

TEST(Sampler, BadParamsAreErrors) {
  EXPECT_THROW(Sampler({.temperature = -1.0f}, 0), Error);
  EXPECT_THROW(Sampler({.top_p = 0.0f}, 0), Error);
  EXPECT_THROW(Sampler({.top_k = -2}, 0), Error);
  EXPECT_THROW(Sampler({.repetition_penalty = 0.0f}, 0), Error);
}

TEST(Generate, BatchEqualsEachPromptAloneAndSeedsRepeat) {
  auto m = OptimizedTransformer::from_config(ModelConfig::builtin("llama-tiny"), {.threads = 2}, 3);
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 200, 17, 3, 3, 8}, {42}, {7, 7, 7}};
  for (float T : {0.0f, 0.8f}) {
    GenerationConfig gc;
    gc.max_new_tokens = 12;
    gc.sampling = {
        .temperature = T, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.1f, .seed = 1234};
    const auto batch = generate(*m, prompts, gc);
    ASSERT_EQ(batch.size(), 3u);
    for (size_t i = 0; i < prompts.size(); ++i) {
      // Alone, a prompt draws from stream 0; in the batch from stream i: compare greedy only,
      // and for sampling the first prompt (stream 0 in both).
      if (T > 0 && i > 0) continue;
      const auto alone = generate(*m, {prompts[i]}, gc);
      EXPECT_EQ(alone[0], batch[i]) << "prompt " << i << " T " << T;
    }
    EXPECT_EQ(generate(*m, prompts, gc), batch) << "same seed, same tokens";
  }
  // A stop id ends the sequence right after it is emitted.
  GenerationConfig gc;
  gc.max_new_tokens = 12;
  const auto free_run = generate(*m, {prompts[0]}, gc)[0];
  gc.stop_ids = {free_run[3]};
  const auto stopped = generate(*m, {prompts[0]}, gc)[0];
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin();
  EXPECT_EQ(static_cast<int64_t>(stopped.size()), first + 1);
  // Too long for the context: one error, nothing generated.
  gc.max_new_tokens = m->config().max_positions;
  EXPECT_THROW(generate(*m, {prompts[0]}, gc), Error);
}

}  // namespace
}  // namespace tboost::model
