// strata/backend/cpu.hpp: the CPU compute backend (Eigen GEMM and plain-loop kernels).
#pragma once

#include "cpu/gemm.hpp"
#include "cpu/norm.hpp"
#include "cpu/activation.hpp"
#include "cpu/attention.hpp"
#include "cpu/backend.hpp"
