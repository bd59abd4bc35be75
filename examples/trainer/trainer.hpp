// examples/trainer/trainer.hpp: the training loop shared by train_gpt and train_llama.
//
// One loop, two devices (--device):
//   cpu   ranks are threads of this process (in-process communicator, CPU backend);
//   cuda  one rank per GPU (NCCL communicator, CUDA backend built on the rank's GPU and enqueuing on
//         the communicator's stream, so kernels and collectives are ordered on one stream): one
//         process driving --world-size local GPUs from threads (nccl::run), or one process per GPU
//         when torchrun / Slurm / Open MPI variables are set (nccl::init_from_environment; the world
//         size then comes from the environment). Only compiled by nvcc (STRATA_TRAINER_CUDA).
// The world is split into tensor-parallel groups of --tensor-model-parallel-size ranks; the rest is
// data parallel. Each iteration:
//   1. fetch this rank's micro-batches of the global batch and count the tokens that carry loss
//      over every data-parallel rank's batches (on the host: every rank can build every batch), so
//      every token weighs 1 / tokens of the global batch;
//   2. forward + backward per micro-batch (gradients accumulate), the output layer and the loss
//      fused over blocks of rows (models::FusedLoss: the whole logits never exist);
//   3. all-reduce gradients over data parallel, clip by the global norm (across model-parallel
//      ranks), AdamW step with the scheduled learning rate;
//   4. log (iteration, loss, lr, grad norm where taken, tokens/s, time left, peak device memory) to stdout and
//      JSONL; save when due. Loss sums and gradient norms stay on the device (one slot per
//      iteration) and are read by the host at log steps only (the NaN check too: see below);
//      every --eval-interval iterations (and at the end) the loss on the first --eval-iters global
//      batches of the validation part of --split, forward only (model.evaluate; its index is capped at
//      kMaxValidationIndexSamples samples, read cyclically beyond, so memory does not grow with it).
// A NaN or infinite loss or gradient norm stops the run unless --no-check-for-nan-in-loss-and-grad
// is given: from that iteration on the optimizer makes no update (its kernels read a device flag),
// and the host, reading the flag at the next log or save step, stops there naming the iteration,
// before any save. So the weights and the last checkpoint stay those of the last good iteration,
// and the host never waits for the device between log steps.
// Everything is validated before the first allocation, and the memory the run needs is estimated,
// printed and compared with the memory available (plan_memory); checkpoints resume bit for bit.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include <strata/checkpoint.hpp>
#include <strata/checkpoint/huggingface.hpp>
#include <strata/comm.hpp>
#include <strata/data.hpp>
#include <strata/layers.hpp>
#include <strata/models.hpp>
#include <strata/optim.hpp>
#include <strata/policy.hpp>

#include "args.hpp"
#include "entry.hpp"
#include "data_parallel.hpp"
#include "memory_plan.hpp"
#include "tensorboard.hpp"
#include "pipeline_step.hpp"
#include "pipeline_timing.hpp"
#include "resilience.hpp"

#ifdef STRATA_TRAINER_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <strata/backend/cuda/backend.cuh>
#include <strata/comm/nccl.hpp>
#endif


namespace trainer {

using namespace strata;


struct TrainResult {
  int start_iteration = 0;
  std::vector<double> losses;                           // one per iteration run
  std::vector<std::pair<int, double>> validation_losses;  // (iteration, loss) per evaluation
  std::string sample;                                     // text generated after training
  std::string nothing_to_do;  // set when the loaded checkpoint is already at or past --train-iters
  int exited_at = 0;          // --exit-interval / --exit-duration-in-mins: the last iteration run (0: ran to the end)
  double first_step_seconds = 0;  // from launch (main_for) to the end of the first iteration on the device
  // With keep_final_parameters: every parameter after the last step, gathered over tensor
  // parallelism (global shape, row-major), in the model's parameter order.
  std::vector<std::pair<std::string, std::vector<double>>> final_parameters;
  MemoryReport memory;                   // rank 0's allocations (printed at start)
  std::vector<double> loss_scales;       // with a loss scaler: the scale after each iteration
  std::vector<int> skipped_iterations;   // iterations (1-based) whose update was skipped
  // Mixture of experts: per iteration, the load-balancing and z losses as logged (router_log_of;
  // empty when that loss is off).
  std::vector<double> load_balancing_losses, z_losses;
  // Multi-token prediction: per iteration, each depth's mean loss over its tokens (depth-major runs
  // of --mtp-num-layers values), as logged.
  std::vector<double> mtp_losses;
  // pp > 1: per pipeline rank (of tensor- and data-parallel rank 0), the mean time of the schedule's
  // actions and of the whole schedule per step, over the steps after the first (pipeline_timing.hpp),
  // and the bubble the schedule table predicts (its unit-cost model).
  std::vector<double> pipeline_busy_seconds, pipeline_step_seconds;
  double pipeline_predicted_bubble = 0;
};

// A number in the JSONL log: JSON has no NaN or infinity, so a non-finite value (a skipped
// iteration's gradient norm, a diverged loss) is written as null.
struct JsonNumber {
  double value;
  friend std::ostream& operator<<(std::ostream& out, JsonNumber n) {
    return std::isfinite(n.value) ? out << n.value : out << "null";
  }
};


// Any sample source behind one type (the datasets of --data-path, or --mock-data), so the training
// loop is compiled once; a sample is one indirect call, next to the copy of seq_length tokens.
class Samples {
 public:
  Samples() = default;
  template <class Source>
  static Samples of(std::shared_ptr<Source> source) {
    Samples s;
    s.size_ = static_cast<std::int64_t>(source->size());
    s.seq_length_ = static_cast<std::int64_t>(source->seq_length());
    s.sample_ = [source](std::int64_t i, std::span<std::int32_t> out) { source->sample(i, out); };
    return s;
  }
  std::int64_t size() const { return size_; }
  std::int64_t seq_length() const { return seq_length_; }
  void sample(std::int64_t i, std::span<std::int32_t> out) const { sample_(i, out); }

