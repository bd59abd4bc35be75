#!/usr/bin/env bash
# megatron_launch_lines.sh <pretrain_gpt> <preprocess_data> <source dir>: command lines shaped like
# Megatron-LM's own example scripts (examples/gpt3/train_gpt3_175b_distributed.sh,
# examples/llama/train_llama3_8b_h100_fp8.sh, examples/mixtral/train_mixtral_8x7b_distributed.sh),
# and the building blocks of Qwen, gpt-oss and DeepSeek-V3 as their lines give them,
# with the same flags at tiny sizes, run through pretrain_gpt on CPU threads (torchrun's processes
# become --world-size threads). The arrays are built and expanded as the scripts do (unquoted, so
# "--split '99,1,0'" reaches the trainer with its quotes). What a line needs that strata does not
# have must fail with a message naming the flag and the missing feature; the rest must train.
set -euo pipefail
pretrain=${1:?usage: megatron_launch_lines.sh <pretrain_gpt> <preprocess_data> <source dir>}
preprocess=${2:?}
src=${3:?}
convert=${4:-}  # strata-convert (optional): the gpt-oss checkpoint exported again from the checkpoint
work=$(mktemp -d /tmp/strata_megatron_lines.XXXXXX)
trap '[[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_refusal <name> <text...> -- <command...>: the command exits 1 and stderr holds every text.
expect_refusal() {
  local name=$1; shift
  local texts=()
  while [[ $1 != -- ]]; do texts+=("$1"); shift; done
  shift
  if "$@" >"$work/$name.out" 2>"$work/$name.err"; then fail "$name: trained, but should have been refused"; fi
  for t in "${texts[@]}"; do
    grep -qF -- "$t" "$work/$name.err" || { cat "$work/$name.err" >&2; fail "$name: the error does not say '$t'"; }
  done
  echo "ok: $name refused: $(grep -m1 '^error' "$work/$name.err")"
}
# expect_same_export <name> <checkpoint> <trainer's --save-hf directory>: strata-convert --save-hf (when
# given) exports the checkpoint to the same weights and configuration as the trainer (the
# architecture options and router settings the checkpoint records); only the trainer knows its
# tokenizer's end-of-document id.
expect_same_export() {
  [[ -n "$convert" ]] || return 0
  "$convert" --load "$2" --save-hf "$3-convert" --quiet || fail "$1: strata-convert --save-hf"
  cmp -s "$3/model.safetensors" "$3-convert/model.safetensors" || fail "$1: strata-convert's weights differ from the trainer's export"
  diff "$3/config.json" "$3-convert/config.json" || fail "$1: strata-convert's config.json differs from the trainer's"
  echo "ok: $1: strata-convert exports the checkpoint as the trainer did"
}
# expect_training <name> <command...>: the command exits 0 and logs "done: loss A -> B".
expect_training() {
  local name=$1; shift
  "$@" >"$work/$name.out" 2>"$work/$name.err" || { cat "$work/$name.err" >&2; fail "$name: exit status $?"; }
  grep -q '^done: loss' "$work/$name.out" || { tail -n 5 "$work/$name.out" >&2; fail "$name: no 'done:' line"; }
  echo "ok: $name: $(grep '^done: loss' "$work/$name.out")"
}

# The data of the GPT-3 line: the shipped corpus tokenized with a small GPT-2-style BPE.
VOCAB_FILE=$src/tests/training/bpe/vocab.json
MERGE_FILE=$src/tests/training/bpe/merges.txt
"$preprocess" --input "$src/examples/data/kjv_pentateuch.txt" --output-prefix "$work/kjv" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$VOCAB_FILE" --merge-file "$MERGE_FILE" --append-eod >"$work/preprocess.out" 2>&1 ||
  { cat "$work/preprocess.out" >&2; fail "preprocess_data"; }
DATA_PATH=$work/kjv_text_document

