// strata/backend/cuda/kernels/rope.cuh: rotary position embedding, forward and backward, in place
// (variants: backend/rope_options.hpp).
//
//   x [s, n, d] (n = batch * heads); of each head the first rotary_dim dimensions turn, half =
//   rotary_dim / 2; for position t and pair i < half:
//     angle = (position_offset + t) * rope_inverse_frequency(i)
//     forward:  (x_a, x_b) <- (x_a cos - x_b sin,  x_b cos + x_a sin),  (a, b) = (i, i + half), or
//               (2i, 2i + 1) when interleaved
//     backward: the inverse (transposed) rotation, the same with -sin
//   cos and sin are multiplied by rope_attention_factor(options) (YaRN's concentration, else 1)
//
// The angle and its sine and cosine are computed in double, as the CPU twin does: positions reach
// thousands of radians, where a float angle would already be wrong in the fourth digit. They depend
// on the position and the pair only, so a block takes one position at a time: its threads compute
// that position's `half` cosines and sines once (in shared memory, rounded to A as the twin rounds
// them) and then turn every pair of its n heads, which lie contiguous in x [s, n, d]. The rotation
// itself runs in A = accumulate_t<T>, 16 bytes of each half at a time where the layout allows (not
// interleaved, whole runs, aligned rows). (A thread per pair with its own double sincos and pow ran at
// a sixth of the memory bandwidth: 220 us a call for [4096 x 48 heads x 128] bf16 on an H100; the
// angles once per position brought it to 67 us.)
//
// qkv_rope: the attention's qkv_split with RoPE on q and k in the same pass, and qkv_merge with the
// backward rotation of dq and dk (see qkv_rope_kernel).
#pragma once

#include "../../rope_options.hpp"
#include "../../../core/fp8_recipe.hpp"
#include "common.cuh"
#include "fp8_codes.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

// Position `position`'s `half` cosines and sines (times factor; the sines times sign) into the block's
// shared table, in double as the CPU twin computes them, rounded to A; the barriers before (the
// previous position's table is no longer read) and after (every entry written).
template <class A>
__device__ __forceinline__ void rope_table(A* cosines, A* sines, index_t position, index_t half, index_t rotary_dim,
                                           double base, const RopeOptions& options, double factor, double sign) {
  __syncthreads();
  for (index_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = static_cast<double>(position) * rope_inverse_frequency(i, rotary_dim, base, options);
    double sin_angle, cos_angle;
    sincos(angle, &sin_angle, &cos_angle);
    cosines[i] = A(factor * cos_angle);
    sines[i] = A(factor * (sign * sin_angle));
  }
  __syncthreads();
}

template <class T, class A = accumulate_t<T>>
__global__ void rope_kernel(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, double sign,
                            RopeOptions options, bool vectorized) {
  extern __shared__ unsigned char rope_shared[];
  A* cosines = reinterpret_cast<A*>(rope_shared);
  const index_t rotary_dim = rope_rotary_dim(options, d), half = rotary_dim / 2;
  A* sines = cosines + half;
  const double factor = rope_attention_factor(options);
  const index_t first_step = options.interleaved ? 2 : 1, second_offset = options.interleaved ? 1 : half;
  for (index_t t = blockIdx.x; t < s; t += gridDim.x) {
    rope_table<A>(cosines, sines, position_offset + t, half, rotary_dim, base, options, factor, sign);
    T* rows = x + t * n * d;  // the n heads of position t
    if (vectorized) {  // (i, i + half) for W neighbouring i at once: two 16-byte loads and stores
      constexpr int W = packed<T>::width;
      const index_t runs = half / W;
      for (index_t p = threadIdx.x; p < n * runs; p += blockDim.x) {
        const index_t head = p / runs, i0 = (p - head * runs) * W;
        packed<T>* first = reinterpret_cast<packed<T>*>(rows + head * d + i0);
        packed<T>* second = reinterpret_cast<packed<T>*>(rows + head * d + i0 + half);
        packed<T> a = *first, b = *second;
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const A c = cosines[i0 + j], sn = sines[i0 + j], va = unpack<T>(a.raw[j]), vb = unpack<T>(b.raw[j]);
          a.raw[j] = pack<T>(va * c - vb * sn);
          b.raw[j] = pack<T>(vb * c + va * sn);
        }
        *first = a;
        *second = b;
      }
      continue;
    }
    for (index_t p = threadIdx.x; p < n * half; p += blockDim.x) {
      const index_t head = p / half, i = p - head * half;
      T* pair = rows + head * d;
      const index_t first = i * first_step, second = first + second_offset;
      const A c = cosines[i], sn = sines[i];
      const A a = load(pair, first), b = load(pair, second);
      store(pair, first, a * c - b * sn);
      store(pair, second, b * c + a * sn);
    }
  }
}

