// strata/backend/cuda/kernels/activation.cuh: GELU (tanh approximation) and SwiGLU, forward and
// backward, element-wise in A = accumulate_t<T>.
//
//   gelu(x)       = 0.5 x (1 + tanh(u)) = x s,  u = c (x + 0.044715 x^3),  c = sqrt(2 / pi),  s = sigmoid(2u)
//   gelu'(x)      = s + x 2 s (1 - s) c (1 + 3 * 0.044715 x^2)
//   swiglu(g, u)  = silu(g) u,  silu(g) = g sigmoid(g)
//   d/du = dy silu(g),  d/dg = dy u sigmoid(g) (1 + g (1 - sigmoid(g)))
//
//   glu (backend/activation_options.hpp): act(min(g, c)) * (clamp(u, -c, c) + offset),
//   act(g) = g sigmoid(alpha g), alpha 1 (silu) or 1.702 (quick_gelu); squared_relu(x) = max(x, 0)^2
//
// gate_up [rows, 2f] holds [gate (f) | up (f)] in each row; y [rows, f]. GELU runs through map
// (16-byte accesses where the pointers allow).
//
// Every sigmoid is sigmoid_(z) = 1 / (1 + e^-z), in float from the SFU's exp2 and reciprocal
// (__expf, __fdividef: a few ulp, as the CPU twin's vector_exp; five instructions where tanhf and
// an exactly rounded division take about twenty each, which the FP8 casts that compute GELU and
// SwiGLU feel), in double exactly rounded. GELU is written x sigmoid(2u), as the twin writes it:
// 1 + tanh(u) cancels for negative x.
#pragma once

#include "../../activation_options.hpp"
#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class A>
__device__ __forceinline__ A sigmoid_(A z) {
  if constexpr (std::is_same_v<A, float>) return __fdividef(1.0f, 1.0f + __expf(-z));  // 0 where e^-z overflows
  else return A(1) / (A(1) + exp_(-z));
}
template <class A>
struct gelu_forward_op {  // a = x
  __device__ A operator()(A v, A, index_t) const {
    const A c2 = A(2 * 0.7978845608028654);
    return v * sigmoid_(c2 * (v + A(0.044715) * v * v * v));
  }
};
template <class A>
struct gelu_backward_op {  // a = dy, b = x
  __device__ A operator()(A dy, A v, index_t) const {
    const A c = A(0.7978845608028654), k = A(0.044715);
    const A s = sigmoid_(A(2) * c * (v + k * v * v * v));
    const A du = c * (A(1) + A(3) * k * v * v);
    return dy * (s + v * A(2) * s * (A(1) - s) * du);
  }
};
template <class T>
void gelu_forward(const T* x, index_t n, T* y, cudaStream_t stream) {
  map<T>(x, nullptr, n, y, gelu_forward_op<accumulate_t<T>>{}, "gelu_forward", stream);
}
template <class T>
void gelu_backward(const T* dy, const T* x, index_t n, T* dx, cudaStream_t stream) {
  map<T>(dy, x, n, dx, gelu_backward_op<accumulate_t<T>>{}, "gelu_backward", stream);
}

// SwiGLU of one (gate, up) pair and its two gradients, as every kernel that computes them does (the
// FP8 casts that make them too: kernels/fp8.cuh), so those agree bit for bit.
template <class A>
__device__ __forceinline__ A swiglu_value(A gate, A up) {
  const A sig = sigmoid_(gate);
  return gate * sig * up;
}
template <class A>
__device__ __forceinline__ A swiglu_gate_gradient(A d, A gate, A up) {
  const A sig = sigmoid_(gate);
  return d * up * sig * (A(1) + gate * (A(1) - sig));
}
template <class A>
__device__ __forceinline__ A swiglu_up_gradient(A d, A gate) {
  const A sig = sigmoid_(gate);
  return d * gate * sig;
}

