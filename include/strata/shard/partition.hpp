// strata/shard/partition.hpp: how a length is cut into per-rank pieces.
//
// - `partition(n, parts, i)`: contiguous split where the first n % parts pieces get one extra
//   element (the split used for sample and bucket ranges); `partition_even` insists that parts
//   divides n (the split used for weights: every rank's shard has the same shape).
// - `stage_layers`: the transformer layers a pipeline stage builds. Without overrides the layers
//   split evenly; with Megatron's --decoder-first-pipeline-num-layers and
//   --decoder-last-pipeline-num-layers the first and/or last stage get the given count and the
//   remaining layers split evenly over the stages in between.
// - `padded_vocab_size`, `vocab_range`: Megatron pads the vocabulary up to a multiple of
//   make_vocab_size_divisible_by * tp, so every tensor-parallel rank holds the same number of
//   embedding rows; rank r holds rows vocab_range(padded, tp, r).
// - `heads_per_rank`, `query_groups_per_rank`: attention heads and key/value groups per
//   tensor-parallel rank.
//
// Everything is constexpr: with constant inputs the results are constants, and an input that
// cannot work does not compile; with run-time inputs the same call throws ConfigError.
#pragma once

#include <algorithm>

#include "../core/shape.hpp"
#include "problem.hpp"

STRATA_NAMESPACE_BEGIN

// The half-open interval [begin, end).
struct Range {
  index_t begin = 0;
  index_t end = 0;

  constexpr index_t size() const { return end - begin; }
  constexpr bool empty() const { return end == begin; }
  constexpr bool contains(index_t i) const { return begin <= i && i < end; }
  friend constexpr bool operator==(const Range&, const Range&) = default;
};

namespace detail {

constexpr Problem partition_problem(index_t n, int parts, int i) {
  if (n < 0) return Problem::sentence("cannot partition n=", n, " elements; the length must be at least 0.");
  if (parts < 1) return Problem::sentence("cannot partition into parts=", parts, " pieces; there must be at least 1 part.");
  if (i < 0 || i >= parts)
    return Problem::sentence("part index i=", i, " is outside a partition into parts=", parts, " pieces; use 0 <= i < ",
                             parts, ".");
  return {};
}

constexpr Problem stage_split_problem(int num_layers, int pp, int first, int last) {
  if (num_layers < 1)
    return Problem::sentence("num_layers=", num_layers, " is not a valid layer count; a model needs at least one layer.");
  if (pp < 1) return Problem::sentence("pp=", pp, " is not a valid size; every parallel size must be at least 1.");
  if (first == 0 || first < -1)
    return Problem::sentence("first_stage_layers=", first,
                             " is not valid; give the first pipeline stage at least 1 layer, or -1 to split evenly.");
  if (last == 0 || last < -1)
    return Problem::sentence("last_stage_layers=", last,
                             " is not valid; give the last pipeline stage at least 1 layer, or -1 to split evenly.");
  if (pp == 1) {
    if (first != -1 && first != num_layers)
      return Problem::sentence("first_stage_layers=", first, " cannot apply with pp=1, where the only stage holds all num_layers=",
                               num_layers, "; leave it at -1.");
    if (last != -1 && last != num_layers)
      return Problem::sentence("last_stage_layers=", last, " cannot apply with pp=1, where the only stage holds all num_layers=",
                               num_layers, "; leave it at -1.");
    return {};
  }
  if (pp > num_layers)
    return Problem::sentence("pp=", pp, " exceeds num_layers=", num_layers,
                             "; every pipeline stage needs at least one layer, so use pp <= ", num_layers, ".");
  const int given_first = first > 0 ? first : 0;
  const int given_last = last > 0 ? last : 0;
  const int middle = pp - (first > 0) - (last > 0);
  const int rest = num_layers - given_first - given_last;
  if (first < 0 && last < 0) {
    if (num_layers % pp != 0)
      return Problem::sentence("pp=", pp, " does not divide num_layers=", num_layers,
                               "; choose pp among the divisors of ", num_layers,
                               ", or split unevenly with first_stage_layers / last_stage_layers (Megatron's "
                               "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers).");
    return {};
  }
  if (middle == 0) {
    if (rest != 0)
      return Problem::sentence("first_stage_layers=", first, " plus last_stage_layers=", last, " is ", given_first + given_last,
                               ", but with pp=2 these two stages hold all num_layers=", num_layers, ".");
    return {};
  }
  if (rest < middle)
    return Problem::sentence("first_stage_layers=", first, " and last_stage_layers=", last, " leave ", rest, " of num_layers=",
                             num_layers, " for the ", middle,
                             " other pipeline stages; every stage needs at least one layer, so give the first and last "
                             "stages fewer layers.");
  if (rest % middle != 0)
    return Problem::sentence("the ", rest, " layers left after first_stage_layers=", first, " and last_stage_layers=", last,
                             " (of num_layers=", num_layers, ") do not split evenly over the ", middle,
                             " other pipeline stages; change the first or last stage's count so that ", middle,
                             " divides the rest.");
  return {};
}

}  // namespace detail

