// strata/pipeline/stage.hpp: what one pipeline stage (one model chunk of one rank) holds:
// `StageLayers`, a contiguous range of the model's transformer layers and whether the stage also
// holds the input embedding (the first virtual stage) and the head (final norm, output layer and
// loss: the last virtual stage).
//
// With pp ranks and v chunks per rank the model is cut into S = pp v virtual stages; chunk c of
// rank r is virtual stage c pp + r (action.hpp). The layers split as shard/partition.hpp's
// stage_layers splits them over S pieces: evenly by default, or with Megatron's
// --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers fixing the first and
// last pieces and the rest split evenly; a split that leaves a piece empty or does not add up is a
// ConfigError naming the numbers.
#pragma once

#include "../shard/partition.hpp"
#include "action.hpp"

STRATA_NAMESPACE_BEGIN
namespace pipeline {

struct StageLayers {
  Range layers{};              // the global indices of the transformer layers held
  bool has_embedding = true;   // the first virtual stage: embedding (and learned positions)
  bool has_head = true;        // the last virtual stage: final norm, output layer, loss
  int virtual_stage = 0;
  int virtual_stages_total = 1;  // S = pp * chunks per rank

  // The whole model on one stage.
  static constexpr StageLayers whole(int num_layers) { return {{0, num_layers}, true, true, 0, 1}; }
};

// The layers chunk `chunk` of pipeline rank `rank` holds. first_stage_layers / last_stage_layers:
// -1 splits evenly.
constexpr StageLayers stage_layers_of(int num_layers, int pp, int virtual_stages, int rank, int chunk,
                                      int first_stage_layers = -1, int last_stage_layers = -1) {
  if (pp < 1 || virtual_stages < 1)
    raise_if(Problem::sentence("pp=", pp, " and virtual_stages=", virtual_stages, " must both be at least 1."));
  if (rank < 0 || rank >= pp || chunk < 0 || chunk >= virtual_stages)
    raise_if(Problem::sentence("rank=", rank, " chunk=", chunk, " is outside a pipeline of pp=", pp, " ranks with ",
                               virtual_stages, " chunks each."));
  const int total = pp * virtual_stages;
  const Problem split = ::strata::detail::stage_split_problem(num_layers, total, first_stage_layers, last_stage_layers);
  if (!split.ok()) {
    if (virtual_stages == 1) raise_if(split);
    raise_if(Problem::sentence("with virtual_stages=", virtual_stages, " the model is cut into pp x virtual_stages = ", total,
                               " pieces (the pp below): ", split.message()));
  }
  const int vs = virtual_stage(pp, rank, chunk);
  return {stage_layers(num_layers, total, vs, first_stage_layers, last_stage_layers), vs == 0, vs == total - 1, vs, total};
}

}  // namespace pipeline
STRATA_NAMESPACE_END
