#!/usr/bin/env bash
# bench/gpu_bench.sh [build-dir] [out-dir]: strata's GPT trainer beside the PyTorch peer on one GPU,
# in one command, on the shapes of GPT-2 124M and 350M (seq 1024, vocab 50304, bf16, random tokens),
# GPT 1.41B, and a Llama of 3.0B at seq 4096 (shape llama3B: 28 layers, hidden 3072, 24 heads in 8
# key/value groups, SwiGLU of width 8192, vocab 32000, rotary base 500000; train_llama beside the peer's
# --arch llama).
#
#   1. Builds what it needs when <build-dir> (default build-bench) has no CUDA train_gpt yet:
#      configure with CUDA, NCCL, cuDNN (STRATA_CUDNN_FRONTEND_DIR, or the nvidia-cudnn-frontend
#      Python package) and the CUPTI tracer, then build train_gpt, train_llama and strata_kernel_trace. CLI11's
#      headers: a system install, or CLI11_INCLUDE_DIR.
#   2. Per shape: strata (--mock-data-random, one GPU, STRATA_BENCH_ITERS iterations, tokens/s of the last
#      log interval), then the same run again under the CUPTI tracer with --profile (the per-kernel
#      table of iterations [10, 12) goes to <out-dir>/kernels-<shape>.md) whose losses must be
#      bit-identical to the first run's (determinism), then the peer bench/peers/torch_gpt.py
#      (torch.compile) with the same shape and batch.
#   3. Prints one table last: tokens/s, MFU (FLOPs per token 6 N_matmul + 6 L D T, the peer's count,
#      over a 989 TFLOP/s dense bf16 peak), peak device memory, time from launch to the first
#      finished step, and whether the two strata runs gave the same losses.
# Full logs: <out-dir> (default <build-dir>/bench-logs). STRATA_BENCH_SHAPES picks shapes (default
# "124M 350M"; a shape may name its batch, as in "350M:32", else it runs at its default batch:
# 124M 32, 350M 16, 1.4B 8, llama3B 2; strata and the peer always run at the same batch, and the
# logs of "350M:32" are named 350M-b32); STRATA_BENCH_PEER=0 skips the peer; STRATA_BENCH_ITERS (default 30);
# STRATA_BENCH_DTYPE=fp16 runs both in fp16 with dynamic loss scaling (strata --dtype fp16 from a
# scale of 2^16, the peer's --dtype fp16 with torch.amp.GradScaler, whose default start that is)
# instead of bf16. STRATA_BENCH_DTYPE=fp8 runs strata in bf16 with the transformer layers' linear GEMMs
# in FP8 (--fp8-format hybrid --fp8-recipe $STRATA_BENCH_FP8_RECIPE, default tensorwise) and the peer
# in bf16 with torchao's float8 (--float8 tensorwise); docs/FP8.md; STRATA_BENCH_FP8_FLAGS adds strata flags to
# those (for example --fp8-activation-codes-in-backward). STRATA_BENCH_NONDETERMINISTIC=1 adds a third strata run per shape with
# --no-deterministic-attention (cuDNN's attention backward adding dQ up with atomics): the cost of
# bit-identical runs, as its own row. STRATA_BENCH_GEMM_TUNING=1 adds two strata runs per shape with
# --gemm-tuning <out-dir>/gemm-<shape>.tuning (removed first): the first times cuBLASLt's candidates
# and writes the file, the second reads it; their row gives the second's tokens/s, both times to the
# first step (timing, reading), and whether the two gave the same losses.
# It measures and prints; it asserts nothing about speed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build-bench}
out=${2:-$build/bench-logs}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
iters=${STRATA_BENCH_ITERS:-30}
shapes=${STRATA_BENCH_SHAPES:-124M 350M}
dtype=${STRATA_BENCH_DTYPE:-bf16}
[[ $dtype == bf16 || $dtype == fp16 || $dtype == fp8 ]] || { echo "STRATA_BENCH_DTYPE=$dtype: use bf16, fp16 or fp8"; exit 1; }
# fp8: bf16 parameters and activations, FP8 GEMMs in the linear layers (strata) / torchao float8 (peer)
element=$dtype
fp8_args=()
peer_script=$here/peers/torch_gpt.py
peer_type=(--dtype "$element")
if [[ $dtype == fp8 ]]; then
  element=bf16
  fp8_args=(--fp8-format hybrid --fp8-recipe "${STRATA_BENCH_FP8_RECIPE:-tensorwise}")
  read -r -a extra_fp8 <<<"${STRATA_BENCH_FP8_FLAGS:-}"
  fp8_args+=("${extra_fp8[@]}")
  peer_script=${STRATA_BENCH_PEER_SCRIPT:-$peer_script}  # --float8 needs the torchao package
  peer_type=(--float8 tensorwise)
