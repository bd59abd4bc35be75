// strata/backend/cuda/kernels/fp8_codes.cuh: the device-side FP8 rounding and amax pieces that
// kernels making FP8 codes share (fp8.cuh's casts, norm.cuh's norms and rope.cuh's merge writing codes). Device functions
// only (no launcher, nothing STRATA_CUDA_INLINE), so any library source may include it.
#pragma once

#include <cuda_fp8.h>

#include "../../../core/fp8.hpp"
#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

__device__ __forceinline__ std::uint8_t fp8_round(float v, Fp8Format format) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<std::uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2));
#else
  return fp8_encode(v, format);
#endif
}

// |v| as the bits the amax compares: any NaN becomes the canonical quiet NaN 0x7fc00000 (above
// every finite float and infinity), as on the CPU, whatever payload the input or the hardware's
// fabs gives it.
__device__ __forceinline__ unsigned fp8_abs_bits(float v) { return isnan(v) ? 0x7fc00000u : __float_as_uint(fabsf(v)); }

// The block's max of `bits` into *amax (bits of non-negative floats, compared as unsigned; a NaN's
// bits, whatever its payload, become the canonical quiet NaN's).
__device__ __forceinline__ void fp8_block_amax(unsigned bits, float* amax) {
  __shared__ unsigned warp_max[32];
  for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_down_sync(0xffffffffu, bits, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = bits;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    bits = lane < warps ? warp_max[lane] : 0u;
    for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_down_sync(0xffffffffu, bits, offset));
    if (lane == 0) atomicMax(reinterpret_cast<unsigned*>(amax), bits > 0x7f800000u ? 0x7fc00000u : bits);  // NaN: canonical
  }
}

// The codes of v[0..8) * s as eight bytes (byte j at the lowest address + j), two a conversion on
// sm_89 and newer (the paired cvt rounds each element as the single one does). |v| is folded into
// bits as the raw bits of fabs(v): a NaN's are above every number's, and fp8_block_amax makes any
// NaN the canonical one, so the amax is fp8_abs_bits's without a test per element.
__device__ __forceinline__ uint2 fp8_round8(const float (&v)[8], float s, Fp8Format format, unsigned& bits) {
#pragma unroll
  for (int j = 0; j < 8; ++j) bits = max(bits, __float_as_uint(v[j]) & 0x7fffffffu);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const __nv_fp8_interpretation_t kind = format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;
  unsigned pair[4];
#pragma unroll
  for (int p = 0; p < 4; ++p)
    pair[p] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * p] * s, v[2 * p + 1] * s), __NV_SATFINITE, kind);
  return make_uint2(pair[0] | (pair[1] << 16), pair[2] | (pair[3] << 16));
#else
  unsigned word[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) word[j / 4] |= static_cast<unsigned>(fp8_round(v[j] * s, format)) << (8 * (j % 4));
  return make_uint2(word[0], word[1]);
#endif
}

// The FP8 codes of one 16-byte vector of T elements into its V bytes at p (V-byte aligned), each
// element's |value| folded into bits: fp8_cast's codes of those elements (fp8_round8's eight at a
// time for 2-byte T, one by one for float and double).
template <class T>
__device__ __forceinline__ void fp8_store_vector(std::uint8_t* p, const packed<T>& v, float s, Fp8Format format,
                                                 unsigned& bits) {
  constexpr int V = packed<T>::width;
  if constexpr (V == 8) {
    float e[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) e[k] = static_cast<float>(unpack<T>(v.raw[k]));
    *reinterpret_cast<uint2*>(p) = fp8_round8(e, s, format, bits);
  } else {
    unsigned word = 0;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float e = static_cast<float>(unpack<T>(v.raw[k]));
      bits = max(bits, __float_as_uint(e) & 0x7fffffffu);
      word |= static_cast<unsigned>(fp8_round(e * s, format)) << (8 * k);
    }
    if constexpr (V == 4) *reinterpret_cast<unsigned*>(p) = word;
    else *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(word);
  }
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
