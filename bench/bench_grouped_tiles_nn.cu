// bench/bench_grouped_tiles_nn.cu: the candidates of bench_grouped_tiles for B [k, n].
#include "bench_grouped_tiles_kernels.cuh"

std::vector<strata_bench::tile_candidate> strata_bench::candidates_nn() {
  return all_candidates<strata::cuda::sm90::kernel::RowsNN>();
}
