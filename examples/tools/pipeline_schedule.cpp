// pipeline_schedule: prints the table of a pipeline schedule, its transfers, the proof's verdict,
// the peak of micro-batch chunks in flight per rank and the bubble fraction of the unit-cost model
// (forward 1 per chunk, fused backward 2, split backward 1 + 1).
//
//   pipeline_schedule 1f1b 4 8
//   pipeline_schedule interleaved 4 8 2
//   pipeline_schedule zero-bubble 4 8
//   pipeline_schedule --compare 4 8 2     # every schedule side by side
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <strata/pipeline.hpp>

namespace {

using namespace strata::pipeline;

int to_int(const char* text, const char* what) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0') {
    std::fprintf(stderr, "pipeline_schedule: %s '%s' is not an integer\n", what, text);
    std::exit(2);
  }
  return static_cast<int>(value);
}

void print_table(const ScheduleShape& shape) {
  const auto table = schedule_table(shape);
  for (int r = 0; r < shape.pp; ++r) {
    std::printf("rank %d:", r);
    for (const Action& a : table[static_cast<std::size_t>(r)]) {
      std::printf(" %s%d", std::string(op_name(a.op)).c_str(), a.micro_batch);
      if (shape.virtual_stages > 1) std::printf(".%d", a.chunk);
    }
    std::printf("\n");
  }
}

int report(const ScheduleShape& shape, bool verbose) {
  const ScheduleReport r = verify_schedule(shape);
  if (!r.ok()) {
    std::printf("%-12s pp=%d m=%d v=%d: rejected: %s\n", std::string(schedule_name(shape.kind)).c_str(), shape.pp,
                shape.micro_batches, shape.virtual_stages, std::string(r.problem.message()).c_str());
    return 1;
  }
  if (verbose) print_table(shape);
  std::printf("%-12s pp=%d m=%d v=%d: proved (order, matching, no deadlock); bubble %.4f (makespan %ld, work %ld); "
              "peak in flight per rank:",
              std::string(schedule_name(shape.kind)).c_str(), shape.pp, shape.micro_batches, shape.virtual_stages, r.bubble_fraction(),
              r.makespan, r.work);
  for (int i = 0; i < shape.pp; ++i) std::printf(" %d", r.peak_in_flight[static_cast<std::size_t>(i)]);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::fprintf(stderr,
                 "usage: pipeline_schedule gpipe|1f1b|interleaved|zero-bubble PP MICRO_BATCHES [VIRTUAL_STAGES]\n"
                 "       pipeline_schedule --compare PP MICRO_BATCHES [VIRTUAL_STAGES]\n");
    return 2;
  }
  const int pp = to_int(argv[2], "PP"), m = to_int(argv[3], "MICRO_BATCHES");
  const int v = argc == 5 ? to_int(argv[4], "VIRTUAL_STAGES") : 1;
  if (std::string_view(argv[1]) == "--compare") {
    int failed = 0;
    for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zero_bubble})
      failed += report({k, pp, m, k == ScheduleKind::interleaved ? v : 1}, false);
    return failed == 0 ? 0 : 1;
  }
  ScheduleKind kind{};
  if (!parse_schedule_kind(argv[1], kind)) {
    std::fprintf(stderr, "pipeline_schedule: unknown schedule '%s'; use gpipe, 1f1b, interleaved or zero-bubble\n", argv[1]);
    return 2;
  }
  return report({kind, pp, m, v}, true);
}
