#!/usr/bin/env bash
# bench/build_times.sh [out-dir]: cold build times of what a newcomer and a user build first, one
# row per (what, cores), as a table. Cold: a fresh build folder of a fresh copy of the sources, and
# ccache off (CCACHE_DISABLE=1), so no earlier build helps.
#
#   demo      README command 1 without its apt-get: configure with -DSTRATA_TRAINER_ELEMENTS=float,
#             build train_gpt, run it until its first logged iteration (--log-interval 1), timed
#             from the configure; also the build of the four element types' instances (the default)
#             for comparison ("demo, all types")
#   user TU   examples/custom_model.cpp: a user's translation unit that defines a model from the
#             public layers and trains it (configure with STRATA_BUILD_EXAMPLES, build custom_model)
#   cuda      train_gpt with --device cuda (STRATA_CUDA_TRAINERS, the cuDNN frontend when
#             STRATA_CUDNN_FRONTEND_DIR names it), where nvcc is found; its element types from
#             STRATA_BUILD_TIMES_CUDA_ELEMENTS (default "bf16"). The compiled way (strata::cuda_kernels
#             and the host compiler) unless STRATA_BUILD_TIMES_CUDA_HEADER_ONLY=1 (nvcc, header-only)
#   cuda-user strata::cuda_kernels alone (a row of its own), then examples/llama_cuda.cpp in the same
#             folder: a user's translation unit that trains a Llama on GPUs, host compiler
#   ci        `bash .ci/run` in the fresh copy (STRATA_CI_SKIP_APT=1): asked for by name only
#             (STRATA_BUILD_TIMES_WHAT=ci), as it takes about 12 minutes on 2 cores
#
# STRATA_BUILD_TIMES_CORES (default: "2" and this machine's count) lists the core counts: each row
# builds with -j<cores> under `taskset` on the first <cores> CPUs. STRATA_BUILD_TIMES_WHAT picks rows
# ("demo demo-all user cuda cuda-user" by default). Logs: <out-dir> (default build-times). It measures and
# prints; it asserts nothing about time.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${1:-$repo/build-times}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export CCACHE_DISABLE=1
all=$(nproc)
cores_list=${STRATA_BUILD_TIMES_CORES:-$( [[ $all == 2 ]] && echo 2 || echo "2 $all" )}
what_list=${STRATA_BUILD_TIMES_WHAT:-demo demo-all user cuda cuda-user}
# The CMake generator of every row: STRATA_BUILD_TIMES_GENERATOR, else CMake's default (Unix Makefiles).
generator=(${STRATA_BUILD_TIMES_GENERATOR:+-G "$STRATA_BUILD_TIMES_GENERATOR"})
echo "generator: ${STRATA_BUILD_TIMES_GENERATOR:-the CMake default}" >"$out/generator.txt"
: >"$out/rows.tsv"

# fresh SOURCE copy of the files git tracks or would track (no build folders, no caches, nothing ignored)
fresh() {
  local dir=$1
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents {} "$dir/") 2>/dev/null ||
    (cd "$repo" && tar cf - --exclude='./build*' --exclude=./.git . | tar xf - -C "$dir")
}
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
now() { date +%s.%N; }

