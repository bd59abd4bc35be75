#!/usr/bin/env bash
# tests/gpu/run_moe_gpus.sh <build> [log dir]: Mixtral on GPUs through train_mixtral.
#
# 1. Equivalence (fp32): on one GPU, full activation recompute and the experts' activation recomputed
#    (--recompute-modules moe_act) or the whole MoE block (moe) give the losses of the run without
#    recompute, as logged. Then a
#    Mixtral-shaped small model (8 experts, top-2, GQA, aux and z losses) at
#    expert parallelism 2 on 2 GPUs (a job of 2 processes, one per GPU, dp 2 x ep 2), with
#    the all-to-all and the all-gather dispatcher, against ep 1 on 1 GPU: every iteration's loss and
#    load-balancing loss within 1e-3 relative (fp32 reductions in another order over 20 steps).
#    Needs 2 GPUs; skipped (and said) with one.
# 2. Speed (bf16, random tokens, seq 1024): a Mixtral-shaped model (8 layers, hidden 1024, 8 experts
#    of width 3584, top-2) on 1 GPU and at ep 2 on 2 GPUs, beside the dense Llama with the same
#    active parameters (MLP width 2 x 3584), and both MoE runs again with the fixed-size exchange
#    (experts padded to capacity factor 1; at ep 2 also to factor 4, a capacity of every token:
#    dropless with no read on the host), the MoE model with FP8 delayed scaling on 1 GPU, and the
#    MoE and dense runs again at 8 micro-batches a step (global batch 64), and the MoE model at one
#    sequence a micro-batch with the grouped GEMM's automatic tile and with the 128 x 256 tile forced:
#    tokens/s (mean of the log lines of iterations 11-30), MFU of the active
#    FLOPs, peak memory. Measures, asserts nothing.
# Prints a table last; logs in <log dir> (default <build>/moe-logs). Exit status non-zero when an
# equivalence check fails or a run fails.
set -uo pipefail
build=${1:?usage: run_moe_gpus.sh <build> [log dir]}
logs=${2:-$build/moe-logs}
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mixtral=$build/examples/train_mixtral
llama=$build/examples/train_llama
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
status=0
rows=()

small=(--device cuda --dtype float --num-layers 4 --hidden-size 256 --num-attention-heads 8 --group-query-attention
  --num-query-groups 4 --ffn-hidden-size 512 --seq-length 256 --num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2
  --moe-z-loss-coeff 1e-3 --mock-data-random --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 3e-4
  --lr-warmup-iters 2 --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --sample-tokens 0 --log-interval 1 --seed 7)

# run <name> <program> <flags...>: one run, its log and JSONL under $logs. With --world-size N > 1
# the run is a job of N processes, one per GPU, started as torchrun starts them.
run() {
  local name=$1 program=$2
  shift 2
  rm -f "$logs/$name.jsonl"
  local world=1 args=("$@") i
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do [[ ${args[i]} == --world-size ]] && world=${args[i + 1]}; done
  if [[ $world == 1 ]]; then
    timeout 600 "$program" "$@" --log-jsonl "$logs/$name.jsonl" >"$logs/$name.log" 2>&1 && return 0
  else
    local port=$((20000 + RANDOM % 12000)) pids=() r failed=0
    for ((r = 0; r < world; r++)); do
      env RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout 600 "$program" "$@" --log-jsonl "$logs/$name.jsonl" >"$logs/$name.rank$r.log" 2>&1 &
      pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || failed=1; done
    cp "$logs/$name.rank0.log" "$logs/$name.log"
    [[ $failed == 0 ]] && return 0
  fi
  echo "$name: FAILED: $(tail -n 2 "$logs/$name.log" | tr '\n' ' ')"
  status=1
  return 1
}
# compare <name> <reference>: losses and load-balancing losses of two JSONL logs within 1e-3.
compare() {
  python3 - "$logs/$1.jsonl" "$logs/$2.jsonl" "$1" <<'EOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
b = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
worst, at = 0.0, ''
if len(a) != len(b) or not a:
    print(f"FAIL {sys.argv[3]}: {len(a)} iterations against {len(b)}"); sys.exit(1)
for x, y in zip(a, b):
    for key in ('loss', 'load_balancing_loss', 'z_loss'):
        e = abs(x[key] - y[key]) / abs(y[key])
        if e > worst: worst, at = e, f"iteration {x['iteration']} {key}"
verdict = 'PASS' if worst <= 1e-3 else 'FAIL'
print(f"{verdict} {sys.argv[3]}: {len(a)} iterations, loss, load_balancing_loss and z_loss within 1e-3 of ep=1 on 1 GPU "
      f"(worst {worst:.2e} at {at}; last loss {a[-1]['loss']:.5f} vs {b[-1]['loss']:.5f})")
sys.exit(0 if verdict == 'PASS' else 1)
EOF
}

