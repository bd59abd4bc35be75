// strata/shard/parallel_config.hpp: `ParallelConfig` (how many ways each parallelism splits the
// job), `ModelDims` (the model numbers the split must fit) and their validation.
//
// Dense layers see the world as tp x cp x dp x pp ranks (world_size = tp*pp*dp*cp). Expert layers
// regroup the same ranks, stage by stage, as etp x ep x edp x pp (Megatron-Core's expert rank
// generator): expert tensor parallelism etp, expert parallelism ep, and what remains is expert
// data parallelism edp = world_size / (etp*ep*pp). So experts are carved out of the ranks of one
// pipeline stage, and etp*ep must divide tp*cp*dp. Megatron's default etp is tp; here etp is
// explicit and defaults to 1 (set .etp = tp to get Megatron's default).
//
// `validate` returns the first Problem as one sentence (empty when fine) and works in constant
// expressions; `check` throws it as ConfigError; `checked` returns its input, so
// `constexpr auto c = checked(ParallelConfig{...}, ModelDims{...});` does not compile when the
// configuration cannot work.
#pragma once

#include <cstdint>
#include <limits>

#include "partition.hpp"
#include "problem.hpp"

STRATA_NAMESPACE_BEGIN

struct ParallelConfig {
  int tp = 1;   // tensor parallel
  int pp = 1;   // pipeline parallel
  int dp = 1;   // data parallel (of dense layers)
  int cp = 1;   // context parallel
  int ep = 1;   // expert parallel (carved out of the ranks of a stage)
  int etp = 1;  // tensor parallel inside an expert

  constexpr int world_size() const { return tp * pp * dp * cp; }
  // Ranks of one pipeline stage: tp*cp*dp for dense layers, etp*ep*expert_dp() for expert layers.
  constexpr int ranks_per_stage() const { return tp * cp * dp; }
  // Data parallelism of expert layers: world_size / (etp*ep*pp).
  constexpr int expert_dp() const { return etp * ep > 0 ? ranks_per_stage() / (etp * ep) : 0; }
  friend constexpr bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

struct ModelDims {
  int num_layers = 0;
  int hidden_size = 0;
  int num_attention_heads = 0;
  int num_query_groups = 0;  // 0: one group per head (multi-head attention)
  int ffn_hidden_size = 0;
  int vocab_size = 0;
  int seq_length = 0;
  int num_experts = 0;  // 0: dense model
  bool sequence_parallel = false;
  int kv_channels = 0;             // 0: hidden_size / num_attention_heads (then heads must divide hidden_size)
  int expert_ffn_hidden_size = 0;  // 0: ffn_hidden_size
  int first_stage_layers = -1;     // -1: layers split evenly over the pipeline stages
  int last_stage_layers = -1;

