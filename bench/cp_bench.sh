#!/usr/bin/env bash
# bench/cp_bench.sh [build-dir] [out-dir]: long-context training with context parallelism on 2 GPUs
# of one host, beside PyTorch's own context parallelism (bench/peers/torch_cp.py), in one command.
#
# Model: a Llama of about 1.1B parameters (16 layers, hidden 2048, 16 heads, 8 query groups, SwiGLU
# width 8192, vocab 32000, untied output), bf16, micro-batch 1 = global batch 1, random tokens
# (--mock-data-random), every layer recomputed (--recompute-granularity full, one layer per chunk),
# the fused chunked loss (always on in strata; in chunks of 8192 tokens in the peer), and cuDNN's
# attention backward that adds dQ up with atomics (--no-deterministic-attention): the deterministic
# one needs a dP scratch of b x heads x s x s x 2 bytes (128 GiB at 64K tokens on one GPU) with the
# cuDNN releases seen here. PyTorch's SDPA backward is not deterministic either.
# Per sequence length (STRATA_CPBENCH_SEQS, default "16384 65536 131072"):
#   strata cp=1 on 1 GPU; cp=2 ring attention (--cp-comm-type p2p); cp=2 all-to-all (a2a); cp=2 ring
#   with the distributed optimizer (its state sharded over the cp group), each as one process per
#   GPU started as torchrun does. The peer (STRATA_CPBENCH_PEER_SEQS, default
#   "65536"; empty skips it): 1 GPU, and cp=2 under torchrun (rotate method alltoall, the ring).
# tokens/s: the mean of the log lines after the first STRATA_CPBENCH_WARMUP (default 2) of
# STRATA_CPBENCH_ITERS (default 6) iterations, logged every iteration; the peer times 3 steps after
# 2. MFU per GPU with 6 N_matmul + 6 L D T FLOPs per token over 989 TFLOP/s. Peak memory: rank 0's
# caching allocator (strata) or torch.cuda.max_memory_allocated (peer). A run that does not fit
# shows its error in the table. It measures and prints; it asserts nothing about speed.
# Needs <build-dir>/examples/train_llama built with CUDA, NCCL and cuDNN. Logs: <out-dir>.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build-bench}
out=${2:-$build/cp-bench-logs}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
seqs=${STRATA_CPBENCH_SEQS:-16384 65536 131072}
peer_seqs=${STRATA_CPBENCH_PEER_SEQS-65536}
iters=${STRATA_CPBENCH_ITERS:-6}
warmup=${STRATA_CPBENCH_WARMUP:-2}
run_timeout=${STRATA_CPBENCH_TIMEOUT:-420}
llama=$build/examples/train_llama
[[ -x $llama ]] || { echo "cp_bench: $llama is missing; build train_llama with CUDA first" >&2; exit 1; }
source "$here/cudnn_frontend_check.sh"
warn_without_cudnn_frontend "$build" "$out"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } >"$out/device.txt" 2>&1
torchrun=(torchrun)
command -v torchrun >/dev/null 2>&1 || torchrun=(python3 -m torch.distributed.run)

shape=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8 --ffn-hidden-size 8192
       --vocab-size 32000 --micro-batch-size 1 --global-batch-size 1 --tensor-model-parallel-size 1)
common=(--device cuda --bf16 --mock-data-random --train-iters "$iters" --log-interval 1 --eval-iters 0 --sample-tokens 0
        --lr 3e-4 --lr-warmup-iters 1 --seed 1234 --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.1
        --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --no-deterministic-attention)

# strata RUN NPROC ARGS...: the trainer alone (1), or one process per GPU with torchrun's variables.
source "$here/launch.sh"
strata() {
  local run=$1 n=$2
  shift 2
  launch_ranks "$run" "$n" "$llama" "$@"
}
peer() {
  local run=$1 n=$2
  shift 2
  local cmd=(python3 "$here/peers/torch_cp.py" "$@")
  ((n > 1)) && cmd=("${torchrun[@]}" --standalone --nproc-per-node "$n" "$here/peers/torch_cp.py" "$@")
  echo "  ${cmd[*]}" >"$out/$run.cmd"
  timeout "$run_timeout" "${cmd[@]}" >"$out/$run.log" 2>&1
  echo "exit $?" >>"$out/$run.log"
}

for seq in $seqs; do
  echo "seq $seq: strata cp=1, cp=2 p2p, cp=2 a2a ..."
  strata "strata-s$seq-cp1" 1 "${common[@]}" "${shape[@]}" --seq-length "$seq"
  strata "strata-s$seq-cp2-p2p" 2 "${common[@]}" "${shape[@]}" --seq-length "$seq" --context-parallel-size 2 --cp-comm-type p2p
  strata "strata-s$seq-cp2-a2a" 2 "${common[@]}" "${shape[@]}" --seq-length "$seq" --context-parallel-size 2 --cp-comm-type a2a
  strata "strata-s$seq-cp2-p2p-zero" 2 "${common[@]}" "${shape[@]}" --seq-length "$seq" --context-parallel-size 2 --cp-comm-type p2p \
    --use-distributed-optimizer
