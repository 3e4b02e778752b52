"""The models of the `models` suite: each built from a config with random weights (nothing is
downloaded), at the suite's size ("bench"), a tiny one ("tiny": the CPU tests) or a small one
that our GPU kernels take ("small": head dim 64, the GPU tests), with the batch it runs on.

| name | model | batch |
| --- | --- | --- |
| `llama_gqa` | transformers Llama-3 style: hidden 2048, 4 layers, GQA 16/4 heads of 128 | 4 x 2048 tokens |
| `llama_gqa_padded` | the same, a right-padded batch (lengths 2048, 1536, 1024, 1792) | 4 x 2048 |
| `mistral_swa` | transformers Mistral, the Llama shape with `sliding_window=512` | 4 x 2048 |
| `qwen2` | transformers Qwen2 (q/k/v bias), the Llama shape | 4 x 2048 |
| `gpt_oss` | transformers gpt-oss: sinks, sliding (128) and full layers alternating, 8 experts top-2 | 4 x 2048 |
| `vit_b16` | timm vit_base_patch16_224 | 64 images |
| `eva02_b14` | timm eva02_base_patch14_224 (rotary embeddings, SwiGLU) | 64 images |

Imports torch, transformers and timm inside the functions only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

__all__ = ["ModelSpec", "SPECS", "spec", "build", "make_batch"]

VOCAB = 32000
SIZES = ("bench", "tiny", "small")
# "small" = "tiny" with these entries: shapes the GPU kernels take (head dim 64), still seconds.
_SMALL_LM = dict(vocab_size=512, hidden_size=256, intermediate_size=512, head_dim=64, max_position_embeddings=1024)
_SMALL_IMAGE = dict(img_size=64, patch_size=8, embed_dim=256, num_heads=4)
_SMALL_BATCH, _SMALL_SEQ = 2, 256


@dataclass(frozen=True)
class ModelSpec:
    """One model of the suite. `kind` is "causal_lm" (a transformers causal LM: loss from
    labels, logits, generate) or "image" (a timm classifier: cross-entropy on random labels).
    `lengths` right-pads the batch (each row's real length) when given."""

    name: str
    library: str
    kind: str
    description: str
    config: dict = field(default_factory=dict)
    tiny: dict = field(default_factory=dict)
    batch: int = 4
    seq: int = 2048
    lengths: tuple[int, ...] | None = None
    tiny_batch: int = 3
    tiny_seq: int = 12

    @property
    def generates(self) -> bool:
        return self.kind == "causal_lm"


_LLAMA = dict(vocab_size=VOCAB, hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=16,
              num_key_value_heads=4, head_dim=128, max_position_embeddings=8192, tie_word_embeddings=False)
_TINY_LM = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=False)

SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec("llama_gqa", "transformers", "causal_lm", "Llama-3 style, GQA 16/4, hidden 2048, 4 layers",
              dict(model_type="llama", rope_theta=500000.0, **_LLAMA), dict(model_type="llama", **_TINY_LM)),
    ModelSpec("llama_gqa_padded", "transformers", "causal_lm", "the same Llama, a right-padded batch",
              dict(model_type="llama", rope_theta=500000.0, **_LLAMA), dict(model_type="llama", **_TINY_LM),
              lengths=(2048, 1536, 1024, 1792)),
    ModelSpec("mistral_swa", "transformers", "causal_lm", "Mistral, sliding_window=512",
              dict(model_type="mistral", sliding_window=512, **_LLAMA),
              dict(model_type="mistral", sliding_window=4, **_TINY_LM)),
    ModelSpec("qwen2", "transformers", "causal_lm", "Qwen2 (q/k/v bias), the Llama shape",
              dict(model_type="qwen2", **_LLAMA), dict(model_type="qwen2", **_TINY_LM)),
    ModelSpec("gpt_oss", "transformers", "causal_lm", "gpt-oss: sinks, sliding(128)/full layers, 8 experts top-2",
              dict(model_type="gpt_oss", vocab_size=VOCAB, hidden_size=2048, intermediate_size=2048,
                   num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                   num_local_experts=8, num_experts_per_tok=2, sliding_window=128,
                   layer_types=["sliding_attention", "full_attention"] * 2),
              dict(model_type="gpt_oss", vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                   num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    ModelSpec("vit_b16", "timm", "image", "timm vit_base_patch16_224",
              dict(model_name="vit_base_patch16_224"),
              dict(model_name="vit_base_patch16_224", img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4,
                   num_classes=10), batch=64, tiny_batch=2),
    ModelSpec("eva02_b14", "timm", "image", "timm eva02_base_patch14_224 (rotary embeddings, SwiGLU)",
              dict(model_name="eva02_base_patch14_224", num_classes=1000),  # timm's default has no head
              dict(model_name="eva02_base_patch14_224", img_size=28, patch_size=7, embed_dim=48, depth=2, num_heads=4,
                   num_classes=10), batch=64, tiny_batch=2),
)}


