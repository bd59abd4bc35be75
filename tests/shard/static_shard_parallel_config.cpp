// Compile-only checks of strata/shard/parallel_config.hpp: validation in constant expressions.
#include <strata/shard/parallel_config.hpp>

#include <array>
#include <string_view>

namespace {
using strata::ModelDims;
using strata::ParallelConfig;

constexpr ModelDims kLlama7b{.num_layers = 32,
                             .hidden_size = 4096,
                             .num_attention_heads = 32,
                             .num_query_groups = 8,
                             .ffn_hidden_size = 11008,
                             .vocab_size = 32000,
                             .seq_length = 4096};

static_assert(ParallelConfig{}.world_size() == 1);
static_assert(ParallelConfig{.tp = 2, .pp = 2}.world_size() == 4);
static_assert(ParallelConfig{.tp = 2, .pp = 4, .dp = 2, .cp = 2}.world_size() == 32);
static_assert(ParallelConfig{.tp = 2, .dp = 4, .ep = 4, .etp = 1}.expert_dp() == 2);

static_assert(strata::validate(ParallelConfig{.tp = 8, .pp = 4, .dp = 2}, kLlama7b).ok());
static_assert(strata::validate(ParallelConfig{.tp = 8, .pp = 4, .dp = 2}, kLlama7b).message().empty());
static_assert(strata::validate(ParallelConfig{.tp = 3}, kLlama7b).message() ==
              "tp=3 does not divide num_attention_heads=32; each tensor-parallel rank holds whole heads, so choose tp "
              "among the divisors of 32.");
static_assert(strata::validate(ParallelConfig{.tp = 16}, kLlama7b).message().starts_with(
    "num_query_groups=8 is smaller than tp=16; query groups must be a multiple of tp"));
static_assert(strata::validate(ParallelConfig{.tp = 0}).message().starts_with("tp=0 is not a valid size"));
static_assert(strata::validate(ParallelConfig{.dp = 2, .ep = 4}).message().starts_with("etp=1 times ep=4 is 4"));
static_assert(strata::validate(ParallelConfig{.pp = 3}, kLlama7b).message().starts_with("pp=3 does not divide num_layers=32"));
static_assert(strata::validate(ParallelConfig{.pp = 64}, kLlama7b).message().starts_with("pp=64 exceeds num_layers=32"));
static_assert(strata::validate(ParallelConfig{.cp = 3}, kLlama7b).message().starts_with("2*cp=6 does not divide seq_length=4096"));

constexpr ModelDims kMoe{.num_layers = 16,
                         .hidden_size = 2048,
                         .num_attention_heads = 16,
                         .ffn_hidden_size = 8192,
                         .vocab_size = 50257,
                         .seq_length = 2048,
                         .num_experts = 8};
static_assert(strata::validate(ParallelConfig{.tp = 2, .dp = 4, .ep = 4, .etp = 2}, kMoe).ok());
static_assert(strata::validate(ParallelConfig{.dp = 3, .ep = 3}, kMoe).message().starts_with("ep=3 does not divide num_experts=8"));
static_assert(strata::validate(ParallelConfig{.dp = 2, .ep = 2}, kLlama7b).message().starts_with("ep=2 needs a mixture-of-experts model"));

// checked() in a constant expression gives the configuration back, usable as a constant.
constexpr ParallelConfig kLayout = strata::checked(ParallelConfig{.tp = 4, .pp = 2, .dp = 2}, kLlama7b, 16);
std::array<int, kLayout.world_size()> per_rank_counter{};
static_assert(per_rank_counter.size() == 16);
template <ParallelConfig C>
struct Job {
  static constexpr int ranks = C.world_size();
};
static_assert(Job<kLayout>::ranks == 16);
}  // namespace