// With `vectorized` (f a multiple of a 16-byte vector's elements, every pointer 16-byte aligned), each
// thread makes a vector of neighbouring elements of one row from 16-byte loads of gate and up (and
// dy) and stores it whole; else one element a thread. The values are the same either way.
template <class T, class A = accumulate_t<T>>
__global__ void swiglu_forward_kernel(const T* gate_up, index_t rows, index_t f, T* y, bool vectorized) {
  const index_t n = rows * f, first = blockIdx.x * index_t(blockDim.x) + threadIdx.x, stride = index_t(gridDim.x) * blockDim.x;
  if (vectorized) {
    constexpr int width = packed<T>::width;
    for (index_t v = first; v < n / width; v += stride) {
      const index_t i = v * width, r = i / f, j = i % f;
      const packed<T> g = *reinterpret_cast<const packed<T>*>(gate_up + r * 2 * f + j);
      const packed<T> u = *reinterpret_cast<const packed<T>*>(gate_up + r * 2 * f + f + j);
      packed<T> out;
#pragma unroll
      for (int k = 0; k < width; ++k) out.raw[k] = pack<T>(swiglu_value<A>(unpack<T>(g.raw[k]), unpack<T>(u.raw[k])));
      reinterpret_cast<packed<T>*>(y)[v] = out;
    }
    return;
  }
  for (index_t i = first; i < n; i += stride) {
    const index_t r = i / f, j = i % f;  // y (rows, f)
    const A gate = load(gate_up, r * 2 * f + j), up = load(gate_up, r * 2 * f + f + j);  // gate_up (rows, 2f)
    store(y, i, swiglu_value(gate, up));
  }
}
template <class T, class A = accumulate_t<T>>
__global__ void swiglu_backward_kernel(const T* dy, const T* gate_up, index_t rows, index_t f, T* dgate_up, bool vectorized) {
  const index_t n = rows * f, first = blockIdx.x * index_t(blockDim.x) + threadIdx.x, stride = index_t(gridDim.x) * blockDim.x;
  if (vectorized) {
    constexpr int width = packed<T>::width;
    for (index_t v = first; v < n / width; v += stride) {
      const index_t i = v * width, r = i / f, j = i % f, gate_at = r * 2 * f + j, up_at = gate_at + f;
      const packed<T> g = *reinterpret_cast<const packed<T>*>(gate_up + gate_at);
      const packed<T> u = *reinterpret_cast<const packed<T>*>(gate_up + up_at);
      const packed<T> d = reinterpret_cast<const packed<T>*>(dy)[v];
      packed<T> dg, du;
#pragma unroll
      for (int k = 0; k < width; ++k) {
        const A gate = unpack<T>(g.raw[k]), up = unpack<T>(u.raw[k]), dk = unpack<T>(d.raw[k]);
        du.raw[k] = pack<T>(swiglu_up_gradient(dk, gate));
        dg.raw[k] = pack<T>(swiglu_gate_gradient(dk, gate, up));
      }
      *reinterpret_cast<packed<T>*>(dgate_up + up_at) = du;
      *reinterpret_cast<packed<T>*>(dgate_up + gate_at) = dg;
    }
    return;
  }
  for (index_t i = first; i < n; i += stride) {
    const index_t r = i / f, j = i % f;
    const index_t gate_at = r * 2 * f + j, up_at = gate_at + f;
    const A gate = load(gate_up, gate_at), up = load(gate_up, up_at), d = load(dy, i);
    store(dgate_up, up_at, swiglu_up_gradient(d, gate));
    store(dgate_up, gate_at, swiglu_gate_gradient(d, gate, up));
  }
}
template <class T>
void swiglu_forward(const T* gate_up, index_t rows, index_t f, T* y, cudaStream_t stream) {
  if (rows <= 0 || f <= 0) return;
  const bool vectorized = f % packed<T>::width == 0 && aligned_16(gate_up) && aligned_16(y);
  const index_t work = vectorized ? rows * f / packed<T>::width : rows * f;
  swiglu_forward_kernel<T><<<grid_for(work), kThreads, 0, stream>>>(gate_up, rows, f, y, vectorized);
  check_launch("swiglu_forward");
}
template <class T>
void swiglu_backward(const T* dy, const T* gate_up, index_t rows, index_t f, T* dgate_up, cudaStream_t stream) {
  if (rows <= 0 || f <= 0) return;
  const bool vectorized = f % packed<T>::width == 0 && aligned_16(dy) && aligned_16(gate_up) && aligned_16(dgate_up);
  const index_t work = vectorized ? rows * f / packed<T>::width : rows * f;
  swiglu_backward_kernel<T><<<grid_for(work), kThreads, 0, stream>>>(dy, gate_up, rows, f, dgate_up, vectorized);
  check_launch("swiglu_backward");
}

