// Must fail to compile: a norm fed the hidden-sharded output of a ColumnParallelLinear (it needs
// the whole hidden dimension). The control build gathers the output first.
#include <strata/layers.hpp>
#include <strata/policy.hpp>

using namespace strata;

void build(ParallelContext<inprocess::communicator>& ctx) {
  ColumnParallelLinear<default_policy> column(ctx, "fc1", 8, 16);
  RmsNorm<default_policy> norm(ctx, "norm", 16);
  Activation<float, layout::replicated> x(Tensor<float>(Shape{4, 1, 8}));
  auto [h, saved1] = column.forward(ctx, x);
#ifdef STRATA_FAILTEST_CONTROL
  auto [y, saved2] = norm.forward(ctx, gather_from_tensor_parallel(ctx.tp, h));
#else
  auto [y, saved2] = norm.forward(ctx, h);
#endif
  (void)y;
}