# ---- GPT-3 (175B) shape: 2 layers, hidden 64; tp=2 x pp=2 on 4 threads; fp16; a step batch schedule
CHECKPOINT_PATH=$work/gpt3-ckpt
TENSORBOARD_LOGS_PATH=$work/gpt3-tb
GPT_MODEL_ARGS=(
    --num-layers 2
    --hidden-size 64
    --num-attention-heads 4
    --seq-length 64
    --max-position-embeddings 64
    --attention-backend auto
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --step-batch-size-schedule "0:2 1K:4"
    --train-iters 12
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.006
    --clip-grad 1.0
    --fp16
    --lr 6.0e-4
    --lr-decay-style cosine
    --min-lr 6.0e-5
    --lr-warmup-fraction .001
    --lr-decay-iters 10
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
)
DATA_ARGS=(
    --data-path $DATA_PATH
    --vocab-file $VOCAB_FILE
    --merge-file $MERGE_FILE
    --split 949,50,1
)
EVAL_AND_LOGGING_ARGS=(
    --log-interval 4
    --save-interval 6
    --eval-interval 6
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --eval-iters 2
    --tensorboard-dir $TENSORBOARD_LOGS_PATH
)
expect_training gpt3 "$pretrain" --world-size 4 ${GPT_MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} \
  ${DATA_ARGS[@]} ${EVAL_AND_LOGGING_ARGS[@]}
grep -q 'global batch 4' "$work/gpt3.out" || fail "gpt3: the step schedule never reached a global batch of 4"
ls "$TENSORBOARD_LOGS_PATH" | grep -q tfevents || fail "gpt3: no TensorBoard event file"
# The same line again (the scripts pass --save X --load X): it resumes at iteration 12, nothing to do;
# with --train-iters 14 it trains two more.
"$pretrain" --world-size 4 ${GPT_MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${DATA_ARGS[@]} \
  ${EVAL_AND_LOGGING_ARGS[@]} >"$work/gpt3-again.out" 2>&1 || fail "gpt3 again: exit status $?"
grep -q 'nothing to do' "$work/gpt3-again.out" || fail "gpt3 again: did not find the finished checkpoint"
expect_training gpt3-resume "$pretrain" --world-size 4 ${GPT_MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} \
  ${DATA_ARGS[@]} ${EVAL_AND_LOGGING_ARGS[@]} --train-iters 14
grep -q 'iterations 13\.\.14' "$work/gpt3-resume.out" || fail "gpt3-resume: did not resume at iteration 13"

# ---- Llama 3 (8B) shape, its MOCK branch: 2 layers, hidden 64, GQA 4/2; tp=2 x dp=2; bf16; samples
CHECKPOINT_PATH=$work/llama-ckpt
TENSORBOARD_LOGS_PATH=$work/llama-tb
DATA_CACHE_PATH=$work/cache
MODEL_ARGS=(
    --use-mcore-models
    --num-layers 2
    --hidden-size 64
    --ffn-hidden-size 160
    --num-attention-heads 4
    --group-query-attention
    --num-query-groups 2
    --kv-channels 16
    --seq-length 64
    --max-position-embeddings 64
    --position-embedding-type rope
    --rotary-base 1000000
    --rotary-percent 1.0
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --swiglu
    --normalization RMSNorm
    --init-method-std 0.0134
    --attention-backend fused
    --apply-layernorm-1p
    --untie-embeddings-and-output-weights
    --disable-bias-linear
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 4
    --train-samples 40
    --lr-decay-samples 36
    --lr-warmup-samples 4
    --lr 0.00015
    --min-lr 0.00001
    --decoupled-lr 5.0e-4
    --decoupled-min-lr 4.5e-5
    --lr-decay-style cosine
    --clip-grad 1.0
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --bf16
    --grad-reduce-in-bf16
    --cross-entropy-loss-fusion
    --calculate-per-token-loss
    --manual-gc
    --empty-unused-memory-level 1
    --exit-duration-in-mins 235
)
DTYPE_ARGS=(
    "--fp8-format hybrid"
    "--fp8-amax-history-len 1024"
    "--fp8-amax-compute-algo max"
    "--fp8-param-gather"
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --context-parallel-size 1
    --sequence-parallel
)
TRAINING_ARGS+=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
DATA_ARGS_LIST=(
    "--mock-data"
    "--tokenizer-type NullTokenizer"
    "--vocab-size 1000"
    "--data-cache-path ${DATA_CACHE_PATH}"
    "--tiktoken-pattern v2"
    "--split '99,1,0'"
    "--no-create-attention-mask-in-dataloader"
    "--no-mmap-bin-files"
    "--num-workers 1"
)
EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --eval-iters 2
    --eval-interval 5
    --save-interval 5
    --log-throughput
    --profile
    --profile-step-start 4
    --profile-step-end 6
    --ckpt-format torch_dist
    --distributed-timeout-minutes 60
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --tensorboard-dir "$TENSORBOARD_LOGS_PATH"
)
llama() { "$pretrain" --world-size 4 ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} "$@" ${MODEL_PARALLEL_ARGS[@]} ${DATA_ARGS_LIST[@]} \
  ${EVAL_AND_LOGGING_ARGS[@]}; }
