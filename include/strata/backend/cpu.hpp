// strata/backend/cpu.hpp: the CPU compute backend (Eigen GEMM and plain-loop kernels, one family
// per header) and `cpu::backend`, which forwards the Backend concept's entry points to them.
#pragma once

#include "cpu/elementwise.hpp"
#include "cpu/gemm.hpp"
#include "cpu/norm.hpp"
#include "cpu/activation.hpp"
#include "cpu/rope.hpp"
#include "cpu/attention.hpp"
#include "cpu/embedding.hpp"
#include "cpu/cross_entropy.hpp"
#include "cpu/dropout.hpp"
#include "cpu/init.hpp"
#include "cpu/adamw.hpp"
#include "cpu/reduce.hpp"
#include "cpu/backend.hpp"
