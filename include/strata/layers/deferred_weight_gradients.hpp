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
//
// A list made `at_collectives` serves the other use: overlapping the tensor-parallel collectives
// of a backward. A layer given such a list issues each collective of its backward on the
// communicator's overlapped handle, runs the list (the weight gradients of the layers whose
// backward came before, which do not depend on the collective) while the collective is in flight,
// joins it, and appends its own weight gradients for the next collective. Whoever made the list
// runs what is left before the gradients are read (TransformerLayer: before its backward returns).
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "../core/config.hpp"

STRATA_NAMESPACE_BEGIN

class DeferredWeightGradients {
 public:
  enum class mode {
    by_owner,       // run by the list's owner (a split backward's second half)
    at_collectives  // also run by the layers, while each of their backward collectives is in flight
  };
  DeferredWeightGradients() = default;
  explicit DeferredWeightGradients(mode m) : mode_(m) {}
  DeferredWeightGradients(DeferredWeightGradients&&) = default;
  DeferredWeightGradients& operator=(DeferredWeightGradients&&) = default;

  bool runs_at_collectives() const { return mode_ == mode::at_collectives; }
  void add(std::function<void()> work) { work_.push_back(std::move(work)); }
  // Appends `other`'s work after this list's, in its order, and empties `other`.
  void append(DeferredWeightGradients&& other) {
    for (auto& work : other.work_) work_.push_back(std::move(work));
    other.work_.clear();
  }
  // Runs every deferred computation in order and empties the list.
  void run() {
    for (auto& work : work_) work();
    work_.clear();
  }
  std::size_t size() const { return work_.size(); }
  bool empty() const { return work_.empty(); }

 private:
  std::vector<std::function<void()>> work_;
  mode mode_ = mode::by_owner;
};

STRATA_NAMESPACE_END
