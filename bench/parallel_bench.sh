#!/usr/bin/env bash
# bench/parallel_bench.sh [build-dir] [out-dir]: strata's trainers on several GPUs of one host, in
# data-parallel, tensor-parallel and pipeline-parallel layouts, beside the PyTorch peer
# bench/peers/torch_gpt_parallel.py where it has the layout. Random tokens (--mock-data-random), bf16.
#
#   STRATA_PARBENCH="dp tp pp recompute"   the suites, any of them, space-separated (default all four):
#     dp  GPT 24 x 1024 (16 heads, seq 1024, vocab 50304, ~405M with the tied embedding; the
#         shape of GPT-2 350M, reported as "24x1024"), micro-batch 16 per GPU, global 16 x dp:
#         1 GPU; dp=2 without and with --overlap-grad-reduce; dp=2 with --use-distributed-optimizer
#         --overlap-grad-reduce --overlap-param-gather; with 4 GPUs dp=4 the same. Peer: DDP on 1, 2
#         (and 4) GPUs, batch 16 per GPU.
#     tp  GPT 24 x 2048 (16 heads, seq 1024, ~1.41B): 1 GPU at micro-batch 8; tp=2 +
#         --sequence-parallel at the same global batch (micro 8, one replica); tp=2 at micro 16;
#         both again with --tp-comm-overlap. Where the CUPTI tracer is built
#         (<build-dir>/bench/libstrata_kernel_trace.so), tp=2 at micro 8 without and with
#         --tp-comm-overlap once more under the tracer (--profile, iterations 10-11): each rank's
#         per-kernel table, with the NCCL time that ran under compute kernels, in
#         <out-dir>/<run>.kernels.rank<r>.md. Peer: 1 GPU and DTensor tp=2 + sequence parallel, batch 8.
#         STRATA_PARBENCH_TP_WIDE=1 adds 1 GPU at micro-batch 16 (the global batch of tp=2 at 16) and
#         tp=2 + SP at micro-batch 24 (per-GPU memory still below one GPU's at 8); the ratios stay
#         against 1 GPU at micro-batch 8, the suite's first 1-GPU run.
#         STRATA_PARBENCH_TP_OVERLAP_ARGS adds its words to every --tp-comm-overlap run (e.g.
#         "--tp-comm-overlap-sm-margin 8").
#     pp  Llama ~3B on 4 GPUs: 28 layers, hidden 3072, 24 heads, 8 query groups (GQA), SwiGLU
#         width 8192, seq 4096, vocab 32000, tp=2 x pp=2 + --sequence-parallel, micro-batch 1,
#         global batch 16 (dp = 1: 16 micro-batches per step; the interleaved schedule needs a
#         multiple of pp), schedules 1f1b, interleaved (--num-layers-per-virtual-pipeline-stage 7:
#         2 chunks of 7 layers per rank) and zero-bubble; no peer. Each run's rank 0 prints the
#         measured bubble of every pipeline rank beside the table's prediction (docs/PIPELINE.md).
#         STRATA_PARBENCH_PP_TP (default 2) sets tp (1: the same model on 2 GPUs, tp=1 x pp=2);
#         STRATA_PARBENCH_PP_OVERLAP (default "off") lists the p2p modes per schedule: off (the
#         transfers on the compute stream), on (--overlap-p2p-communication), or "off on".
#     recompute  the dp shape on 1 GPU (micro-batch 16): no recompute, --recompute-granularity
#         selective (the attention core), full (--recompute-method uniform, 1 layer per chunk): tokens/s,
#         peak memory, and the peak less the model state (the trainer's measured state bytes), which
#         is the activations' and workspaces' share.
#   The trainers take positions up to --seq-length (no --max-position-embeddings flag) and GQA from
#   --num-query-groups alone (no --group-query-attention flag).
#
# Every multi-GPU strata run is one process per GPU started as torchrun does (RANK, WORLD_SIZE,
# LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), each rank's output in
# <out-dir>/<run>.rank<r>.log; a 1-GPU run is the trainer alone (--world-size 1). Each process runs
# under `timeout` (STRATA_PARBENCH_TIMEOUT seconds, default 300). Layouts needing more GPUs than
# `nvidia-smi -L` lists (or STRATA_PARBENCH_GPUS) are skipped with a line saying so.
#
# tokens/s: rank 0 logs every --log-interval iterations (STRATA_PARBENCH_ITERS iterations, default 20,
# interval ITERS / 5, so five lines); the figure is the mean of the log lines after the first two
# intervals (the first holds start-up and the first step's allocations and plans), or the last line
# when there are no more than two. MFU per GPU: FLOPs per token over a STRATA_PARBENCH_PEAK_TFLOPS
# (default 989, H100 / H200 SXM dense bf16) peak, with FLOPs per token = 6 N_matmul + 6 L D T
# (the peer's count; N_matmul: the weights of every matrix multiply, the output layer included and
# the input embedding left out). Peak memory: rank 0's caching allocator (the trainer's last line);
# the peer's torch.cuda.max_memory_allocated.
#
# STRATA_PARBENCH_PEER=0 skips the peers; STRATA_PARBENCH_DRY=1 prints the command lines only;
# STRATA_PARBENCH_TINY=1 runs tiny shapes on the CPU (--device cpu, a CPU build's trainers, every
# layout as threads of one process with --world-size N, no peer): a check of the script itself.
# A <build-dir> without the trainers the suites need is configured and built with CUDA and NCCL first
# (as bench/gpu_bench.sh does). Full logs in <out-dir> (default <build-dir>/parbench-logs); the
# tables last, also in <out-dir>/summary.md. It measures and prints; it asserts nothing about speed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build-bench}
out=${2:-$build/parbench-logs}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
unset NCCL_COMM_ID STRATA_NCCL_ID_FILE
suites=${STRATA_PARBENCH:-dp tp pp recompute}
iters=${STRATA_PARBENCH_ITERS:-20}
interval=$((iters >= 10 ? iters / 5 : 1))
run_timeout=${STRATA_PARBENCH_TIMEOUT:-300}
peer=${STRATA_PARBENCH_PEER:-1}
dry=${STRATA_PARBENCH_DRY:-0}
tiny=${STRATA_PARBENCH_TINY:-0}
peak_tflops=${STRATA_PARBENCH_PEAK_TFLOPS:-989}
pp_tp=${STRATA_PARBENCH_PP_TP:-2}
pp_overlaps=${STRATA_PARBENCH_PP_OVERLAP:-off}
tp_wide=${STRATA_PARBENCH_TP_WIDE:-0}
read -r -a overlap_args <<< "${STRATA_PARBENCH_TP_OVERLAP_ARGS:-}"
[[ $tiny == 1 ]] && peer=0

