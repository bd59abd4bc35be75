// strata/backend/cuda/kernels/launchers.hpp: the host side of every CUDA kernel family, as
// declarations a host compiler reads: each launcher enqueues its kernels on `stream` and returns.
// The families' .cuh files (activation.cuh, norm.cuh, ...) define them, and say what each computes.
//
// Two ways to build (docs/DEVELOPING.md, "Compiled and header-only CUDA"):
//   header-only (the default)  every translation unit that uses the CUDA backend is compiled by nvcc;
//                              backend.cuh includes the .cuh definitions, so each unit instantiates
//                              the kernels it calls.
//   compiled                   STRATA_CUDA_KERNELS_LIBRARY=1 (set by linking strata::cuda_kernels):
//                              the launchers are explicitly instantiated once, for float, double,
//                              bf16 and fp16, in the library's sources (backend/cuda/library/*.cu),
//                              and model code includes this header alone: the host compiler builds
//                              it, and it links the library. Nothing else changes; the bits are the
//                              same.
// Default arguments live here only; the definitions repeat none of them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../../../core/dtype.hpp"
#include "../../../core/fp8.hpp"
#include "../../../core/fp8_recipe.hpp"
#include "../../../core/shape.hpp"
#include "../../activation_options.hpp"
#include "../../adamw_step.hpp"
#include "../../moe_routing.hpp"
#include "../../rope_options.hpp"
#include "../../tensor_ref.hpp"

// STRATA_CUDA_HEADER_ONLY: 1 unless STRATA_CUDA_KERNELS_LIBRARY is set. STRATA_CUDA_INLINE marks the
// non-template functions the .cuh files define: inline in header-only builds, and defined once in the
// library when it is compiled.
#if defined(STRATA_CUDA_KERNELS_LIBRARY) && STRATA_CUDA_KERNELS_LIBRARY
#define STRATA_CUDA_HEADER_ONLY 0
#define STRATA_CUDA_INLINE
#else
#define STRATA_CUDA_HEADER_ONLY 1
#define STRATA_CUDA_INLINE inline
#endif

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

// --- elementwise.cuh -------------------------------------------------------------------------------
template <class X>
void fill(X* x, index_t n, double value, cudaStream_t stream);
template <class From, class To>
void convert(const From* src, index_t n, To* dst, cudaStream_t stream);
template <class X>
void add(const X* a, const X* b, index_t n, X* out, cudaStream_t stream);
template <class X>
void scale(X* x, index_t n, double factor, cudaStream_t stream);
template <class X>
void scale_by(X* x, index_t n, const double* factor, cudaStream_t stream);
template <class X>
void transpose(const X* in, index_t rows, index_t cols, X* out, cudaStream_t stream);

// --- multi_tensor.cuh ------------------------------------------------------------------------------
template <class X>
std::size_t sum_of_squares_many_workspace(const TensorRef<const X>* tensors, std::size_t count);
template <class X>
void sum_of_squares_many(const TensorRef<const X>* tensors, std::size_t count, double* accumulator, double* workspace,
                         cudaStream_t stream);
template <class X>
void scale_by_many(const TensorRef<X>* tensors, std::size_t count, const double* factor, cudaStream_t stream);
template <class X>
void fill_many(const TensorRef<X>* tensors, std::size_t count, double value, cudaStream_t stream);

// --- optimizer.cuh ---------------------------------------------------------------------------------
// One parameter of adamw_step_many: its state, gradient and value, and whether it decays.
template <class T, class A = accumulate_t<T>>
using adamw_tensor = AdamWTensor<T, A>;
template <class T, class Step, class A = accumulate_t<T>>
void adamw_step(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, T* value, index_t n, const Step& step,
                cudaStream_t stream);
template <class T, class Step, class A = accumulate_t<T>>
void adamw_step_many(const adamw_tensor<T, A>* tensors, std::size_t count, const Step& step, cudaStream_t stream);
STRATA_CUDA_INLINE index_t reduce_blocks(index_t n);  // blocks (and workspace doubles) of sum_of_squares
template <class X>
void sum_of_squares(const X* x, index_t n, double* accumulator, double* workspace, cudaStream_t stream);
STRATA_CUDA_INLINE void clip_factor(const double* square_sum, double max_norm, double* norm, double* factor,
                                    cudaStream_t stream);

