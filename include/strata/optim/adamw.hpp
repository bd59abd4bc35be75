// strata/optim/adamw.hpp: `AdamW<T>`, Adam with decoupled weight decay (Loshchilov & Hutter), with
// main parameters kept in accumulate_t<T> -- the fp32 master copy for bf16 / fp16 models.
//
// Per parameter the optimizer keeps, in A = accumulate_t<T> (float for bf16 / fp16, T otherwise):
//   main        the master weights; the model's value is main rounded to T after every step
//   exp_avg     m, the first moment
//   exp_avg_sq  v, the second moment
// and one step counter t for the whole optimizer. A step with learning rate lr, for every element:
//   t += 1
//   main -= lr * weight_decay * main                 (only when the parameter has weight_decay)
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2
//   main -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
//   value = T(main)
// computed in A (the bias corrections in double, then rounded to A) by the backend's adamw_step,
// one call per parameter; the state lives in the backend's space. The gradient g is the
// parameter's grad (already in A), read as it is: reduce over data parallel and clip before step().
//
// Tensor parallelism needs no communication here: each rank updates its own shard, and replicated
// parameters (biases of row-parallel layers, norms) receive the same gradient on every rank, so
// they stay identical. The module is visited through `for_each_parameter`; step() checks that it
// sees the same parameters, in the same order and with the same shapes, as the constructor did.
//
// for_each_state exposes the state as named tensors ("<param>.main", "<param>.exp_avg",
// "<param>.exp_avg_sq") for checkpoints; steps() / set_steps() carry t.
//
// The per-parameter state records the parameter's global shape and ShardSpec, so a checkpoint can
// store where each moment lives.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../backend/adamw_step.hpp"
#include "../backend/cpu/backend.hpp"
#include "../core/tensor.hpp"
#include "../shard/shard_spec.hpp"
#include "grad_utils.hpp"

STRATA_NAMESPACE_BEGIN

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;

  // The constants of update number `step` (1, 2, ...) at learning rate lr, in A: bias corrections
  // 1 - beta^step, decay = lr * weight_decay (applied where a tensor decays), the skip flag and the
  // gradients' factor (AdamWStep).
  template <class A>
  AdamWStep<A> step_constants(double lr, std::int64_t step, const double* skip_unless_finite,
                              const double* grad_scale = nullptr) const {
    const double t = static_cast<double>(step);
    AdamWStep<A> c;
    c.lr = static_cast<A>(lr);
    c.beta1 = static_cast<A>(beta1);
    c.beta2 = static_cast<A>(beta2);
    c.one_minus_beta1 = static_cast<A>(1.0 - beta1);
    c.one_minus_beta2 = static_cast<A>(1.0 - beta2);
    c.eps = static_cast<A>(eps);
    c.bias_correction1 = static_cast<A>(1.0 - std::pow(beta1, t));
    c.bias_correction2 = static_cast<A>(1.0 - std::pow(beta2, t));
    c.skip_unless_finite = skip_unless_finite;
    c.grad_scale = grad_scale;
    c.decay = static_cast<A>(lr * weight_decay);
    return c;
  }

  void validate() const {
    if (!(beta1 >= 0 && beta1 < 1)) fail<ConfigError>("AdamW: beta1 must lie in [0, 1), got ", beta1);
    if (!(beta2 >= 0 && beta2 < 1)) fail<ConfigError>("AdamW: beta2 must lie in [0, 1), got ", beta2);
    if (!(eps > 0) || !std::isfinite(eps)) fail<ConfigError>("AdamW: eps must be a finite number > 0, got ", eps);
    if (!(weight_decay >= 0) || !std::isfinite(weight_decay))
      fail<ConfigError>("AdamW: weight_decay must be a finite number >= 0, got ", weight_decay);
  }
};

// A backend with a multi-tensor AdamW step (adamw_step_many over a span of AdamWTensor).
template <class Device, class T, class A>
concept has_adamw_step_many = requires(Device& d, std::span<const AdamWTensor<T, A>> list, const AdamWStep<A>& step) {
  d.template adamw_step_many<T>(list, step);
};

template <class T, class Space = space::host>
class AdamW {
 public:
  using element_type = T;
  using state_type = accumulate_t<T>;  // main params and moments
  using space_type = Space;

  struct State {
    std::string name;     // the parameter's name
    Shape global_shape;   // the parameter's global (unsharded) shape
    ShardSpec shard;      // where this rank's piece lives
    bool weight_decay = true;
    bool pipeline_copy = false;  // a tied weight's copy on another pipeline stage (same name, same state)
    bool expert = false;         // an expert's weight (Parameter::expert)
    Tensor<state_type, Space> main;
    Tensor<state_type, Space> exp_avg;
    Tensor<state_type, Space> exp_avg_sq;
  };