# Libraries: CUDA's lib64 and the Python environment's nvidia-* packages (cuDNN, NCCL, cuBLAS).
libs=()
for dir in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64; do [[ -d $dir ]] && libs+=("$dir"); done
for module in nvidia.cudnn nvidia.nccl nvidia.cublas nvidia.cuda_runtime; do
  dir=$(python3 -c "import $module as m; print(list(m.__path__)[0])" 2>/dev/null) && [[ -d $dir/lib ]] && libs+=("$dir/lib")
done
LD_LIBRARY_PATH=$(IFS=:; echo "${libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

gpt=$build/examples/train_gpt
llama=$build/examples/train_llama
missing=0  # the trainers the chosen suites run: train_gpt for dp, tp, recompute; train_llama for pp
[[ " $suites " == *" dp "* || " $suites " == *" tp "* || " $suites " == *" recompute "* ]] && [[ ! -x $gpt ]] && missing=1
[[ " $suites " == *" pp "* && ! -x $llama ]] && missing=1
if [[ $dry != 1 && $missing == 1 ]]; then
  if [[ $tiny == 1 ]]; then echo "no $gpt or $llama: build the trainers first (a CPU build is enough for STRATA_PARBENCH_TINY)"; exit 1; fi
  echo "building $build (train_gpt, train_llama with CUDA) ..."
  frontend=${STRATA_CUDNN_FRONTEND_DIR:-$(python3 -c "import cudnn, os; print(os.path.dirname(cudnn.__file__))" 2>/dev/null)}
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF -DSTRATA_CUDA_TRAINERS=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 ${frontend:+-DSTRATA_CUDNN_FRONTEND_DIR=$frontend} \
    ${CLI11_INCLUDE_DIR:+-DCLI11_INCLUDE_DIR=$CLI11_INCLUDE_DIR} >"$out/configure.log" 2>&1 ||
    { echo "configure failed: $out/configure.log"; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target train_gpt train_llama >"$out/build.log" 2>&1 ||
    { echo "build failed: $out/build.log"; tail -20 "$out/build.log"; exit 1; }
fi
source "$here/cudnn_frontend_check.sh"
[[ $tiny == 1 ]] || warn_without_cudnn_frontend "$build" "$out"

if [[ $tiny == 1 ]]; then
  gpus=${STRATA_PARBENCH_GPUS:-4}
  echo "STRATA_PARBENCH_TINY: tiny shapes on the CPU, $gpus ranks at most (threads)" >"$out/device.txt"
  device=(--device cpu --dtype float)
else
  gpus=${STRATA_PARBENCH_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; } >"$out/device.txt" 2>&1
  device=(--device cuda --bf16)
fi
torchrun=(torchrun)
command -v torchrun >/dev/null 2>&1 || torchrun=(python3 -m torch.distributed.run)

# Shapes: layers hidden heads seq vocab micro-batch (GPT); Llama adds query groups and MLP width.
if [[ $tiny == 1 ]]; then
  read -r DP_L DP_D DP_H DP_T DP_V DP_B <<<"2 64 4 32 320 2"
  read -r TP_L TP_D TP_H TP_T TP_V TP_B <<<"2 64 4 32 320 2"
  read -r PP_L PP_D PP_H PP_G PP_F PP_T PP_V PP_GLOBAL PP_VPP <<<"4 64 4 2 128 32 320 8 1"
else
  read -r DP_L DP_D DP_H DP_T DP_V DP_B <<<"24 1024 16 1024 50304 16"
  read -r TP_L TP_D TP_H TP_T TP_V TP_B <<<"24 2048 16 1024 50304 8"
  read -r PP_L PP_D PP_H PP_G PP_F PP_T PP_V PP_GLOBAL PP_VPP <<<"28 3072 24 8 8192 4096 32000 16 7"
fi
common=("${device[@]}" --mock-data-random --train-iters "$iters" --log-interval "$interval" --eval-iters 0 --sample-tokens 0
        --lr 6e-4 --lr-warmup-iters 2 --seed 1234 --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.1
        --adam-beta2 0.95 --lr-decay-style cosine)

# One line per run in runs.tsv (suite, run, stack, GPUs, label, model, log, note), read by the summary.
runs=$out/runs.tsv
: >"$runs"
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$runs"; }

# strata RUN NPROC BINARY ARGS...: NPROC = 1: the trainer alone; else one process per GPU with
# torchrun's variables (TINY: one process of NPROC threads). Logs: <out>/RUN.rank<r>.log. With
# traced=1 each process runs under the CUPTI tracer (the caller passes --profile and its window).
traced=0
tracer=$build/bench/libstrata_kernel_trace.so
strata() {
  local run=$1 n=$2 binary=$3
  shift 3
  rm -f "$out/$run".rank*.log
  if [[ $n == 1 || $tiny == 1 ]]; then
    local cmd=("$binary" "$@" --world-size "$n")
    echo "  ${cmd[*]}" >"$out/$run.cmd"
    [[ $dry == 1 ]] && { cat "$out/$run.cmd"; return; }
    timeout "$run_timeout" "${cmd[@]}" >"$out/$run.rank0.log" 2>&1
    echo "exit $?" >>"$out/$run.rank0.log"
    return
  fi
  local port=$((20000 + RANDOM % 12000)) pids=() r
  echo "  RANK=r WORLD_SIZE=$n LOCAL_RANK=r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port $binary $*" >"$out/$run.cmd"
  [[ $dry == 1 ]] && { cat "$out/$run.cmd"; return; }
  for ((r = 0; r < n; ++r)); do
    local trace_env=()
    [[ $traced == 1 ]] && trace_env=(STRATA_TRACE_OUT="$out/$run.kernels.rank$r.md" CUDA_INJECTION64_PATH="$tracer")
    env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${trace_env[@]}" \
      timeout "$run_timeout" "$binary" "$@" >"$out/$run.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < n; ++r)); do
    wait "${pids[$r]}"
    echo "exit $?" >>"$out/$run.rank$r.log"
  done
}

