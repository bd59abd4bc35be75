// strata/optim/lr_schedule.hpp: `LrSchedule`, the learning rate as a function of the step, with the
// semantics of Megatron-Core's OptimizerParamScheduler (warmup, then decay). A step is whatever the
// caller counts: iterations, or samples as Megatron's scheduler does (the trainers pass the samples
// consumed, so batch-size ramp-ups and sample-based runs follow Megatron exactly).
//
//   it <= warmup_iters (warmup_iters > 0)  lr = init + (max_lr - init) * it / warmup_iters, init =
//                                           warmup_init (Megatron's --lr-warmup-init, default 0)
//   style constant                          lr = max_lr
//   it > decay_iters                        lr = min_lr
//   otherwise, ratio = (it - warmup) / (decay_iters - warmup):
//     linear                                lr = max_lr - (max_lr - min_lr) * ratio
//     cosine                                lr = min_lr + (max_lr - min_lr) * 0.5 * (cos(pi * ratio) + 1)
//
// As in Megatron, the constant style stays at max_lr after warmup (it never drops to min_lr).
// decay_iters = 0 means "decay over the whole run": train_iters is used instead. A warmup that is a
// fraction of the decay (Megatron's --lr-warmup-fraction) need not be a whole number of steps:
// fractional_warmup > 0 replaces warmup_iters with that real number, as Megatron keeps it. The schedule is a
// plain aggregate so a trainer fills it with designated initializers; `validate()` (also run by
// `lr()`) throws ConfigError with a sentence naming the bad value.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <string_view>

#include "../core/error.hpp"

STRATA_NAMESPACE_BEGIN

enum class LrDecayStyle { constant, linear, cosine };

constexpr std::string_view lr_decay_style_name(LrDecayStyle style) {
  switch (style) {
    case LrDecayStyle::constant: return "constant";
    case LrDecayStyle::linear: return "linear";
    case LrDecayStyle::cosine: return "cosine";
  }
  return "unknown";
}

// "constant", "linear" or "cosine" (Megatron's --lr-decay-style values this library implements).
inline LrDecayStyle parse_lr_decay_style(std::string_view text) {
  for (LrDecayStyle style : {LrDecayStyle::constant, LrDecayStyle::linear, LrDecayStyle::cosine})
    if (text == lr_decay_style_name(style)) return style;
  fail<ConfigError>("unknown learning-rate decay style '", text, "'; valid values are constant, linear, cosine");
}

struct LrSchedule {
  double max_lr = 0;
  double min_lr = 0;
  std::int64_t warmup_iters = 0;
  std::int64_t decay_iters = 0;  // 0: decay over train_iters
  LrDecayStyle style = LrDecayStyle::cosine;
  std::int64_t train_iters = 0;  // the run's length; used when decay_iters is 0
  double fractional_warmup = 0;  // > 0: the warmup in steps, not rounded (replaces warmup_iters)
  double warmup_init = 0;        // the learning rate warmup starts from (step 0)

  // The warmup length: fractional_warmup when set, else warmup_iters.
  constexpr double warmup() const { return fractional_warmup > 0 ? fractional_warmup : static_cast<double>(warmup_iters); }

  // The step at which decay ends (decay_iters, else train_iters).
  constexpr std::int64_t effective_decay_iters() const { return decay_iters > 0 ? decay_iters : train_iters; }

  void validate() const {
    if (!std::isfinite(max_lr) || max_lr < 0)
      fail<ConfigError>("the maximum learning rate must be a finite number >= 0, got ", max_lr);
    if (!std::isfinite(min_lr) || min_lr < 0 || min_lr > max_lr)
      fail<ConfigError>("the minimum learning rate must lie in [0, max_lr = ", max_lr, "], got ", min_lr);
    if (!std::isfinite(warmup_init) || warmup_init < 0)
      fail<ConfigError>("the learning rate warmup starts from (--lr-warmup-init) must be a finite number >= 0, got ",
                        warmup_init);
    if (warmup_iters < 0) fail<ConfigError>("the number of warmup iterations must be >= 0, got ", warmup_iters);
    if (!std::isfinite(fractional_warmup) || fractional_warmup < 0)
      fail<ConfigError>("the fractional warmup must be a finite number of steps >= 0, got ", fractional_warmup);
    if (decay_iters < 0 || train_iters < 0)
      fail<ConfigError>("decay_iters and train_iters must be >= 0, got ", decay_iters, " and ", train_iters);
    const std::int64_t decay = effective_decay_iters();
    if (style != LrDecayStyle::constant && decay == 0)
      fail<ConfigError>("the ", lr_decay_style_name(style),
                        " learning-rate decay needs decay_iters (or train_iters when decay_iters is 0) > 0");
    if (decay > 0 && warmup() > static_cast<double>(decay))
      fail<ConfigError>("warmup_iters = ", warmup(), " is more than the ", decay,
                        " iterations the learning rate decays over; warmup must end before decay does");
  }

  // The learning rate at step `iteration` (>= 0).
  double lr(std::int64_t iteration) const {
    validate();
    if (iteration < 0) fail<ConfigError>("LrSchedule::lr: the iteration must be >= 0, got ", iteration);
    const double warmup_steps = warmup();
    if (warmup_steps > 0 && static_cast<double>(iteration) <= warmup_steps)
      return warmup_init + (max_lr - warmup_init) * static_cast<double>(iteration) / warmup_steps;
    if (style == LrDecayStyle::constant) return max_lr;
    const std::int64_t decay = effective_decay_iters();
    if (iteration > decay) return min_lr;
    const double ratio = (static_cast<double>(iteration) - warmup_steps) / (static_cast<double>(decay) - warmup_steps);
    const double delta = max_lr - min_lr;
    if (style == LrDecayStyle::linear) return max_lr - delta * ratio;
    return min_lr + delta * 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  }
};

STRATA_NAMESPACE_END
