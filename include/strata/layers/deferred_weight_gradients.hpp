// strata/layers/deferred_weight_gradients.hpp: `DeferredWeightGradients`, the second half of a
// split backward.
//
// The layer contract's backward computes the input gradient and accumulates the weight gradients
// at once. A zero-bubble pipeline schedule splits it: the input gradient (on the critical path to
// the previous stage) runs first, the weight gradients later, in a bubble. A layer's backward takes
// an optional list; given one, a layer that can split appends its weight-gradient work (a closure
// holding the tensors it reads: the saved input and the output gradient, shared handles) instead of
// running it, and `run()` runs the list in the order it was filled. The gradients are the same bits
// as the fused backward's (the same calls on the same operands). A layer that cannot split does its
// whole backward at once and appends nothing.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "../core/config.hpp"

STRATA_NAMESPACE_BEGIN

class DeferredWeightGradients {
 public:
  void add(std::function<void()> work) { work_.push_back(std::move(work)); }
  // Runs every deferred computation in order and empties the list.
  void run() {
    for (auto& work : work_) work();
    work_.clear();
  }
  std::size_t size() const { return work_.size(); }
  bool empty() const { return work_.empty(); }

 private:
  std::vector<std::function<void()>> work_;
};

STRATA_NAMESPACE_END