# peer RUN NPROC ARGS...: bench/peers/torch_gpt_parallel.py, under torchrun when NPROC > 1.
peer_run() {
  local run=$1 n=$2
  shift 2
  local cmd=(python3 "$here/peers/torch_gpt_parallel.py" "$@" --steps "$iters")
  [[ $n -gt 1 ]] && cmd=("${torchrun[@]}" --standalone --nproc-per-node "$n" "$here/peers/torch_gpt_parallel.py" "$@" --steps "$iters")
  echo "  ${cmd[*]}" >"$out/$run.cmd"
  [[ $dry == 1 ]] && { cat "$out/$run.cmd"; return; }
  timeout "$run_timeout" "${cmd[@]}" >"$out/$run.log" 2>&1
  echo "exit $?" >>"$out/$run.log"
}

# needs N WHAT RUN: true when N GPUs are there; else records the skip of RUN (of $model) and prints it.
needs() {
  if ((gpus >= $1)); then return 0; fi
  echo "  skipped: $2 needs $1 GPUs, this machine has $gpus"
  record "$suite" "$3" "-" "$1" "$2" "$model" "-" "skipped: needs $1 GPUs, $gpus present"
  return 1
}

for suite in $suites; do
  case $suite in
    dp)
      echo "dp: GPT ${DP_L}x${DP_D}, micro-batch $DP_B per GPU ..."
      model="L=$DP_L D=$DP_D H=$DP_H T=$DP_T V=$DP_V"
      shape=(--num-layers "$DP_L" --hidden-size "$DP_D" --num-attention-heads "$DP_H" --seq-length "$DP_T"
             --vocab-size "$DP_V" --micro-batch-size "$DP_B" --tensor-model-parallel-size 1)
      strata dp-1 1 "$gpt" "${common[@]}" "${shape[@]}" --global-batch-size "$DP_B"
      record dp dp-1 strata 1 "1 GPU" "$model" dp-1.rank0.log ""
      if needs 2 "dp=2" dp-2; then
        strata dp-2 2 "$gpt" "${common[@]}" "${shape[@]}" --global-batch-size $((2 * DP_B))
        record dp dp-2 strata 2 "dp=2" "$model" dp-2.rank0.log ""
        strata dp-2-overlap 2 "$gpt" "${common[@]}" "${shape[@]}" --global-batch-size $((2 * DP_B)) --overlap-grad-reduce
        record dp dp-2-overlap strata 2 "dp=2 --overlap-grad-reduce" "$model" dp-2-overlap.rank0.log ""
        strata dp-2-distopt 2 "$gpt" "${common[@]}" "${shape[@]}" --global-batch-size $((2 * DP_B)) \
          --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
        record dp dp-2-distopt strata 2 "dp=2 distributed optimizer + overlap" "$model" dp-2-distopt.rank0.log ""
      fi
      if needs 4 "dp=4" dp-4-distopt; then
        strata dp-4-distopt 4 "$gpt" "${common[@]}" "${shape[@]}" --global-batch-size $((4 * DP_B)) \
          --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
        record dp dp-4-distopt strata 4 "dp=4 distributed optimizer + overlap" "$model" dp-4-distopt.rank0.log ""
      fi
      if [[ $peer != 0 ]]; then
        pshape=(--layers "$DP_L" --heads "$DP_H" --hidden "$DP_D" --vocab "$DP_V" --seq "$DP_T" --batch "$DP_B")
        peer_run peer-dp-1 1 --mode single "${pshape[@]}"
        record dp peer-dp-1 peer 1 "1 GPU" "$model" peer-dp-1.log ""
        for n in 2 4; do
          if needs "$n" "peer dp=$n" "peer-dp-$n"; then
            peer_run "peer-dp-$n" "$n" --mode dp "${pshape[@]}"
            record dp "peer-dp-$n" peer "$n" "DDP dp=$n" "$model" "peer-dp-$n.log" ""
          fi
        done
      fi
      ;;
    tp)
      echo "tp: GPT ${TP_L}x${TP_D} ..."
      model="L=$TP_L D=$TP_D H=$TP_H T=$TP_T V=$TP_V"
      shape=(--num-layers "$TP_L" --hidden-size "$TP_D" --num-attention-heads "$TP_H" --seq-length "$TP_T" --vocab-size "$TP_V")
      strata tp-1 1 "$gpt" "${common[@]}" "${shape[@]}" --tensor-model-parallel-size 1 --micro-batch-size "$TP_B" \
        --global-batch-size "$TP_B"
      record tp tp-1 strata 1 "1 GPU, micro-batch $TP_B" "$model" tp-1.rank0.log ""
      if [[ $tp_wide == 1 ]]; then  # one GPU at tp=2's larger micro-batch: the same global batch as tp-2-mb2x
        strata tp-1-mb2x 1 "$gpt" "${common[@]}" "${shape[@]}" --tensor-model-parallel-size 1 \
          --micro-batch-size $((2 * TP_B)) --global-batch-size $((2 * TP_B))
        record tp tp-1-mb2x strata 1 "1 GPU, micro-batch $((2 * TP_B))" "$model" tp-1-mb2x.rank0.log ""
      fi
      if needs 2 "tp=2" tp-2; then
        strata tp-2 2 "$gpt" "${common[@]}" "${shape[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
          --micro-batch-size "$TP_B" --global-batch-size "$TP_B"
        record tp tp-2 strata 2 "tp=2 + SP, micro-batch $TP_B" "$model" tp-2.rank0.log ""
        strata tp-2-mb2x 2 "$gpt" "${common[@]}" "${shape[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
          --micro-batch-size $((2 * TP_B)) --global-batch-size $((2 * TP_B))
        record tp tp-2-mb2x strata 2 "tp=2 + SP, micro-batch $((2 * TP_B))" "$model" tp-2-mb2x.rank0.log ""
        if [[ $tp_wide == 1 ]]; then  # per-GPU memory still below one GPU's at micro-batch TP_B
          strata tp-2-mb3x 2 "$gpt" "${common[@]}" "${shape[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
            --micro-batch-size $((3 * TP_B)) --global-batch-size $((3 * TP_B))
          record tp tp-2-mb3x strata 2 "tp=2 + SP, micro-batch $((3 * TP_B))" "$model" tp-2-mb3x.rank0.log ""
        fi
        strata tp-2-overlap 2 "$gpt" "${common[@]}" "${shape[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
          --tp-comm-overlap "${overlap_args[@]}" --micro-batch-size "$TP_B" --global-batch-size "$TP_B"
        record tp tp-2-overlap strata 2 "tp=2 + SP + --tp-comm-overlap, micro-batch $TP_B" "$model" tp-2-overlap.rank0.log ""
        strata tp-2-mb2x-overlap 2 "$gpt" "${common[@]}" "${shape[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
          --tp-comm-overlap "${overlap_args[@]}" --micro-batch-size $((2 * TP_B)) --global-batch-size $((2 * TP_B))
        record tp tp-2-mb2x-overlap strata 2 "tp=2 + SP + --tp-comm-overlap, micro-batch $((2 * TP_B))" "$model" \
          tp-2-mb2x-overlap.rank0.log ""
        if [[ -f $tracer && $tiny != 1 ]]; then
          traced=1
          for overlap in "" --tp-comm-overlap; do
            export STRATA_TRACE_STEPS=2
            extra=()
            [[ -n $overlap ]] && extra=("$overlap" "${overlap_args[@]}")
            strata "tp-2-traced${overlap:+-overlap}" 2 "$gpt" "${common[@]}" "${shape[@]}" --tensor-model-parallel-size 2 \
              --sequence-parallel "${extra[@]}" --micro-batch-size "$TP_B" --global-batch-size "$TP_B" --profile \
              --profile-step-start 10 --profile-step-end 12
          done
          traced=0
        fi
      fi
      if [[ $peer != 0 ]]; then
        pshape=(--layers "$TP_L" --heads "$TP_H" --hidden "$TP_D" --vocab "$TP_V" --seq "$TP_T" --batch "$TP_B")
        peer_run peer-tp-1 1 --mode single "${pshape[@]}"
        record tp peer-tp-1 peer 1 "1 GPU, batch $TP_B" "$model" peer-tp-1.log ""
        if needs 2 "peer tp=2" peer-tp-2; then
          peer_run peer-tp-2 2 --mode tp "${pshape[@]}"
          record tp peer-tp-2 peer 2 "DTensor tp=2 + SP, batch $TP_B" "$model" peer-tp-2.log ""
        fi
      fi
      ;;
    pp)
      echo "pp: Llama ${PP_L}x${PP_D}, tp=$pp_tp x pp=2, seq $PP_T, global batch $PP_GLOBAL, p2p overlap: $pp_overlaps ..."
      model="L=$PP_L D=$PP_D H=$PP_H G=$PP_G F=$PP_F T=$PP_T V=$PP_V TP=$pp_tp"
      shape=(--num-layers "$PP_L" --hidden-size "$PP_D" --num-attention-heads "$PP_H" --group-query-attention --num-query-groups "$PP_G"
             --ffn-hidden-size "$PP_F" --seq-length "$PP_T" --vocab-size "$PP_V" --micro-batch-size 1
             --global-batch-size "$PP_GLOBAL" --tensor-model-parallel-size "$pp_tp" --pipeline-model-parallel-size 2)
      ((pp_tp > 1)) && shape+=(--sequence-parallel)
      for schedule in 1f1b interleaved zero-bubble; do
        for overlap in $pp_overlaps; do
          extra=() run=pp-$schedule label=$schedule
          [[ $schedule == interleaved ]] && extra=(--num-layers-per-virtual-pipeline-stage "$PP_VPP") &&
            label+=" ($((PP_L / (2 * PP_VPP))) chunks of $PP_VPP layers per rank)"
          [[ $overlap == on ]] && extra+=(--overlap-p2p-communication) && run+=-overlap && label+=", p2p overlapped"
          if needs $((2 * pp_tp)) "tp=$pp_tp x pp=2 $schedule" "$run"; then
            strata "$run" $((2 * pp_tp)) "$llama" "${common[@]}" "${shape[@]}" --pipeline-schedule "$schedule" "${extra[@]}"
            record pp "$run" strata $((2 * pp_tp)) "$label" "$model" "$run.rank0.log" ""
          fi
        done
      done
      ;;
    recompute)
      echo "recompute: GPT ${DP_L}x${DP_D}, micro-batch $DP_B, 1 GPU: none, selective, full ..."
      model="L=$DP_L D=$DP_D H=$DP_H T=$DP_T V=$DP_V"
      shape=(--num-layers "$DP_L" --hidden-size "$DP_D" --num-attention-heads "$DP_H" --seq-length "$DP_T"
             --vocab-size "$DP_V" --micro-batch-size "$DP_B" --global-batch-size "$DP_B" --tensor-model-parallel-size 1)
      strata rc-none 1 "$gpt" "${common[@]}" "${shape[@]}"
      record recompute rc-none strata 1 "none" "$model" rc-none.rank0.log ""
      strata rc-selective 1 "$gpt" "${common[@]}" "${shape[@]}" --recompute-granularity selective
      record recompute rc-selective strata 1 "selective (attention core)" "$model" rc-selective.rank0.log ""
      strata rc-full 1 "$gpt" "${common[@]}" "${shape[@]}" --recompute-granularity full --recompute-method uniform \
        --recompute-num-layers 1
      record recompute rc-full strata 1 "full, uniform, 1 layer per chunk" "$model" rc-full.rank0.log ""
      ;;
    *) echo "STRATA_PARBENCH: unknown suite '$suite' (use dp, tp, pp, recompute)"; exit 1 ;;
  esac