 private:
  std::int64_t size_ = 0, seq_length_ = 0;
  std::function<void(std::int64_t, std::span<std::int32_t>)> sample_;
};

// Samples [0, size) of `inner`, repeated: sample i is inner's sample i mod inner.size().
template <class Source>
struct CycledSamples {
  const Source* inner;
  std::int64_t count;
  std::int64_t size() const { return count; }
  std::int64_t seq_length() const { return inner->seq_length(); }
  void sample(std::int64_t i, std::span<std::int32_t> out) const { inner->sample(i % inner->size(), out); }
};
// The allocation report printed at start: what rank 0 allocated for parameters, gradients and the
// optimizer state (exact bytes), bytes per parameter, and the activation estimate.
inline std::string describe(const MemoryReport& m, bool distributed, int dp) {
  auto part = [](std::int64_t bytes) { return ::strata::detail::concat(models::format_bytes(bytes), " (", bytes, " B)"); };
  char per_parameter[32];
  std::snprintf(per_parameter, sizeof per_parameter, "%.2f", m.bytes_per_parameter());
  return ::strata::detail::concat(
      "memory allocated per rank (rank 0", distributed ? ", distributed optimizer over dp=" : ", dp=", dp, "): ",
      m.parameters, " parameters ", part(m.parameter_bytes), ", gradients ", part(m.gradient_bytes), ", optimizer state ",
      part(m.optimizer_bytes), " = ", per_parameter, " bytes per parameter; activations ", part(m.activation_bytes),
      " (estimate for the micro-batches in flight, without recompute)",
      m.measured_state_bytes >= 0
          ? ::strata::detail::concat("; the device allocator holds ", part(m.measured_state_bytes), " for that state")
          : std::string());
}

// The loss scaler's state as TrainState extras (the scale as the bits of its double), and back.
template <class Optimizer>
std::map<std::string, std::int64_t> loss_scaler_state(Optimizer& optimizer) {
  std::map<std::string, std::int64_t> extra;
  if (const LossScaler* s = optimizer.loss_scaler()) {
    extra["loss_scale_bits"] = std::bit_cast<std::int64_t>(s->scale());
    extra["loss_scale_growth_tracker"] = s->growth_tracker();
    extra["loss_scale_hysteresis_tracker"] = s->hysteresis_tracker();
  }
  return extra;
}
template <class Optimizer>
void restore_loss_scaler(Optimizer& optimizer, const TrainState& state) {
  LossScaler* s = optimizer.loss_scaler();
  if (!s || !state.extra.count("loss_scale_bits")) return;
  s->restore(std::bit_cast<double>(state.extra.at("loss_scale_bits")),
             static_cast<int>(state.extra.at("loss_scale_growth_tracker")),
             static_cast<int>(state.extra.at("loss_scale_hysteresis_tracker")));
}

template <class T, bool SP, class Backend = cpu::backend, class Comm = inprocess::communicator>
struct TrainPolicy : default_policy {
  using element = T;
  using backend = Backend;
  using comm = Comm;
  static constexpr bool sequence_parallel = SP;
};

// Peak bytes the device allocator has held (the CUDA caching allocator's counter); -1 on the CPU.
template <class Device>
std::int64_t peak_device_bytes(const Device& device) {
  if constexpr (requires { device.memory_stats().peak_bytes_in_use; })
    return static_cast<std::int64_t>(device.memory_stats().peak_bytes_in_use);
  else
    return -1;
}

// Bytes the device allocator has handed out and not taken back (rounded to its granule); -1 on the CPU.
template <class Device>
std::int64_t device_bytes_in_use(const Device& device) {
  if constexpr (requires { device.memory_stats().bytes_in_use; })
    return static_cast<std::int64_t>(device.memory_stats().bytes_in_use);
  else
    return -1;
}

// Bytes the device allocator holds from the driver (in use or cached); -1 on the CPU.
template <class Device>
std::int64_t reserved_device_bytes(const Device& device) {
  if constexpr (requires { device.memory_stats().bytes_reserved; })
    return static_cast<std::int64_t>(device.memory_stats().bytes_reserved);
  else
    return -1;
}

// Sums `n` host doubles over `comm` (a group of ctx): directly on the host for a host
// communicator, through a device buffer for a device one (one synchronization).
template <class Context, class Comm>
void all_reduce_host_values(Context& ctx, Comm& comm, double* values, index_t n) {
  using Space = typename Context::space;
  if constexpr (std::is_same_v<Space, space::host>) {
    comm.all_reduce(std::span<double>(values, static_cast<std::size_t>(n)), ReduceOp::sum);
  } else {
    auto buffer = Tensor<double, Space>::empty(Shape{n});
    ctx.device.template copy_from_host<double>(values, n, buffer.data());
    comm.all_reduce(buffer.buffer(), ReduceOp::sum);
    ctx.device.template copy_to_host<double>(buffer.data(), n, values);
  }
}

// pp > 1, at the end of training: the mean busy and schedule time per step of every pipeline rank
// (pipeline_timing.hpp), gathered over the pipeline group (collective over ctx.pp), and one line per
// pipeline rank printed by world rank 0 beside the bubble the schedule table predicts
// (pipeline::verify_schedule(shape).bubble_fraction(), as examples/tools/pipeline_schedule prints).
template <class Context, class Timer>
void report_pipeline_times(Context& ctx, Timer& timer, const pipeline::ScheduleShape& shape, bool logger, bool print,
                           TrainResult& result, std::mutex& result_mutex) {
  const PipelineTimes times = timer.finish();
  const int pp = shape.pp, rank = ctx.pp.rank();
  std::vector<double> values(static_cast<std::size_t>(2 * pp), 0.0);  // [pp, 2]: busy, step seconds
  values[static_cast<std::size_t>(2 * rank)] = times.mean_busy();
  values[static_cast<std::size_t>(2 * rank + 1)] = times.mean_step();
  all_reduce_host_values(ctx, ctx.pp, values.data(), 2 * pp);
  if (!logger) return;
  const double predicted = pipeline::verify_schedule(shape).bubble_fraction();
  {
    std::lock_guard lock(result_mutex);
    result.pipeline_predicted_bubble = predicted;
    for (int r = 0; r < pp; ++r) {
      result.pipeline_busy_seconds.push_back(values[static_cast<std::size_t>(2 * r)]);
      result.pipeline_step_seconds.push_back(values[static_cast<std::size_t>(2 * r + 1)]);
    }
  }
  if (!print) return;
  const std::string name(pipeline::schedule_name(shape.kind));
  const std::string over = ::strata::detail::concat(" [", pp, " stages, ", shape.micro_batches, " micro-batches, ", shape.virtual_stages,
                                                    " chunk(s) per rank; ",
                                                    times.first_only ? std::string("the first step only")
                                                                     : ::strata::detail::concat("mean of ", times.steps, " steps after the first"),
                                                    "]");
  for (int r = 0; r < pp; ++r) {
    const double busy = values[static_cast<std::size_t>(2 * r)], step = values[static_cast<std::size_t>(2 * r + 1)];
    std::printf("pipeline rank %d: busy %.1f ms of %.1f ms per step (measured bubble %.1f%%; the %s table predicts %.1f%%)%s\n", r,
                1e3 * busy, 1e3 * step, step > 0 ? 100.0 * (1.0 - busy / step) : 0.0, name.c_str(), 100.0 * predicted,
                r + 1 == pp ? over.c_str() : "");
  }
  std::fflush(stdout);
}

// Continues --sample-prompt token by token (the tokenizer's ids): each step runs the model on the
// last seq_length tokens (padded with EOD after the end, which causal attention ignores) and draws
// the next token from softmax(logits / temperature) over the tokenizer's ids but EOD, with the
// counter-based RNG, so every rank draws the same token. The text is the tokenizer's decode of the
// whole sequence, with bytes that are not valid UTF-8 replaced by U+FFFD.
template <class Context, class Model>
std::string generate(Context& ctx, const Model& model, const TrainArgs& a, data::Tokenizer tokenizer) {
  const index_t window = a.model.seq_length;
  const std::int32_t eod = tokenizer.eod();
  std::vector<std::int32_t> tokens = a.sample_prompt.empty() ? std::vector<std::int32_t>{} : tokenizer.encode(a.sample_prompt);
  const std::size_t prompt_tokens = tokens.size();
  if (tokens.empty()) tokens.push_back(eod);
  const std::uint64_t key = rng::mix(a.seed, 0x73616d706c65ull);  // "sample"
  for (int step = 0; step < a.sample_tokens; ++step) {
    const std::size_t begin = tokens.size() > static_cast<std::size_t>(window) ? tokens.size() - window : 0;
    Tensor<std::int32_t> input(Shape{1, window}, eod);
    for (std::size_t i = begin; i < tokens.size(); ++i) input[static_cast<index_t>(i - begin)] = tokens[i];
    std::vector<double> logits = model.next_token_logits(ctx, input, static_cast<index_t>(tokens.size() - begin - 1));
    logits.resize(static_cast<std::size_t>(std::min<std::int64_t>(tokenizer.vocab_size(), static_cast<std::int64_t>(logits.size()))));
    if (eod >= 0 && static_cast<std::size_t>(eod) < logits.size()) logits[static_cast<std::size_t>(eod)] = -1e300;  // keep writing text
    std::size_t next = 0;
    if (a.sample_temperature == 0) {
      next = static_cast<std::size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      const double top = *std::max_element(logits.begin(), logits.end());
      double total = 0;
      for (double& z : logits) total += (z = std::exp((z - top) / a.sample_temperature));
      double u = rng::uniform(key, static_cast<std::uint64_t>(step)) * total;
      while (next + 1 < logits.size() && u >= logits[next]) u -= logits[next++];
    }
    tokens.push_back(static_cast<std::int32_t>(next));
  }
  if (prompt_tokens == 0) tokens.erase(tokens.begin());  // the EOD that stood in for an empty prompt
  return tokenizer.decode_text(tokens);
}

// What --save-hf writes into config.json that the model does not hold: the --load-hf model's
// token ids and (Llama) max_position_embeddings when the run started from one, else the
// tokenizer's end of document as eos_token_id (GPT-2: its bos_token_id too, the same token).
inline hf::SaveOptions hf_save_options(const TrainArgs& a, const data::Tokenizer& tokenizer, hf::Architecture architecture) {
  hf::SaveOptions options;
  if (!a.load_hf.empty()) {
    hf::carry_settings(hf::read_config(a.load_hf), options);
  } else {
    options.eos_token_id = strata::json::number(static_cast<std::int64_t>(tokenizer.eod()));
    if (architecture == hf::Architecture::gpt2) options.bos_token_id = options.eos_token_id;
  }
  return options;
}

// The token ids of hf_save_options kept in a checkpoint (TrainState::extra "hf_bos_token_id",
// "hf_eos_token_id"), so strata-convert --save-hf writes the config.json the trainer's --save-hf
// writes; ids given as a list (an imported config's several eos ids) are not kept.
inline void record_hf_token_ids(const hf::SaveOptions& ids, std::map<std::string, std::int64_t>& extra) {
  for (const auto& [key, text] : {std::pair{"hf_bos_token_id", &ids.bos_token_id}, std::pair{"hf_eos_token_id", &ids.eos_token_id}})
    if (!text->empty() && std::all_of(text->begin(), text->end(), [](char c) { return c >= '0' && c <= '9'; }) && text->size() < 18)
      extra[key] = std::stoll(*text);
}

// Whether torchrun, Slurm or Open MPI variables say this process is one rank of a job (then the
// cuda device runs one process per GPU and the world size comes from the environment).
inline bool launched_as_job() {
  for (const char* name : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return true;
  }
  return false;
}


// GPUs this process sees; 0 when it was built without CUDA or no GPU is present.
inline int visible_gpus() {
#ifdef STRATA_TRAINER_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
#else
  return 0;
#endif
}

// When the process started (main_for sets it first thing): the origin of "time to first step".
inline std::chrono::steady_clock::time_point& launch_time() {
  static std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  return t;
}

// --profile's window: cudaProfilerStart / cudaProfilerStop on a CUDA build (a tracer or profiler
// brackets those iterations), nothing on the CPU.
inline void profiler_window(bool start, int steps) {
#ifdef STRATA_TRAINER_CUDA
  if (start) {
    ::setenv("STRATA_TRACE_STEPS", std::to_string(steps).c_str(), /*overwrite=*/0);
    (void)cudaProfilerStart();
  } else {
    (void)cudaProfilerStop();
  }
#else
  (void)start;
  (void)steps;
#endif
}

// Everything the ranks share: datasets, the JSONL file, the result (written by rank 0).
template <class Dataset, class Validation>
struct SharedRun {
  const Dataset& dataset;
  const CycledSamples<Validation>& valid_samples;
  bool evaluate;
  std::ofstream& jsonl;
  TensorBoardWriter* tensorboard;  // --tensorboard-dir (rank 0 writes), or null
  TrainResult& result;
  std::mutex& result_mutex;
  const MemoryPlan& memory;  // plan_memory's estimate, made once before the ranks start
  const data::Tokenizer& tokenizer;  // the end-of-document id, and the sample's text
  const BatchSchedule& batches;      // the global batch of each iteration
  Progress* progress = nullptr;              // each rank's phase (resilience.hpp)
  const FaultInjection* fault = nullptr;     // STRATA_FAULT_INJECT (tests)
};

// A backend whose attention plans can be frozen (cuda::backend), and a communicator with a
// process-local host barrier (nccl::communicator).
template <class B>
concept has_frozen_plans = requires(B& b) { b.attention().freeze(); };
template <class B>
concept has_attention_determinism = requires(B& b) { b.attention().deterministic(true); };
template <class B>
concept has_gemm_tuning = requires(B& b) { b.blas().tune(nullptr); };
template <class C>
concept has_local_barrier = requires(C& c) { c.local_barrier(); };
template <class C>
concept has_dry_run = requires(C& c) { c.set_dry_run(true); };

// The FP8 scaling rows of every layer, kept across a forward that is not training (the dry run's
// warm-up, an evaluation), which would otherwise fold its amaxes into the delayed recipe's histories
// and so change the scales of the training steps after it. Nothing is kept without FP8 or (keep_rows
// false) where no history is kept.
//   restore()         every row back (the warm-up, which also steps; its caller then drops the
//                     weight caches, whose fill folded the weight's amax into the rows now restored,
//                     so the next use casts again, folding it where the run without the warm-up does)
//   restore_inputs()  the input rows back (an evaluation's forward folds its inputs' amaxes there);
//                     the weight rows keep what the evaluation folded, which is what the next
//                     training forward folds anyway (the same weights and scale, the cache it filled
//                     read from then on), and the weight caches stay as they are (under the FP8
//                     parameter gather they hold the gathered codes, which no recast could make)
template <class Context>
struct Fp8RowsKept {
  using Space = typename Context::space;
  std::vector<Tensor<float, Space>> rows;
  Fp8RowsKept(const Context& ctx, bool keep_rows) {
    if (ctx.fp8 && keep_rows)
      for (const auto& state : ctx.fp8->states) rows.push_back(state->rows.clone());
  }
  void restore(Context& ctx) const {
    for (std::size_t i = 0; i < rows.size(); ++i)
      ctx.device.template copy<float>(rows[i].data(), rows[i].numel(), ctx.fp8->states[i]->rows.data());
  }
  void restore_inputs(Context& ctx) const {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      auto& state = *ctx.fp8->states[i];
      const auto offset = state.row(Fp8Role::input) - state.rows.data();
      ctx.device.template copy<float>(rows[i].data() + offset, state.row_length(), state.row(Fp8Role::input));
    }
  }
};

// Whether a step takes the global gradient norm: to clip (--clip-grad > 0), for a loss scaler (an
// overflow shows as a non-finite norm), or for the non-finite checks (--check-for-nan-in-loss-and-grad,
// --skip-nonfinite-iterations, which read the norm without a scaler). Otherwise nothing reads it and
// the pass over every gradient is skipped: the log then shows no gradient norm, as Megatron logs
// none without clipping. The updates are the same either way (a norm is only read, never applied,
// when --clip-grad is 0).
inline bool grad_norm_needed(const TrainArgs& a, bool loss_scaler) {
  return a.clip_grad > 0 || loss_scaler || a.check_for_nan_in_loss_and_grad || a.skip_nonfinite_iterations;
}