// --- columns.cuh -----------------------------------------------------------------------------------
template <class T>
void slice_columns(const T* in, index_t rows, index_t cols, index_t begin, index_t width, T* out, cudaStream_t stream);
template <class T>
void copy_columns(const T* in, index_t in_cols, index_t rows, index_t width, T* out, index_t out_cols, cudaStream_t stream);
template <class T>
void unstack_columns(const T* stacked, index_t parts, index_t rows, index_t width, T* out, cudaStream_t stream);
template <class T>
void qkv_split(const T* qkv, index_t rows, index_t groups, index_t heads_per_group, index_t d, T* q, T* k, T* v,
               cudaStream_t stream);
template <class T>
void qkv_merge(const T* dq, const T* dk, const T* dv, index_t rows, index_t groups, index_t heads_per_group, index_t d,
               T* dqkv, cudaStream_t stream);

// --- bias.cuh --------------------------------------------------------------------------------------
template <class T>
void bias_add(T* y, const T* bias, index_t rows, index_t cols, cudaStream_t stream);
STRATA_CUDA_INLINE index_t column_sum_chunks(index_t rows);  // bias_grad's workspace: this many rows of A
template <class T, class A = accumulate_t<T>>
void bias_grad(const T* dy, index_t rows, index_t cols, A* dbias, A* workspace, cudaStream_t stream,
               unsigned* tickets = nullptr, index_t ticket_count = 0);

// --- pointer_table.cuh -----------------------------------------------------------------------------
template <class Pointer>
void store_pointers(const Pointer* pointers, std::size_t count, Pointer* table, cudaStream_t stream);

// --- random.cuh (Map: GlobalIndexMap or ShardIndexMap) -----------------------------------------------
template <class T, class Map>
void dropout(T* x, index_t n, Map map, double p, std::uint64_t key, cudaStream_t stream);
template <class T, class Map>
void init_normal(T* x, index_t n, Map map, std::uint64_t key, double stddev, cudaStream_t stream);

// --- rope.cuh --------------------------------------------------------------------------------------
template <class T>
void rope(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, bool inverse,
          cudaStream_t stream, RopeOptions options = {});
// qkv_split (merge false: packed -> q, k, v) or qkv_merge (merge true: q, k, v -> packed, or with
// fp8.codes the packed rows' FP8 codes) with RoPE's forward on q and k (its backward on dq and dk) in
// the same pass; s positions of b rows each.
template <class T>
void qkv_rope(T* packed_rows, T* q, T* k, T* v, index_t s, index_t b, index_t groups, index_t hpg, index_t d, double base,
              index_t position_offset, bool merge, cudaStream_t stream, RopeOptions options = {}, Fp8Output fp8 = {});

// --- embedding.cuh ---------------------------------------------------------------------------------
template <class T>
void embedding_forward(const std::int32_t* tokens, index_t n, const T* weight, index_t row_begin, index_t rows_local,
                       index_t h, T* out, cudaStream_t stream);
STRATA_CUDA_INLINE int embedding_key_bits(index_t rows_local);
STRATA_CUDA_INLINE std::size_t embedding_backward_workspace(index_t n, index_t rows_local);  // bytes
template <class T, class A = accumulate_t<T>>
void embedding_backward(const std::int32_t* tokens, index_t n, const T* dout, index_t row_begin, index_t rows_local,
                        index_t h, A* dweight, void* workspace, std::size_t workspace_bytes, cudaStream_t stream);
template <class T>
void position_add(T* x, const T* weight, index_t s, index_t b, index_t h, index_t first, cudaStream_t stream);
template <class T, class A = accumulate_t<T>>
void position_grad(const T* dy, index_t s, index_t b, index_t h, index_t first, A* dweight, cudaStream_t stream);

// --- activation.cuh --------------------------------------------------------------------------------
template <class T>
void gelu_forward(const T* x, index_t n, T* y, cudaStream_t stream);
template <class T>
void gelu_backward(const T* dy, const T* x, index_t n, T* dx, cudaStream_t stream);
template <class T>
void swiglu_forward(const T* gate_up, index_t rows, index_t f, T* y, cudaStream_t stream);
template <class T>
void swiglu_backward(const T* dy, const T* gate_up, index_t rows, index_t f, T* dgate_up, cudaStream_t stream);
template <class T>
void glu_forward(const T* gate_up, index_t rows, index_t f, GluActivation activation, T* y, cudaStream_t stream);
template <class T>
void sigmoid_gate_forward(const T* x, const T* z, index_t rows, index_t cols, T* y, cudaStream_t stream);
template <class T>
void sigmoid_gate_backward(const T* dy, const T* x, const T* z, index_t rows, index_t cols, T* dx, T* dz, cudaStream_t stream);
template <class T>
void glu_backward(const T* dy, const T* gate_up, index_t rows, index_t f, GluActivation activation, T* dgate_up,
                  cudaStream_t stream);