// The attention's split of the packed projection with RoPE in one pass, or the merge of dq, dk turned
// back and dv: the packed rows [s * b, groups, hpg + 2, d] (each group's hpg query heads, its key
// head, its value head) and the heads q [s, b, groups * hpg, d], k, v [s, b, groups, d]. Forward
// (Merge false): packed -> q, k, v with q and k turned (sign 1); backward (Merge true): dq, dk turned
// back (sign -1) and dv -> packed, or (fp8.codes set) -> the packed rows' FP8 codes, each element
// rounded to T first and cast as fp8_cast casts it, |element| folded into fp8.amax (the qkv
// projection's output-gradient codes; the packed rows are then never written in T). A block per
// position as in rope_kernel (the same table), each of its b rows' heads read once and written once:
// qkv_split then rope_forward on q and k (rope_backward then qkv_merge) moved q and k twice more. The
// same bits: the elements that do not turn are copied, the turned ones computed by the same
// expression from the same table.
// I: the type of a position's element and head indices (unsigned where b * slots * d fits it: the
// divisions by slots, hpg + 2 and the chunks per head are the loop's main cost in 64 bits).
template <class T, bool Merge, class I = unsigned, class A = accumulate_t<T>>
__global__ void qkv_rope_kernel(T* packed_rows, T* q, T* k, T* v, index_t s, index_t b, index_t groups, index_t hpg,
                                index_t d, double base, index_t position_offset, RopeOptions options, bool vectorized,
                                Fp8Output fp8) {
  extern __shared__ unsigned char rope_shared[];
  A* cosines = reinterpret_cast<A*>(rope_shared);
  const index_t rotary_dim = rope_rotary_dim(options, d), half = rotary_dim / 2;
  A* sines = cosines + half;
  const double factor = rope_attention_factor(options), sign = Merge ? -1.0 : 1.0;
  const index_t slots = groups * (hpg + 2);  // heads of a packed row
  const I islots = static_cast<I>(slots), islot_heads = static_cast<I>(hpg + 2), ihpg = static_cast<I>(hpg);
  const bool codes = Merge && fp8.codes != nullptr;
  const float scale = codes ? *fp8.scale : 0.0f;
  unsigned bits = 0;  // the codes' amax
  using S = storage_t<T>;
  for (index_t t = blockIdx.x; t < s; t += gridDim.x) {
    rope_table<A>(cosines, sines, position_offset + t, half, rotary_dim, base, options, factor, sign);
    // head h of this position's b rows: its element offset in the packed rows and its address in q,
    // k or v; whether it turns (q and k)
    auto heads_of = [&](I h, index_t& packed_at, T*& split_head) {
      const I bi = h / islots, slot = h - bi * islots, g = slot / islot_heads, j = slot - g * islot_heads;
      const index_t row = t * b + index_t(bi), group = row * groups + index_t(g);
      packed_at = (group * (hpg + 2) + index_t(j)) * d;
      split_head = j < ihpg ? q + (group * hpg + index_t(j)) * d : (j == ihpg ? k : v) + group * d;
      return j <= ihpg;
    };
    if (vectorized) {  // 16-byte chunks: a chunk of the first half turns with its twin of the second
      constexpr int W = packed<T>::width;
      const I chunks = static_cast<I>(d / W), half_chunks = static_cast<I>(half / W),
              rotary_chunks = static_cast<I>(rotary_dim / W);
      // With RoPE over whole heads an item is a chunk of the first half and its twin of the second,
      // turned (q, k) or copied (v), so every thread of a warp moves two chunks (an item a chunk left
      // the threads of a turned head's second half idle; the items of two chunks take 0.69-0.83x its
      // time on an H100, bench/RESULTS.md); with partial RoPE an item is a chunk, turned with its
      // twin, copied, or left to its twin.
      const bool pairs = rotary_chunks == chunks;
      const I per_head = pairs ? half_chunks : chunks, items = static_cast<I>(b * slots) * per_head;
      for (I p = threadIdx.x; p < items; p += blockDim.x) {
        const I h = p / per_head, c = p - h * per_head;
        index_t packed_at;
        T* split_head;
        const bool turn = heads_of(h, packed_at, split_head);
        const packed<T>* src = reinterpret_cast<const packed<T>*>(Merge ? split_head : packed_rows + packed_at);
        auto put = [&](I chunk, const packed<T>& value) {  // chunk `chunk` of the head's output
          if (codes) fp8_store_vector<T>(fp8.codes + packed_at + index_t(chunk) * W, value, scale, fp8.format, bits);
          else reinterpret_cast<packed<T>*>(Merge ? packed_rows + packed_at : split_head)[chunk] = value;
        };
        if (pairs || (turn && c < half_chunks)) {
          packed<T> a = src[c], bv = src[c + half_chunks];
          if (turn) {
#pragma unroll
            for (int j = 0; j < W; ++j) {
              const A cs = cosines[c * W + j], sn = sines[c * W + j], va = unpack<T>(a.raw[j]), vb = unpack<T>(bv.raw[j]);
              a.raw[j] = pack<T>(va * cs - vb * sn);
              bv.raw[j] = pack<T>(vb * cs + va * sn);
            }
          }
          put(c, a);
          put(c + half_chunks, bv);
        } else if (!turn || c >= rotary_chunks) {
          put(c, src[c]);
        }
      }
      continue;
    }
    const index_t first_step = options.interleaved ? 2 : 1, second_offset = options.interleaved ? 1 : half;
    const I id = static_cast<I>(d), elements = static_cast<I>(b * slots) * id;
    for (I p = threadIdx.x; p < elements; p += blockDim.x) {
      const I h = p / id;
      const index_t e = index_t(p - h * id);
      index_t packed_at;
      T* split_head;
      const bool turn = heads_of(h, packed_at, split_head) && e < rotary_dim;
      const T* src = Merge ? split_head : packed_rows + packed_at;
      auto put = [&](index_t i, S value) {  // element i of the head's output, T's bits
        if (codes) {
          const float x = static_cast<float>(unpack<T>(value));
          bits = max(bits, fp8_abs_bits(x));
          fp8.codes[packed_at + i] = fp8_round(x * scale, fp8.format);
        } else {
          reinterpret_cast<S*>(Merge ? packed_rows + packed_at : split_head)[i] = value;
        }
      };
      if (!turn) {
        put(e, reinterpret_cast<const S*>(src)[e]);
        continue;
      }
      if (options.interleaved ? e % 2 != 0 : e >= half) continue;  // the pair's second: its first turns both
      const index_t i = first_step == 2 ? e / 2 : e, first = e, second = e + second_offset;
      const A c = cosines[i], sn = sines[i];
      const A a = load(src, first), bb = load(src, second);
      put(first, pack<T>(a * c - bb * sn));
      put(second, pack<T>(bb * c + a * sn));
    }
  }
  if (codes && fp8.amax) fp8_block_amax(bits, fp8.amax);
}

