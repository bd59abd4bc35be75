// Mixtral (models::Mixtral: the Llama block with a MoeMlp in every layer) through the trainers'
// loop, as pretrain_gpt runs it with Megatron's MoE flags: the loss falls and the load-balancing
// and z losses are logged each iteration; expert parallelism (ep 2 and 4, with tensor and
// sequence parallelism, expert tensor parallelism, data parallelism and pipeline parallelism,
// either dispatcher) follows the single-rank trajectory, router losses included; a run resumed
// from a checkpoint (expert bias included) continues bit for bit; the memory estimate counts this
// rank's experts exactly as the model allocates them; with FP8 (delayed) the experts' GEMMs in FP8
// follow the single-rank FP8 run at every layout, and resume bit for bit. With --moe-layer-freq (dense layers among
// the MoE ones) the same holds at every layout, pipeline stages holding mixed layers included. The
// experts' gradients zeroed by first write train the bits of a fill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <tuple>

#include "same_parameters.hpp"
#include "trainer/trainer.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_training_moe_cases {

namespace {

using strata::models::Mixtral;

trainer::TrainArgs tiny_mixtral() {
  trainer::TrainArgs a = trainer::default_args("llama");
  a.model_kind = "mixtral";
  a.model.num_layers = 2;
  a.model.hidden_size = 64;
  a.model.num_attention_heads = 4;
  a.model.num_query_groups = 2;
  a.model.ffn_hidden_size = 96;
  a.model.seq_length = 32;
  a.model.moe.num_experts = 4;
  a.model.moe.topk = 2;
  a.model.moe.aux_loss_coeff = 1e-2;
  a.model.moe.z_loss_coeff = 1e-3;
  a.micro_batch_size = 2;
  a.global_batch_size = 8;
  a.lr = 1e-2;
  a.min_lr = 1e-3;
  a.lr_warmup_iters = 3;
  a.quiet = true;
  a.eval_interval = 20;
  a.eval_iters = 2;
  a.sample_tokens = 0;
  a.world_size = 1;
  a.tensor_model_parallel_size = 1;
  a.sequence_parallel = false;
  return a;
}

double mean(const std::vector<double>& v, std::size_t begin, std::size_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, 0.0) / static_cast<double>(end - begin);
}

// `run` follows `reference`: the loss, the load-balancing loss and the z-loss of every iteration
// within 1e-10 relative.
template <class Result>
void expect_follows(const Result& run, const Result& reference, const std::string& what) {
  ASSERT_EQ(run.losses.size(), reference.losses.size()) << what;
  ASSERT_EQ(run.load_balancing_losses.size(), reference.load_balancing_losses.size()) << what;
  ASSERT_EQ(run.z_losses.size(), reference.z_losses.size()) << what;
  for (std::size_t i = 0; i < run.losses.size(); ++i) {
    EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-10 * reference.losses[i]) << what << " iteration " << i + 1;
    EXPECT_NEAR(run.load_balancing_losses[i], reference.load_balancing_losses[i], 1e-10 * reference.load_balancing_losses[i])
        << what << " iteration " << i + 1;
    EXPECT_NEAR(run.z_losses[i], reference.z_losses[i], 1e-10 * reference.z_losses[i]) << what << " iteration " << i + 1;
  }
}

// Drops the checkpoint of iteration `drop` from `dir` and points the tracker at `keep`, so that a run
// loading `dir` resumes from iteration `keep`.
void rewind_checkpoint(const std::filesystem::path& dir, int keep, int drop) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07d", drop);
  std::filesystem::remove_all(dir / name);
  std::ofstream tracker(dir / "latest_checkpointed_iteration.txt", std::ios::trunc);
  tracker << keep << "\n";
}

// A layout of these tests: ranks, the parallel sizes, sequence parallelism and the dispatcher.
struct MoeLayout {
  int world, tp, pp, ep, etp;
  bool sp;
  strata::MoeDispatcherType dispatcher;
  int cp = 1;
};
trainer::TrainArgs with_layout(trainer::TrainArgs a, const MoeLayout& l) {
  a.world_size = l.world;
  a.context_parallel_size = l.cp;
  a.tensor_model_parallel_size = l.tp;
  a.pipeline.pipeline_model_parallel_size = l.pp;
  a.expert_model_parallel_size = l.ep;
  a.expert_tensor_parallel_size = l.etp;
  a.sequence_parallel = l.sp;
  a.model.moe.token_dispatcher = l.dispatcher;
  return a;
}
std::string describe(const MoeLayout& l) {
  return "world=" + std::to_string(l.world) + " tp=" + std::to_string(l.tp) + " pp=" + std::to_string(l.pp) +
         " ep=" + std::to_string(l.ep) + " etp=" + std::to_string(l.etp) + (l.sp ? " sp" : "") +
         (l.dispatcher == strata::MoeDispatcherType::allgather ? " allgather" : " alltoall") +
         (l.cp > 1 ? " cp=" + std::to_string(l.cp) : "");
}

TEST(TrainingMoe, MixtralLossFallsAndRouterLossesAreLogged) {
  auto a = tiny_mixtral();
  a.train_iters = 40;
  a.world_size = 2;
  a.model.moe.token_dispatcher = strata::MoeDispatcherType::alltoall;
  trainer::ParallelConfig expected{.tp = 1, .pp = 1, .dp = 2, .ep = 1, .etp = 1};
  a.expert_model_parallel_size = 2;
  expected.ep = 2;
  EXPECT_EQ(trainer::parallel_config_of(a), expected);
  const auto result = trainer::train<Mixtral>(a);
  ASSERT_EQ(result.losses.size(), 40u);
  EXPECT_LT(mean(result.losses, 30, 40), mean(result.losses, 0, 10) - 1.0) << "loss did not fall";
  ASSERT_EQ(result.load_balancing_losses.size(), 40u);
  ASSERT_EQ(result.z_losses.size(), 40u);
  for (std::size_t i = 0; i < 40; ++i) {
    // Switch's balance E / (k N^2) sum_i P_i c_i is 1 for a uniform router, never below 1/k's share
    EXPECT_GT(result.load_balancing_losses[i], 0.5) << "iteration " << i + 1;
    EXPECT_LT(result.load_balancing_losses[i], 4.0) << "iteration " << i + 1;
    EXPECT_GT(result.z_losses[i], 0.0) << "iteration " << i + 1;
  }
  ASSERT_EQ(result.validation_losses.size(), 2u);
}

