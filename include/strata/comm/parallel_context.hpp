// strata/comm/parallel_context.hpp: `ParallelContext<Comm>`, this rank's place in a parallel
// configuration: one communicator per group and the rank's coordinates.
//
// Built collectively from a ParallelConfig and the world communicator: every group is carved out
// with split(color = group index, key = position in group) following the rank generator's order
// (Megatron's default tp-cp-ep-dp-pp, leftmost fastest), so the groups are exactly Megatron's.
// The configuration is checked against the world size before any communicator is created.
#pragma once

#include <string>
#include <string_view>

#include "../shard/parallel_config.hpp"
#include "../shard/rank_generator.hpp"
#include "communicator.hpp"

STRATA_NAMESPACE_BEGIN

template <class Comm>
struct ParallelContext {
  static_assert(is_communicator_v<Comm>,
                "ParallelContext<Comm>: Comm does not model strata::Communicator (see strata/comm/communicator.hpp).");
  using communicator_type = Comm;

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

  // Collective over `world`: every rank must call it with the same config.
  static ParallelContext create(Comm world, const ParallelConfig& config, std::string_view order = "tp-cp-ep-dp-pp") {
    check(config, world.size());
    const RankGenerator generator(config, order);
    const int rank = world.rank();
    auto make = [&](std::string_view axes) {
      return world.split(generator.group_index_of(rank, axes), generator.position_in_group(rank, axes), std::string(axes));
    };
    ParallelContext ctx{config, generator.coordinates(rank), world, make("tp"), make("cp"), make("dp"),
                        make("pp"), make("ep"), make("dp-cp"), make("tp-pp")};
    return ctx;
  }

  // A context for one rank that runs everything itself (tp = pp = dp = cp = ep = 1).
  static ParallelContext single(Comm world) { return create(std::move(world), ParallelConfig{}); }
};

STRATA_NAMESPACE_END