// The warm-up of a dry run (communicator::set_dry_run): one training step's forwards and backwards
// through the pipeline schedule (fused classifier, as training runs it; with pp > 1 the stages
// compute on whatever the dry receives left in their buffers), one validation forward, the
// gradient reduction and clipping, an optimizer step that changes nothing (its skip flag is NaN;
// the step count is restored) and, when sampling is on, one sampling forward. Gradients are zeroed
// after; the weights, moments and step count are as before.
template <class Context, class Model, class Optimizer, class Dataset>
void warm_up_step(Context& ctx, Model& model, Optimizer& optimizer, const TrainArgs& a, const Dataset& dataset, int micro_steps,
                  std::int32_t eod) {
  using Space = typename Context::space;
  const data::Batch b = data::make_batch(dataset, 0, a.micro_batch_size, data::BatchOptions{eod, false});
  const std::vector<data::Batch> batches(static_cast<std::size_t>(micro_steps), b);
  std::vector<std::uint64_t> keys(static_cast<std::size_t>(micro_steps), rng::mix(a.seed, 0x7761726dull));
  auto loss_sum = Tensor<double, Space>::zeros(Shape{1});
  pipeline_micro_batches(ctx, model, schedule_kind_of(a.pipeline), batches, keys, 1.0, loss_sum,
                         GradientReady<typename Model::Chunk::T, Space>{}, ParameterNeeded<typename Model::Chunk::T, Space>{});
  (void)model.evaluate(ctx, std::span<const data::Batch>(&b, 1));
  optimizer.reduce_gradients(ctx);
  if (grad_norm_needed(a, optimizer.scaling())) (void)optimizer.unscale_and_clip(ctx, model, a.clip_grad);
  auto skip = Tensor<double, Space>::empty(Shape{1});
  ctx.device.template fill<double>(skip.data(), 1, std::numeric_limits<double>::quiet_NaN());
  const int steps = optimizer.steps();
  optimizer.step(ctx, model, a.lr, skip.data());
  optimizer.finish_step(ctx);
  optimizer.wait_parameters(ctx);
  optimizer.set_steps(steps);
  optimizer.zero_gradients(ctx);
  if (a.sample_tokens > 0 && a.pipeline.pipeline_model_parallel_size == 1 && model.virtual_stages() == 1 &&
      a.context_parallel_size == 1) {  // sampling runs whole sequences on whole models
    Tensor<std::int32_t> input(Shape{1, a.model.seq_length}, eod);
    (void)model.chunks().front()->next_token_logits(ctx, input, 0);
  }
  ctx.device.synchronize();
}

// The routers' losses of one iteration as Megatron logs them: each summed over every layer and
// micro-batch (and every rank's share), divided by MoE layers x micro-batches and by its coefficient
// (the balance itself, 1 when perfectly balanced under aux_loss); absent when that loss is off.
struct RouterLog {
  std::optional<double> aux, z;
};
inline RouterLog router_log_of(const models::ModelConfig& m, double aux_sum, double z_sum, int micro_batches) {
  RouterLog log;
  const double per = static_cast<double>(m.moe_layer_count()) * std::max(micro_batches, 1);
  if (m.moe.load_balancing != MoeLoadBalancing::none && m.moe.aux_loss_coeff > 0) log.aux = aux_sum / per / m.moe.aux_loss_coeff;
  if (m.moe.z_loss_coeff > 0) log.z = z_sum / per / m.moe.z_loss_coeff;
  return log;
}