# As shipped (fp8 or bf16): refused at the one flag strata lacks, named with its feature:
# --ckpt-format torch_dist (--apply-layernorm-1p and --kv-channels are run-time options).
expect_refusal llama3-fp8 "--ckpt-format torch_dist" "Hugging Face" -- llama ${DTYPE_ARGS[@]}
expect_refusal llama3-ckpt-format "--ckpt-format torch_dist" "Hugging Face" -- llama
EVAL_AND_LOGGING_ARGS=("${EVAL_AND_LOGGING_ARGS[@]/torch_dist/strata}")
# Without those two, the bf16 line trains (--decoupled-lr included): 40 samples of 4 are 10 iterations.
expect_training llama3 llama
grep -q 'iterations 1\.\.10' "$work/llama3.out" || fail "llama3: --train-samples 40 at global batch 4 is not 10 iterations"
grep -q 'TFLOP/s/GPU' "$work/llama3.out" || fail "llama3: --log-throughput printed no TFLOP/s"
grep -q 'note: --grad-reduce-in-bf16' "$work/llama3.err" || fail "llama3: no note for --grad-reduce-in-bf16"
# The fp8 line trains: hybrid E4M3 / E5M2 with delayed scaling over a history of 1024 steps, the
# distributed optimizer gathering the FP8 weights' codes (--fp8-param-gather, overlapped), emulated
# on the CPU threads (from scratch: the bf16 run's checkpoint goes).
rm -rf "$CHECKPOINT_PATH"
expect_training llama3-fp8-train llama ${DTYPE_ARGS[@]}
grep -q '^fp8: format hybrid, recipe delayed, amax history 1024 (max).*weights gathered as FP8 codes' "$work/llama3-fp8-train.out" ||
  fail "llama3-fp8-train: the run did not report FP8 hybrid delayed scaling with the weights gathered as codes"
grep -q 'iterations 1\.\.10' "$work/llama3-fp8-train.out" || fail "llama3-fp8-train: did not train from iteration 1"

# ---- Mixtral (8x7B) shape: its Mixture-of-Experts flags train Mixtral. The script's layout is
# tp 1, pp 4, ep 8 with the distributed optimizer and --sequence-parallel (off at tp 1, with a note);
# here pp 2, ep 2 over 4 ranks (expert data parallel 1, dense data parallel 2).
MODEL_ARGS=(--use-mcore-models --disable-bias-linear --seq-length 64 --max-position-embeddings 256 --num-layers 2
    --hidden-size 64 --ffn-hidden-size 160 --num-attention-heads 4 --init-method-std 0.01 --attention-dropout 0.0
    --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu
    --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2 --no-masked-softmax-fusion
    --no-position-embedding --rotary-base 1000000)
MOE_ARGS=(--num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce)
MOE_PARALLEL_ARGS=(--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
    --use-distributed-optimizer --sequence-parallel)
expect_training mixtral "$pretrain" --world-size 4 ${MODEL_ARGS[@]} ${MOE_ARGS[@]} ${MOE_PARALLEL_ARGS[@]} --mock-data \
  --micro-batch-size 1 --global-batch-size 4 --lr 1e-4 --train-iters 3 --bf16 --eval-iters 1 --log-interval 1
grep -q 'strata mixtral' "$work/mixtral.out" || fail "mixtral: the MoE flags did not select Mixtral"
grep -q 'load_balancing_loss' "$work/mixtral.out" || fail "mixtral: no load_balancing_loss in the log lines"
grep -q 'note: --moe-grouped-gemm' "$work/mixtral.err" || fail "mixtral: no note for --moe-grouped-gemm"
# A layout the experts do not divide is refused naming the value.
expect_refusal mixtral-ep3 "ep=3" "--num-experts=8" -- "$pretrain" --world-size 3 ${MODEL_ARGS[@]} ${MOE_ARGS[@]} \
  --expert-model-parallel-size 3 --use-distributed-optimizer --mock-data --micro-batch-size 1 --lr 1e-4 --train-iters 2
# Without the MoE flags the same dense model trains (Llama).
expect_training mixtral-dense "$pretrain" --world-size 2 ${MODEL_ARGS[@]} --mock-data --micro-batch-size 1 \
  --global-batch-size 2 --lr 1e-4 --train-iters 2 --bf16 --eval-iters 1 --sample-tokens 0

