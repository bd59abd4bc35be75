// strata/optim/loss_scaler.hpp: `LossScaler`, the loss scale of fp16 training (Megatron's
// DynamicGradScaler and ConstantGradScaler).
//
// fp16 holds magnitudes down to 6e-8 only, so small gradients underflow. The loss is multiplied by
// `scale` before the backward (every gradient with it), and the gradients are divided by it after
// the data-parallel reduction, before the norm, clipping and the optimizer. A scale too large makes
// some gradient overflow to inf (or NaN): that iteration's optimizer step is skipped and the scale
// backs off. The dynamic rule, per iteration, given found_inf (any non-finite gradient on any rank,
// which the global gradient norm tells: it is finite exactly when every gradient is):
//
//   found_inf:  growth_tracker = 0; hysteresis_tracker -= 1;
//               if hysteresis_tracker <= 0: scale = max(scale * backoff_factor, min_scale)
//               the step is skipped
//   otherwise:  growth_tracker += 1;
//               if growth_tracker == growth_interval:
//                   growth_tracker = 0; hysteresis_tracker = hysteresis; scale *= growth_factor
//
// so the scale halves after `hysteresis` overflowing iterations (consecutive or not, until the next
// growth) and doubles after `growth_interval` clean ones in a row. A constant scaler (dynamic =
// false) never changes its scale but still skips a step whose gradients are not finite.
// The state (scale, trackers) is plain host numbers, saved in checkpoints by the trainer.
#pragma once

#include <algorithm>
#include <cmath>

#include "../core/error.hpp"

STRATA_NAMESPACE_BEGIN

struct LossScalerConfig {
  bool dynamic = true;
  double initial_scale = 4294967296.0;  // 2^32, Megatron's --initial-loss-scale
  double min_scale = 1.0;               // --min-loss-scale
  int growth_interval = 1000;           // --loss-scale-window
  int hysteresis = 2;                   // --hysteresis
  double growth_factor = 2.0;
  double backoff_factor = 0.5;

  void validate() const {
    if (!(initial_scale > 0) || !std::isfinite(initial_scale))
      fail<ConfigError>("loss scaler: the initial scale must be a finite number > 0, got ", initial_scale);
    if (!(min_scale > 0) || !std::isfinite(min_scale) || (dynamic && min_scale > initial_scale))
      fail<ConfigError>("loss scaler: the minimum scale must be a finite number in (0, initial scale = ", initial_scale,
                        "], got ", min_scale);
    if (growth_interval < 1) fail<ConfigError>("loss scaler: the growth interval must be >= 1 iteration, got ", growth_interval);
    if (hysteresis < 1) fail<ConfigError>("loss scaler: the hysteresis must be >= 1 iteration, got ", hysteresis);
    if (!(growth_factor > 1) || !std::isfinite(growth_factor))
      fail<ConfigError>("loss scaler: the growth factor must be a finite number > 1, got ", growth_factor);
    if (!(backoff_factor > 0 && backoff_factor < 1))
      fail<ConfigError>("loss scaler: the backoff factor must lie in (0, 1), got ", backoff_factor);
  }
};

class LossScaler {
 public:
  LossScaler() : LossScaler(LossScalerConfig{}) {}
  explicit LossScaler(LossScalerConfig config) : config_(config) {
    config_.validate();
    scale_ = config_.initial_scale;
    hysteresis_tracker_ = config_.hysteresis;
  }
  // A constant scale (Megatron's --loss-scale).
  static LossScaler constant(double scale) {
    LossScalerConfig c;
    c.dynamic = false;
    c.initial_scale = scale;
    c.min_scale = std::min(c.min_scale, scale);
    return LossScaler(c);
  }

  double scale() const { return scale_; }
  double inverse_scale() const { return 1.0 / scale_; }

  // After an iteration's gradients were checked: returns true when the step must be skipped
  // (found_inf), and updates the scale by the rule above.
  bool update(bool found_inf) {
    if (!config_.dynamic) return found_inf;
    if (found_inf) {
      growth_tracker_ = 0;
      if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * config_.backoff_factor, config_.min_scale);
      return true;
    }
    if (++growth_tracker_ == config_.growth_interval) {
      growth_tracker_ = 0;
      hysteresis_tracker_ = config_.hysteresis;
      scale_ *= config_.growth_factor;
    }
    return false;
  }

  const LossScalerConfig& config() const { return config_; }
  int growth_tracker() const { return growth_tracker_; }
  int hysteresis_tracker() const { return hysteresis_tracker_; }
  // Restores a saved state (checkpoints).
  void restore(double scale, int growth_tracker, int hysteresis_tracker) {
    if (!(scale > 0) || !std::isfinite(scale)) fail<ConfigError>("loss scaler: a saved scale must be finite and > 0, got ", scale);
    scale_ = scale;
    growth_tracker_ = growth_tracker;
    hysteresis_tracker_ = hysteresis_tracker;
  }

 private:
  LossScalerConfig config_;
  double scale_ = 1.0;
  int growth_tracker_ = 0;
  int hysteresis_tracker_ = 1;
};

STRATA_NAMESPACE_END
