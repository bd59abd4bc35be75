#!/usr/bin/env python3
"""Cross-check of strata's Hugging Face import and export against transformers itself.

Two directions, each comparing the logits of every position of a 16-token prompt:

  strata -> transformers   hf_crosscheck builds a tiny float32 model (GPT-2; Llama with 4 query heads
                           in 2 key/value groups; the same Llama with q/k/v biases as Qwen2, and with
                           qk norms and head_dim 24 as Qwen3; Mixtral: that Llama with 4 experts of
                           width 48, top-2, in each layer; Qwen3-MoE: the Qwen3 one with a dense
                           first layer and such experts in the second; DeepSeek-V3: multi-latent attention,
                           a dense first layer, then 4 sigmoid-routed experts in 2 groups with the router's
                           correction bias and a shared expert), with random norm weights and biases,
                           exports it (config.json + model.safetensors) with its own logits;
                           GPT2LMHeadModel / LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM /
                           MixtralForCausalLM / Qwen3MoeForCausalLM .from_pretrained loads the
                           directory and computes the logits again.
  transformers -> strata   (and back, trained) a transformers model with random weights (norm weights and biases too) is
                           saved with save_pretrained(safe_serialization=True) -- GPT-2, Llama, Llama
                           with tied embeddings, Llama in shards with an index, Llama with Llama 3.1's
                           rope_scaling, Llama with YaRN's rope_scaling (with and without mscale),
                           Qwen2, Qwen3, Mixtral, Qwen3-MoE (norm_topk_prob true and false), DeepSeek-V3
                           (with and without the queries' latent, interleaved RoPE or not) -- and
                           hf_crosscheck imports it at tp=2 (CPU threads; the MoE models over 2
                           expert-parallel ranks) and computes the logits. The first case of each
                           architecture is then trained 5 AdamW steps by strata (one rank), exported,
                           and loaded by transformers: its logits and its loss on the prompt must be
                           strata's, and strata's loss must have fallen.

Prints a table (max |difference|, relative error = ||strata - transformers|| / ||transformers||) and
the versions of torch, transformers and safetensors, and exits 1 when a case fails: a relative error
above --rtol (1e-4: float32 rounding of two different summation orders is ~1e-6), a weight
transformers reports missing or unexpected, or an error on either side. Exits 2 when numpy, torch or
transformers is missing or hf_crosscheck cannot be found.

Needs numpy, torch and transformers (CPU is enough). Build the strata program first:

    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target hf_crosscheck -j
    python3 tests/hf/check_transformers.py --binary build/tests/hf/hf_crosscheck
"""

import argparse
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile

PROMPT_LENGTH = 16
VOCAB = 101

# Weights transformers may report missing from a file without harm: tied or derived buffers.
HARMLESS_MISSING = [r"(^|\.)attn\.(masked_)?bias$", r"^lm_head\.weight$", r"rotary_emb\.inv_freq$"]


def parse_args():
    here = pathlib.Path(__file__).resolve().parent
    default_binary = here.parent.parent / "build" / "tests" / "hf" / "hf_crosscheck"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", default=str(default_binary), help="the hf_crosscheck program (default: %(default)s)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks of the strata import (default: 2; at most 2 for the Llama cases, "
                   "whose 2 key/value groups strata splits whole over the ranks; Mixtral's import uses them as expert-parallel ranks)")
    p.add_argument("--rtol", type=float, default=1e-4, help="largest relative error that passes (default: 1e-4)")
    p.add_argument("--seed", type=int, default=1234, help="seed of both sides' random weights")
    p.add_argument("--keep", metavar="DIR", help="write the checkpoints under DIR and keep them (default: a temporary directory)")
    p.add_argument("--verbose", action="store_true", help="print the output of hf_crosscheck")
    return p.parse_args()


def run(binary, args, verbose):
    command = [binary] + [str(a) for a in args]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if verbose or done.returncode != 0:
        print("$ " + " ".join(command))
        print(done.stdout, end="")
    if done.returncode != 0:
        raise RuntimeError(f"hf_crosscheck exited with {done.returncode}: {done.stdout.strip().splitlines()[-1:]}")