// One rank's training: `world` its world communicator, `device` its backend (Policy::backend).
template <template <class> class Model, class Policy, class Comm, class Shared>
void train_rank(Comm& world, typename Policy::backend device, const TrainArgs& a, Shared& shared) {
  using T = typename Policy::element;
  using Context = context_t<Policy>;
  using Space = typename Context::space;
  constexpr bool SP = Policy::sequence_parallel;
  TrainResult& result = shared.result;
  std::mutex& result_mutex = shared.result_mutex;
  std::ofstream& jsonl = shared.jsonl;
  const int pp = a.pipeline.pipeline_model_parallel_size;
  const int dp = data_parallel_size_of(a);
  const int micro_steps = a.global_batch_size / (a.micro_batch_size * dp);  // of the final global batch (evaluation)
  const data::BatchOptions batch_options{shared.tokenizer.eod(), a.eod_mask_loss};

  Context ctx = Context::create(world, parallel_config_of(a), device);
  ctx.tp_comm_overlap = a.tp_comm_overlap && a.sequence_parallel;
  if (const auto fp8 = fp8_options_of(a)) {  // before the model: its linear layers keep their scaling states here
    ctx.fp8 = std::make_shared<Fp8Scaling<Space>>(*fp8, static_cast<int>(a.model.num_layers));
    if (world.rank() == 0 && !a.quiet) {
      std::printf("fp8: format %s, recipe %s", a.fp8_format.c_str(), a.fp8_recipe.c_str());
      if (fp8->recipe == Fp8RecipeKind::delayed)
        std::printf(", amax history %d (%s), margin %d", fp8->amax_history_len, a.fp8_amax_compute_algo.c_str(), fp8->margin);
      if (fp8->first_last_layers_bf16)
        std::printf(", first %d and last %d layers in %s", fp8->num_layers_at_start_in_bf16, fp8->num_layers_at_end_in_bf16,
                    a.dtype.c_str());
      if (a.fp8_param_gather) std::printf(", weights gathered as FP8 codes");
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  ctx.cp_comm_type = context_parallel_comm_of(a);
  if (ctx.cp_comm_type == ContextParallelComm::a2a_p2p && ctx.cp.size() > 1)
    ctx.split_context_parallel(a.hierarchical_cp_sizes[0]);  // collective over cp
  ctx.tp_comm_overlap_ag = !a.disable_tp_comm_overlap_ag;
  ctx.tp_comm_overlap_rs = !a.disable_tp_comm_overlap_rs;
  ctx.tp_comm_overlap_gather = a.tp_comm_overlap_gather == "collective"     ? Context::OverlapGather::collective
                               : a.tp_comm_overlap_gather == "copy-engines" ? Context::OverlapGather::copy_engines
                                                                            : Context::OverlapGather::ring;
  if (ctx.tp_comm_overlap && ctx.tp.size() > 1 && ctx.tp_comm_overlap_gather == Context::OverlapGather::copy_engines) {
    // The window holds the largest all-gather beside GEMMs: a whole micro-batch of hidden states.
    const auto window_bytes = static_cast<std::size_t>(checked_product("the copy-engine window", a.model.seq_length,
                                                                       a.micro_batch_size, a.model.hidden_size,
                                                                       static_cast<std::int64_t>(sizeof(T))));
    const bool engines = use_copy_engines_for_overlapped_gathers(ctx.tp, window_bytes);
    if (world.rank() == 0 && !a.quiet) {
      if (engines)
        std::printf("tp comm overlap: all-gathers by copy engines through a window of %.1f MiB per rank\n",
                    static_cast<double>(window_bytes) / (1 << 20));
      else
        std::printf("tp comm overlap: copy-engine all-gathers are not available on this communicator (they need NCCL "
                    "2.28 and GPUs that map each other's memory); gathering as --tp-comm-overlap-gather collective\n");
      std::fflush(stdout);
    }
  }
  if constexpr (requires { ctx.device.set_communication_sm_margin(0); })
    if (ctx.tp_comm_overlap) (void)ctx.device.set_communication_sm_margin(a.tp_comm_overlap_sm_margin);
  // The device bytes the model's state takes (parameters, gradients, optimizer state), measured
  // around its construction for the allocation report, leaving out the attention plans' workspace.
  const std::int64_t in_use_before_model = device_bytes_in_use(ctx.device);
  // This rank's pipeline stage(s); with pp = 1 one chunk holding the whole model (pipeline_step.hpp).
  models::PipelineModel<Model, Policy> model(ctx, a.model, layout_of(a.pipeline, a.model));
  auto& whole_model = *model.chunks().front();  // the whole model when pp = 1 (warm-up step, sampling)
  constexpr bool moe = decltype(model)::mixture_of_experts;
  // Plan the attention of every shape the run uses now, before any collective: on the GPU that
  // builds the cuDNN plans, whose code loading waits for every GPU of the process. With one process
  // driving several GPUs, a plan built mid-step would wait for a peer GPU inside a collective that
  // waits for this thread; so in that mode the plans are then frozen (a shape not planned here
  // runs on the flash kernels).
  const auto t_plan = std::chrono::steady_clock::now();
  if constexpr (has_attention_determinism<typename Policy::backend>) device.attention().deterministic(a.deterministic_attention);
  if constexpr (has_gemm_tuning<typename Policy::backend>)
    if (!a.gemm_tuning.empty()) {  // one file per rank: each times its own GPU
      using Tuning = std::remove_cvref_t<decltype(*device.blas().tuning())>;
      const std::string file = world.size() > 1 ? a.gemm_tuning + ".rank" + std::to_string(world.rank()) : a.gemm_tuning;
      device.blas().tune(std::make_shared<Tuning>(file));
    }
  const std::int64_t in_use_before_plans = device_bytes_in_use(ctx.device);
  model.prepare(ctx, a.micro_batch_size);
  if (a.sample_tokens > 0) model.prepare(ctx, 1, /*backward=*/false);
  const std::int64_t plan_bytes = device_bytes_in_use(ctx.device) - in_use_before_plans;
  if (world.rank() == 0 && !a.quiet) {
    const auto now = std::chrono::steady_clock::now();
    std::printf("start-up: %.2f s from launch to the model, %.2f s planning attention\n",
                std::chrono::duration<double>(t_plan - launch_time()).count(), std::chrono::duration<double>(now - t_plan).count());
    std::fflush(stdout);
  }
  if constexpr (has_frozen_plans<typename Policy::backend>)
    if (world.size() > 1 && !launched_as_job()) device.attention().freeze();
  model.init(ctx, a.seed);
  model.set_recompute(recompute_of(a));
  // Gradients in bucketed buffers reduced over data parallelism; AdamW, or its state sharded over
  // data parallelism (--use-distributed-optimizer); the loss scaler of --fp16 / --loss-scale.
  DataParallelOptimizer<T, Space> optimizer(
      ctx, model,
      DataParallelOptions{a.use_distributed_optimizer, static_cast<index_t>(a.ddp_bucket_size),
                          AdamWConfig{a.adam_beta1, a.adam_beta2, a.adam_eps, a.weight_decay}, loss_scaler_of(a),
                          a.overlap_grad_reduce, a.overlap_param_gather, !a.zero_gradients_by_fill, a.fp8_param_gather});
  MemoryReport memory = optimizer.memory(model, shared.memory.stage_estimates.at(static_cast<std::size_t>(ctx.pp.rank())).activation_bytes);
  if (in_use_before_model >= 0) memory.measured_state_bytes = device_bytes_in_use(ctx.device) - in_use_before_model - plan_bytes;
  // One process driving several GPUs: one dry training step first (collectives enqueue nothing),
  // so every kernel, cuBLASLt algorithm and cuDNN plan a step uses is loaded before any collective
  // is in flight (docs/DEVICE.md), then a host barrier so no rank starts the real first step while
  // another still loads.
  if constexpr (has_dry_run<Comm>) {
    if (world.size() > 1 && !launched_as_job()) {
      world.set_dry_run(true);
      const Fp8RowsKept<Context> fp8_rows(ctx, true);  // the warm-up's casts must leave no amax behind
      warm_up_step(ctx, model, optimizer, a, shared.dataset, micro_steps, shared.tokenizer.eod());
      fp8_rows.restore(ctx);
      fp8_drop_weight_caches(ctx);  // the warm-up's weight codes were cast with no collective and its scales are gone
      world.set_dry_run(false);
    }
  }
  // pp > 1: every action of the schedule timed on this rank, for the measured bubble
  // (pipeline_timing.hpp: device events on CUDA, created here, before the first step).
  const pipeline::ScheduleShape schedule_shape{schedule_kind_of(a.pipeline), pp, micro_steps, model.virtual_stages()};
  std::optional<PipelineTimer<typename Policy::backend>> pipeline_timer;
  pipeline::ExecutorOptions executor_options;
  executor_options.overlap_transfers = a.pipeline.overlap_p2p_communication;
  if (pp > 1 && shared.batches.constant()) {  // (a batch schedule changes the actions per step: not timed)
    pipeline_timer.emplace(ctx.device, pipeline::rank_actions(schedule_shape, ctx.pp.rank()).size());
    executor_options.on_action = [&pipeline_timer](const pipeline::Action&, bool begin) { pipeline_timer->on_action(begin); };
  }
  if constexpr (has_local_barrier<Comm>) world.local_barrier();
  const LrSchedule schedule = schedule_of(a);
  const std::optional<LrSchedule> decoupled_schedule = decoupled_schedule_of(a);
  int start = 0;
  std::int64_t consumed = 0;
  // The samples the learning-rate schedule has counted: as Megatron's scheduler, it steps only after
  // an update the loss scaler did not skip (else consumed).
  std::int64_t scheduled = 0;
  const bool logger = world.rank() == 0;
  // --profile's window (cudaProfilerStart/Stop, process-wide): opened by every process's rank when
  // each GPU has its own process, so a tracer in each sees the same iterations; by rank 0 alone when
  // the ranks are threads of one process.
  const bool profiles = logger || launched_as_job();
  // A --load directory without a checkpoint yet (scripts pass --save X --load X from the first run
  // on): start from scratch, and say so.
  const bool load = !a.load.empty() && (a.ckpt_step >= 0 || latest_checkpointed_iteration(a.load).has_value());
  if (!a.load.empty() && !load && logger)
    std::printf("warning: --load %s holds no checkpoint (no %s); training starts from %s\n", a.load.c_str(),
                std::string(kCheckpointTrackerName).c_str(), a.load_hf.empty() ? "scratch" : "--load-hf");
  if (!load && !a.load_hf.empty()) {  // transformers' weights, into this rank's shards; a fresh optimizer over them
    hf::load_hf(ctx, a.load_hf, model);
    optimizer.reload_main_from_model(ctx.device, model);
    if (logger && !a.quiet) std::printf("loaded the Hugging Face model in %s\n", a.load_hf.c_str());
  }
  if (load) {
    LoadOptions options;
    if (a.ckpt_step >= 0) options.iteration = a.ckpt_step;
    options.load_optimizer = !a.no_load_optim && !a.finetune;
    const TrainState state = load_checkpoint(ctx, a.load, model, optimizer, options);
    if (options.load_optimizer) restore_loss_scaler(optimizer, state);
    if (!a.finetune) {
      start = static_cast<int>(state.iteration);
      consumed = state.consumed_samples;
      scheduled = state.extra.count("lr_scheduler_samples") ? state.extra.at("lr_scheduler_samples") : consumed;
      if (state.seed != a.seed)
        fail<ConfigError>("checkpoint in '", a.load, "' was trained with --seed=", state.seed, ", this run has --seed=", a.seed,
                          "; resume with the same seed so the data order matches (or pass --finetune)");
    }
  }
  if (logger) {
    std::lock_guard lock(result_mutex);
    shared.result.start_iteration = start;
  }
  // A finished run resumed again: nothing to train, evaluate or sample (every rank returns here).
  if (start >= a.train_iters) {
    if (logger)
      result.nothing_to_do = ::strata::detail::concat(
          "nothing to do: the checkpoint in '", a.load, "' is at iteration ", start, ", already at or past --train-iters=",
          a.train_iters, "; raise --train-iters to train further");
    return;
  }
  if (logger && !a.quiet) {
    std::int64_t params = 0;
    model.for_each_parameter([&](auto& p) { params += p.global_shape.numel(); });
    std::printf("strata %s: %d ranks on %s (tp=%d, pp=%d %s, cp=%d%s, dp=%d, sequence parallel %s), %s, %lld parameters, global batch %d x %d tokens (%d micro-batches of %d per rank), iterations %d..%d\n",
                a.model_kind.c_str(), a.world_size, a.device.c_str(), a.tensor_model_parallel_size, pp, a.pipeline.pipeline_schedule.c_str(),
                a.context_parallel_size, context_parallel_label(a).c_str(), dp, SP ? "on" : "off",
                a.dtype.c_str(), static_cast<long long>(params), a.global_batch_size, a.model.seq_length, micro_steps,
                a.micro_batch_size, start + 1, a.train_iters);
    std::printf("%s\n", describe(memory, optimizer.distributed(), dp).c_str());
    std::fflush(stdout);
  }
  if (logger) {
    std::lock_guard lock(result_mutex);
    shared.result.memory = memory;
  }
  // Mean loss over the first eval_iters global batches of the validation data (forward only). Under
  // the delayed FP8 recipe its casts' amaxes are not kept (Fp8RowsKept): an evaluation does not
  // change the training run's scales, so a run with evaluations trains as the run without.
  auto validation_loss = [&] {
    const Fp8RowsKept<Context> fp8_rows(ctx, ctx.fp8 && ctx.fp8->options.recipe == Fp8RecipeKind::delayed);
    double sums[2] = {0, 0};  // loss, tokens
    for (int k = 0; k < a.eval_iters; ++k)
      for (int m = 0; m < micro_steps; ++m) {
        const auto first = data::micro_batch_first_sample(static_cast<std::int64_t>(k) * a.global_batch_size,
                                                          a.micro_batch_size, ctx.coords.dp, dp, m);
        const data::Batch b = data::make_batch(shared.valid_samples, first, a.micro_batch_size, batch_options);
        const auto loss = model.evaluate(ctx, std::span<const data::Batch>(&b, 1));
        sums[0] += loss.loss_sum();
        sums[1] += loss.tokens;
      }
    all_reduce_host_values(ctx, ctx.dp_cp, sums, 2);  // each cp rank holds its tokens' part
    fp8_rows.restore_inputs(ctx);
    return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  };
  // --log-jsonl written through: a write that failed (a full disk) stops the run naming the file.
  auto flush_jsonl = [&] {
    if (!jsonl.is_open()) return;
    jsonl.flush();
    if (!jsonl)
      fail<FileError>("cannot write to the --log-jsonl file '", a.log_jsonl, "' (is its disk full?); free space or give "
                      "another file");
  };
  auto report_validation = [&](int iteration, double loss) {
    if (!logger) return;
    {
      std::lock_guard lock(result_mutex);
      result.validation_losses.emplace_back(iteration, loss);
    }
    if (!a.quiet) {
      std::printf("validation  %6d/%6d | loss %.4f | ppl %.3f\n", iteration, a.train_iters, loss, std::exp(loss));
      std::fflush(stdout);
    }
    if (jsonl.is_open()) {
      jsonl << "{\"iteration\": " << iteration << ", \"validation_loss\": " << JsonNumber{loss} << "}\n";
      flush_jsonl();
    }
    if (shared.tensorboard) {
      shared.tensorboard->scalar("lm loss validation", loss, iteration);
      shared.tensorboard->scalar("lm loss validation ppl", std::exp(loss), iteration);
      shared.tensorboard->flush();
    }
  };
  // Per iteration, on the device: the global loss sum and the gradient norm (slot it - start),
  // read by the host at log steps (or every iteration for the NaN check).
  const index_t slots = a.train_iters - start;
  auto loss_history = Tensor<double, Space>::zeros(Shape{slots});
  auto norm_history = Tensor<double, Space>::zeros(Shape{slots});
  const bool norm_needed = grad_norm_needed(a, optimizer.scaling());
  auto loss_sum = Tensor<double, Space>::zeros(Shape{1});
  // Mixture of experts: per iteration the routers' [aux, z] losses summed over every rank, layer and
  // micro-batch (slots 2 (it - start) and +1), read with the loss.
  auto router_history = Tensor<double, Space>::zeros(Shape{moe ? 2 * slots : 1});
  // Multi-token prediction: per iteration each depth's loss sum, then its tokens, summed over the
  // data-parallel ranks and the pipeline stages (2 D values per slot), read with the loss.
  const index_t mtp_depths = a.model.mtp_num_layers;
  auto mtp_history = Tensor<double, Space>::zeros(Shape{std::max<index_t>(1, 2 * mtp_depths * slots)});
  std::vector<int> micro_batches_of(static_cast<std::size_t>(slots), 0);  // per iteration, every data-parallel rank's
  // The NaN check's running sum of every iteration's loss sum and gradient norm: finite exactly
  // while every one of them was. The optimizer skips its update when it is not (read by the
  // kernels), and the host reads it at log and save steps only.
  auto health = Tensor<double, Space>::zeros(Shape{1});
  auto iteration_health = Tensor<double, Space>::zeros(Shape{1});  // --skip-nonfinite-iterations
  std::vector<double> loss_tokens(static_cast<std::size_t>(slots), 0.0), lrs(static_cast<std::size_t>(slots), 0.0);
  std::vector<std::int64_t> consumed_after(static_cast<std::size_t>(slots), 0);  // samples consumed after each iteration
  const std::int64_t start_consumed = consumed;
  bool exited = false;  // --exit-interval / --exit-duration-in-mins stopped the run
  int read_up_to = start;  // iterations [start, read_up_to) have been read and logged
  auto t_interval = std::chrono::steady_clock::now();
  const auto t_begin = t_interval;
  std::optional<AsyncSaver<Context>> saver;
  if (a.async_save) saver.emplace(1);
  const int world_rank = world.rank();
  const auto phase = [&](int iteration, std::string_view what) {
    if (shared.progress) shared.progress->set(world_rank, ::strata::detail::concat("iteration ", iteration, ": ", what));
  };
  // Tests: STRATA_FAULT_INJECT's ":save" fires inside the save of its iteration, after this rank's
  // file is written (on the writing thread with --async-save).
  const auto save_options = [&shared, world_rank](int iteration) {
    SaveOptions options;
    if (shared.fault && shared.fault->in_save)
      options.on_stage = [fault = shared.fault, world_rank, iteration](std::string_view stage) {
        if (stage == "rank_file_written" || stage == "background_write") fault->maybe_fire(world_rank, iteration, true);
      };
    return options;
  };
  auto t_straggler = std::chrono::steady_clock::now();
  int last_straggler_iteration = start;
  bool straggler_started = !a.disable_straggler_on_startup;
  for (int it = start; it < a.train_iters; ++it) {
    if (saver) saver->poll(ctx);  // commits a background save all ranks have written; reports a failed one
    phase(it + 1, "forward and backward");
    if (shared.fault) shared.fault->maybe_fire(world_rank, it + 1, false);
    const index_t slot = it - start;
    if (a.profile && it == a.profile_step_start) {
      ctx.device.synchronize();
      if (profiles) profiler_window(true, a.profile_step_end - a.profile_step_start);
    }
    optimizer.zero_gradients(ctx);
    // This iteration's global batch (a ramp-up or step schedule changes it with the samples consumed).
    const int global_batch = shared.batches.at(consumed);
    const int iteration_micro_steps = global_batch / (a.micro_batch_size * dp);
    std::vector<data::Batch> batches;
    double tokens = 0;  // tokens carrying loss in the global batch: every data-parallel rank's micro-batches
    for (int d = 0; d < dp; ++d)
      for (int m = 0; m < iteration_micro_steps; ++m) {
        const auto first = data::micro_batch_first_sample(consumed, a.micro_batch_size, d, dp, m);
        data::Batch batch = data::make_batch(shared.dataset, first, a.micro_batch_size, batch_options);
        for (index_t i = 0; i < batch.loss_mask.numel(); ++i) tokens += batch.loss_mask[i];
        if (d == ctx.coords.dp) batches.push_back(std::move(batch));
      }
    if (tokens <= 0) fail<ConfigError>("iteration ", it, ": every token of the global batch is masked out");
    ctx.device.template fill<double>(loss_sum.data(), 1, 0.0);
    // Dropout masks keyed by the global index of each micro-batch's first sample, so a sample draws
    // the same masks on whichever data-parallel rank and micro-batch slot holds it (tensor and
    // pipeline parallelism already draw the unsharded masks): every layout trains the same model.
    std::vector<std::uint64_t> dropout_keys;
    for (int m = 0; m < iteration_micro_steps; ++m)
      dropout_keys.push_back(rng::mix(a.seed, static_cast<std::uint64_t>(
                                                  data::micro_batch_first_sample(consumed, a.micro_batch_size, ctx.coords.dp, dp, m))));
    // The loss gradient (mask / tokens, times the loss scaler's factor: 1 without one) is known
    // before the forward, so the output layer and the loss run fused over blocks of rows and the
    // whole logits never exist; the schedule runs the micro-batches (with pp = 1: forward and
    // backward of each in turn).
    // With --overlap-grad-reduce the backward starts each bucket's collective once it is complete.
    // With --overlap-param-gather the forward waits for each bucket of the last step's parameter
    // all-gather right before it reads the bucket's parameters (and for the rest after the step).
    const auto ready = optimizer.gradient_ready(ctx);
    const auto needed = optimizer.parameters_needed(ctx);
    if constexpr (moe) model.reset_router_losses(ctx);
    if (mtp_depths > 0) model.reset_mtp_losses(ctx);
    micro_batches_of[static_cast<std::size_t>(slot)] = iteration_micro_steps * dp;
    if (pipeline_timer) pipeline_timer->begin_step();
    pipeline_micro_batches(ctx, model, schedule_kind_of(a.pipeline), batches, dropout_keys, optimizer.loss_scale() / tokens,
                           loss_sum, ready, needed, executor_options);
    if (pipeline_timer) pipeline_timer->end_step();
    phase(it + 1, "gradient reduction and optimizer step");
    optimizer.wait_parameters(ctx);
    optimizer.reduce_gradients(ctx);
    if constexpr (moe) {  // the expert bias moves by this step's load; the router losses of every rank
      model.update_expert_bias(ctx);
      auto router = model.router_losses(ctx);
      ctx.tp_cp_dp.all_reduce(router.buffer(), ReduceOp::sum);
      if (pp > 1) ctx.pp.all_reduce(router.buffer(), ReduceOp::sum);
      ctx.device.template copy<double>(router.data(), 2, router_history.data() + 2 * slot);
    }
    if (mtp_depths > 0) {  // the depths' sums and tokens of every data-parallel rank
      auto mtp = model.mtp_losses(ctx);
      ctx.dp_cp.all_reduce(mtp.buffer(), ReduceOp::sum);
      if (pp > 1) ctx.pp.all_reduce(mtp.buffer(), ReduceOp::sum);  // the last stage's
      ctx.device.template copy<double>(mtp.data(), 2 * mtp_depths, mtp_history.data() + 2 * mtp_depths * slot);
    }
    ctx.dp_cp.all_reduce(loss_sum.buffer(), ReduceOp::sum);  // each cp rank holds its tokens' part
    ctx.device.template copy<double>(loss_sum.data(), 1, loss_history.data() + slot);
    if (it == a.inject_nonfinite_gradient_at)  // (tests) an overflow in every gradient
      ctx.device.template fill<accumulate_t<T>>(optimizer.gradients().data(), optimizer.gradients().numel(),
                                                std::numeric_limits<double>::infinity());
    // The gradient norm is a pass over every gradient; it is taken only where something reads it
    // (grad_norm_needed), as Megatron takes it only to clip. A loss scaler unscales here either way.
    Tensor<double, Space> norm;
    if (norm_needed) {
      norm = optimizer.unscale_and_clip(ctx, model, a.clip_grad);
      ctx.device.template copy<double>(norm.data(), 1, norm_history.data() + slot);
    }
    loss_tokens[static_cast<std::size_t>(slot)] = tokens;
    // Megatron's --check-for-nan-in-loss-and-grad, without a host synchronization per iteration:
    // health += loss sum + gradient norm on the device, and the optimizer step does nothing once
    // health is not finite, so the weights stay those of the last good iteration. The host reads
    // health at log and save steps (below) and stops there, naming the first bad iteration.
    // With a loss scaler an overflowing gradient is expected now and then: the scaler skips that
    // step (reading the norm on the host) and only the loss counts towards health.
    const bool scaled = optimizer.scaling();
    if (a.check_for_nan_in_loss_and_grad) {
      ctx.device.template add<double>(health.data(), loss_history.data() + slot, 1, health.data());
      if (!scaled) ctx.device.template add<double>(health.data(), norm_history.data() + slot, 1, health.data());
    }
    const bool scaler_skips = optimizer.update_loss_scale(norm);
    if (logger && scaled) {
      std::lock_guard lock(result_mutex);
      result.loss_scales.push_back(optimizer.loss_scale());
      if (scaler_skips) result.skipped_iterations.push_back(it + 1);
    }
    // --skip-nonfinite-iterations: the update reads this iteration's own loss (and norm) instead of
    // the running health, so a bad iteration is skipped and the next good one updates again.
    const double* gate = a.check_for_nan_in_loss_and_grad ? health.data() : nullptr;
    if (a.skip_nonfinite_iterations) {
      ctx.device.template copy<double>(loss_history.data() + slot, 1, iteration_health.data());
      if (!scaled) ctx.device.template add<double>(iteration_health.data(), norm_history.data() + slot, 1, iteration_health.data());
      gate = iteration_health.data();
    }
    const double lr = schedule.lr(scheduled);  // in samples, as Megatron's scheduler
    const double decoupled_lr = decoupled_schedule ? decoupled_schedule->lr(scheduled) : -1.0;
    lrs[static_cast<std::size_t>(slot)] = lr;
    if (!scaler_skips) {
      optimizer.step(ctx, model, lr, gate, decoupled_lr);
      scheduled += global_batch;
    }
    fp8_after_optimizer_step(ctx);  // FP8: the weight caches dropped; delayed scaling: this step's amaxes, new scales
    optimizer.finish_step(ctx);     // --fp8-param-gather: the shards cast with those scales, the codes gathered
    consumed += global_batch;
    consumed_after[static_cast<std::size_t>(slot)] = consumed;
    // --exit-interval / --exit-duration-in-mins: save (with --save) and stop after this iteration. The
    // duration is rank 0's clock, agreed on by every rank (one small all-reduce per iteration, only
    // with the flag).
    bool exit_now = a.exit_interval > 0 && (it + 1) % a.exit_interval == 0 && it + 1 < a.train_iters;
    if (a.exit_duration_in_mins > 0 && it + 1 < a.train_iters) {
      double over = world.rank() == 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - launch_time()).count() >
                                             60.0 * a.exit_duration_in_mins
                        ? 1.0
                        : 0.0;
      all_reduce_host_values(ctx, ctx.world, &over, 1);
      exit_now = exit_now || over > 0;
    }
    const bool save_now =
        !a.save.empty() && ((a.save_interval > 0 && (it + 1) % a.save_interval == 0) || it + 1 == a.train_iters || exit_now);
    const bool evaluate_now =
        shared.evaluate && ((a.eval_interval > 0 && (it + 1) % a.eval_interval == 0) || it + 1 == a.train_iters);
    if (save_now || evaluate_now || it + 1 == a.train_iters) optimizer.wait_parameters(ctx);  // they read the parameters
    if (save_now || exit_now || it + 1 == a.train_iters) optimizer.gather_values(ctx);  // --fp8-param-gather: the values too
    const bool log_now = (it + 1) % a.log_interval == 0 || it + 1 == a.train_iters || exit_now;
    // Loss and norm are identical on every rank (all-reduced), so every rank stops here together,
    // before any save.
    if (it == start || (a.profile && it + 1 == a.profile_step_end)) {  // one wait each: the first step, the window's end
      ctx.device.synchronize();
      if (logger && it == start) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - launch_time()).count();
        {
          std::lock_guard lock(result_mutex);
          result.first_step_seconds = seconds;
        }
        if (!a.quiet) {
          std::printf("first iteration finished %.2f s after launch\n", seconds);
          if constexpr (has_gemm_tuning<typename Policy::backend>)
            if (const auto* tuning = ctx.device.blas().tuning())
              std::printf("GEMM tuning %s: %zu problems timed, %zu read from the file; the chosen algorithms take %.3f ms "
                          "less than the heuristic's first choices over one call of each\n",
                          tuning->file().c_str(), tuning->timed(), tuning->read_from_file(), tuning->saved_ms());
          std::fflush(stdout);
        }
      }
      if (profiles && a.profile && it + 1 == a.profile_step_end) profiler_window(false, 0);
    }
    if (a.check_for_nan_in_loss_and_grad && !a.skip_nonfinite_iterations && (log_now || save_now)) {
      double h = 0;
      ctx.device.template copy_to_host<double>(health.data(), 1, &h);
      if (!std::isfinite(h)) {
        const index_t first = read_up_to - start, count = it + 1 - read_up_to;
        std::vector<double> sums(static_cast<std::size_t>(count)), norms(static_cast<std::size_t>(count));
        ctx.device.template copy_to_host<double>(loss_history.data() + first, count, sums.data());
        ctx.device.template copy_to_host<double>(norm_history.data() + first, count, norms.data());
        index_t bad = 0;
        while (bad + 1 < count && std::isfinite(sums[static_cast<std::size_t>(bad)]) &&
               (scaled || std::isfinite(norms[static_cast<std::size_t>(bad)])))
          ++bad;
        const double loss = sums[static_cast<std::size_t>(bad)] / loss_tokens[static_cast<std::size_t>(first + bad)];
        const double grad_norm = norms[static_cast<std::size_t>(bad)];
        const int bad_iteration = static_cast<int>(read_up_to + bad + 1);
        fail<Error>("iteration ", bad_iteration, ": the ", std::isfinite(loss) ? "gradient norm" : "loss", " is ",
                    std::isfinite(loss) ? grad_norm : loss, " (loss ", loss, ", gradient norm ", grad_norm,
                    "); the optimizer made no update from that iteration on, so the weights are those after iteration ",
                    bad_iteration - 1, "; training stopped at iteration ", it + 1, " and nothing was saved",
                    a.save.empty() ? std::string() : " over the last checkpoint in '" + a.save + "'",
                    ". Lower --lr or --init-method-std, or pass --no-check-for-nan-in-loss-and-grad to go on");
      }
    }
    // The evaluation due now runs before the log and any save: a non-finite validation loss stops the
    // run as a non-finite training loss does, before anything is saved (it is printed after the log line).
    std::optional<double> validation;
    if (evaluate_now && !exit_now) {
      phase(it + 1, "evaluation");
      validation = validation_loss();
      if (a.check_for_nan_in_loss_and_grad && !std::isfinite(*validation))
        fail<Error>("iteration ", it + 1, ": the validation loss is ", *validation, "; training stopped at iteration ", it + 1,
                    " and nothing was saved",
                    a.save.empty() ? std::string() : " over the last checkpoint in '" + a.save + "'",
                    a.save_hf.empty() ? std::string() : " nor to --save-hf '" + a.save_hf + "'",
                    ". Lower --lr or --init-method-std, or pass --no-check-for-nan-in-loss-and-grad to go on");
    }
    // The iteration's log line (stdout, JSONL, TensorBoard) is written before its checkpoint is
    // committed, so a run killed in between has logged every iteration it resumes after.
    if (log_now) phase(it + 1, "log step (reading the losses)");
    if (logger && log_now) {
      // One read of the iterations since the last log step (it waits for the device).
      const index_t first = read_up_to - start, count = it + 1 - read_up_to;
      std::vector<double> sums(static_cast<std::size_t>(count)), norms(static_cast<std::size_t>(count));
      ctx.device.template copy_to_host<double>(loss_history.data() + first, count, sums.data());
      ctx.device.template copy_to_host<double>(norm_history.data() + first, count, norms.data());
      std::vector<double> routers(moe ? static_cast<std::size_t>(2 * count) : 0);
      if (moe) ctx.device.template copy_to_host<double>(router_history.data() + 2 * first, 2 * count, routers.data());
      std::vector<double> mtp(static_cast<std::size_t>(2 * mtp_depths * count));
      if (mtp_depths > 0) ctx.device.template copy_to_host<double>(mtp_history.data() + 2 * mtp_depths * first, 2 * mtp_depths * count, mtp.data());
      const auto t1 = std::chrono::steady_clock::now();
      const double step_s = std::chrono::duration<double>(t1 - t_interval).count() / static_cast<double>(count);
      const double elapsed = std::chrono::duration<double>(t1 - t_begin).count();
      const double left = elapsed / (it + 1 - start) * (a.train_iters - it - 1);
      const std::int64_t interval_samples = consumed_after[static_cast<std::size_t>(first + count - 1)] -
                                            (first == 0 ? start_consumed : consumed_after[static_cast<std::size_t>(first - 1)]);
      const double tokens_per_s = static_cast<double>(interval_samples) * a.model.seq_length / (step_s * static_cast<double>(count));
      const double tflops_per_gpu = tokens_per_s * flops_per_token(a) / 1e12 / a.world_size;
      const std::int64_t peak = peak_device_bytes(ctx.device);
      const std::string memory = peak >= 0 ? " | peak mem " + models::format_bytes(peak) : std::string();
      double loss = 0, grad_norm = 0;
      RouterLog router_log;
      std::vector<double> mtp_log(static_cast<std::size_t>(mtp_depths));  // each depth's mean loss
      for (index_t k = 0; k < count; ++k) {
        const std::size_t i = static_cast<std::size_t>(first + k), j = static_cast<std::size_t>(k);
        loss = sums[j] / loss_tokens[i];
        grad_norm = norms[j];
        for (index_t d = 0; d < mtp_depths; ++d) {
          const double* at = mtp.data() + 2 * mtp_depths * k;
          mtp_log[static_cast<std::size_t>(d)] = at[d] / std::max(at[mtp_depths + d], 1.0);
        }
        if (mtp_depths > 0) {
          std::lock_guard lock(result_mutex);
          result.mtp_losses.insert(result.mtp_losses.end(), mtp_log.begin(), mtp_log.end());
        }
        if (moe) router_log = router_log_of(a.model, routers[2 * j], routers[2 * j + 1], micro_batches_of[i]);
        if (router_log.aux || router_log.z) {
          std::lock_guard lock(result_mutex);
          if (router_log.aux) result.load_balancing_losses.push_back(*router_log.aux);
          if (router_log.z) result.z_losses.push_back(*router_log.z);
        }
        {
          std::lock_guard lock(result_mutex);
          result.losses.push_back(loss);
          if (a.skip_nonfinite_iterations && !(std::isfinite(sums[j]) && (scaled || std::isfinite(norms[j])))) {
            result.skipped_iterations.push_back(read_up_to + k + 1);
            if (!a.quiet)
              std::printf("iteration %6d: the loss (%g) or the gradient norm (%g) is not finite; its update was skipped\n",
                          static_cast<int>(read_up_to + k + 1), loss, grad_norm);
          }
        }
        if (jsonl.is_open()) {
          jsonl << "{\"iteration\": " << read_up_to + k + 1 << ", \"loss\": " << JsonNumber{loss} << ", \"lr\": " << lrs[i];
          if (norm_needed) jsonl << ", \"grad_norm\": " << JsonNumber{grad_norm};
          jsonl << ", \"tokens_per_s\": " << tokens_per_s << ", \"step_seconds\": " << step_s
                << ", \"consumed_samples\": " << consumed_after[i];
          if (a.log_throughput) jsonl << ", \"tflops_per_gpu\": " << tflops_per_gpu;
          if (router_log.aux) jsonl << ", \"load_balancing_loss\": " << JsonNumber{*router_log.aux};
          if (router_log.z) jsonl << ", \"z_loss\": " << JsonNumber{*router_log.z};
          for (index_t d = 0; d < mtp_depths; ++d)
            jsonl << ", \"mtp_" << d + 1 << "_loss\": " << JsonNumber{mtp_log[static_cast<std::size_t>(d)]};
          if (peak >= 0) jsonl << ", \"peak_device_bytes\": " << peak;
          jsonl << "}\n";
        }
        if (TensorBoardWriter* tb = shared.tensorboard) {  // Megatron's tag names
          const std::int64_t step = read_up_to + k + 1;
          tb->scalar("lm loss", loss, step);
          tb->scalar("learning-rate", lrs[i], step);
          if (norm_needed) tb->scalar("grad-norm", grad_norm, step);
          tb->scalar("throughput (tokens/s)", tokens_per_s, step);
          tb->scalar("consumed-samples", static_cast<double>(consumed_after[i]), step);
          tb->scalar("batch-size", static_cast<double>(consumed_after[i] - (i == 0 ? start_consumed : consumed_after[i - 1])), step);
          if (a.log_throughput) tb->scalar("throughput", tflops_per_gpu, step);
          if (router_log.aux) tb->scalar("load_balancing_loss", *router_log.aux, step);
          if (router_log.z) tb->scalar("z_loss", *router_log.z, step);
          for (index_t d = 0; d < mtp_depths; ++d)  // Megatron's "mtp_<k> loss"
            tb->scalar("mtp_" + std::to_string(d + 1) + " loss", mtp_log[static_cast<std::size_t>(d)], step);
          if (scaled) tb->scalar("loss-scale", optimizer.loss_scale(), step);
          if (peak >= 0) tb->scalar("mem-max-allocated-bytes", static_cast<double>(peak), step);
        }
      }
      flush_jsonl();
      if (shared.tensorboard) shared.tensorboard->flush();
      if (!a.quiet) {
        const std::string scaling =
            scaled ? ::strata::detail::concat(" | loss scale ", optimizer.loss_scale(), " | skipped ", optimizer.skipped_iterations())
                   : std::string();
        const std::string extra =
            (a.log_throughput ? ::strata::detail::concat(" | ", std::lround(tflops_per_gpu * 10) / 10.0, " TFLOP/s/GPU") : std::string()) +
            (shared.batches.constant() ? std::string() : ::strata::detail::concat(" | global batch ", global_batch)) +
            (router_log.aux ? ::strata::detail::concat(" | load_balancing_loss ", *router_log.aux) : std::string()) +
            (router_log.z ? ::strata::detail::concat(" | z_loss ", *router_log.z) : std::string());
        std::string mtp_text;
        for (index_t d = 0; d < mtp_depths; ++d) {
          char value[32];
          std::snprintf(value, sizeof value, " %.4f", mtp_log[static_cast<std::size_t>(d)]);
          mtp_text += (d == 0 ? " | mtp loss" : "") + std::string(value);
        }
        char norm_text[48] = "";
        if (norm_needed) std::snprintf(norm_text, sizeof norm_text, " | grad norm %.3f", grad_norm);
        std::printf("iteration %6d/%6d | loss %.4f | lr %.3e%s | %8.0f tokens/s | %.3f s/it | %dm%02ds left%s%s%s%s\n",
                    it + 1, a.train_iters, loss, lr, norm_text, tokens_per_s, step_s, static_cast<int>(left / 60),
                    static_cast<int>(left) % 60, (extra + mtp_text).c_str(), scaling.c_str(), memory.c_str(),
                    !save_now ? "" : " | saving");
        std::fflush(stdout);
      }
      t_interval = t1;
    }
    if (log_now) read_up_to = it + 1;  // every rank: the NaN check above reads from here
    if (a.log_straggler && log_now) {  // every rank's step time since the last log step, one small all-reduce
      ctx.device.synchronize();
      const auto now = std::chrono::steady_clock::now();
      std::vector<double> seconds(static_cast<std::size_t>(world.size()), 0.0);
      const int steps = std::max(1, it + 1 - std::max(start, last_straggler_iteration));
      seconds[static_cast<std::size_t>(world_rank)] = std::chrono::duration<double>(now - t_straggler).count() / steps;
      phase(it + 1, "straggler report");
      all_reduce_host_values(ctx, ctx.world, seconds.data(), static_cast<index_t>(seconds.size()));
      if (logger && straggler_started && !a.quiet) {
        std::printf("%s\n", straggler_line(seconds, a.straggler_minmax_count, it + 1).c_str());
        std::fflush(stdout);
      }
      straggler_started = true;
      last_straggler_iteration = it + 1;
      t_straggler = std::chrono::steady_clock::now();
    }
    if (save_now) {
      std::map<std::string, std::int64_t> extra = loss_scaler_state(optimizer);
      if (scheduled != consumed) extra["lr_scheduler_samples"] = scheduled;
      record_hf_token_ids(hf_save_options(a, shared.tokenizer, hf::architecture_of<Model<Policy>>::value), extra);
      const TrainState state{it + 1, consumed, a.seed, std::move(extra)};
      phase(it + 1, saver ? "checkpoint save (background)" : "checkpoint save");
      if (saver) saver->save(ctx, a.save, it + 1, checkpoint_writer(ctx, model, optimizer, state, /*copy_data=*/true),
                             save_options(it + 1));
      else save_checkpoint(ctx, a.save, it + 1, model, optimizer, state, save_options(it + 1));
    }
    if (shared.progress) shared.progress->iteration_done(world_rank, it + 1);
    if (exit_now) {  // as Megatron: saved above (with --save), no evaluation, the run ends here
      if (logger) {
        std::lock_guard lock(result_mutex);
        result.exited_at = it + 1;
        if (!a.quiet)
          std::printf("exiting after iteration %d (%s)%s\n", it + 1,
                      a.exit_interval > 0 && (it + 1) % a.exit_interval == 0 ? "--exit-interval" : "--exit-duration-in-mins",
                      a.save.empty() ? "" : ", checkpoint saved");
      }
      exited = true;
      break;
    }
    if (validation) report_validation(it + 1, *validation);
  }
  if (saver) saver->finish(ctx);
  if (exited) return;
  if (!a.save_hf.empty()) {
    optimizer.wait_parameters(ctx);
    if (ctx.config.pp == 1) {
      // gathered over tp (experts over etp and ep); rank 0 writes
      hf::save_hf_from_model(ctx, a.save_hf, model, hf_save_options(a, shared.tokenizer, hf::architecture_of<Model<Policy>>::value));
    } else {  // every stage's weights are in the final checkpoint: rank 0 exports from it
      if (world.rank() == 0)
        export_hf_from_checkpoint<T>(a.save, a.train_iters, hf::architecture_of<Model<Policy>>::value, model.config(), a.save_hf,
                                     hf_save_options(a, shared.tokenizer, hf::architecture_of<Model<Policy>>::value));
      world.barrier();
    }
    if (logger && !a.quiet) std::printf("saved the model in Hugging Face format to %s\n", a.save_hf.c_str());
  }
  if (pipeline_timer)
    report_pipeline_times(ctx, *pipeline_timer, schedule_shape, logger, !a.quiet, result, result_mutex);
  if (a.sample_tokens > 0) {
    const std::string text = generate(ctx, whole_model, a, shared.tokenizer);
    if (logger) {
      std::lock_guard lock(result_mutex);
      result.sample = text;
      if (!a.quiet) std::printf("sample: %s\n", text.c_str());
    }
  }
  if (a.keep_final_parameters)
    model.for_each_parameter([&](auto& p) {
      const auto full = gather_global(ctx.tp, p, p.value);  // collective over tp
      if (!logger) return;
      std::vector<double> values(static_cast<std::size_t>(full.numel()));
      for (index_t i = 0; i < full.numel(); ++i) {
        if constexpr (is_half_v<T>) values[static_cast<std::size_t>(i)] = static_cast<float>(full[i]);
        else values[static_cast<std::size_t>(i)] = static_cast<double>(full[i]);
      }
      std::lock_guard lock(result_mutex);
      result.final_parameters.emplace_back(p.name, std::move(values));
    });
  ctx.device.synchronize();
  const std::int64_t peak = peak_device_bytes(ctx.device);
  if (logger && !a.quiet && peak >= 0) {
    std::printf("peak device memory (rank 0, caching allocator): %s in use, %s reserved\n", models::format_bytes(peak).c_str(),
                models::format_bytes(reserved_device_bytes(ctx.device)).c_str());
    std::fflush(stdout);
  }
}