template <class T>
void squared_relu_forward(const T* x, index_t n, T* y, cudaStream_t stream);
template <class T>
void squared_relu_backward(const T* dy, const T* x, index_t n, T* dx, cudaStream_t stream);

// --- norm.cuh --------------------------------------------------------------------------------------
STRATA_CUDA_INLINE index_t norm_backward_blocks(index_t rows);  // the backward's workspace rows (see norm.cuh)
template <class T, class A = accumulate_t<T>>
void layernorm_forward(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean, A* rstd,
                       const T* residual, T* sum, cudaStream_t stream, A weight_offset = A(0), Fp8Output fp8 = {});
template <class T, class A = accumulate_t<T>>
void layernorm_backward(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows, index_t h,
                        T* dx, A* dg, A* db, const T* dresidual, A* workspace, bool accumulate, cudaStream_t stream,
                        A* dresidual_sums = nullptr, A weight_offset = A(0));
template <class T, class A = accumulate_t<T>>
void rmsnorm_forward(const T* x, const T* g, index_t rows, index_t h, A eps, T* y, A* rstd, const T* residual, T* sum,
                     cudaStream_t stream, A weight_offset = A(0), Fp8Output fp8 = {});
template <class T, class A = accumulate_t<T>>
void rmsnorm_backward(const T* dy, const T* x, const T* g, const A* rstd, index_t rows, index_t h, T* dx, A* dg,
                      const T* dresidual, A* workspace, bool accumulate, cudaStream_t stream, A weight_offset = A(0));

// --- cross_entropy.cuh -----------------------------------------------------------------------------
// Blocks per multiprocessor of the fused forward-backward kernel: each holds one row between its two
// passes, so blocks x SMs x row bytes should fit in L2 (2 x 132 x 100 KiB for GPT-2's vocabulary in
// bf16 on an H100, about half of its 50 MiB).
inline constexpr int kCrossEntropyFusedBlocksPerSm = 2;
template <class T, class A = accumulate_t<T>>
void cross_entropy_max(const T* logits, index_t rows, index_t local, index_t used, A* row_max, cudaStream_t stream);
template <class T, class A = accumulate_t<T>>
void cross_entropy_sums(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                        const std::int32_t* labels, index_t begin, A* sums, cudaStream_t stream);
template <class A>
void cross_entropy_loss(const A* sums, const A* row_max, index_t rows, index_t vocab, A smoothing, A* loss, A* lse,
                        cudaStream_t stream);
template <class T, class A = accumulate_t<T>>
void cross_entropy_backward(const T* logits, const A* lse, const std::int32_t* labels, index_t begin, index_t rows,
                            index_t local, index_t used, index_t vocab, A smoothing, const A* dloss, T* dlogits,
                            cudaStream_t stream);
template <class T, class A = accumulate_t<T>>
void cross_entropy_forward_backward(T* logits, const std::int32_t* labels, index_t rows, index_t local, index_t used,
                                    index_t vocab, A smoothing, const A* dloss, A* loss, cudaStream_t stream,
                                    int blocks_per_multiprocessor = kCrossEntropyFusedBlocksPerSm);
template <class A>
void masked_loss_sum(const A* loss, const A* mask, index_t n, double* out, cudaStream_t stream);

// --- attention_merge.cuh ---------------------------------------------------------------------------
template <class T, class A = accumulate_t<T>>
void attention_merge(T* out, A* lse, const T* block_out, const A* block_lse, index_t s, index_t b, index_t heads,
                     index_t d, cudaStream_t stream);

// --- attention_sink.cuh ----------------------------------------------------------------------------
template <class T, class A = accumulate_t<T>>
void attention_sink_forward(T* out, A* lse, const T* sinks, index_t s, index_t b, index_t heads, index_t d,
                            cudaStream_t stream);
template <class T, class A = accumulate_t<T>>
void attention_sink_backward(const T* dout, const T* out, const A* lse, const T* sinks, index_t s, index_t b,
                             index_t heads, index_t d, A* sink_gradient, cudaStream_t stream);

// --- fp8.cuh ---------------------------------------------------------------------------------------
template <class T>
void fp8_amax(const T* x, index_t n, float* amax, cudaStream_t stream);
template <class T>
void fp8_cast(const T* x, index_t n, Fp8Format format, const float* scale, std::uint8_t* out, float* amax,
              cudaStream_t stream);
