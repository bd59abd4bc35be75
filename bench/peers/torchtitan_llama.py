"""Peer baseline: Llama 3 8B trained with torchtitan's own model and parallelization (FSDP2, tensor +
sequence parallel with loss parallel, per-block torch.compile, activation checkpointing) on the
GPUs of one host, to run beside strata's trainer on the same GPUs in the same command.

torchtitan's pieces, not a re-implementation: the model is torchtitan.models.llama3's Transformer
built from its "8B" TransformerModelArgs (32 layers, dim 4096, 32 heads, 8 kv heads, ffn 14336 from
multiple_of 1024 and ffn_dim_multiplier 1.3, vocab 128256, rope theta 500000, SDPA causal
attention); the meshes are torchtitan's ParallelDims; parallelize_llama applies TP, activation
checkpointing (its op-level selective policy), torch.compile per TransformerBlock and FSDP2 with
bf16 parameters and fp32 gradient reduction (torchtitan's default mixed precision), from a JobConfig
holding the few fields it reads; the loss is torchtitan's cross entropy (sum, divided by the global
token count, compiled with the model), the gradients are clipped at 1.0 by its clip_grad_norm_, the
training context is its loss-parallel context. Our own small loop around them: random tokens
(the same on the ranks of one TP group), fused AdamW (lr 3e-4 as its llama3_8b.toml, betas
0.9/0.95, eps 1e-8, weight decay 0.1 as its defaults), no data loader, tokenizer, checkpointer,
metrics or LR schedule.

Release: torchtitan 0.2.2 (February 2026), whose imports and code paths here work on torch 2.11.
torchtitan 0.3.0 needs a newer torch (it imports torch.distributed.fsdp.DataParallelMeshDims, which
2.11 lacks) and has a different config API.

    torchrun --standalone --nproc-per-node 4 torchtitan_llama.py --layout fsdp4 --local-batch 1
    torchrun --standalone --nproc-per-node 4 torchtitan_llama.py --layout tp2-fsdp2 --local-batch 2
    torchrun --standalone --nproc-per-node 4 torchtitan_llama.py --layout tp4 --local-batch 4

(the same 4 x 8192 tokens per step in all three; on 80 GB cards fsdp4 --local-batch 2 is likely
out of memory.)

--layout tpX-fsdpY (either part may be left out; the missing degree fills the world size), or
--tp X --dp-shard Y. --local-batch is per data-parallel (FSDP) rank, so the global batch is
local_batch * fsdp and every rank of a TP group sees the same tokens. --ac none|selective|full
(default selective with torchtitan's "op" policy, as its llama3_8b.toml); --selective-ac-option N
gives its layer-frequency variant instead. --compile/--no-compile (default on; torchtitan compiles
each block with fullgraph=True, and the loss). --layers (and --dim, --heads, --kv-heads, --vocab)
shrink the model for a test. --device cpu (gloo) only checks the driver on a machine without GPUs.

One deviation: with an FSDP degree of 1 (e.g. tp4), torchtitan 0.2.2 would apply no fully_shard and
then, under TP, no autocast either, so the model would run in fp32. Here torchtitan's apply_fsdp is
applied over the size-1 fsdp mesh instead (no collectives; it only installs the bf16/fp32
MixedPrecisionPolicy), which is what torchtitan 0.3.0's parallelize does for that case.

Packages beyond torch (the GPU machine has no network): torchtitan 0.2.2 and what its imports need,
tyro, docstring_parser, typeguard, typing_extensions (typeguard wants >= 4.14) and torchdata, carried
as wheels in .whl/ (not tracked) and installed with

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site

It also imports tokenizers (present there). The HF `datasets` package (pyarrow, pandas, ...) is not
carried: torchtitan.models.llama3 imports its text data loader at import time, so when `datasets` is
missing it is stubbed in sys.modules with placeholders that raise if called; no data loading runs.

Prints one JSON line (rank 0) on stdout, or one with "error" when the run fails (out of memory
included; the traceback goes to stderr) and then exits nonzero. PYTORCH_ALLOC_CONF defaults to
expandable_segments:True, as torchtitan's launcher sets it. tokens_per_s counts the global batch
(local_batch * fsdp * seq per step); mfu_per_gpu is in percent of --peak-tflops (989, H100 dense
bf16); peak_mem_GiB is the largest torch.cuda.max_memory_allocated over the ranks. FLOPs per
token = 6*N_matmul + 6*L*D*T (the count every benchmark of the project uses; N_matmul is every
Linear weight, output layer included, input embedding excluded), not torchtitan's own
6*N + 12*L*D*T.
"""
import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import sys
import time
import types

