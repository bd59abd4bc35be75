// strata/backend/cuda/kernels/attention_sink.cuh: attention sinks (backend/attention_options.hpp,
// Megatron's --softmax-type off-by-one / learnable) on top of any attention engine, in place on out
// and lse (the CPU twin adds the sink inside cpu::attention_forward / attention_backward):
//
//   out [s, b, heads, d];  lse [b, heads, s] (accumulate type);  sinks [heads] (learnable, else s_h = 0)
//   forward   lse' = log(e^lse + e^(s_h)),  out' = e^(lse - lse') out
//             (the attention without the sink divided by the larger denominator: the sink's value is zero)
//   backward  d s_h += -sum over (batch, query) of e^(s_h - lse'_i) D_i,  D_i = dout_i . out'_i
//
// With lse' and out' saved, any engine's backward recomputes the forward's probabilities
// p_ij = e^(S_ij - lse'_i) and D_i = dout_i . out'_i, so dq, dk and dv need nothing more; the
// sink's own gradient is the only addition (learnable only).
//
// Forward: one warp per (query, batch, head) row, as attention_merge. Backward: one block per head,
// its threads striding over the (batch, query) rows and block_sum in a fixed order, so the sum is
// the same bits on every run.
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T, class A = accumulate_t<T>>
__global__ void attention_sink_forward_kernel(T* out, A* lse, const T* sinks, index_t s, index_t b, index_t heads,
                                              index_t d) {
  for_each_attention_row(s, b, heads, [&](index_t row, index_t h, index_t at, int lane) {
    const A l = lse[at], sink = sinks ? load(sinks, h) : A(0);
    const A m = l > sink ? l : sink;
    const A with_sink = m + log(exp(l - m) + exp(sink - m));
    const A w = exp(l - with_sink);
    T* o = out + row * d;
    for (index_t e = lane; e < d; e += 32) store(o, e, w * load(o, e));
    __syncwarp();
    if (lane == 0) lse[at] = with_sink;
  });
}

template <class T, class A = accumulate_t<T>>
__global__ void attention_sink_backward_kernel(const T* dout, const T* out, const A* lse, const T* sinks, index_t s,
                                               index_t b, index_t heads, index_t d, A* sink_gradient) {
  const index_t h = blockIdx.x;
  const A sink = load(sinks, h);
  A sum = 0;
  for (index_t r = threadIdx.x; r < b * s; r += blockDim.x) {  // r = batch s + i
    const index_t batch = r / s, i = r % s;
    const index_t row = (i * b + batch) * heads + h;
    A big_d = 0;
    for (index_t e = 0; e < d; ++e) big_d += load(dout + row * d, e) * load(out + row * d, e);
    sum -= exp(sink - lse[(batch * heads + h) * s + i]) * big_d;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) sink_gradient[h] += sum;
}

template <class T, class A>
void attention_sink_forward(T* out, A* lse, const T* sinks, index_t s, index_t b, index_t heads, index_t d,
                            cudaStream_t stream) {
  const index_t rows = s * b * heads;
  if (rows <= 0) return;
  attention_sink_forward_kernel<T><<<grid_for(rows * 32), kThreads, 0, stream>>>(out, lse, sinks, s, b, heads, d);
  check_launch("attention_sink_forward");
}

template <class T, class A>
void attention_sink_backward(const T* dout, const T* out, const A* lse, const T* sinks, index_t s, index_t b,
                             index_t heads, index_t d, A* sink_gradient, cudaStream_t stream) {
  if (heads <= 0) return;
  attention_sink_backward_kernel<T><<<static_cast<unsigned>(heads), kThreads, 0, stream>>>(dout, out, lse, sinks, s, b,
                                                                                           heads, d, sink_gradient);
  check_launch("attention_sink_backward");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
