// Uses the installed compiled CUDA kernels through find_package(strata COMPONENTS nccl cuda_kernels):
// the CUDA backend and the NCCL communicator included as plain C++ by the host compiler, linked
// against strata::cuda_kernels. The package test builds (and links) it; run without a GPU it says so
// and exits 0.
#include <strata/backend/cuda/backend.cuh>
#include <strata/comm/nccl.hpp>

#include <cstdio>

int main() {
  int gpus = 0;
  try {
    gpus = strata::cuda::device_count();
  } catch (const strata::Error& e) {  // no driver on this machine
    std::printf("no usable GPU (%s)\n", e.what());
  }
  if (gpus < 1) {
    std::printf("no GPU: the compiled kernels linked; nothing to run\n");
    return 0;
  }
  strata::cuda::backend device(0);
  strata::Tensor<float, strata::space::cuda> x = strata::Tensor<float, strata::space::cuda>::zeros(strata::Shape{4});
  device.fill(x.data(), x.numel(), 2.0);
  device.scale(x.data(), x.numel(), 0.5);
  const strata::Tensor<float> host = strata::to_host(x);
  std::printf("fill and scale on GPU 0: %g %g %g %g\n", host[0], host[1], host[2], host[3]);
  return host[0] == 1.0f && host[3] == 1.0f ? 0 : 1;
}