def strata_logits(directory, np):
    meta = json.loads((directory / "crosscheck.json").read_text())
    logits = np.fromfile(directory / meta["logits_file"], dtype="<f4")
    return logits.reshape(meta["logits_shape"]).astype(np.float64), meta["tokens"]


def prompt():
    return [(i * 29 + 7) % VOCAB for i in range(PROMPT_LENGTH)]


def load_pretrained(cls, directory):
    """from_pretrained with the plain (eager) attention and the loading report, where this transformers has them."""
    attempts = [dict(attn_implementation="eager", output_loading_info=True), dict(output_loading_info=True), {}]
    for i, kwargs in enumerate(attempts):
        try:
            loaded = cls.from_pretrained(str(directory), **kwargs)
            break
        except TypeError:
            if i + 1 == len(attempts):
                raise
    model, info = loaded if isinstance(loaded, tuple) else (loaded, {})
    return model.float().eval(), info


def transformers_logits(model, tokens, torch, np):
    with torch.no_grad():
        out = model(torch.tensor([tokens], dtype=torch.long))
    return out.logits[0].to(torch.float64).numpy()


def loading_problems(info):
    problems = []
    for key in info.get("missing_keys", []):
        if not any(re.search(p, key) for p in HARMLESS_MISSING):
            problems.append(f"missing {key}")
    problems += [f"unexpected {k}" for k in info.get("unexpected_keys", [])]
    problems += [f"mismatched {k}" for k in info.get("mismatched_keys", [])]
    problems += [str(e) for e in info.get("error_msgs", [])]
    return problems


def compare(ours, theirs, np):
    if ours.shape != theirs.shape:
        raise RuntimeError(f"logits of shape {list(ours.shape)} against transformers' {list(theirs.shape)}")
    difference = ours - theirs
    max_abs = float(np.max(np.abs(difference)))
    relative = float(np.linalg.norm(difference) / max(np.linalg.norm(theirs), 1e-30))
    return max_abs, relative


