// strata/shard/context_parallel.hpp: `ContextParallelSplit`, which tokens of a sequence a
// context-parallel rank holds (Megatron's load-balanced split for causal attention).
//
// A sequence of length s is cut into 2 cp chunks of c = s / (2 cp) tokens; rank r of the cp group
// holds chunks r and 2 cp - 1 - r, in that order, as its local sequence of 2 c tokens:
//
//   local position p in [0, c)    ->  global position r c + p
//   local position p in [c, 2 c)  ->  global position (2 cp - 1 - r) c + (p - c)
//
// so every rank does the same causal attention work (one early chunk, one late chunk). Everything
// outside attention is per token and runs on the local tokens; RoPE, learned positions and dropout
// masks use the global positions this map gives. `local_sequence` cuts a [batch, seq] host tensor
// (token ids, labels, loss mask) down to this rank's [batch, 2 c] columns.
#pragma once

#include <cstdint>

#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"

STRATA_NAMESPACE_BEGIN

struct ContextParallelSplit {
  int size = 1;       // cp
  int rank = 0;       // this rank's place in the cp group
  index_t chunk = 0;  // c: tokens per chunk (a local sequence is 2 c tokens); 0 for cp = 1

  constexpr bool active() const { return size > 1; }
  // Global chunk index of local chunk 0 or 1.
  constexpr index_t global_chunk(int local_chunk) const { return local_chunk == 0 ? rank : 2 * size - 1 - rank; }
  // Global chunk index of local chunk `local_chunk` of cp rank `owner`.
  constexpr index_t global_chunk_of(int owner, int local_chunk) const {
    return local_chunk == 0 ? owner : 2 * size - 1 - owner;
  }
  // Global position of local position p (identity for cp = 1).
  constexpr index_t global_position(index_t p) const {
    if (!active()) return p;
    return p < chunk ? rank * chunk + p : global_chunk(1) * chunk + (p - chunk);
  }
};

// The split of a sequence of `length` tokens over a cp group; a length that 2 cp does not divide is
// a ConfigError naming both numbers (before anything is allocated).
inline ContextParallelSplit context_parallel_split(index_t length, int cp, int rank, const char* who) {
  if (cp <= 1) return {1, 0, 0};
  if (length % (2 * cp) != 0)
    fail<ConfigError>(who, ": context parallelism cuts each sequence into 2*cp=", 2 * cp, " chunks, but the sequence has ",
                      length, " tokens, which ", 2 * cp,
                      " does not divide; choose a sequence length (--seq-length) that is a multiple of ", 2 * cp,
                      " or a smaller --context-parallel-size");
  return {cp, rank, length / (2 * cp)};
}

// The [b, 2c] columns of a [b, s] host tensor that cp rank `rank` holds (itself for cp = 1).
template <class X>
Tensor<X> local_sequence(const Tensor<X>& bs, int cp, int rank, const char* who) {
  if (cp <= 1) return bs;
  if (bs.rank() != 2) fail<ShapeError>(who, ": a batch must be [batch, seq], got ", bs.shape().str());
  const index_t b = bs.size(0), s = bs.size(1);
  const ContextParallelSplit split = context_parallel_split(s, cp, rank, who);
  const index_t c = split.chunk;
  Tensor<X> out(Shape{b, 2 * c});
  for (index_t row = 0; row < b; ++row)
    for (index_t p = 0; p < 2 * c; ++p) out[row * 2 * c + p] = bs[row * s + split.global_position(p)];
  return out;
}

STRATA_NAMESPACE_END
