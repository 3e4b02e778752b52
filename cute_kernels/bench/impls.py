"""Implementations the harness can time: ours (discovered from the kernel registries) and peers.

An `Impl` is a name, a kind ('ours' or 'peer'), an `available()` check (None, or why it cannot
run here, e.g. a peer that is not importable) and `prepare(case, inputs) -> Prepared`, which
builds a zero-argument callable over the case's shared input tensors. `prepare` raises
`Unsupported(reason)` when the implementation does not take this case (dtype, head dim, ...).

Ours are discovered at call time, so a rung added to `cute_kernels.gemm.KERNELS` (or
`cute_kernels.attention.KERNELS`) is benchmarkable by name without touching the harness:
- GEMM rungs are called as `KERNELS[name](a, b, out, alpha=1.0, beta=0.0, c=None)` on 3-D views
  (L=1) with a preallocated `out`, after `rung.supports(a, b, out)` returns None;
- attention kernels through `scaled_dot_product_attention(q, k, v, is_causal=..., kernel=name)`;
- the copy through `cute_kernels.elementwise.copy(src, dst)` (impl name `cute_kernels`);
- paged decode through `cute_kernels.attention.paged_decode(..., kernel="decode",
  check_indices=False, out=out)` (impl name `decode`).

Peers: `cublas` (torch.matmul), `cublas_fp8` (torch._scaled_mm), `quack` (quack-kernels'
untuned default GEMM), `triton_ampere` (a Triton GEMM held to mma.sync: the Ampere-style peer
of `sm80_mma`, see `cute_kernels.bench.triton_ampere`), `sdpa_flash` and `sdpa_cudnn` (PyTorch SDPA pinned to one backend with
torch.nn.attention.sdpa_kernel), `fa4` (FlashAttention-4's flash_attn.cute.flash_attn_func, which
takes (B, S, H, D): it gets transposed views of the same tensors), `torch_copy` (dst.copy_(src)),
and for paged decode `fa4_paged` (flash_attn_varlen_func with page_table) and `sdpa_gathered`
(SDPA over K/V gathered beforehand: it does not pay for the gather).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from cute_kernels.bench.cases import Case, torch_dtype

PEER_NAMES = ("cublas", "cublas_fp8", "quack", "triton_ampere", "sdpa_flash", "sdpa_cudnn", "fa4", "torch_copy", "fa4_paged",
              "sdpa_gathered")


class Unsupported(Exception):
    """The implementation does not take this case; the message says why (the case is skipped)."""


@dataclass(frozen=True)
class Prepared:
    """A ready call. `fn()` runs the implementation once on torch's current stream.

    When `out` is given, fn writes it (the harness fills it with NaN before the correctness
    call, so a kernel that skips elements is caught); otherwise fn returns the output.
    `canonical` maps the output to the case's reference layout (e.g. FA4's (B, S, H, D) back
    to (B, H, S, D)).
    """

    fn: Callable[[], Any]
    out: Any = None
    canonical: Callable[[Any], Any] | None = None
    extra: dict | None = None  # measured at prepare (e.g. peak memory): copied into the record

    def result(self, returned: Any) -> Any:
        value = self.out if self.out is not None else returned
        return self.canonical(value) if self.canonical is not None else value


@dataclass(frozen=True)
class Impl:
    name: str
    kind: str  # "ours" | "peer"
    prepare: Callable[[Case, dict[str, Any]], Prepared]
    available: Callable[[], str | None] = lambda: None

    def __post_init__(self):
        if self.kind not in ("ours", "peer"):
            raise ValueError(f"impl {self.name!r}: kind must be 'ours' or 'peer', got {self.kind!r}")


def _needs_module(module: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        return None if found else f"{module} is not importable"

    return check


# ---------------------------------------------------------------------------------------- GEMM


def our_gemm_rungs() -> tuple[list[str], str | None]:
    """Names in cute_kernels.gemm.KERNELS (ladder order), or ([], why) when it cannot load."""
    try:
        gemm = importlib.import_module("cute_kernels.gemm")
        return list(gemm.KERNELS), None
    except Exception as err:  # the DSL may be absent, or the package unfinished
        return [], f"cute_kernels.gemm.KERNELS unavailable: {type(err).__name__}: {err}"


def _prepare_gemm_rung(name: str, case, inputs) -> Prepared:
    from cute_kernels.gemm import KERNELS

    rung = KERNELS[name]
    if case.dtype.startswith("fp8"):
        return _prepare_fp8_rung(name, case, inputs)
    out = case.empty_out(inputs)
    a3, b3, out3 = inputs["a"].unsqueeze(0), inputs["b"].T.unsqueeze(0), out.unsqueeze(0)
    reason = rung.supports(a3, b3, out3)
    if reason:
        raise Unsupported(reason)
    bias = inputs.get("bias")
    if bias is not None:
        from cute_kernels.gemm.epilogue_api import FUSING_KERNELS

        if name not in FUSING_KERNELS:
            raise Unsupported(f"{name} fuses no bias (fusing rungs: {', '.join(FUSING_KERNELS)})")
        return Prepared(lambda: rung(a3, b3, out3, alpha=1.0, beta=0.0, c=None, bias=bias), out=out)
    return Prepared(lambda: rung(a3, b3, out3, alpha=1.0, beta=0.0, c=None), out=out)


def _prepare_auto(case, inputs) -> Prepared:
    """The public entry a user calls: `matmul(a, b)` with kernel="auto" (dispatch, routing,
    launch plans and the result's allocation included), `nn.functional.linear(a, b, bias)` for a
    bias case (what a patched nn.Linear runs), or `scaled_mm` for fp8."""
    import torch

    from cute_kernels.gemm import matmul
    from cute_kernels.gemm.epilogue_api import scaled_mm

    a, bt = inputs["a"], inputs["b"].T
    out_dtype = torch_dtype(case.result_dtype)
    if "bias" in inputs:
        from cute_kernels.nn.functional import linear

        w, bias = inputs["b"], inputs["bias"]
        return Prepared(lambda: linear(a, w, bias))
    if case.dtype.startswith("fp8"):
        sa, sb = inputs["scale_a"], inputs["scale_b"]
        return Prepared(lambda: scaled_mm(a, bt, sa, sb, out_dtype=out_dtype))
    return Prepared(lambda: matmul(a, bt, out_dtype=out_dtype))


def _prepare_fp8_rung(name: str, case, inputs) -> Prepared:
    """fp8 with per-tensor scales goes through the rung's scaled_mm entry, as torch._scaled_mm."""
    import torch

    from cute_kernels.gemm import epilogue_api

    if name not in epilogue_api.FUSING_KERNELS:
        raise Unsupported(f"{name} has no fp8 path (fp8 rungs: {', '.join(epilogue_api.FUSING_KERNELS)})")
    a, bt = inputs["a"], inputs["b"].T
    sa, sb = inputs["scale_a"], inputs["scale_b"]
    out_dtype = torch_dtype(case.result_dtype)
    return Prepared(lambda: epilogue_api.scaled_mm(a, bt, sa, sb, out_dtype=out_dtype, kernel=name))


def _prepare_cublas(case, inputs) -> Prepared:
    import torch

    if case.dtype.startswith("fp8"):
        raise Unsupported("fp8 inputs run through cublas_fp8 (torch._scaled_mm)")
    a, bt = inputs["a"], inputs["b"].T
    out = case.empty_out(inputs)
    if "bias" in inputs:  # addmm: what F.linear runs (cuBLASLt's bias epilogue)
        bias = inputs["bias"]
        return Prepared(lambda: torch.addmm(bias, a, bt, out=out), out=out)
    # fp32 runs without TF32: the runner holds float32 matmul precision at 'highest'.
    return Prepared(lambda: torch.matmul(a, bt, out=out), out=out)


def _prepare_cublas_fp8(case, inputs) -> Prepared:
    import torch

    if not case.dtype.startswith("fp8"):
        raise Unsupported("cublas_fp8 takes fp8 inputs only")
    a, bt = inputs["a"], inputs["b"].T  # _scaled_mm wants A row-major and B column-major
    sa, sb = inputs["scale_a"], inputs["scale_b"]
    out_dtype = torch_dtype(case.result_dtype)
    return Prepared(lambda: torch._scaled_mm(a, bt, scale_a=sa, scale_b=sb, out_dtype=out_dtype))


def _prepare_quack(case, inputs) -> Prepared:
    if case.dtype == "fp32":
        raise Unsupported("quack's GEMM takes 16-bit or fp8 inputs")
    if "bias" in inputs:
        raise Unsupported("bias cases: quack's gemm takes no bias here")
    if "scale_a" in inputs:  # called without them its product is unscaled: a wrong answer, not a time
        raise Unsupported("scaled fp8 cases: quack's gemm takes no scales here")
    from quack.gemm_interface import gemm as quack_gemm

    a, b_kn = inputs["a"], inputs["b"].mT  # quack takes B as (K, N); this view is K-major
    out = case.empty_out(inputs)
    return Prepared(lambda: quack_gemm(a, b_kn, out=out, tuned=False), out=out)


def _prepare_triton_ampere(case, inputs) -> Prepared:
    if case.dtype not in ("fp16", "bf16"):
        raise Unsupported("the Ampere-style Triton peer takes fp16 and bf16")
    if "bias" in inputs:
        raise Unsupported("bias cases: the Ampere-style Triton peer has no epilogue")
    from cute_kernels.bench import triton_ampere

    a, b_kn = inputs["a"], inputs["b"].T
    out = case.empty_out(inputs)
    try:
        config, _ = triton_ampere.fastest_config(a, b_kn, out)
    except RuntimeError as err:
        raise Unsupported(str(err)) from None
    return Prepared(lambda: triton_ampere.launch(a, b_kn, out, config), out=out)


def gemm_impls() -> dict[str, Impl]:
    """Ours (every rung in cute_kernels.gemm.KERNELS) then the GEMM peers."""
    impls = {name: Impl(name, "ours", partial(_prepare_gemm_rung, name)) for name in our_gemm_rungs()[0]}
    impls["auto"] = Impl("auto", "ours", _prepare_auto, lambda: our_gemm_rungs()[1])
    impls["cublas"] = Impl("cublas", "peer", _prepare_cublas)
    impls["cublas_fp8"] = Impl("cublas_fp8", "peer", _prepare_cublas_fp8)
    impls["quack"] = Impl("quack", "peer", _prepare_quack, _needs_module("quack"))
    impls["triton_ampere"] = Impl("triton_ampere", "peer", _prepare_triton_ampere, _needs_module("triton"))
    return impls


# ----------------------------------------------------------------------------------- attention


def our_attention_kernels() -> tuple[list[str], str | None]:
    """Names in cute_kernels.attention.KERNELS, or ([], why) when it does not exist yet."""
    try:
        attention = importlib.import_module("cute_kernels.attention")
        kernels = getattr(attention, "KERNELS", None)
        if kernels is None or not hasattr(attention, "scaled_dot_product_attention"):
            return [], "cute_kernels.attention has no KERNELS / scaled_dot_product_attention yet"
        return list(kernels), None
    except Exception as err:
        return [], f"cute_kernels.attention unavailable: {type(err).__name__}: {err}"


def _prepare_attention_kernel(name: str, case, inputs) -> Prepared:
    from cute_kernels.attention import scaled_dot_product_attention

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    causal, gqa = case.causal, case.gqa
    return Prepared(lambda: scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa, kernel=name))