fi

# Libraries: CUDA's lib64 and the Python environment's nvidia-* packages (cuDNN, NCCL, cuBLAS, CUPTI).
libs=()
for dir in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/extras/CUPTI/lib64; do [[ -d $dir ]] && libs+=("$dir"); done
for module in nvidia.cudnn nvidia.nccl nvidia.cublas nvidia.cuda_runtime nvidia.cuda_cupti; do
  dir=$(python3 -c "import $module as m; print(list(m.__path__)[0])" 2>/dev/null) && [[ -d $dir/lib ]] && libs+=("$dir/lib")
done
LD_LIBRARY_PATH=$(IFS=:; echo "${libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

trainer=$build/examples/train_gpt
tracer=$build/bench/libstrata_kernel_trace.so
need_llama=0
[[ " $shapes " == *" llama3B"* ]] && need_llama=1
if [[ ! -x $trainer || ! -f $tracer || ( $need_llama == 1 && ! -x $build/examples/train_llama ) ]]; then
  echo "building $build (train_gpt, strata_kernel_trace) ..."
  frontend=${STRATA_CUDNN_FRONTEND_DIR:-$(python3 -c "import cudnn, os; print(os.path.dirname(cudnn.__file__))" 2>/dev/null)}
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF -DSTRATA_CUDA_TRAINERS=ON \
    -DSTRATA_BUILD_BENCH=ON -DSTRATA_BENCH_TRACE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    ${frontend:+-DSTRATA_CUDNN_FRONTEND_DIR=$frontend} ${CLI11_INCLUDE_DIR:+-DCLI11_INCLUDE_DIR=$CLI11_INCLUDE_DIR} \
    >"$out/configure.log" 2>&1 || { echo "configure failed: $out/configure.log"; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target train_gpt train_llama strata_kernel_trace >"$out/build.log" 2>&1 ||
    { echo "build failed: $out/build.log"; tail -20 "$out/build.log"; exit 1; }
fi
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; } >"$out/device.txt" 2>&1
source "$here/cudnn_frontend_check.sh"
warn_without_cudnn_frontend "$build" "$out"

shape_args() {  # layers hidden heads batch seq vocab
  case $1 in
    124M) echo "12 768 12 32 1024 50304" ;;
    350M) echo "24 1024 16 16 1024 50304" ;;
    1.4B) echo "24 2048 16 8 1024 50304" ;;
    llama3B) echo "28 3072 24 2 4096 32000" ;;
    *) echo "unknown shape $1 (124M, 350M, 1.4B, llama3B)" >&2; return 1 ;;
  esac
}

