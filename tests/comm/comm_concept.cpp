// Compile-only: which types model strata::Communicator, and the element types it moves.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <strata/comm.hpp>
#include <strata/comm/parallel_context.hpp>

namespace {

using strata::inprocess::communicator;

static_assert(strata::Communicator<communicator>);
static_assert(strata::is_communicator_v<communicator>);
static_assert(strata::check_communicator<communicator>());

// The concept checks float and double; the in-process backend moves every CommElement.
template <class T>
concept moves_element = strata::detail::communicator_moves<communicator, T>;
static_assert(moves_element<float> && moves_element<double> && moves_element<strata::bf16> &&
              moves_element<strata::fp16> && moves_element<std::int32_t> && moves_element<std::int64_t> &&
              moves_element<std::uint8_t>);
static_assert(!moves_element<char>, "char is not a CommElement.");

static_assert(strata::CommElement<std::int64_t> && !strata::CommElement<unsigned>);
static_assert(strata::reduce_op_name(strata::ReduceOp::avg) == std::string_view("avg"));

// A type that has everything but split is not a communicator.
struct NoSplit {
  using space = strata::space::host;
  int rank() const { return 0; }
  int size() const { return 1; }
  std::string_view name() const { return "x"; }
  template <class T> void all_reduce(std::span<T>, strata::ReduceOp) {}
  template <class T> void all_gather(std::span<const T>, std::span<T>) {}
  template <class T> void all_gather_v(std::span<const T>, std::span<T>, std::span<const std::size_t>) {}
  template <class T> void reduce_scatter(std::span<const T>, std::span<T>, strata::ReduceOp) {}
  template <class T> void reduce_scatter_v(std::span<const T>, std::span<T>, std::span<const std::size_t>, strata::ReduceOp) {}
  template <class T> void broadcast(std::span<T>, int) {}
  template <class T> void send(std::span<const T>, int) {}
  template <class T> void recv(std::span<T>, int) {}
  template <class T> void all_to_all(std::span<const T>, std::span<const std::size_t>, std::span<T>, std::span<const std::size_t>) {}
  void barrier() {}
};
static_assert(!strata::is_communicator_v<NoSplit>);
static_assert(strata::detail::communicator_moves<NoSplit, float>);
static_assert(!strata::detail::communicator_has_barrier_and_split<NoSplit>);

// The in-process communicator works in host memory and brings the CPU backend as its default.
static_assert(std::is_same_v<communicator::space, strata::space::host>);
static_assert(std::is_same_v<communicator::default_device, strata::cpu::backend>);
static_assert(std::is_same_v<strata::ParallelContext<communicator>::device_type, strata::cpu::backend>);

// A communicator that names no space moves host memory; one that names space::cuda takes
// device_span, and with std::span it would not be a communicator.
static_assert(std::is_same_v<strata::communicator_space_t<communicator>, strata::space::host>);
static_assert(std::is_same_v<strata::comm_span_t<float, communicator>, std::span<float>>);

struct DeviceComm : NoSplit {
  using space = strata::space::cuda;
  DeviceComm split(int, int) { return *this; }
  DeviceComm split(int, int, std::string) { return *this; }
  template <class T> void all_reduce(strata::device_span<T>, strata::ReduceOp) {}
  template <class T> void all_gather(strata::device_span<const T>, strata::device_span<T>) {}
  template <class T> void all_gather_v(strata::device_span<const T>, strata::device_span<T>, std::span<const std::size_t>) {}
  template <class T> void reduce_scatter(strata::device_span<const T>, strata::device_span<T>, strata::ReduceOp) {}
  template <class T> void reduce_scatter_v(strata::device_span<const T>, strata::device_span<T>, std::span<const std::size_t>, strata::ReduceOp) {}
  template <class T> void broadcast(strata::device_span<T>, int) {}
  template <class T> void send(strata::device_span<const T>, int) {}
  template <class T> void recv(strata::device_span<T>, int) {}
  template <class T> void all_to_all(strata::device_span<const T>, std::span<const std::size_t>, strata::device_span<T>, std::span<const std::size_t>) {}
};
static_assert(strata::is_communicator_v<DeviceComm>);
static_assert(std::is_same_v<strata::comm_span_t<float, DeviceComm>, strata::device_span<float>>);
struct HostSpansOnADeviceComm : NoSplit {
  using space = strata::space::cuda;
  HostSpansOnADeviceComm split(int, int) { return *this; }
  HostSpansOnADeviceComm split(int, int, std::string) { return *this; }
};
static_assert(!strata::is_communicator_v<HostSpansOnADeviceComm>);

// The in-process send is buffered: a point-to-point batch is a no-op there.
static_assert(std::is_same_v<decltype(strata::batch_point_to_point(std::declval<communicator&>())), strata::unbatched>);

}  // namespace