// Every layout against one rank, in double: the loss of each iteration and the router losses
// (the aux loss is invariant to the partition: token counts are summed over the tp x cp group).
TEST(TrainingMoe, ExpertParallelRunsFollowSingleRankTrajectory) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 4;
  base.eval_iters = 0;
  base.model.moe.shared_expert_ffn_hidden_size = 32;
  const auto reference = trainer::train<Mixtral>(base);
  ASSERT_EQ(reference.losses.size(), 4u);
  ASSERT_EQ(reference.load_balancing_losses.size(), 4u);
  using D = strata::MoeDispatcherType;
  for (MoeLayout l : {MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, MoeLayout{2, 1, 1, 2, 1, false, D::allgather},
                      MoeLayout{4, 2, 1, 2, 1, true, D::alltoall}, MoeLayout{4, 2, 1, 2, 2, true, D::allgather},
                      MoeLayout{4, 2, 1, 4, 1, false, D::alltoall}, MoeLayout{4, 1, 2, 2, 1, false, D::alltoall},
                      // context parallelism: each sequence's tokens split over cp ranks, routed where they are
                      MoeLayout{2, 1, 1, 1, 1, false, D::alltoall, 2}, MoeLayout{4, 1, 1, 2, 1, false, D::alltoall, 2},
                      MoeLayout{4, 2, 1, 2, 2, true, D::allgather, 2}, MoeLayout{4, 1, 2, 2, 1, false, D::alltoall, 2}})
    expect_follows(trainer::train<Mixtral>(with_layout(base, l)), reference, describe(l));
}

// gpt-oss's experts: quick GeGLU with a clamp and a linear offset in the routed and the shared
// experts. The clamp (0.1 here, so that it bites at this initialization) and the offset change the
// loss from SwiGLU's, and every layout (ep, etp with SP, pp, both dispatchers) follows one rank.
TEST(TrainingMoe, QuickGegluExpertsFollowSingleRankTrajectory) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 3;
  base.eval_iters = 0;
  base.model.moe.shared_expert_ffn_hidden_size = 32;
  const auto swiglu = trainer::train<Mixtral>(base);
  base.model.activation = strata::MlpActivation::quick_geglu;
  base.model.activation_clamp = 0.1;
  base.model.glu_linear_offset = 1.0;
  const auto reference = trainer::train<Mixtral>(base);
  ASSERT_EQ(reference.losses.size(), 3u);
  EXPECT_GT(std::abs(reference.losses[0] - swiglu.losses[0]), 1e-6) << "quick GeGLU gave SwiGLU's loss";
  auto unclamped = base;
  unclamped.model.activation_clamp = 0;
  EXPECT_GT(std::abs(trainer::train<Mixtral>(unclamped).losses[1] - reference.losses[1]), 1e-9)
      << "the clamp changed nothing";
  using D = strata::MoeDispatcherType;
  const MoeLayout layouts[] = {MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, MoeLayout{4, 2, 1, 2, 2, true, D::allgather},
                               MoeLayout{4, 1, 2, 2, 1, false, D::alltoall}};
  for (const MoeLayout& l : layouts)
    expect_follows(trainer::train<Mixtral>(with_layout(base, l)), reference, "quick GeGLU " + describe(l));
  // gpt-oss's biases (router, experts, shared experts, attention): the same at every layout
  base.model.add_bias_linear = true;
  const auto biased = trainer::train<Mixtral>(base);
  EXPECT_GT(std::abs(biased.losses[0] - reference.losses[0]), 1e-9) << "the router's bias changed nothing";
  for (const MoeLayout& l : layouts)
    expect_follows(trainer::train<Mixtral>(with_layout(base, l)), biased, "biases, quick GeGLU " + describe(l));
}

// Megatron's --moe-router-force-load-balancing: random router logits (a benchmark's balanced load).
// The run differs from the routed one, is the same when repeated, and still trains the router's
// weight through the straight-through gradient.
TEST(TrainingMoe, ForcedLoadBalancingRoutesByRandomLogits) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 3;
  base.eval_iters = 0;
  base.world_size = 2;
  base.expert_model_parallel_size = 2;
  base.model.moe.token_dispatcher = strata::MoeDispatcherType::alltoall;
  const auto routed = trainer::train<Mixtral>(base);
  base.model.moe.force_load_balancing = true;
  const auto forced = trainer::train<Mixtral>(base), again = trainer::train<Mixtral>(base);
  ASSERT_EQ(forced.losses.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::isfinite(forced.losses[i])) << "iteration " << i + 1;
    EXPECT_EQ(forced.losses[i], again.losses[i]) << "iteration " << i + 1 << ": the random logits are not reproducible";
  }
  EXPECT_GT(std::abs(forced.losses[0] - routed.losses[0]), 1e-9) << "the logits were not replaced";
  // the z-loss is of the random logits, the same at every step in distribution but not in value
  EXPECT_NE(forced.z_losses[0], forced.z_losses[1]);
  // the MoE block recomputed (--recompute-modules moe, Megatron's DeepSeek-V3 line with forced balance)
  // draws the same random logits again: the run without recompute, bit for bit (with 1F1B at pp 2 too)
  for (const char* modules : {"moe", "core_attn moe"}) {
    auto recomputed = base;
    recomputed.recompute_granularity = "selective";
    recomputed.recompute_modules = modules;
    EXPECT_EQ(trainer::train<Mixtral>(recomputed).losses, forced.losses) << modules;
  }
  auto piped = base;
  piped.world_size = 4;
  piped.pipeline.pipeline_model_parallel_size = 2;
  const auto piped_plain = trainer::train<Mixtral>(piped);
  piped.recompute_granularity = "selective";
  piped.recompute_modules = "moe";
  EXPECT_EQ(trainer::train<Mixtral>(piped).losses, piped_plain.losses) << "pp 2";
}

// Multi-token prediction on a mixture of experts (DeepSeek-V3's shape: the depth's layer is a MoE
// layer, its router's aux and z losses counted with the others'): ep = 2 with both dispatchers,
// tp = 2 x ep = 2 x etp = 2 under sequence parallelism and pp = 2 follow one rank (the loss, the
// router losses and each depth's loss, 1e-10 in double); the estimate counts the depth's experts.
TEST(TrainingMoe, MultiTokenPredictionFollowsSingleRankTrajectory) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 4;
  base.eval_iters = 0;
  base.model.mtp_num_layers = 1;
  base.model.mtp_loss_scaling_factor = 0.3;
  const auto reference = trainer::train<Mixtral>(base);
  ASSERT_EQ(reference.mtp_losses.size(), 4u);
  using D = strata::MoeDispatcherType;
  for (MoeLayout l : {MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, MoeLayout{2, 1, 1, 2, 1, false, D::allgather},
                      MoeLayout{4, 2, 1, 2, 2, true, D::alltoall}, MoeLayout{4, 1, 2, 2, 1, false, D::alltoall}}) {
    const std::string what = describe(l);
    const auto run = trainer::train<Mixtral>(with_layout(base, l));
    expect_follows(run, reference, what);
    ASSERT_EQ(run.mtp_losses.size(), reference.mtp_losses.size()) << what;
    for (std::size_t i = 0; i < run.mtp_losses.size(); ++i)
      EXPECT_NEAR(run.mtp_losses[i], reference.mtp_losses[i], 1e-10 * reference.mtp_losses[i]) << what << " iteration " << i + 1;
  }
  strata::inprocess::run(1, [&](strata::inprocess::communicator& world) {
    auto ctx = strata::ParallelContext<strata::inprocess::communicator>::create(world, strata::ParallelConfig{});
    Mixtral<trainer::TrainPolicy<float, false>> model(ctx, base.model);
    std::int64_t n = 0;
    model.for_each_parameter([&](auto& p) { n += p.value.numel(); });
    EXPECT_EQ(n, strata::models::parameters_per_rank(base.model, strata::models::DecoderShape::llama(), 1));
    ASSERT_EQ(model.routers().size(), 3u);  // two layers and the depth's, registered where it lives
    EXPECT_EQ(model.routers().back()->weight().name, "mtp.0.layer.mlp.router.weight");
  });
}

