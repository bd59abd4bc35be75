// bench/bench_gemm_beside_comm.cu: what a GEMM costs when a communication kernel holds some of the
// SMs, and what planning the GEMM for the SMs left (cuBLASLt's SM count target, the backend's
// communication SM margin) buys back. One GPU, no NCCL: the collective is stood in for by a proxy.
//
// Under --tp-comm-overlap the layers run a collective on the communication stream (a NCCL kernel
// on a few SMs) while the compute stream runs GEMMs that do not depend on it. A GEMM whose grid is
// sized for every SM then leaves some of its blocks waiting for the collective's SMs, so it ends
// late, or holds every SM so the collective waits. The proxy is a kernel of `C` blocks (512
// threads each, as NCCL's; 128 KiB of shared memory each, so no two share an SM) on a high-priority stream that copies 256 KiB slices, at most --bandwidth
// GB/s in all (default 400, about what a NCCL collective moves between two NVLink-joined H100s),
// until `T` microseconds have passed, as a NCCL kernel moves data on the SMs it holds. For each GEMM of
// GPT 1.41B's layer at tensor parallel 2 (hidden 2048, 16 heads, micro-batch 8, seq 1024: the
// blocks a ring runs beside an exchange, and the weight gradients beside a reduce-scatter) and
// each C, it times, in milliseconds (median of 20, CUDA events):
//   gemm      the GEMM alone on every SM
//   gemm@SMs-C  the GEMM alone planned for SMs - C (backend margin C, marked beside communication)
//   proxy     the proxy alone (T is 0.6 x the gemm time: a collective that could hide under it)
//   pair      proxy, then the GEMM on every SM, launched together; time until both have ended
//   pair@SMs-C  the same with the GEMM planned for SMs - C
//   ideal     max(gemm, proxy)
// It measures and prints a markdown table; it never asserts. Built by tests/gpu/CMakeLists.txt
// (STRATA_BUILD_GPU_TESTS) or by hand from the repository root:
//   nvcc -std=c++20 -O3 -arch=sm_90 -I include bench/bench_gemm_beside_comm.cu -lcublasLt -lcublas -o bench_gemm_beside_comm
// Usage: bench_gemm_beside_comm [--blocks 4,8,16,24] [--fraction 0.6] [--bandwidth 400]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_timing.hpp"

