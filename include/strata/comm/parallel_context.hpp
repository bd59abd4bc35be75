// strata/comm/parallel_context.hpp: `ParallelContext<Comm, Device>`, this rank's place in a parallel
// configuration: one communicator per group, the rank's coordinates, and the rank's compute
// backend object (`device`, Comm::default_device unless given: cpu::backend for the in-process
// communicator). Layers reach kernels only through `ctx.device`.
//
// Built collectively from a ParallelConfig and the world communicator: every group is carved out
// with split(color = group index, key = position in group) following the rank generator's order
// (Megatron's default tp-cp-ep-dp-pp, leftmost fastest), so the groups are exactly Megatron's.
// The configuration is checked against the world size before any communicator is created.
//
// Dense layers use tp, cp, dp, pp and their products. Expert (mixture-of-experts) layers regroup
// the ranks of one pipeline stage with Megatron's second, expert rank generator (tp = etp, cp = 1,
// ep, dp = expert_dp, pp, in the same order string): expert_tp (etp), ep, expert_dp (edp),
// expert_tp_ep (the ranks that exchange tokens, Megatron's expert tensor-and-model-parallel group)
// and expert_model_parallel (etp x ep x pp: expert gradient norms). The router's token counts are
// summed over tp_cp (the ranks that split one sequence) and the expert-bias load over tp_cp_dp
// (every rank of a stage).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "../core/error.hpp"
#include "../core/fp8_recipe.hpp"
#include "../shard/parallel_config.hpp"
#include "../shard/rank_generator.hpp"
#include "../backend/backend.hpp"
#include "communicator.hpp"

STRATA_NAMESPACE_BEGIN

// How attention exchanges keys and values over the context-parallel group (Megatron's
// --cp-comm-type; layers/context_parallel_attention.hpp): p2p is ring attention, allgather every
// rank's keys and values at once, a2a (Ulysses) all-to-all to whole sequences of heads / cp heads,
// a2a+p2p all-to-all inside groups of adjacent cp ranks and a ring across them
// (ParallelContext::split_context_parallel).
enum class ContextParallelComm { p2p, a2a, allgather, a2a_p2p };

inline const char* context_parallel_comm_name(ContextParallelComm c) {
  switch (c) {
    case ContextParallelComm::p2p: return "p2p";
    case ContextParallelComm::a2a: return "a2a";
    case ContextParallelComm::allgather: return "allgather";
    case ContextParallelComm::a2a_p2p: return "a2a+p2p";
  }
  return "?";
}

template <class Comm, class Device = typename Comm::default_device>
struct ParallelContext {
  static_assert(is_communicator_v<Comm>,
                "ParallelContext<Comm>: Comm does not model strata::Communicator (see strata/comm/communicator.hpp).");
  static_assert(check_backend<Device>());
  static_assert(std::is_same_v<typename Comm::space, typename Device::space>,
                "ParallelContext<Comm, Device>: the communicator and the backend work in different memory spaces; "
                "pair the in-process communicator with cpu::backend and the NCCL one with cuda::backend.");
  using communicator_type = Comm;
  using device_type = Device;
  using space = typename Device::space;

