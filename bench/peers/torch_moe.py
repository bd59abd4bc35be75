"""Peer baseline: a Mixtral-shaped mixture-of-experts model trained in PyTorch, to time beside the
project's `train_mixtral` (and its dense `train_llama` of the same active parameters) on the same GPU
in the same command.

The model is the trainers' Llama block with the MLP replaced by a top-k MoE layer: RMSNorm, RoPE,
grouped-query attention through scaled_dot_product_attention, SwiGLU experts, an untied output layer,
random tokens, bf16 autocast, fused AdamW, torch.compile (unless --no-compile). The experts run as
torchtitan runs them: tokens sorted by expert into groups padded to a multiple of 16 rows, then one
`torch._grouped_mm` per expert GEMM reading the group offsets from device memory. The permutation is
built on the device at a fixed size (tokens * topk + experts * 16 rows), so the step never waits on
the host for the token counts. Router: softmax over the experts' logits, top-k, weights renormalized
over the chosen k (Mixtral's), a Switch-style load-balancing loss times --aux-loss-coeff.
--experts 0 trains the dense model instead (an MLP of width --ffn).

    python3 torch_moe.py                                  # 8 experts of 3584, top-2 (the MoE benchmark's shape)
    python3 torch_moe.py --experts 0 --ffn 7168           # the dense model of the same active parameters
    python3 torch_moe.py --accum 8                        # 8 micro-batches of --batch sequences a step

Prints one JSON line: tokens/s (the mean over --steps after warm-up), active TFLOP/s per GPU with
FLOPs per token = 6 * (active matmul parameters) + 6 * L * D * T, peak memory.
"""
import time
_launch = time.perf_counter()
import argparse, json, math
import torch, torch.nn as nn, torch.nn.functional as F

from peer_timing import time_steps  # bench/peers/peer_timing.py

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=8); p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--heads", type=int, default=16); p.add_argument("--groups", type=int, default=8)
p.add_argument("--experts", type=int, default=8); p.add_argument("--topk", type=int, default=2)
p.add_argument("--ffn", type=int, default=3584, help="expert width (the dense MLP's with --experts 0)")
p.add_argument("--vocab", type=int, default=384, help="the trainers' byte vocabulary (257) padded to 128")
p.add_argument("--seq", type=int, default=1024); p.add_argument("--batch", type=int, default=8)
p.add_argument("--steps", type=int, default=20); p.add_argument("--warmup", type=int, default=5)
p.add_argument("--accum", type=int, default=1, help="micro-batches of --batch sequences per optimizer step")
p.add_argument("--aux-loss-coeff", type=float, default=1e-2)
p.add_argument("--no-compile", action="store_true")
a = p.parse_args()
L, D, H, G, E, K, Fw, V, T, B = a.layers, a.hidden, a.heads, a.groups, a.experts, a.topk, a.ffn, a.vocab, a.seq, a.batch
hd = D // H
ALIGN = 16  # rows per group, a multiple of which torch._grouped_mm takes in bf16
torch.manual_seed(0)


def rope_tables():
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    return torch.cos(ang).cuda(), torch.sin(ang).cuda()


COS, SIN = rope_tables()


def rope(x):  # x: [b, heads, t, hd], rotating halves
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    c, s = COS[: x.shape[2]].to(x.dtype), SIN[: x.shape[2]].to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


class Attention(nn.Module):
    def __init__(s):
        super().__init__()
        s.q, s.kv, s.o = nn.Linear(D, D, bias=False), nn.Linear(D, 2 * G * hd, bias=False), nn.Linear(D, D, bias=False)

    def forward(s, x):
        b, t, _ = x.shape
        q = s.q(x).view(b, t, H, hd).transpose(1, 2)
        k, v = s.kv(x).view(b, t, 2, G, hd).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, enable_gqa=True)
        return s.o(y.transpose(1, 2).reshape(b, t, D))


class DenseMlp(nn.Module):
    def __init__(s):
        super().__init__()
        s.w13, s.w2 = nn.Linear(D, 2 * Fw, bias=False), nn.Linear(Fw, D, bias=False)

    def forward(s, x):
        g, u = s.w13(x).chunk(2, dim=-1)
        return s.w2(F.silu(g) * u), x.new_zeros((), dtype=torch.float32)