for cores in $cores_list; do
  cpus="0-$((cores - 1))"
  for what in $what_list; do
    src="$out/src-$what-$cores"
    fresh "$src"
    log="$out/$what-$cores.log"
    start=$(now)
    status=ok
    case $what in
      demo|demo-all)
        elements=float
        [[ $what == demo-all ]] && elements="float;double;bf16;fp16"
        taskset -c "$cpus" cmake -S "$src" -B "$src/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF \
          "-DSTRATA_TRAINER_ELEMENTS=$elements" >"$log" 2>&1 &&
          taskset -c "$cpus" cmake --build "$src/build" -j"$cores" --target train_gpt >>"$log" 2>&1 || status=failed
        built=$(now)
        first=""
        if [[ $what == demo && $status == ok ]]; then
          # the README's demo flags, stopped at its first logged iteration
          (cd "$src" && taskset -c "$cpus" build/examples/train_gpt --tensor-model-parallel-size 2 --sequence-parallel \
            --global-batch-size 8 --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --train-iters 1 --eval-iters 0 \
            --sample-tokens 0) >>"$log" 2>&1 || status=failed
          first=$(seconds "$start" "$(now)")
        fi
        ;;
      user)
        taskset -c "$cpus" cmake -S "$src" -B "$src/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF >"$log" 2>&1 &&
          taskset -c "$cpus" cmake --build "$src/build" -j"$cores" --target custom_model >>"$log" 2>&1 || status=failed
        built=$(now)
        first=""
        ;;
      cuda)
        if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
          printf '%s\t%s\t%s\t%s\t%s\n' "$what" "$cores" "-" "-" "skipped: no nvcc" >>"$out/rows.tsv"
          continue
        fi
        taskset -c "$cpus" cmake -S "$src" -B "$src/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF \
          -DSTRATA_CUDA_TRAINERS=ON "-DSTRATA_TRAINER_ELEMENTS=${STRATA_BUILD_TIMES_CUDA_ELEMENTS:-bf16}" \
          "-DSTRATA_CUDA_HEADER_ONLY=$([[ ${STRATA_BUILD_TIMES_CUDA_HEADER_ONLY:-0} == 1 ]] && echo ON || echo OFF)" \
          ${STRATA_CUDNN_FRONTEND_DIR:+-DSTRATA_CUDNN_FRONTEND_DIR=$STRATA_CUDNN_FRONTEND_DIR} >"$log" 2>&1 &&
          taskset -c "$cpus" cmake --build "$src/build" -j"$cores" --target train_gpt >>"$log" 2>&1 || status=failed
        built=$(now)
        first=""
        ;;
      cuda-user)
        # strata::cuda_kernels built once (its own row), then the user's translation unit alone:
        # examples/llama_cuda.cpp, a Llama trained on GPUs, compiled by the host compiler and linked
        # against the library.
        if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
          printf '%s\t%s\t%s\t%s\t%s\n' "$what" "$cores" "-" "-" "skipped: no nvcc" >>"$out/rows.tsv"
          continue
        fi
        taskset -c "$cpus" cmake -S "$src" -B "$src/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF \
          -DSTRATA_CUDA_TRAINERS=ON ${STRATA_CUDNN_FRONTEND_DIR:+-DSTRATA_CUDNN_FRONTEND_DIR=$STRATA_CUDNN_FRONTEND_DIR} >"$log" 2>&1 &&
          taskset -c "$cpus" cmake --build "$src/build" -j"$cores" --target strata_cuda_kernels >>"$log" 2>&1 || status=failed
        built=$(now)
        printf '%s\t%s\t%s\t%s\t%s\n' "cuda-kernels (strata::cuda_kernels, once)" "$cores" "$(seconds "$start" "$built")" "-" "$status" >>"$out/rows.tsv"
        start=$built
        [[ $status == ok ]] && { taskset -c "$cpus" cmake --build "$src/build" -j"$cores" --target llama_cuda >>"$log" 2>&1 || status=failed; }
        built=$(now)
        first=""
        ;;
      ci)
        # `bash .ci/run` itself, without its apt-get (STRATA_CI_SKIP_APT=1), on <cores> CPUs: the
        # README's test command (which passes -j2 / -j3 itself), the header checks, the GPU build
        # where nvcc is found and the benchmarks' build. Not in the default rows (about 12 minutes).
        (cd "$src" && STRATA_CI_SKIP_APT=1 STRATA_CI_JOBS=$cores taskset -c "$cpus" bash .ci/run) >"$log" 2>&1 || status=failed
        built=$(now)
        first=""
        ;;
      *) echo "build_times: unknown row '$what'" >&2; continue ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\n' "$what" "$cores" "$(seconds "$start" "$built")" "${first:--}" "$status" >>"$out/rows.tsv"
    rm -rf "$src"
  done
done

{
  echo "| what | cores | configure + build (s) | to the first iteration (s) | status |"
  echo "| --- | ---: | ---: | ---: | --- |"
  awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$out/rows.tsv"
} | tee "$out/table.md"
