// strata/optim/grad_buffer.hpp: `GradBuffer<T, Space>`, the gradients of a model in one contiguous
// buffer split into buckets, and their reduction over the data-parallel group (Megatron's
// ParamAndGradBuffer).
//
// Layout. Parameters are placed in the reverse of their for_each_parameter order, since backward
// produces gradients roughly from the last layer to the first, so the first bucket completes first:
//
//   buffer (G = accumulate_t<T>):  | bucket 0                      | bucket 1            | ...
//                                  | p_last | pad | p_last-1 | pad |  ...          | pad |
//
//   - each parameter starts at a multiple of `alignment` elements (64: 256 bytes of float);
//   - a bucket is closed after the parameter that brings it to at least `bucket_size` elements (a
//     parameter is never split across buckets; the last bucket holds whatever remains);
//   - each bucket is padded at its end to a multiple of dp x alignment elements, so it splits into dp
//     equal shards of a multiple of `alignment` elements each; padding holds zeros;
//   - each parameter's `grad` becomes a view into the buffer (Tensor::alias), so the layers keep
//     accumulating into p.grad as before. With `param_buffer` (the distributed optimizer) the values
//     get the same layout in a buffer of T, and each `value` becomes a view into it.
//
// FP8 parameter gather (fp8_param_gather, with the distributed optimizer). The weights an FP8 linear
// layer casts (Parameter::fp8) fill buckets that hold nothing else: while the buffer is laid out
// two buckets are open, one of each kind, and each takes the next place in the buffer when it is
// closed. Such a "code bucket" also has one byte per element in codes() (laid out as the bucket),
// and the parameter gather moves those codes instead of its values (DistributedOptimizer::
// finish_step casts them); gather_values() brings the values too when something reads them whole.
// Without the option every parameter is placed as above.
//
// Reduction. With plain data parallelism a bucket is all-reduced (sum) in place; with the
// distributed optimizer it is reduce-scattered in place, so dp rank r then holds the sum of shard r
// of every bucket (the rest of the buffer keeps this rank's own partial sums and is not read
// again). `gradient_scaling_factor` (1 / (dp x micro-batches) when the loss is a per-micro-batch
// mean; 1 when each rank's loss is already divided by the global batch's token count, as the
// trainers do) is applied once, to the bucket, right before its collective.
//
// Overlap. Each bucket counts the parameters whose gradient is not final yet; mark_ready(param)
// counts one down and starts the bucket's collective when it reaches zero, so a backward that
// reports each parameter as it finishes (a GradientReady hook, layers/parameter.hpp) has every
// bucket reduced while later layers still run. Buckets are started in order (a bucket that
// completes early waits for the ones before it), since every rank must issue the same collectives
// in the same order. finish_reduction() starts every bucket not started yet. With
// `overlap_communication` the collectives go through the communicator's overlapped handle (NCCL:
// the rank's communication stream, ordered after the compute stream's work so far, so the
// backward's next kernels run beside it) and finish_reduction() joins the compute stream to it;
// the in-process communicator's collectives are done when they return either way. Without it,
// every collective is enqueued on the compute stream.
//
// Parameter gather. With the distributed optimizer, all_gather_parameters() brings every rank the
// updated values, bucket by bucket, the last bucket first (the next forward reads the parameters
// placed last, the embedding, first). Overlapped, each bucket's gather is followed by a mark of
// the communication stream, and the forward's ParameterNeeded hook (needed_hook) makes the compute
// stream wait for the gather of the bucket it is about to read, and no later one; wait_gathered()
// waits for them all (before anything else reads the parameters).
//
// Groups. Gradients of replicated parameters under sequence parallelism (norm weights) are already
// summed over tensor parallelism by their layers' backward; the tied output layer shares the
// embedding's Parameter, which is visited (and placed) once. So every gradient of the buffer is
// reduced over the data-parallel group only (pass ctx.dp_cp under context parallelism).
//
// Experts. An expert's weight (Parameter::expert) is summed over ctx.expert_dp instead, so a model
// with experts gets two buffers, each with its own buckets: one over its dense parameters
// (GradBuffer(device, dense_parameters(model), {.dp = dp size}), reduced over ctx.dp) and one over
// its experts' (expert_parameters(model), {.dp = expert dp size}, reduced over ctx.expert_dp). A
// buffer for more than one rank that mixes the two kinds is refused.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "../layers/parameter.hpp"
#include "grad_utils.hpp"