done
for seq in $peer_seqs; do
  echo "seq $seq: PyTorch 1 GPU, cp=2 ..."
  peer "torch-s$seq-cp1" 1 --seq "$seq"
  peer "torch-s$seq-cp2" 2 --seq "$seq"
done

python3 - "$out" "$seqs" "$peer_seqs" "$warmup" <<'EOF'
import json, os, re, sys
out, seqs, peer_seqs, warmup = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4])
L, D, V, F, H, G = 16, 2048, 32000, 8192, 16, 8
n_matmul = L * (D * D * 2 + 2 * D * (D // H) * G + 3 * D * F) + V * D  # blocks + output layer
def mfu(tok, seq, gpus): return 100 * (6 * n_matmul + 6 * L * D * seq) * tok / gpus / 989e12
def strata(run):
    path = os.path.join(out, run + ".rank0.log")
    if not os.path.exists(path): return None, None, "no log"
    log = open(path, errors="replace").read()
    tps = [float(x) for x in re.findall(r"\|\s+(\d+) tokens/s", log)]
    peak = re.search(r"peak device memory \(rank 0, caching allocator\): ([\d.]+) (\w+) in use", log)
    mem = None
    if peak: mem = float(peak.group(1)) * {"GiB": 1, "MiB": 1 / 1024, "KiB": 1 / 2**20}.get(peak.group(2), 1)
    if not tps:
        err = [l for l in log.splitlines() if "error" in l.lower() or "out of memory" in l.lower()]
        return None, mem, (err[0][:120] if err else "no tokens/s line (see " + run + ".rank0.log)")
    tail = tps[warmup:] or tps[-1:]
    return sum(tail) / len(tail), mem, ""
def peer(run):
    path = os.path.join(out, run + ".log")
    if not os.path.exists(path): return None, None, "no log"
    for line in open(path, errors="replace"):
        if line.startswith("{"):
            j = json.loads(line)
            return j.get("tokens_per_s"), j.get("peak_mem_GiB"), j.get("error", "")
    return None, None, "no result line (see " + run + ".log)"
rows = ["| seq | stack | layout | tokens/s | x 1 GPU | MFU per GPU | peak memory per GPU | x 1 GPU's memory | note |",
        "|---|---|---|---|---|---|---|---|---|"]
for seq in seqs:
    s = int(seq)
    base = strata(f"strata-s{seq}-cp1")
    for run, layout, gpus in [(f"strata-s{seq}-cp1", "1 GPU", 1), (f"strata-s{seq}-cp2-p2p", "cp=2 p2p (ring)", 2),
                              (f"strata-s{seq}-cp2-a2a", "cp=2 a2a (all-to-all)", 2),
                              (f"strata-s{seq}-cp2-p2p-zero", "cp=2 p2p + distributed optimizer", 2)]:
        tok, mem, note = strata(run)
        speed = f"{tok / base[0]:.2f}x" if tok and base[0] else ""
        memx = f"{mem / base[1]:.2f}" if mem and base[1] and base[0] else ""
        rows.append(f"| {s // 1024}K | strata | {layout} | {f'{tok:,.0f}' if tok else '-'} | {speed} | "
                    f"{f'{mfu(tok, s, gpus):.1f}%' if tok else '-'} | {f'{mem:.1f} GiB' if mem else '-'} | {memx} | {note} |")
for seq in peer_seqs:
    s = int(seq)
    base = peer(f"torch-s{seq}-cp1")
    for run, layout, gpus in [(f"torch-s{seq}-cp1", "1 GPU", 1), (f"torch-s{seq}-cp2", "cp=2 (ring, alltoall rotate)", 2)]:
        tok, mem, note = peer(run)
        speed = f"{tok / base[0]:.2f}x" if tok and base[0] else ""
        memx = f"{mem / base[1]:.2f}" if mem and base[1] and base[0] else ""
        rows.append(f"| {s // 1024}K | PyTorch context_parallel (eager) | {layout} | {f'{tok:,.0f}' if tok else '-'} | {speed} | "
                    f"{f'{mfu(tok, s, gpus):.1f}%' if tok else '-'} | {f'{mem:.1f} GiB' if mem else '-'} | {memx} | {note} |")
table = "\n".join(rows)
open(os.path.join(out, "table.md"), "w").write(table + "\n")
print(table)
EOF
