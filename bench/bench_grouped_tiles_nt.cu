// bench/bench_grouped_tiles_nt.cu: the candidates of bench_grouped_tiles for B [n, k].
#include "bench_grouped_tiles_kernels.cuh"

std::vector<strata_bench::tile_candidate> strata_bench::candidates_nt() {
  return all_candidates<strata::cuda::sm90::kernel::RowsNT>();
}
