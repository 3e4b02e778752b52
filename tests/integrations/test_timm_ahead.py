"""integrations.timm's compile-ahead predictor: for a timm-style ViT attention (one qkv projection
split by reshape and permute, SDPA through a global name, rebound by `nn.patch`), the predicted
SDPA call has the layout the module's own call has, and it runs. A stand-in model defined under
a "timm." module name, so this runs without timm installed."""

from __future__ import annotations

import pickle
import warnings

import torch
import torch.nn.functional as F


class Attention(torch.nn.Module):
    def __init__(self, dim=32, num_heads=4):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.fused_attn = True
        self.qkv = torch.nn.Linear(dim, dim * 3)
        self.attn_drop = torch.nn.Dropout(0.0)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Block(torch.nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attn = Attention(dim)

    def forward(self, x):
        return x + self.attn(self.norm1(x))


class VisionTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(), Block())

    def forward(self, x):
        return self.blocks(x)


for cls in (Attention, Block, VisionTransformer):
    cls.__module__ = "timm.models.vision_transformer"


def test_the_predicted_sdpa_call_has_the_module_s_layout_and_runs(monkeypatch):
    import cute_kernels.nn as cnn
    from cute_kernels.integrations import timm as ct
    from cute_kernels.nn import ahead
    from cute_kernels.nn import functional as cf
    from cute_kernels.runtime import ahead_worker

    model = cnn.patch(VisionTransformer(), fallback="torch").train()
    assert ct._predict in ahead.PREDICTORS
    x = torch.randn(2, 7, 32, requires_grad=True)
    forwards, backwards = ct._predict(model, x)
    assert len(forwards) == len(backwards) == 1  # two blocks alike
    predicted = forwards[0].args[0]

    seen = []
    real = cf.scaled_dot_product_attention
    monkeypatch.setattr(cf, "scaled_dot_product_attention", lambda q, k, v, *a, **kw: seen.append(q) or real(
        q, k, v, *a, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's FallbackWarning
        model(x)
        for call in forwards + backwards:
            ahead_worker.run(pickle.loads(pickle.dumps(call)))
    q = seen[0]
    assert predicted.shape == tuple(q.shape) and predicted.stride == q.stride() and predicted.dtype == q.dtype
    assert forwards[0].kwargs == {"kernel": "auto", "fallback": "torch"} and backwards[0].backward
    with torch.no_grad():
        assert ct._predict(model.eval(), x)[1] == []
    assert ct._predict(torch.nn.Linear(2, 2), x) == ([], [])