def _expanded(case, t):
    """k or v with each key/value head repeated over its group of query heads (what
    transformers' repeat_kv does), made at prepare: the SDPA peers run grouped cases as MHA."""
    return t.repeat_interleave(case.h // case.kv_heads, dim=1) if case.gqa else t


def _prepare_sdpa(backend_name: str, case, inputs) -> Prepared:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    q, k, v = inputs["q"], _expanded(case, inputs["k"]), _expanded(case, inputs["v"])
    causal = case.causal

    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return Prepared(fn)


def _prepare_fa4(case, inputs) -> Prepared:
    from flash_attn.cute import flash_attn_func

    # FA4 takes (B, S, H, D) with unit stride on D: transposed views of the same storage.
    q, k, v = (inputs[n].transpose(1, 2) for n in ("q", "k", "v"))
    causal = case.causal

    def fn():
        r = flash_attn_func(q, k, v, causal=causal)
        return r[0] if isinstance(r, tuple) else r

    return Prepared(fn, canonical=lambda o: o.transpose(1, 2))


def attention_impls() -> dict[str, Impl]:
    """Ours (cute_kernels.attention.KERNELS when it exists) then the attention peers."""
    impls = {name: Impl(name, "ours", partial(_prepare_attention_kernel, name)) for name in our_attention_kernels()[0]}
    impls["sdpa_flash"] = Impl("sdpa_flash", "peer", partial(_prepare_sdpa, "FLASH_ATTENTION"))
    impls["sdpa_cudnn"] = Impl("sdpa_cudnn", "peer", partial(_prepare_sdpa, "CUDNN_ATTENTION"))
    impls["fa4"] = Impl("fa4", "peer", _prepare_fa4, _needs_module("flash_attn.cute"))
    return impls


# -------------------------------------------------------------------------- attention backward
# Every implementation is timed the same way: its forward runs once at prepare (with autograd
# recording), and the timed call is torch.autograd.grad of that output for `dout`
# (retain_graph), i.e. exactly the backward kernels plus the autograd engine's dispatch.


def _grads_of(out, leaves, dout):
    import torch

    def fn():
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)

    return fn


