// strata/backend/cpu/embedding.hpp: vocabulary-parallel lookup and its scatter-add gradient, and the
// learned absolute position embedding (add and gradient).
//
//   embedding_forward:   out[i,:] = weight[tokens[i] - row_begin, :] if that row is held here, else 0
//   embedding_backward:  dweight[tokens[i] - row_begin, :] += dout[i,:]   (positions ascending)
//   position_add:        x[t,j,:] += weight[first + t, :]                  x [s, b, h]
//   position_grad:       dweight[first + t, :] += sum_j dy[t,j,:]          (j ascending)
// Token ids are validated on the host by the layer before they get here.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

template <class T>
void embedding_forward(const std::int32_t* tokens, index_t n, const T* weight, index_t row_begin, index_t rows_local,
                       index_t h, T* out) {
  for (index_t i = 0; i < n; ++i) {
    const index_t row = index_t(tokens[i]) - row_begin;
    if (row >= 0 && row < rows_local) std::copy_n(weight + row * h, h, out + i * h);
    else std::fill_n(out + i * h, h, T(0));
  }
}

template <class T, class A = accumulate_t<T>>
void embedding_backward(const std::int32_t* tokens, index_t n, const T* dout, index_t row_begin, index_t rows_local,
                        index_t h, A* dweight) {
  for (index_t i = 0; i < n; ++i) {
    const index_t row = index_t(tokens[i]) - row_begin;
    if (row >= 0 && row < rows_local)
      for (index_t c = 0; c < h; ++c) dweight[row * h + c] += A(dout[i * h + c]);
  }
}

template <class T, class A = accumulate_t<T>>
void position_add(T* x, const T* weight, index_t s, index_t b, index_t h, index_t first) {
  for (index_t t = 0; t < s; ++t)
    for (index_t j = 0; j < b; ++j)
      for (index_t c = 0; c < h; ++c) {
        T& v = x[(t * b + j) * h + c];
        v = T(A(v) + A(weight[(first + t) * h + c]));
      }
}

template <class T, class A = accumulate_t<T>>
void position_grad(const T* dy, index_t s, index_t b, index_t h, index_t first, A* dweight) {
  for (index_t t = 0; t < s; ++t)
    for (index_t j = 0; j < b; ++j)
      for (index_t c = 0; c < h; ++c) dweight[(first + t) * h + c] += A(dy[(t * b + j) * h + c]);
}

}  // namespace cpu
STRATA_NAMESPACE_END
