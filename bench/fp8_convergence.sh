#!/usr/bin/env bash
# bench/fp8_convergence.sh [build-dir] [out-dir]: the loss curve of FP8 training beside bf16's on one
# GPU, in one command: GPT 350M (24 layers, hidden 1024, 16 heads, seq 1024) on text no run reads
# twice, STRATA_FP8_CONV_ITERS iterations (default 2000), the same seed, data order and
# learning-rate schedule (3e-4 cosine to 3e-5, warm-up 100) for every run:
#   bf16                            the reference
#   fp8 tensorwise                  --fp8-format hybrid --fp8-recipe tensorwise
#   fp8 delayed                     --fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024
#                                   --fp8-amax-compute-algo max (the Llama 3 example line's recipe)
#   fp8 blockwise                   --fp8-format e4m3 --fp8-recipe blockwise (1x128 / 128x128 blocks)
#   blockwise-hybrid                blockwise with E5M2 gradients (--fp8-format hybrid), and
#   tensorwise-e4m3                 tensorwise with E4M3 gradients (--fp8-format e4m3): the two recipes
#                                   with each other's gradient format, to tell the format's part in a
#                                   difference between them from the scaling's (not by default)
#   delayed-default                 --fp8-format hybrid --fp8-recipe delayed with Megatron's defaults
#                                   (history 1, most_recent: each step's scale from the step before) (not by default)
#   bf16-reseeded                   bf16 with another --seed (initialization and data order): how far
#                                   two bf16 runs lie apart (not by default)
#   bf16-nondeterministic           bf16 with --no-deterministic-attention: the same initialization and
#                                   data, only the attention backward's summation order differs: how far
#                                   two runs apart by rounding alone drift, the floor of the distances (not by default)
#   <run>-nondeterministic, <run>.N any run with --no-deterministic-attention, and another draw of it
#                                   (bf16-nondeterministic.2, tensorwise-nondeterministic.3): since the
#                                   floor varies from draw to draw, several draws show its spread
# The corpus (STRATA_FP8_CONV_CORPUS): "bible", the whole King James Bible
# (examples/data/kjv_bible.txt.gz, 4.15M byte tokens), or "library", the Bible and eight novels
# (examples/data/novels.txt.gz, 14.5M byte tokens more: 18.6M in all); by default the Bible when the
# run reads no more than it holds (micro-batch 2: 2,000 iterations of 2 x 1024 read 4.10M tokens),
# else the library (micro-batch 8: 16.4M tokens), so every sample is new text (the shipped
# corpus_text_document, 817K tokens, would be read five times over and measure memorization). It is
# tokenized first by <build-dir>/examples/tools/preprocess_data into <out-dir>.
# STRATA_FP8_CONV_BATCH sets the micro-batch (default 2). STRATA_FP8_CONV_RUNS picks some of
# "bf16 tensorwise delayed blockwise" and the runs not made by default. The trainer logs the mean loss
# of every 10 iterations; the table gives, after iteration STRATA_FP8_CONV_FROM (default 200), each
# curve's largest, mean and mean signed relative distance from bf16's at the same iterations, the
# largest distance over 100-iteration means, how many logged points lie beyond 1%, the last logged
# loss and tokens/s;
# <out-dir>/fp8_convergence.svg plots the curves (bench/plot_losses.py). Where bf16-nondeterministic
# runs beside bf16, a second table gives each curve's distance from the band the two bf16 runs span
# (zero inside it): both are bf16 runs, so the band is as much of bf16's curve as two runs pin down.
# Every STRATA_FP8_CONV_EVAL_INTERVAL iterations (default 50; 0: none) each run also takes the loss on
# the same STRATA_FP8_CONV_EVAL_ITERS global batches (default 16: 131K tokens at micro-batch 8) of the
# held-out part of the corpus (--split 969,30,1: the validation part, which training never reads), forward
# only: the table's second half compares those curves the same way, and
# <out-dir>/fp8_convergence_validation.svg plots them. A training loss is one batch's, seen once,
# so two runs' losses at a logged point differ by how each model meets those 10 batches; the
# validation loss is every model's on the same 131K tokens.
# Needs <build-dir>/examples/train_gpt built with CUDA and preprocess_data. It measures and prints;
# it asserts nothing.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build-bench}
out=${2:-$build/fp8-convergence-logs}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$here/cudnn_frontend_check.sh"
warn_without_cudnn_frontend "$build" "$out"
iters=${STRATA_FP8_CONV_ITERS:-2000}
eval_interval=${STRATA_FP8_CONV_EVAL_INTERVAL:-50}
eval_iters=${STRATA_FP8_CONV_EVAL_ITERS:-16}
(( eval_interval > 0 )) || eval_iters=0
from=${STRATA_FP8_CONV_FROM:-200}
runs=${STRATA_FP8_CONV_RUNS:-bf16 tensorwise delayed blockwise}
batch=${STRATA_FP8_CONV_BATCH:-2}
trainer=$build/examples/train_gpt
preprocess=$build/examples/tools/preprocess_data
[[ -x $trainer ]] || { echo "fp8_convergence: $trainer is missing; build train_gpt with CUDA first" >&2; exit 1; }
[[ -x $preprocess ]] || { echo "fp8_convergence: $preprocess is missing; build preprocess_data first" >&2; exit 1; }
tokens=$(( iters * batch * 1024 ))
corpus=${STRATA_FP8_CONV_CORPUS:-auto}
if [[ $corpus == auto ]]; then
  corpus=library
  (( tokens <= 4150000 )) && corpus=bible