// The per-sequence aux loss (DeepSeek-V2's seq_aux_loss) under context parallelism: each sequence's
// tokens are split over the cp ranks, the per-sequence counts are summed over tp x cp, and the run
// follows one rank (loss and load-balancing loss, 1e-10 in double), also with ep 2 over cp 2 x dp 2.
TEST(TrainingMoe, PerSequenceAuxLossUnderContextParallelismFollowsSingleRank) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 3;
  base.eval_iters = 0;
  base.moe_router_load_balancing_type = "seq_aux_loss";
  base.model.moe.load_balancing = strata::MoeLoadBalancing::seq_aux_loss;
  const auto reference = trainer::train<Mixtral>(base);
  ASSERT_EQ(reference.load_balancing_losses.size(), 3u);
  auto whole_batch = base;  // the Switch aux loss over the whole batch: another number, so the per-sequence one ran
  whole_batch.moe_router_load_balancing_type = "aux_loss";
  whole_batch.model.moe.load_balancing = strata::MoeLoadBalancing::aux_loss;
  EXPECT_NE(trainer::train<Mixtral>(whole_batch).load_balancing_losses[0], reference.load_balancing_losses[0]);
  for (auto [world, ep] : {std::pair{2, 1}, std::pair{4, 2}}) {
    auto a = base;
    a.world_size = world;
    a.context_parallel_size = 2;
    a.expert_model_parallel_size = ep;
    const std::string what = "cp=2 world=" + std::to_string(world) + " ep=" + std::to_string(ep);
    expect_follows(trainer::train<Mixtral>(a), reference, what);
  }
}

// FP8 experts (--fp8-format hybrid --fp8-recipe delayed, the experts' six GEMMs on FP8 codes with the
// scales every rank shares): every layout follows the single-rank FP8 run in double (1e-10), and a run
// resumed from its checkpoint (the experts' amax histories and scales in it) follows the straight
// run bit for bit.
TEST(TrainingMoe, Fp8ExpertsFollowSingleRankFp8Trajectory) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 4;
  base.eval_iters = 0;
  base.fp8_format = "hybrid";
  base.fp8_recipe = "delayed";
  base.fp8_amax_history_len = 4;
  base.fp8_amax_compute_algo = "max";
  base.fp8_margin = 1;
  const auto reference = trainer::train<Mixtral>(base);
  auto plain = base;
  plain.fp8_format.clear();
  EXPECT_GT(std::abs(trainer::train<Mixtral>(plain).losses[1] - reference.losses[1]), 1e-6) << "FP8 is in effect";
  using D = strata::MoeDispatcherType;
  for (MoeLayout l : {MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, MoeLayout{2, 1, 1, 2, 1, false, D::allgather},
                      MoeLayout{4, 2, 1, 2, 2, true, D::allgather}, MoeLayout{4, 2, 1, 4, 1, false, D::alltoall},
                      MoeLayout{4, 1, 2, 2, 1, false, D::alltoall}, MoeLayout{4, 1, 1, 2, 1, false, D::alltoall, 2}})
    expect_follows(trainer::train<Mixtral>(with_layout(base, l)), reference, "FP8 " + describe(l));

  const auto dir = std::filesystem::temp_directory_path() / "strata_training_moe_fp8_resume";
  std::filesystem::remove_all(dir);
  auto a = with_layout(base, MoeLayout{2, 1, 1, 2, 1, false, D::alltoall});
  a.dtype = "float";
  a.train_iters = 6;
  const auto straight = trainer::train<Mixtral>(a);
  auto first = a;
  first.save = dir.string();
  first.save_interval = 3;
  ASSERT_EQ(trainer::train<Mixtral>(first).losses, straight.losses);
  {  // the experts ran FP8: their two scaling states are in the checkpoint, once for all experts
    strata::StateReader reader(dir / "iter_0000003" / "rank_00000.strata");
    for (const char* projection : {"fc1", "fc2"})
      for (int layer : {0, 1})
        EXPECT_TRUE(reader.has_tensor("fp8.layers." + std::to_string(layer) + ".mlp.experts." + projection + ".scaling"))
            << "layer " << layer << " " << projection;
  }
  rewind_checkpoint(dir, 3, 6);
  auto resumed = a;
  resumed.load = dir.string();
  const auto second = trainer::train<Mixtral>(resumed);
  ASSERT_EQ(second.losses.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << "iteration " << 4 + i;
  std::filesystem::remove_all(dir);
}

// Aux-loss-free balancing (the expert bias moves every step) and the distributed optimizer over
// expert data parallelism: 6 straight iterations equal 3, a checkpoint, and 3 more, bit for bit.
TEST(TrainingMoe, ResumeWithExpertBiasEqualsStraightThrough) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_moe_resume";
  std::filesystem::remove_all(dir);
  auto a = tiny_mixtral();
  a.train_iters = 6;
  a.eval_iters = 0;
  a.world_size = 4;
  a.expert_model_parallel_size = 2;
  a.use_distributed_optimizer = true;
  a.model.moe.expert_bias = true;
  a.model.moe.load_balancing = strata::MoeLoadBalancing::none;
  a.model.moe.aux_loss_coeff = 0;
  a.model.moe.expert_bias_update_rate = 0.05;
  const auto straight = trainer::train<Mixtral>(a);
  ASSERT_EQ(straight.losses.size(), 6u);
  EXPECT_TRUE(straight.load_balancing_losses.empty()) << "no aux loss is logged when it is off";

  auto first = a;
  first.train_iters = 6;
  first.save = dir.string();
  first.save_interval = 3;
  ASSERT_EQ(trainer::train<Mixtral>(first).losses, straight.losses);
  rewind_checkpoint(dir, 3, 6);
  auto resumed = a;
  resumed.load = dir.string();
  const auto second = trainer::train<Mixtral>(resumed);
  EXPECT_EQ(second.start_iteration, 3);
  ASSERT_EQ(second.losses.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << "iteration " << 4 + i;
  std::filesystem::remove_all(dir);
}