  ParallelConfig config{};
  Coordinates coords{};
  Comm world;
  Comm tp;              // tensor parallel
  Comm cp;              // context parallel
  Comm dp;              // data parallel
  Comm pp;              // pipeline parallel
  Comm ep;              // expert parallel
  Comm dp_cp;           // data x context parallel (gradient all-reduce when cp > 1)
  Comm model_parallel;  // tensor x pipeline parallel (gradient norm, found-inf)
  Comm tp_cp;           // tensor x context parallel (the ranks that split one sequence)
  Comm tp_cp_dp;        // tensor x context x data parallel (every rank of a pipeline stage)
  Comm expert_tp;              // expert tensor parallel (etp): the ranks that split each expert's MLP
  Comm expert_dp;              // expert data parallel (edp): replicas of the same expert shards
  Comm expert_tp_ep;           // expert tensor x expert parallel: the ranks that exchange tokens
  Comm expert_model_parallel;  // expert tensor x expert x pipeline parallel (expert gradient norms)
  ExpertCoordinates expert_coords{};  // this rank's {etp, ep, edp, pp}
  Device device;        // this rank's compute backend
  // Tensor-parallel communication beside computation (Megatron's --tp-comm-overlap), for layers
  // under sequence parallelism over tp > 1 on a communicator that overlaps (NCCL): the
  // column-parallel layers gather their input as a ring of exchanges while each arrived block's
  // GEMM runs, and the backward runs each collective beside weight gradients that do not depend on
  // it (ColumnParallelLinear, RowParallelLinear, TransformerLayer). Off: every collective runs on
  // the compute stream where its result is needed. The results are the same either way, to the
  // rounding of GEMMs run on blocks of rows instead of all of them.
  bool tp_comm_overlap = false;
  // With tp_comm_overlap, which forward collectives run as rings beside the GEMMs (Megatron's
  // --disable-tp-comm-overlap-ag / -rs turn them off): the column-parallel layers' all-gather of
  // their input (ag) and the row-parallel layers' reduce-scatter of their output (rs). Off, that
  // collective runs whole on the compute stream; the backward's overlap stays either way.
  bool tp_comm_overlap_ag = true;
  bool tp_comm_overlap_rs = true;
  // With tp_comm_overlap, how an all-gather beside GEMMs (the column layers' forward, the row
  // layers' first backward gather) moves the blocks: `ring`, tp - 1 point-to-point exchanges, each
  // arrived block's GEMM beside the next exchange; `collective`, one all-gather on the
  // communication stream with this rank's own block's GEMM beside it and the other blocks' after it
  // (NCCL's collective kernel and channels instead of its point-to-point ones; on two ranks the same
  // blocks in the same order, so the same bits); `copy_engines`, as collective, with every all-gather
  // of the overlapped handle moved by the GPUs' copy engines instead of a kernel, so no SM is taken
  // from the GEMMs beside it (the trainer calls use_copy_engines_for_overlapped_gathers on the tp
  // group; NCCL 2.28 and symmetric memory; a communicator without copy engines runs it as
  // collective). The same bits as collective.
  enum class OverlapGather { ring, collective, copy_engines };
  OverlapGather tp_comm_overlap_gather = OverlapGather::ring;
  // With cp > 1, how attention moves keys and values over the cp group (see ContextParallelComm).
  ContextParallelComm cp_comm_type = ContextParallelComm::p2p;
  // a2a+p2p's two levels of the cp group (split_context_parallel): the groups of adjacent cp ranks
  // that exchange heads all-to-all, and the ring over the ranks at one place in them. Empty until
  // split.
  std::optional<Comm> cp_a2a{}, cp_p2p{};
  // FP8 training (core/fp8_recipe.hpp): null runs every GEMM in the element type. Set before the
  // model is built: the linear layers of the transformer layers built under it keep a scaling state
  // here and run their three GEMMs in FP8 (layers/fp8_linear.hpp). One per rank.
  std::shared_ptr<Fp8Scaling<space>> fp8{};

  // Collective over `world`: every rank must call it with the same config.
  static ParallelContext create(Comm world, const ParallelConfig& config, Device device = {},
                                std::string_view order = "tp-cp-ep-dp-pp") {
    check(config, world.size());
    const RankGenerator generator(config, order);
    const int rank = world.rank();
    auto make = [&](std::string_view axes) {
      return world.split(generator.group_index_of(rank, axes), generator.position_in_group(rank, axes), std::string(axes));
    };
    ParallelContext ctx{config,         generator.coordinates(rank), world,         make("tp"),
                        make("cp"),     make("dp"),                  make("pp"),    make("ep"),
                        make("dp-cp"),  make("tp-pp"),               make("tp-cp"), make("tp-cp-dp"),
                        make("etp"),    make("edp"),                 make("etp-ep"), make("etp-ep-pp"),
                        generator.expert_coordinates(rank),          std::move(device)};
    return ctx;
  }

  // Megatron's --hierarchical-context-parallel-sizes a b (a x b = cp) for --cp-comm-type a2a+p2p:
  // cp rank r joins all-to-all group r / a at place r % a (cp_a2a, a adjacent cp ranks) and ring
  // r % a at place r / a (cp_p2p, b ranks). Collective over cp: every cp rank calls it with the
  // same size. A size that does not divide cp is a ConfigError naming both numbers.
  void split_context_parallel(int a2a_size) {
    const int size = cp.size(), r = cp.rank();
    if (a2a_size < 1 || size % a2a_size != 0)
      fail<ConfigError>("hierarchical context parallelism: an all-to-all group of ", a2a_size,
                        " ranks does not divide --context-parallel-size ", size,
                        "; give --hierarchical-context-parallel-sizes whose product is the cp size");
    cp_a2a = cp.split(r / a2a_size, r % a2a_size, "cp-a2a");
    cp_p2p = cp.split(r % a2a_size, r / a2a_size, "cp-p2p");
  }

  // A context for one rank that runs everything itself (tp = pp = dp = cp = ep = 1).
  static ParallelContext single(Comm world, Device device = {}) {
    return create(std::move(world), ParallelConfig{}, std::move(device));
  }
};

STRATA_NAMESPACE_END
