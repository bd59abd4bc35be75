// strata/shard.hpp: constexpr sharding arithmetic (parallel layout and its validation, rank
// <-> coordinate mapping and process groups, partitions, pipeline layer split, vocab padding).
#pragma once

#include "shard/problem.hpp"
#include "shard/partition.hpp"
#include "shard/context_parallel.hpp"
#include "shard/parallel_config.hpp"
#include "shard/rank_generator.hpp"
#include "shard/shard_spec.hpp"
