// Must fail to compile, with check_backend naming the missing family in its sentence: a backend
// that has every entry point but attention_forward / attention_backward. With
// STRATA_FAILTEST_CONTROL the checked backend is cpu::backend, which compiles.
#include <strata/backend/cpu/backend.hpp>

namespace {

// Every entry point of the CPU backend, with the attention family hidden.
struct NoAttention : strata::cpu::backend {
  void attention_forward() = delete;
  void attention_backward() = delete;
};

#ifdef STRATA_FAILTEST_CONTROL
using Checked = strata::cpu::backend;
#else
using Checked = NoAttention;
#endif

static_assert(strata::check_backend<Checked>());

}  // namespace