STRATA_NAMESPACE_BEGIN

struct GradBufferOptions {
  // Elements per bucket before padding (Megatron's --ddp-bucket-size; its default is
  // max(40M, 1M x dp)). 0 means one bucket for the whole model.
  index_t bucket_size = 40'000'000;
  int dp = 1;                     // data-parallel size: buckets pad to dp x alignment
  index_t alignment = 64;         // elements; parameter starts and shard sizes are multiples of it
  bool distributed = false;       // reduce-scatter (the distributed optimizer) instead of all-reduce
  bool param_buffer = false;      // also place the values in a contiguous buffer (needed when distributed)
  bool overlap_communication = false;  // collectives beside compute (the communicator's overlapped handle)
  double gradient_scaling_factor = 1.0;
  // (distributed) The FP8 parameter gather (Megatron's --fp8-param-gather): the weights the FP8
  // linear layers cast (Parameter::fp8) go into buckets of their own, which also hold one byte of
  // FP8 code per element, and the parameter gather moves those codes instead of the values.
  bool fp8_param_gather = false;

  void validate() const {
    if (bucket_size < 0) fail<ConfigError>("GradBuffer: bucket_size=", bucket_size, " must be >= 0 (0: one bucket)");
    if (dp < 1) fail<ConfigError>("GradBuffer: dp=", dp, " must be >= 1");
    if (alignment < 1) fail<ConfigError>("GradBuffer: alignment=", alignment, " must be >= 1");
    if (distributed && !param_buffer)
      fail<ConfigError>("GradBuffer: the distributed optimizer all-gathers parameters in place, so it needs "
                        "param_buffer = true");
    if (fp8_param_gather && !distributed)
      fail<ConfigError>("GradBuffer: the FP8 parameter gather is the distributed optimizer's (each rank casts its shard "
                        "of the weights and the codes are all-gathered), so it needs distributed = true");
  }
};

// a rounded up to a multiple of m
constexpr index_t round_up(index_t a, index_t m) { return (a + m - 1) / m * m; }

template <class T, class Space = space::host>
class GradBuffer {
 public:
  using element_type = T;
  using grad_type = accumulate_t<T>;
  using space_type = Space;
  using Param = Parameter<T, Space>;

  struct Entry {
    Param* param;
    index_t offset;  // first element in the buffer
    index_t numel;
    std::size_t bucket;
  };
  struct Bucket {
    index_t offset;  // first element in the buffer
    index_t numel;   // padded: a multiple of dp x alignment
    index_t used;    // elements up to the end of its last parameter (numel - used is the end padding)
    int parameters;  // how many parameters it holds
    int pending = 0; // parameters whose gradient is not final yet (mark_ready)
    bool started = false;
    bool codes = false;       // FP8 weights with codes (fp8_param_gather): its gather moves the codes
    index_t code_offset = 0;  // its first code in codes()
  };