template <template <class> class Model, class T, bool SP>
TrainResult train_with(const TrainArgs& a) {
  const MemoryPlan memory = plan_memory<T>(a);
  if (a.device == "cpu") check_fits(memory, a.dtype);  // its error carries the same report
  if (!a.quiet) {
    std::printf("%s\n", describe(memory, a.dtype).c_str());
    std::fflush(stdout);
  }
#ifdef STRATA_TRAINER_CUDA
  if (a.device == "cuda") {  // the model's memory lives on each rank's GPU: compare one rank with GPU 0's free memory
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && memory.per_rank.total() > static_cast<std::int64_t>(free_bytes))
      fail<ConfigError>("the configuration does not fit in GPU memory: one rank needs ", models::format_bytes(memory.per_rank.total()),
                        " but GPU 0 has ", models::format_bytes(static_cast<std::int64_t>(free_bytes)),
                        " free; use smaller sizes, a larger --tensor-model-parallel-size or --dtype bf16");
  }
#endif
  const data::Tokenizer tokenizer = data::make_tokenizer(tokenizer_options_of(a));
  const BatchSchedule batch_schedule = batch_schedule_of(a);
  const std::int64_t num_samples = samples_of(batch_schedule, a.train_iters);
  const std::vector<double> split = data::parse_split(a.split);
  const bool evaluate = a.eval_iters > 0 && (a.mock_data_random || split[1] > 0);
  const std::int64_t eval_samples = static_cast<std::int64_t>(a.eval_iters) * a.global_batch_size;
  const std::int64_t eval_index_samples = std::min(eval_samples, kMaxValidationIndexSamples);
  // The training and validation samples: the datasets of --data-path and --split, or random tokens
  // (--mock-data-random; validation on other random tokens), or Megatron's mock documents split
  // like a dataset (--mock-data).
  Samples dataset, valid;
  if (a.mock_data) {
    const data::GptDatasetConfig train_config{a.model.seq_length, num_samples, a.seed, true};
    dataset = Samples::of(std::make_shared<data::MockGptDataset>(train_config, a.model.vocab_size, tokenizer.eod(), split, 0));
    if (evaluate)
      valid = Samples::of(std::make_shared<data::MockGptDataset>(
          data::GptDatasetConfig{a.model.seq_length, eval_index_samples, a.seed, true}, a.model.vocab_size, tokenizer.eod(), split, 1));
  } else if (a.mock_data_random) {
    dataset = Samples::of(std::make_shared<data::MockDataset>(num_samples, a.model.seq_length, a.model.vocab_size, a.seed));
    if (evaluate)
      valid = Samples::of(std::make_shared<data::MockDataset>(eval_index_samples, a.model.seq_length, a.model.vocab_size,
                                                              rng::mix(a.seed, 1)));
  } else {
    data::GptDatasetConfig data_config{a.model.seq_length, num_samples, a.seed, true, a.model.vocab_size};
    dataset = Samples::of(data::build_blended_gpt_dataset(a.data_path, data_config, num_samples, split, 0));
    if (evaluate)
      valid = Samples::of(data::build_blended_gpt_dataset(
          a.data_path, data::GptDatasetConfig{a.model.seq_length, eval_index_samples, a.seed, true, a.model.vocab_size},
          eval_index_samples,
          split, 1));
  }
  using Dataset = Samples;
  using ValidationSet = Samples;
  const CycledSamples<ValidationSet> valid_samples{&valid, eval_samples};

  std::ofstream jsonl;
  if (!a.log_jsonl.empty()) {
    jsonl.open(a.log_jsonl, std::ios::app);
    if (!jsonl) fail<FileError>("cannot open --log-jsonl file '", a.log_jsonl, "' for appending");
    jsonl << std::setprecision(17);  // every bit of a double, so two runs' losses compare exactly
  }

  std::optional<TensorBoardWriter> tensorboard;
  if (!a.tensorboard_dir.empty()) tensorboard.emplace(a.tensorboard_dir);

  TrainResult result;
  std::mutex result_mutex;
  SharedRun<Dataset, ValidationSet> shared{dataset,       valid_samples, evaluate,  jsonl,     tensorboard ? &*tensorboard : nullptr,
                                           result,        result_mutex,  memory,    tokenizer, batch_schedule};
  const std::optional<std::chrono::duration<double>> timeout =
      a.distributed_timeout_minutes > 0 ? std::optional<std::chrono::duration<double>>(60.0 * a.distributed_timeout_minutes)
                                        : std::nullopt;
  // Resilience (resilience.hpp): each rank's phase is known to the progress timer and, between
  // processes, to the liveness monitor; the trainer programs (run_main) also make the first
  // failure end the process (failure::exit_on_failure).
  // Shared with the failure line's annotation (failure::set_annotator), which may run on another
  // thread while this function returns.
  const auto progress_owner = std::make_shared<Progress>(a.world_size);
  Progress& progress = *progress_owner;
  shared.progress = &progress;
  // Threads of one process: a failure line says where every rank was (the liveness monitor says it
  // between processes).
  failure::set_annotator([weak = std::weak_ptr<Progress>(progress_owner)] {
    const auto p = weak.lock();
    const std::string where = p ? p->phases() : std::string();
    return where.empty() ? where : " [where the ranks are: " + where + "]";
  });
  const std::optional<FaultInjection> fault = FaultInjection::from_environment();
  if (fault) shared.fault = &*fault;
  std::optional<ProgressTimer> progress_timer;
  if (a.progress_timeout_minutes > 0) progress_timer.emplace(progress, 60.0 * a.progress_timeout_minutes);
  if (a.device == "cpu") {
    using Policy = TrainPolicy<T, SP>;
    inprocess::run(
        a.world_size, [&](inprocess::communicator& world) { train_rank<Model, Policy>(world, cpu::backend{}, a, shared); },
        inprocess::RunOptions{.timeout = timeout});
    return result;
  }
