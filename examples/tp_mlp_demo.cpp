// tp_mlp_demo: the smallest tensor-parallel program. A two-layer MLP (ColumnParallelLinear, GELU,
// RowParallelLinear) runs on 2 ranks (threads) and on 1; outputs and gathered gradients match.
#include <cmath>
#include <cstdio>
#include <mutex>
#include <vector>

#include <strata/strata.hpp>

using namespace strata;

struct Policy : default_policy {
  using element = double;
};

struct Result {
  std::vector<double> output, fc1_grad;
};

Result run(int tp) {
  Result result;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    ColumnParallelLinear<Policy> fc1(ctx, "fc1", 16, 64);  // weight [64/tp, 16]
    RowParallelLinear<Policy> fc2(ctx, "fc2", 64, 16);     // weight [16, 64/tp]
    fc1.init(ctx, 42, 0.2);
    fc2.init(ctx, 42, 0.2);
    Tensor<double> x(Shape{8, 2, 16});  // (seq, batch, hidden)
    for (index_t i = 0; i < x.numel(); ++i) x[i] = rng::normal(7, static_cast<std::uint64_t>(i));
    auto [h, s1] = fc1.forward(ctx, Activation<double, layout::replicated>(x));  // sharded<-1>
    Tensor<double> a(h.shape());
    cpu::gelu_forward(h.data(), h.tensor.numel(), a.data());
    auto [y, s2] = fc2.forward(ctx, Activation<double, layout::sharded<-1>>(a));  // all-reduced: replicated
    auto dh = fc2.backward(ctx, s2, y);  // d(0.5 |y|^2) / dy = y
    Tensor<double> dpre(dh.shape());
    cpu::gelu_backward(dh.data(), h.data(), h.tensor.numel(), dpre.data());
    fc1.backward(ctx, s1, Activation<double, layout::sharded<-1>>(dpre));
    auto grad = gather_global(ctx.tp, fc1.weight(), fc1.weight().grad);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      result.output.assign(y.tensor.data(), y.tensor.data() + y.tensor.numel());
      result.fc1_grad.assign(grad.data(), grad.data() + grad.numel());
    }
  });
  return result;
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
  return std::sqrt(d / n);
}

int main() {
  const Result one = run(1), two = run(2);
  const double out_err = relative_error(two.output, one.output), grad_err = relative_error(two.fc1_grad, one.fc1_grad);
  std::printf("tp=2 MLP vs unsharded: output relative error %.2e, fc1 weight gradient relative error %.2e -> %s\n",
              out_err, grad_err, out_err <= 1e-12 && grad_err <= 1e-12 ? "match" : "MISMATCH");
  return out_err <= 1e-12 && grad_err <= 1e-12 ? 0 : 1;
}
