"""Named benchmark suites: a case list, a family of implementations, and a default selection.

| suite | cases | default implementations |
| --- | --- | --- |
| `gemm` | the 7 bf16 shapes of the device README, C = A·Bᵀ | our rungs except the slow ones, every GEMM peer |
| `attention` | the 8 bf16 forward cases (B, H, S, D) × causal | ours, sdpa_flash, sdpa_cudnn, fa4 |
| `attention_varlen` | ragged batches packed without padding (varlen: 1/17/1000/4096; eight chat-length prompts with GQA 32/8; long GQA documents; 32 ViT-length sequences), causal forward | ours with a varlen launch, fa4 (flash_attn_varlen_func) |
| `attention_varlen_bwd` | the `attention_varlen` batches, backward (dq, dk, dv through autograd), with `peak_mib` | ours with a varlen backward (`sdpa_varlen`), fa4 (flash_attn_varlen_func) |
| `attention_bwd` | the same 8 cases, backward (dq, dk, dv through autograd), then D 96 and 192, GQA 32/8 heads and S 1000 (causal), with `peak_mib` (forward + backward) per record | ours with a backward, sdpa_flash, sdpa_cudnn, fa4 (SDPA on grouped cases: k, v expanded at prepare, as repeat_kv) |
| `copy` | 16 MiB to 1 GiB bf16 | cute_kernels (our vectorized copy), torch_copy |
| `skinny` | M ∈ {16, 64, 128}, N = K = 8192, bf16 | as `gemm` |
| `gemm_shapes` | the linear layers of ViT-B/L, EVA-02-B, Llama-3 1B/8B/70B, Mistral-7B, Qwen2.5-7B (`model_shapes`): prefill, decode, dX and dW, the forwards of layers with a bias as `_bias` cases (ours: `nn.functional.linear`, cuBLAS: `addmm`), plus the cliff classes | auto (`matmul`), cublas, quack |
| `fp8` | e4m3 4096³ and 8192³ (bf16 out), per-tensor and row-wise scales (`_rowwise`) | as `gemm` (cublas_fp8 is the peer) |
| `ladder` | fp32, fp16 and bf16 at 4096³ and 8192³ | every rung, cublas (fp32 without TF32) and triton_ampere (Triton held to mma.sync) |
| `decode` | bf16 paged decode B=64, Hkv=8, D=128, ctx 8192; Hq 8/32/64 × page 16/256 | decode, fa4_paged, sdpa_gathered |
| `fused` | bf16 norms, softmax, cross-entropy, RoPE, SwiGLU, linear + CE (`FUSED_CASES`) | cute_kernels (+ cute_kernels_gemm), eager, torch_compile, quack, liger |

`--impl` takes a comma list of names and these keywords: `default`, `all`, `ours`, `peers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cute_kernels.bench.cases import (AttentionBwdCase, AttentionCase, Case, CopyCase, DecodeCase, GemmCase, VarlenBwdCase,
                                      VarlenCase)
from cute_kernels.bench.fused_cases import FusedCase
from cute_kernels.bench.impls import FAMILY_IMPLS, Impl
from cute_kernels.bench.model_shapes import gemm_shape_cases

# Rungs too slow for the big default shapes (seconds per call at 8192×28672×8192); the ladder
# suite and an explicit --impl still run them.
SLOW_RUNGS = frozenset({"naive", "simt_smem"})

GEMM_SHAPES = ((2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 28672, 8192),
               (8192, 8192, 28672), (4096, 14336, 4096), (16384, 4096, 4096))
ATTENTION_SHAPES = ((4, 32, 2048, 128), (2, 16, 8192, 128), (8, 16, 2048, 64), (2, 16, 4096, 256))
# The backward suite's cases beyond those: head dims 96 and 192, grouped heads (32 query heads over
# 8 key/value heads), an odd length (B, H, S, D, causal, key/value heads).
ATTENTION_BWD_EXTRA = ((2, 16, 2048, 96, True, 0), (2, 16, 4096, 192, True, 0), (4, 32, 4096, 128, True, 8),
                       (2, 16, 1000, 128, True, 0))
# Ragged batches (sequence lengths, Hq, Hkv, D): issue 15's mix of a token, a short prompt and long
# documents, a batch of chat-length prompts, and a GQA mix of long ones.
VARLEN_CASES = (((1, 17, 1000, 4096), 16, 16, 128), ((512, 384, 1024, 200, 768, 640, 1536, 96), 32, 8, 128),
                ((8192, 3000, 5000, 100), 32, 8, 128), ((197,) * 32, 12, 12, 64))
COPY_MIB = (16, 64, 256, 1024)
# Paged decode (B, Hq, Hkv, D, ctx, page): 1 GiB each of K and V cache in bf16 per case.
DECODE_SHAPES = tuple((64, hq, 8, 128, 8192, page) for hq in (8, 32, 64) for page in (16, 256))
# The fused suite: the 16384x4096 norms / softmax and 8192 x 128256 cross-entropy, a
# vocabulary softmax past the registers, Llama-8B-sized RoPE and SwiGLU, the linear + CE, and
# Llama-8B's gate/up projection with SwiGLU (one gated GEMM against a GEMM then the activation).
FUSED_CASES = (
    FusedCase("rmsnorm_fwd", 16384, 4096), FusedCase("rmsnorm_residual_fwd", 16384, 4096),
    FusedCase("rmsnorm_bwd", 16384, 4096), FusedCase("layernorm_fwd", 16384, 4096),
    FusedCase("softmax_fwd", 16384, 4096), FusedCase("softmax_bwd", 16384, 4096),
    FusedCase("softmax_fwd", 2048, 128256), FusedCase("cross_entropy_fwd", 8192, 128256),
    FusedCase("cross_entropy_fwd_bwd", 8192, 128256), FusedCase.rope(8, 4096, 32, 8, 128),
    FusedCase("swiglu_fwd", 16384, 14336), FusedCase("swiglu_bwd", 8192, 14336),
    FusedCase.linear_cross_entropy(8192, 4096, 128256),
    FusedCase.linear_swiglu(8192, 4096, 14336), FusedCase.linear_swiglu(8192, 4096, 14336, backward=True),
)


@dataclass(frozen=True)
class Suite:
    name: str
    family: str  # "gemm" | "attention" | "attention_bwd" | "copy" | "decode" | "fused"
    cases: tuple[Case, ...]
    description: str
    default: Callable[[Impl], bool]  # which discovered impls run without --impl

    def impls(self) -> dict[str, Impl]:
        """Every implementation of this suite's family, ours first (discovered now)."""
        return FAMILY_IMPLS[self.family]()

    def parse_cases(self, spec: str) -> tuple[Case, ...]:
        """Cases from a comma list of case names, each optionally suffixed `:dtype`
        (e.g. `1024x1024x1024:fp32`); without a suffix, the suite's first case's dtype."""
        kind = {"gemm": GemmCase, "attention": AttentionCase, "attention_bwd": AttentionBwdCase, "copy": CopyCase,
                "decode": DecodeCase, "fused": FusedCase, "attention_varlen": VarlenCase,
                "attention_varlen_bwd": VarlenBwdCase}[self.family]
        default_dtype = self.cases[0].dtype if self.cases else "bf16"
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise ValueError("--cases needs at least one case name")
        cases = []
        for text in names:
            name, _, dtype = text.partition(":")
            cases.append(kind.parse(name, dtype or default_dtype))
        return tuple(cases)


