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
// computed in A (the bias corrections in double, then rounded to A). The gradient g is the
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
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "../shard/shard_spec.hpp"

STRATA_NAMESPACE_BEGIN

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;

  void validate() const {
    if (!(beta1 >= 0 && beta1 < 1)) fail<ConfigError>("AdamW: beta1 must lie in [0, 1), got ", beta1);
    if (!(beta2 >= 0 && beta2 < 1)) fail<ConfigError>("AdamW: beta2 must lie in [0, 1), got ", beta2);
    if (!(eps > 0) || !std::isfinite(eps)) fail<ConfigError>("AdamW: eps must be a finite number > 0, got ", eps);
    if (!(weight_decay >= 0) || !std::isfinite(weight_decay))
      fail<ConfigError>("AdamW: weight_decay must be a finite number >= 0, got ", weight_decay);
  }
};

template <class T>
class AdamW {
 public:
  using element_type = T;
  using state_type = accumulate_t<T>;  // main params and moments

  struct State {
    std::string name;     // the parameter's name
    Shape global_shape;   // the parameter's global (unsharded) shape
    ShardSpec shard;      // where this rank's piece lives
    bool weight_decay = true;
    Tensor<state_type> main;
    Tensor<state_type> exp_avg;
    Tensor<state_type> exp_avg_sq;
  };

  // Visits the module's parameters once: main = value, moments = 0.
  template <class Module>
    requires(!std::is_same_v<std::remove_cvref_t<Module>, AdamW>)
  AdamW(Module& module, AdamWConfig config = {}) : config_(config) {
    config_.validate();
    module.for_each_parameter([&](auto& p) {
      check_element_type(p);
      State s;
      s.name = p.name;
      s.global_shape = p.global_shape;
      s.shard = p.shard;
      s.weight_decay = p.weight_decay;
      s.main = convert<state_type, T>(p.value.view());
      s.exp_avg = Tensor<state_type>(p.value.shape());
      s.exp_avg_sq = Tensor<state_type>(p.value.shape());
      states_.push_back(std::move(s));
    });
  }

  // One AdamW step with learning rate lr on every parameter of `module` (the one given to the
  // constructor, or one with the same parameters).
  template <class Module>
  void step(Module& module, double lr) {
    if (!std::isfinite(lr) || lr < 0) fail<ConfigError>("AdamW::step: the learning rate must be finite and >= 0, got ", lr);
    ++steps_;
    using A = state_type;
    const double t = static_cast<double>(steps_);
    const A bias_correction1 = static_cast<A>(1.0 - std::pow(config_.beta1, t));
    const A bias_correction2 = static_cast<A>(1.0 - std::pow(config_.beta2, t));
    const A beta1 = static_cast<A>(config_.beta1), beta2 = static_cast<A>(config_.beta2);
    const A one_minus_beta1 = static_cast<A>(1.0 - config_.beta1), one_minus_beta2 = static_cast<A>(1.0 - config_.beta2);
    const A eps = static_cast<A>(config_.eps), rate = static_cast<A>(lr);
    const A decay = static_cast<A>(lr * config_.weight_decay);
    std::size_t index = 0;
    module.for_each_parameter([&](auto& p) {
      check_element_type(p);
      State& s = state_for(p, index++);
      const index_t n = s.main.numel();
      A* w = s.main.data();
      A* m = s.exp_avg.data();
      A* v = s.exp_avg_sq.data();
      const A* g = p.grad.data();
      T* value = p.value.data();
      const bool apply_decay = s.weight_decay && config_.weight_decay != 0;
      for (index_t i = 0; i < n; ++i) {
        A x = w[i];
        if (apply_decay) x = x - decay * x;
        m[i] = beta1 * m[i] + one_minus_beta1 * g[i];
        v[i] = beta2 * v[i] + one_minus_beta2 * g[i] * g[i];
        const A m_hat = m[i] / bias_correction1;
        const A v_hat = v[i] / bias_correction2;
        x = x - rate * m_hat / (std::sqrt(v_hat) + eps);
        w[i] = x;
        value[i] = static_cast<T>(x);
      }
    });
    if (index != states_.size())
      fail<ConfigError>("AdamW::step: the module has ", index, " parameters but the optimizer was built for ",
                        states_.size());
  }

  // main = value for every parameter (after the model's weights were changed from outside, e.g.
  // loaded without the optimizer state; Megatron's reload_model_params).
  template <class Module>
  void reload_main_from_model(Module& module) {
    std::size_t index = 0;
    module.for_each_parameter([&](auto& p) {
      check_element_type(p);
      State& s = state_for(p, index++);
      s.main = convert<state_type, T>(p.value.view());
    });
    if (index != states_.size())
      fail<ConfigError>("AdamW::reload_main_from_model: the module has ", index,
                        " parameters but the optimizer was built for ", states_.size());
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

  int steps() const { return steps_; }
  void set_steps(int steps) {
    if (steps < 0) fail<ConfigError>("AdamW::set_steps: the step count must be >= 0, got ", steps);
    steps_ = steps;
  }
  const AdamWConfig& config() const { return config_; }
  const std::vector<State>& states() const { return states_; }

 private:
  template <class P>
  static void check_element_type(const P&) {
    static_assert(std::is_same_v<typename P::value_type, T>,
                  "AdamW<T>: the module has a parameter whose element type is not T; build the optimizer with "
                  "the model's element type.");
  }

  template <class P>
  State& state_for(const P& p, std::size_t index) {
    if (index >= states_.size())
      fail<ConfigError>("AdamW: the module has more parameters than the ", states_.size(),
                        " the optimizer was built for (first extra: '", p.name, "')");
    State& s = states_[index];
    if (s.name != p.name)
      fail<ConfigError>("AdamW: parameter ", index, " is '", p.name, "' but the optimizer was built with '", s.name,
                        "' in that place; pass the same module the optimizer was built for");
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