# ---- The building blocks of today's open models as run-time options of the same compiled Llama:
# Qwen3 (qk norms, kv-channels 24 x 4 heads != hidden 64) at tp=2 + SP x dp=2, Qwen2 (q/k/v biases)
# with Llama 3.1's RoPE scaling, and gpt-oss's dense MLP (quick GeGLU, clamp, offset) with partial
# interleaved RoPE; harmless flags are noted, Megatron-FSDP is refused pointing at the distributed optimizer.
QWEN_ARGS=(--use-mcore-models --num-layers 2 --hidden-size 64 --ffn-hidden-size 96 --num-attention-heads 4
    --group-query-attention --num-query-groups 2 --seq-length 32 --max-position-embeddings 32
    --position-embedding-type rope --rotary-base 1000000 --normalization RMSNorm --norm-epsilon 1e-6
    --untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0
    --mock-data --micro-batch-size 1 --global-batch-size 4 --lr 1e-3 --train-iters 3 --eval-iters 1 --log-interval 1
    --sample-tokens 0)
expect_training qwen3 "$pretrain" --world-size 4 ${QWEN_ARGS[@]} --swiglu --qk-layernorm --kv-channels 24 \
  --tensor-model-parallel-size 2 --sequence-parallel --accumulate-allreduce-grads-in-fp32 --logging-level 20 \
  --log-num-zeros-in-grad --enable-experimental --disable-bf16-reduced-precision-matmul --auto-detect-ckpt-format \
  --dist-ckpt-strictness log_all
grep -q 'strata llama' "$work/qwen3.out" || fail "qwen3: the flags did not select the Llama model"
grep -q 'note: --dist-ckpt-strictness' "$work/qwen3.err" || fail "qwen3: no note for --dist-ckpt-strictness"
# Exported as a Hugging Face Qwen3 (--save-hf), it trains again from there (--load-hf) with the same flags,
# and a plain Llama is refused naming the difference.
QWEN3_ARGS=(${QWEN_ARGS[@]} --swiglu --qk-layernorm --kv-channels 24 --tensor-model-parallel-size 2)
expect_training qwen3-save-hf "$pretrain" --world-size 2 ${QWEN3_ARGS[@]} --save-hf "$work/qwen3-hf" --save "$work/qwen3-ckpt"
# Its checkpoint records the options: other architecture flags are refused naming the option.
expect_refusal qwen3-other-rope "rotary_interleaved=0" "this run's model has 1" -- "$pretrain" --world-size 2 \
  ${QWEN3_ARGS[@]} --rotary-interleaved --load "$work/qwen3-ckpt" --train-iters 4
grep -q '"Qwen3ForCausalLM"' "$work/qwen3-hf/config.json" || fail "qwen3-save-hf: config.json does not name Qwen3ForCausalLM"
grep -q '"head_dim": 24' "$work/qwen3-hf/config.json" || fail "qwen3-save-hf: config.json does not give head_dim 24"
expect_training qwen3-load-hf "$pretrain" --world-size 2 ${QWEN3_ARGS[@]} --load-hf "$work/qwen3-hf"
grep -q 'loaded the Hugging Face model' "$work/qwen3-load-hf.out" || fail "qwen3-load-hf: the model was not loaded"
expect_refusal qwen3-into-llama 'model_type is "qwen3"' "--qk-layernorm" -- "$pretrain" --world-size 2 ${QWEN_ARGS[@]} \
  --swiglu --kv-channels 24 --tensor-model-parallel-size 2 --load-hf "$work/qwen3-hf"
expect_training qwen2 "$pretrain" --world-size 2 ${QWEN_ARGS[@]} --swiglu --add-qkv-bias --use-rope-scaling \
  --rope-scaling-factor 8 --tensor-model-parallel-size 2
expect_training gpt-oss-mlp "$pretrain" --world-size 2 ${QWEN_ARGS[@]} --quick-geglu --glu-linear-offset 1.0 \
  --activation-func-clamp-value 7.0 --rotary-percent 0.5 --rotary-interleaved --tensor-model-parallel-size 2
