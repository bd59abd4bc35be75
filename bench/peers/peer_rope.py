"""bench/peers/peer_rope.py: the rotary embedding the Llama peers apply, written once.

    q = rotate(q, cos, sin)

turns x [b, h, t, d] by the angles cos, sin [t, d / 2]: the pairs (i, i + d/2), rotate-half as
Hugging Face's Llama (and strata's default layout). The scripts import it from their own folder.
"""
import torch


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
