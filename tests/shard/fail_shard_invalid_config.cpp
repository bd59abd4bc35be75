// Must not compile: an invalid configuration (tp=3 does not divide 32 heads) used in a constant
// expression. With STRATA_FAILTEST_CONTROL the configuration is valid and the file compiles.
#include <strata/shard/parallel_config.hpp>

#ifdef STRATA_FAILTEST_CONTROL
constexpr int kTensorParallel = 2;
#else
constexpr int kTensorParallel = 3;
#endif

constexpr strata::ParallelConfig kLayout =
    strata::checked(strata::ParallelConfig{.tp = kTensorParallel, .dp = 2},
                    strata::ModelDims{.num_layers = 4,
                                      .hidden_size = 1024,
                                      .num_attention_heads = 32,
                                      .ffn_hidden_size = 4096,
                                      .vocab_size = 50257,
                                      .seq_length = 1024});
static_assert(kLayout.world_size() > 0);