for spec in $shapes; do
  read -r L D H B T V <<<"$(shape_args "${spec%%:*}")" || exit 1
  shape=${spec%%:*}
  run=$trainer
  arch=()       # strata's model flags beyond the common ones
  peer_arch=()  # the peer's
  if [[ $shape == llama3B ]]; then
    run=$build/examples/train_llama
    arch=(--group-query-attention --num-query-groups 8 --ffn-hidden-size 8192 --rotary-base 500000)
    peer_arch=(--arch llama --kv-heads 8 --ffn 8192 --rope-theta 500000)
  fi
  if [[ $spec == *:* ]]; then
    B=${spec#*:}
    [[ $B =~ ^[1-9][0-9]*$ ]] || { echo "STRATA_BENCH_SHAPES: '$spec': the batch after ':' must be a positive integer"; exit 1; }
    shape=$shape-b$B
  fi
  common=(--device cuda --mock-data-random --num-layers "$L" --hidden-size "$D" --num-attention-heads "$H" --seq-length "$T"
          --vocab-size "$V" "${arch[@]}" --micro-batch-size "$B" --global-batch-size "$B" --train-iters "$iters" --log-interval 10
          --eval-iters 0 --sample-tokens 0 --lr 6e-4 --lr-warmup-iters 2 --seed 1234 --dtype "$element" "${fp8_args[@]}"
          --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.1 --adam-beta2 0.95 --lr-decay-style cosine)
  # fp16: the loss scaler starts where torch.amp.GradScaler does (2^16) rather than at Megatron's 2^32,
  # whose first dozens of iterations would overflow and be skipped.
  [[ $dtype == fp16 ]] && common+=(--initial-loss-scale 65536)
  echo "strata $shape ..."
  rm -f "$out/strata-$shape-1.jsonl" "$out/strata-$shape-2.jsonl"
  timeout 600 "$run" "${common[@]}" --log-jsonl "$out/strata-$shape-1.jsonl" >"$out/strata-$shape.log" 2>&1
  echo "exit $?" >>"$out/strata-$shape.log"
  STRATA_TRACE_OUT="$out/kernels-$shape.md" CUDA_INJECTION64_PATH="$tracer" timeout 600 "$run" "${common[@]}" \
    --profile --profile-step-start 10 --profile-step-end 12 --log-jsonl "$out/strata-$shape-2.jsonl" \
    >"$out/strata-$shape-traced.log" 2>&1
  echo "exit $?" >>"$out/strata-$shape-traced.log"
  if [[ ${STRATA_BENCH_NONDETERMINISTIC:-0} != 0 ]]; then
    timeout 600 "$run" "${common[@]}" --no-deterministic-attention >"$out/strata-$shape-nd.log" 2>&1
    echo "exit $?" >>"$out/strata-$shape-nd.log"
  fi
  if [[ ${STRATA_BENCH_GEMM_TUNING:-0} != 0 ]]; then
    rm -f "$out/gemm-$shape.tuning" "$out/strata-$shape-tuned-1.jsonl" "$out/strata-$shape-tuned-2.jsonl"
    for k in 1 2; do
      timeout 600 "$run" "${common[@]}" --gemm-tuning "$out/gemm-$shape.tuning" \
        --log-jsonl "$out/strata-$shape-tuned-$k.jsonl" >"$out/strata-$shape-tuned-$k.log" 2>&1
      echo "exit $?" >>"$out/strata-$shape-tuned-$k.log"
    done
  fi
  if [[ ${STRATA_BENCH_PEER:-1} != 0 ]]; then
    echo "peer $shape ..."
    timeout 600 python3 "$peer_script" --layers "$L" --heads "$H" --hidden "$D" --batch "$B" --seq "$T" --vocab "$V" \
      "${peer_arch[@]}" "${peer_type[@]}" \
      >"$out/peer-$shape.log" 2>&1
    echo "exit $?" >>"$out/peer-$shape.log"
  fi
done

python3 - "$out" "$dtype" $shapes <<'PY'
import json, re, sys, os
out, dtype, shapes = sys.argv[1], sys.argv[2], sys.argv[3:]
# layers, hidden, heads, batch, seq, vocab; the FLOPs' count leaves out the embeddings that do no
# matmul work: GPT's position table, Llama's untied token table
dims = {"124M": (12, 768, 12, 32, 1024, 50304), "350M": (24, 1024, 16, 16, 1024, 50304),
        "1.4B": (24, 2048, 16, 8, 1024, 50304), "llama3B": (28, 3072, 24, 2, 4096, 32000)}
rows = [f"| model ({dtype}) | stack | batch | tokens/s | MFU | peak memory | launch to first step | same losses twice |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
for spec in shapes:
    name, _, batch = spec.partition(":")
    L, D, H, B, T, V = dims[name]
    model = "Llama 3.0B" if name == "llama3B" else f"GPT-2 {name}"
    no_matmul = V * D if name == "llama3B" else T * D
    s = f"{name}-b{batch}" if batch else name
    if batch: B = int(batch)
    log = open(f"{out}/strata-{s}.log").read() if os.path.exists(f"{out}/strata-{s}.log") else ""
    params = re.search(r"(?:bf16|fp16), (\d+) parameters", log)
    tps = re.findall(r"\|\s+(\d+) tokens/s", log)
    peak = re.search(r"peak device memory \(rank 0, caching allocator\): ([\d.]+ \w+) in use", log)
    first = re.search(r"first iteration finished ([\d.]+) s after launch", log)
    def losses(k):
        try: return [json.loads(l)["loss"] for l in open(f"{out}/strata-{s}-{k}.jsonl") if '"loss"' in l]
        except OSError: return []
    l1, l2 = losses(1), losses(2)
    same = "yes" if l1 and l1 == l2 else ("no" if l1 and l2 else "n/a")
    if params and tps:
        n = int(params.group(1)); tok = int(tps[-1])
        mfu = 100 * (6 * (n - no_matmul) + 6 * L * D * T) * tok / 989e12
        rows.append(f"| {model} | strata | {B} | {tok:,} | {mfu:.1f}% | {peak.group(1) if peak else '?'} | "
                    f"{first.group(1) + ' s' if first else '?'} | {same} |")
    else:
        rows.append(f"| {model} | strata | {B} | failed (see strata-{s}.log) | | | | |")
    if os.path.exists(f"{out}/strata-{s}-nd.log"):
        nd = open(f"{out}/strata-{s}-nd.log").read()
        tps_nd = re.findall(r"\|\s+(\d+) tokens/s", nd)
        if params and tps_nd:
            tok = int(tps_nd[-1]); n = int(params.group(1))
            mfu = 100 * (6 * (n - no_matmul) + 6 * L * D * T) * tok / 989e12
            rows.append(f"| {model} | strata --no-deterministic-attention | {B} | {tok:,} | {mfu:.1f}% | | | not asked |")
        else:
            rows.append(f"| {model} | strata --no-deterministic-attention | {B} | failed (see strata-{s}-nd.log) | | | | |")
    if os.path.exists(f"{out}/strata-{s}-tuned-2.log"):
        t1, t2 = (open(f"{out}/strata-{s}-tuned-{k}.log").read() for k in (1, 2))
        tps_t = re.findall(r"\|\s+(\d+) tokens/s", t2)
        firsts = [re.search(r"first iteration finished ([\d.]+) s after launch", t) for t in (t1, t2)]
        peak_t = re.search(r"peak device memory \(rank 0, caching allocator\): ([\d.]+ \w+) in use", t2)
        lt1, lt2 = losses("tuned-1"), losses("tuned-2")
        same_t = "yes" if lt1 and lt1 == lt2 else ("no" if lt1 and lt2 else "n/a")
        if params and tps_t:
            tok = int(tps_t[-1]); n = int(params.group(1))
            mfu = 100 * (6 * (n - no_matmul) + 6 * L * D * T) * tok / 989e12
            first_t = " / ".join(f.group(1) + " s" if f else "?" for f in firsts)
            rows.append(f"| {model} | strata --gemm-tuning | {B} | {tok:,} | {mfu:.1f}% | {peak_t.group(1) if peak_t else '?'} | "
                        f"{first_t} (timing / reading) | {same_t} |")
        else:
            rows.append(f"| {model} | strata --gemm-tuning | {B} | failed (see strata-{s}-tuned-*.log) | | | | |")
    try:
        peer = [json.loads(l) for l in open(f"{out}/peer-{s}.log") if l.startswith("{")][-1]
        rows.append(f"| {model} | PyTorch {peer['torch']} torch.compile | {B} | {peer['tokens_per_s']:,} | {peer['mfu_pct']}% | "
                    f"{peer['peak_mem_GiB']} GiB | {peer['first_step_s']} s | |")
    except (OSError, IndexError, ValueError):
        if os.path.exists(f"{out}/peer-{s}.log"): rows.append(f"| {model} | PyTorch | {B} | failed (see peer-{s}.log) | | | | |")
print(open(f"{out}/device.txt").read().strip())
print("\n".join(rows))
open(f"{out}/summary.md", "w").write("\n".join(rows) + "\n")
PY
