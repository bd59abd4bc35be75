# bench/cudnn_frontend_check.sh: sourced by the GPU bench scripts once their build exists.
#
# warn_without_cudnn_frontend <build-dir> <out-dir>: a build configured without the cuDNN frontend
# headers has no cuDNN attention, and strata's own flash kernels run (several times slower at the
# benchmarks' sizes, bench/RESULTS.md). Every figure depends on it, so say so on the terminal and in
# <out-dir>/warning.txt.
warn_without_cudnn_frontend() {
  if grep -q "^CudnnFrontend_INCLUDE_DIR:PATH=.*NOTFOUND" "$1/CMakeCache.txt" 2>/dev/null; then
    echo "warning: $1 was configured without the cuDNN frontend headers (no cuDNN attention; strata's own flash" \
         "kernels run); point STRATA_CUDNN_FRONTEND_DIR at them (pip's nvidia-cudnn-frontend) and build again" |
      tee "$2/warning.txt"
  fi
}