done
[[ $dry == 1 ]] && exit 0

python3 - "$out" "$peak_tflops" "$([[ $tiny == 1 ]] && echo float || echo bf16)" <<'PY'
import json, os, re, sys
out, peak, dtype = sys.argv[1], float(sys.argv[2]) * 1e12, sys.argv[3]
rows = [l.rstrip("\n").split("\t") for l in open(f"{out}/runs.tsv") if l.strip()]

def read(name):
    try:
        return open(f"{out}/{name}").read()
    except OSError:
        return ""

def strata_figures(log):
    """tokens/s (mean after the first two log intervals), the lines used, params, peak memory, bubble lines."""
    tps = [int(x) for x in re.findall(r"^iteration\s+\d+/\s*\d+ \|.*?\|\s+(\d+) tokens/s", log, re.M)]
    used = tps[2:] if len(tps) > 2 else tps[-1:]
    params = re.search(r", (\d+) parameters", log)
    peak_mem = re.search(r"peak device memory \(rank 0, caching allocator\): ([\d.]+ \w+) in use", log)
    state = re.search(r"the device allocator holds .*?\((\d+) B\) for that state", log)
    bubbles = re.findall(r"^pipeline rank (\d+): busy ([\d.]+) ms of ([\d.]+) ms per step \(measured bubble ([\d.]+)%; "
                         r"the (\S+) table predicts ([\d.]+)%\)", log, re.M)
    return (sum(used) / len(used) if used else None, len(tps), len(used), int(params.group(1)) if params else None,
            peak_mem.group(1) if peak_mem else "?", bubbles, int(state.group(1)) if state else None)

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}