class MoE(nn.Module):
    def __init__(s):
        super().__init__()
        s.router = nn.Linear(D, E, bias=False)
        # [E, out, in], passed transposed as torchtitan does
        s.w1 = nn.Parameter(torch.randn(E, Fw, D) * 0.02)
        s.w3 = nn.Parameter(torch.randn(E, Fw, D) * 0.02)
        s.w2 = nn.Parameter(torch.randn(E, D, Fw) * 0.02)

    def forward(s, x):
        shape = x.shape
        x = x.reshape(-1, D)
        n = x.shape[0]
        probs = torch.softmax(s.router(x).float(), dim=-1)                     # [n, E]
        w, idx = torch.topk(probs, K, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        flat = idx.reshape(-1)                                                   # [n K]
        counts = torch.zeros(E, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        aux = E * (counts.float() / (n * K) * probs.mean(0)).sum()
        padded = (counts + ALIGN - 1) // ALIGN * ALIGN
        ends = torch.cumsum(padded, 0)
        order = torch.argsort(flat, stable=True)                                 # assignments by expert
        sorted_e = flat[order]
        start_unpadded = torch.cumsum(counts, 0) - counts
        dest = (ends - padded)[sorted_e] + torch.arange(n * K, device=x.device) - start_unpadded[sorted_e]
        rows = n * K + E * ALIGN                                                 # fixed: no host wait
        token = order // K
        xb = x.to(torch.bfloat16)
        xp = xb.new_zeros(rows, D).index_copy(0, dest, xb[token])
        offs = ends.to(torch.int32)
        g = torch._grouped_mm(xp, s.w1.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        u = torch._grouped_mm(xp, s.w3.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        yp = torch._grouped_mm(F.silu(g) * u, s.w2.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        y = yp[dest] * w.reshape(-1)[order].unsqueeze(1).to(yp.dtype)
        out = torch.zeros(n, D, dtype=y.dtype, device=x.device).index_add(0, token, y)
        return out.view(shape), aux


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1, s.n2 = nn.RMSNorm(D), nn.RMSNorm(D)
        s.attn = Attention()
        s.mlp = MoE() if E > 0 else DenseMlp()

    def forward(s, x):
        x = x + s.attn(s.n1(x))
        y, aux = s.mlp(s.n2(x))
        return x + y, aux


class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D)
        s.blocks = nn.ModuleList([Block() for _ in range(L)])
        s.norm, s.out = nn.RMSNorm(D), nn.Linear(D, V, bias=False)
        for name, prm in s.named_parameters():
            if prm.dim() == 2 and "router" not in name:
                nn.init.normal_(prm, 0.0, 0.02)

    def forward(s, idx, tgt):
        x = s.emb(idx)
        aux = x.new_zeros((), dtype=torch.float32)
        for blk in s.blocks:
            x, a_ = blk(x)
            aux = aux + a_
        logits = s.out(s.norm(x))
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1)) + a.aux_loss_coeff * aux


model = Model().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
step_fn = model if a.no_compile else torch.compile(model)
attn_params = D * D + D * 2 * G * hd + D * D
mlp_active = (K * 3 * D * Fw + D * E) if E > 0 else 3 * D * Fw
active = L * (attn_params + mlp_active) + V * D  # matmul parameters a token passes through
flops_per_token = 6 * active + 6 * L * D * T


def step():
    for _ in range(a.accum):  # gradients summed over the micro-batches, as the trainers' global batch does
        idx = torch.randint(0, V, (B, T), device="cuda")
        tgt = torch.randint(0, V, (B, T), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(idx, tgt)
        (loss / a.accum).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


step()
torch.cuda.synchronize()
first_step_s = time.perf_counter() - _launch
dt, loss = time_steps(step, a.warmup, a.steps, torch.cuda.synchronize)
tok_s = B * T * a.accum / dt
print(json.dumps({
    "peer": "pytorch-moe", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
    "layers": L, "hidden": D, "heads": H, "groups": G, "experts": E, "topk": K, "ffn": Fw, "vocab": V, "seq": T,
    "batch": B, "accum": a.accum, "compile": not a.no_compile, "active_params_M": round(active / 1e6, 1),
    "params_M": round(sum(q.numel() for q in model.parameters()) / 1e6, 1), "step_ms": round(dt * 1e3, 2),
    "tokens_per_s": round(tok_s), "active_tflops": round(flops_per_token * tok_s / 1e12, 1),
    "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2), "loss": round(loss.item(), 4),
    "first_step_s": round(first_step_s, 1),
}))