// strata-convert's path for experts: a checkpoint saved at tp 2 x ep 2 (etp 2, dp 2), converted to
// tp 1 x ep 4 x dp 4, puts expert e in rank e's file alone, whole, and every dense tensor in rank 0's;
// converted again to tp 2 x dp 2 x ep 2 x etp 2 (from a source saved whole, at tp 1), splits the
// dense and the expert tensors in two. Both continue the run as loading the original does.
TEST(TrainingMoe, ConvertedCheckpointPlacesEachExpertOnItsRank) {
  const auto root = std::filesystem::temp_directory_path() / "strata_training_moe_convert";
  std::filesystem::remove_all(root);
  auto a = tiny_mixtral();
  a.dtype = "double";
  a.train_iters = 6;
  a.eval_iters = 0;
  a.world_size = 4;
  a.tensor_model_parallel_size = 2;
  a.expert_model_parallel_size = 2;
  auto saving = a;
  saving.save = (root / "saved").string();
  saving.save_interval = 3;
  const auto straight = trainer::train<Mixtral>(saving);
  rewind_checkpoint(root / "saved", 3, 6);
  strata::ShardedCheckpoint source(root / "saved" / "iter_0000003");
  strata::convert_checkpoint(source, root / "ep4", strata::ConvertOptions{.tp = 1, .pp = 1, .dp = 4, .ep = 4, .etp = 1, .optimizer = true, .progress = {}});
  for (int r = 0; r < 4; ++r) {
    char file[32];
    std::snprintf(file, sizeof file, "rank_%05d.strata", r);
    strata::StateReader reader(root / "ep4" / "iter_0000003" / file);
    for (int e = 0; e < 4; ++e) {
      const std::string name = "model.layers.1.mlp.experts." + std::to_string(e) + ".fc1.weight";
      EXPECT_EQ(reader.has_tensor(name), e == r) << name << " in rank " << r;
      EXPECT_EQ(reader.has_tensor("optimizer.layers.1.mlp.experts." + std::to_string(e) + ".fc2.weight.exp_avg"), e == r);
      if (e == r) {
        const auto& record = reader.record(name);
        EXPECT_EQ(record.local_shape, record.global_shape) << name << " is whole at etp 1";
      }
    }
    EXPECT_EQ(reader.has_tensor("model.layers.0.attention.qkv.weight"), r == 0);
    EXPECT_EQ(reader.get_int("parallel.ep"), 4);
  }
  strata::ShardedCheckpoint ep4(root / "ep4" / "iter_0000003");
  strata::convert_checkpoint(ep4, root / "etp2", strata::ConvertOptions{.tp = 2, .pp = 1, .dp = 2, .ep = 2, .etp = 2, .optimizer = true, .progress = {}});
  {
    // Rank 1: tp rank 1 of dp 0; as an expert rank etp 1 of ep 0 (experts 0 and 1).
    strata::StateReader reader(root / "etp2" / "iter_0000003" / "rank_00001.strata");
    const auto& qkv = reader.record("model.layers.0.attention.qkv.weight");
    EXPECT_EQ(2 * qkv.local_shape[0], qkv.global_shape[0]) << "the dense tensor saved whole is split over tp 2";
    const auto& fc2 = reader.record("model.layers.1.mlp.experts.1.fc2.weight");
    EXPECT_EQ(2 * fc2.local_shape[1], fc2.global_shape[1]) << "fc2 is split over etp 2 on its columns";
    EXPECT_FALSE(reader.has_tensor("model.layers.1.mlp.experts.2.fc1.weight"));
  }
  for (auto [target, tp, ep, etp] : {std::tuple{"ep4", 1, 4, 1}, std::tuple{"etp2", 2, 2, 2}}) {
    auto resumed = a;
    resumed.tensor_model_parallel_size = tp;
    resumed.expert_model_parallel_size = ep;
    resumed.expert_tensor_parallel_size = etp;
    resumed.load = (root / target).string();
    const auto second = trainer::train<Mixtral>(resumed);
    EXPECT_EQ(second.start_iteration, 3) << target;
    ASSERT_EQ(second.losses.size(), 3u) << target;
    for (std::size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(second.losses[i], straight.losses[3 + i], 1e-9 * std::abs(straight.losses[3 + i])) << target << " iteration " << 4 + i;
  }
  auto bad = strata::ConvertOptions{.tp = 1, .pp = 1, .dp = 3, .ep = 3, .etp = 1, .optimizer = true, .progress = {}};
  try {
    strata::convert_checkpoint(source, root / "bad", bad);
    ADD_FAILURE() << "ep 3 of 4 experts was converted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the checkpoint's 4 experts"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(root);
}

// The estimate's parameter count of a rank is what the Mixtral model allocates on it, at every
// (tp, ep, etp) with a shared expert.
TEST(TrainingMoe, MemoryEstimateCountsThisRanksExperts) {
  using Context = strata::ParallelContext<strata::inprocess::communicator>;
  auto a = tiny_mixtral();
  a.model.moe.shared_expert_ffn_hidden_size = 32;
  struct Layout {
    int world, tp, ep, etp;
  };
  for (Layout l : {Layout{1, 1, 1, 1}, Layout{2, 1, 2, 1}, Layout{4, 2, 2, 2}, Layout{4, 2, 4, 1}}) {
    const strata::ParallelConfig config{.tp = l.tp, .dp = l.world / l.tp, .ep = l.ep, .etp = l.etp};
    strata::models::ModelPiece piece;
    piece.ep = l.ep;
    piece.etp = l.etp;
    const std::int64_t expected = strata::models::parameters_per_rank(a.model, strata::models::DecoderShape::llama(), l.tp, piece);
    std::vector<std::int64_t> counted(static_cast<std::size_t>(l.world));
    strata::inprocess::run(l.world, [&](strata::inprocess::communicator& world) {
      Context ctx = Context::create(world, config);
      Mixtral<trainer::TrainPolicy<float, false>> model(ctx, a.model);
      std::int64_t n = 0;
      model.for_each_parameter([&](auto& p) { n += p.value.numel(); });
      counted[static_cast<std::size_t>(world.rank())] = n;
    });
    for (int r = 0; r < l.world; ++r)
      EXPECT_EQ(counted[static_cast<std::size_t>(r)], expected)
          << "tp=" << l.tp << " ep=" << l.ep << " etp=" << l.etp << " rank " << r;
  }
}

// A capacity factor so large that ceil(T k / E x factor) overflows an integer drops nothing: the
// capacity is bounded by the tokens, and the run trains as without a capacity.
// The experts' weight gradients left for their first grouped GEMM to write (the default: zero by
// first write) against one fill of the whole buffer (--zero-gradients-by-fill): the same losses and
// parameters, bit for bit, over four micro-batches a step, with experts that get no token (16
// experts, top-1, 4 tokens a micro-batch on each of at most 2 expert-parallel ranks: at least 8 empty
// groups in every micro-batch, whose gradients the step's first call must set to zero), over ep = 2
// and etp = 2 with either dispatcher, and with the experts' GEMMs in FP8.
TEST(TrainingMoe, ZeroByFirstWriteOfExpertGradientsTrainsTheBitsOfTheFill) {
  auto base = tiny_mixtral();
  base.dtype = "float";
  base.train_iters = 3;
  base.eval_iters = 0;
  base.keep_final_parameters = true;
  auto sparse = base;
  sparse.model.moe.num_experts = 16;
  sparse.model.moe.topk = 1;
  sparse.model.seq_length = 4;
  sparse.micro_batch_size = 1;
  sparse.global_batch_size = 4;
  auto fp8 = base;
  fp8.fp8_format = "hybrid";
  fp8.fp8_recipe = "delayed";
  using D = strata::MoeDispatcherType;
  struct Case {
    trainer::TrainArgs args;
    MoeLayout layout;
    std::string what;
  };
  for (const Case& c : {Case{base, MoeLayout{1, 1, 1, 1, 1, false, D::alltoall}, "top-2"},
                        Case{sparse, MoeLayout{1, 1, 1, 1, 1, false, D::alltoall}, "top-1, empty experts"},
                        Case{sparse, MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, "top-1, empty experts"},
                        Case{base, MoeLayout{4, 2, 1, 2, 2, true, D::allgather}, "top-2"},
                        Case{fp8, MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, "FP8 experts"}}) {
    auto a = with_layout(c.args, c.layout);
    const std::string what = c.what + ", " + describe(c.layout);
    a.zero_gradients_by_fill = true;
    const auto filled = trainer::train<Mixtral>(a);
    a.zero_gradients_by_fill = false;
    const auto first_write = trainer::train<Mixtral>(a);
    ASSERT_EQ(first_write.losses.size(), filled.losses.size()) << what;
    EXPECT_EQ(first_write.losses, filled.losses) << what;
    strata_training_test::expect_same_parameters(first_write, filled, what);
  }
}

// Full activation recompute with MoE layers: each recomputed layer routes its tokens again (the same
// input, deterministic kernels, collectives run again on every rank alike) and its router's second
// record of the aux and z losses and the expert-bias load is taken back after the backward. So the
// losses, both router losses and the trained parameters are those of the run without recompute, bit
// for bit, in double: one rank, ep 2 with either dispatcher, tp 2 + SP x ep 2 x etp 2, pp 2 x ep 2
// (1F1B: other micro-batches' forwards between a forward and its backward), capacity dropping at
// ep 2, aux-loss-free balancing (the expert bias, which the load of every forward moves), and FP8
// experts (delayed; the recomputed forward casts with the step's scales); chunks of one and of two
// layers, and the block method (the first layer recomputed, the second keeping its activations). The
// same for selective recompute of the experts' activation (--recompute-modules moe_act) and of the
// whole MoE block (moe: router, exchanges, experts and shared experts run again in the backward), each
// alone and with core_attn. Shared experts run in every case.
TEST(TrainingMoe, RecomputeTrainsTheBitsOfNoRecompute) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 3;
  base.eval_iters = 0;
  base.keep_final_parameters = true;
  base.model.moe.shared_expert_ffn_hidden_size = 32;
  auto dropping = base;
  dropping.model.moe.capacity_factor = 1.0;
  auto bias = base;
  bias.model.moe.expert_bias = true;
  bias.model.moe.load_balancing = strata::MoeLoadBalancing::none;
  bias.model.moe.aux_loss_coeff = 0;
  bias.model.moe.expert_bias_update_rate = 0.05;
  auto fp8 = base;
  fp8.fp8_format = "hybrid";
  fp8.fp8_recipe = "delayed";
  fp8.fp8_amax_history_len = 4;
  fp8.fp8_amax_compute_algo = "max";
  using D = strata::MoeDispatcherType;
  struct Case {
    trainer::TrainArgs args;
    MoeLayout layout;
    std::string what;
  };
  struct Recompute {
    const char* granularity;
    const char* method;
    int layers;
    const char* modules = "";
  };
  for (const Case& c : {Case{base, MoeLayout{1, 1, 1, 1, 1, false, D::alltoall}, "aux and z losses"},
                        Case{base, MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, "aux and z losses"},
                        Case{base, MoeLayout{2, 1, 1, 2, 1, false, D::allgather}, "aux and z losses"},
                        Case{base, MoeLayout{4, 2, 1, 2, 2, true, D::allgather}, "aux and z losses"},
                        Case{base, MoeLayout{4, 1, 2, 2, 1, false, D::alltoall}, "aux and z losses"},
                        Case{dropping, MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, "capacity factor 1"},
                        Case{bias, MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, "expert bias"},
                        Case{fp8, MoeLayout{2, 1, 1, 2, 1, false, D::alltoall}, "FP8 experts"},
                        Case{fp8, MoeLayout{4, 2, 1, 2, 2, true, D::allgather}, "FP8 experts"}}) {
    const auto a = with_layout(c.args, c.layout);
    const auto plain = trainer::train<Mixtral>(a);
    ASSERT_EQ(plain.losses.size(), 3u) << c.what;
    for (const Recompute r : {Recompute{"full", "uniform", 1}, Recompute{"full", "uniform", 2}, Recompute{"full", "block", 1},
                              Recompute{"selective", "uniform", 1, "moe_act"},
                              Recompute{"selective", "uniform", 1, "core_attn moe_act"},
                              Recompute{"selective", "uniform", 1, "moe"}, Recompute{"selective", "uniform", 1, "core_attn moe"}}) {
      if (c.layout.pp > 1 && r.layers > 1) continue;  // a stage holds one layer
      auto recomputed = a;
      recomputed.recompute_granularity = r.granularity;
      recomputed.recompute_method = r.method;
      recomputed.recompute_num_layers = r.layers;
      recomputed.recompute_modules = r.modules;
      const auto run = trainer::train<Mixtral>(recomputed);
      const std::string what = c.what + ", " + describe(c.layout) + ", " + r.granularity + " recompute " + r.method + " " +
                               std::to_string(r.layers) + " " + r.modules;
      EXPECT_EQ(run.losses, plain.losses) << what;
      EXPECT_EQ(run.load_balancing_losses, plain.load_balancing_losses) << what;
      EXPECT_EQ(run.z_losses, plain.z_losses) << what;
      strata_training_test::expect_same_parameters(run, plain, what);
    }
  }
}

// Forced balance draws new random router logits at each forward: a layer recomputed whole would
// route differently, so full recompute with it is refused before the model is built, naming both.
TEST(TrainingMoe, FullRecomputeWithForcedBalanceIsRefused) {
  auto a = tiny_mixtral();
  a.train_iters = 4;
  a.recompute_granularity = "full";
  a.model.moe.force_load_balancing = true;
  try {
    (void)trainer::train<Mixtral>(a);
    FAIL() << "full recompute with forced balance was not refused";
  } catch (const strata::ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("recompute"), std::string::npos) << message;
    EXPECT_NE(message.find("force"), std::string::npos) << message;
  }
}