fi
case $corpus in
  bible) input="$repo/examples/data/kjv_bible.txt.gz" ;;
  library)  # the Bible, then the novels: one plain-text file, a document per paragraph
    input="$out/library.txt"
    { gzip -dc "$repo/examples/data/kjv_bible.txt.gz" && echo && gzip -dc "$repo/examples/data/novels.txt.gz"; } >"$input" ||
      { echo "fp8_convergence: cannot unpack the corpus into $input" >&2; exit 1; } ;;
  *) echo "fp8_convergence: STRATA_FP8_CONV_CORPUS='$corpus' is none of bible, library, auto" >&2; exit 1 ;;
esac
echo "fp8_convergence: corpus '$corpus' ($input), $iters iterations x $batch x 1024 = $tokens tokens"
held=$([[ $corpus == bible ]] && echo 4150830 || echo 18577572)
(( tokens <= held )) || echo "fp8_convergence: warning: the run reads $tokens tokens, the corpus holds $held: some text is read" \
  "twice, and the curves measure memorization there" | tee "$out/warning-corpus.txt"
"$preprocess" --input "$input" --output-prefix "$out/corpus" --append-eod \
  --log-interval 0 >"$out/preprocess.log" 2>&1 ||
  { echo "fp8_convergence: tokenizing the corpus failed: $out/preprocess.log" >&2; exit 1; }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } >"$out/device.txt" 2>&1
common=(--device cuda --bf16 --data-path "$out/corpus_text_document" --num-layers 24 --hidden-size 1024
        --num-attention-heads 16 --seq-length 1024 --micro-batch-size "$batch" --global-batch-size "$batch" --train-iters "$iters"
        --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 100 --weight-decay 0.1 --adam-beta2 0.95
        --hidden-dropout 0 --attention-dropout 0 --log-interval 10 --split 969,30,1 --eval-interval "$eval_interval"
        --eval-iters "$eval_iters" --sample-tokens 0
        --world-size 1)
# flags_of <run>: the run's seed and flags into `seed` and `extra`. A "-nondeterministic" suffix adds
# --no-deterministic-attention to any run, and a ".N" suffix names another draw of the same run
# (bf16-nondeterministic.2: a second draw of the noise floor; tensorwise-nondeterministic.2).
flags_of() {
  local kind=${1%%.*}
  seed=1234 extra=()
  if [[ $kind == *-nondeterministic ]]; then extra=(--no-deterministic-attention); kind=${kind%-nondeterministic}; fi
  case $kind in
    bf16) ;;
    bf16-reseeded) seed=4321 ;;
    delayed-default) extra+=(--fp8-format hybrid --fp8-recipe delayed) ;;
    tensorwise) extra+=(--fp8-format hybrid --fp8-recipe tensorwise) ;;
    delayed) extra+=(--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo max) ;;
    blockwise) extra+=(--fp8-format e4m3 --fp8-recipe blockwise) ;;
    blockwise-hybrid) extra+=(--fp8-format hybrid --fp8-recipe blockwise) ;;
    tensorwise-e4m3) extra+=(--fp8-format e4m3 --fp8-recipe tensorwise) ;;
    *) return 1 ;;
  esac
}
for run in $runs; do  # every name checked before the first run
  flags_of "$run" || { echo "fp8_convergence: unknown run '$run' (bf16, tensorwise, delayed, blockwise, delayed-default, blockwise-hybrid, tensorwise-e4m3," \
                            "bf16-reseeded, each with an optional -nondeterministic and .N suffix)" >&2; exit 1; }
done
for run in $runs; do
  flags_of "$run"
  echo "$run: $iters iterations ..."
  echo "$trainer ${common[*]} --seed $seed ${extra[*]}" >"$out/$run.cmd"
  "$trainer" "${common[@]}" --seed "$seed" "${extra[@]}" >"$out/$run.log" 2>&1
  echo "exit $?" >>"$out/$run.log"
done
# with a second bf16 run (bf16-nondeterministic, and any further draws of it), each curve's distance
# from the band the bf16 runs span is printed too
band=()
bf16_runs=$(for run in $runs; do [[ $run == bf16 || ${run%%.*} == bf16-nondeterministic ]] && echo "$run"; done | paste -sd, -)
[[ " $runs " == *" bf16 "* && $bf16_runs == *,* ]] && band=(--band "$bf16_runs")
python3 "$here/plot_losses.py" --out "$out/fp8_convergence.svg" --from "$from" --reference bf16 "${band[@]}" \
  $(for run in $runs; do echo "$run=$out/$run.log"; done) | tee "$out/table.md"
if (( eval_iters > 0 )); then
  echo
  echo "validation loss ($eval_iters global batches of the held-out part, every $eval_interval iterations):"
  python3 "$here/plot_losses.py" --validation --out "$out/fp8_convergence_validation.svg" --from "$from" --reference bf16 "${band[@]}" \
    $(for run in $runs; do echo "$run=$out/$run.log"; done)
fi | tee -a "$out/table.md"