  // Places every parameter of `model` (all of type Parameter<T, Space>), moves their gradients
  // (and values, with param_buffer) into the buffers and points them there. The model must stay
  // where it is (its parameters are held by address) for the buffer's lifetime.
  template <class Device, class Module>
  GradBuffer(Device& device, Module& model, GradBufferOptions options) : options_(options) {
    options_.validate();
    std::vector<Param*> order;
    model.for_each_parameter([&](auto& p) {
      static_assert(std::is_same_v<std::remove_cvref_t<decltype(p)>, Param>,
                    "GradBuffer<T, Space>: every parameter of the model must be a Parameter<T, Space> of the "
                    "buffer's element type and space.");
      order.push_back(&p);
    });
    std::reverse(order.begin(), order.end());
    check_one_kind(order);
    lay_out(order);
    grads_ = Tensor<grad_type, Space>::zeros(Shape{std::max<index_t>(total_, 1)});
    if (options_.param_buffer) {
      params_ = Tensor<T, Space>::empty(Shape{std::max<index_t>(total_, 1)});
      device.template fill<T>(params_.data(), params_.numel(), 0.0);
    }
    if (code_total_ > 0) {
      codes_ = Tensor<std::uint8_t, Space>::zeros(Shape{code_total_});
    }
    for (Entry& e : entries_) {
      Param& p = *e.param;
      auto grad = Tensor<grad_type, Space>::alias(grads_, e.offset, p.grad.shape());
      if (e.numel > 0) device.template copy<grad_type>(p.grad.data(), e.numel, grad.data());
      p.grad = std::move(grad);
      if (options_.param_buffer) {
        auto value = Tensor<T, Space>::alias(params_, e.offset, p.value.shape());
        if (e.numel > 0) device.template copy<T>(p.value.data(), e.numel, value.data());
        p.value = std::move(value);
      }
      if (buckets_[e.bucket].codes) p.fp8->gathered_codes = codes_of(e);
    }
    reset_ready();
  }
  GradBuffer(const GradBuffer&) = delete;
  GradBuffer& operator=(const GradBuffer&) = delete;
  GradBuffer(GradBuffer&&) = default;

  // grad = 0 for every parameter (one fill over the whole buffer, padding included), and every
  // bucket waits for its parameters again. With `first_write`, the gradients of parameters marked
  // grad_first_write are not filled but marked grad_stale: their first weight-gradient GEMM writes
  // instead of adding (layers/parameter.hpp), and a bucket settles any still stale before its
  // reduction; the rest of the buffer is filled (one multi-tensor fill where the backend has one).
  template <class Device>
  void zero(Device& device, bool first_write = false) {
    reset_ready();
    bool any = false;
    for (Entry& e : entries_) any = (e.param->grad_stale = first_write && e.param->grad_first_write && e.numel > 0) || any;
    if (!any) {
      device.template fill<grad_type>(grads_.data(), grads_.numel(), 0.0);
      return;
    }
    // The runs between the stale gradients (entries_ are in buffer order), padding included.
    std::vector<TensorRef<grad_type>> runs;
    index_t from = 0;
    for (const Entry& e : entries_) {
      if (!e.param->grad_stale) continue;
      if (e.offset > from) runs.push_back({grads_.data() + from, e.offset - from});
      from = e.offset + e.numel;
    }
    if (grads_.numel() > from) runs.push_back({grads_.data() + from, grads_.numel() - from});
    if constexpr (has_fill_many<Device, grad_type>) {
      if (!runs.empty()) device.template fill_many<grad_type>(std::span<const TensorRef<grad_type>>(runs), 0.0);
    } else {
      for (const auto& run : runs) device.template fill<grad_type>(run.data, run.n, 0.0);
    }
  }