// Padded to capacity (capacity factor 1, which drops here, and --moe-pad-expert-input-to-capacity):
// expert parallelism, whose all-to-all dispatcher compacts the fixed-size exchange's rows to the real
// ones (their counts on the device: the experts compute no padding row and nothing waits for the
// host), follows the data-parallel run of as many ranks, where each rank routes its own tokens with
// the same capacity (its kept rows sorted packed): every loss within 1e-10 (ep 2 and 4, ep 2 x etp 2;
// the all-gather dispatcher, whose experts compute the padded rows, beside it).
TEST(TrainingMoe, PaddedCapacityExpertParallelRunsFollowDataParallel) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 4;
  base.eval_iters = 0;
  base.model.moe.capacity_factor = 1.0;
  base.model.moe.pad_to_capacity = true;
  using D = strata::MoeDispatcherType;
  for (int world : {2, 4}) {
    const auto reference = trainer::train<Mixtral>(with_layout(base, MoeLayout{world, 1, 1, 1, 1, false, D::alltoall}));
    ASSERT_EQ(reference.losses.size(), 4u);
    std::vector<MoeLayout> layouts{MoeLayout{world, 1, 1, world, 1, false, D::alltoall},
                                   MoeLayout{world, 1, 1, world, 1, false, D::allgather}};
    if (world == 4) layouts.push_back(MoeLayout{4, 1, 1, 2, 2, false, D::alltoall});
    for (const MoeLayout& l : layouts) expect_follows(trainer::train<Mixtral>(with_layout(base, l)), reference, describe(l));
  }
}