p = argparse.ArgumentParser()
p.add_argument("--layout", default=None, help="tpX-fsdpY, fsdpY or tpX (default: FSDP over all ranks)")
p.add_argument("--tp", type=int, default=None)
p.add_argument("--dp-shard", type=int, default=None)
p.add_argument("--seq", type=int, default=8192)
p.add_argument("--local-batch", type=int, default=1)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
p.add_argument("--ac", choices=["none", "selective", "full"], default="selective")
p.add_argument("--selective-ac-option", default="op", help="'op' or a layer frequency N")
p.add_argument("--layers", type=int, default=None)
p.add_argument("--dim", type=int, default=None)
p.add_argument("--heads", type=int, default=None)
p.add_argument("--kv-heads", type=int, default=None)
p.add_argument("--vocab", type=int, default=None)
p.add_argument("--lr", type=float, default=3e-4)
p.add_argument("--peak-tflops", type=float, default=989.0)
p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
a = p.parse_args()

for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
             ("MASTER_PORT", "29517")):
    os.environ.setdefault(k, v)  # a plain `python3 torchtitan_llama.py` is a world of one
os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")  # as torchtitan's run_train.sh
world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])

# the layout: tp innermost, FSDP over the rest (torchtitan's mesh order)
tp, fsdp, layout_error = a.tp, a.dp_shard, None
for part in (a.layout or "").lower().split("-") if a.layout else []:
    m = re.fullmatch(r"(tp|fsdp|dp)(\d+)", part)
    if not m:
        layout_error = f"--layout {a.layout}: its parts are tpX and fsdpY"
    elif m.group(1) == "tp":
        tp = int(m.group(2))
    else:
        fsdp = int(m.group(2))