template <class T>
void qkv_rope(T* packed_rows, T* q, T* k, T* v, index_t s, index_t b, index_t groups, index_t hpg, index_t d, double base,
              index_t position_offset, bool merge, cudaStream_t stream, RopeOptions options, Fp8Output fp8) {
  using A = accumulate_t<T>;
  if (s <= 0 || b <= 0 || groups <= 0 || d <= 0) return;
  if (!merge) fp8 = {};  // codes: the merge's output only
  const index_t half = rope_rotary_dim(options, d) / 2;
  const unsigned blocks = static_cast<unsigned>(std::min<index_t>(s, index_t{1} << 20));
  const std::size_t shared = std::max<std::size_t>(1, 2 * static_cast<std::size_t>(half) * sizeof(A));
  constexpr index_t width = 16 / sizeof(T);
  const bool vectorized = !options.interleaved && half % width == 0 && d % width == 0 && aligned_16(q) && aligned_16(k) &&
                          aligned_16(v) && (fp8.codes ? aligned_16(fp8.codes) : aligned_16(packed_rows));
  // a position's elements, b * slots * d, index in 32 bits where they fit (they do but for huge batches)
  const bool narrow = b * groups * (hpg + 2) * d < (index_t{1} << 31);
  const auto launch = [&](auto merge_tag, auto index_tag) {
    qkv_rope_kernel<T, decltype(merge_tag)::value, decltype(index_tag)><<<blocks, kThreads, shared, stream>>>(
        packed_rows, q, k, v, s, b, groups, hpg, d, base, position_offset, options, vectorized, fp8);
  };
  using yes = std::true_type;
  using no = std::false_type;
  if (merge) narrow ? launch(yes{}, 0u) : launch(yes{}, index_t{0});
  else narrow ? launch(no{}, 0u) : launch(no{}, index_t{0});
  check_launch(merge ? "qkv_merge_rope" : "qkv_split_rope");
}

template <class T>
void rope(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, bool inverse,
          cudaStream_t stream, RopeOptions options) {
  using A = accumulate_t<T>;
  const index_t half = rope_rotary_dim(options, d) / 2;
  if (s <= 0 || n <= 0 || half <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<index_t>(s, index_t{1} << 20));
  const std::size_t shared = 2 * static_cast<std::size_t>(half) * sizeof(A);
  // 16-byte runs of pairs: the plain layout, whole runs in each half, every head's start aligned
  constexpr index_t width = 16 / sizeof(T);
  const bool vectorized = !options.interleaved && half % width == 0 && d % width == 0 && aligned_16(x);
  rope_kernel<T><<<blocks, kThreads, shared, stream>>>(x, s, n, d, base, position_offset, inverse ? -1.0 : 1.0, options,
                                                       vectorized);
  check_launch(inverse ? "rope_backward" : "rope_forward");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