// Padded to a capacity of every token (factor E / k = 2 here: a token picks an expert at most once,
// so nothing can drop, and the router runs no drop pass): the fixed-size exchange with no read on the
// host trains the dropless model. ep 2 and 4, ep 2 x etp 2 (and the all-gather dispatcher) follow the
// dropless run of one rank within 1e-10.
TEST(TrainingMoe, PaddedToEveryTokenTrainsTheDroplessModel) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 4;
  base.eval_iters = 0;
  using D = strata::MoeDispatcherType;
  const auto reference = trainer::train<Mixtral>(base);
  ASSERT_EQ(reference.losses.size(), 4u);
  auto padded = base;
  padded.model.moe.capacity_factor = double(base.model.moe.num_experts) / double(base.model.moe.topk);
  padded.model.moe.pad_to_capacity = true;
  for (const MoeLayout& l : {MoeLayout{1, 1, 1, 1, 1, false, D::alltoall}, MoeLayout{2, 1, 1, 2, 1, false, D::alltoall},
                             MoeLayout{4, 1, 1, 4, 1, false, D::alltoall}, MoeLayout{4, 1, 1, 2, 2, false, D::alltoall},
                             MoeLayout{2, 1, 1, 2, 1, false, D::allgather}})
    expect_follows(trainer::train<Mixtral>(with_layout(padded, l)), reference, "padded to every token, " + describe(l));
}

TEST(TrainingMoe, HugeCapacityFactorDropsNothing) {
  auto a = tiny_mixtral();
  a.dtype = "double";
  a.train_iters = 3;
  a.eval_iters = 0;
  const auto reference = trainer::train<Mixtral>(a);
  for (double factor : {1e18, 1e308}) {
    auto b = a;
    b.model.moe.capacity_factor = factor;
    const auto result = trainer::train<Mixtral>(b);
    ASSERT_EQ(result.losses.size(), reference.losses.size());
    for (std::size_t i = 0; i < reference.losses.size(); ++i)
      EXPECT_NEAR(result.losses[i], reference.losses[i], 1e-12 * std::abs(reference.losses[i])) << "factor " << factor;
  }
  EXPECT_EQ(strata::moe_expert_capacity(64, 2, 4, 1e308), 64);
  EXPECT_EQ(strata::moe_expert_capacity(64, 2, 4, 1.0), 32);
}

// The memory estimate counts the experts' padded capacity (--moe-pad-expert-input-to-capacity):
// more than without padding, bounded by the tokens however large the factor.
TEST(TrainingMoe, MemoryEstimateCountsPaddedCapacity) {
  auto a = tiny_mixtral();
  a.model.moe.capacity_factor = 1000;
  const auto unpadded = trainer::plan_memory<float>(a).per_rank.activation_bytes;
  a.model.moe.pad_to_capacity = true;
  const auto padded = trainer::plan_memory<float>(a).per_rank.activation_bytes;
  // tokens 64 of a micro-batch: 4 experts x 64 padded rows instead of 64 x 2 routed rows, per layer
  // (its input, fc1's output and the activation, the experts' output the dispatcher keeps), and as
  // many again in the one layer's backward the estimate counts on top
  const std::int64_t row_bytes = (2 * 64 + 3 * a.model.expert_ffn()) * 4;
  EXPECT_EQ(padded - unpadded, (2 + 1) * (4 * 64 - 64 * 2) * row_bytes);
  a.model.moe.capacity_factor = 1e18;
  EXPECT_EQ(trainer::plan_memory<float>(a).per_rank.activation_bytes, padded);
  // a padded run that cannot fit is refused naming the factor
  auto plan = trainer::plan_memory<float>(a);
  plan.available = plan.total - 1;
  try {
    trainer::check_fits(plan, "float");
    ADD_FAILURE() << "a run beyond the memory available was accepted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-expert-capacity-factor"), std::string::npos) << e.what();
  }
}