# same <name> <reference> <what>: the losses, load-balancing losses and z-losses of two JSONL logs equal
# (as logged: the same bits where the two runs compute the same).
same() {
  python3 - "$logs/$1.jsonl" "$logs/$2.jsonl" "$1" "$3" <<'EOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
b = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
if len(a) != len(b) or not a:
    print(f"FAIL {sys.argv[3]}: {len(a)} iterations against {len(b)}"); sys.exit(1)
diff = [f"iteration {x['iteration']} {k}" for x, y in zip(a, b) for k in ('loss', 'load_balancing_loss', 'z_loss') if x[k] != y[k]]
verdict = 'PASS' if not diff else 'FAIL'
print(f"{verdict} {sys.argv[3]}: {len(a)} iterations, loss, load_balancing_loss and z_loss {sys.argv[4]}"
      + (f" (first difference: {diff[0]})" if diff else f" (last loss {a[-1]['loss']:.6f})"))
sys.exit(0 if verdict == 'PASS' else 1)
EOF
}

# --- 1. equivalence -----------------------------------------------------------------------------
if run ep1 "$mixtral" "${small[@]}" --world-size 1 --moe-token-dispatcher-type alltoall; then
  # Activation recompute on one GPU (deterministic kernels): full recompute routes the tokens again and
  # the routers' second record is put back; moe_act makes the experts' activation again, moe the whole
  # block. Equal as logged.
  for recompute in full moe_act moe; do
    flags=(--recompute-granularity full)
    [[ $recompute != full ]] && flags=(--recompute-granularity selective --recompute-modules $recompute)
    if run ep1-recompute-$recompute "$mixtral" "${small[@]}" --world-size 1 --moe-token-dispatcher-type alltoall "${flags[@]}"; then
      line=$(same ep1-recompute-$recompute ep1 "equal to the run without recompute") || status=1
      echo "$line"
      rows+=("| ${flags[*]} against no recompute, 1 GPU, fp32 | ${line%%:*} | ${line#*: } |")
    fi
  done
  if [[ $gpus -ge 2 ]]; then
    for dispatcher in alltoall allgather; do
      name=ep2-$dispatcher
      if run $name "$mixtral" "${small[@]}" --world-size 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type $dispatcher; then
        line=$(compare $name ep1) || status=1
        echo "$line"
        rows+=("| ep=2 ($dispatcher) on 2 GPUs against ep=1 on 1 GPU, fp32 | ${line%%:*} | ${line#*: } |")
      fi
    done
  else
    echo "one GPU: the ep=2 equivalence needs 2 and was not run"
    rows+=("| ep=2 against ep=1, fp32 | not run | one GPU |")
  fi
fi

# --- 2. speed -----------------------------------------------------------------------------------
shape=(--device cuda --dtype bf16 --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --group-query-attention
  --num-query-groups 8 --seq-length 1024 --mock-data-random --micro-batch-size 8 --train-iters 30 --lr 3e-4 --lr-warmup-iters 2
  --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --sample-tokens 0 --log-interval 1 --log-throughput)