def spec(name: str) -> ModelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; the suite's models: {', '.join(SPECS)}") from None


def build(s: ModelSpec, *, size: str = "bench", dtype=None, device: str = "cuda", seed: int = 0,
          overrides: dict | None = None):
    """The stock model of `s` with seeded random weights, in `dtype` (default bf16) on
    `device`, in training mode; `overrides` change config entries."""
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    options = dict(_options(s, size), **(overrides or {}))
    torch.manual_seed(seed)
    if s.library == "transformers":
        from transformers import AutoConfig, AutoModelForCausalLM

        model_type = options.pop("model_type")
        config = AutoConfig.for_model(model_type, **options)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        import timm

        name = options.pop("model_name")
        with torch.device(device):
            model = timm.create_model(name, pretrained=False, **options)
        model = model.to(dtype)
    return model.train()


def _options(s: ModelSpec, size: str) -> dict:
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    if size == "bench":
        return dict(s.config)
    if size == "tiny":
        return dict(s.tiny)
    small = dict(s.tiny, **(_SMALL_LM if s.kind == "causal_lm" else _SMALL_IMAGE))
    if "sliding_window" in small:
        small["sliding_window"] = 64
    if s.name == "gpt_oss":
        del small["max_position_embeddings"]  # its YaRN rope is set for the default
    if s.name == "eva02_b14":
        small["patch_size"] = 7  # 9 x 9 patches of a 63-pixel image
        small["img_size"] = 63
    return small


def _shape(s: ModelSpec, size: str) -> tuple[int, int]:
    """(batch, sequence length) at `size` (the sequence length is unused for images)."""
    if size == "bench":
        return s.batch, s.seq
    if size == "tiny":
        return s.tiny_batch, s.tiny_seq
    return _SMALL_BATCH, _SMALL_SEQ


def copy_model(model):
    """An independent copy (parameters and buffers), for the patched side."""
    return copy.deepcopy(model)


def make_batch(s: ModelSpec, *, size: str = "bench", device: str = "cuda", seed: int = 0, dtype=None) -> dict:
    """The model's inputs: for a causal LM `input_ids`, `labels` (-100 on padding) and, for a
    padded spec, `attention_mask`; for an image model `x` (N(0, 1) images, in `dtype`) and
    integer `target` classes."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    batch, seq = _shape(s, size)
    options = _options(s, size)
    if s.kind == "causal_lm":
        ids = torch.randint(0, options["vocab_size"], (batch, seq), generator=gen)
        out = {"input_ids": ids.to(device), "labels": ids.clone().to(device)}
        if s.lengths is not None:
            step = max(3, seq // 4)
            lengths = s.lengths if size == "bench" else tuple(seq - step * (i % 3) for i in range(batch))
            mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()
            out["attention_mask"] = mask.to(device)
            out["labels"] = ids.masked_fill(mask == 0, -100).to(device)
        return out
    img = options.get("img_size", 224)
    classes = options.get("num_classes", 1000)
    x = torch.randn(batch, 3, img, img, generator=gen).to(device=device, dtype=dtype or torch.bfloat16)
    return {"x": x, "target": torch.randint(0, classes, (batch,), generator=gen).to(device)}
