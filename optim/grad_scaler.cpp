#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>

namespace lockstep::optim {

ChosenScalerOptions choose_scaler_options(int64_t steps, double init_scale, int64_t growth_interval) {
  ChosenScalerOptions chosen;
  std::string reason;
  if (init_scale > 0) {
    chosen.options.init_scale = init_scale;
    reason = "init_scale from precision.init_scale";
  } else {
    // 2^k with k = log2(steps), between 2^8 and 2^16: backing off from a
    // scale that is too high costs one skipped step per halving, at most k
    // of the run's `steps` steps.
    const int exponent = std::clamp(int(std::floor(std::log2(double(std::max<int64_t>(steps, 1))))), 8, 16);
    chosen.options.init_scale = std::ldexp(1.0, exponent);
    reason = "init_scale 2^" + std::to_string(exponent) + " for a " + std::to_string(steps) +
             "-step run (2^log2(steps), within 2^8..2^16): at most " + std::to_string(exponent) +
             " steps spent backing off";
  }
  if (growth_interval > 0) {
    chosen.options.growth_interval = growth_interval;
    reason += "; growth_interval from precision.growth_interval";
  } else {
    chosen.options.growth_interval = std::clamp<int64_t>(steps / 20, 50, 2000);
    reason += "; growth_interval " + std::to_string(chosen.options.growth_interval) +
              " (steps / 20, within 50..2000)";
  }
  chosen.reason = reason;
  return chosen;
}

GradScaler::GradScaler(ScalerOptions options) : options_(options), scale_(options.init_scale) {}

bool GradScaler::update(int64_t step, bool found_nonfinite) {
  ++steps_seen_;
  if (found_nonfinite) {
    scale_ *= options_.backoff_factor;
    good_in_a_row_ = 0;
    skipped_steps_.push_back({{"step", step}, {"scale_after", scale_}});
    return false;
  }
  if (++good_in_a_row_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    good_in_a_row_ = 0;
  }
  return true;
}

nlohmann::json GradScaler::state() const {
  return {{"scale", scale_}, {"good_in_a_row", good_in_a_row_}, {"steps_seen", steps_seen_},
          {"skipped_steps", skipped_steps_}};
}

void GradScaler::load(const nlohmann::json& state) {
  scale_ = state.at("scale").get<double>();
  good_in_a_row_ = state.at("good_in_a_row").get<int64_t>();
  steps_seen_ = state.at("steps_seen").get<int64_t>();
  skipped_steps_ = state.at("skipped_steps");
}

}  // namespace lockstep::optim