moe=(--num-experts 8 --moe-router-topk 2 --ffn-hidden-size 3584 --moe-aux-loss-coeff 1e-2 --moe-token-dispatcher-type alltoall)
speed() {  # speed <name> <gpus> <program> <flags...>: a table row from the JSONL of the run
  local name=$1 n=$2 program=$3
  shift 3
  run "$name" "$program" "${shape[@]}" "$@" || return
  python3 - "$logs/$name.jsonl" "$name" "$n" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tail = [r for r in rows if 11 <= r['iteration'] <= 30]
tps = sum(r['tokens_per_s'] for r in tail) / len(tail)
tflops = sum(r['tflops_per_gpu'] for r in tail) / len(tail)
peak = rows[-1].get('peak_device_bytes', 0) / 2**30
print(f"| {sys.argv[2]} | {sys.argv[3]} | {tps:,.0f} | {tflops:.1f} TFLOP/s per GPU | {peak:.2f} GiB |")
EOF
}
speed_rows=()
speed_rows+=("$(speed mixtral-1gpu 1 "$mixtral" --world-size 1 "${moe[@]}")")
[[ $gpus -ge 2 ]] && speed_rows+=("$(speed mixtral-ep2 2 "$mixtral" --world-size 2 --expert-model-parallel-size 2 "${moe[@]}")")
speed_rows+=("$(speed llama-dense-1gpu 1 "$llama" --world-size 1 --ffn-hidden-size 7168)")
# The fixed-size exchange: every expert padded to its capacity (factor 1: tokens past it are dropped),
# so the all-to-all's sizes are known without reading counts on the host; against the counted exchange above.
padded=(--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity)
speed_rows+=("$(speed mixtral-1gpu-padded 1 "$mixtral" --world-size 1 "${moe[@]}" "${padded[@]}")")
[[ $gpus -ge 2 ]] && speed_rows+=("$(speed mixtral-ep2-padded 2 "$mixtral" --world-size 2 --expert-model-parallel-size 2 "${moe[@]}" "${padded[@]}")")
# Padded to a capacity of every token (factor E / k = 4): nothing can drop, so this is the dropless
# model with a fixed-size exchange (4x the rows sent, padding included) and no read on the host.
[[ $gpus -ge 2 ]] && speed_rows+=("$(speed mixtral-ep2-padded-dropless 2 "$mixtral" --world-size 2 --expert-model-parallel-size 2 "${moe[@]}" --moe-expert-capacity-factor 4.0 --moe-pad-expert-input-to-capacity)")
# The experts (and the attention's and the router's linear layers) in FP8, delayed scaling: the FP8
# experts need their counts on the host (per-expert cuBLASLt GEMMs), read once per layer.
fp8=(--fp8-format hybrid --fp8-recipe delayed)
speed_rows+=("$(speed mixtral-1gpu-fp8 1 "$mixtral" --world-size 1 "${moe[@]}" "${fp8[@]}")")
# The attention's and the router's linear layers in FP8, the experts in bf16 (the device-count grouped GEMM).
speed_rows+=("$(speed mixtral-1gpu-fp8-bf16-experts 1 "$mixtral" --world-size 1 "${moe[@]}" "${fp8[@]}" --no-fp8-experts)")
# The same models with 8 micro-batches of 8 sequences a step (global batch 64): the optimizer, whose
# cost grows with all parameters (3.6x the dense model's here) and not with the tokens, runs once per
# 8 micro-batches, as in training at a real batch size.
speed_rows+=("$(speed mixtral-1gpu-gb64 1 "$mixtral" --world-size 1 "${moe[@]}" --global-batch-size 64)")
speed_rows+=("$(speed llama-dense-1gpu-gb64 1 "$llama" --world-size 1 --ffn-hidden-size 7168 --global-batch-size 64)")
[[ $gpus -ge 2 ]] && speed_rows+=("$(speed mixtral-ep2-gb64 2 "$mixtral" --world-size 2 --expert-model-parallel-size 2 "${moe[@]}" --global-batch-size 64)")
# One sequence a micro-batch (256 rows an expert on one GPU): the Hopper grouped GEMM's automatic tile
# (128 x 128 up to 256 rows a group) against the 128 x 256 tile forced (STRATA_SM90_ROWS_TILE).
shape_mb1=("${shape[@]}")
for i in "${!shape_mb1[@]}"; do [[ ${shape_mb1[i]} == --micro-batch-size ]] && shape_mb1[i + 1]=1; done
speed_rows+=("$(shape=("${shape_mb1[@]}"); speed mixtral-1gpu-mb1 1 "$mixtral" --world-size 1 "${moe[@]}")")
speed_rows+=("$(export STRATA_SM90_ROWS_TILE=c128x256_1x2; shape=("${shape_mb1[@]}")
                speed mixtral-1gpu-mb1-c128x256 1 "$mixtral" --world-size 1 "${moe[@]}")")
[[ "${speed_rows[*]}" == *FAILED* ]] && status=1  # (each row ran in a subshell)

echo
echo "| check | verdict | detail |"
echo "| --- | --- | --- |"
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "| run | GPUs | tokens/s | active FLOPs | peak memory |"
echo "| --- | ---: | ---: | ---: | ---: |"
for r in "${speed_rows[@]}"; do echo "$r"; done
echo "SUITE moe gpus: $([[ $status == 0 ]] && echo passed || echo FAILED) (logs in $logs)"
exit $status