# gpt-oss's attention: YaRN (Megatron's gpt-oss flags) and learnable sinks on alternating windowed
# layers, at tp=2 + SP, and at cp=2 (ring attention: the window by global positions, the sinks on the
# diagonal blocks).
GPT_OSS_ATTENTION=(--position-embedding-type yarn --rotary-base 150000 --rotary-scaling-factor 32.0
    --yarn-original-max-position-embeddings 4096 --yarn-beta-fast 32.0 --yarn-beta-slow 1.0 --mscale 1.0
    --mscale-all-dim 0.0 --no-yarn-correction-range-round-to-int --softmax-type learnable --window-size 7,0
    --window-attn-skip-freq 2)
expect_training gpt-oss-attention "$pretrain" --world-size 2 ${QWEN_ARGS[@]} ${GPT_OSS_ATTENTION[@]} --quick-geglu \
  --glu-linear-offset 1.0 --activation-func-clamp-value 7.0 --tensor-model-parallel-size 2 --sequence-parallel
grep -q 'strata llama' "$work/gpt-oss-attention.out" || fail "gpt-oss-attention: the flags did not select the Llama model"
expect_training gpt-oss-attention-cp "$pretrain" --world-size 2 ${QWEN_ARGS[@]} ${GPT_OSS_ATTENTION[@]} --quick-geglu \
  --glu-linear-offset 1.0 --activation-func-clamp-value 7.0 --context-parallel-size 2
# Hierarchical context parallelism: all-to-all inside pairs of cp ranks, the ring across the pairs.
expect_training gpt-oss-attention-a2a-p2p "$pretrain" --world-size 4 ${QWEN_ARGS[@]} ${GPT_OSS_ATTENTION[@]} --quick-geglu \
  --glu-linear-offset 1.0 --activation-func-clamp-value 7.0 --context-parallel-size 4 --cp-comm-type a2a+p2p \
  --hierarchical-context-parallel-sizes 2 2
grep -q 'cp=4 a2a+p2p 2x2' "$work/gpt-oss-attention-a2a-p2p.out" || fail "gpt-oss-attention-a2a-p2p: the start-up line does not show cp"
# DeepSeek-V3's blocks at a toy size: multi-latent attention (queries and keys/values through latents,
# a RoPE part shared by the heads), experts with a shared expert and sigmoid routing with an expert
# bias, and one multi-token prediction depth, at tp=2 + SP x ep=2 on 4 threads.
DEEPSEEK_ARGS=(${QWEN_ARGS[@]} --swiglu --multi-latent-attention --qk-layernorm --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 16
    --qk-pos-emb-head-dim 8 --v-head-dim 12 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32
    --moe-shared-expert-intermediate-size 32 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    --mtp-num-layers 1)
expect_training deepseek "$pretrain" --world-size 4 ${DEEPSEEK_ARGS[@]} --rope-type rope --tensor-model-parallel-size 2 \
  --sequence-parallel --expert-model-parallel-size 2
grep -q 'strata mixtral' "$work/deepseek.out" || fail "deepseek: the flags did not select the Mixtral model"
# Megatron's DeepSeek-V3 RoPE: YaRN (its default --rope-type under multi-latent attention) with the
# example's factor and mscales.
expect_training deepseek-yarn "$pretrain" --world-size 2 ${DEEPSEEK_ARGS[@]} --rotary-scaling-factor 40 --mscale 1.0 \
  --mscale-all-dim 1.0 --tensor-model-parallel-size 2
# Without the MTP depth (transformers has none), exported as DeepseekV3ForCausalLM at ep=2; its
# checkpoint records the latent attention and the router, so strata-convert exports it the same and
# a resume with softmax routing is refused.
DEEPSEEK_HF=("${DEEPSEEK_ARGS[@]:0:${#DEEPSEEK_ARGS[@]}-2}")
expect_training deepseek-save-hf "$pretrain" --world-size 2 ${DEEPSEEK_HF[@]} --rope-type rope --expert-model-parallel-size 2 \
  --save "$work/deepseek-ckpt" --save-hf "$work/deepseek-hf"
grep -q '"DeepseekV3ForCausalLM"' "$work/deepseek-hf/config.json" || fail "deepseek-save-hf: config.json does not name DeepseekV3ForCausalLM"
expect_same_export deepseek "$work/deepseek-ckpt" "$work/deepseek-hf"
expect_refusal deepseek-other-router "moe_router_score=1" -- "$pretrain" --world-size 2 ${DEEPSEEK_HF[@]/sigmoid/softmax} \
  --rope-type rope --expert-model-parallel-size 2 --load "$work/deepseek-ckpt" --train-iters 4
expect_refusal deepseek-interleaved "--rotary-interleaved with --multi-latent-attention" -- "$pretrain" --world-size 1 \
  ${DEEPSEEK_ARGS[@]} --rotary-interleaved
