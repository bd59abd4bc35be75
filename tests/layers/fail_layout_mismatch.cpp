// Must fail to compile: a ColumnParallelLinear that gathers its output (replicated) feeding a
// RowParallelLinear that expects an input sharded on its last dimension. The control build pairs
// it with a RowParallelLinear that splits a replicated input itself, which compiles.
#include <strata/layers.hpp>
#include <strata/policy.hpp>

using namespace strata;

void build(ParallelContext<inprocess::communicator>& ctx) {
  ColumnParallelLinear<default_policy, ColumnOptions{.gather_output = true}> column(ctx, "fc1", 8, 16);
#ifdef STRATA_FAILTEST_CONTROL
  RowParallelLinear<default_policy, RowOptions{.input_is_parallel = false}> row(ctx, "fc2", 16, 8);
#else
  RowParallelLinear<default_policy, RowOptions{.input_is_parallel = true}> row(ctx, "fc2", 16, 8);
#endif
  Activation<float, layout::replicated> x(Tensor<float>(Shape{4, 1, 8}));
  auto [h, saved1] = column.forward(ctx, x);
  auto [y, saved2] = row.forward(ctx, h);
  (void)y;
}
