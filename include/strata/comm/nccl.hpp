// strata/comm/nccl.hpp: the NCCL communicator (opt-in: needs the CUDA runtime and NCCL; link
// strata::nccl). `nccl::communicator` models the Communicator concept on device memory; the
// launchers start ranks from torchrun / Slurm / Open MPI variables or as threads, one per GPU.
#pragma once

#include "nccl/types.hpp"
#include "nccl/watchdog.hpp"
#include "nccl/communicator.hpp"
#include "nccl/launch.hpp"