  // The gradient of `param` is final for this iteration: counts its bucket down, and starts the
  // collectives of every complete bucket whose predecessors have started.
  template <class Device, class Comm>
  void mark_ready(Device& device, Comm& dp, const Param& param) {
    const Entry& e = entry_of(param);
    Bucket& b = buckets_[e.bucket];
    if (b.pending <= 0)
      fail<Error>("GradBuffer::mark_ready: parameter '", param.name, "' was reported twice in one iteration (its bucket ",
                  e.bucket, " has no parameter left to wait for); call zero() at the start of every iteration");
    --b.pending;
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) start_bucket(device, dp, next_bucket_++);
  }

  // Starts the collective of every bucket not started yet, in order (the end of the backward); with
  // overlap_communication the compute stream then waits for them all.
  template <class Device, class Comm>
  void finish_reduction(Device& device, Comm& dp) {
    while (next_bucket_ < buckets_.size()) start_bucket(device, dp, next_bucket_++);
    if (options_.overlap_communication && dp.size() > 1) join_overlapped(dp);
  }

  // The mark_ready of every parameter, as a GradientReady hook for a model's backward.
  template <class Device, class Comm>
  GradientReady<T, Space> ready_hook(Device& device, Comm& dp) {
    return [this, &device, &dp](Param& p) { mark_ready(device, dp, p); };
  }

  // Buckets whose collective has started in this iteration.
  std::size_t buckets_started() const { return next_bucket_; }

  // This rank's shard of bucket b (distributed): elements [first, first + size) of the buffer.
  index_t shard_begin(std::size_t b, int dp_rank) const { return buckets_[b].offset + dp_rank * shard_size(b); }
  index_t shard_size(std::size_t b) const { return buckets_[b].numel / options_.dp; }

  // All-gathers the parameter buffer over `dp` in place, bucket by bucket: after the distributed
  // optimizer updated this rank's shards, every rank holds every updated value. With `overlapped`
  // the gathers run beside compute (the communicator's overlapped handle), the last bucket first,
  // each followed by a mark; until wait_gathered(dp) (or needed_hook for every parameter) nothing
  // may read or write the parameters.
  template <class Comm>
  void all_gather_parameters(Comm& dp, bool overlapped = false) {
    if (!options_.param_buffer)
      fail<ConfigError>("GradBuffer::all_gather_parameters: this buffer has no parameter buffer (param_buffer = false)");
    check_group(dp, "all_gather_parameters");
    wait_gathered(dp);  // a gather still pending (nothing read every bucket) ends before this one writes
    if (dp.size() == 1) return;
    Comm comm = overlapped ? overlapped_handle(dp) : dp;
    for (std::size_t k = buckets_.size(); k-- > 0;) {
      if (buckets_[k].codes) gather_bucket(comm, dp.rank(), k, codes_.data() + buckets_[k].code_offset);
      else gather_bucket(comm, dp.rank(), k, params_.data() + buckets_[k].offset);
      if (overlapped) gather_marks_.push_back(overlapped_mark(comm));
    }
    gathers_waited_ = 0;
    values_stale_ = code_total_ > 0;
  }

  // Under the FP8 parameter gather: the values of the FP8 weights' buckets, which the parameter
  // gather leaves as they were outside this rank's shard (it moves their codes), all-gathered now
  // in place, so every rank holds every updated value (before a checkpoint or an export reads
  // them). Does nothing when they are current.
  template <class Comm>
  void gather_values(Comm& dp) {
    check_group(dp, "gather_values");
    wait_gathered(dp);
    if (!values_stale_) return;
    for (std::size_t k = buckets_.size(); k-- > 0;)
      if (buckets_[k].codes) gather_bucket(dp, dp.rank(), k, params_.data() + buckets_[k].offset);
    values_stale_ = false;
  }
  // Whether the FP8 weights' values are stale outside this rank's shards (see gather_values).
  bool values_stale() const { return values_stale_; }

  // After an overlapped all_gather_parameters: the compute stream waits for the gather of bucket b
  // (and of the buckets issued before it, which end first). Does nothing once waited.
  template <class Comm>
  void wait_gathered(Comm& dp, std::size_t b) {
    if (gather_marks_.empty()) return;
    const std::size_t position = buckets_.size() - 1 - b;  // issue order: the last bucket first
    if (position < gathers_waited_) return;
    join_overlapped(dp, gather_marks_[position]);
    gathers_waited_ = position + 1;
    if (gathers_waited_ == gather_marks_.size()) gather_marks_.clear();
  }
  // ... for every bucket (before the optimizer, an evaluation or a checkpoint reads the parameters).
  template <class Comm>
  void wait_gathered(Comm& dp) {
    if (!gather_marks_.empty()) wait_gathered(dp, 0);
  }
  // The ParameterNeeded hook for the forward after an overlapped gather: waits for the parameter's
  // bucket the first time one of its parameters is needed.
  template <class Comm>
  ParameterNeeded<T, Space> needed_hook(Comm& dp) {
    return [this, &dp](const Param& p) { wait_gathered(dp, entry_of(p).bucket); };
  }
  // Buckets of the overlapped gather waited for so far (all of them once nothing is pending).
  std::size_t gathers_waited() const { return gather_marks_.empty() ? buckets_.size() : gathers_waited_; }
  bool gather_pending() const { return !gather_marks_.empty(); }

  const std::vector<Entry>& entries() const { return entries_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const GradBufferOptions& options() const { return options_; }
  index_t size() const { return total_; }  // elements, padding included
  Tensor<grad_type, Space>& grads() { return grads_; }
  Tensor<T, Space>& params() { return params_; }
  // The FP8 codes of the code buckets (fp8_param_gather; empty without): bucket b's at
  // [buckets()[b].code_offset, + numel), laid out as the bucket.
  Tensor<std::uint8_t, Space>& codes() { return codes_; }
  bool has_codes() const { return code_total_ > 0; }
  // Bytes allocated for gradients and (with param_buffer) for values.
  std::int64_t grad_bytes() const { return total_ == 0 ? 0 : static_cast<std::int64_t>(grads_.bytes()); }
  std::int64_t param_bytes() const { return total_ == 0 || params_.empty() ? 0 : static_cast<std::int64_t>(params_.bytes()); }

private:
  // Places `order` into buckets (see the layout above). Under the FP8 parameter gather the FP8
  // weights fill buckets of their own: two buckets are open at a time, one of each kind, and each
  // takes its place in the buffer when it is closed, so the buckets still complete in about the
  // order the backward finishes their parameters.
  void lay_out(const std::vector<Param*>& order) {
    struct Open {
      std::vector<std::pair<Param*, index_t>> members;  // parameter, offset within the bucket
      index_t cursor = 0;
      std::size_t last = 0;  // position in `order` of its last parameter
    };
    struct Closed {
      Open bucket;
      bool codes;
    };
    std::vector<Closed> closed;
    Open open[2];
    auto close = [&](int kind) {
      closed.push_back(Closed{std::move(open[kind]), kind == 1});
      open[kind] = Open{};
    };
    for (std::size_t i = 0; i < order.size(); ++i) {
      Param* p = order[i];
      const int kind = options_.fp8_param_gather && p->fp8 != nullptr ? 1 : 0;
      Open& b = open[kind];
      const index_t offset = round_up(b.cursor, options_.alignment);
      b.members.emplace_back(p, offset);
      b.cursor = offset + p->value.numel();
      b.last = i;
      if (options_.bucket_size > 0 && b.cursor >= options_.bucket_size) close(kind);
    }
    // the last open buckets, the one whose parameters end first first
    const bool both = !open[0].members.empty() && !open[1].members.empty();
    const int first = both && open[1].last < open[0].last ? 1 : 0;
    for (int kind : {first, 1 - first})
      if (!open[kind].members.empty()) close(kind);
    const index_t pad = static_cast<index_t>(options_.dp) * options_.alignment;
    index_t cursor = 0;
    for (Closed& c : closed) {
      Bucket bucket{cursor, round_up(c.bucket.cursor, pad), c.bucket.cursor, static_cast<int>(c.bucket.members.size())};
      if (c.codes) {
        bucket.codes = true;
        bucket.code_offset = code_total_;
        code_total_ += bucket.numel;
      }
      for (const auto& [p, offset] : c.bucket.members) {
        index_of_.emplace(p, entries_.size());
        entries_.push_back(Entry{p, cursor + offset, p->value.numel(), buckets_.size()});
      }
      buckets_.push_back(bucket);
      cursor += bucket.numel;
    }
    total_ = cursor;
  }

  std::uint8_t* codes_of(const Entry& e) { return codes_.data() + buckets_[e.bucket].code_offset + (e.offset - buckets_[e.bucket].offset); }

  const Entry& entry_of(const Param& param) const {
    if (auto it = index_of_.find(&param); it != index_of_.end()) return entries_[it->second];
    fail<ConfigError>("GradBuffer: parameter '", param.name, "' is not in this buffer; pass a parameter of the model the "
                      "buffer was built for");
  }

  // Dense and expert weights are reduced over different groups: one buffer per kind.
  void check_one_kind(const std::vector<Param*>& order) const {
    if (options_.dp == 1 || order.empty()) return;
    for (const Param* p : order)
      if (p->expert != order.front()->expert)
        fail<ConfigError>("GradBuffer: parameter '", p->name, "' is ", p->expert ? "an expert's weight" : "a dense weight",
                          " but '", order.front()->name, "' is ", order.front()->expert ? "an expert's" : "dense",
                          "; expert gradients are summed over the expert-data-parallel group, dense ones over dp, so build "
                          "one buffer over dense_parameters(model) and one over expert_parameters(model)");
  }

  template <class Comm>
  void check_group(const Comm& dp, const char* who) const {
    if (dp.size() != options_.dp)
      fail<ConfigError>("GradBuffer::", who, ": the group has ", dp.size(), " ranks but the buffer was laid out for dp=",
                        options_.dp, "; pass the data-parallel group the buffer was built for");
  }

  void reset_ready() {
    for (Bucket& b : buckets_) {
      b.pending = b.parameters;
      b.started = false;
    }
    next_bucket_ = 0;
  }

  // Bucket k of `data` (T values or codes, laid out as the bucket) gathered from each rank's shard.
  template <class Comm, class U>
  void gather_bucket(Comm& comm, int rank, std::size_t k, U* whole) {
    const index_t shard = shard_size(k);
    comm.all_gather(comm_span_t<const U, Comm>(whole + rank * shard, static_cast<std::size_t>(shard)),
                    comm_span_t<U, Comm>(whole, static_cast<std::size_t>(buckets_[k].numel)));
  }

  template <class Device, class Comm>
  void start_bucket(Device& device, Comm& dp, std::size_t index) {
    check_group(dp, "reduction");
    Bucket& b = buckets_[index];
    b.started = true;
    for (Entry& e : entries_)  // a stale gradient no GEMM wrote this iteration is zero
      if (e.bucket == index) settle_gradient(device, *e.param);
    grad_type* data = grads_.data() + b.offset;
    if (options_.gradient_scaling_factor != 1.0)
      device.template scale<grad_type>(data, b.numel, options_.gradient_scaling_factor);
    if (dp.size() == 1) return;
    Comm comm = options_.overlap_communication ? overlapped_handle(dp) : dp;
    if (options_.distributed) {
      const index_t shard = shard_size(index);
      comm.reduce_scatter(comm_span_t<const grad_type, Comm>(data, static_cast<std::size_t>(b.numel)),
                        comm_span_t<grad_type, Comm>(data + dp.rank() * shard, static_cast<std::size_t>(shard)),
                        ReduceOp::sum);
    } else {
      comm.all_reduce(comm_span_t<grad_type, Comm>(data, static_cast<std::size_t>(b.numel)), ReduceOp::sum);
    }
  }

  GradBufferOptions options_;
  std::vector<Entry> entries_;
  std::unordered_map<const Param*, std::size_t> index_of_;  // entry of each parameter
  std::vector<Bucket> buckets_;
  index_t total_ = 0;
  std::size_t next_bucket_ = 0;
  std::vector<std::uint64_t> gather_marks_;  // per bucket of an overlapped gather, in issue order; empty: none pending
  std::size_t gathers_waited_ = 0;           // of gather_marks_
  Tensor<grad_type, Space> grads_;
  Tensor<T, Space> params_;
  Tensor<std::uint8_t, Space> codes_;  // the code buckets' codes (fp8_param_gather)
  index_t code_total_ = 0;
  bool values_stale_ = false;  // see gather_values
};

STRATA_NAMESPACE_END
