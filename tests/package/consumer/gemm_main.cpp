// Links the installed strata::cpu_kernels (the CPU backend's GEMM compiled once): the program sees
// only the GEMM's declaration, so an install without the library's archive or its definitions fails
// at the link, and a wrong product fails the run.
#include <strata/backend/cpu.hpp>

#include <cstdio>

#ifndef STRATA_CPU_KERNELS_LIBRARY
#error "strata::cpu_kernels did not define STRATA_CPU_KERNELS_LIBRARY"
#endif

int main() {
  // [2,3] x [3,2] in float and double against the product worked out by hand.
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const float b[6] = {7, 8, 9, 10, 11, 12};
  float c[4] = {};
  strata::cpu::gemm<float>(false, false, 2, 2, 3, a, b, c, false);
  const double ad[6] = {1, 2, 3, 4, 5, 6};
  const double bd[6] = {7, 8, 9, 10, 11, 12};
  double cd[4] = {};
  strata::cpu::gemm<double>(false, false, 2, 2, 3, ad, bd, cd, false);
  const double want[4] = {58, 64, 139, 154};
  bool ok = true;
  for (int i = 0; i < 4; ++i) ok = ok && c[i] == static_cast<float>(want[i]) && cd[i] == want[i];
  std::printf("strata::cpu_kernels GEMM: [%g %g; %g %g] %s\n", c[0], c[1], c[2], c[3], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