expect_refusal megatron-fsdp "--use-megatron-fsdp" "--use-distributed-optimizer" -- "$pretrain" --world-size 2 \
  ${QWEN_ARGS[@]} --swiglu --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params
expect_refusal qk-tp "num_query_groups=2 is smaller than tp=4" -- "$pretrain" --world-size 4 ${QWEN_ARGS[@]} \
  --swiglu --qk-layernorm --kv-channels 24 --tensor-model-parallel-size 4

# ---- gpt-oss (examples/gptoss/02_train.sh), its MOCK branch with every flag but the FP8 ones
# (--fp8-format, --fp8-param-gather, --fp8-amax-compute-algo, --fp8-amax-history-len): 4 layers,
# hidden 64, 8 heads over 2 key/value groups, 4 experts (quick GeGLU with the clamp and offset in
# the experts too), learnable sinks on alternating windowed layers, --enable-gpt-oss's YaRN; the
# script's pipeline over every GPU becomes pp=2 on 2 threads, its sample counts a few samples.
GPT_OSS_CKPT=$work/gpt-oss-ckpt
mkdir -p "$GPT_OSS_CKPT"
MODEL_ARGS=(
    --no-masked-softmax-fusion --transformer-impl transformer_engine --disable-bias-linear
    --untie-embeddings-and-output-weights --no-rope-fusion --normalization RMSNorm --num-layers 4 --hidden-size 64
    --ffn-hidden-size 64 --num-attention-heads 8 --group-query-attention --num-query-groups 2 --seq-length 32
    --max-position-embeddings 32 --use-mcore-models --rotary-percent 1.0 --rope-type rope --position-embedding-type rope
    --rotary-base 10000 --no-bias-gelu-fusion --export-force-local-attention --no-bias-dropout-fusion --quick-geglu
    --glu-linear-offset 1.0 --softmax-type learnable --window-attn-skip-freq 2 --activation-func-clamp-value 7.0
    --window-size 7,0 --enable-gpt-oss
)
MOE_ARGS=(
    --num-experts 4 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce
    --moe-ffn-hidden-size 64 --moe-router-dtype fp32 --moe-z-loss-coeff 1e-3 --moe-permute-fusion
)
DATA_ARGS_LIST=(
    "--mock-data" "--tokenizer-type NullTokenizer" "--vocab-size 512" "--data-cache-path $work/gpt-oss-cache"
    "--tiktoken-pattern v2" "--split '99,1,0'" "--no-create-attention-mask-in-dataloader" "--no-mmap-bin-files"
    "--num-workers 1"
)
TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 4 --lr 1.0e-5 --train-samples 16 --lr-decay-samples 12
    --lr-decay-style cosine --min-lr 1.0e-6 --weight-decay 0.1 --lr-warmup-fraction 0.05 --clip-grad 1.0 --bf16
    --use-flash-attn --attention-softmax-in-fp32 --accumulate-allreduce-grads-in-fp32
    --disable-bf16-reduced-precision-matmul --recompute-activations
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --expert-model-parallel-size 1 --sequence-parallel
    --context-parallel-size 1 --use-distributed-optimizer
)
LOGGING_ARGS=(
    --log-interval 1 --save-interval 10000 --eval-interval 50000000 --eval-iters 0 --save $GPT_OSS_CKPT
    --tensorboard-dir "${GPT_OSS_CKPT}/tensorboard" --moe-per-layer-logging --no-load-optim --no-load-rng --log-throughput
)
expect_training gpt-oss-line "$pretrain" --world-size 2 ${MODEL_ARGS[@]} ${MOE_ARGS[@]} ${DATA_ARGS_LIST[@]} \
  ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${LOGGING_ARGS[@]} --sample-tokens 0