def randomize(model, seed, torch, std=0.1):
    """Random weights everywhere (transformers' init leaves norm weights at 1 and biases at 0)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = std * torch.randn(p.shape, generator=generator, dtype=torch.float32)
            is_norm_weight = p.dim() == 1 and name.endswith("weight") and ("ln" in name or "norm" in name)
            p.copy_(1.0 + noise if is_norm_weight else noise)
        for name, b in model.named_buffers():  # DeepSeek-V3's router bias is a buffer (zeros at init)
            if name.endswith("e_score_correction_bias"):
                b.copy_(std * torch.randn(b.shape, generator=generator, dtype=torch.float32))


def make_config(cls, torch, **fields):
    config = cls(**fields)
    try:
        config._attn_implementation = "eager"
    except Exception:  # older transformers: eager is the only attention
        pass
    return config


def hf_cases(transformers, torch):
    """(name, architecture, model class, config, save_pretrained keyword arguments)."""
    gpt2 = make_config(transformers.GPT2Config, torch, vocab_size=VOCAB, n_positions=PROMPT_LENGTH, n_embd=48, n_layer=2,
                       n_head=4, n_inner=112, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                       bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)  # GPT-2's are its last token
    llama_fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=PROMPT_LENGTH,
                        rms_norm_eps=1e-5, hidden_act="silu")  # RoPE theta: the default 10000
    llama = make_config(transformers.LlamaConfig, torch, tie_word_embeddings=False, **llama_fields)
    llama_tied = make_config(transformers.LlamaConfig, torch, tie_word_embeddings=True, **llama_fields)
    # Llama 3.1's scaling with an original context of 8 positions, so all three frequency regimes occur.
    llama31 = make_config(transformers.LlamaConfig, torch, tie_word_embeddings=False,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
                          **llama_fields)
    # YaRN: head_dim 16, theta 10000 and an original context of 2048 put the correction range at
    # dimensions 2.0 .. 5.0 of 8 (kept, ramped and interpolated pairs); max_position_embeddings is
    # factor x original, so transformers releases that derive the factor from the two agree.
    yarn_fields = dict(llama_fields, max_position_embeddings=4 * 2048)
    llama_yarn = make_config(transformers.LlamaConfig, torch, tie_word_embeddings=False,
                             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
                                           "beta_fast": 32.0, "beta_slow": 1.0}, **yarn_fields)
    llama_yarn_mscale = make_config(transformers.LlamaConfig, torch, tie_word_embeddings=False,
                                    rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
                                                  "mscale": 0.9, "mscale_all_dim": 0.5}, **yarn_fields)
    cases = []
    qwen_fields = dict(llama_fields, tie_word_embeddings=False, use_sliding_window=False)
    if hasattr(transformers, "Qwen2ForCausalLM"):
        qwen2 = make_config(transformers.Qwen2Config, torch, **qwen_fields)
        cases.append(("qwen2 (q/k/v biases)", "qwen2", transformers.Qwen2ForCausalLM, qwen2, {}))
    if hasattr(transformers, "Qwen3ForCausalLM"):
        qwen3 = make_config(transformers.Qwen3Config, torch, head_dim=24, attention_bias=False, **qwen_fields)
        cases.append(("qwen3 (qk norms, head_dim 24)", "qwen3", transformers.Qwen3ForCausalLM, qwen3, {}))
    if hasattr(transformers, "MistralForCausalLM"):
        # Mistral: Llama with a sliding window of 6 keys (the query's own included) on every layer,
        # shorter than the 16-token prompt.
        mistral = make_config(transformers.MistralConfig, torch, sliding_window=6, tie_word_embeddings=False,
                              head_dim=16, **llama_fields)
        cases.append(("mistral (sliding window 6)", "mistral", transformers.MistralForCausalLM, mistral, {}))
    if hasattr(transformers, "MixtralForCausalLM"):
        # Mixtral at a reduced size: 4 experts of width 48 (intermediate_size is one expert's), top-2,
        # full attention (sliding_window None), no router noise.
        mixtral_fields = dict(llama_fields, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                              sliding_window=None, router_jitter_noise=0.0, router_aux_loss_coef=0.02,
                              tie_word_embeddings=False)
        mixtral = make_config(transformers.MixtralConfig, torch, **mixtral_fields)
        cases.append(("mixtral (4 experts, top-2)", "mixtral", transformers.MixtralForCausalLM, mixtral, {}))
    if hasattr(transformers, "Qwen3MoeForCausalLM"):
        # Qwen3-MoE: Qwen3's attention (qk norms, head_dim 24), a dense first layer (mlp_only_layers) of
        # intermediate_size 96, then 4 experts of moe_intermediate_size 48, top-2, with and without
        # norm_topk_prob (strata's --moe-router-pre-softmax when false).
        for norm_topk_prob in (True, False):
            qwen3_moe = make_config(transformers.Qwen3MoeConfig, torch, head_dim=24, attention_bias=False,
                                    moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                                    norm_topk_prob=norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[0],
                                    router_aux_loss_coef=0.02, **qwen_fields)
            cases.append((f"qwen3_moe (dense first layer, norm_topk_prob {norm_topk_prob})", "qwen3_moe",
                          transformers.Qwen3MoeForCausalLM, qwen3_moe, {}))
    if hasattr(transformers, "Qwen2MoeForCausalLM"):
        # Qwen2-MoE: Qwen2's attention (q/k/v biases), a dense first layer of intermediate_size 96, then 4
        # experts of moe_intermediate_size 48, top-2, and a shared expert of 40 behind its sigmoid gate,
        # with and without norm_topk_prob.
        for norm_topk_prob in (False, True):
            qwen2_moe = make_config(transformers.Qwen2MoeConfig, torch, moe_intermediate_size=48, num_experts=4,
                                    num_experts_per_tok=2, shared_expert_intermediate_size=40, norm_topk_prob=norm_topk_prob,
                                    decoder_sparse_step=1, mlp_only_layers=[0], router_aux_loss_coef=0.02, qkv_bias=True,
                                    **qwen_fields)
            cases.append((f"qwen2_moe (gated shared expert, norm_topk_prob {norm_topk_prob})", "qwen2_moe",
                          transformers.Qwen2MoeForCausalLM, qwen2_moe, {}))
    if hasattr(transformers, "DeepseekV3ForCausalLM"):
        # DeepSeek-V3: multi-latent attention (queries through a latent of 24, or none; keys and values
        # through one of 16; heads of 12 + 8 RoPE dimensions, values of 10), a dense first layer, then 4
        # sigmoid-routed experts of width 32 in 2 groups (top-1 group, top-2 experts) with the router's
        # correction bias, a scaling factor and a shared expert; interleaved RoPE or not.
        for q_lora_rank, interleave in ((24, True), (None, False)):
            deepseek = make_config(transformers.DeepseekV3Config, torch, vocab_size=VOCAB, hidden_size=64,
                                   intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                   max_position_embeddings=PROMPT_LENGTH, rms_norm_eps=1e-5, hidden_act="silu",
                                   q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8,
                                   v_head_dim=10, moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1,
                                   num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                                   norm_topk_prob=True, first_k_dense_replace=1, rope_interleave=interleave,
                                   tie_word_embeddings=False)
            cases.append((f"deepseek_v3 (MLA, q_lora_rank {q_lora_rank}, rope_interleave {interleave}, experts in groups)",
                          "deepseek_v3", transformers.DeepseekV3ForCausalLM, deepseek, {}))
        # and with DeepSeek-V3's YaRN: factor 4 over an original context of 4, mscale = mscale_all_dim
        # (the softmax scale times mscale(4, 1)^2), the ramp over the 8 RoPE dimensions
        deepseek_yarn = make_config(transformers.DeepseekV3Config, torch, vocab_size=VOCAB, hidden_size=64,
                                    intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                    max_position_embeddings=PROMPT_LENGTH, rms_norm_eps=1e-5, hidden_act="silu",
                                    q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
                                    moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                    n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                                    first_k_dense_replace=1, rope_interleave=True, tie_word_embeddings=False,
                                    rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4,
                                                  "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
        cases.append(("deepseek_v3 with YaRN (factor 4, mscale_all_dim 1)", "deepseek_v3",
                      transformers.DeepseekV3ForCausalLM, deepseek_yarn, {}))
    if hasattr(transformers, "GptOssForCausalLM"):
        # gpt-oss at a reduced size: 4 experts of width 48 with their biases, top-2, the router's bias,
        # quick GeGLU clamped at 0.3 (swiglu_limit) with the offset 1, q/k/v/o biases, a learned sink per
        # head, a window of 6 keys on the first layer and full attention on the second, YaRN (factor 4
        # over an original context of 4, not truncated).
        gpt_oss = make_config(transformers.GptOssConfig, torch, vocab_size=VOCAB, hidden_size=64, intermediate_size=48,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              max_position_embeddings=PROMPT_LENGTH, rms_norm_eps=1e-5, num_local_experts=4,
                              num_experts_per_tok=2, sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                              swiglu_limit=0.3, attention_bias=True, tie_word_embeddings=False, router_aux_loss_coef=0.02,
                              rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                               "truncate": False, "original_max_position_embeddings": 4,
                                               "rope_theta": 10000.0})
        cases.append(("gpt_oss (biases, clamped quick GeGLU experts, sinks, alternating window, YaRN)", "gpt_oss",
                      transformers.GptOssForCausalLM, gpt_oss, {}))
    return cases + [
        ("gpt2", "gpt2", transformers.GPT2LMHeadModel, gpt2, {}),
        ("llama (GQA 4/2)", "llama", transformers.LlamaForCausalLM, llama, {}),
        # strata compiles no tied Llama: the import must refuse it, naming the field
        ("llama, tied lm_head (refused)", "llama", transformers.LlamaForCausalLM, llama_tied, {"refused": "tie_word_embeddings"}),
        ("llama, sharded", "llama", transformers.LlamaForCausalLM, llama, {"max_shard_size": "40KB"}),
        ("llama 3.1 rope_scaling", "llama", transformers.LlamaForCausalLM, llama31, {}),
        ("llama yarn rope_scaling", "llama", transformers.LlamaForCausalLM, llama_yarn, {}),
        ("llama yarn, mscale / mscale_all_dim", "llama", transformers.LlamaForCausalLM, llama_yarn_mscale, {}),
    ]


def save_pretrained(model, directory, extra):
    try:
        model.save_pretrained(str(directory), safe_serialization=True, **extra)
    except TypeError:  # a transformers where safetensors is the only format
        model.save_pretrained(str(directory), **extra)


def main():
    args = parse_args()
    try:
        import numpy as np
        import torch
        import transformers
    except ImportError as error:
        print(f"check_transformers.py needs numpy, torch and transformers: {error}", file=sys.stderr)
        return 2
    try:
        import safetensors
        safetensors_version = getattr(safetensors, "__version__", "unknown")
    except ImportError:
        safetensors_version = "not installed"
    binary = shutil.which(args.binary) or args.binary
    if not os.access(binary, os.X_OK):
        print(f"check_transformers.py: no hf_crosscheck program at {args.binary}; build it "
              "(cmake --build build --target hf_crosscheck) or pass --binary", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

    if args.keep:
        work = pathlib.Path(args.keep)
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = pathlib.Path(tempfile.mkdtemp(prefix="strata_hf_check_"))
    rows = []

    def record(direction, name, action):
        try:
            max_abs, relative, shape, problems = action()
            ok = relative <= args.rtol and not problems
            rows.append((direction, name, shape, f"{max_abs:.3g}", f"{relative:.3g}", "ok" if ok else "FAIL", "; ".join(problems)))
        except Exception as error:  # one failing case must not hide the others
            rows.append((direction, name, "-", "-", "-", "FAIL", f"{type(error).__name__}: {error}"))

    # strata -> transformers
    classes = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM,
               "qwen2": getattr(transformers, "Qwen2ForCausalLM", None), "qwen3": getattr(transformers, "Qwen3ForCausalLM", None),
               "mistral": getattr(transformers, "MistralForCausalLM", None),
               "mixtral": getattr(transformers, "MixtralForCausalLM", None),
               "qwen3_moe": getattr(transformers, "Qwen3MoeForCausalLM", None),
               "qwen2_moe": getattr(transformers, "Qwen2MoeForCausalLM", None),
               "deepseek_v3": getattr(transformers, "DeepseekV3ForCausalLM", None),
               "gpt_oss": getattr(transformers, "GptOssForCausalLM", None)}
    for architecture in ("gpt2", "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v3", "gpt_oss"):
        if classes[architecture] is None:
            rows.append(("strata -> transformers", architecture, "-", "-", "-", "FAIL",
                         f"this transformers ({transformers.__version__}) has no {architecture} model"))
            continue
        def export_case(architecture=architecture):
            directory = work / f"strata_to_transformers_{architecture}"
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            run(binary, ["export", directory, architecture, "--seed", args.seed], args.verbose)
            ours, tokens = strata_logits(directory, np)
            model, info = load_pretrained(classes[architecture], directory)
            theirs = transformers_logits(model, tokens, torch, np)
            max_abs, relative = compare(ours, theirs, np)
            return max_abs, relative, f"{ours.shape[0]} x {ours.shape[1]}", loading_problems(info)
        name = {"gpt2": "gpt2", "llama": "llama (GQA 4/2)", "mistral": "mistral (sliding window 6)", "qwen2": "qwen2 (q/k/v biases)",
                "qwen3": "qwen3 (qk norms, head_dim 24)", "mixtral": "mixtral (4 experts, top-2)",
                "qwen3_moe": "qwen3_moe (dense first layer, 4 experts)",
                "qwen2_moe": "qwen2_moe (q/k/v biases, dense first layer, 4 experts, gated shared expert)",
                "deepseek_v3": "deepseek_v3 (MLA, dense first layer, grouped sigmoid experts, shared expert)",
                "gpt_oss": "gpt_oss (biases, clamped quick GeGLU experts, sinks, alternating window, YaRN)"}[architecture]
        record("strata -> transformers", name, export_case)

    # transformers -> strata
    trained = set()
    for index, (name, architecture, cls, config, extra) in enumerate(hf_cases(transformers, torch)):
        def import_case(name=name, architecture=architecture, cls=cls, config=config, extra=extra, index=index):
            extra = dict(extra)
            refusal = extra.pop("refused", None)
            directory = work / f"transformers_to_strata_{index}_{architecture}"
            shutil.rmtree(directory, ignore_errors=True)
            torch.manual_seed(args.seed + index)
            model = cls(config)
            randomize(model, args.seed + index, torch)
            model.eval()
            save_pretrained(model, directory, extra)
            if extra.get("max_shard_size") and not (directory / "model.safetensors.index.json").exists():
                raise RuntimeError("save_pretrained wrote no shard index; lower max_shard_size")
            tokens = prompt()
            (directory / "tokens.json").write_text(json.dumps({"tokens": tokens}))
            if refusal:
                try:
                    run(binary, ["import", directory, architecture, "--tp", args.tp], args.verbose)
                except RuntimeError as error:
                    if refusal in str(error):
                        return 0.0, 0.0, "refused", []
                    raise
                raise RuntimeError(f"the import was expected to be refused (naming {refusal}) and was not")
            run(binary, ["import", directory, architecture, "--tp", args.tp], args.verbose)
            ours, _ = strata_logits(directory, np)
            theirs = transformers_logits(model, tokens, torch, np)
            max_abs, relative = compare(ours, theirs, np)
            return max_abs, relative, f"{ours.shape[0]} x {ours.shape[1]}", []
        record(f"transformers -> strata (tp={args.tp})", name, import_case)

        # The first imported case of each architecture again: trained 5 AdamW steps by strata, exported,
        # and loaded by transformers, whose logits and loss on the prompt must be strata's.
        if rows[-1][5] != "ok" or rows[-1][2] == "refused" or architecture in trained:
            continue
        trained.add(architecture)
        def train_case(architecture=architecture, cls=cls, index=index):
            directory = work / f"transformers_to_strata_{index}_{architecture}"
            out = directory / "trained"
            shutil.rmtree(out, ignore_errors=True)
            run(binary, ["train", directory, out, architecture, "--steps", 5], args.verbose)
            ours, tokens = strata_logits(out, np)
            model, info = load_pretrained(cls, out)
            theirs = transformers_logits(model, tokens, torch, np)
            max_abs, relative = compare(ours, theirs, np)
            losses = json.loads((out / "losses.json").read_text())["losses"]
            targets = torch.tensor(tokens[1:], dtype=torch.long)
            their_loss = float(torch.nn.functional.cross_entropy(torch.tensor(theirs[:-1]), targets))
            problems = loading_problems(info)
            if not losses[-1] < losses[0]:
                problems.append(f"strata's loss did not fall over the 5 steps: {losses[0]:.6f} -> {losses[-1]:.6f}")
            if abs(their_loss - losses[-1]) > args.rtol * abs(their_loss):
                problems.append(f"transformers' loss of the trained model {their_loss:.7f}, strata's {losses[-1]:.7f}")
            return max_abs, relative, f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", problems
        record("transformers -> strata, 5 steps -> transformers", name, train_case)

    header = ("direction", "case", "logits", "max |diff|", "rel. error", "result")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join("{:<%d}" % w for w in widths)
    print(line.format(*header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line.format(*r[:6]))
        if r[6]:
            print("    " + r[6])
    print()
    print(f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, safetensors {safetensors_version}; "
          f"pass: relative error <= {args.rtol:g}")
    if args.keep:
        print(f"checkpoints kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in rows if r[5] != "ok"]
    print(f"{len(rows) - len(failed)} of {len(rows)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
