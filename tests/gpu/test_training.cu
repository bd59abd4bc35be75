// tests/gpu/test_training.cu: 20 training iterations of the trainers' loop (examples/trainer) on
// GPUs in bf16: tp=2 with sequence parallelism, dp=2 (with the distributed optimizer, with the
// reduction overlapped) and pp=2 (1F1B, zero-bubble) on 2 GPUs must follow tp=1 on 1 GPU (every
// iteration's loss within 2e-2 relative); the distributed optimizer's state takes on the device
// what the allocation report says; fp16 under the dynamic loss scaler follows bf16 on 1 GPU and
// backs its scale off from 2^32; pp=2 with the transfers on the communication stream trains the
// same bits; checkpoints saved on a GPU (in place and --async-save) resume bit for bit, and the
// 1-GPU checkpoint resumes at tp=2 + SP on the tp=2 trajectory; context parallelism cp=2 (ring
// attention, and all-to-all attention) on 2 GPUs follows tp=1 on 1 GPU, with and without the
// selective recompute of the attention core.
//
//   test_training [--data-path PREFIX]   tp=1 on 1 GPU (nccl::run(1)): the loss falls, a second run
//                                        gives the same losses bit for bit; prints `LOSSES ...`;
//                                        fp16 with the loss scaler against it
//   test_training --threads              also tp=2 + SP (also with --tp-comm-overlap, its
//                                        collective gathers and an SM margin), tp=2 without SP,
//                                        dp=2 (also ZeRO-1, also overlapped) and pp=2 (1F1B,
//                                        zero-bubble) on 2 GPUs from threads of this process
//                                        (nccl::run(2)), losses and final parameters (gathered)
//                                        within 2e-2 of tp=1 (the suite runs it with 2+ GPUs);
//                                        the same 2-GPU runs as processes:
//   test_training --process [--process-layout tp2|tp2-overlap|tp2-engines|dp2|dp2-zero|pp2|cp2|cp2-a2a]
//                                        one rank of a torchrun-style job (RANK, WORLD_SIZE, ...);
//                                        rank 0 prints its LOSSES; run_training_processes.sh starts
//                                        both jobs and compares them with the 1-GPU losses.
// The corpus: --data-path, else STRATA_DATA_PATH, else the build's corpus.
// One line per check, `SUITE training: N passed, M failed` last, non-zero exit on a failure.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "check.hpp"
#include "trainer/trainer.hpp"