// Part i of n elements cut into `parts` contiguous pieces; the first n % parts pieces are one
// element longer than the others.
constexpr Range partition(index_t n, int parts, int i) {
  raise_if(detail::partition_problem(n, parts, i));
  const index_t base = n / parts;
  const index_t extra = n % parts;
  const index_t begin = i * base + std::min<index_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

// Part i of n elements cut into `parts` pieces of equal size; parts must divide n.
constexpr Range partition_even(index_t n, int parts, int i) {
  raise_if(detail::partition_problem(n, parts, i));
  if (n % parts != 0)
    raise_if(Problem::sentence("parts=", parts, " does not divide n=", n,
                               "; an even partition gives every part the same size, so pad n to a multiple of ", parts,
                               " or use partition(), which allows pieces one element apart."));
  const index_t size = n / parts;
  return {i * size, (i + 1) * size};
}

// The layers [begin, end) that pipeline stage `stage` of `pp` builds. first_stage_layers and
// last_stage_layers (-1: not given) fix the first and last stage's counts; the remaining layers
// split evenly over the other stages.
constexpr Range stage_layers(int num_layers, int pp, int stage, int first_stage_layers = -1, int last_stage_layers = -1) {
  raise_if(detail::stage_split_problem(num_layers, pp, first_stage_layers, last_stage_layers));
  if (stage < 0 || stage >= pp)
    raise_if(Problem::sentence("stage=", stage, " is outside a pipeline of pp=", pp, " stages; stages are numbered 0 to ",
                               pp - 1, "."));
  if (pp == 1) return {0, num_layers};
  const bool has_first = first_stage_layers > 0;
  const bool has_last = last_stage_layers > 0;
  const int middle = pp - has_first - has_last;
  const int rest = num_layers - (has_first ? first_stage_layers : 0) - (has_last ? last_stage_layers : 0);
  const int per_stage = middle > 0 ? rest / middle : 0;
  if (stage == pp - 1 && has_last) return {num_layers - last_stage_layers, num_layers};
  if (stage == 0) return {0, has_first ? first_stage_layers : per_stage};
  const index_t begin = (has_first ? first_stage_layers : per_stage) + static_cast<index_t>(stage - 1) * per_stage;
  return {begin, begin + per_stage};
}

// The first stage holds the input embedding; the last holds the output layer and the loss.
constexpr bool stage_has_embedding(int stage, int pp) {
  if (pp < 1 || stage < 0 || stage >= pp)
    raise_if(Problem::sentence("stage=", stage, " is outside a pipeline of pp=", pp, " stages."));
  return stage == 0;
}
constexpr bool stage_has_output(int stage, int pp) {
  if (pp < 1 || stage < 0 || stage >= pp)
    raise_if(Problem::sentence("stage=", stage, " is outside a pipeline of pp=", pp, " stages."));
  return stage == pp - 1;
}

// Megatron's vocabulary padding: the smallest multiple of make_vocab_size_divisible_by * tp
// that is at least `vocab`.
constexpr index_t padded_vocab_size(index_t vocab, int tp, int make_vocab_size_divisible_by = 128) {
  if (vocab < 1) raise_if(Problem::sentence("vocab_size=", vocab, " is not valid; a vocabulary needs at least one token."));
  if (tp < 1) raise_if(Problem::sentence("tp=", tp, " is not a valid size; every parallel size must be at least 1."));
  if (make_vocab_size_divisible_by < 1)
    raise_if(Problem::sentence("make_vocab_size_divisible_by=", make_vocab_size_divisible_by,
                               " is not valid; it must be at least 1 (Megatron's default is 128)."));
  const index_t multiple = static_cast<index_t>(make_vocab_size_divisible_by) * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

// The embedding rows tensor-parallel rank `rank` holds of a padded vocabulary.
constexpr Range vocab_range(index_t padded_vocab, int tp, int rank) {
  if (tp >= 1 && padded_vocab >= 0 && padded_vocab % tp != 0)
    raise_if(Problem::sentence("tp=", tp, " does not divide the vocabulary size ", padded_vocab,
                               "; pad it first with padded_vocab_size(vocab_size, tp), so every rank holds the same "
                               "number of rows."));
  if (tp >= 1 && (rank < 0 || rank >= tp))
    raise_if(Problem::sentence("tensor-parallel rank=", rank, " is outside tp=", tp, "; ranks are numbered 0 to ", tp - 1, "."));
  return partition_even(padded_vocab, tp, rank);
}

// Attention heads per tensor-parallel rank.
constexpr int heads_per_rank(int heads, int tp) {
  if (heads < 1) raise_if(Problem::sentence("num_attention_heads=", heads, " is not valid; attention needs at least one head."));
  if (tp < 1) raise_if(Problem::sentence("tp=", tp, " is not a valid size; every parallel size must be at least 1."));
  if (heads % tp != 0)
    raise_if(Problem::sentence("tp=", tp, " does not divide num_attention_heads=", heads,
                               "; each tensor-parallel rank holds whole heads, so choose tp among the divisors of ", heads,
                               "."));
  return heads / tp;
}

// Key/value (query) groups per tensor-parallel rank; groups must be a multiple of tp.
constexpr int query_groups_per_rank(int groups, int tp) {
  if (groups < 1) raise_if(Problem::sentence("num_query_groups=", groups, " is not valid; attention needs at least one group."));
  if (tp < 1) raise_if(Problem::sentence("tp=", tp, " is not a valid size; every parallel size must be at least 1."));
  if (groups < tp)
    raise_if(Problem::sentence("num_query_groups=", groups, " is smaller than tp=", tp,
                               "; query groups must be a multiple of tp, so each tensor-parallel rank holds whole "
                               "key/value heads (use tp <= ", groups, " or more query groups)."));
  if (groups % tp != 0)
    raise_if(Problem::sentence("tp=", tp, " does not divide num_query_groups=", groups,
                               "; query groups must be a multiple of tp, so each tensor-parallel rank holds whole "
                               "key/value heads."));
  return groups / tp;
}

STRATA_NAMESPACE_END