def to_bytes(text):  # "12.3 GiB" -> bytes; None when unreadable
    parts = text.split()
    return float(parts[0]) * UNITS[parts[1]] if len(parts) == 2 and parts[1] in UNITS else None

def peer_figures(log):
    try:
        j = [json.loads(l) for l in log.splitlines() if l.startswith("{")][-1]
        return j["tokens_per_s"], f"{j['peak_mem_GiB']} GiB", j
    except (IndexError, ValueError, KeyError):
        return None, "?", None

def unusable(lead, note, log, f, columns):
    """The row of a skipped or failed run (lead: its first cells, columns: the table's), or None when it has figures."""
    if note.startswith("skipped"):
        text = note
    elif not f or not f[0]:
        text = f"failed (see {log})"
    else:
        return None
    return "| " + " | ".join(lead + [text]) + " |" + " |" * (columns - len(lead) - 1)

def dims(model):
    return {k: int(v) for k, v in (p.split("=") for p in model.split())}

def gpt_flops(m):  # tied embedding: the output layer's matmul counts once; the position embedding does none
    L, D, T, V = m["L"], m["D"], m["T"], m["V"]
    return 6 * (L * 12 * D * D + D * V) + 6 * L * D * T

def llama_flops(m):
    L, D, H, G, F, T, V = m["L"], m["D"], m["H"], m["G"], m["F"], m["T"], m["V"]
    n = L * (2 * D * D + 2 * D * G * (D // H) + 3 * D * F) + D * V
    return 6 * n + 6 * L * D * T, n

tables = []
for suite in ("dp", "tp", "pp", "recompute"):
    mine = [r for r in rows if r[0] == suite]
    if not mine:
        continue
    base = {}
    figures = {}
    for s, run, stack, gpus, label, model, log, note in mine:
        if note.startswith("skipped"):
            continue
        text = read(log)
        figures[run] = strata_figures(text) if stack == "strata" else peer_figures(text)
        if gpus == "1" and figures[run][0]:
            base.setdefault(stack, figures[run][0])  # the suite's first 1-GPU run
    lines = []
    if suite == "recompute":
        m = dims(mine[0][5])
        lines.append(f"### recompute: GPT {m['L']}x{m['D']} ({m['H']} heads, seq {m['T']}, vocab {m['V']}), 1 GPU, {dtype}")
        lines.append("")
        lines.append("| recompute | tokens/s | vs none | peak memory | model state | peak less the state |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
        for s, run, stack, gpus, label, model, log, note in mine:
            f = figures.get(run)
            row = unusable([label], note, log, f, 6)
            if row:
                lines.append(row)
                continue
            peak_b, state_b = to_bytes(f[4]), f[6]
            rest = f"{(peak_b - state_b) / 2**30:.2f} GiB" if peak_b is not None and state_b is not None else "?"
            state = f"{state_b / 2**30:.2f} GiB" if state_b is not None else "?"
            lines.append(f"| {label} | {f[0]:,.0f} | {f[0] / base['strata']:.2f}x | {f[4]} | {state} | {rest} |")
    elif suite in ("dp", "tp"):
        m = dims(mine[0][5])
        fpt = gpt_flops(m)
        lines.append(f"### {suite}: GPT {m['L']}x{m['D']} ({m['H']} heads, seq {m['T']}, vocab {m['V']}), {dtype}")
        lines.append(f"FLOPs per token 6 N_matmul + 6 L D T = 6 x {(fpt - 6 * m['L'] * m['D'] * m['T']) // 6:,} + "
                     f"6 x {m['L']} x {m['D']} x {m['T']} = {fpt / 1e9:.2f} GFLOP")
        lines.append("")
        lines.append("| layout | stack | GPUs | tokens/s | vs its own 1 GPU | MFU per GPU | peak memory per GPU |")
        lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for s, run, stack, gpus, label, model, log, note in mine:
            f = figures.get(run)
            row = unusable([label, stack, gpus], note, log, f, 7)
            if row:
                lines.append(row)
                continue
            tok, n = f[0], int(gpus)
            scale = f"{tok / base[stack]:.2f}x ({100 * tok / base[stack] / n:.0f}% of {n}x)" if stack in base else "?"
            stack_name = "strata" if stack == "strata" else ("PyTorch " + f[2]["torch"] if f[2] else "PyTorch")
            lines.append(f"| {label} | {stack_name} | {n} | {tok:,.0f} | {scale} | {100 * fpt * tok / n / peak:.1f}% | "
                         f"{f[1] if stack != 'strata' else f[4]} |")
    else:
        m = dims(mine[0][5])
        fpt, n_matmul = llama_flops(m)
        lines.append(f"### pp: Llama {m['L']}x{m['D']} ({m['H']} heads, {m['G']} query groups, SwiGLU {m['F']}, seq {m['T']}, "
                     f"vocab {m['V']}), tp={m['TP']} x pp=2{' + sequence parallel' if m['TP'] > 1 else ''}, {dtype}")
        lines.append(f"N_matmul = L (2 D^2 + 2 D G D/H + 3 D F) + D V = {n_matmul:,}; FLOPs per token 6 N_matmul + 6 L D T = "
                     f"{fpt / 1e9:.2f} GFLOP; MFU over {2 * m['TP']} GPUs x {peak / 1e12:.0f} TFLOP/s")
        lines.append("")
        lines.append("| schedule | tokens/s | MFU per GPU | schedule time per step | measured bubble per pipeline rank | "
                     "the table predicts | peak memory (rank 0) |")
        lines.append("| --- | ---: | ---: | ---: | --- | ---: | ---: |")
        for s, run, stack, gpus, label, model, log, note in mine:
            f = figures.get(run)
            row = unusable([label], note, log, f, 7)
            if row:
                lines.append(row)
                continue
            tok, bubbles = f[0], f[5]
            measured = ", ".join(f"rank {b[0]}: {b[3]}% (busy {b[1]} of {b[2]} ms)" for b in bubbles) or "?"
            step = f"{max(float(b[2]) for b in bubbles):.1f} ms" if bubbles else "?"
            predicted = f"{bubbles[0][5]}%" if bubbles else "?"
            lines.append(f"| {label} | {tok:,.0f} | {100 * fpt * tok / int(gpus) / peak:.1f}% | {step} | {measured} | {predicted} | "
                         f"{f[4]} |")
    counts = {run: f"{figures[run][2]} of {figures[run][1]}" for _, run, stack, *_ in mine
              if stack == "strata" and run in figures and figures[run][0]}
    if counts:
        same = len(set(counts.values())) == 1
        detail = (next(iter(counts.values())) + " lines each") if same else "; ".join(f"{r}: {c}" for r, c in counts.items())
        lines.append("")
        lines.append(f"strata tokens/s: the mean of rank 0's log lines after the first two intervals ({detail}).")
    tables.append("\n".join(lines))
print(open(f"{out}/device.txt").read().strip())
print()
print("\n\n".join(tables))
open(f"{out}/summary.md", "w").write("\n\n".join(tables) + "\n")
PY
