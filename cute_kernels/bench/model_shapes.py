"""The GEMMs real models run: the linear layers of a few model families, at the token counts
of prefill, decode and training, as `gemm_shapes` benchmark cases.

Each model is described by the sizes its Hugging Face / timm config gives (hidden size, heads,
key/value heads, head dim, MLP width, vocabulary); `linear_layers` lists the nn.Linear layers
one block (and the LM head) holds, as (name, out_features N, in_features K), with q, k, v and
gate, up as the separate layers those libraries build. Every layer gives, per token count M:
the forward y = x·Wᵀ (M×N×K, both operands K-major; layout "bias" where the layer adds a bias,
y = x·Wᵀ + b, as the model runs it), and in training its input gradient
dX = dY·W (M×K×N, W read N-major: layout "bn") and weight gradient dW = dYᵀ·X (N×K×M, dYᵀ
read M-major and X N-major: layout "am_bn"). `gemm_shape_cases()` dedupes the union over the
models (the same shape from two models is timed once) and adds the shape classes issue 13
names (GEMV, K not a multiple of 8, small M with long K); `uses(case)` says which layers of
which models produce a case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ModelShape", "MODELS", "linear_layers", "gemm_shape_cases", "uses", "PREFILL_M", "DECODE_M", "TRAIN_M"]

PREFILL_M = (4096, 8192, 16384)  # tokens per forward at prefill (batch x sequence)
DECODE_M = (1, 8, 32, 128)  # tokens per decode step (the batch)
TRAIN_M = 8192  # tokens per training step for the backward GEMMs


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int  # the MLP's inner width (intermediate_size)
    vocab: int = 0  # 0: no LM head (a vision model)
    gated: bool = True  # SwiGLU MLP (gate and up) vs a plain two-layer MLP (fc1, fc2)
    fused_qkv: bool = False  # one qkv projection (timm's ViT) vs q, k, v layers
    tokens: tuple = ()  # token counts for a vision model (batch x patches), instead of PREFILL_M
    biased: tuple = ()  # the layers (linear_layers' names) that add a bias in their forward


MODELS = (
    ModelShape("vit_b16", 768, 12, 12, 64, 3072, gated=False, fused_qkv=True, tokens=(64 * 197,),
               biased=("qkv", "o", "fc1", "fc2")),
    ModelShape("vit_l16", 1024, 16, 16, 64, 4096, gated=False, fused_qkv=True, tokens=(64 * 197,),
               biased=("qkv", "o", "fc1", "fc2")),
    # timm's eva02_base_patch14_224: separate q, k, v layers (k without a bias) and a SwiGLU MLP,
    # 257 tokens an image
    ModelShape("eva02_b14", 768, 12, 12, 64, 2048, tokens=(64 * 257,), biased=("q", "v", "o", "gate", "up", "down")),
    ModelShape("llama3_1b", 2048, 32, 8, 64, 8192, vocab=128256),
    ModelShape("llama3_8b", 4096, 32, 8, 128, 14336, vocab=128256),
    ModelShape("llama3_70b", 8192, 64, 8, 128, 28672, vocab=128256),
    ModelShape("mistral_7b", 4096, 32, 8, 128, 14336, vocab=32000),
    ModelShape("qwen2.5_7b", 3584, 28, 4, 128, 18944, vocab=152064, biased=("q", "k", "v")),
)


def linear_layers(model: ModelShape) -> list[tuple[str, int, int]]:
    """(layer, N = out_features, K = in_features) of one block, then the LM head."""
    h, q, kv = model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim
    attn = [("qkv", q + 2 * kv, h)] if model.fused_qkv else [("q", q, h), ("k", kv, h), ("v", kv, h)]
    attn.append(("o", h, q))
    mlp = [("gate", model.mlp, h), ("up", model.mlp, h), ("down", h, model.mlp)] if model.gated else \
        [("fc1", model.mlp, h), ("fc2", h, model.mlp)]
    head = [("lm_head", model.vocab, h)] if model.vocab else []
    return attn + mlp + head


def _model_gemms(model: ModelShape):
    """(M, N, K, layout, use) of every GEMM the model's linear layers run."""
    prefill = model.tokens or PREFILL_M
    train = model.tokens[0] if model.tokens else TRAIN_M
    for layer, n, k in linear_layers(model):
        fwd = "bias" if layer in model.biased else ""
        for m in prefill:
            yield m, n, k, fwd, f"{model.name}.{layer} fwd M={m}"
        if not model.tokens:
            for m in DECODE_M:
                yield m, n, k, fwd, f"{model.name}.{layer} decode M={m}"
        yield train, k, n, "bn", f"{model.name}.{layer} dX M={train}"
        yield n, k, train, "am_bn", f"{model.name}.{layer} dW M={train}"


# The shape classes issue 13 measured cliffs on, beyond what the models give.
CLASSES = (
    (1, 4096, 4096, "", "class: GEMV"),
    (2048, 2048, 4100, "", "class: K not a multiple of 8"),
    (2048, 4100, 2048, "", "class: N not a multiple of 8"),
    (256, 4096, 16384, "", "class: small M, long K"),
    (4096, 2, 1024, "", "class: classifier head / router (small N)"),
)


def _all_uses():
    for model in MODELS:
        yield from _model_gemms(model)
    yield from CLASSES


def gemm_shape_cases(dtype: str = "bf16") -> tuple:
    """The `gemm_shapes` suite's cases: every distinct (M, N, K, layout), in first-use order."""
    from .cases import GemmCase

    seen, cases = set(), []
    for m, n, k, layout, _ in _all_uses():
        if (m, n, k, layout) not in seen:
            seen.add((m, n, k, layout))
            cases.append(GemmCase(m, n, k, dtype, layout=layout))
    return tuple(cases)


def uses(case) -> list[str]:
    """The layers (model.layer pass M=...) and classes that run `case`'s GEMM."""
    key = (case.m, case.n, case.k, case.layout)
    return [use for m, n, k, layout, use in _all_uses() if (m, n, k, layout) == key]


def shape_class(case_name: str) -> str:
    """The shape class a `gemm_shapes` case ("MxNxK" with an optional _layout) belongs to, as
    issue 13's bars group them: the two backward GEMMs, unaligned sizes, small M (decode), small
    N, and the prefill forwards with and without a bias."""
    m, n, k, *layout = re.fullmatch(r"(\d+)x(\d+)x(\d+)(?:_(\w+))?", case_name).groups()
    m, n, k, layout = int(m), int(n), int(k), layout[0] or ""
    if layout == "am_bn":
        return "training dW = Xᵀ·dY"
    if layout == "bn":
        return "training dX = dY·W"
    if k % 8 or n % 8:
        return "K or N not a multiple of 8"
    if m <= 16:
        return "M ≤ 16 (GEMV, decode)"
    if m <= 128:
        return "M 17-128 (decode batches)"
    if n <= 16:
        return "N ≤ 16 (classifier head, router)"
    return "forward with bias" if layout == "bias" else "forward (prefill, M ≥ 256)"
