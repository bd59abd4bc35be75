"""Peer baseline: a Llama-shaped model trained at long context with PyTorch's own context
parallelism (torch.distributed.tensor.experimental.context_parallel over
scaled_dot_product_attention), to run beside strata's train_llama --context-parallel-size on the
same GPUs in the same command.

RMSNorm, rotary embeddings, grouped-query attention (keys and values repeated to the query heads
before SDPA, as torchtitan does), SwiGLU, untied output layer, bf16 autocast, fused AdamW, every
block recomputed in the backward (torch.utils.checkpoint), the loss over the rank's tokens in
chunks. Under torchrun with N processes the sequence is split over the N GPUs (PyTorch's
load-balanced split) and the gradients are averaged over them by DDP; one process is the plain
single-GPU run of the same model.

    python3 torch_cp.py --seq 65536                                   # 1 GPU
    torchrun --standalone --nproc-per-node 2 torch_cp.py --seq 65536  # cp = 2

--rotate alltoall (default: the keys and values pass around the ring) or allgather (each rank
gathers all keys and values). --compile wraps each block in torch.compile (eager by default: the
context-parallel dispatch of SDPA is an eager-mode feature in the releases this was written for).

Prints one JSON line (rank 0), or one with "error" when the step fails (out of memory included).
FLOPs per token = 6*N_matmul + 6*L*D*T (the count every benchmark of the project uses).
"""
import argparse
import json
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from peer_rope import rotate  # bench/peers/peer_rope.py
from peer_timing import time_steps  # bench/peers/peer_timing.py

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=16); p.add_argument("--hidden", type=int, default=2048)
p.add_argument("--heads", type=int, default=16); p.add_argument("--groups", type=int, default=8)
p.add_argument("--ffn", type=int, default=8192); p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--seq", type=int, default=65536); p.add_argument("--batch", type=int, default=1)
p.add_argument("--steps", type=int, default=3); p.add_argument("--warmup", type=int, default=2)
p.add_argument("--rotate", choices=["alltoall", "allgather"], default="alltoall")
p.add_argument("--compile", action="store_true")
p.add_argument("--peak-tflops", type=float, default=989.0)
a = p.parse_args()
L, D, H, G, F_, V, T, B = a.layers, a.hidden, a.heads, a.groups, a.ffn, a.vocab, a.seq, a.batch
HD = D // H

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
if world > 1:
    dist.init_process_group("nccl")
torch.manual_seed(0)


class RMSNorm(nn.Module):
    def __init__(s, d):
        super().__init__()
        s.weight = nn.Parameter(torch.ones(d))

    def forward(s, x):
        return F.rms_norm(x, (x.shape[-1],), s.weight, 1e-5)


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1, s.n2 = RMSNorm(D), RMSNorm(D)
        s.q, s.kv, s.o = nn.Linear(D, D, bias=False), nn.Linear(D, 2 * G * HD, bias=False), nn.Linear(D, D, bias=False)
        s.gu, s.down = nn.Linear(D, 2 * F_, bias=False), nn.Linear(F_, D, bias=False)

    def forward(s, x, cos, sin):
        b, t, _ = x.shape
        h = s.n1(x)
        q = s.q(h).view(b, t, H, HD).transpose(1, 2)
        k, v = s.kv(h).view(b, t, 2, G, HD).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, D)
        x = x + s.o(y)
        g, u = s.gu(s.n2(x)).chunk(2, dim=-1)
        return x + s.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D)
        s.blocks = nn.ModuleList([Block() for _ in range(L)])
        s.norm, s.head = RMSNorm(D), nn.Linear(D, V, bias=False)
        for name, prm in s.named_parameters():
            if prm.dim() >= 2:
                nn.init.normal_(prm, 0.0, 0.02 / math.sqrt(2 * L) if name.endswith(("o.weight", "down.weight")) else 0.02)
        s.run_block = [torch.compile(blk) if a.compile else blk for blk in s.blocks]

    def forward(s, idx, tgt, cos, sin):
        x = s.emb(idx)
        for blk in s.run_block:
            x = checkpoint(blk, x, cos, sin, use_reentrant=False)
        x = s.norm(x)
        loss, n, chunk = 0.0, idx.numel(), 8192  # the logits of 8192 tokens at a time, each chunk recomputed
        flat, labels = x.view(-1, D), tgt.view(-1)
        for i in range(0, flat.shape[0], chunk):
            part = lambda h, y: F.cross_entropy(s.head(h).float(), y, reduction="sum")
            loss = loss + checkpoint(part, flat[i:i + chunk], labels[i:i + chunk], use_reentrant=False)
        return loss / n


model = Llama().cuda()
n_params = sum(q.numel() for q in model.parameters())
n_matmul = n_params - V * D  # the input embedding is a lookup
if world > 1:
    model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
inv = 1.0 / (500000.0 ** (torch.arange(0, HD, 2, device="cuda", dtype=torch.float64) / HD))
angles = torch.arange(T, device="cuda", dtype=torch.float64)[:, None] * inv[None]
cos_all, sin_all = angles.cos().float(), angles.sin().float()

cp_context = None
if world > 1:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    set_rotate_method(a.rotate)
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))


def step():
    gen = torch.Generator(device="cuda").manual_seed(1234)  # every rank draws the same whole sequence
    idx = torch.randint(0, V, (B, T), device="cuda", generator=gen)
    tgt = torch.randint(0, V, (B, T), device="cuda", generator=gen)
    cos, sin = cos_all.clone(), sin_all.clone()
    if world > 1:
        with context_parallel(mesh, buffers=[idx, tgt, cos, sin], buffer_seq_dims=[1, 1, 0, 0],
                              no_restore_buffers={idx, tgt, cos, sin}):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(idx, tgt, cos, sin)
            loss.backward()
    else:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, tgt, cos, sin)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


result = {"peer": "pytorch", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "cp": world,
          "rotate": a.rotate if world > 1 else "-", "compile": a.compile, "layers": L, "hidden": D, "heads": H,
          "groups": G, "ffn": F_, "vocab": V, "seq": T, "batch": B, "params_M": round(n_params / 1e6, 1)}
try:
    dt, loss = time_steps(step, a.warmup, a.steps, torch.cuda.synchronize)
    tok_s = B * T / dt
    flops_per_token = 6 * n_matmul + 6 * L * D * T
    result.update({"step_ms": round(dt * 1e3, 1), "tokens_per_s": round(tok_s),
                   "mfu_pct_per_gpu": round(100 * flops_per_token * tok_s / world / (a.peak_tflops * 1e12), 1),
                   "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2), "loss": round(loss.item(), 4)})
except torch.OutOfMemoryError as e:
    result.update({"error": "out of memory", "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2)})
except Exception as e:  # noqa: BLE001 - the bench reports the failure and goes on
    result.update({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]})
if rank == 0:
    print(json.dumps(result), flush=True)
if world > 1:
    dist.destroy_process_group()
