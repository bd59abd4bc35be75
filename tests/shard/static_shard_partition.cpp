// Compile-only checks of strata/shard/partition.hpp: results are constants, and constants in give
// constants out (usable as array bounds and template arguments).
#include <strata/shard/partition.hpp>

#include <array>

namespace {
using strata::index_t;
using strata::Range;

// partition: the first n % parts pieces get one extra element.
static_assert(strata::partition(10, 3, 0) == Range{0, 4});
static_assert(strata::partition(10, 3, 1) == Range{4, 7});
static_assert(strata::partition(10, 3, 2) == Range{7, 10});
static_assert(strata::partition(2, 4, 3) == Range{2, 2} && strata::partition(2, 4, 3).empty());
static_assert(strata::partition(0, 1, 0).size() == 0);
static_assert(strata::partition(7, 7, 6) == Range{6, 7});

constexpr bool pieces_tile(index_t n, int parts) {
  index_t expected_begin = 0;
  for (int i = 0; i < parts; ++i) {
    const Range r = strata::partition(n, parts, i);
    if (r.begin != expected_begin || r.size() < n / parts || r.size() > n / parts + 1) return false;
    expected_begin = r.end;
  }
  return expected_begin == n;
}
static_assert(pieces_tile(100, 7) && pieces_tile(3, 8) && pieces_tile(64, 8) && pieces_tile(1, 1));

static_assert(strata::partition_even(12, 4, 3) == Range{9, 12});
static_assert(strata::partition_even(0, 3, 1).empty());

// Uneven pipeline split (Megatron's first/last stage layer counts).
static_assert(strata::stage_layers(32, 4, 0) == Range{0, 8});
static_assert(strata::stage_layers(32, 4, 3) == Range{24, 32});
static_assert(strata::stage_layers(30, 4, 0, 6) == Range{0, 6});  // 24 left over 3 stages
static_assert(strata::stage_layers(30, 4, 1, 6) == Range{6, 14});
static_assert(strata::stage_layers(30, 4, 3, 6) == Range{22, 30});
static_assert(strata::stage_layers(30, 4, 0, -1, 3) == Range{0, 9});  // 27 left over 3 stages
static_assert(strata::stage_layers(30, 4, 2, -1, 3) == Range{18, 27});
static_assert(strata::stage_layers(30, 4, 3, -1, 3) == Range{27, 30});
static_assert(strata::stage_layers(26, 5, 0, 5, 3) == Range{0, 5});  // 18 left over 3 stages
static_assert(strata::stage_layers(26, 5, 1, 5, 3) == Range{5, 11});
static_assert(strata::stage_layers(26, 5, 3, 5, 3) == Range{17, 23});
static_assert(strata::stage_layers(26, 5, 4, 5, 3) == Range{23, 26});
static_assert(strata::stage_layers(10, 2, 1, 7, 3) == Range{7, 10});
static_assert(strata::stage_layers(5, 1, 0) == Range{0, 5});
static_assert(strata::stage_has_embedding(0, 4) && !strata::stage_has_embedding(3, 4));
static_assert(strata::stage_has_output(3, 4) && !strata::stage_has_output(0, 4));
static_assert(strata::stage_has_embedding(0, 1) && strata::stage_has_output(0, 1));

// Vocabulary padding: GPT-2's 50257 tokens pad to 50304 (a multiple of 128), to 50432 under tp=2
// (a multiple of 256), to 51200 under tp=8 (a multiple of 1024).
static_assert(strata::padded_vocab_size(50257, 1) == 50304);
static_assert(strata::padded_vocab_size(50257, 2) == 50432);
static_assert(strata::padded_vocab_size(50257, 8) == 51200);
static_assert(strata::padded_vocab_size(32000, 1) == 32000);
static_assert(strata::padded_vocab_size(32000, 4, 64) == 32000);
static_assert(strata::padded_vocab_size(100, 3, 1) == 102);
static_assert(strata::vocab_range(50432, 2, 1) == Range{25216, 50432});

// Heads and query groups per rank.
static_assert(strata::heads_per_rank(32, 4) == 8);
static_assert(strata::query_groups_per_rank(8, 8) == 1);

// Static in, static out.
constexpr int kHeads = strata::heads_per_rank(64, 8);
std::array<float, strata::heads_per_rank(64, 8)> per_head_scale{};
static_assert(per_head_scale.size() == 8 && kHeads == 8);
template <index_t Rows>
struct EmbeddingShard {
  static constexpr index_t rows = Rows;
};
using Shard = EmbeddingShard<strata::vocab_range(strata::padded_vocab_size(50257, 4), 4, 3).size()>;
static_assert(Shard::rows == 12672);  // 50688 / 4
char layer_flags[strata::stage_layers(30, 4, 1, 6).size()];
static_assert(sizeof(layer_flags) == 8);
}  // namespace