  constexpr int query_groups() const { return num_query_groups == 0 ? num_attention_heads : num_query_groups; }
  constexpr int expert_ffn() const { return expert_ffn_hidden_size == 0 ? ffn_hidden_size : expert_ffn_hidden_size; }
};

// The first reason the layout cannot work, or an empty Problem.
constexpr Problem validate(const ParallelConfig& c) {
  struct Named {
    const char* name;
    int value;
  };
  const Named sizes[] = {{"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"cp", c.cp}, {"ep", c.ep}, {"etp", c.etp}};
  for (const Named& s : sizes)
    if (s.value < 1)
      return Problem::sentence(s.name, "=", s.value, " is not a valid size; every parallel size must be at least 1.");
  const std::int64_t world = std::int64_t{c.tp} * c.pp * c.dp * c.cp;
  if (world > std::numeric_limits<int>::max())
    return Problem::sentence("tp*pp*dp*cp=", world, " ranks is more than this library can number (at most ",
                             std::numeric_limits<int>::max(), ").");
  const std::int64_t expert = std::int64_t{c.etp} * c.ep;
  const std::int64_t stage = std::int64_t{c.tp} * c.cp * c.dp;
  if (stage % expert != 0)
    return Problem::sentence("etp=", c.etp, " times ep=", c.ep, " is ", expert, ", which does not divide tp*cp*dp=", stage,
                             ", the ranks of one pipeline stage; expert layers regroup those ranks as etp x ep x "
                             "expert data parallel, so choose ep and etp whose product divides ",
                             stage, ".");
  return {};
}

// The first reason the layout cannot train the model, or an empty Problem.
constexpr Problem validate(const ParallelConfig& c, const ModelDims& m) {
  if (Problem p = validate(c); !p.ok()) return p;
  struct Named {
    const char* name;
    int value;
  };
  const Named at_least_one[] = {{"num_layers", m.num_layers},   {"hidden_size", m.hidden_size},
                                {"num_attention_heads", m.num_attention_heads},
                                {"ffn_hidden_size", m.ffn_hidden_size}, {"vocab_size", m.vocab_size},
                                {"seq_length", m.seq_length}};
  for (const Named& s : at_least_one)
    if (s.value < 1) return Problem::sentence(s.name, "=", s.value, " is not valid; it must be at least 1.");
  const Named at_least_zero[] = {{"num_query_groups", m.num_query_groups}, {"num_experts", m.num_experts},
                                 {"kv_channels", m.kv_channels}, {"expert_ffn_hidden_size", m.expert_ffn_hidden_size}};
  for (const Named& s : at_least_zero)
    if (s.value < 0) return Problem::sentence(s.name, "=", s.value, " is not valid; it must be at least 0 (0 picks the default).");

  // Attention.
  const int heads = m.num_attention_heads;
  const int groups = m.query_groups();
  if (m.kv_channels == 0 && m.hidden_size % heads != 0)
    return Problem::sentence("num_attention_heads=", heads, " does not divide hidden_size=", m.hidden_size,
                             "; each head gets hidden_size / num_attention_heads channels unless kv_channels is set.");
  if (groups > heads)
    return Problem::sentence("num_query_groups=", groups, " exceeds num_attention_heads=", heads,
                             "; a query group is a set of heads sharing one key/value head.");
  if (heads % groups != 0)
    return Problem::sentence("num_query_groups=", groups, " does not divide num_attention_heads=", heads,
                             "; every query group must hold the same number of heads.");
  if (heads % c.tp != 0)
    return Problem::sentence("tp=", c.tp, " does not divide num_attention_heads=", heads,
                             "; each tensor-parallel rank holds whole heads, so choose tp among the divisors of ", heads, ".");
  if (groups < c.tp)
    return Problem::sentence("num_query_groups=", groups, " is smaller than tp=", c.tp,
                             "; query groups must be a multiple of tp, so each tensor-parallel rank holds whole "
                             "key/value heads (use tp <= ",
                             groups, " or more query groups).");
  if (groups % c.tp != 0)
    return Problem::sentence("tp=", c.tp, " does not divide num_query_groups=", groups,
                             "; query groups must be a multiple of tp, so each tensor-parallel rank holds whole "
                             "key/value heads.");

  // Feed-forward.
  if (m.ffn_hidden_size % c.tp != 0)
    return Problem::sentence("tp=", c.tp, " does not divide ffn_hidden_size=", m.ffn_hidden_size,
                             "; the column-parallel first MLP projection gives every rank ffn_hidden_size / tp columns.");

  // Pipeline.
  if (Problem p = detail::stage_split_problem(m.num_layers, c.pp, m.first_stage_layers, m.last_stage_layers); !p.ok())
    return p;

  // Sequence: context parallelism cuts it into 2*cp chunks (two per rank, for causal load
  // balance); sequence parallelism then cuts each rank's part over tp.
  if (c.cp > 1 && m.seq_length % (2 * c.cp) != 0)
    return Problem::sentence("2*cp=", 2 * c.cp, " does not divide seq_length=", m.seq_length,
                             "; context parallelism cuts the sequence into 2*cp chunks (two per rank, to balance causal "
                             "attention), so choose a sequence length that is a multiple of ",
                             2 * c.cp, ".");
  if (m.sequence_parallel && c.tp > 1) {
    const int local = m.seq_length / c.cp;
    if (local % c.tp != 0) {
      if (c.cp == 1)
        return Problem::sentence("tp=", c.tp, " does not divide seq_length=", m.seq_length,
                                 "; sequence parallelism splits the sequence over the tensor-parallel ranks, so choose "
                                 "a sequence length that is a multiple of ",
                                 c.tp, " or turn sequence parallelism off.");
      return Problem::sentence("tp=", c.tp, " does not divide seq_length/cp=", local, " (seq_length=", m.seq_length,
                               ", cp=", c.cp,
                               "); sequence parallelism splits each context-parallel rank's part over the "
                               "tensor-parallel ranks, so choose a sequence length that is a multiple of ",
                               c.tp * c.cp, ".");
    }
  }

  // Experts.
  if (m.num_experts == 0) {
    if (c.ep > 1)
      return Problem::sentence("ep=", c.ep,
                               " needs a mixture-of-experts model, but num_experts=0; set num_experts or use ep=1.");
  } else {
    if (m.num_experts % c.ep != 0)
      return Problem::sentence("ep=", c.ep, " does not divide num_experts=", m.num_experts,
                               "; each expert-parallel rank holds num_experts / ep whole experts.");
    if (m.expert_ffn() % c.etp != 0)
      return Problem::sentence("etp=", c.etp, " does not divide the expert ffn hidden size ", m.expert_ffn(),
                               "; each expert-tensor-parallel rank holds an equal slice of every expert's MLP.");
  }
  return {};
}

namespace detail {
constexpr Problem world_size_problem(const ParallelConfig& c, int world_size) {
  if (world_size < 0 || world_size == c.world_size()) return {};
  const int model = c.tp * c.pp * c.cp;
  if (world_size > 0 && world_size % model == 0)
    return Problem::sentence("the layout tp=", c.tp, " x pp=", c.pp, " x dp=", c.dp, " x cp=", c.cp, " needs ",
                             c.world_size(), " ranks, but world_size=", world_size, "; set dp=", world_size / model,
                             " so that tp*pp*dp*cp equals the world size.");
  return Problem::sentence("the layout tp=", c.tp, " x pp=", c.pp, " x dp=", c.dp, " x cp=", c.cp, " needs ", c.world_size(),
                           " ranks, but world_size=", world_size, ", which tp*pp*cp=", model,
                           " does not divide; change tp, pp or cp, or the number of ranks.");
}
}  // namespace detail

// Throws ConfigError with the first problem; world_size >= 0 also checks that the layout uses
// exactly that many ranks.
constexpr void check(const ParallelConfig& c, int world_size = -1) {
  raise_if(validate(c));
  raise_if(detail::world_size_problem(c, world_size));
}
constexpr void check(const ParallelConfig& c, const ModelDims& m, int world_size = -1) {
  raise_if(validate(c, m));
  raise_if(detail::world_size_problem(c, world_size));
}

// The configuration itself, once checked: in a constant expression an invalid one does not compile.
constexpr ParallelConfig checked(const ParallelConfig& c, int world_size = -1) {
  check(c, world_size);
  return c;
}
constexpr ParallelConfig checked(const ParallelConfig& c, const ModelDims& m, int world_size = -1) {
  check(c, m, world_size);
  return c;
}

STRATA_NAMESPACE_END
