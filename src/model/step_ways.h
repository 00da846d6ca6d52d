// StepWays: which of two ways the decode GEMVs' weight streams read (kernels::
// set_weight_stream_nta), chosen step by step while a model decodes.
//
// Why online: on the hosts we measured, the better way depends on the state of the memory, which
// moves within minutes (gemv.cc, FarPlanOf: with the memory slow, asking for the weight lines
// with prefetchnta made llama-110m f32 decode 2-4% faster; with it fast, 4-8% slower). Timing
// the GEMVs alone cannot tell the two apart: much of the gain lands in the small ops between
// them, whose data the weights no longer push out of the caches. So whole decode steps are
// timed: every kEvery-th step runs the other way, the step after it the current one, and the
// log of their time ratio (adjacent steps: the same work but one more cached token), clamped,
// feeds a moving average. When that average says the other way is kMargin faster or more, it
// becomes the current one. The cost is the worse way on one step in kEvery while the current way is
// the better one: with one in 8, llama-110m bf16 decode in the fast mode lost 1-3%; with one in
// 32 the two binaries were even there (llama-110m f32 1.012-1.054 of the read against
// 1.024-1.046, bf16 0.906-0.934 against 0.920-0.932). Adjacent explored and reference steps of
// llama-110m f32 differed by +3-8% (the explored prefetchnta step slower) in the fast mode, with
// one step in 15 or so an outlier of 20-40% either way (the clamp's reason). The outputs do not
// depend on the way (only prefetch requests differ).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

namespace tboost::model {

class StepWays {
 public:
  static constexpr uint64_t kEvery = 32;
  static constexpr double kMargin = 0.015;  // the other way must be 1.5% faster
  static constexpr double kWeight = 0.25;   // of each new sample in the average (from 0)
  static constexpr double kClamp = 0.04;    // |log ratio| a sample counts for at most
  static constexpr int kMinSamples = 3;

  // The way of the next decode step (true: weight_stream_nta).
  bool begin() {
    std::lock_guard<std::mutex> lock(mu_);
    ++steps_;
    if (phase_ == Phase::kReference) return current_;
    phase_ = Phase::kNormal;  // an explored step that never ended (it threw) is dropped
    if (steps_ % kEvery == 0) {
      phase_ = Phase::kExplore;
      return !current_;
    }
    return current_;
  }
  // That step's wall time.
  void end(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ == Phase::kExplore) {
      explore_s_ = seconds;
      phase_ = Phase::kReference;
    } else if (phase_ == Phase::kReference) {
      phase_ = Phase::kNormal;
      if (seconds <= 0.0 || explore_s_ <= 0.0) return;
      // Clamped, so that one step the OS interrupted (or one that ran alone) cannot decide.
      const double sample = std::clamp(std::log(explore_s_ / seconds), -kClamp, kClamp);
      log_ratio_ = (1.0 - kWeight) * log_ratio_ + kWeight * sample;
      ++samples_;
      if (samples_ >= kMinSamples && log_ratio_ < std::log(1.0 - kMargin)) {
        current_ = !current_;
        samples_ = 0;
        log_ratio_ = 0.0;
      }
    }
  }
  bool current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }

 private:
  enum class Phase { kNormal, kExplore, kReference };
  mutable std::mutex mu_;
  bool current_ = false;
  Phase phase_ = Phase::kNormal;
  uint64_t steps_ = 0;
  double explore_s_ = 0.0, log_ratio_ = 0.0;
  int samples_ = 0;
};

}  // namespace tboost::model
