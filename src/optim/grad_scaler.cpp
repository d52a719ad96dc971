#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::optim {

GradScaler::GradScaler(const GradScalerConfig& c) : dynamic_(!(c.loss_scale > 0.0)) {
  if (!dynamic_) {
    scale_ = static_cast<float>(c.loss_scale);
    return;
  }
  if (c.loss_scale < 0.0) mt::fail("--loss-scale must be > 0 (leave it unset for dynamic scaling), got {}", c.loss_scale);
  if (!(c.initial_loss_scale > 0.0)) mt::fail("--initial-loss-scale must be > 0, got {}", c.initial_loss_scale);
  if (!(c.min_loss_scale > 0.0)) mt::fail("--min-loss-scale must be > 0, got {}", c.min_loss_scale);
  if (!(c.min_loss_scale <= c.initial_loss_scale))
    mt::fail("--min-loss-scale ({}) must not exceed --initial-loss-scale ({})", c.min_loss_scale,
             c.initial_loss_scale);
  if (c.loss_scale_window <= 0) mt::fail("--loss-scale-window must be > 0, got {}", c.loss_scale_window);
  if (c.hysteresis <= 0) mt::fail("--hysteresis must be > 0, got {}", c.hysteresis);
  MT_CHECK(c.growth_factor > 1.0, "growth_factor {}", c.growth_factor);
  MT_CHECK(c.backoff_factor > 0.0 && c.backoff_factor < 1.0, "backoff_factor {}", c.backoff_factor);
  // Megatron keeps the scale and both factors as fp32 tensors; so do we, for the same bits.
  scale_ = static_cast<float>(c.initial_loss_scale);
  min_scale_ = static_cast<float>(c.min_loss_scale);
  growth_factor_ = static_cast<float>(c.growth_factor);
  backoff_factor_ = static_cast<float>(c.backoff_factor);
  growth_interval_ = c.loss_scale_window;
  hysteresis_ = c.hysteresis;
  hysteresis_tracker_ = hysteresis_;
}

void GradScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    growth_tracker_ = 0;
    // The tracker keeps counting down (not reset by clean steps until the next growth), so
    // once exhausted every further overflow backs off immediately.
    --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * backoff_factor_, min_scale_);
    return;
  }
  ++growth_tracker_;
  if (growth_tracker_ == growth_interval_) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ = scale_ * growth_factor_;
  }
}

void GradScaler::load_state(const GradScalerState& s) {
  if (!dynamic_) return;  // Megatron's ConstantGradScaler ignores saved state: the flag wins
  if (!(s.scale > 0.0f) || !std::isfinite(s.scale))
    mt::fail("checkpoint holds an invalid loss scale {}", s.scale);
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
}

}  // namespace mt::optim
