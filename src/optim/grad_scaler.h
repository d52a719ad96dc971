#pragma once
// Loss scaling for fp16 training, as Megatron's ConstantGradScaler (--loss-scale) and
// DynamicGradScaler (--initial-loss-scale, --min-loss-scale, --loss-scale-window,
// --hysteresis; growth x2, backoff x0.5). bf16 and fp32 runs use no scaler.
//
// Per step: unscale the main grads with inv_scale() while looking for inf/nan
// (ops::unscale_and_check), skip the optimizer step if any were found, then update(found_inf).
// Every data-parallel rank must pass the same found_inf (all-reduced) to stay in step.
#include <cstdint>

namespace mt::optim {

struct GradScalerConfig {
  double loss_scale = 0.0;                // --loss-scale: > 0 gives a constant scale; 0 (unset) is dynamic
  double initial_loss_scale = 4294967296.0;  // --initial-loss-scale (2^32)
  double min_loss_scale = 1.0;            // --min-loss-scale
  int64_t loss_scale_window = 1000;       // --loss-scale-window: clean steps before the scale doubles
  int64_t hysteresis = 2;                 // --hysteresis: overflowing steps tolerated before backing off
  double growth_factor = 2.0;             // fixed in Megatron
  double backoff_factor = 0.5;            // fixed in Megatron
};

// What a checkpoint keeps (Megatron's state_dict: scale, growth_tracker, hysteresis_tracker).
// A constant scaler saves nothing in Megatron; here it saves its scale and ignores it on load.
struct GradScalerState {
  float scale = 1.0f;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerConfig& cfg);  // throws mt::Error naming the bad flag

  bool dynamic() const { return dynamic_; }
  float scale() const { return scale_; }
  // 1/scale in double, rounded to float, as Megatron's inv_scale.
  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_)); }

  void update(bool found_inf);

  GradScalerState state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void load_state(const GradScalerState& s);

 private:
  bool dynamic_;
  float scale_;
  float min_scale_ = 0.0f, growth_factor_ = 2.0f, backoff_factor_ = 0.5f;
  int64_t growth_interval_ = 0, hysteresis_ = 0;
  int64_t growth_tracker_ = 0, hysteresis_tracker_ = 0;
};

}  // namespace mt::optim
