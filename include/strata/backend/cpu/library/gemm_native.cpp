// The -march=native variant of the CPU backend's GEMM (gemm.hpp: cpu::detail::native), for code
// compiled with strata_native_arch. CMakeLists.txt compiles this unit with -march=native and
// STRATA_CPU_GEMM_NATIVE=1 when STRATA_NATIVE_ARCH is on.
#if !defined(STRATA_CPU_GEMM_NATIVE) || !STRATA_CPU_GEMM_NATIVE
#error "gemm_native.cpp is the -march=native variant: compile it with -DSTRATA_CPU_GEMM_NATIVE=1 -march=native"
#endif
#include "gemm.cpp"
