// strata/optim/grad_norm_overlap.hpp: `GradNormOverlap<T, Space>`, the squares of the global gradient
// norm summed beside the backward, bucket by bucket, on the backend's side stream.
//
// The global norm (grad_utils.hpp) reads every gradient once more after the backward: 4 bytes a
// parameter at memory speed, 1-2% of a step of a model of billions of parameters on one GPU. A
// bucket of a GradBuffer is final once the buffer starts it (its last parameter reported by the
// backward's GradientReady hook and every bucket before it started; stale gradients settled to
// zero), so its squares can be summed while the backward of the layers before it still runs: the
// squares' blocks, on a stream of the least priority, take the SMs that the GEMMs' and attention's
// last waves leave idle. Each gradient's sum goes to a slot of its own, and finish() adds the slots
// in the order accumulate_grad_squares visits the gradients: the result has the bits of
// accumulate_grad_squares on a backend whose sum_of_squares_many is sum_of_squares_each +
// add_in_order (cuda::backend).
//
// The gradients that count are those accumulate_grad_squares counts (not a pipeline copy; one that
// is not tensor-parallel on tp rank 0 alone) among the parameters of `counted` (a model, or its dense
// or expert parameters) that the buffer holds. Use it only where a started bucket's gradients are
// final on the compute stream: a buffer over one data-parallel rank (elsewhere the bucket's
// collective comes first) and no loss scaler (the unscale comes first).
//
// Per step: reset() with the buffer's zero(); launch_started(device) after each GradBuffer::mark_ready
// (in the hook) sums the buckets the buffer started since the last call; after the buffer's
// finish_reduction, finish(device, accumulator) sums the rest, makes the compute stream wait for the
// side stream and adds every slot to accumulator[0]. Whoever writes the gradients after the backward
// (a test's injected overflow) calls discard(): valid() is then false until the next reset(), and the
// norm must be summed the plain way.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <unordered_map>
#include <vector>

#include "../backend/tensor_ref.hpp"
#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "grad_buffer.hpp"
#include "grad_utils.hpp"

STRATA_NAMESPACE_BEGIN

// A backend that can sum squares on a side stream (cuda::backend; see GradNormOverlap).
template <class Device, class X>
concept has_side_squares = requires(const Device& d, std::span<const SquaresTensor<X>> tensors, double* out,
                                    const double* in, index_t n) {
  { Device::template sum_of_squares_each_workspace<X>(tensors) } -> std::convertible_to<std::size_t>;
  d.template sum_of_squares_each_on_side<X>(tensors, out, out);
  d.add_in_order(in, n, out);
  d.side_fork();
  d.side_join();
};

template <class T, class Space>
class GradNormOverlap {
 public:
  using G = accumulate_t<T>;
  using Param = Parameter<T, Space>;

  // The gradients of `counted` that count towards the norm, in visiting order, found in `buffer`
  // (which must outlive this object and not move). Each bucket's counted gradients must be a run of
  // that order, as the buffer's layout (the reverse of the visiting order) makes them.
  template <class Device, class Module>
  GradNormOverlap(const Device&, const GradBuffer<T, Space>& buffer, Module& counted, int tp_rank) : buffer_(&buffer) {
    static_assert(has_side_squares<Device, G>, "GradNormOverlap: the backend has no side stream for the squares");
    std::unordered_map<const Param*, std::size_t> bucket_of;
    for (const auto& e : buffer.entries()) bucket_of.emplace(e.param, e.bucket);
    buckets_.resize(buffer.buckets().size());
    index_t slot = 0;
    counted.for_each_parameter([&](auto& p) {
      if (detail::is_pipeline_copy(p) || (!p.tensor_parallel() && tp_rank != 0) || p.grad.numel() == 0) return;
      const auto found = bucket_of.find(&p);
      if (found == bucket_of.end())
        fail<Error>("GradNormOverlap: parameter '", p.name, "' counts towards the norm but is not in the gradient buffer");
      Bucket& b = buckets_[found->second];
      if (b.tensors.empty()) b.first_slot = slot;
      else if (b.first_slot + static_cast<index_t>(b.tensors.size()) != slot)
        fail<Error>("GradNormOverlap: the counted gradients of bucket ", found->second,
                    " are not one run of the visiting order (parameter '", p.name, "')");
      b.tensors.push_back({static_cast<const G*>(p.grad.data()), p.grad.numel()});
      ++slot;
    });
    std::size_t workspace = 0;
    for (Bucket& b : buckets_) {
      b.workspace_offset = workspace;
      workspace += Device::template sum_of_squares_each_workspace<G>(std::span<const SquaresTensor<G>>(b.tensors));
    }
    slots_ = slot;
    sums_ = Tensor<double, Space>::zeros(Shape{std::max<index_t>(slots_, 1)});
    workspace_ = Tensor<double, Space>::zeros(Shape{std::max<index_t>(static_cast<index_t>(workspace), 1)});
  }
  GradNormOverlap(const GradNormOverlap&) = delete;
  GradNormOverlap& operator=(const GradNormOverlap&) = delete;
  GradNormOverlap(GradNormOverlap&&) = default;

  // A new step: nothing summed yet.
  void reset() {
    launched_ = 0;
    valid_ = true;
  }
  // Sums, on the side stream, the buckets the buffer has started since the last call.
  template <class Device>
  void launch_started(const Device& device) {
    launch_up_to(device, buffer_->buckets_started());
  }
  // Sums the buckets not summed yet (call after the buffer's finish_reduction), makes the compute
  // stream wait for the side stream and adds every gradient's sum to accumulator[0] in visiting order.
  template <class Device>
  void finish(const Device& device, double* accumulator) {
    if (!valid_) fail<Error>("GradNormOverlap::finish: the gradients were written after the backward (discard()); sum the norm the plain way");
    launch_up_to(device, buckets_.size());
    device.side_join();
    device.add_in_order(sums_.data(), slots_, accumulator);
    launched_ = 0;  // the next step sums every bucket again, reset() or not
  }
  void discard() { valid_ = false; }
  bool valid() const { return valid_; }
  index_t gradients() const { return slots_; }            // how many gradients count
  std::size_t buckets_summed() const { return launched_; }  // in this step so far (0 after finish)

 private:
  struct Bucket {
    std::vector<SquaresTensor<G>> tensors;  // its counted gradients, in visiting order
    index_t first_slot = 0;                 // the slot of its first
    std::size_t workspace_offset = 0;       // doubles
  };

  template <class Device>
  void launch_up_to(const Device& device, std::size_t end) {
    if (end <= launched_) return;
    device.side_fork();
    for (; launched_ < end; ++launched_) {
      const Bucket& b = buckets_[launched_];
      if (b.tensors.empty()) continue;
      device.template sum_of_squares_each_on_side<G>(std::span<const SquaresTensor<G>>(b.tensors), sums_.data() + b.first_slot,
                                                     workspace_.data() + b.workspace_offset);
    }
  }

  const GradBuffer<T, Space>* buffer_;
  std::vector<Bucket> buckets_;  // the buffer's, in its order
  index_t slots_ = 0;
  Tensor<double, Space> sums_;       // (slots_): each counted gradient's sum of squares
  Tensor<double, Space> workspace_;  // the buckets' partials, side by side
  std::size_t launched_ = 0;         // buckets summed (or enqueued) in this step
  bool valid_ = true;
};

STRATA_NAMESPACE_END