// --moe-layer-freq with dense first layers (DeepSeek-V3's shape): dense layers run an MLP of
// --ffn-hidden-size, the MoE layers experts of --moe-ffn-hidden-size. Every layout follows one
// rank in double: tp 2 (sequence parallel), ep 2, pp 2 (a stage of a dense and a MoE layer, and with
// [0,0,1,1] a stage without any expert, whose experts' share of the gradient norm is 0), dp 2, and
// tp 2 x ep 2 x pp 2, with and without the distributed optimizer; the router losses are divided by
// the MoE layers alone.
TEST(TrainingMoe, DenseFirstLayersFollowSingleRankTrajectory) {
  auto base = tiny_mixtral();
  base.dtype = "double";
  base.train_iters = 3;
  base.eval_iters = 0;
  base.model.num_layers = 4;
  base.model.moe.expert_ffn_hidden_size = 48;
  base.model.moe.shared_expert_ffn_hidden_size = 32;
  base.model.moe.token_dispatcher = strata::MoeDispatcherType::alltoall;
  struct Layout {
    std::vector<int> pattern;
    int world, tp, pp, ep;
    bool sp;
    bool distributed = false;  // --use-distributed-optimizer
  };
  std::map<std::vector<int>, trainer::TrainResult> references;
  for (const Layout& l : {Layout{{0, 1, 1, 1}, 2, 2, 1, 1, true}, Layout{{0, 1, 1, 1}, 2, 1, 1, 2, false},
                          Layout{{0, 1, 1, 1}, 2, 1, 2, 1, false}, Layout{{0, 1, 1, 1}, 2, 1, 1, 1, false},
                          Layout{{0, 1, 1, 1}, 8, 2, 2, 2, true, true}, Layout{{0, 0, 1, 1}, 4, 1, 2, 2, false},
                          Layout{{0, 0, 1, 1}, 4, 1, 2, 2, false, true}}) {
    auto a = base;
    a.model.moe.layers = l.pattern;
    if (!references.contains(l.pattern)) {
      references[l.pattern] = trainer::train<Mixtral>(a);
      ASSERT_EQ(references[l.pattern].losses.size(), 3u);
    }
    const auto& reference = references[l.pattern];
    a.world_size = l.world;
    a.tensor_model_parallel_size = l.tp;
    a.pipeline.pipeline_model_parallel_size = l.pp;
    a.expert_model_parallel_size = l.ep;
    a.expert_tensor_parallel_size = 1;
    a.sequence_parallel = l.sp;
    a.use_distributed_optimizer = l.distributed;
    std::string what = "pattern";
    for (int x : l.pattern) what += std::to_string(x);
    what += " world=" + std::to_string(l.world) + " tp=" + std::to_string(l.tp) + " pp=" + std::to_string(l.pp) +
            " ep=" + std::to_string(l.ep) + (l.sp ? " sp" : "") + (l.distributed ? " distributed optimizer" : "");
    const auto run = trainer::train<Mixtral>(a);
    expect_follows(run, reference, what);
    // Megatron's balance: summed over the MoE layers, divided by them; near 1 for a fresh router
    EXPECT_GT(run.load_balancing_losses[0], 0.5) << what;
    EXPECT_LT(run.load_balancing_losses[0], 2.0) << what;
  }
  // the dense layers are dense: the pattern changes the trajectory
  auto every = base;
  const std::vector<int> first_dense{0, 1, 1, 1};
  EXPECT_NE(trainer::train<Mixtral>(every).losses[2], references[first_dense].losses[2]);
}

// The parameters of each pipeline stage of a mixed model are what its layers allocate: a dense
// layer's MLP of ffn_hidden_size, named as a dense model's; a MoE layer's router and experts.
TEST(TrainingMoe, MemoryEstimateCountsEachStagesLayerKinds) {
  using Context = strata::ParallelContext<strata::inprocess::communicator>;
  auto a = tiny_mixtral();
  a.model.num_layers = 4;
  a.model.moe.layers = {0, 1, 0, 1};
  a.model.moe.shared_expert_ffn_hidden_size = 32;
  a.model.moe.expert_ffn_hidden_size = 48;
  const strata::ParallelConfig config{.tp = 2, .pp = 2, .dp = 1, .ep = 1, .etp = 1};
  std::vector<std::int64_t> counted(4), expected(4);
  std::vector<std::vector<std::string>> names(4);
  strata::inprocess::run(4, [&](strata::inprocess::communicator& world) {
    Context ctx = Context::create(world, config);
    const auto stage = strata::pipeline::stage_layers_of(a.model.num_layers, 2, 1, ctx.pp.rank(), 0);
    Mixtral<trainer::TrainPolicy<float, false>> model(ctx, a.model, stage);
    std::int64_t n = 0;
    std::vector<std::string> mine;
    model.for_each_parameter([&](auto& p) {
      n += p.value.numel();
      mine.push_back(p.name);
    });
    strata::models::ModelPiece piece{stage.layers.end - stage.layers.begin, stage.has_embedding, stage.has_head};
    piece.first_layer = stage.layers.begin;
    const auto r = static_cast<std::size_t>(world.rank());
    counted[r] = n;
    expected[r] = strata::models::parameters_per_rank(a.model, strata::models::DecoderShape::llama(), 2, piece);
    names[r] = mine;
    EXPECT_EQ(model.routers().size(), 1u) << "one MoE layer per stage";
  });
  for (std::size_t r = 0; r < 4; ++r) EXPECT_EQ(counted[r], expected[r]) << "rank " << r;
  auto has = [&](std::size_t rank, const std::string& name) {
    return std::find(names[rank].begin(), names[rank].end(), name) != names[rank].end();
  };
  EXPECT_TRUE(has(0, "layers.0.mlp.fc1.weight"));
  EXPECT_TRUE(has(0, "layers.1.mlp.router.weight"));
  EXPECT_TRUE(has(0, "layers.1.mlp.experts.0.fc1.weight"));
  EXPECT_FALSE(has(0, "layers.0.mlp.router.weight"));
  EXPECT_TRUE(has(3, "layers.2.mlp.fc2.weight"));
  EXPECT_TRUE(has(3, "layers.3.mlp.shared_experts.fc1.weight"));
}

