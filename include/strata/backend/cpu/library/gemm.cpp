// The CPU backend's Eigen GEMM, compiled once into strata::cpu_kernels (CMakeLists.txt): code that
// links the library sees only the declarations of gemm.hpp (STRATA_CPU_KERNELS_LIBRARY=1). This unit
// compiles the portable variant; gemm_native.cpp includes it again for the -march=native one.
#include "../gemm.hpp"
#include "../gemm_eigen.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu::detail {

template void gemm_native<float>(bool, bool, index_t, index_t, index_t, const float*, const float*, float*, bool, float);
template void gemm_native<double>(bool, bool, index_t, index_t, index_t, const double*, const double*, double*, bool,
                                  double);

}  // namespace cpu::detail
STRATA_NAMESPACE_END