#ifdef STRATA_TRAINER_CUDA
  using Policy = TrainPolicy<T, SP, strata::cuda::backend, nccl::communicator>;
  if (launched_as_job()) {  // one process per GPU: this process is one rank
    const nccl::LaunchEnvironment env = nccl::launch_environment();
    const int gpus = visible_gpus();
    const int ordinal = env.local_rank < gpus ? env.local_rank : 0;  // srun --gpus-per-task=1: the one GPU it sees
    strata::cuda::backend device(ordinal);
    nccl::Options options;
    options.stream = device.stream();
    options.timeout = timeout;
    nccl::communicator world = nccl::init_from_environment(options);
    // A peer process that died, stopped or failed aborts this rank's communicators at once.
    JobLiveness liveness(env.rank, env.world_size, world.timeout().count(), progress,
                         [](const std::string& reason) { nccl::abort_all_ranks(reason); }, env.rank == 0 && !a.quiet);
    train_rank<Model, Policy>(world, device, a, shared);
    return result;
  }
  if (a.model.moe.enabled() && a.world_size > 1)
    fail<ConfigError>("--num-experts with --world-size ", a.world_size, " GPUs in one process: the token dispatcher reads the "
                      "token counts on the host between collectives, which the warm-up step of one process driving several "
                      "GPUs cannot run (its collectives move nothing); launch one process per GPU (torchrun "
                      "--nproc-per-node ", a.world_size, ", srun or mpirun, README)");
  nccl::run(
      a.world_size,
      [&](nccl::communicator& world) {
        train_rank<Model, Policy>(world, strata::cuda::backend(world.device(), world.stream()), a, shared);
      },
      nccl::RunOptions{.timeout = timeout});
  return result;
