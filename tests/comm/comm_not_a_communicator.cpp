// Must fail to compile: a type without all_reduce checked with check_communicator stops at the
// sentence "... does not model strata::Communicator: it lacks all_reduce(std::span<T>, ReduceOp) ...".
// With STRATA_FAILTEST_CONTROL the checked type is the in-process communicator, which compiles.
#include <string_view>

#include <strata/comm.hpp>

namespace {

struct OnlyQueries {
  int rank() const { return 0; }
  int size() const { return 1; }
  std::string_view name() const { return "world"; }
};

#ifdef STRATA_FAILTEST_CONTROL
using Checked = strata::inprocess::communicator;
#else
using Checked = OnlyQueries;
#endif

static_assert(strata::check_communicator<Checked>());

}  // namespace