def _flat_grads(grads):
    import torch

    return torch.cat([g.float().flatten() for g in grads])


def _grouped_grads(case):
    """Flattened (dq, dk, dv) from the gradients of expanded k and v: each group's sum."""
    def canonical(grads):
        dq, dk, dv = grads
        b, h, s, d = dk.shape

        def fold(g):
            return g.float().reshape(b, case.kv_heads, h // case.kv_heads, s, d).sum(2) if case.gqa else g

        return _flat_grads((dq, fold(dk), fold(dv)))
    return canonical


def peak_mib(fn) -> float:
    """Peak memory of one call of fn above what is allocated before it, MiB (CUDA only)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return peak / 2**20


def _bwd_prepared(forward, leaves, dout, canonical) -> Prepared:
    """The timed backward of `forward(*leaves)` (run once here with autograd recording), with the
    peak memory of one whole forward + backward (activations and gradients, above the inputs) as
    `peak_mib`."""
    import torch

    fresh = tuple(t.detach().clone().requires_grad_() for t in leaves)  # made before the peak is taken

    def whole():
        with torch.enable_grad():
            return torch.autograd.grad(forward(*fresh), fresh, dout)

    peak = peak_mib(whole) if dout.is_cuda else None
    del fresh
    with torch.enable_grad():
        out = forward(*leaves)
    return Prepared(_grads_of(out, leaves, dout), canonical=canonical,
                    extra=None if peak is None else {"peak_mib": round(peak, 1)})


def _leaves(inputs):
    return tuple(inputs[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))


def _prepare_attention_bwd_kernel(name: str, case, inputs, deterministic: bool = False) -> Prepared:
    import torch

    from cute_kernels.attention import scaled_dot_product_attention

    def forward(q, k, v):
        return scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=case.gqa, kernel=name)

    prepared = _bwd_prepared(forward, _leaves(inputs), inputs["dout"], _flat_grads)
    if not deterministic:
        return prepared
    backward = prepared.fn

    def fn():  # the backward reads the switch when it runs
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            return backward()
        finally:
            torch.use_deterministic_algorithms(was)

    return Prepared(fn, canonical=prepared.canonical, extra=prepared.extra)


def _prepare_sdpa_bwd(backend_name: str, case, inputs) -> Prepared:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def forward(q, k, v):
        # The backward kernel follows the forward's backend, chosen here.
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

    q, k, v = _leaves(inputs)
    leaves = (q, _expanded(case, k).detach().requires_grad_(), _expanded(case, v).detach().requires_grad_())
    return _bwd_prepared(forward, leaves, inputs["dout"], _grouped_grads(case))


def _prepare_fa4_bwd(case, inputs) -> Prepared:
    from flash_attn.cute import flash_attn_func

    def forward(q, k, v):
        r = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=case.causal)
        return (r[0] if isinstance(r, tuple) else r).transpose(1, 2)

    return _bwd_prepared(forward, _leaves(inputs), inputs["dout"], _flat_grads)


def _our_attention_with(launch: str, prepare) -> dict[str, Impl]:
    """Our attention kernels whose rung has `launch` (e.g. "backward", "varlen"), each prepared by
    `prepare(name, case, inputs)`."""
    names, _ = our_attention_kernels()
    if not names:
        return {}
    from cute_kernels.attention import KERNELS

    return {name: Impl(name, "ours", partial(prepare, name)) for name in names if hasattr(KERNELS[name], launch)}


def attention_bwd_impls() -> dict[str, Impl]:
    """Ours (attention KERNELS with a backward) then the backward peers."""
    impls = _our_attention_with("backward", _prepare_attention_bwd_kernel)
    if "sm90_flash" in impls:  # its deterministic dQ (ordered adds) costs time: timed beside
        impls["sm90_flash_deterministic"] = Impl("sm90_flash_deterministic", "ours",
                                                 partial(_prepare_attention_bwd_kernel, "sm90_flash",
                                                         deterministic=True))
    impls["sdpa_flash"] = Impl("sdpa_flash", "peer", partial(_prepare_sdpa_bwd, "FLASH_ATTENTION"))
    impls["sdpa_cudnn"] = Impl("sdpa_cudnn", "peer", partial(_prepare_sdpa_bwd, "CUDNN_ATTENTION"))
    impls["fa4"] = Impl("fa4", "peer", _prepare_fa4_bwd, _needs_module("flash_attn.cute"))
    return impls


# ---------------------------------------------------------------------------------------- copy


def _our_copy_available() -> str | None:
    try:
        elementwise = importlib.import_module("cute_kernels.elementwise")
    except Exception as err:
        return f"cute_kernels.elementwise unavailable: {type(err).__name__}: {err}"
    return None if hasattr(elementwise, "copy") else "cute_kernels.elementwise has no copy yet"


def _prepare_our_copy(case, inputs) -> Prepared:
    from cute_kernels.elementwise import copy

    src = inputs["src"]
    out = case.empty_out(inputs)
    return Prepared(lambda: copy(src, out), out=out)


def _prepare_torch_copy(case, inputs) -> Prepared:
    src = inputs["src"]
    out = case.empty_out(inputs)
    return Prepared(lambda: out.copy_(src), out=out)


def copy_impls() -> dict[str, Impl]:
    return {
        "cute_kernels": Impl("cute_kernels", "ours", _prepare_our_copy, _our_copy_available),
        "torch_copy": Impl("torch_copy", "peer", _prepare_torch_copy),
    }


# -------------------------------------------------------------------------------- paged decode


def _our_decode_available() -> str | None:
    try:
        attention = importlib.import_module("cute_kernels.attention")
    except Exception as err:
        return f"cute_kernels.attention unavailable: {type(err).__name__}: {err}"
    if "paged_decode" not in getattr(attention, "__all__", ()):
        return "cute_kernels.attention has no paged_decode yet"
    return None


def _decode_args(inputs) -> tuple:
    return tuple(inputs[n] for n in ("q", "k_cache", "v_cache", "block_table", "seqlens_k"))


def _prepare_our_decode(case, inputs) -> Prepared:
    """The `decode` rung with the index check off (the harness built a valid table), as a
    serving loop that validated its tables once would call it."""
    from cute_kernels.attention import paged_decode

    args = _decode_args(inputs)
    out = case.empty_out(inputs)
    return Prepared(lambda: paged_decode(*args, kernel="decode", check_indices=False, out=out), out=out)


def _prepare_fa4_paged(case, inputs) -> Prepared:
    """FlashAttention-4's paged KV path: flash_attn_varlen_func with q (B, 1, Hq, D), the caches
    as they are, page_table = block_table and seqused_k = seqlens_k. On sm90 FA4 has no split-KV
    (it asserts num_splits == 1) and loads pages whose size is not its key tile with cp.async
    (one page-table lookup per row) instead of TMA; it runs as FA4's interface picks."""
    from flash_attn.cute import flash_attn_varlen_func

    q, k_cache, v_cache, block_table, seqlens_k = _decode_args(inputs)
    q4 = q.unsqueeze(1)

    def fn():
        r = flash_attn_varlen_func(q4, k_cache, v_cache, seqused_k=seqlens_k, page_table=block_table)
        return r[0] if isinstance(r, tuple) else r

    return Prepared(fn, canonical=lambda o: o.squeeze(1))


def _prepare_sdpa_gathered(case, inputs) -> Prepared:
    """A baseline, not a paged kernel: the pages are gathered here, before timing, into
    contiguous (B, Hkv, ctx, D) K and V, and only PyTorch SDPA (enable_gqa, the fused backends
    only: never the math fallback, which would materialize Hq/Hkv copies of K and V) over them is
    timed. It does NOT pay for the gather, which a real paged decode must do."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cute_kernels.bench.cases import gather_pages

    q, k_cache, v_cache, block_table, seqlens_k = _decode_args(inputs)
    lens = seqlens_k.tolist()
    if len(set(lens)) > 1:
        raise Unsupported("sdpa_gathered needs every sequence the same length (no key mask)")
    ctx = lens[0] if lens else 0
    k = gather_pages(k_cache, block_table)[:, :ctx].transpose(1, 2).contiguous()
    v = gather_pages(v_cache, block_table)[:, :ctx].transpose(1, 2).contiguous()
    q4 = q.unsqueeze(2)
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]

    def fn():
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)

    return Prepared(fn, canonical=lambda o: o.squeeze(2))


def decode_impls() -> dict[str, Impl]:
    return {
        "decode": Impl("decode", "ours", _prepare_our_decode, _our_decode_available),
        "fa4_paged": Impl("fa4_paged", "peer", _prepare_fa4_paged, _needs_module("flash_attn.cute")),
        "sdpa_gathered": Impl("sdpa_gathered", "peer", _prepare_sdpa_gathered),
    }


def _fused_impls() -> dict[str, Impl]:
    # cute_kernels.bench.fused_impls imports this module: loaded when first asked for.
    return importlib.import_module("cute_kernels.bench.fused_impls").fused_impls()


# ----------------------------------------------------------------------------- attention_varlen


def _prepare_varlen_kernel(name: str, case, inputs) -> Prepared:
    from cute_kernels.attention import attention_varlen_forward

    q, k, v, cu, smax = (inputs[n] for n in ("q", "k", "v", "cu_seqlens", "max_seqlen"))
    causal = "bottom_right" if case.causal else None  # S_q = S_k per sequence: both alignments agree
    out = case.empty_out(inputs)
    return Prepared(lambda: attention_varlen_forward(q, k, v, cu, cu, smax, smax, causal=causal, kernel=name,
                                                     out=out), out=out)


def _prepare_fa4_varlen(case, inputs) -> Prepared:
    from flash_attn.cute import flash_attn_varlen_func

    q, k, v, cu, smax = (inputs[n] for n in ("q", "k", "v", "cu_seqlens", "max_seqlen"))

    def fn():
        r = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=smax, max_seqlen_k=smax,
                                   causal=case.causal)
        return r[0] if isinstance(r, tuple) else r

    return Prepared(fn)


def varlen_impls() -> dict[str, Impl]:
    """Ours (every attention rung with a varlen launch) then FlashAttention-4's varlen."""
    impls = _our_attention_with("varlen", _prepare_varlen_kernel)
    impls["fa4"] = Impl("fa4", "peer", _prepare_fa4_varlen, _needs_module("flash_attn.cute"))
    return impls


def _varlen_leaves(inputs):
    return tuple(inputs[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))


def _prepare_varlen_bwd_kernel(name: str, case, inputs) -> Prepared:
    """Our packed backward through the differentiable varlen operator, forward rung `name` (its
    backward: that rung's `varlen_backward`, where it takes the problem)."""
    from cute_kernels.ops import sdpa_varlen

    cu, smax = inputs["cu_seqlens"], inputs["max_seqlen"]
    causal = "bottom_right" if case.causal else None

    def forward(q, k, v):
        return sdpa_varlen(q, k, v, cu, cu, smax, smax, causal, None, -1, -1, rung=name)[0]

    return _bwd_prepared(forward, _varlen_leaves(inputs), inputs["dout"], _flat_grads)


def _prepare_fa4_varlen_bwd(case, inputs) -> Prepared:
    from flash_attn.cute import flash_attn_varlen_func

    cu, smax = inputs["cu_seqlens"], inputs["max_seqlen"]

    def forward(q, k, v):
        r = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=smax, max_seqlen_k=smax,
                                   causal=case.causal)
        return r[0] if isinstance(r, tuple) else r

    return _bwd_prepared(forward, _varlen_leaves(inputs), inputs["dout"], _flat_grads)


def varlen_bwd_impls() -> dict[str, Impl]:
    """Ours (every attention rung with a varlen backward) then FlashAttention-4's varlen backward."""
    impls = _our_attention_with("varlen_backward", _prepare_varlen_bwd_kernel)
    impls["fa4"] = Impl("fa4", "peer", _prepare_fa4_varlen_bwd, _needs_module("flash_attn.cute"))
    return impls


FAMILY_IMPLS: dict[str, Callable[[], dict[str, Impl]]] = {
    "fused": _fused_impls,
    "gemm": gemm_impls,
    "attention": attention_impls,
    "attention_bwd": attention_bwd_impls,
    "copy": copy_impls,
    "decode": decode_impls,
    "attention_varlen": varlen_impls,
    "attention_varlen_bwd": varlen_bwd_impls,
}