#else
  fail<ConfigError>("--device ", a.device, ": this trainer was built without CUDA; rebuild with the CUDA toolkit and NCCL "
                    "found (cmake prints 'strata::nccl available') or use --device cpu");
#endif
}

// Each (model, element type) pair of train_with is compiled once, in translation units of its own in
// the strata_trainer library (examples/trainer/instance.cpp.in, generated by CMake, grouped per model,
// per pair or per half as STRATA_TRAINER_UNITS says), and not again in every program that includes
// this header: those are the heavy instantiations (the model, its backward, the optimizer, the
// backend's kernels for T), so the trainers and the training tests link them, and a parallel build
// compiles the units side by side.
#define STRATA_TRAINER_FOR_EACH_INSTANCE(X)                                                                  \
  X(::strata::models::Gpt, float) X(::strata::models::Gpt, double) X(::strata::models::Gpt, ::strata::bf16)  \
  X(::strata::models::Gpt, ::strata::fp16) X(::strata::models::Llama, float) X(::strata::models::Llama, double) \
  X(::strata::models::Llama, ::strata::bf16) X(::strata::models::Llama, ::strata::fp16) X(::strata::models::Mixtral, float) \
  X(::strata::models::Mixtral, double) X(::strata::models::Mixtral, ::strata::bf16) X(::strata::models::Mixtral, ::strata::fp16)
