#!/usr/bin/env bash
# tests/gpu/run_architecture_trainers.sh <build> [log dir]: the architecture presets of
# docs/MEGATRON.md (Llama 3.1, Qwen2, Qwen3, Mistral, gpt-oss dense), multi-token prediction's
# depths (--mtp-num-layers 2) and multi-latent attention (--multi-latent-attention) trained by
# train_llama on a GPU, and gpt-oss with its experts and linear biases (the router's, the experts',
# the attention's) and Qwen2-MoE (the gated shared expert) by pretrain_gpt. STRATA_ARCH_PRESETS="a b" runs
# those presets only.
#
# For each preset, at a small size (2 layers, hidden 128, 8 heads in 2 query groups, sequence 128,
# the shipped corpus):
#   1. fp32, 20 iterations on the GPU (--device cuda) against the same run on CPU threads
#      (--device cpu, one rank): every iteration's loss within 1e-3 relative (fp32 sums in other
#      orders, through 20 AdamW steps);
#   2. bf16, 40 iterations on the GPU: the loss of the last five iterations below that of the first
#      five (the run trains), and no NaN.
# Needs train_llama built with the CUDA trainers (-DSTRATA_CUDA_TRAINERS=ON); a check whose element
# type (float, bf16) was not compiled (STRATA_TRAINER_ELEMENTS) is listed as not run.
# Prints a table last; logs in <log dir> (default <build>/architecture-logs). Exit status non-zero
# when a check fails or a run fails.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${1:?usage: run_architecture_trainers.sh <build> [log dir]}
logs=${2:-$build/architecture-logs}
mkdir -p "$logs"
llama=$build/examples/train_llama
data=${STRATA_DATA_PATH:-$repo/examples/data/corpus_text_document}
status=0
rows=()

small=(--world-size 1 --num-layers 2 --hidden-size 128 --num-attention-heads 8 --group-query-attention --num-query-groups 2
  --seq-length 128 --micro-batch-size 4 --global-batch-size 4 --lr 1e-3 --lr-warmup-iters 2 --hidden-dropout 0
  --attention-dropout 0 --eval-iters 0 --sample-tokens 0 --log-interval 1 --seed 11 --data-path "$data")
# The presets of docs/MEGATRON.md (beyond train_llama's own defaults), at this size: kv-channels 32
# for Qwen3 (hidden / heads is 16), windows of 31 keys for Mistral and 15 for gpt-oss.
declare -A preset=(
  [llama3.1]="--rotary-base 500000 --use-rope-scaling"
  [qwen2]="--add-qkv-bias --rotary-base 1000000 --norm-epsilon 1e-6"
  [qwen3]="--qk-layernorm --kv-channels 32 --rotary-base 1000000 --norm-epsilon 1e-6"
  [mistral]="--rotary-base 10000 --norm-epsilon 1e-5 --window-size (31,0)"
  [gpt-oss]="--position-embedding-type yarn --rotary-base 150000 --rotary-scaling-factor 32 --yarn-original-max-position-embeddings 64 --no-yarn-correction-range-round-to-int --quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 7.0 --softmax-type learnable --window-size (15,0) --window-attn-skip-freq 2"
)
preset[deepseek-mtp]="--mtp-num-layers 2 --mtp-loss-scaling-factor 0.3"  # multi-token prediction's depths
# Multi-latent attention (heads of 16 + 16 dimensions, values of 16 padded to 32) with one MTP depth.
preset[deepseek-mla]="--multi-latent-attention --qk-layernorm --q-lora-rank 64 --kv-lora-rank 32 --qk-head-dim 16 --qk-pos-emb-head-dim 16 --v-head-dim 16 --rope-type rope --mtp-num-layers 1"
# gpt-oss with 4 experts (quick GeGLU, clamp and offset in the experts) and Megatron's default linear
# biases (no --disable-bias-linear): pretrain_gpt, since train_llama's preset has no biases.
preset[gpt-oss-moe]="--position-embedding-type yarn --normalization RMSNorm --untie-embeddings-and-output-weights ${preset[gpt-oss]#--position-embedding-type yarn } --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-token-dispatcher-type alltoall"
# The same with Megatron's benchmark router (--moe-router-force-load-balancing): random logits drawn by
# the device's counter-based generator, the same numbers on the GPU as on CPU threads.
preset[gpt-oss-flb]="${preset[gpt-oss-moe]} --moe-router-force-load-balancing"
# Qwen2-MoE: Qwen2's biases, 4 experts with a shared expert behind its sigmoid gate, top-k weights as
# they are (norm_topk_prob false).
preset[qwen2-moe]="--position-embedding-type rope --normalization RMSNorm --untie-embeddings-and-output-weights --swiglu ${preset[qwen2]} --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-shared-expert-intermediate-size 96 --moe-shared-expert-gate --moe-router-pre-softmax --moe-token-dispatcher-type alltoall"
declare -A binary=([gpt-oss-moe]=$build/examples/pretrain_gpt [gpt-oss-flb]=$build/examples/pretrain_gpt
                   [qwen2-moe]=$build/examples/pretrain_gpt)