template <class T>
void fp8_cast_transpose(const T* x, index_t rows, index_t cols, Fp8Format format, const float* scale, std::uint8_t* out,
                        std::uint8_t* out_t, float* amax, cudaStream_t stream);
template <class T, class A>
void fp8_cast_transpose_fused(Fp8Producer producer, const T* x, const T* pre, index_t rows, index_t cols, Fp8Format format,
                              const float* scale, std::uint8_t* out, std::uint8_t* out_t, float* amax, A* column_sums,
                              A* partials, Fp8Output activation, cudaStream_t stream);
STRATA_CUDA_INLINE index_t fp8_tile_rows(index_t rows);  // the rows of fp8_cast_transpose_fused's partials (see fp8.cuh)
STRATA_CUDA_INLINE void fp8_transpose(const std::uint8_t* in, index_t rows, index_t cols, std::uint8_t* out,
                                      cudaStream_t stream);
STRATA_CUDA_INLINE void fp8_align_scales(const float* a, const float* b, float* out, cudaStream_t stream);
STRATA_CUDA_INLINE void fp8_update_scale(float* row, float max, const Fp8UpdateArgs& args, cudaStream_t stream);
STRATA_CUDA_INLINE void fp8_update_scales(float* rows, index_t count, index_t stride, const Fp8RoleMaxes& maxes,
                                          const Fp8UpdateArgs& args, float* aligned, cudaStream_t stream);
template <class T>
void fp8_cast_blocks(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                     float* q_scale_inv, std::uint8_t* qt, float* qt_scale_inv, cudaStream_t stream);
template <class T>
void fp8_cast_tiles(const T* x, index_t rows, index_t cols, Fp8Format format, index_t block, std::uint8_t* q,
                    std::uint8_t* qt, float* scale_inv, float* scale_inv_t, cudaStream_t stream);
template <class T>
void fp8_decode_blocks(const std::uint8_t* q, index_t rows, index_t k, Fp8Format format, const float* scale_inv, bool tiles,
                       index_t block, T* out, cudaStream_t stream);

// --- moe.cuh ---------------------------------------------------------------------------------------
template <class A>
void moe_router_forward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing, const A* bias,
                        std::int32_t* indices, A* weights, A* aux, A* lse, cudaStream_t stream);
template <class A>
void moe_router_backward(const A* logits, index_t tokens, index_t experts, index_t k, MoeRouting routing,
                         const std::int32_t* indices, const A* dweights, const A* coefficients, index_t groups,
                         double aux_scale, double z_scale, A* dlogits, cudaStream_t stream);
template <class A>
void moe_drop(const std::int32_t* indices, const A* weights, index_t n, index_t capacity, bool by_position,
              std::int32_t* routed, cudaStream_t stream);
template <class C>
void moe_count(const std::int32_t* routed, index_t n, index_t k, index_t groups, index_t experts, C* counts,
               bool accumulate, cudaStream_t stream);
STRATA_CUDA_INLINE void moe_sort_by_expert(const std::int32_t* routed, index_t n, index_t k, index_t first_expert,
                                           index_t experts, index_t capacity, std::int32_t* slot_of,
                                           std::int32_t* token_of_slot, index_t slots, cudaStream_t stream);
STRATA_CUDA_INLINE void moe_chunk_maps(const std::int32_t* chunk_counts, index_t chunks, index_t local, index_t capacity,
                                       std::int32_t* start, std::int32_t* to_expert, std::int32_t* to_chunk,
                                       std::int32_t* expert_counts, cudaStream_t stream);
template <class T>
void moe_gather_rows(const T* in, index_t cols, const std::int32_t* rows, index_t n, T* out, cudaStream_t stream);
template <class T, class A>
void moe_combine(const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k, index_t cols, T* out,
                 cudaStream_t stream);
template <class T, class A>
void moe_combine_backward(const T* dy, const T* in, const std::int32_t* slot, const A* weights, index_t tokens, index_t k,
                          index_t cols, index_t slots, T* d_in, A* dweights, cudaStream_t stream);
template <class A>
void moe_aux_loss(const A* prob_sums, const A* counts, index_t n, double factor, double* loss, A* coefficients,
                  cudaStream_t stream);
template <class A>
void moe_expert_bias_update(const A* counts, index_t experts, double rate, A* bias, cudaStream_t stream);

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