// A checkpoint records which layers are MoE layers: it resumes with the same --moe-layer-freq and
// is refused, naming the flag, with another.
TEST(TrainingMoe, CheckpointKeepsTheLayerPattern) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_moe_pattern";
  std::filesystem::remove_all(dir);
  auto a = tiny_mixtral();
  a.model.num_layers = 3;
  a.model.moe.layers = {0, 1, 1};
  a.train_iters = 4;
  a.eval_iters = 0;
  a.world_size = 2;
  a.expert_model_parallel_size = 2;
  const auto straight = trainer::train<Mixtral>(a);
  auto first = a;
  first.save = dir.string();
  first.save_interval = 2;
  ASSERT_EQ(trainer::train<Mixtral>(first).losses, straight.losses);
  rewind_checkpoint(dir, 2, 4);
  auto resumed = a;
  resumed.load = dir.string();
  const auto second = trainer::train<Mixtral>(resumed);
  ASSERT_EQ(second.losses.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(second.losses[i], straight.losses[2 + i]) << "iteration " << 3 + i;
  auto other = resumed;
  other.model.moe.layers = {1, 0, 1};
  try {
    (void)trainer::train<Mixtral>(other);
    ADD_FAILURE() << "a checkpoint of another layer pattern was loaded";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-layer-freq"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("011"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The activations of a MoE layer replace the dense MLP's intermediate (8 h / tp per token) with
// the router's logits, the experts' rows (tokens x topk, or the padded capacity) and the shared
// experts' intermediate; a dense layer of the same model counts as a dense model's layer.
TEST(TrainingMoe, MemoryEstimateCountsEachLayerKindsActivations) {
  namespace mm = strata::models;
  auto a = tiny_mixtral();
  a.model.num_layers = 4;
  a.model.moe.expert_ffn_hidden_size = 48;
  a.model.moe.shared_expert_ffn_hidden_size = 32;
  const auto bytes = mm::element_bytes_of<float>();
  const std::int64_t s = 32, b = 2, h = 64, E = 4, k = 2, w = 48, ws = 32;
  for (int tp : {1, 2}) {
    for (bool sp : {false, true}) {
      if (sp && tp == 1) continue;
      mm::ModelConfig dense = a.model;
      dense.moe = {};
      mm::ModelConfig all = a.model;
      mm::ModelConfig mixed = a.model;
      mixed.moe.layers = {0, 0, 1, 1};
      const mm::ModelPiece body{4, false, false, 1, 1};
      const auto d = mm::activations_of(dense, tp, sp, b, bytes, 0, body).kept;
      const auto m = mm::activations_of(all, tp, sp, b, bytes, 0, body).kept;
      const auto x = mm::activations_of(mixed, tp, sp, b, bytes, 0, body).kept;
      const std::int64_t routed = s * b / tp;
      // the router's input and logits, the choices, slots (int32) and weights, per row its input, fc1's
      // output, the activation and the experts' output; the shared experts' input and intermediate
      const std::int64_t moe_layer = routed * k * (2 * h + 3 * w) * 4 + routed * h * 4 + routed * E * 4 + routed * k * 12 +
                                     s * b * (h + 3 * ws / tp) * 4;
      // a dense (GELU, as activations_of counts without gated_mlp) MLP's input and intermediate
      const std::int64_t dense_intermediate = s * b * (h + 2 * a.model.ffn() / tp) * 4;
      EXPECT_EQ(m - d, 4 * (moe_layer - dense_intermediate)) << "tp=" << tp << (sp ? " sp" : "");
      EXPECT_EQ(x - d, 2 * (moe_layer - dense_intermediate)) << "tp=" << tp << (sp ? " sp" : "");
      // each pipeline piece counts its own layers' kinds
      mm::ModelPiece first{2, true, false, 1, 1}, last{2, false, true, 1, 1};
      last.first_layer = 2;
      EXPECT_EQ(mm::activations_of(mixed, tp, sp, b, bytes, 0, first).kept, mm::activations_of(dense, tp, sp, b, bytes, 0, first).kept);
      EXPECT_EQ(mm::activations_of(mixed, tp, sp, b, bytes, 0, last).kept - mm::activations_of(dense, tp, sp, b, bytes, 0, last).kept,
                2 * (moe_layer - dense_intermediate));
    }
  }
  // with padding every expert holds its capacity: ceil(tokens x k / E x factor) rows each
  auto padded = a.model;
  padded.moe.capacity_factor = 1.5;
  padded.moe.pad_to_capacity = true;
  const mm::ModelPiece one{1, false, false, 1, 1};
  const auto unpadded_bytes = mm::activations_of(a.model, 1, false, b, bytes, 0, one).kept;
  const auto padded_bytes = mm::activations_of(padded, 1, false, b, bytes, 0, one).kept;
  const std::int64_t capacity = (s * b * k * 3 + 2 * E - 1) / (2 * E);  // ceil(64 x 2 / 4 x 1.5) = 48
  EXPECT_EQ(capacity, 48);
  EXPECT_EQ(padded_bytes - unpadded_bytes, (E * capacity - s * b * k) * (2 * h + 3 * w) * 4);
}

// --save-hf and --load-hf with experts (MixtralForCausalLM): the trained model exported from one
// rank and from tp 2 x ep 2 (gathered from the model) or pp 2 x ep 2 (from the final checkpoint)
// holds the same weights (1e-10: the runs follow one trajectory); a run started from the files
// and trained with a zero learning rate exports them again unchanged; strata-convert's export of
// the checkpoint writes the trainer's files.
TEST(TrainingMoe, HuggingFaceExportAndImportAtEveryLayout) {
  const auto root = std::filesystem::temp_directory_path() / "strata_training_moe_hf";
  std::filesystem::remove_all(root);
  auto a = tiny_mixtral();
  a.dtype = "double";
  a.train_iters = 3;
  a.eval_iters = 0;
  a.model.moe.token_dispatcher = strata::MoeDispatcherType::alltoall;
  auto one = a;
  one.save_hf = (root / "one").string();
  (void)trainer::train<Mixtral>(one);
  auto spread = a;
  spread.world_size = 4;
  spread.tensor_model_parallel_size = 2;
  spread.expert_model_parallel_size = 2;
  spread.expert_tensor_parallel_size = 1;
  spread.sequence_parallel = true;
  spread.save_hf = (root / "spread").string();
  (void)trainer::train<Mixtral>(spread);
  auto staged = a;
  staged.world_size = 4;
  staged.pipeline.pipeline_model_parallel_size = 2;
  staged.expert_model_parallel_size = 2;
  staged.save = (root / "checkpoint").string();
  staged.save_interval = 3;
  staged.save_hf = (root / "staged").string();
  (void)trainer::train<Mixtral>(staged);
  const strata::SafetensorsDirectory reference(root / "one");
  auto values = [](const strata::SafetensorsDirectory& files, const std::string& name) {
    std::vector<double> v(static_cast<std::size_t>(files.entry(name).numel));
    files.read<double>(name, std::span<double>(v));
    return v;
  };
  auto expect_close = [&](const std::filesystem::path& dir) {
    const strata::SafetensorsDirectory files(dir);
    ASSERT_EQ(files.names(), reference.names()) << dir;
    for (const std::string& name : reference.names()) {
      const auto x = values(reference, name), y = values(files, name);
      ASSERT_EQ(x.size(), y.size()) << name;
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < x.size(); ++i) diff += (x[i] - y[i]) * (x[i] - y[i]), norm += x[i] * x[i];
      EXPECT_LE(std::sqrt(diff), 1e-10 * std::sqrt(norm)) << dir << " " << name;
    }
  };
  expect_close(root / "spread");
  expect_close(root / "staged");
  // strata-convert --save-hf's path: the model a checkpoint describes, exported from it
  {
    strata::ShardedCheckpoint source = strata::open_sharded_checkpoint(root / "checkpoint", strata::LoadOptions{});
    const auto [architecture, config] = strata::checkpoint_model(source);
    EXPECT_EQ(architecture, strata::hf::Architecture::mixtral);
    EXPECT_EQ(config.moe.num_experts, 4);
    EXPECT_EQ(config.moe.topk, 2);
    EXPECT_EQ(config.expert_ffn(), a.model.expert_ffn());
    strata::export_hf_from_checkpoint<double>(source, architecture, config, root / "converted");
    std::ifstream x(root / "staged" / "model.safetensors", std::ios::binary), y(root / "converted" / "model.safetensors", std::ios::binary);
    const std::string staged_bytes{std::istreambuf_iterator<char>(x), {}}, converted_bytes{std::istreambuf_iterator<char>(y), {}};
    EXPECT_FALSE(staged_bytes.empty());
    EXPECT_EQ(converted_bytes, staged_bytes);
  }
  EXPECT_TRUE(reference.has("model.layers.1.block_sparse_moe.experts.3.w2.weight"));

  auto again = a;
  again.world_size = 2;
  again.expert_model_parallel_size = 2;
  again.load_hf = (root / "one").string();
  again.save_hf = (root / "again").string();
  again.lr = 0;
  again.min_lr = 0;
  again.train_iters = 1;
  again.lr_warmup_iters = 0;
  (void)trainer::train<Mixtral>(again);
  const strata::SafetensorsDirectory back(root / "again");
  for (const std::string& name : reference.names()) EXPECT_EQ(values(back, name), values(reference, name)) << name;
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace test_training_moe_cases