  // Visits the module's parameters once: main = value (converted on `device`), moments = 0.
  template <class Device, class Module>
    requires(!std::is_same_v<std::remove_cvref_t<Module>, AdamW> && requires { typename Device::space; })
  AdamW(Device& device, Module& model, AdamWConfig config = {}) : config_(config) {
    config_.validate();
    model.for_each_parameter([&](auto& p) {
      check_element_type(p);
      State s;
      s.name = p.name;
      s.global_shape = p.global_shape;
      s.shard = p.shard;
      s.weight_decay = p.weight_decay;
      s.pipeline_copy = detail::is_pipeline_copy(p);
      s.expert = detail::is_expert(p);
      s.main = Tensor<state_type, Space>::empty(p.value.shape());
      device.template convert<T, state_type>(p.value.data(), p.value.numel(), s.main.data());
      s.exp_avg = Tensor<state_type, Space>::zeros(p.value.shape());
      s.exp_avg_sq = Tensor<state_type, Space>::zeros(p.value.shape());
      states_.push_back(std::move(s));
    });
  }
  // Host parameters: on the CPU backend.
  template <class Module>
    requires(!std::is_same_v<std::remove_cvref_t<Module>, AdamW> && std::is_same_v<Space, space::host>)
  AdamW(Module& model, AdamWConfig config = {}) : AdamW(host_device(), model, config) {}

  // One AdamW step with learning rate lr on every parameter of `model` (the one given to the
  // constructor, or one with the same parameters): adamw_step_many where the backend has it, else
  // one adamw_step per parameter.
  // skip_unless_finite (optional, in the device's space): the step changes nothing when it points at
  // a NaN or infinite value (AdamWStep), read by the kernels, so the host does not wait for it.
  // decoupled_lr >= 0: the learning rate of the parameters flagged decoupled_lr (the word embedding
  // and the output layer, Megatron's --decoupled-lr); their weight decay scales with it.
  // grad_scale (optional, in the device's space): every gradient is read times *grad_scale (the
  // clipping factor of clip_factor_device, applied without a pass of its own; AdamWStep).
  template <class Device, class Module>
  void step(Device& device, Module& model, double lr, const double* skip_unless_finite = nullptr, double decoupled_lr = -1,
            const double* grad_scale = nullptr) {
    if (!std::isfinite(lr) || lr < 0) fail<ConfigError>("AdamW::step: the learning rate must be finite and >= 0, got ", lr);
    if (!std::isfinite(decoupled_lr)) fail<ConfigError>("AdamW::step: the decoupled learning rate must be finite, got ", decoupled_lr);
    ++steps_;
    using A = state_type;
    const AdamWStep<A> constants =
        config_.template step_constants<A>(lr, static_cast<std::int64_t>(steps_), skip_unless_finite, grad_scale);
    const AdamWStep<A> decoupled = decoupled_lr >= 0
        ? config_.template step_constants<A>(decoupled_lr, static_cast<std::int64_t>(steps_), skip_unless_finite, grad_scale)
        : constants;
    std::size_t index = 0;
    // A backend with a multi-tensor step updates every parameter in a few launches; otherwise one
    // adamw_step per parameter.
    constexpr bool many = has_adamw_step_many<Device, T, A>;
    std::vector<AdamWTensor<T, A>> tensors, decoupled_tensors;
    model.for_each_parameter([&](auto& p) {
      check_element_type(p);
      State& s = state_for(p, index++);
      const bool decays = s.weight_decay && config_.weight_decay != 0;
      const bool own_rate = decoupled_lr >= 0 && detail::is_decoupled_lr(p);
      if constexpr (many) {
        (own_rate ? decoupled_tensors : tensors)
            .push_back(AdamWTensor<T, A>{s.main.data(), s.exp_avg.data(), s.exp_avg_sq.data(), p.grad.data(), p.value.data(),
                                         s.main.numel(), decays});
      } else {
        AdamWStep<A> step = own_rate ? decoupled : constants;
        if (!decays) step.decay = A(0);
        device.template adamw_step<T>(s.main.data(), s.exp_avg.data(), s.exp_avg_sq.data(), p.grad.data(), p.value.data(),
                                      s.main.numel(), step);
      }
    });
    if (index != states_.size())
      fail<ConfigError>("AdamW::step: the model has ", index, " parameters but the optimizer was built for ",
                        states_.size());
    if constexpr (many) {  // the decay applies to the tensors whose weight_decay is set
      if (!tensors.empty()) device.template adamw_step_many<T>(std::span<const AdamWTensor<T, A>>(tensors), constants);
      if (!decoupled_tensors.empty())
        device.template adamw_step_many<T>(std::span<const AdamWTensor<T, A>>(decoupled_tensors), decoupled);
    }
  }
  template <class Module>
    requires std::is_same_v<Space, space::host>
  void step(Module& model, double lr) {
    auto device = host_device();
    step(device, model, lr);
  }

