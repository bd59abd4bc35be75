#!/usr/bin/env bash
# bench/plan_at_scale.sh [strata-plan binary] [calibration]: the plans of docs/PLANNING.md ("Plans
# past the machines here"): Llama 3 8B / 70B / 405B and a DeepSeek-V3-like model on 8 / 64 / 1,024 /
# 16,384 H100s (8 per node, InfiniBand between nodes), one table row per plan, printed in the
# document's format. Needs no GPU: strata-plan predicts from the calibration file.
set -u
here=$(cd "$(dirname "$0")" && pwd)
plan=${1:-$here/../build/examples/tools/strata-plan}
calibration=${2:-$here/calibration/h100_node.json}
[[ -x $plan ]] || { echo "plan_at_scale: $plan is missing; build the strata_plan target" >&2; exit 1; }
llama="--position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear --group-query-attention --num-query-groups 8 --vocab-size 128256 --seq-length 8192"
declare -A model=(
  ["Llama 3 8B"]="--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 $llama"
  ["Llama 3 70B"]="--num-layers 80 --hidden-size 8192 --num-attention-heads 64 --ffn-hidden-size 28672 $llama"
  ["Llama 3 405B"]="--num-layers 126 --hidden-size 16384 --num-attention-heads 128 --ffn-hidden-size 53248 $llama"
  ["DeepSeek-V3-like"]="--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm --moe-layer-freq [0]*3+[1]*58 --ffn-hidden-size 18432 --num-experts 256 --moe-ffn-hidden-size 2048 --moe-router-topk 8 --moe-shared-expert-intermediate-size 2048 --moe-token-dispatcher-type alltoall --position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 129280 --seq-length 4096"
)
echo "| model | GPUs | global batch | enumerated / refused / valid / fit | planner's best layout | GiB per GPU | step | tokens/s | MFU | where the best step goes |"
echo "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- |"
for name in "Llama 3 8B" "Llama 3 70B" "Llama 3 405B" "DeepSeek-V3-like"; do
  for gpus in 8 64 1024 16384; do
    case $gpus in 8) batch=128;; 64) batch=512;; 1024) batch=1024;; *) batch=2048;; esac
    [[ $name == DeepSeek* ]] && batch=$((2 * batch))
    nodes=$((gpus / 8)); per_node=8
    out=$("$plan" ${model[$name]} --global-batch-size $batch --gpus-per-node $per_node --nodes $nodes --gpu-memory-gib 80 \
          --calibration "$calibration" --top 1 2>&1)
    python3 - "$name" "$gpus" "$batch" "$out" <<'PY'
import re, sys
name, gpus, batch, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
counts = re.search(r"(\d+) layouts enumerated: (\d+) refused by the trainers' validation, (\d+) valid, (\d+) fit", out)
c = "/".join(counts.groups()) if counts else "?"
row = None
lines = out.splitlines()
for i, l in enumerate(lines):
    if l.startswith("rank ") and i + 1 < len(lines):  # rank tp pp schedule dp cp ep mbs recompute dopt GiB step tokens MFU
        m = re.match(r"\s*\d+\s+(\d+)\s+(\d+)\s+(.*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(none|selective|full)\s+(on|off)"
                     r"\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+([\d.]+%)", lines[i + 1])
        row = m.groups() if m else None
        break
breakdown = re.search(r"best step ([\d.]+) ms = (.*)", out)
if not row or not breakdown or not counts or int(counts.group(4)) == 0:
    print(f"| {name} | {gpus} | {batch} | {c} | none fits | | | | | {out.splitlines()[-1][:120] if out else ''} |")
    sys.exit()
tp, pp, sched, dp, cp, ep, mbs, rec, dopt, gib, step, tok, mfu = row
layout = f"tp{tp} pp{pp}" + (f" {sched}" if sched != "-" else "") + f" dp{dp}" + (f" cp{cp}" if cp != "1" else "") + \
         (f" ep{ep}" if ep != "1" else "") + f" mbs{mbs}" + (f" recompute {rec}" if rec != "none" else "") + (" dist-opt" if dopt == "on" else "")
total = float(breakdown.group(1))
parts = [(float(v), k.strip()) for k, v in re.findall(r"([a-z -]+?) ([\d.]+)(?: \+|$)", breakdown.group(2))]
top = sorted(parts, reverse=True)[:3]
goes = ", ".join(f"{k.replace('tensor-parallel', 'tp').replace('context-parallel', 'cp').replace('data-parallel', 'dp').replace('expert-parallel', 'ep')} {100 * v / total:.0f}%" for v, k in top)
print(f"| {name} | {gpus} | {batch} | {c} | {layout} | {gib} | {float(step) / 1000:.2f} s | {int(tok):,} | {mfu} | {goes} |")
PY
  done
done
