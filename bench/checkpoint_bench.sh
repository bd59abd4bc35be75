#!/usr/bin/env bash
# bench/checkpoint_bench.sh <train_gpt> [out-dir]: the cost of checkpointing on one GPU. GPT-2 124M
# (bf16, random tokens, seq 1024, batch 32) trains STRATA_CKPT_ITERS iterations (default 60) three
# times: without saving, saving every STRATA_CKPT_INTERVAL iterations (default 20) in place, and
# the same with --async-save (device-to-host copies at the step boundary, the files written by a
# background thread while training goes on, committed at a later step). Per run, from the per-
# iteration JSONL (--log-interval 1): the median step time, the step time of the iterations that
# save, of the iterations while a background write is in flight (the two after a save), the whole
# run's wall time, and the checkpoint's size on disk.
# It measures and prints; it asserts nothing about speed.
set -u
trainer=${1:?usage: checkpoint_bench.sh <train_gpt> [out-dir]}
out=${2:-checkpoint-bench}
mkdir -p "$out"
out=$(cd "$out" && pwd)
iters=${STRATA_CKPT_ITERS:-60}
interval=${STRATA_CKPT_INTERVAL:-20}
ckpt=${STRATA_CKPT_DIR:-$out/ckpt}
common=(--device cuda --mock-data-random --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024
        --vocab-size 50304 --micro-batch-size 32 --global-batch-size 32 --train-iters "$iters" --log-interval 1
        --eval-iters 0 --sample-tokens 0 --lr 6e-4 --lr-warmup-iters 2 --seed 1234 --dtype bf16 --quiet
        --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.1 --adam-beta2 0.95 --lr-decay-style cosine)
for mode in none sync async; do
  rm -rf "$ckpt"
  extra=()
  [[ $mode != none ]] && extra=(--save "$ckpt" --save-interval "$interval")
  [[ $mode == async ]] && extra+=(--async-save)
  echo "checkpoint bench: $mode ..."
  start=$(date +%s.%N)
  timeout 900 "$trainer" "${common[@]}" "${extra[@]}" --log-jsonl "$out/$mode.jsonl" >"$out/$mode.log" 2>&1
  status=$?
  end=$(date +%s.%N)
  echo "exit $status" >>"$out/$mode.log"
  python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$start" "$end" >"$out/$mode.wall"
  if [[ $mode != none ]]; then du -sb "$ckpt/iter_$(printf %07d "$interval")" 2>/dev/null | cut -f1 >"$out/$mode.bytes"; fi
done
rm -rf "$ckpt"
python3 - "$out" "$interval" <<'PY'
import json, statistics, sys, os
out, interval = sys.argv[1], int(sys.argv[2])
rows = ["| run | median step | saving steps | 2 steps after a save | wall time | checkpoint size | same losses as no save |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
def load(mode):
    try: return [json.loads(l) for l in open(f"{out}/{mode}.jsonl") if '"step_seconds"' in l]
    except OSError: return []
base = [r["loss"] for r in load("none")]
for mode in ["none", "sync", "async"]:
    runs = load(mode)
    if not runs:
        rows.append(f"| {mode} | failed (see {mode}.log) | | | | | |"); continue
    step = {r["iteration"]: r["step_seconds"] for r in runs}
    steady = [v for k, v in step.items() if k > 3]
    saving = [step[k] for k in step if k % interval == 0 and k > 3]
    after = [step[k + d] for k in step if k % interval == 0 for d in (1, 2) if k + d in step]
    wall = open(f"{out}/{mode}.wall").read().strip()
    size = open(f"{out}/{mode}.bytes").read().strip() if os.path.exists(f"{out}/{mode}.bytes") else ""
    ms = lambda xs: f"{1000 * statistics.mean(xs):.1f} ms" if xs else "-"
    same = "yes" if [r["loss"] for r in runs] == base else "no"
    rows.append(f"| {mode} | {1000 * statistics.median(steady):.1f} ms | {ms(saving) if mode != 'none' else '-'} | "
                f"{ms(after) if mode != 'none' else '-'} | {float(wall):.1f} s | "
                f"{f'{int(size) / 2**30:.2f} GiB' if size else '-'} | {same} |")
print("\n".join(rows))
PY