  // main = value for every parameter (after the model's weights were changed from outside, e.g.
  // loaded without the optimizer state; Megatron's reload_model_params).
  template <class Device, class Module>
  void reload_main_from_model(Device& device, Module& model) {
    std::size_t index = 0;
    model.for_each_parameter([&](auto& p) {
      check_element_type(p);
      State& s = state_for(p, index++);
      device.template convert<T, state_type>(p.value.data(), p.value.numel(), s.main.data());
    });
    if (index != states_.size())
      fail<ConfigError>("AdamW::reload_main_from_model: the model has ", index,
                        " parameters but the optimizer was built for ", states_.size());
  }
  template <class Module>
    requires std::is_same_v<Space, space::host>
  void reload_main_from_model(Module& model) {
    auto device = host_device();
    reload_main_from_model(device, model);
  }

  // exp_avg = exp_avg_sq = 0 (a fresh optimizer over loaded weights).
  template <class Device>
  void reset_moments(Device& device) {
    for (State& s : states_) {
      device.template fill<state_type>(s.exp_avg.data(), s.exp_avg.numel(), 0.0);
      device.template fill<state_type>(s.exp_avg_sq.data(), s.exp_avg_sq.numel(), 0.0);
    }
  }

  // visit(std::string name, Tensor<state_type>& tensor) for "<param>.main", "<param>.exp_avg" and
  // "<param>.exp_avg_sq" of every parameter, in parameter order.
  template <class Visitor>
  void for_each_state(Visitor&& visit) {
    for (State& s : states_) {
      visit(s.name + ".main", s.main);
      visit(s.name + ".exp_avg", s.exp_avg);
      visit(s.name + ".exp_avg_sq", s.exp_avg_sq);
    }
  }
  // The same tensors with where they live: visit(name, tensor, global_shape, shard) (the moments
  // are sharded exactly like their parameter).
  template <class Visitor>
  void for_each_sharded_state(Visitor&& visit) {
    for (State& s : states_) {
      visit(s.name + ".main", s.main, s.global_shape, s.shard);
      visit(s.name + ".exp_avg", s.exp_avg, s.global_shape, s.shard);
      visit(s.name + ".exp_avg_sq", s.exp_avg_sq, s.global_shape, s.shard);
    }
  }

  // The state for checkpoints that reshard: visit(piece, main, exp_avg, exp_avg_sq), one piece per
  // parameter covering its whole local shard, the same on every data-parallel rank.
  template <class Visitor>
  void for_each_state_piece(Visitor&& visit) {
    for (State& s : states_) {
      const StatePiece piece{s.name, s.global_shape, s.shard, 0, s.main.numel(), 0, true, s.pipeline_copy, s.expert};
      visit(piece, s.main, s.exp_avg, s.exp_avg_sq);
    }
  }

  int steps() const { return steps_; }
  void set_steps(int steps) {
    if (steps < 0) fail<ConfigError>("AdamW::set_steps: the step count must be >= 0, got ", steps);
    steps_ = steps;
  }
  const AdamWConfig& config() const { return config_; }
  const std::vector<State>& states() const { return states_; }

 private:
  static cpu::backend& host_device() {
    static cpu::backend device;
    return device;
  }

  template <class P>
  static void check_element_type(const P&) {
    static_assert(std::is_same_v<typename P::value_type, T>,
                  "AdamW<T>: the model has a parameter whose element type is not T; build the optimizer with "
                  "the model's element type.");
  }

  template <class P>
  State& state_for(const P& p, std::size_t index) {
    if (index >= states_.size())
      fail<ConfigError>("AdamW: the model has more parameters than the ", states_.size(),
                        " the optimizer was built for (first extra: '", p.name, "')");
    State& s = states_[index];
    if (s.name != p.name)
      fail<ConfigError>("AdamW: parameter ", index, " is '", p.name, "' but the optimizer was built with '", s.name,
                        "' in that place; pass the same model the optimizer was built for");
    if (!(s.main.shape() == p.value.shape()) || !(p.grad.shape() == p.value.shape()))
      fail<ShapeError>("AdamW: parameter '", p.name, "' has value ", p.value.shape().str(), " and gradient ",
                       p.grad.shape().str(), " but the optimizer state is ", s.main.shape().str());
    return s;
  }

  AdamWConfig config_;
  std::vector<State> states_;
  int steps_ = 0;
};

STRATA_NAMESPACE_END
