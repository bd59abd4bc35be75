#!/usr/bin/env bash
# bench/scale_bench.sh [build-dir] [out-dir]: Llama 3 8B on the 4 (or 8) GPUs of one host in every
# parallel layout, beside torchtitan on the same GPUs, with strata-plan's prediction of each layout
# and one rank killed mid-run, in one command; one table last (also <out-dir>/table.md).
#
# Model: Llama 3 8B (32 layers, hidden 4096, 32 heads, 8 key/value groups, SwiGLU width 14336, vocab
# 128256, RoPE base 500000, untied output), seq 8192, bf16, random tokens (--mock-data-random),
# micro-batch 1, global batch 4 per GPU (16 sequences on 4 GPUs, 32 on 8: the same per-GPU batch),
# cuDNN's attention backward with atomics (--no-deterministic-attention; the peer's is not
# deterministic either). STRATA_SCALE_DTYPE=fp8 adds --fp8-format hybrid --fp8-recipe tensorwise.
#
# Layouts (STRATA_SCALE_LAYOUTS picks some by name; by default those of the machine's GPU count):
#   4 GPUs  tp4               tp=4 + sequence parallel, --tp-comm-overlap
#           tp2-pp2-1f1b      tp=2 + SP x pp=2, 1F1B, --overlap-p2p-communication, --tp-comm-overlap
#           tp2-pp2-interleaved   the same, interleaved (2 chunks of 8 layers per rank)
#           tp2-dp2-distopt   tp=2 + SP x dp=2, distributed optimizer, gradient reduce and parameter
#                             gather overlapped, --tp-comm-overlap
#           tp2-cp2           tp=2 + SP x cp=2 (ring attention), distributed optimizer over the cp group
#           dp4-distopt       dp=4, distributed optimizer, gradient reduce and parameter gather overlapped
#                             (102 GiB per GPU without recompute: on 80 GiB cards it falls back to recompute)
#           pp4-zb            pp=4, zero-bubble schedule, --overlap-p2p-communication
#   8 GPUs  tp8, tp4-dp2-distopt, tp2-pp2-dp2 (interleaved), tp2-cp2-dp2, and a Mixtral-shaped MoE
#           (mixtral-ep8: 16 layers of hidden 4096, 8 experts of width 14336, top-2, ep=8 x dp=8 with the
#           distributed optimizer, alltoall dispatcher).
# Recompute: each layout tries the recompute levels of its list in order (none first where the
# planner finds that it fits on 80 GiB) and keeps the first that runs; a level that ends out of
# memory is listed in the row's note.
#
# The peer (STRATA_SCALE_PEER=0 skips it): bench/peers/torchtitan_llama.py, torchtitan's Llama 3 8B
# with its own FSDP2 + tensor-parallel code and torch.compile, under torchrun on the same GPUs at the
# local batches of STRATA_SCALE_PEER_LAYOUTS (layout:local-batch, default "fsdp4:4 fsdp4:2 tp2-fsdp2:4"
# on 4 GPUs, fsdp4:4 being strata's global batch of 16; "fsdp8:4 fsdp8:2 tp2-fsdp4:4" on 8), timing
# STRATA_SCALE_PEER_STEPS (5) steps after STRATA_SCALE_PEER_WARMUP (3), the first of which compiles.
# torchtitan and what it imports must be importable (PYTHONPATH; the peer's docstring lists the wheels).
# The kill (STRATA_SCALE_KILL=0 skips it): the layout STRATA_SCALE_KILL_LAYOUT (default
# tp2-dp2-distopt on 4 GPUs, tp4-dp2-distopt on 8) runs with --distributed-timeout-minutes 0.5;
# after rank 0's second iteration the last rank is killed (SIGKILL); the row gives the seconds from
# the kill until every other rank had ended, their exit codes and rank 0's message.
# Predictions: <build-dir>/examples/tools/strata-plan (or STRATA_SCALE_PLAN) with
# bench/calibration/h100_node.json, the row of the planner's table with the same tp, pp, schedule,
# dp, cp, ep, micro-batch, recompute and distributed optimizer.
#
# tokens/s: the mean of the log lines after the first STRATA_SCALE_WARMUP (default 2) of
# STRATA_SCALE_ITERS (default 6) iterations, logged every iteration. MFU per GPU: 6 N_matmul + 6 L D T
# FLOPs per token (N_matmul: the weights of every matrix multiply, the output layer included; the
# peer's count) over STRATA_SCALE_PEAK_TFLOPS (default 989, H100 / H200 dense bf16) per GPU. Peak
# memory: rank 0's caching allocator (strata), torch.cuda.max_memory_allocated (peer). Bubble: each
# pipeline rank's measured idle share (the trainer's CUDA-event timing of the schedule's actions).
# Each process runs under `timeout` STRATA_SCALE_TIMEOUT seconds (default 300).
# STRATA_SCALE_PARTS (default "strata peer kill") runs some parts only: the table reads every log in
# <out-dir>, so one part per call on the same machine and out-dir builds the same table.
# STRATA_SCALE_TINY=1: tiny shapes as threads of one CPU process (--device cpu, a CPU build's
# trainers), no peer and no kill: a check of the script and of the layouts' flags.
# Needs <build-dir>/examples/train_llama (and train_mixtral on 8 GPUs) built with CUDA, NCCL, cuDNN.
# It measures and prints; it asserts nothing about speed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build-bench}
out=${2:-$build/scale-bench-logs}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$here/cudnn_frontend_check.sh"
warn_without_cudnn_frontend "$build" "$out"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
unset NCCL_COMM_ID STRATA_NCCL_ID_FILE
iters=${STRATA_SCALE_ITERS:-6}
warmup=${STRATA_SCALE_WARMUP:-2}
run_timeout=${STRATA_SCALE_TIMEOUT:-300}
dtype=${STRATA_SCALE_DTYPE:-bf16}
tiny=${STRATA_SCALE_TINY:-0}
parts=${STRATA_SCALE_PARTS:-strata peer kill}
[[ ${STRATA_SCALE_PEER:-1} == 0 ]] && parts=${parts//peer/}
[[ ${STRATA_SCALE_KILL:-1} == 0 ]] && parts=${parts//kill/}
peak_tflops=${STRATA_SCALE_PEAK_TFLOPS:-989}
plan=${STRATA_SCALE_PLAN:-$build/examples/tools/strata-plan}
[[ $dtype == bf16 || $dtype == fp8 ]] || { echo "STRATA_SCALE_DTYPE=$dtype: use bf16 or fp8" >&2; exit 1; }
llama=$build/examples/train_llama
mixtral=$build/examples/train_mixtral
[[ -x $llama ]] || { echo "scale_bench: $llama is missing; build train_llama (with CUDA unless STRATA_SCALE_TINY=1)" >&2; exit 1; }
source "$here/launch.sh"

if [[ $tiny == 1 ]]; then
  gpus=${STRATA_SCALE_GPUS:-4}
  launch_threads=1
  echo "STRATA_SCALE_TINY: tiny shapes as $gpus threads of one CPU process" >"$out/device.txt"
  device=(--device cpu --dtype float)
  read -r L D H G F V T <<<"8 64 8 8 128 320 64"
  read -r ML MD MF <<<"4 64 128"
  vpp=2
  parts=${parts//peer/}
  parts=${parts//kill/}
else
  gpus=${STRATA_SCALE_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } >"$out/device.txt" 2>&1
  device=(--device cuda --bf16)
  read -r L D H G F V T <<<"32 4096 32 8 14336 128256 8192"
  read -r ML MD MF <<<"16 4096 14336"
  vpp=8
fi
((gpus >= 4)) || { echo "scale_bench: needs 4 or 8 GPUs, found $gpus" >&2; exit 1; }
global=$((4 * gpus))
fp8=()
[[ $dtype == fp8 ]] && fp8=(--fp8-format hybrid --fp8-recipe tensorwise)
model=(--num-layers "$L" --hidden-size "$D" --num-attention-heads "$H" --group-query-attention --num-query-groups "$G"
       --ffn-hidden-size "$F" --vocab-size "$V" --seq-length "$T" --rotary-base 500000)
moe_model=(--num-layers "$ML" --hidden-size "$MD" --num-attention-heads "$H" --group-query-attention --num-query-groups "$G"
           --ffn-hidden-size "$MF" --vocab-size "$V" --seq-length "$T" --rotary-base 1000000 --num-experts 8
           --moe-router-topk 2 --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2)
common=("${device[@]}" --mock-data-random --log-interval 1 --eval-iters 0 --sample-tokens 0
        --lr 3e-4 --lr-warmup-iters 1 --seed 1234 --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.1
        --adam-beta2 0.95 --no-deterministic-attention --micro-batch-size 1 --global-batch-size "$global" "${fp8[@]}")
recompute_args() {
  case $1 in
    none) ;;
    selective) echo --recompute-granularity selective ;;
    full) echo --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 ;;
  esac
}

# name|GPUs|trainer|label|planner key (tp pp schedule dp cp ep dist-opt)|recompute levels|trainer flags
tpo=--tp-comm-overlap
layouts_all=(
  "tp4|4|llama|tp=4 + SP, TP overlap|4 1 - 1 1 1 off|none selective full|--tensor-model-parallel-size 4 --sequence-parallel $tpo"
  "tp2-pp2-1f1b|4|llama|tp=2 + SP x pp=2, 1F1B|2 2 1f1b 1 1 1 off|none selective full|--tensor-model-parallel-size 2 --sequence-parallel $tpo --pipeline-model-parallel-size 2 --pipeline-schedule 1f1b --overlap-p2p-communication"
  "tp2-pp2-interleaved|4|llama|tp=2 + SP x pp=2, interleaved (2 chunks/rank)|2 2 interleaved/$vpp 1 1 1 off|none selective full|--tensor-model-parallel-size 2 --sequence-parallel $tpo --pipeline-model-parallel-size 2 --pipeline-schedule interleaved --num-layers-per-virtual-pipeline-stage $vpp --overlap-p2p-communication"
  "tp2-dp2-distopt|4|llama|tp=2 + SP x dp=2, distributed optimizer, overlaps|2 1 - 2 1 1 on|none selective full|--tensor-model-parallel-size 2 --sequence-parallel $tpo --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
  "tp2-cp2|4|llama|tp=2 + SP x cp=2 ring, distributed optimizer|2 1 - 1 2 1 on|none selective full|--tensor-model-parallel-size 2 --sequence-parallel $tpo --context-parallel-size 2 --cp-comm-type p2p --use-distributed-optimizer"
  "dp4-distopt|4|llama|dp=4, distributed optimizer, overlaps|1 1 - 4 1 1 on|none selective full|--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
  "pp4-zb|4|llama|pp=4, zero-bubble|1 4 zero-bubble 1 1 1 off|selective full|--pipeline-model-parallel-size 4 --pipeline-schedule zero-bubble --overlap-p2p-communication"
  "tp8|8|llama|tp=8 + SP, TP overlap|8 1 - 1 1 1 off|none selective full|--tensor-model-parallel-size 8 --sequence-parallel $tpo"
  "tp4-dp2-distopt|8|llama|tp=4 + SP x dp=2, distributed optimizer, overlaps|4 1 - 2 1 1 on|none selective full|--tensor-model-parallel-size 4 --sequence-parallel $tpo --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
  "tp2-pp2-dp2|8|llama|tp=2 + SP x pp=2 interleaved x dp=2, distributed optimizer|2 2 interleaved/$vpp 2 1 1 on|none selective full|--tensor-model-parallel-size 2 --sequence-parallel $tpo --pipeline-model-parallel-size 2 --pipeline-schedule interleaved --num-layers-per-virtual-pipeline-stage $vpp --overlap-p2p-communication --use-distributed-optimizer --overlap-grad-reduce"
  "tp2-cp2-dp2|8|llama|tp=2 + SP x cp=2 x dp=2, distributed optimizer|2 1 - 2 2 1 on|none selective full|--tensor-model-parallel-size 2 --sequence-parallel $tpo --context-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
  "mixtral-ep8|8|mixtral|Mixtral-shaped MoE, ep=8 x dp=8, distributed optimizer|1 1 - 8 1 8 on|none selective full|--expert-model-parallel-size 8 --use-distributed-optimizer --overlap-grad-reduce"
)
layout_field() { local IFS='|'; read -r -a f <<<"$1"; echo "${f[$2]}"; }
chosen=()
for spec in "${layouts_all[@]}"; do
  name=$(layout_field "$spec" 0)
  if [[ -n ${STRATA_SCALE_LAYOUTS:-} ]]; then
    [[ " $STRATA_SCALE_LAYOUTS " == *" $name "* ]] && chosen+=("$spec")
  elif [[ $(layout_field "$spec" 1) == "$gpus" ]]; then
    chosen+=("$spec")
  fi
done

# runs.tsv: kind, run, layout name, GPUs, label, planner key, recompute, note (read by the table).
runs=$out/runs.tsv
touch "$runs"
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$runs"; }
out_of_memory() { grep -l -i -E "out of memory|does not fit|cudaErrorMemoryAllocation" "$out/$1".rank*.log >/dev/null 2>&1; }
has_rate() { grep -q "tokens/s |" "$out/$1.rank0.log" 2>/dev/null; }

if [[ " $parts " == *" strata "* ]]; then
  for spec in "${chosen[@]}"; do
    IFS='|' read -r name n trainer label key levels flags <<<"$spec"
    ((n <= gpus)) || { record strata "$name" "$name" "$n" "$label" "$key" - "skipped: needs $n GPUs, $gpus present"; continue; }
    binary=$llama shape=("${model[@]}")
    [[ $trainer == mixtral ]] && binary=$mixtral shape=("${moe_model[@]}")
    [[ -x $binary ]] || { record strata "$name" "$name" "$n" "$label" "$key" - "skipped: $binary is missing"; continue; }
    note=""
    for level in $levels; do
      run=$name-$level
      echo "$name, recompute $level ..."
      # shellcheck disable=SC2046,SC2086
      launch_ranks "$run" "$n" "$binary" "${common[@]}" "${shape[@]}" $flags $(recompute_args "$level") --train-iters "$iters"
      if has_rate "$run" || ! out_of_memory "$run"; then break; fi
      note+="recompute $level: out of memory; "
    done
    record strata "$run" "$name" "$n" "$label" "$key" "$level" "$note"
  done
fi

if [[ " $parts " == *" peer "* ]]; then
  torchrun=(torchrun)
  command -v torchrun >/dev/null 2>&1 || torchrun=(python3 -m torch.distributed.run)
  default_peer="fsdp4:4 fsdp4:2 tp2-fsdp2:4"
  ((gpus >= 8)) && default_peer="fsdp8:4 fsdp8:2 tp2-fsdp4:4"
  for spec in ${STRATA_SCALE_PEER_LAYOUTS:-$default_peer}; do
    layout=${spec%%:*} local_batch=${spec#*:}
    run=torchtitan-$layout-b$local_batch
    echo "peer: torchtitan $layout, local batch $local_batch ..."
    cmd=("${torchrun[@]}" --standalone --nproc-per-node "$gpus" "$here/peers/torchtitan_llama.py" --layout "$layout"
         --seq "$T" --local-batch "$local_batch" --steps "${STRATA_SCALE_PEER_STEPS:-5}" --warmup "${STRATA_SCALE_PEER_WARMUP:-3}")
    echo "  ${cmd[*]}" >"$out/$run.cmd"
    timeout "$run_timeout" "${cmd[@]}" >"$out/$run.log" 2>&1
    echo "exit $?" >>"$out/$run.log"
    record peer "$run" "$run" "$gpus" "torchtitan $layout, local batch $local_batch" - - ""
  done
fi

if [[ " $parts " == *" kill "* ]]; then
  kill_layout=${STRATA_SCALE_KILL_LAYOUT:-tp2-dp2-distopt}
  ((gpus >= 8)) && kill_layout=${STRATA_SCALE_KILL_LAYOUT:-tp4-dp2-distopt}
  for spec in "${layouts_all[@]}"; do
    IFS='|' read -r name n trainer label key levels flags <<<"$spec"
    [[ $name == "$kill_layout" ]] || continue
    run=kill-$name
    level=${levels%% *}
    echo "kill: $name, the last rank killed after iteration 2 ..."
    # shellcheck disable=SC2046,SC2086
    export STRATA_EXIT_GRACE_SECONDS=5
    launch_ranks_background "$run" "$n" "$llama" "${common[@]}" "${model[@]}" $flags \
      $(recompute_args "$level") --train-iters 1000 --distributed-timeout-minutes 0.5
    waited=0
    until grep -q "iteration  *2/" "$out/$run.rank0.log" 2>/dev/null || ((waited >= run_timeout * 10)); do sleep 0.1; waited=$((waited + 1)); done
    victim=${launch_pids[$((n - 1))]}
    child=$(pgrep -P "$victim" | head -1)
    start=$(date +%s.%N)
    kill -9 "${child:-$victim}" 2>/dev/null
    codes=()
    for ((r = 0; r < n - 1; ++r)); do
      wait "${launch_pids[$r]}"
      codes+=("$?")
    done
    seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    wait "$victim" 2>/dev/null
    message=$(grep -m1 -i -E "error|timed out|peer|abort" "$out/$run.rank0.log" | cut -c1-160)
    record kill "$run" "$name" "$n" "rank $((n - 1)) killed after iteration 2" - - \
      "survivors ended ${seconds} s after the kill, exit codes ${codes[*]}; rank 0: ${message:-no message}"
  done
fi

# Planner predictions: the whole ranked table for this model and machine, for the summary to look up.
plan_flags=(--position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights
            --disable-bias-linear --global-batch-size "$global" --gpus-per-node "$gpus" --nodes 1 --gpu-memory-gib 1000
            --calibration "$here/calibration/h100_node.json" --top 100000 --max-context-parallel 2)
if [[ -x $plan ]]; then
  "$plan" "${model[@]}" "${plan_flags[@]}" >"$out/plan-llama.txt" 2>&1
  "$plan" "${moe_model[@]}" "${plan_flags[@]}" >"$out/plan-mixtral.txt" 2>&1
fi

python3 - "$out" "$warmup" "$peak_tflops" "$L" "$D" "$H" "$G" "$F" "$V" "$T" "$ML" "$MD" "$MF" <<'EOF'
import json, os, re, sys
out, warmup, peak = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
L, D, H, G, F, V, T, ML, MD, MF = map(int, sys.argv[4:])
def flops(layers, d, f, experts_active):  # per token: 6 N_matmul + 6 L D T
    attn = 2 * d * d + 2 * d * (d // H) * G
    return 6 * (layers * (attn + experts_active * 3 * d * f) + V * d) + 6 * layers * d * T
def gib(text):
    m = re.search(r"([\d.]+) (GiB|MiB|KiB)", text)
    return float(m.group(1)) * {"GiB": 1, "MiB": 1 / 1024, "KiB": 1 / 2**20}[m.group(2)] if m else None
def plan_rows(name):
    path = os.path.join(out, f"plan-{name}.txt")
    rows = {}
    if os.path.exists(path):
        for line in open(path):
            f = line.split()
            if len(f) >= 14 and f[0].isdigit():
                key = (f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9])  # tp pp schedule dp cp ep mbs recompute dopt
                rows.setdefault(key, (f[10], f[12], f[13]))  # GiB, tokens/s, MFU
    return rows
plans = {"llama": plan_rows("llama"), "mixtral": plan_rows("mixtral")}
def strata(run):
    path = os.path.join(out, run + ".rank0.log")
    if not os.path.exists(path): return None, None, None, "no log"
    log = open(path, errors="replace").read()
    tps = [float(x) for x in re.findall(r"\|\s+(\d+) tokens/s", log)]
    peak_line = re.search(r"peak device memory \(rank 0, caching allocator\): (.*) in use", log)
    mem = gib(peak_line.group(1)) if peak_line else None
    first = re.search(r"first iteration finished ([\d.]+) s after launch", log)
    bubbles = re.findall(r"pipeline rank (\d+): .*?measured bubble ([\d.]+)%", log)
    bubble = ", ".join(f"r{r} {b}%" for r, b in bubbles)
    if not tps:
        err = [l for l in log.splitlines() if re.search(r"error|out of memory|refused", l, re.I)]
        return None, mem, bubble, (err[0][:140] if err else f"no tokens/s line (see {run}.rank0.log)")
    tail = tps[warmup:] or tps[-1:]
    note = f"first step {float(first.group(1)):.0f} s after launch" if first else ""
    return sum(tail) / len(tail), mem, bubble, note
def peer(run):
    path = os.path.join(out, run + ".log")
    if not os.path.exists(path): return None, None, "no log"
    result = None
    for line in open(path, errors="replace"):
        if line.startswith("{"):
            try: result = json.loads(line)
            except ValueError: pass
    if not result:
        tail = [l.strip() for l in open(path, errors="replace") if l.strip()][-2:]
        return None, None, "no result line: " + " / ".join(tail)[:140]
    return result.get("tokens_per_s"), result.get("peak_mem_GiB"), result.get("error", "")
rows = ["| layout | GPUs | recompute | tokens/s | MFU per GPU | peak memory per GPU | bubble per pipeline rank | strata-plan: tokens/s, MFU, GiB | note |",
        "|---|---|---|---|---|---|---|---|---|"]
best = {}
lines = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "runs.tsv"))]
latest = {}  # a layout measured twice in <out-dir>: the later record
for f in lines: latest[(f[0], f[2])] = f
for (kind, name), f in latest.items():
    _, run, name, gpus, label, key, level, note = f
    gpus = int(gpus)
    moe = name.startswith("mixtral")
    per_token = flops(ML, MD, MF, 2) if moe else flops(L, D, F, 1)
    if kind == "strata":
        if note.startswith("skipped"):
            rows.append(f"| strata {label} | {gpus} | - | - | - | - | - | - | {note} |"); continue
        tok, mem, bubble, extra = strata(run)
        predicted = "-"
        if key != "-" and level != "-":
            tp, pp, sched, dp, cp, ep, dopt = key.split()
            p = plans["mixtral" if moe else "llama"].get((tp, pp, sched, dp, cp, ep, "1", level, dopt))
            if p: predicted = f"{int(p[1]):,}, {p[2]}, {p[0]}"
        mfu = f"{100 * tok * per_token / gpus / (peak * 1e12):.1f}%" if tok else "-"
        if tok and not moe: best[gpus] = max(best.get(gpus, (0, "")), (tok, label))
        rows.append(f"| strata {label} | {gpus} | {level} | {f'{tok:,.0f}' if tok else '-'} | {mfu} | "
                    f"{f'{mem:.1f} GiB' if mem else '-'} | {bubble or '-'} | {predicted} | {(note + extra).strip()} |")
    elif kind == "peer":
        tok, mem, err = peer(run)
        mfu = f"{100 * tok * per_token / gpus / (peak * 1e12):.1f}%" if tok else "-"
        rows.append(f"| {label} (FSDP2 + TP + torch.compile) | {gpus} | torchtitan's | {f'{tok:,.0f}' if tok else '-'} | {mfu} | "
                    f"{f'{mem:.1f} GiB' if mem else '-'} | - | - | {err or ''} |")
        if tok: best[f"peer{gpus}"] = max(best.get(f"peer{gpus}", (0, "")), (tok, label))
    else:
        rows.append(f"| {label} ({name}) | {gpus} | - | - | - | - | - | - | {note} |")
table = "\n".join(rows)
summary = []
for g in (4, 8):
    if g in best and f"peer{g}" in best:
        summary.append(f"{g} GPUs: strata's best ({best[g][1]}) {best[g][0] / best[f'peer{g}'][0]:.2f}x the peer's best ({best[f'peer{g}'][1]})")
if 4 in best and 8 in best:
    summary.append(f"8 GPUs / 4 GPUs, best layouts: {best[8][0] / best[4][0]:.2f}x")
table += "\n" + "".join(f"\n{s}" for s in summary)
open(os.path.join(out, "table.md"), "w").write(table + "\n")
print(table)
EOF