namespace {

constexpr const char* kProgram = "bench_gemm_beside_comm";
using strata::bf16;
using strata::index_t;
using strata_bench::check_cuda;

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Each block copies a 256 KiB slice of `from` into `to`, pass after pass, no faster than
// `pass_ns` per pass, until `ns` have passed since it started: a stand-in for a collective's kernel
// that keeps its SMs and some memory bandwidth busy for that long.
constexpr std::size_t kSliceElements = (std::size_t{256} << 10) / sizeof(int4);
constexpr int kProxySharedBytes = 128 << 10;  // more than half an SM's: one proxy block per SM

__global__ void proxy_kernel(const int4* from, int4* to, unsigned long long ns, unsigned long long pass_ns) {
  __shared__ int go;
  const unsigned long long start = global_ns();
  const std::size_t begin = kSliceElements * blockIdx.x;
  for (unsigned long long pass = 0;; ++pass) {
    if (threadIdx.x == 0) {
      unsigned long long t = global_ns() - start;
      while (t < pass * pass_ns && t < ns) t = global_ns() - start;
      go = t < ns;
    }
    __syncthreads();
    if (!go) break;
    for (std::size_t i = threadIdx.x; i < kSliceElements; i += blockDim.x) to[begin + i] = from[begin + i];
    __syncthreads();
  }
}

struct problem {
  const char* name;
  bool ta, tb;
  index_t m, n, k;
  bool weight_gradient;  // fp32 C accumulated (beta = 1)
};

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> blocks = {4, 8, 16, 24};
  double fraction = 0.6, bandwidth = 400;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--blocks") == 0 && i + 1 < argc) blocks = parse_list(argv[++i]);
    else if (std::strcmp(argv[i], "--fraction") == 0 && i + 1 < argc) fraction = std::atof(argv[++i]);
    else if (std::strcmp(argv[i], "--bandwidth") == 0 && i + 1 < argc) bandwidth = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--blocks 4,8,16,24] [--fraction 0.6] [--bandwidth 400]\n", kProgram);
      return 2;
    }
  }
  strata::cuda::backend device(0);
  const int sms = device.sm_count();
  // Tokens 8 x 1024 at tp = 2: a ring block is half of them; hidden 2048, ffn 8192 (4096 per rank).
  const index_t tokens = 8192, block = tokens / 2, hidden = 2048, qkv = 3 * hidden / 2, ffn = 4 * hidden / 2;
  const std::vector<problem> problems = {
      {"qkv fwd block (ag ring)", false, true, block, qkv, hidden, false},
      {"fc1 fwd block (ag ring)", false, true, block, ffn, hidden, false},
      {"proj fwd block (rs ring)", false, true, block, hidden, hidden / 2, false},
      {"fc2 fwd block (rs ring)", false, true, block, hidden, ffn, false},
      {"qkv dW (beside rs)", true, false, qkv, hidden, tokens, true},
      {"fc1 dW (beside rs)", true, false, ffn, hidden, tokens, true},
      {"fc2 dx block (ag ring)", false, false, block, ffn, hidden, false},
  };
  check_cuda(cudaFuncSetAttribute(proxy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kProxySharedBytes), kProgram,
             "cudaFuncSetAttribute");
  cudaStream_t side;
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), kProgram, "cudaDeviceGetStreamPriorityRange");
  check_cuda(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, greatest), kProgram, "cudaStreamCreateWithPriority");
  const std::size_t copy_elements = kSliceElements * static_cast<std::size_t>(sms);
  int4 *from = nullptr, *to = nullptr;
  check_cuda(cudaMalloc(&from, copy_elements * sizeof(int4)), kProgram, "cudaMalloc");
  check_cuda(cudaMalloc(&to, copy_elements * sizeof(int4)), kProgram, "cudaMalloc");
  check_cuda(cudaMemset(from, 0, copy_elements * sizeof(int4)), kProgram, "cudaMemset");
  cudaEvent_t fork, join;
  check_cuda(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), kProgram, "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), kProgram, "cudaEventCreate");

  std::printf("# GEMMs beside a communication proxy on %d SMs (median of 20, ms; proxy %.0f GB/s for %.2f x the GEMM)\n\n",
              sms, bandwidth, fraction);
  std::printf("| GEMM | m x n x k | C | gemm | gemm@SMs-C | proxy | pair | pair@SMs-C | ideal |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const problem& p : problems) {
    const std::size_t a_elems = static_cast<std::size_t>(p.m * p.k), b_elems = static_cast<std::size_t>(p.k * p.n),
                      c_elems = static_cast<std::size_t>(p.m * p.n);
    bf16 *a = nullptr, *b = nullptr, *c = nullptr;
    float* g = nullptr;
    check_cuda(cudaMalloc(&a, a_elems * sizeof(bf16)), kProgram, "cudaMalloc");
    check_cuda(cudaMalloc(&b, b_elems * sizeof(bf16)), kProgram, "cudaMalloc");
    check_cuda(cudaMalloc(&c, c_elems * sizeof(bf16)), kProgram, "cudaMalloc");
    check_cuda(cudaMalloc(&g, c_elems * sizeof(float)), kProgram, "cudaMalloc");
    device.fill(a, static_cast<index_t>(a_elems), 0.01);
    device.fill(b, static_cast<index_t>(b_elems), 0.01);
    device.fill(g, static_cast<index_t>(c_elems), 0.0);
    const auto gemm = [&] {
      if (p.weight_gradient) device.gemm<bf16, float>(p.ta, p.tb, p.m, p.n, p.k, a, b, g, true);
      else device.gemm<bf16>(p.ta, p.tb, p.m, p.n, p.k, a, b, c, false);
    };
    const auto beside = [&](int margin, const auto& call) {
      (void)device.set_communication_sm_margin(margin);
      const bool was = device.gemms_beside_communication(true);
      call();
      (void)device.gemms_beside_communication(was);
      (void)device.set_communication_sm_margin(0);
    };
    const double alone = strata_bench::median_ms(device, 20, gemm, kProgram);
    const unsigned long long proxy_ns = static_cast<unsigned long long>(alone * fraction * 1e6);
    for (const int count : blocks) {
      if (count <= 0 || count >= sms) continue;
      // bytes read per pass / (bytes per second per block), in ns
      const auto pass_ns = static_cast<unsigned long long>(static_cast<double>(kSliceElements * sizeof(int4)) /
                                                           (bandwidth * 1e9 / count) * 1e9);
      const auto proxy = [&] {
        proxy_kernel<<<count, 512, kProxySharedBytes, side>>>(from, to, proxy_ns, pass_ns);
        check_cuda(cudaGetLastError(), kProgram, "proxy_kernel launch");
      };
      const auto pair = [&](int margin) {
        return [&, margin] {
          check_cuda(cudaEventRecord(fork, device.stream()), kProgram, "cudaEventRecord");
          check_cuda(cudaStreamWaitEvent(side, fork, 0), kProgram, "cudaStreamWaitEvent");
          proxy();
          beside(margin, gemm);
          check_cuda(cudaEventRecord(join, side), kProgram, "cudaEventRecord");
          check_cuda(cudaStreamWaitEvent(device.stream(), join, 0), kProgram, "cudaStreamWaitEvent");
        };
      };
      const auto proxy_alone = [&] {
        check_cuda(cudaEventRecord(fork, device.stream()), kProgram, "cudaEventRecord");
        check_cuda(cudaStreamWaitEvent(side, fork, 0), kProgram, "cudaStreamWaitEvent");
        proxy();
        check_cuda(cudaEventRecord(join, side), kProgram, "cudaEventRecord");
        check_cuda(cudaStreamWaitEvent(device.stream(), join, 0), kProgram, "cudaStreamWaitEvent");
      };
      double targeted = 0;
      {
        const auto call = [&] { beside(count, gemm); };
        targeted = strata_bench::median_ms(device, 20, call, kProgram);
      }
      const double proxy_ms = strata_bench::median_ms(device, 20, proxy_alone, kProgram);
      const double pair_full = strata_bench::median_ms(device, 20, pair(0), kProgram);
      const double pair_target = strata_bench::median_ms(device, 20, pair(count), kProgram);
      std::printf("| %s | %lld x %lld x %lld | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", p.name,
                  static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k), count, alone,
                  targeted, proxy_ms, pair_full, pair_target, std::max(alone, proxy_ms));
    }
    device.synchronize();
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(g);
  }
  cudaFree(from), cudaFree(to);
  return 0;
}