#ifdef STRATA_TRAINER_CUDA
// The CUDA ranks' loop of one (model, element type, sequence parallel) instance: CMake compiles it in
// a translation unit of its own (instance.cpp.in), so the CPU and the CUDA halves of train_with build
// side by side; the unit of train_with declares it extern.
#define STRATA_TRAINER_CUDA_RANK(Model, T, SP)                                                                      \
  void train_rank<Model, TrainPolicy<T, SP, ::strata::cuda::backend, nccl::communicator>, nccl::communicator,      \
                  SharedRun<Samples, Samples>>(nccl::communicator&, ::strata::cuda::backend, const TrainArgs&,      \
                                               SharedRun<Samples, Samples>&)
#endif
#define STRATA_TRAINER_EXTERN_INSTANCE(Model, T)                              \
  extern template TrainResult train_with<Model, T, false>(const TrainArgs&); \
  extern template TrainResult train_with<Model, T, true>(const TrainArgs&);
STRATA_TRAINER_FOR_EACH_INSTANCE(STRATA_TRAINER_EXTERN_INSTANCE)
#undef STRATA_TRAINER_EXTERN_INSTANCE

// Settles --device auto and, on cuda, the world size of a launcher's job; the dtype default of the
// device when --dtype was not given (dtype_given false).
inline void resolve_device(TrainArgs& a, bool dtype_given) {
  if (a.device == "auto") a.device = visible_gpus() > 0 ? "cuda" : "cpu";
  if (a.device == "cuda" && !dtype_given) a.dtype = "bf16";
#ifdef STRATA_TRAINER_CUDA
  if (a.device == "cuda" && launched_as_job()) a.world_size = nccl::launch_environment().world_size;
#endif
}

// Prints notes[from..] as "note: ..." lines on stderr (rank 0 of a launcher's job, unless --quiet).
inline void print_notes(const TrainArgs& a, std::size_t from = 0) {
  const char* rank = std::getenv("RANK");
  if (a.quiet || (rank != nullptr && std::string(rank) != "0")) return;
  for (std::size_t i = from; i < a.notes.size(); ++i) std::fprintf(stderr, "note: %s\n", a.notes[i].c_str());
}

// --load names a checkpoint directory, or one not made yet (a script's first run passes --save X
// --load X). Anything else is refused before training: a regular file or a FIFO, and a directory
// holding iteration folders without the tracker that names the last complete one (training from
// scratch there would overwrite them). The path's type is read without opening it.
inline void check_load_path(const TrainArgs& a) {
  namespace fs = std::filesystem;
  if (a.load.empty()) return;
  std::error_code ec;
  const fs::file_status status = fs::status(a.load, ec);
  if (!fs::exists(status)) return;
  if (!fs::is_directory(status))
    fail<ConfigError>("--load ", a.load, " is ", fs::is_regular_file(status) ? "a regular file" : fs::is_fifo(status) ? "a FIFO" : "not a directory",
                      ", not a checkpoint directory: pass the directory --save wrote (the one holding ",
                      std::string(kCheckpointTrackerName), ")");
  if (a.ckpt_step >= 0 || fs::exists(fs::symlink_status(tracker_path(a.load), ec))) return;
  std::vector<std::string> saved;
  for (const fs::directory_entry& entry : fs::directory_iterator(a.load, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("iter_") && entry.is_directory(ec)) saved.push_back(name);
  }
  if (saved.empty()) return;
  std::sort(saved.begin(), saved.end());
  std::string list;
  for (const std::string& name : saved) list += (list.empty() ? "" : ", ") + name;
  fail<ConfigError>("--load ", a.load, " holds checkpoints (", list, ") but no ", std::string(kCheckpointTrackerName),
                    ", which names the last complete one; training from scratch would overwrite them. Pass --ckpt-step N "
                    "to resume from iteration N, or restore the tracker");
}

template <template <class> class Model>
TrainResult train(const TrainArgs& given) {
  TrainArgs a = given;
  (void)resolve_run(a);  // the tokenizer's vocabulary, the global batch, --train-samples, sequence parallel at tp=1
  print_notes(a, given.notes.size());  // the notes resolve_run added (sequence parallelism at tp=1, ...)
  validate(a);
  check_load_path(a);
  if (a.device != "cpu" && a.device != "cuda")
    fail<ConfigError>("--device=", a.device, " is not a device: use cpu or cuda");
  if (a.device == "cuda" && visible_gpus() == 0)
    fail<ConfigError>("--device cuda: ",
#ifdef STRATA_TRAINER_CUDA
                      "this process sees no GPU (check CUDA_VISIBLE_DEVICES and the driver)",
#else
                      "this trainer was built without CUDA (configure with the CUDA toolkit and NCCL found)",
#endif
                      "; use --device cpu");
  // A build may compile only some element types' instances (CMake's STRATA_TRAINER_ELEMENTS).
  [[maybe_unused]] auto absent = [&](const char* type) -> TrainResult {
    fail<ConfigError>("--dtype ", a.dtype, ": this trainer was built without its ", type,
                      " instances (CMake's STRATA_TRAINER_ELEMENTS); rebuild with ", type,
                      " in STRATA_TRAINER_ELEMENTS, or pick another --dtype");
  };
  if (a.dtype == "double") {
#ifndef STRATA_TRAINER_WITHOUT_DOUBLE
    return a.sequence_parallel ? train_with<Model, double, true>(a) : train_with<Model, double, false>(a);
#else
    return absent("double");
#endif
  }
  if (a.dtype == "bf16") {
#ifndef STRATA_TRAINER_WITHOUT_BF16
    return a.sequence_parallel ? train_with<Model, bf16, true>(a) : train_with<Model, bf16, false>(a);
#else
    return absent("bf16");
#endif
  }
  if (a.dtype == "fp16") {
#ifndef STRATA_TRAINER_WITHOUT_FP16
    return a.sequence_parallel ? train_with<Model, fp16, true>(a) : train_with<Model, fp16, false>(a);
#else
    return absent("fp16");
#endif
  }
#ifndef STRATA_TRAINER_WITHOUT_FLOAT
  return a.sequence_parallel ? train_with<Model, float, true>(a) : train_with<Model, float, false>(a);
#else
  return absent("float");
#endif
}


// main() of a trainer: parse the flags over Megatron's defaults (the architecture preset of `kind`),
// print the notes on Megatron flags strata treats differently, train the model the architecture
// flags select (one of `Models`: train_gpt and train_llama hold one, pretrain_gpt both), report
// errors as one clear line on stderr with exit status 1 (every std::exception, not only strata's).
template <template <class> class... Models>
int run_main(const char* kind, const char* program, int argc, char** argv) {
  (void)launch_time();
  TrainArgs args = command_line_defaults(kind);
  args.device = "auto";
  CLI::App app{std::string(program) +
               ": strata's GPT / Llama trainer (Megatron's pretrain_gpt flags): tensor, sequence, pipeline and data "
               "parallel training on CPU threads or NVIDIA GPUs"};
  add_options(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError&) {  // as Megatron's argparse: the flags it does not know, exit status 2
    std::string unknown;
    for (const std::string& flag : app.remaining()) unknown += " " + flag;
    std::fprintf(stderr, "%s: error: unrecognized arguments:%s\n(%s --help lists the flags)\n", program, unknown.c_str(), program);
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // The first failure of any rank is printed at once and ends the process within
  // STRATA_EXIT_GRACE_SECONDS (default 5 s) even where a thread is blocked (comm/failure.hpp).
  std::string prefix = "strata";
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') {
      prefix = ::strata::detail::concat("strata rank ", value);
      break;
    }
  failure::exit_on_failure(failure::grace_from_environment(), 1, prefix);
  try {
    finish_command_line(app, args);
    resolve_device(args, app.count("--dtype") + app.count("--bf16") + app.count("--fp16") > 0);
    // The demo on a GPU: one GPU (tp=1). Several GPUs: a launcher (torchrun, srun, mpirun), or
    // --world-size N for threads mode (README).
    if (args.device == "cuda" && !launched_as_job() && app.count("--world-size") == 0 &&
        app.count("--tensor-model-parallel-size") == 0) {
      args.world_size = 1;
      args.tensor_model_parallel_size = 1;
    }
    print_notes(args);
    std::optional<TrainResult> trained;
    const std::string_view wanted = args.model_kind == "gpt"     ? models::Gpt<TrainPolicy<float, false>>::architecture
                                    : args.model_kind == "mixtral" ? models::Mixtral<TrainPolicy<float, false>>::architecture
                                                                   : models::Llama<TrainPolicy<float, false>>::architecture;
    ((Models<TrainPolicy<float, false>>::architecture == wanted ? (void)(trained = train<Models>(args)) : (void)0), ...);
    if (!trained)
      fail<ConfigError>("the architecture flags select ", args.model_kind, ", which ", program, " does not build (",
                        std::string(kind) == "llama"     ? "train_llama is the Llama preset"
                        : std::string(kind) == "mixtral" ? "train_mixtral is the Mixtral preset"
                                                         : "train_gpt is the GPT-2 preset",
                        "); use pretrain_gpt, which builds GPT-2, Llama and Mixtral");
    const TrainResult& result = *trained;
    if (!result.nothing_to_do.empty()) {  // documented in the README: exit 0, the run is already complete
      std::printf("%s\n", result.nothing_to_do.c_str());
      return 0;
    }
    if (!args.quiet && result.losses.size() >= 2)
      std::printf("done: loss %.4f -> %.4f over %zu iterations\n", result.losses.front(), result.losses.back(), result.losses.size());
    return 0;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory (std::bad_alloc): the configuration needs more memory than this machine has; "
                         "use smaller sizes\n");
    return 1;
  } catch (const std::exception& e) {  // strata::Error and anything else: one line, non-zero exit
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    failure::report(e.what(), /*print=*/false);  // the other processes of a job hear it at once (resilience.hpp)
    return 1;
  }
}

// train_gpt / train_llama / train_mixtral: one model, its architecture flags preset.
template <template <class> class Model>
int main_for(const char* kind, int argc, char** argv) {
  const std::string k = kind;
  return run_main<Model>(kind, k == "llama" ? "train_llama" : k == "mixtral" ? "train_mixtral" : "train_gpt", argc, argv);
}

}  // namespace trainer
