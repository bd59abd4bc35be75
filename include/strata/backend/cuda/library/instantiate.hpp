// strata/backend/cuda/library/instantiate.hpp: what the sources of strata::cuda_kernels share: the
// element types every launcher is compiled for (float, double, bf16, fp16) and the accumulate types
// (float, double). Each source includes the .cuh definitions of a few kernel families and
// instantiates their launchers (kernels/launchers.hpp) for these types, once; code built with the
// host compiler then links them. A launcher a build needs but no source instantiates is a link
// error naming it: add it to the source of its family.
#pragma once

#ifndef STRATA_CUDA_KERNELS_LIBRARY
#define STRATA_CUDA_KERNELS_LIBRARY 1
#endif
#if !STRATA_CUDA_KERNELS_LIBRARY
#error "the sources of strata::cuda_kernels are compiled with STRATA_CUDA_KERNELS_LIBRARY=1"
#endif

#include "../../../core/dtype.hpp"

// X(T) for each element type, and for each accumulate type.
#define STRATA_CUDA_FOR_EACH_ELEMENT(X) X(float) X(double) X(::strata::bf16) X(::strata::fp16)
#define STRATA_CUDA_FOR_EACH_ACCUMULATE(X) X(float) X(double)