namespace {

trainer::TrainArgs args_for(const std::string& data_path, int world, int tp, bool sp) {
  trainer::TrainArgs a = trainer::default_args("gpt");
  a.device = "cuda";
  a.dtype = "bf16";
  a.world_size = world;
  a.tensor_model_parallel_size = tp;
  a.sequence_parallel = sp;
  a.model.num_layers = 2;
  a.model.hidden_size = 128;
  a.model.num_attention_heads = 4;
  a.model.ffn_hidden_size = 512;
  a.model.seq_length = 64;
  a.micro_batch_size = 4;
  a.global_batch_size = 8;
  a.train_iters = 20;
  a.lr = 3e-3;
  a.min_lr = 3e-4;
  a.lr_warmup_iters = 3;
  a.eval_iters = 0;
  a.sample_tokens = 0;
  a.quiet = true;
  a.keep_final_parameters = true;
  if (!data_path.empty()) a.data_path = data_path;
  return a;
}

// The trainers' train() (its instances come compiled from the strata_trainer library).
trainer::TrainResult train(const trainer::TrainArgs& a) { return trainer::train<strata::models::Gpt>(a); }

void print_losses(const trainer::TrainResult& run) {
  std::printf("LOSSES");
  for (double l : run.losses) std::printf(" %.17g", l);
  std::printf("\n");
  std::fflush(stdout);
}

double relative(const std::vector<double>& a, const std::vector<double>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - ref[i]) * (a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

void compare(gpu_test::suite& s, const std::string& label, const trainer::TrainResult& run, const trainer::TrainResult& ref) {
  constexpr double kTol = 2e-2;
  double worst = 0;
  int worst_at = -1;
  bool ok = run.losses.size() == ref.losses.size() && !ref.losses.empty();
  for (std::size_t i = 0; ok && i < ref.losses.size(); ++i) {
    const double e = std::abs(run.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]);
    if (!(e <= worst)) worst = e, worst_at = static_cast<int>(i) + 1;
  }
  char line[512];
  std::snprintf(line, sizeof line, "%s: %zu losses within %.0e of tp=1 on 1 GPU (worst iteration %d: %.3e; last %.4f vs %.4f)",
                label.c_str(), run.losses.size(), kTol, worst_at, worst, run.losses.empty() ? NAN : run.losses.back(),
                ref.losses.empty() ? NAN : ref.losses.back());
  s.record(ok && worst <= kTol, line);
  double worst_p = 0;
  std::string worst_name = "(none)";
  // With pp > 1 the run keeps the parameters of world rank 0's stage only: compare those with the
  // reference's parameters of the same names.
  std::vector<std::pair<std::string, std::vector<double>>> matched;
  for (const auto& [name, values] : ref.final_parameters)
    for (const auto& entry : run.final_parameters)
      if (entry.first == name) matched.emplace_back(name, values);
  const std::vector<std::pair<std::string, std::vector<double>>>& want_all =
      run.final_parameters.size() < ref.final_parameters.size() ? matched : ref.final_parameters;
  bool params_ok = run.final_parameters.size() == want_all.size() && !want_all.empty();
  // The vocabulary is padded to a multiple of 128 x tp, so the word embedding (and an untied output
  // layer) has more rows at tp = 2 than at tp = 1; the padding rows are never used (their logits are
  // left out of the softmax): compare the real vocabulary's rows.
  const trainer::TrainArgs shape = args_for("", 1, 1, false);
  const std::size_t real_rows = static_cast<std::size_t>(shape.model.vocab_size) * static_cast<std::size_t>(shape.model.hidden_size);
  for (std::size_t i = 0; params_ok && i < want_all.size(); ++i) {
    const std::string& name = want_all[i].first;
    params_ok = params_ok && run.final_parameters[i].first == name;
    std::vector<double> got = run.final_parameters[i].second, want = want_all[i].second;
    if ((name == "embedding.word.weight" || name == "output.weight") && got.size() >= real_rows && want.size() >= real_rows) {
      got.resize(real_rows);
      want.resize(real_rows);
    }
    // The key part of the QKV bias has a zero gradient in exact arithmetic (adding a constant to
    // every key shifts all scores of a query alike, which the softmax ignores): what it holds after
    // AdamW's normalized steps is rounding noise, different at every tp size. Compare q and v.
    if (name.size() >= 18 && name.compare(name.size() - 18, 18, "attention.qkv.bias") == 0) {
      const std::size_t d = static_cast<std::size_t>(shape.model.hidden_size / shape.model.num_attention_heads);
      const std::size_t slots = 3;  // MHA: per head q, k, v
      auto drop_keys = [&](const std::vector<double>& v) {
        std::vector<double> kept;
        for (std::size_t i = 0; i < v.size(); ++i)
          if ((i / d) % slots != 1) kept.push_back(v[i]);
        return kept;
      };
      got = drop_keys(got);
      want = drop_keys(want);
    }
    const double e = relative(got, want);
    if (!(e <= worst_p)) worst_p = e, worst_name = name;
  }
  std::snprintf(line, sizeof line, "%s: %zu final parameters within %.0e of tp=1 (worst %s: %.3e)%s", label.c_str(),
                run.final_parameters.size(), kTol, worst_name.c_str(), worst_p,
                &want_all == &matched ? " (world rank 0's pipeline stage)" : "");
  s.record(params_ok && worst_p <= kTol, line);
}

// The device bytes the model's state took (measured by the trainer around building the model and
// its optimizer) against the report's figures as the caching allocator rounds them: with the
// distributed optimizer the state is five flat tensors (parameter buffer, gradient buffer, main
// weights, exp_avg, exp_avg_sq), and the report is Megatron's 6 + 12 / dp bytes per element.
void check_state_memory(gpu_test::suite& s, const std::string& label, const trainer::MemoryReport& m, int dp) {
  auto rounded = [](std::int64_t bytes) {
    const std::int64_t mib = std::int64_t{1} << 20;
    return bytes <= mib ? (bytes + 511) / 512 * 512 : (bytes + 2 * mib - 1) / (2 * mib) * (2 * mib);
  };
  const std::int64_t expected = rounded(m.parameter_bytes) + rounded(m.gradient_bytes) + 3 * rounded(m.optimizer_bytes / 3);
  const double formula = 6.0 + 12.0 / dp;
  char line[512];
  std::snprintf(line, sizeof line,
                "%s: the device holds %lld B for the model state, the report's %lld + %lld + %lld B as allocated = %lld B "
                "(within 64 KiB); %.3f bytes per parameter against Megatron's 6 + 12/dp = %.3f (padding aside)",
                label.c_str(), static_cast<long long>(m.measured_state_bytes), static_cast<long long>(m.parameter_bytes),
                static_cast<long long>(m.gradient_bytes), static_cast<long long>(m.optimizer_bytes),
                static_cast<long long>(expected), m.bytes_per_parameter(), formula);
  const bool close = m.measured_state_bytes >= 0 && std::llabs(m.measured_state_bytes - expected) <= (64 << 10);
  s.record(close && std::abs(m.bytes_per_parameter() - formula) <= 0.05 * formula, line);
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_path;
  bool process = false, threads = false;
  std::string layout = "tp2";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--data-path" && i + 1 < argc) data_path = argv[++i];
    else if (arg == "--process") process = true;
    else if (arg == "--process-layout" && i + 1 < argc) layout = argv[++i];
    else if (arg == "--threads") threads = true;
    else {
      std::fprintf(stderr, "usage: %s [--data-path PREFIX] [--threads | --process [--process-layout "
                           "tp2|tp2-overlap|tp2-engines|dp2|dp2-zero|pp2|cp2|cp2-a2a]]\n",
                   argv[0]);
      return 2;
    }
  }
  if (data_path.empty() && std::getenv("STRATA_DATA_PATH") != nullptr) data_path = std::getenv("STRATA_DATA_PATH");
  gpu_test::suite s("training");
  try {
    if (process) {  // one rank of a torchrun-style job (the world size comes from WORLD_SIZE)
      // --process tp2: tp=2 + sequence parallel (tp2-overlap: with --tp-comm-overlap and ring gathers; tp2-engines: with
      // --tp-comm-overlap and copy-engine gathers); dp2: dp=2; dp2-zero: dp=2 with the distributed optimizer and both
      // overlaps; pp2: 2 pipeline stages (1F1B).
      const bool tp2 = layout == "tp2" || layout == "tp2-overlap" || layout == "tp2-engines";
      trainer::TrainArgs a = tp2 ? args_for(data_path, 2, 2, true) : args_for(data_path, 2, 1, false);
      a.tp_comm_overlap = layout == "tp2-overlap" || layout == "tp2-engines";
      if (a.tp_comm_overlap) a.tp_comm_overlap_gather = layout == "tp2-engines" ? "copy-engines" : "ring";
      if (layout == "dp2-zero") a.use_distributed_optimizer = a.overlap_grad_reduce = a.overlap_param_gather = true;
      if (layout == "pp2") a.pipeline.pipeline_model_parallel_size = 2;
      if (layout == "cp2" || layout == "cp2-a2a") {
        a.context_parallel_size = 2;
        a.cp_comm_type = layout == "cp2" ? "p2p" : "a2a";
      }
      trainer::resolve_device(a, true);
      const auto run = train(a);
      if (!run.losses.empty()) print_losses(run);  // rank 0 logs
      return s.finish();
    }
    const auto reference = train(args_for(data_path, 1, 1, false));
    char line[256];
    std::snprintf(line, sizeof line, "tp=1 on 1 GPU: 20 iterations, loss %.4f -> %.4f falls", reference.losses.front(),
                  reference.losses.back());
    s.record(reference.losses.size() == 20 && reference.losses.back() < reference.losses.front() - 0.5, line);
    const auto again = train(args_for(data_path, 1, 1, false));
    s.record(again.losses == reference.losses, "tp=1 on 1 GPU: a second run gives the same 20 losses bit for bit");
    print_losses(reference);  // run_training_processes.sh compares the 2-GPU jobs with these
    // fp16 parameters and activations (--fp16) under the dynamic loss scaler. From a scale that fits
    // (2^12) no iteration is skipped and every loss follows bf16's; from the default 2^32 the first
    // iterations' gradients overflow fp16, and each is skipped and halves the scale (hysteresis 1)
    // until one fits.
    auto half = args_for(data_path, 1, 1, false);
    half.dtype = "fp16";
    half.initial_loss_scale = 4096;
    const auto fp16_run = train(half);
    s.record(fp16_run.skipped_iterations.empty() && fp16_run.loss_scales == std::vector<double>(20, 4096),
             "fp16 on 1 GPU from loss scale 2^12: no iteration skipped, the scale stays");
    compare(s, "fp16 on 1 GPU (against bf16)", fp16_run, reference);
    half.initial_loss_scale = 4294967296.0;
    half.hysteresis = 1;
    const auto backed_off = train(half);
    const std::vector<int>& skipped = backed_off.skipped_iterations;
    std::size_t lead = 0;  // the leading run of skipped iterations: 1, 2, ..., lead
    while (lead < skipped.size() && skipped[lead] == static_cast<int>(lead + 1)) ++lead;
    bool halved = lead > 0 && lead < 15 && backed_off.losses.size() == 20 && backed_off.loss_scales.size() == 20;
    for (std::size_t j = 0; halved && j < skipped.size(); ++j) {  // each overflow halves the scale (hysteresis 1)
      const int it = skipped[j];
      const double before = it >= 2 ? backed_off.loss_scales[static_cast<std::size_t>(it - 2)] : std::ldexp(1.0, 32);
      halved = backed_off.loss_scales[static_cast<std::size_t>(it - 1)] == before / 2;
    }
    std::snprintf(line, sizeof line,
                  "fp16 on 1 GPU from loss scale 2^32: iterations 1..%zu skipped (%zu in all), each halving the scale, then "
                  "the loss falls %.4f -> %.4f",
                  lead, skipped.size(), halved ? backed_off.losses[lead] : NAN, halved ? backed_off.losses.back() : NAN);
    s.record(halved && backed_off.losses.back() < backed_off.losses[lead] - 0.2, line);
    // Checkpoints on the GPU: saved at iteration 10 in place or in the background (--async-save:
    // device-to-host copies at the step boundary, the files written while training goes on), the
    // run's losses are unchanged and the run resumed from iteration 10 gives the same bits.
    const std::filesystem::path ckpt =
        std::filesystem::temp_directory_path() / ("strata_gpu_checkpoint_" + std::to_string(::getpid()));
    const std::vector<double> last_ten(reference.losses.begin() + 10, reference.losses.end());
    for (bool async : {false, true}) {
      std::filesystem::remove_all(ckpt);
      auto saving = args_for(data_path, 1, 1, false);
      saving.save = ckpt.string();
      saving.save_interval = 10;
      saving.async_save = async;
      const auto saved = train(saving);
      const std::string how = async ? "--async-save" : "save";
      s.record(saved.losses == reference.losses && strata::latest_checkpointed_iteration(ckpt) == 20,
               "checkpoint on 1 GPU (" + how + " at 10 and 20): the 20 losses are unchanged bit for bit");
      auto resumed = args_for(data_path, 1, 1, false);
      resumed.load = ckpt.string();
      resumed.ckpt_step = 10;
      const auto from10 = train(resumed);
      s.record(from10.start_iteration == 10 && from10.losses == last_ten,
               "checkpoint on 1 GPU (" + how + "): resumed from iteration 10, iterations 11-20 give the same losses bit for bit");
    }
    if (threads) {  // 2 GPUs driven from threads of this process (nccl::run)
      if (strata::cuda::device_count() < 2) {
        s.record(false, "test_training --threads needs 2 GPUs; this process sees " + std::to_string(strata::cuda::device_count()));
        return s.finish();
      }
      const auto tp2 = train(args_for(data_path, 2, 2, true));
      compare(s, "tp=2 + sequence parallel on 2 GPUs (threads)", tp2, reference);
      // --tp-comm-overlap: ring gathers and reduce-scatters beside the GEMMs and the chained
      // backward, on the communication stream; also twice, for the same bits run to run.
      auto overlapped_args = args_for(data_path, 2, 2, true);
      overlapped_args.tp_comm_overlap = true;
      overlapped_args.tp_comm_overlap_gather = "ring";
      const auto tp2_overlap = train(overlapped_args);
      compare(s, "tp=2 + sequence parallel + --tp-comm-overlap on 2 GPUs (threads)", tp2_overlap, reference);
      s.record(!tp2_overlap.losses.empty() && train(overlapped_args).losses == tp2_overlap.losses,
               "tp=2 + sequence parallel + --tp-comm-overlap: a second run gives the same 20 losses bit for bit");
      // --tp-comm-overlap-gather collective moves the same blocks through an all-gather instead of
      // send/recv: the same bits. --tp-comm-overlap-sm-margin 8 plans the GEMMs beside a collective for
      // 8 SMs fewer (other cuBLASLt algorithms): the tp=1 run's losses within the tolerance.
      auto whole_args = overlapped_args;
      whole_args.tp_comm_overlap_gather = "collective";
      const auto tp2_whole = train(whole_args);
      s.record(!tp2_whole.losses.empty() && tp2_whole.losses == tp2_overlap.losses,
               "tp=2 + sequence parallel + --tp-comm-overlap-gather collective: the same 20 losses bit for bit as the ring");
      // --tp-comm-overlap-gather copy-engines moves the same blocks by the copy engines: the same bits again.
      auto engines_args = overlapped_args;
      engines_args.tp_comm_overlap_gather = "copy-engines";
      const auto tp2_engines = train(engines_args);
      s.record(!tp2_engines.losses.empty() && tp2_engines.losses == tp2_overlap.losses,
               "tp=2 + sequence parallel + --tp-comm-overlap-gather copy-engines: the same 20 losses bit for bit as the ring");
      auto margin_args = overlapped_args;
      margin_args.tp_comm_overlap_sm_margin = 8;
      compare(s, "tp=2 + sequence parallel + --tp-comm-overlap-sm-margin 8 on 2 GPUs (threads)", train(margin_args), reference);
      // The 1-GPU checkpoint of iteration 10 loaded at tp=2 + SP (resharded): iterations 11-20
      // follow the straight tp=2 run.
      auto resharded = args_for(data_path, 2, 2, true);
      resharded.load = ckpt.string();
      resharded.ckpt_step = 10;
      const auto tp2_from10 = train(resharded);
      double worst = tp2_from10.losses.size() == 10 ? 0.0 : INFINITY;
      for (std::size_t i = 0; i < tp2_from10.losses.size() && i < 10; ++i)
        worst = std::max(worst, std::abs(tp2_from10.losses[i] - tp2.losses[10 + i]) / tp2.losses[10 + i]);
      std::snprintf(line, sizeof line,
                    "the 1-GPU checkpoint of iteration 10 resumed at tp=2 + SP on 2 GPUs: iterations 11-20 within %.1e "
                    "of the straight tp=2 run (bound 2e-2)", worst);
      s.record(tp2_from10.start_iteration == 10 && worst <= 2e-2, line);
      const auto tp2_no_sp = train(args_for(data_path, 2, 2, false));
      compare(s, "tp=2 without sequence parallel on 2 GPUs (threads)", tp2_no_sp, reference);
      const auto dp2 = train(args_for(data_path, 2, 1, false));
      compare(s, "dp=2 on 2 GPUs (threads)", dp2, reference);
      // The distributed optimizer, then the same with the reduction and the parameter all-gather
      // on the communication stream: the same collectives in the same order give the same bits.
      auto zero = args_for(data_path, 2, 1, false);
      zero.use_distributed_optimizer = true;
      const auto dp2_zero = train(zero);
      compare(s, "dp=2 + distributed optimizer on 2 GPUs (threads)", dp2_zero, reference);
      check_state_memory(s, "dp=2 + distributed optimizer", dp2_zero.memory, 2);
      zero.overlap_grad_reduce = zero.overlap_param_gather = true;
      const auto dp2_overlap = train(zero);
      s.record(dp2_overlap.losses == dp2_zero.losses && !dp2_zero.losses.empty(),
               "dp=2 + distributed optimizer with --overlap-grad-reduce --overlap-param-gather: the same 20 losses bit for "
               "bit as without overlap");
      compare(s, "dp=2 + distributed optimizer, overlapped, on 2 GPUs (threads)", dp2_overlap, reference);
      // Context parallelism over NCCL: each sequence's 4 chunks of 16 tokens split over 2 GPUs
      // (chunks 0 and 3, 1 and 2); ring attention with its transfers beside the blocks on the
      // communication stream, twice for the same bits; all-to-all attention; the ring with the
      // attention core recomputed in the backward (the same bits as without).
      auto cp2 = args_for(data_path, 2, 1, false);
      cp2.context_parallel_size = 2;
      const auto ring = train(cp2);
      compare(s, "cp=2 ring attention (p2p) on 2 GPUs (threads)", ring, reference);
      s.record(!ring.losses.empty() && train(cp2).losses == ring.losses,
               "cp=2 ring attention: a second run gives the same 20 losses bit for bit");
      auto recomputed = cp2;
      recomputed.recompute_granularity = "selective";
      s.record(!ring.losses.empty() && train(recomputed).losses == ring.losses,
               "cp=2 ring attention with --recompute-granularity selective: the same 20 losses bit for bit");
      cp2.cp_comm_type = "a2a";
      compare(s, "cp=2 all-to-all attention (a2a) on 2 GPUs (threads)", train(cp2), reference);
      // Pipeline parallelism over NCCL: 2 stages, the 2 micro-batches of each step under 1F1B and
      // zero-bubble.
      // With --overlap-p2p-communication the transfers run on the communication stream: the same
      // transfers in the same order, so the same bits.
      for (const char* schedule : {"1f1b", "zero-bubble"}) {
        auto pp2 = args_for(data_path, 2, 1, false);
        pp2.pipeline.pipeline_model_parallel_size = 2;
        pp2.pipeline.pipeline_schedule = schedule;
        const auto plain = train(pp2);
        compare(s, std::string("pp=2 ") + schedule + " on 2 GPUs (threads)", plain, reference);
        pp2.pipeline.overlap_p2p_communication = true;
        const auto overlapped = train(pp2);
        s.record(overlapped.losses == plain.losses && !plain.losses.empty(),
                 std::string("pp=2 ") + schedule + " with --overlap-p2p-communication: the same 20 losses bit for bit");
      }
    }
  } catch (const std::exception& e) {
    s.record(false, std::string("test_training stopped: ") + e.what());
  }
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("strata_gpu_checkpoint_" + std::to_string(::getpid())), ec);
  return s.finish();
}
