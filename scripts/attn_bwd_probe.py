"""Issue 16's backward fuzz failures: kernel or tolerance? Each case's dq, dk, dv from ours and
from the peers (SDPA's flash, efficient and cuDNN backends, FA4 where it runs) against a float64
reference, and against a float64 reference that rounds O to the input dtype before forming
D = rowsum(dO * O), as every FlashAttention-style backward does."""
import math
import torch
import torch.nn.functional as F

torch.manual_seed(0)
CASES = [  # (B, H, Sq, Sk, D, dtype, causal alignment)
    (1, 1, 2, 2, 64, torch.bfloat16, "top_left"), (1, 2, 2, 17, 80, torch.bfloat16, "top_left"),
    (1, 2, 2, 17, 80, torch.bfloat16, "bottom_right"), (1, 1, 1024, 1, 256, torch.float16, None),
    (1, 4, 3, 3, 64, torch.bfloat16, "top_left"), (2, 8, 64, 64, 128, torch.bfloat16, "top_left"),
]


def ref_grads(q, k, v, do, causal, o_rounded=None):
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        off = 0 if causal == "top_left" else sk - sq
        keep = torch.arange(sk, device=q.device)[None] <= torch.arange(sq, device=q.device)[:, None] + off
        s = s.masked_fill(~keep, -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    o = p @ vd
    o.backward(do.double())
    return qd.grad, kd.grad, vd.grad, o


def rel(x, r):
    return ((x.double() - r).norm() / r.norm().clamp_min(1e-30)).item()


def ours(q, k, v, do, causal):
    from cute_kernels.nn.functional import scaled_dot_product_attention as sdpa
    from torch.nn.attention.bias import causal_lower_right
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    mask = causal_lower_right(q.shape[2], k.shape[2]) if causal == "bottom_right" else None
    o = sdpa(qq, kk, vv, attn_mask=mask, is_causal=causal == "top_left")
    o.backward(do)
    return qq.grad, kk.grad, vv.grad


def sdpa_backend(backend):
    def f(q, k, v, do, causal):
        from torch.nn.attention import sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(backend):
            if causal == "bottom_right":
                o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=causal_lower_right(q.shape[2], k.shape[2]))
            else:
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal == "top_left")
        o.backward(do)
        return qq.grad, kk.grad, vv.grad
    return f


def fa4(q, k, v, do, causal):
    from flash_attn.cute import flash_attn_func
    if causal == "top_left" and q.shape[2] != k.shape[2]:
        raise RuntimeError("FA4 aligns causal bottom-right")
    qq, kk, vv = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    o = flash_attn_func(qq, kk, vv, causal=causal is not None)
    o = o[0] if isinstance(o, tuple) else o
    o.backward(do.transpose(1, 2).contiguous())
    return tuple(t.grad.transpose(1, 2) for t in (qq, kk, vv))


from torch.nn.attention import SDPBackend
IMPLS = {"ours": ours, "sdpa_flash": sdpa_backend(SDPBackend.FLASH_ATTENTION),
         "sdpa_eff": sdpa_backend(SDPBackend.EFFICIENT_ATTENTION), "sdpa_cudnn": sdpa_backend(SDPBackend.CUDNN_ATTENTION),
         "fa4": fa4}
for (b, h, sq, sk, d, dt, causal) in CASES:
    q = torch.randn(b, h, sq, d, device="cuda", dtype=dt)
    k = torch.randn(b, h, sk, d, device="cuda", dtype=dt)
    v = torch.randn(b, h, sk, d, device="cuda", dtype=dt)
    do = torch.randn(b, h, sq, d, device="cuda", dtype=dt)
    gq, gk, gv, o = ref_grads(q, k, v, do, causal)
    norms = f"|dq| {gq.norm().item():.3g} |dk| {gk.norm().item():.3g} |dv| {gv.norm().item():.3g}"
    print(f"B{b} H{h} Sq{sq} Sk{sk} D{d} {str(dt)[6:]} causal={causal}: {norms}")
    for name, fn in IMPLS.items():
        try:
            g = fn(q, k, v, do, causal)
            print(f"   {name:11s} dq {rel(g[0], gq):.3g}  dk {rel(g[1], gk):.3g}  dv {rel(g[2], gv):.3g}")
        except Exception as e:  # noqa: BLE001
            print(f"   {name:11s} -- {type(e).__name__}: {str(e)[:100]}")