tp = max(1, tp or (world // fsdp if fsdp else 1))
fsdp = max(1, fsdp or world // tp)
layout = "-".join([f"tp{tp}"] * (tp > 1) + [f"fsdp{fsdp}"] * (fsdp > 1)) or "single"
B, T = a.local_batch, a.seq

result = {"stack": "torchtitan", "layout": layout, "world": world, "tp": tp, "fsdp": fsdp,
          "seq": T, "batch": B, "global_batch": B * fsdp, "steps": a.steps, "warmup": a.warmup,
          "compile": a.compile, "ac": a.ac if a.ac != "selective" else f"selective-{a.selective_ac_option}"}


def emit(code):
    if rank == 0:
        print(json.dumps(result), flush=True)
    if code == 0:
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no process-group teardown (it can hang on a failed peer or abort in gloo)


def on_term(signum, frame):  # torchrun ends the survivors when another rank fails
    result.setdefault("error", f"terminated by signal {signum} (another rank failed?)")
    emit(1)


signal.signal(signal.SIGTERM, on_term)


def error_text(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


phase = "import"
try:
    import torch
    import torch.distributed as dist

    result["torch"] = torch.__version__
    if importlib.util.find_spec("datasets") is None:  # only the HF data loader, never called here
        def _missing(*args, **kwargs):
            raise ImportError("the `datasets` package is a stub in torchtitan_llama.py")
        ds = types.ModuleType("datasets")
        ds.Dataset, ds.IterableDataset = type("Dataset", (), {}), type("IterableDataset", (), {})
        ds.load_dataset = _missing
        ds_dist = types.ModuleType("datasets.distributed")
        ds_dist.split_dataset_by_node = _missing
        ds.distributed = ds_dist
        sys.modules["datasets"], sys.modules["datasets.distributed"] = ds, ds_dist
    import torchtitan
    import torchtitan.distributed.parallel_dims as tt_parallel_dims
    from torchtitan.components.loss import build_cross_entropy_loss
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3 import Transformer, llama3_args, parallelize_llama
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp

    result["stack"] = f"torchtitan {torchtitan.__version__}"

    phase = "setup"
    if a.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl")
        result["gpu"] = torch.cuda.get_device_name()
    else:  # torchtitan picks "cuda" when no accelerator is present; the meshes are on CPU here
        tt_parallel_dims.device_type = "cpu"
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    if layout_error:
        raise ValueError(layout_error)
    if tp * fsdp != world:
        raise ValueError(f"layout tp{tp} x fsdp{fsdp} != {world} processes")

    # the fields of torchtitan's JobConfig that the model, parallelize_llama and the loss read
    jc = JobConfig()
    jc.training.seq_len, jc.training.local_batch_size = T, B
    jc.training.mixed_precision_param, jc.training.mixed_precision_reduce = "bfloat16", "float32"
    jc.parallelism.tensor_parallel_degree, jc.parallelism.data_parallel_shard_degree = tp, fsdp
    jc.parallelism.disable_loss_parallel = False
    jc.activation_checkpoint.mode = a.ac
    jc.activation_checkpoint.selective_ac_option = a.selective_ac_option
    jc.compile.enable, jc.compile.components = a.compile, ["model", "loss"]

    parallel_dims = ParallelDims(dp_shard=fsdp, dp_replicate=1, cp=1, tp=tp, pp=1, ep=1, etp=1,
                                 world_size=world)
    parallel_dims.build_mesh()
    dist_utils.set_determinism(parallel_dims, device, jc.debug, distinct_seed_mesh_dims=["pp"])
    dp_rank = parallel_dims.get_mesh("fsdp").get_local_rank() if fsdp > 1 else 0

    args = llama3_args["8B"]
    for field, value in (("n_layers", a.layers), ("dim", a.dim), ("n_heads", a.heads),
                         ("n_kv_heads", a.kv_heads), ("vocab_size", a.vocab)):
        if value is not None:
            setattr(args, field, value)
    args.update_from_config(jc)  # max_seq_len = seq (the RoPE table)
    with torch.device("meta"):
        model = Transformer(args)
    n_params = sum(q.numel() for q in model.parameters())
    n_matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    L, D = args.n_layers, args.dim
    result.update({"layers": L, "hidden": D, "heads": args.n_heads, "kv_heads": args.n_kv_heads,
                   "ffn": model.layers["0"].feed_forward.w1.out_features, "vocab": args.vocab_size,
                   "params_B": round(n_params / 1e9, 3)})

    model = parallelize_llama(model, parallel_dims, jc)
    if not parallel_dims.fsdp_enabled:  # the deviation in the docstring: bf16 params, fp32 reduce
        apply_fsdp(model, parallel_dims._meshes["fsdp"], param_dtype=torch.bfloat16,
                   reduce_dtype=torch.float32, pp_enabled=False)
    if a.device == "cpu":  # gloo has no PREMUL_SUM, which FSDP2 uses for torchtitan's divide factor of 1
        for mod in model.modules():
            if hasattr(mod, "set_force_sum_reduction_for_comms"):
                mod.set_force_sum_reduction_for_comms(True)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()

    loss_fn = build_cross_entropy_loss(jc)
    train_context = dist_utils.get_train_context(parallel_dims.tp_enabled)
    params = [q for q in model.parameters()]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=a.device == "cuda", foreach=None if a.device == "cuda" else True)
    global_tokens = float(B * T * fsdp)
    step_no = [0]

    def step():
        gen = torch.Generator(device=device).manual_seed(1234 + 7919 * dp_rank + step_no[0])
        step_no[0] += 1
        tokens = torch.randint(0, args.vocab_size, (B, T + 1), device=device, generator=gen)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        with train_context():
            pred = model(inputs)
            loss = loss_fn(pred, labels) / global_tokens  # torchtitan: sum / global valid tokens
            del pred
            loss.backward()
        dist_utils.clip_grad_norm_(params, 1.0, foreach=True, pp_mesh=None, ep_enabled=False)
        opt.step()
        opt.zero_grad()
        return loss

    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    phase = "warmup"
    for _ in range(a.warmup):
        step()
    sync()
    phase = "timed steps"
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    tok_s = global_tokens / dt
    flops_per_token = 6 * n_matmul + 6 * L * D * T
    if a.device == "cuda":
        peak = torch.tensor([torch.cuda.max_memory_allocated()], dtype=torch.float64, device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        result["peak_mem_GiB"] = round(peak.item() / 2**30, 2)
    loss_value = loss.detach()
    if isinstance(loss_value, torch.distributed.tensor.DTensor):
        loss_value = loss_value.full_tensor()
    dist.all_reduce(loss_value)  # each rank's loss is its tokens' sum over the global token count
    result.update({"step_ms": round(dt * 1e3, 1), "tokens_per_s": round(tok_s),
                   "mfu_per_gpu": round(100 * flops_per_token * tok_s / world / (a.peak_tflops * 1e12), 1),
                   "loss": round(loss_value.item() / tp, 4)})
except BaseException as e:  # noqa: BLE001 - the bench reports the failure and goes on
    oom = ("torch" in sys.modules and isinstance(e, sys.modules["torch"].OutOfMemoryError)) or \
        "out of memory" in str(e).lower()  # also when compile or a collective wraps it
    result["error"] = f"{phase}: " + ("out of memory" if oom else error_text(e))
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_available() and a.device == "cuda":
        with contextlib.suppress(Exception):
            result["peak_mem_GiB"] = round(sys.modules["torch"].cuda.max_memory_allocated() / 2**30, 2)
    import traceback
    traceback.print_exc()  # stderr; stdout keeps the one JSON line
    emit(1)
emit(0)