order=(llama3.1 qwen2 qwen3 mistral gpt-oss gpt-oss-moe gpt-oss-flb qwen2-moe deepseek-mtp deepseek-mla)
[[ -n ${STRATA_ARCH_PRESETS:-} ]] && read -r -a order <<<"$STRATA_ARCH_PRESETS"  # a subset, e.g. "deepseek-mla"
for name in "${order[@]}"; do  # every trainer the chosen presets need, built with the CUDA trainers
  trainer=${binary[$name]:-$llama}
  [[ -x $trainer ]] || { echo "no $trainer: build it with -DSTRATA_CUDA_TRAINERS=ON"; exit 2; }
done

run() {  # run <preset> <name> <flags...>: 0 done, 1 failed, 2 not run (the element type was not compiled)
  local trainer=${binary[$1]:-$llama} name=$2
  shift 2
  rm -f "$logs/$name.jsonl"
  timeout 300 "$trainer" "$@" --log-jsonl "$logs/$name.jsonl" >"$logs/$name.log" 2>&1 && return 0
  grep -q STRATA_TRAINER_ELEMENTS "$logs/$name.log" && return 2
  echo "$name: FAILED: $(tail -n 2 "$logs/$name.log" | tr '\n' ' ')"
  return 1
}

# fp32_equal <gpu jsonl> <cpu jsonl>: the verdict line of "every loss within 1e-3 of the CPU run".
fp32_equal() {
  python3 - "$1" "$2" <<'EOF'
import json, math, sys
a = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
b = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
if len(a) != len(b) or not a:
    print(f"FAIL: {len(a)} iterations against {len(b)}"); sys.exit(1)
worst, at = 0.0, 0
for x, y in zip(a, b):
    e = abs(x['loss'] - y['loss']) / abs(y['loss']) if math.isfinite(x['loss']) else math.inf
    if e > worst: worst, at = e, x['iteration']
ok = worst <= 1e-3
print(f"{'PASS' if ok else 'FAIL'}: {len(a)} losses within {worst:.1e} of the CPU run (iteration {at}); "
      f"{a[0]['loss']:.4f} -> {a[-1]['loss']:.4f}")
sys.exit(0 if ok else 1)
EOF
}
# bf16_trains <jsonl>: the verdict line of "40 finite losses, the last five below the first five".
bf16_trains() {
  python3 - "$1" <<'EOF'
import json, math, sys
a = [json.loads(l)['loss'] for l in open(sys.argv[1]) if '"loss"' in l]
first, last = sum(a[:5]) / 5, sum(a[-5:]) / 5
ok = len(a) == 40 and all(math.isfinite(x) for x in a) and last < first
print(f"{'PASS' if ok else 'FAIL'}: {len(a)} iterations, mean loss of the first five {first:.4f}, of the last five {last:.4f}")
sys.exit(0 if ok else 1)
EOF
}
# record <preset> <title> <check> <result of the runs> <element> <verdict command...>: prints the
# check's line and adds its table row: not run (result 2: the element type was not compiled), the
# verdict command's line (result 0), or FAIL (a run failed).
record() {
  local preset=$1 title=$2 check=$3 result=$4 element=$5 line
  shift 5
  if [[ $result == 2 ]]; then
    line="not run: train_llama was built without $element (STRATA_TRAINER_ELEMENTS)"
  elif [[ $result == 0 ]]; then
    line=$("$@") || status=1
  else
    line="FAIL: a run failed (logs in $logs)"
    status=1
  fi
  echo "$preset $title: $line"
  rows+=("| $preset | $check | ${line%%:*} | ${line#*: } |")
}

for name in "${order[@]}"; do
  read -r -a flags <<<"${preset[$name]}"
  run "$name" "$name-cuda-fp32" --device cuda --dtype float --train-iters 20 "${small[@]}" "${flags[@]}"
  result=$?
  [[ $result == 0 ]] && { run "$name" "$name-cpu-fp32" --device cpu --dtype float --train-iters 20 "${small[@]}" "${flags[@]}"; result=$?; }
  record "$name" "fp32 GPU = CPU" "fp32, GPU against CPU threads" $result float \
    fp32_equal "$logs/$name-cuda-fp32.jsonl" "$logs/$name-cpu-fp32.jsonl"
  run "$name" "$name-cuda-bf16" --device cuda --dtype bf16 --train-iters 40 "${small[@]}" "${flags[@]}"
  record "$name" "bf16 trains" "bf16 on the GPU, 40 iterations" $? bf16 bf16_trains "$logs/$name-cuda-bf16.jsonl"
done

echo
echo "| preset | check | verdict | detail |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
if [[ $status == 0 ]]; then echo "SUITE architecture trainers: passed"; else echo "SUITE architecture trainers: FAILED"; fi
exit $status
