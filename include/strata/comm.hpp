// strata/comm.hpp: the communication module (the Communicator concept and the in-process backend).
#pragma once

#include "comm/communicator.hpp"
#include "comm/inprocess.hpp"
