// strata/strata.hpp: everything that runs without a GPU: core, sharding arithmetic, the in-process
// communicator, the CPU backend, layers, models, optimizer, checkpoints and data. CUDA and NCCL
// headers are opt-in (strata/backend/cuda/..., strata/comm/nccl...).
#pragma once

#include "core.hpp"
#include "shard.hpp"
#include "comm.hpp"
#include "comm/parallel_context.hpp"
#include "backend/cpu.hpp"
#include "policy.hpp"
#include "layers.hpp"
#include "models.hpp"
#include "data.hpp"