grep -q 'strata mixtral' "$work/gpt-oss-line.out" || fail "gpt-oss-line: the flags did not select the Mixtral model"
grep -q 'note: --enable-gpt-oss' "$work/gpt-oss-line.err" || fail "gpt-oss-line: no note for --enable-gpt-oss"
# As shipped (fp8, with the FP8 weights gathered by the distributed optimizer): trains too.
expect_training gpt-oss-fp8-param-gather "$pretrain" --world-size 2 ${MODEL_ARGS[@]} \
  ${MOE_ARGS[@]} ${DATA_ARGS_LIST[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} --fp8-format hybrid --fp8-param-gather \
  --fp8-amax-compute-algo max --fp8-amax-history-len 1024 ${LOGGING_ARGS[@]} --sample-tokens 0
grep -q 'weights gathered as FP8 codes' "$work/gpt-oss-fp8-param-gather.out" ||
  fail "gpt-oss-fp8-param-gather: the run did not report the FP8 parameter gather"

# With Megatron's default linear biases (no --disable-bias-linear) the same blocks are Hugging Face's
# GptOssForCausalLM: exported at ep=2 (--save-hf), trained again from there at ep=1 (--load-hf).
GPT_OSS_HF=(--use-mcore-models --untie-embeddings-and-output-weights --normalization RMSNorm --num-layers 2 --hidden-size 64
    --ffn-hidden-size 64 --num-attention-heads 8 --group-query-attention --num-query-groups 2 --seq-length 32
    --max-position-embeddings 32 --position-embedding-type rope --quick-geglu --glu-linear-offset 1.0
    --activation-func-clamp-value 7.0 --softmax-type learnable --window-size 7,0 --window-attn-skip-freq 2 --enable-gpt-oss
    --num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --mock-data --micro-batch-size 1
    --global-batch-size 4 --lr 1e-4 --train-iters 2 --eval-iters 0 --sample-tokens 0 --attention-dropout 0.0
    --hidden-dropout 0.0)
expect_training gpt-oss-save-hf "$pretrain" --world-size 2 ${GPT_OSS_HF[@]} --expert-model-parallel-size 2 \
  --save "$work/gpt-oss-hf-ckpt" --save-hf "$work/gpt-oss-hf"
grep -q '"GptOssForCausalLM"' "$work/gpt-oss-hf/config.json" || fail "gpt-oss-save-hf: config.json does not name GptOssForCausalLM"
expect_training gpt-oss-load-hf "$pretrain" --world-size 2 ${GPT_OSS_HF[@]} --load-hf "$work/gpt-oss-hf"
grep -q 'loaded the Hugging Face model' "$work/gpt-oss-load-hf.out" || fail "gpt-oss-load-hf: the model was not loaded"
# Its checkpoint records the windows: another window is refused naming both.
expect_refusal gpt-oss-other-window "sliding window of 7 keys" "this run's model has 3" -- "$pretrain" --world-size 2 \
  ${GPT_OSS_HF[@]/7,0/3,0} --expert-model-parallel-size 2 --load "$work/gpt-oss-hf-ckpt" --train-iters 4
expect_same_export gpt-oss "$work/gpt-oss-hf-ckpt" "$work/gpt-oss-hf"

# Qwen2-MoE's blocks: q/k/v biases, a dense first layer, experts with a shared expert behind its
# sigmoid gate (--moe-shared-expert-gate), Hugging Face's Qwen2MoeForCausalLM at ep=2, exported again
# from its checkpoint by strata-convert.
QWEN2_MOE=(${QWEN_ARGS[@]} --swiglu --add-qkv-bias --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32
    --moe-shared-expert-intermediate-size 48 --moe-shared-expert-gate --moe-layer-freq "[0,1]" --moe-router-pre-softmax
    --moe-token-dispatcher-type alltoall)
expect_training qwen2-moe-save-hf "$pretrain" --world-size 2 ${QWEN2_MOE[@]} --expert-model-parallel-size 2 \
  --save "$work/qwen2-moe-ckpt" --save-hf "$work/qwen2-moe-hf"
grep -q '"Qwen2MoeForCausalLM"' "$work/qwen2-moe-hf/config.json" || fail "qwen2-moe-save-hf: config.json does not name Qwen2MoeForCausalLM"
expect_training qwen2-moe-load-hf "$pretrain" --world-size 2 ${QWEN2_MOE[@]} --load-hf "$work/qwen2-moe-hf"
expect_same_export qwen2-moe "$work/qwen2-moe-ckpt" "$work/qwen2-moe-hf"

# ---- DeepSeek-V3 (examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh) without Megatron-FSDP
# (USE_MEGATRON_FSDP=0), wandb (WANDB=0) or the profiler: every other flag, at 4 layers (the first
# dense, as the script's [0]*3 of 61), hidden 64, 8 experts in 4 groups, the latents and heads
# shrunk; EP=8 becomes ep=2 on 2 threads. The tokenizer is a local Llama 3 style tokenizer.json in
# place of deepseek-ai/DeepSeek-V3 (no network), the data the shipped corpus tokenized with it.
"$preprocess" --input "$src/examples/data/kjv_pentateuch.txt" --output-prefix "$work/kjv-hf" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$src/tests/tokenizers/llama3_bpe" --append-eod \
  >"$work/preprocess-hf.out" 2>&1 || { cat "$work/preprocess-hf.out" >&2; fail "preprocess_data (HuggingFaceTokenizer)"; }
OUTPUT_PATH=$work/deepseek-v3
mkdir -p "$OUTPUT_PATH"
PRETRAIN_ARGS=(
    --distributed-timeout-minutes 60 --tensor-model-parallel-size 1 --expert-model-parallel-size 2
    --expert-tensor-parallel-size 1 --context-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce
    --overlap-param-gather --use-mcore-models --sequence-parallel --use-flash-attn --disable-bias-linear
    --micro-batch-size 1 --global-batch-size 4 --train-samples 16 --exit-duration-in-mins 220
    --no-check-for-nan-in-loss-and-grad --manual-gc --manual-gc-interval 10 --recompute-granularity selective
    --recompute-modules mlp moe mla_up_proj layernorm --transformer-impl transformer_engine --seq-length 32
    --data-cache-path ${OUTPUT_PATH}/cache --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model $src/tests/tokenizers/llama3_bpe --data-path $work/kjv-hf_text_document --split 99,1,0
    --no-mmap-bin-files --no-create-attention-mask-in-dataloader --num-workers 6 --num-layers 4 --hidden-size 64
    --ffn-hidden-size 96 --num-attention-heads 4 --kv-channels 16 --max-position-embeddings 32
    --position-embedding-type rope --rotary-base 10000 --make-vocab-size-divisible-by 128 --normalization RMSNorm
    --norm-epsilon 1e-6 --swiglu --untie-embeddings-and-output-weights --multi-latent-attention --attention-dropout 0.0
    --hidden-dropout 0.0 --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm --lr-decay-samples 12
    --lr-warmup-samples 4 --lr-warmup-init 3.9e-7 --lr 3.9e-6 --min-lr 3.9e-7 --lr-decay-style cosine
    --adam-beta1 0.9 --adam-beta2 0.95 --num-experts 8 --moe-layer-freq [0]*1+[1]*3 --moe-ffn-hidden-size 16
    --moe-shared-expert-intermediate-size 16 --moe-router-load-balancing-type seq_aux_loss --moe-router-topk 4
    --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-router-pre-softmax
    --moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 2 --moe-router-num-groups 4
    --moe-router-topk-scaling-factor 2.5 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 1e-3 --moe-router-dtype fp32 --moe-permute-fusion --moe-router-force-load-balancing
    --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16
    --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0 --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1
    --eval-iters 1 --eval-interval 100 --auto-detect-ckpt-format --load ${OUTPUT_PATH}/checkpoints
    --save ${OUTPUT_PATH}/checkpoints --save-interval 100 --dist-ckpt-strictness log_all --init-method-std 0.02
    --log-timers-to-tensorboard --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm
    --log-validation-ppl-to-tensorboard --log-throughput --log-interval 1 --logging-level 40
    --tensorboard-dir ${OUTPUT_PATH}/tensorboard --bf16 --enable-experimental
)
expect_training deepseek-v3-line "$pretrain" --world-size 2 ${PRETRAIN_ARGS[@]} --sample-tokens 0
grep -q 'strata mixtral' "$work/deepseek-v3-line.out" || fail "deepseek-v3-line: the flags did not select the Mixtral model"
for note in '--moe-token-dispatcher-type flex' '--recompute-modules' '--moe-router-pre-softmax'; do
  grep -qF -- "note: $note" "$work/deepseek-v3-line.err" || fail "deepseek-v3-line: no note for $note"
done
# With Megatron-FSDP (the script's default USE_MEGATRON_FSDP=1): refused, pointing at the distributed optimizer.
expect_refusal deepseek-v3-fsdp "--use-megatron-fsdp" "--use-distributed-optimizer" -- "$pretrain" --world-size 2 \
  ${PRETRAIN_ARGS[@]} --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params \
  --no-gradient-accumulation-fusion --use-distributed-optimizer --calculate-per-token-loss --init-model-with-meta-device \
  --ckpt-format fsdp_dtensor --fsdp-double-buffer --use-nccl-ub --megatron-fsdp-grad-comm-dtype bf16 \
  --megatron-fsdp-main-grads-dtype bf16

echo "all Megatron-shaped launch lines behave as stated"