template <class T, class A = accumulate_t<T>>
__global__ void glu_forward_kernel(const T* gate_up, index_t rows, index_t f, GluActivation activation, T* y) {
  const index_t n = rows * f;
  const A alpha = A(glu_alpha(activation.kind)), clamp = A(activation.clamp), offset = A(activation.linear_offset);
  const bool clamped = activation.clamp > 0;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const index_t r = i / f, j = i % f;  // y (rows, f); gate_up (rows, 2f)
    A gate = load(gate_up, r * 2 * f + j), up = load(gate_up, r * 2 * f + f + j);
    if (clamped) {
      gate = gate < clamp ? gate : clamp;
      up = up < -clamp ? -clamp : (up > clamp ? clamp : up);
    }
    const A sig = A(1) / (A(1) + exp_(-alpha * gate));
    store(y, i, gate * sig * (up + offset));
  }
}
template <class T, class A = accumulate_t<T>>
__global__ void glu_backward_kernel(const T* dy, const T* gate_up, index_t rows, index_t f, GluActivation activation,
                                    T* dgate_up) {
  const index_t n = rows * f;
  const A alpha = A(glu_alpha(activation.kind)), clamp = A(activation.clamp), offset = A(activation.linear_offset);
  const bool clamped = activation.clamp > 0;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const index_t r = i / f, j = i % f;
    const index_t gate_at = r * 2 * f + j, up_at = gate_at + f;
    const A graw = load(gate_up, gate_at), uraw = load(gate_up, up_at), d = load(dy, i);
    const bool gate_passes = !clamped || graw <= clamp, up_passes = !clamped || (uraw >= -clamp && uraw <= clamp);
    const A gate = gate_passes ? graw : clamp, up = up_passes ? uraw : (uraw < A(0) ? -clamp : clamp);
    const A sig = A(1) / (A(1) + exp_(-alpha * gate));
    store(dgate_up, up_at, up_passes ? d * gate * sig : A(0));
    store(dgate_up, gate_at, gate_passes ? d * (up + offset) * sig * (A(1) + alpha * gate * (A(1) - sig)) : A(0));
  }
}
template <class T>
void glu_forward(const T* gate_up, index_t rows, index_t f, GluActivation activation, T* y, cudaStream_t stream) {
  if (rows <= 0 || f <= 0) return;
  glu_forward_kernel<T><<<grid_for(rows * f), kThreads, 0, stream>>>(gate_up, rows, f, activation, y);
  check_launch("glu_forward");
}
template <class T>
void glu_backward(const T* dy, const T* gate_up, index_t rows, index_t f, GluActivation activation, T* dgate_up,
                  cudaStream_t stream) {
  if (rows <= 0 || f <= 0) return;
  glu_backward_kernel<T><<<grid_for(rows * f), kThreads, 0, stream>>>(dy, gate_up, rows, f, activation, dgate_up);
  check_launch("glu_backward");
}

template <class A>
struct squared_relu_forward_op {  // a = x
  __device__ A operator()(A v, A, index_t) const {
    const A r = v > A(0) ? v : A(0);
    return r * r;
  }
};
template <class A>
struct squared_relu_backward_op {  // a = dy, b = x
  __device__ A operator()(A dy, A v, index_t) const { return dy * A(2) * (v > A(0) ? v : A(0)); }
};
template <class T>
void squared_relu_forward(const T* x, index_t n, T* y, cudaStream_t stream) {
  map<T>(x, nullptr, n, y, squared_relu_forward_op<accumulate_t<T>>{}, "squared_relu_forward", stream);
}
template <class T>
void squared_relu_backward(const T* dy, const T* x, index_t n, T* dx, cudaStream_t stream) {
  map<T>(dy, x, n, dx, squared_relu_backward_op<accumulate_t<T>>{}, "squared_relu_backward", stream);
}

// The shared experts' gate (cpu::sigmoid_gate_forward / _backward): rows scaled by sigmoid(z[r]).
// Forward one thread per element; backward one warp per row (the row's dot product by shuffles).
template <class T, class A = accumulate_t<T>>
__global__ void sigmoid_gate_forward_kernel(const T* x, const T* z, index_t rows, index_t cols, T* y) {
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < rows * cols; i += index_t(gridDim.x) * blockDim.x) {
    const A g = A(1) / (A(1) + exp_(-A(load(z, i / cols))));
    store(y, i, g * load(x, i));
  }
}
template <class T, class A = accumulate_t<T>>
__global__ void sigmoid_gate_backward_kernel(const T* dy, const T* x, const T* z, index_t rows, index_t cols, T* dx, T* dz) {
  const int lane = threadIdx.x % 32;
  const index_t warps = index_t(gridDim.x) * (blockDim.x / 32);
  for (index_t r = (blockIdx.x * index_t(blockDim.x) + threadIdx.x) / 32; r < rows; r += warps) {
    const A g = A(1) / (A(1) + exp_(-A(load(z, r))));
    A dot = 0;
    for (index_t c = lane; c < cols; c += 32) {
      const A d = load(dy, r * cols + c);
      dot += d * load(x, r * cols + c);
      store(dx, r * cols + c, g * d);
    }
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (lane == 0) store(dz, r, g * (A(1) - g) * dot);
  }
}
template <class T>
void sigmoid_gate_forward(const T* x, const T* z, index_t rows, index_t cols, T* y, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  sigmoid_gate_forward_kernel<T><<<grid_for(rows * cols), kThreads, 0, stream>>>(x, z, rows, cols, y);
  check_launch("sigmoid_gate_forward");
}
template <class T>
void sigmoid_gate_backward(const T* dy, const T* x, const T* z, index_t rows, index_t cols, T* dx, T* dz, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  sigmoid_gate_backward_kernel<T><<<grid_for(rows * 32), kThreads, 0, stream>>>(dy, x, z, rows, cols, dx, dz);
  check_launch("sigmoid_gate_backward");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
