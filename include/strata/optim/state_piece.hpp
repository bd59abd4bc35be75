// strata/optim/state_piece.hpp: `StatePiece`, how an optimizer describes its state to
// checkpoints that reshard (checkpoint/checkpoint.hpp): which elements of which parameter's shard
// each stretch of its state tensors belongs to.
#pragma once

#include <string>

#include "../core/shape.hpp"
#include "../shard/shard_spec.hpp"

STRATA_NAMESPACE_BEGIN

// A piece of an optimizer's state, for checkpoints that reshard: the state tensors' elements
// [offset, offset + count) hold the state of elements [flat_begin, flat_begin + count) of parameter
// `name`'s local shard (global shape and ShardSpec as the parameter's). The state is stored as
// "<name>.main", "<name>.exp_avg", "<name>.exp_avg_sq".
struct StatePiece {
  std::string name;
  Shape global_shape;
  ShardSpec shard;
  index_t flat_begin = 0;
  index_t count = 0;
  index_t offset = 0;
  bool data_parallel_replica = true;  // every data-parallel rank holds the same piece (AdamW), not its own share
  bool pipeline_copy = false;         // a tied weight's copy on another pipeline stage: the original is saved
  bool expert = false;                // an expert's weight (Parameter::expert): replicated over expert dp, split over etp
};

STRATA_NAMESPACE_END
