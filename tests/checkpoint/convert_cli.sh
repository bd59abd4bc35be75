#!/usr/bin/env bash
# strata-convert from the command line: a tiny GPT trained at tp=2 x pp=2 on CPU threads and saved,
# converted to tp=4 x pp=1, then resumed from the converted checkpoint; the resumed run starts at
# the saved iteration; a size the target does not divide is refused; --save-hf exports it to
# Hugging Face's format, and the trainer starts from that with --load-hf (and exports it again with
# the source's eos_token_id); flags out of range are refused before anything is read, and an
# expert-parallel target for a model without experts is refused.
#   convert_cli.sh <train_gpt> <strata-convert>
set -euo pipefail
train=$1
convert=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Flags out of range are refused with a sentence before anything is read or allocated.
refused() {  # refused <text the error must hold> <strata-convert arguments...>
  local want=$1; shift
  if "$convert" "$@" 2> "$work/err"; then echo "strata-convert $* was accepted"; exit 1; fi
  grep -q -- "$want" "$work/err" || { echo "strata-convert $*: the error does not say '$want':"; cat "$work/err"; exit 1; }
}
refused "--ckpt-step -7 is negative" --load "$work/none" --save "$work/x" --ckpt-step -7
refused "--target-data-parallel-size 2147483647" --load "$work/none" --save "$work/x" --target-data-parallel-size 2147483647
refused "--target-expert-parallel-size=0 is out of range" --load "$work/none" --save "$work/x" --target-expert-parallel-size 0
common=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --ffn-hidden-size 64 --seq-length 16
        --micro-batch-size 2 --global-batch-size 4 --eval-iters 0 --sample-tokens 0 --lr-warmup-iters 1 --quiet
        --hidden-dropout 0 --attention-dropout 0)
"$train" "${common[@]}" --world-size 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
  --train-iters 2 --save "$work/a"
"$convert" --load "$work/a" --save "$work/b" --target-tensor-parallel-size 4 --target-pipeline-parallel-size 1 2> "$work/progress"
grep -q "tensors" "$work/progress" || { echo "no progress line"; cat "$work/progress"; exit 1; }
test "$(cat "$work/b/latest_checkpointed_iteration.txt")" = 2
test -f "$work/b/iter_0000002/rank_00003.strata"
"$train" "${common[@]}" --world-size 4 --tensor-model-parallel-size 4 --train-iters 3 --load "$work/b" --log-jsonl "$work/log.jsonl"
grep -q '"iteration": 3' "$work/log.jsonl" || { echo "the resumed run did not run iteration 3"; exit 1; }
if grep -q '"iteration": 1,' "$work/log.jsonl"; then echo "the resumed run started from scratch"; exit 1; fi
if "$convert" --load "$work/a" --save "$work/c" --target-tensor-parallel-size 3 2> "$work/err"; then
  echo "tp=3 (4 heads) was accepted"; exit 1
fi
grep -q "divide" "$work/err" || { echo "the tp=3 error does not say what does not divide:"; cat "$work/err"; exit 1; }
if "$convert" --load "$work/a" --save "$work/e" --target-expert-parallel-size 2 --target-data-parallel-size 2 2> "$work/err"; then
  echo "ep=2 was accepted for a model without experts"; exit 1
fi
grep -q "holds no experts" "$work/err" || { echo "the ep=2 error does not say the checkpoint holds no experts:"; cat "$work/err"; exit 1; }
"$convert" --load "$work/a" --save-hf "$work/hf" --quiet
test -f "$work/hf/config.json" && test -f "$work/hf/model.safetensors" || { echo "--save-hf wrote no model"; exit 1; }
grep -q GPT2LMHeadModel "$work/hf/config.json" || { echo "config.json does not name GPT2LMHeadModel"; exit 1; }
# The source's token ids pass through a fine-tuning run into its export.
sed -i 's/"eos_token_id": [0-9]*/"eos_token_id": [3, 7]/' "$work/hf/config.json"
"$train" "${common[@]}" --world-size 2 --tensor-model-parallel-size 2 --train-iters 1 --load-hf "$work/hf" \
  --log-jsonl "$work/hf.jsonl" --save-hf "$work/hf2"
grep -q '"iteration": 1,' "$work/hf.jsonl" || { echo "training from the exported model did not run"; exit 1; }
grep -q '"eos_token_id": \[3, 7\]' "$work/hf2/config.json" || { echo "--save-hf lost the source's eos_token_id:"; cat "$work/hf2/config.json"; exit 1; }
echo "strata-convert: converted, resumed, refused tp=3, exported to Hugging Face and trained from it"
