// strata/backend/cpu/backend.hpp: `cpu::backend`, the CPU model of the Backend concept: static entry
// points forwarding to the plain kernels of this folder.
#pragma once

#include <string_view>

#include "../backend.hpp"
#include "activation.hpp"
#include "attention.hpp"
#include "gemm.hpp"
#include "norm.hpp"

STRATA_NAMESPACE_BEGIN
namespace cpu {

struct backend {
  static constexpr std::string_view name = "cpu";

  template <class T, class C = T>
  static void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, C* c, bool accumulate,
                   accumulate_t<T> alpha = accumulate_t<T>(1)) {
    cpu::gemm<T, C>(ta, tb, m, n, k, a, b, c, accumulate, alpha);
  }
  template <class T, class A = accumulate_t<T>>
  static void layernorm_forward(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean,
                                A* rstd) {
    cpu::layernorm_forward<T>(x, g, b, rows, h, eps, y, mean, rstd);
  }
  template <class T, class A = accumulate_t<T>>
  static void layernorm_backward(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows,
                                 index_t h, T* dx, A* dg, A* db) {
    cpu::layernorm_backward<T>(dy, x, g, mean, rstd, rows, h, dx, dg, db);
  }
  template <class T, class A = accumulate_t<T>>
  static void rmsnorm_forward(const T* x, const T* g, index_t rows, index_t h, A eps, T* y, A* rstd) {
    cpu::rmsnorm_forward<T>(x, g, rows, h, eps, y, rstd);
  }
  template <class T, class A = accumulate_t<T>>
  static void rmsnorm_backward(const T* dy, const T* x, const T* g, const A* rstd, index_t rows, index_t h, T* dx,
                               A* dg) {
    cpu::rmsnorm_backward<T>(dy, x, g, rstd, rows, h, dx, dg);
  }
  template <class T>
  static void gelu_forward(const T* x, index_t n, T* y) { cpu::gelu_forward<T>(x, n, y); }
  template <class T>
  static void gelu_backward(const T* dy, const T* x, index_t n, T* dx) { cpu::gelu_backward<T>(dy, x, n, dx); }
  template <class T>
  static void swiglu_forward(const T* gu, index_t rows, index_t f, T* y) { cpu::swiglu_forward<T>(gu, rows, f, y); }
  template <class T>
  static void swiglu_backward(const T* dy, const T* gu, index_t rows, index_t f, T* dgu) {
    cpu::swiglu_backward<T>(dy, gu, rows, f, dgu);
  }
  template <class A>
  static void causal_attention_forward(const A* q, const A* k, const A* v, index_t batch, index_t nq, index_t nkv,
                                       index_t s, index_t d, A scale, A* out, A* probs) {
    cpu::causal_attention_forward<A>(q, k, v, batch, nq, nkv, s, d, scale, out, probs);
  }
  template <class A>
  static void causal_attention_backward(const A* dout, const A* q, const A* k, const A* v, const A* probs,
                                        index_t batch, index_t nq, index_t nkv, index_t s, index_t d, A scale, A* dq,
                                        A* dk, A* dv) {
    cpu::causal_attention_backward<A>(dout, q, k, v, probs, batch, nq, nkv, s, d, scale, dq, dk, dv);
  }
  template <class A>
  static void rope_apply(A* x, index_t n, index_t s, index_t d, double base, index_t offset, bool inverse) {
    cpu::rope_apply<A>(x, n, s, d, base, offset, inverse);
  }
};

static_assert(Backend<backend>);

}  // namespace cpu
STRATA_NAMESPACE_END
