// Uses the installed strata headers through find_package(strata): a tensor, a view, the RNG and
// the error type, so a missing header or a broken include path fails the package test.
#include <strata/core.hpp>

#include <cstdio>

int main() {
  strata::Tensor<float> t({2, 3}, 1.5f);
  strata::TensorView<const float> v = t.view();
  float sum = 0;
  for (strata::index_t i = 0; i < v.numel(); ++i) sum += v[i];

  bool caught = false;
  try {
    t.reshape({4, 2});
  } catch (const strata::ShapeError&) {
    caught = true;
  }
  double u = strata::rng::uniform(strata::rng::parameter_key(1234, "weight"), 0);

  std::printf("strata %d.%d.%d: sum=%g shape=%s reshape-error=%d uniform=%.6f\n", STRATA_VERSION_MAJOR,
              STRATA_VERSION_MINOR, STRATA_VERSION_PATCH, sum, t.shape().str().c_str(), caught ? 1 : 0, u);
  return (sum == 9.0f && caught && u > 0.0 && u < 1.0) ? 0 : 1;
}