def select_impls(available: dict[str, Impl], spec: str | None, default: Callable[[Impl], bool], *,
                 strict: bool = True) -> dict[str, Impl]:
    """The impls named by `spec` (comma list; keywords default, all, ours, peers), in the
    order of `available`. Raises ValueError naming an unknown impl and listing the known ones
    (with `strict` False, unknown names are ignored: for `--impl` over several suites).
    """
    words = [w.strip() for w in (spec or "default").split(",") if w.strip()]
    if not words:
        raise ValueError("--impl needs at least one name")
    chosen: set[str] = set()
    for w in words:
        if w == "default":
            chosen |= {n for n, i in available.items() if default(i)}
        elif w == "all":
            chosen |= set(available)
        elif w in ("ours", "peers"):
            kind = "ours" if w == "ours" else "peer"
            chosen |= {n for n, i in available.items() if i.kind == kind}
        elif w in available:
            chosen.add(w)
        elif strict:
            raise ValueError(f"unknown impl {w!r}; known here: {', '.join(available) or '(none)'} "
                             "(and the keywords default, all, ours, peers)")
    return {n: i for n, i in available.items() if n in chosen}


# Peers that only the ladder suite compares against (the Ampere-style Triton GEMM autotunes at
# prepare: minutes over the big default shapes, for a comparison only sm80_mma needs).
LADDER_ONLY_PEERS = frozenset({"triton_ampere"})


def _fast(impl: Impl) -> bool:
    if impl.kind == "peer":
        return impl.name not in LADDER_ONLY_PEERS
    return impl.name not in SLOW_RUNGS and impl.name != "auto"


def _public_entry(impl: Impl) -> bool:
    """What a user's call runs (`matmul`, kernel "auto") against cuBLAS and quack."""
    return impl.name in ("auto", "cublas", "cublas_fp8", "quack")


def _ladder_default(impl: Impl) -> bool:
    return impl.kind == "ours" or impl.name in ("cublas", "triton_ampere")


def _everything(impl: Impl) -> bool:
    return True


SUITES: dict[str, Suite] = {
    "gemm": Suite("gemm", "gemm", tuple(GemmCase(m, n, k, "bf16") for m, n, k in GEMM_SHAPES),
                  "bf16 C = A·Bᵀ at the device README's 7 shapes", _fast),
    "attention": Suite("attention", "attention",
                       tuple(AttentionCase(b, h, s, d, causal, "bf16") for b, h, s, d in ATTENTION_SHAPES
                             for causal in (False, True)),
                       "bf16 attention forward, 4 shapes × causal", _everything),
    "attention_bwd": Suite("attention_bwd", "attention_bwd",
                           tuple(AttentionBwdCase(b, h, s, d, causal, "bf16") for b, h, s, d in ATTENTION_SHAPES
                                 for causal in (False, True))
                           + tuple(AttentionBwdCase(b, h, s, d, causal, "bf16", hkv)
                                   for b, h, s, d, causal, hkv in ATTENTION_BWD_EXTRA),
                           "bf16 attention backward (dq, dk, dv), 4 shapes × causal, then D 96 and 192, GQA 32/8 "
                           "and S 1000; peak memory of forward + backward per record", _everything),
    "attention_varlen": Suite("attention_varlen", "attention_varlen",
                              tuple(VarlenCase(lengths, hq, hkv, d, True, "bf16") for lengths, hq, hkv, d in VARLEN_CASES),
                              "bf16 varlen (packed ragged batch) attention forward, causal, vs FlashAttention-4's "
                              "varlen", _everything),
    "attention_varlen_bwd": Suite("attention_varlen_bwd", "attention_varlen_bwd",
                                  tuple(VarlenBwdCase(lengths, hq, hkv, d, True, "bf16")
                                        for lengths, hq, hkv, d in VARLEN_CASES),
                                  "bf16 varlen (packed ragged batch) attention backward, causal, vs FlashAttention-4's "
                                  "varlen backward; peak memory of forward + backward per record", _everything),
    "copy": Suite("copy", "copy", tuple(CopyCase((mib << 20) // 2, "bf16") for mib in COPY_MIB),
                  "device-to-device copy (memory side of the roofline), GB/s", _everything),
    "skinny": Suite("skinny", "gemm", tuple(GemmCase(m, 8192, 8192, "bf16") for m in (16, 64, 128)),
                    "bf16 GEMM with small M (memory-bound: B is read once)", _fast),
    "fp8": Suite("fp8", "gemm", tuple(GemmCase(s, s, s, "fp8_e4m3", layout=lay) for lay in ("", "rowwise")
                                      for s in (4096, 8192)),
                 "fp8 e4m3 GEMM, bf16 out, per-tensor and row-wise scales, vs torch._scaled_mm", _fast),
    "ladder": Suite("ladder", "gemm",
                    tuple(GemmCase(s, s, s, dt) for dt in ("fp32", "fp16", "bf16") for s in (4096, 8192)),
                    "every GEMM rung vs cuBLAS (fp32 without TF32) at 4096³ and 8192³; fp16 for sm70_mma",
                    _ladder_default),
    "gemm_shapes": Suite("gemm_shapes", "gemm", gemm_shape_cases("bf16"),
                         "bf16 GEMMs of real models (ViT-B/L, Llama-3 1B/8B/70B, Mistral-7B, Qwen2.5-7B): prefill, "
                         "decode, and the two backward GEMMs of training, plus the cliff classes; through matmul",
                         _public_entry),
    "decode": Suite("decode", "decode", tuple(DecodeCase(*shape, "bf16") for shape in DECODE_SHAPES),
                    "bf16 paged decode (one query token, vLLM cache layout), GB/s and % of HBM", _everything),
    "fused": Suite("fused", "fused", FUSED_CASES,
                   "bf16 fused memory-bound ops vs eager, torch.compile, quack, Liger: GB/s and % of the copy "
                   "bandwidth (linear + CE: TFLOP/s and peak memory)", _everything),
}
