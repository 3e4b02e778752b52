"""Rung `sm90_flash`, backward: dQ, dK, dV with FlashAttention-2/3's algorithm on Hopper's
TMA and warpgroup MMA. With P = exp(S * scale - lse) recomputed from the forward's
log-sum-exp, D_i = sum_d dO[i, d] O[i, d], dP = dO V^T and dS = P * (dP - D):

    dV = P^T dO        dK = scale * dS^T Q        dQ = scale * dS K

One kernel, `FlashAttentionSm90Bwd` (`sm90_bwd_mainloop`; this module holds its config, the
host entry points and the compile-only variants). A CTA owns `block_n` = 128 keys of one
(query head, batch) and is three warpgroups (`hopper.warp_roles`):

    producer   one warp TMA-loads K and V once, then per Q block (`block_m` rows: 128 up to
               D = 64, else 64) that sees these keys, ascending: Q, dO and the block's lse2
               and D (1-D boxes) into an mbarrier pipeline of `stages` slots; with
               `dq_writer` its second warp is the dQ writer (below)
    consumers  each owns 64 of the keys: S^T = K Q^T and dP^T = V dO^T (wgmma SS, two commit
               groups, so P^T is computed while dP^T runs), P^T and dS^T in fp32 registers
               (masks as selects), dV += P^T dO and dK += dS^T Q with 16-bit P^T and dS^T as
               register A operands; dS^T also goes to shared memory (stmatrix, two buffers),
               and dQ_blk = dS K is one wgmma SS over both warpgroups' keys

dQ_blk is added to an fp32 accumulator in one of three ways: by the dQ writer warp (`dq_writer`,
the default wherever its tiles fit in shared memory, up to D = 208, and Sq pads to whole Q
blocks by at most an eighth, `writer_pads_little`; an option for packed sequences): each
consumer stores scale * dQ_blk to its shared tile in fragment order
(`sm90_layouts.dq_tile_layout`: 16-byte stores, a warp's 512 contiguous bytes) and the writer
adds the whole tile with one `cp.reduce.async.bulk ... add.f32` into an accumulator of the same
order (whole Q blocks per head), which `dq_from_tiles` un-permutes; by the consumers' own
`red.global.add.v2.f32` per value pair into a row-major accumulator of Sq rows (the other
cases); or by one TMA reduce-add per warpgroup (`dq_tma_reduce`, slower). `deterministic` adds
each Q block's dQ_blk in key-block order: a counter per (batch, query head, Q block) that the
adding side (the writer warp, or the consumers) waits on, then advances; dQ is then the same
bits on every run.

Windows (`mask_rule`): `causal` tests the upper bound (runtime `causal_offset`), `local` the
lower (runtime `offset_lo`), and the CTA walks only the Q blocks of `block_info.m_block_range`;
with `unmasked_interior` the tiles that need no mask (`block_info.tile_unmasked`) run a copy of
the step without it. Soft cap: `sm90_bwd_mainloop`. GQA: fp32 dK, dV per query head summed on
the host, or with `gqa_loop` (the default where its grid fills the GPU, `gqa_loop_fills`) one
CTA per key/value head walking its group's query heads and summing dK, dV in registers. Head
dims above 128 (`head_split`): 64 keys a CTA shared by both consumers, which split S^T and dP^T
by queries and dV, dK, dQ_blk by the head dim, P^T and dS^T through shared memory (one buffer
each at 256).

Pre-processing (D, lse in base 2 with empty rows' -inf mapped to +inf so their P is 0, both
padded to whole Q blocks, and the zeroed dQ accumulator) is the `sm90_bwd_prep` kernel (torch
ops otherwise); post-processing converts dQ to q's dtype in one copy. Rows and keys past the
ends: TMA zero-fills the loads and lse2 of a missing row is +inf, so a tail needs no separate
code path. Host path (`backward`): with TVM-FFI both kernels are built once per config from
fake tensors and take the torch tensors on torch's current stream; config, scalars and padding
are derived once per problem (`_Launch`), and `backward_plan` replays a warm call.

Packed sequences (`varlen_backward`, `FlashSm90BwdConfig.varlen`): a CTA per (key block of the
longest sequence, query head, sequence); Q, dO, K, V through ragged tensor maps, lse2, D and the
(Hq, Tq, D) accumulator from the dense prep pass over the packed tensors viewed (1, H, T, D)
(rows past a sequence, the next one's, are masked in P^T and dS^T); with `dq_writer` the tiles go
to each sequence's own whole Q blocks (`varlen_tile_rows`). The lse2 / D boxes start at
the 16-byte boundary at or below a block's first row (`FlashSm90BwdConfig.row_box`): a 1-D TMA
box must start aligned, which stopped the first GPU run wherever a sequence began at a row not
a multiple of 4.

docs/attention.md ("The Hopper backward") has the measurements, the schedule options tried and
the history of each choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import cutlass

from cute_kernels.hopper.warp_roles import THREADS_PER_WARPGROUP
from cute_kernels.runtime import compile_kernel, tvm_ffi_available
from cute_kernels.runtime.arch import sm_count
from cute_kernels.runtime.plan_cache import WarmCache, memo

from . import sm90_bwd_prep as _prep
from .features import feature_reason
from .problem_checks import launch_scalars, mask_flags, rows_aligned, window_scalars
from .softmax import LOG2_E
from .sm90_bwd_mainloop import CUTLASS_DTYPES as _CUTLASS
from .sm90_bwd_mainloop import FlashAttentionSm90Bwd

__all__ = ["FlashSm90BwdConfig", "bwd_config_for", "FlashAttentionSm90Bwd", "supports_backward", "backward",
           "build_variant", "BWD_VARIANT_CONFIGS", "HEAD_DIMS"]

HEAD_DIMS = tuple(range(16, 257, 16))
# Head dims whose dK and dV accumulators of 64 keys fit one warpgroup's registers; the wider ones
# need `head_split` (the two consumer warpgroups share 64 keys and split the head dim).
_WHOLE_HEAD_DIMS = tuple(range(16, 129, 16))
_REGS = 65536
_SMEM_LIMIT = 227 * 1024


@dataclass(frozen=True)
class FlashSm90BwdConfig:
    """The static shape of one compiled backward kernel.

    head_dim: D of Q, K, V (a multiple of 16 up to 256, `HEAD_DIMS`); dtype: "float16" | "bfloat16";
    causal: whether the upper bound j <= i + offset is tested (causality or a window's right bound;
    the offset is a runtime value); local: whether a window's lower bound j >= i + offset_lo is
    tested (runtime offset_lo; the dK/dV CTA then also stops at the last Q block that sees its
    keys); block_m: Q rows per step (the N of S^T = K Q^T, the K of dV += P^T dO); block_n: keys per
    CTA (two consumer warpgroups x 64); stages: smem slots of the Q/dO pipeline; dkv_fp32: dK/dV are
    written as fp32 per query head (GQA, summed on the host) instead of in `dtype`; dq_tma_reduce:
    each step's dQ tile is staged in shared memory and added to global memory by one TMA reduce-add
    per warpgroup (else by per-element `red.global.add.f32` from registers); defer_dkv_wait: a step
    does not wait for its dV and dK GEMMs, the next step's S^T and dP^T queue behind them (wgmma
    groups retire in order, so waiting for the next S^T frees P^T, dS^T and the Q/dO slot);
    early_dv: dV += P^T dO is issued as soon as P^T is in registers, under the dS^T arithmetic;
    prep_kernel: D, lse2 and the zeroed dQ accumulator come from the `sm90_bwd_prep` kernel instead
    of torch ops (host side only: not part of the compiled kernel's key); producer_regs /
    consumer_regs: the setmaxnreg budgets; softcap: soft-capped scores (the cap a runtime argument;
    `sm90_bwd_mainloop` recovers the tanh from P^T for dS^T's factor); gqa_loop: with GQA, one CTA
    per (key block, key/value head) walks the query heads of its group and sums their dK, dV in
    registers, writing them once in `dtype` (no fp32 per-query-head buffers and no host sum: the
    memory of the non-GQA backward, deterministic), against `dkv_fp32`'s CTA per query head (more
    CTAs for small problems); head_split: the two consumer warpgroups share block_n = 64 keys, split
    S^T and dP^T by queries (32 columns each) and dV, dK by the head dim, with P^T and dS^T going
    through shared memory as the A of dV and dK (the layout of head dims above 128, whose dK and dV
    of 64 keys x D overflow one warpgroup's registers); ds_buffers: smem buffers of dS^T (and with
    head_split of P^T), 2 so that a step's writes never wait for the other warpgroup's reads of the
    last step, 1 where shared memory is short (D = 256), with a barrier before the writes instead;
    varlen: packed sequences delimited by cu_seqlens (`varlen_backward`): a CTA per (key block of
    the longest sequence, head, sequence), each sequence's rows read through ragged tensor maps;
    deterministic: each Q block's dQ_blk additions happen in key-block order (a counter per (batch,
    query head, Q block) that a CTA waits on, then advances), so dQ is the same bits on every run;
    dq_writer: each consumer warpgroup stores its scaled dQ_blk to a shared tile in fragment order
    (`sm90_layouts.dq_tile_layout`) and the producer warpgroup's second warp adds the whole tile to
    a fp32 accumulator of the same order with one bulk reduction (`hopper.tma.bulk_reduce_add_f32`),
    as FlashAttention-3's dQ warp does, instead of the consumers' `red.global` per value pair; with
    `deterministic` that warp keeps the key-block order, off the consumers' path;
    unmasked_interior: a Q block whose tile with this CTA's keys needs no mask
    (`block_info.tile_unmasked`) runs a copy of the step without the mask's tests and selects
    (FlashAttention-3 masks only the boundary blocks); an option: it measured between 4% slower
    and 6% faster (H100, 2026-12-06).
    """

    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    local: bool = False
    block_m: int = 64
    block_n: int = 128
    stages: int = 2
    dkv_fp32: bool = False
    dq_tma_reduce: bool = False
    defer_dkv_wait: bool = False
    early_dv: bool = False
    prep_kernel: bool = True
    producer_regs: int = 24
    consumer_regs: int = 240
    softcap: bool = False
    gqa_loop: bool = False
    head_split: bool = False
    ds_buffers: int = 2
    varlen: bool = False
    deterministic: bool = False
    dq_writer: bool = False
    unmasked_interior: bool = False

    def validate(self) -> "FlashSm90BwdConfig":
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"FlashSm90BwdConfig.head_dim must be a multiple of 16 in [16, 256], got "
                             f"{self.head_dim!r}")
        if self.dtype not in _CUTLASS:
            raise ValueError(f"FlashSm90BwdConfig.dtype must be one of {tuple(_CUTLASS)}, got {self.dtype!r}")
        for name in ("causal", "local", "dkv_fp32", "dq_tma_reduce", "defer_dkv_wait", "early_dv", "prep_kernel",
                     "softcap", "gqa_loop", "head_split", "varlen", "deterministic", "dq_writer",
                     "unmasked_interior"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FlashSm90BwdConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.gqa_loop and self.dkv_fp32:
            raise ValueError("FlashSm90BwdConfig: gqa_loop sums dK, dV in registers; it writes no fp32 "
                             "per-query-head results (dkv_fp32)")
        if self.block_m not in (64, 128):
            raise ValueError(f"FlashSm90BwdConfig.block_m must be 64 or 128 (the N of S^T), got {self.block_m!r}")
        if self.block_m == 128 and (self.head_dim > 64 or self.head_split or self.dq_tma_reduce):
            raise ValueError("FlashSm90BwdConfig: block_m 128 takes head dims up to 64 (S^T and dP^T of 64 keys x "
                             "128 queries beside dK and dV fill a consumer's registers), without head_split or "
                             "dq_tma_reduce")
        if self.head_split:
            if self.block_n != 64:
                raise ValueError(f"FlashSm90BwdConfig.block_n must be 64 with head_split (both consumer "
                                 f"warpgroups take the same 64 keys), got {self.block_n!r}")
            if self.early_dv or self.dq_tma_reduce:
                raise ValueError("FlashSm90BwdConfig: head_split takes neither early_dv (P^T reaches dV through "
                                 "shared memory, after both warpgroups wrote it) nor dq_tma_reduce (no shared "
                                 "memory left for the fp32 dQ tile at the head dims it serves)")
        else:
            if self.head_dim not in _WHOLE_HEAD_DIMS:
                raise ValueError(f"FlashSm90BwdConfig.head_dim {self.head_dim} needs head_split: the dK and dV "
                                 f"accumulators of 64 keys x D overflow a warpgroup's registers above "
                                 f"{_WHOLE_HEAD_DIMS[-1]}")
            if self.block_n != 128:
                raise ValueError(f"FlashSm90BwdConfig.block_n must be 128 (two consumer warpgroups x 64 keys), "
                                 f"got {self.block_n!r}")
            if self.ds_buffers != 2:
                raise ValueError(f"FlashSm90BwdConfig.ds_buffers must be 2 without head_split, got "
                                 f"{self.ds_buffers!r}")
        if self.varlen and (self.dq_tma_reduce or self.gqa_loop):
            raise ValueError("FlashSm90BwdConfig: varlen takes neither dq_tma_reduce (the packed dQ accumulator "
                             "has no per-sequence tensor map) nor gqa_loop")
        if self.deterministic and (self.dq_tma_reduce or self.varlen):
            raise ValueError("FlashSm90BwdConfig: deterministic orders the dQ reductions from registers of the "
                             "dense launch; it takes neither dq_tma_reduce nor varlen")
        if self.dq_writer and self.dq_tma_reduce:
            raise ValueError("FlashSm90BwdConfig: dq_writer (dQ staged in shared memory, added by a producer warp) "
                             "and dq_tma_reduce are two ways of adding dQ: take one")
        if self.dq_writer and self.head_split and self.smem_bytes > _SMEM_LIMIT:
            raise ValueError(f"FlashSm90BwdConfig: dq_writer's tiles ({4 * self.dq_stage_floats} bytes) do not fit "
                             f"beside head_split's buffers at head dim {self.head_dim} (up to 208 they do)")
        if self.ds_buffers not in (1, 2):
            raise ValueError(f"FlashSm90BwdConfig.ds_buffers must be 1 or 2, got {self.ds_buffers!r}")
        if self.stages not in (1, 2, 3):
            raise ValueError(f"FlashSm90BwdConfig.stages must be 1 to 3, got {self.stages!r}")
        for name in ("producer_regs", "consumer_regs"):
            r = getattr(self, name)
            if not isinstance(r, int) or r % 8 or not 24 <= r <= 256:
                raise ValueError(f"FlashSm90BwdConfig.{name} must be a multiple of 8 in [24, 256], got {r!r}")
        if 128 * (self.producer_regs + 2 * self.consumer_regs) > _REGS:
            raise ValueError(f"setmaxnreg budgets {self.producer_regs} + 2 x {self.consumer_regs} per thread exceed "
                             f"the {_REGS} registers of an SM for 3 warpgroups")
        if self.smem_bytes > _SMEM_LIMIT:
            raise ValueError(f"FlashSm90BwdConfig needs {self.smem_bytes} bytes of shared memory, over sm_90's "
                             f"{_SMEM_LIMIT}: lower stages")
        return self

    @property
    def threads(self) -> int:
        return 3 * THREADS_PER_WARPGROUP

    @property
    def s_cols(self) -> int:
        """Query columns of a consumer warpgroup's S^T and dP^T (the N of their wgmma)."""
        return self.block_m // 2 if self.head_split else self.block_m

    @property
    def smem_bytes(self) -> int:
        """K and V (block_n x D), `stages` slots of Q and dO (block_m x D), `ds_buffers` dS^T
        buffers (block_n x block_m; as many of P^T with head_split), all 16-bit; the fp32 dQ tile
        (block_m x D) with `dq_tma_reduce`; lse2 and D per stage; barriers and alignment slack."""
        d = self.head_dim
        score_tiles = self.ds_buffers * (2 if self.head_split else 1)
        tiles = 2 * self.block_n * d + 2 * self.stages * self.block_m * d + score_tiles * self.block_n * self.block_m
        dq_tile = 4 * self.block_m * d if self.dq_tma_reduce else 4 * self.dq_stage_floats if self.dq_writer else 0
        return 2 * tiles + dq_tile + 2 * 4 * self.row_stage * self.stages + 2048

    @property
    def row_box(self) -> int:
        """lse2 and D rows a Q block's TMA box loads: block_m, or varlen block_m + 4. A 1-D box must
        start 16-byte aligned (else the load stops the kernel with an illegal instruction, the
        first GPU run of varlen), and a sequence's rows start anywhere, so a varlen box starts
        at the 4-float boundary at or below its first row and takes 4 more."""
        return self.block_m + 4 if self.varlen else self.block_m

    @property
    def row_stage(self) -> int:
        """Floats between two stages of the lse2 / D buffers: `row_box` rounded up to 128 bytes."""
        return -(-self.row_box // 32) * 32

    @property
    def dq_tile_cols(self) -> int:
        """Columns of a consumer warpgroup's dQ_blk (64 rows): half the head dim, or all of it with
        128 Q rows (the warpgroups then split the rows)."""
        return self.head_dim if self.block_m == 128 else self.head_dim // 2

    @property
    def dq_tile_floats(self) -> int:
        """Floats of one warpgroup's dQ_blk, in `dq_writer`'s shared tile and accumulator alike."""
        return 64 * self.dq_tile_cols

    @property
    def dq_stage_floats(self) -> int:
        return 2 * self.dq_tile_floats

    @property
    def tx_bytes_kv(self) -> int:
        return 2 * 2 * self.block_n * self.head_dim

    @property
    def tx_bytes_qdo(self) -> int:
        return 2 * 2 * self.block_m * self.head_dim + 2 * 4 * self.row_box


def block_n_for(head_dim: int) -> int:
    """Keys per CTA at a head dim: 128 (64 a consumer warpgroup), 64 where the warpgroups split
    the head dim (above 128)."""
    return 128 if head_dim in _WHOLE_HEAD_DIMS else 64


def bwd_config_for(head_dim: int, dtype: str, causal: bool, *, dkv_fp32: bool = False,
                   local: bool = False, softcap: bool = False, gqa_loop: bool = False,
                   varlen: bool = False, deterministic: bool = False, wide_q: bool = True,
                   dq_writer: bool | None = None) -> FlashSm90BwdConfig:
    """The tile for a head dim: 64 Q rows per step (with `wide_q`, 128 up to D = 64, as
    FlashAttention-3 takes them there: half the steps, each twice the work between the
    consumers' meetings) against `block_n_for(head_dim)` keys per CTA; at D = 256 one dS^T / P^T
    buffer each (two would need 232 KB of shared memory). dq_writer: None takes the writer warp
    wherever its tiles fit beside head_split's buffers (up to D = 208), except for `varlen`:
    4-22% faster than the consumers' reductions from D = 32 to 192, and deterministic at
    1.1-1.8x its non-deterministic time against their 1.4-2.7x (H200 and H100, 2026-12-06;
    packed sequences measured 5% faster on two batches and 6% slower on a third, so they keep
    the consumers' reductions)."""
    split = head_dim not in _WHOLE_HEAD_DIMS
    config = FlashSm90BwdConfig(head_dim=head_dim, dtype=dtype, causal=causal, local=local,
                                dkv_fp32=dkv_fp32, softcap=softcap, gqa_loop=gqa_loop, head_split=split,
                                block_m=128 if wide_q and head_dim <= 64 else 64,
                                block_n=block_n_for(head_dim), ds_buffers=1 if head_dim > 192 else 2,
                                varlen=varlen, deterministic=deterministic,
                                dq_writer=not varlen if dq_writer is None else dq_writer)
    if dq_writer is None and config.dq_writer and config.smem_bytes > _SMEM_LIMIT:
        config = replace(config, dq_writer=False)
    return config.validate()


# ---- compile-only variants ------------------------------------------------------------------------


def build_variant(head_dim: int = 128, dtype: str = "bfloat16", causal: bool = False, dkv_fp32: bool = False,
                  local: bool = False, **tile):
    """A CompileJob for the backward over fake (B, H, S, D) tensors with symbolic sizes (with
    `varlen`, packed (1, H, T, D) views and int32 cu_seqlens)."""
    from cute_kernels.runtime import CompileJob, fake_stream, fake_tensor

    # 64 Q rows and the consumers' own dQ reductions unless the variant asks for 128 rows or the
    # writer warp (its options are written against that base)
    config = replace(bwd_config_for(head_dim, dtype, causal, dkv_fp32=dkv_fp32, local=local, wide_q=False,
                                    dq_writer=False), **tile).validate()
    return CompileJob(_entry(config), _fake_args(config, fake_tensor, fake_stream),
                      ("attention.sm90_flash_bwd", config))


def _entry(config: FlashSm90BwdConfig):
    """The jit entry of `config`'s kernel: the dense `__call__`, `call_varlen` or
    `call_deterministic` (each with its own parameter list)."""
    kernel = _kernel_for(config)
    if config.varlen:
        return kernel.call_varlen
    return kernel.call_deterministic if config.deterministic else kernel


def _fake_args(config: FlashSm90BwdConfig, fake_tensor, fake_stream):
    t = _CUTLASS[config.dtype]
    dkv_t = cutlass.Float32 if config.dkv_fp32 else t
    q, k, v, do = [fake_tensor(t, 4, leading_dim=3, assumed_align=16, stride_divisibility=8) for _ in range(4)]
    lse2, drow, dq = [fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=16) for _ in range(3)]
    dk, dv = [fake_tensor(dkv_t, 4, leading_dim=3, assumed_align=16) for _ in range(2)]
    return (q, k, v, do, lse2, drow, dq, dk, dv, cutlass.Float32(1.0 / math.sqrt(config.head_dim)),
            cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(1), fake_stream(),
            cutlass.Float32(30.0) if config.softcap else None, *_varlen_tail(config, fake_tensor),
            *_turns_tail(config, fake_tensor))


def _turns_tail(config: FlashSm90BwdConfig, fake_tensor) -> tuple:
    """The deterministic launch's trailing fake argument (the int32 counters); none otherwise."""
    return (fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4),) if config.deterministic else ()


def _varlen_tail(config: FlashSm90BwdConfig, fake_tensor) -> tuple:
    """The varlen launch's trailing fake arguments (cu_seqlens q and k, the launch order, the
    longest key length, the bottom-right flag); none for a dense config."""
    if not config.varlen:
        return ()
    cu = [fake_tensor(cutlass.Int32, 1, leading_dim=0, assumed_align=4) for _ in range(3)]
    return (*cu, cutlass.Int32(1), cutlass.Int32(1))


BWD_VARIANT_CONFIGS = {
    f"d{d}_{dt}{'_causal' if causal else ''}{'_gqa' if gqa else ''}": {"head_dim": d, "dtype": dt, "causal": causal,
                                                                      "dkv_fp32": gqa}
    for d, dt, causal, gqa in (
        (64, "float16", True, False), (64, "bfloat16", False, True), (128, "bfloat16", False, False),
        (128, "bfloat16", True, False), (128, "float16", True, True), (96, "bfloat16", True, False),
        (96, "float16", False, True),
    )
}
# The schedule options (compile-checked here; see the module docstring): the TMA reduce-add of
# dQ alone, and with the early dV and the deferred dV/dK wait.
BWD_VARIANT_CONFIGS["d128_bfloat16_tma"] = {"head_dim": 128, "dtype": "bfloat16", "causal": False,
                                            "dq_tma_reduce": True}
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_tma_early_defer"] = {
    "head_dim": 128, "dtype": "bfloat16", "causal": True, "dq_tma_reduce": True, "early_dv": True,
    "defer_dkv_wait": True}
# Sliding windows: the lower bound alone, and both bounds with GQA.
BWD_VARIANT_CONFIGS["d64_float16_local"] = {"head_dim": 64, "dtype": "float16", "causal": False, "local": True}
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_local_gqa"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                         "local": True, "dkv_fp32": True}
BWD_VARIANT_CONFIGS["d64_float16_causal_gqa_tma_early_defer"] = {
    "head_dim": 64, "dtype": "float16", "causal": True, "dkv_fp32": True, "dq_tma_reduce": True, "early_dv": True,
    "defer_dkv_wait": True}
# Soft-capped scores (dS^T's tanh factor recovered from P^T).
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_softcap"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                       "softcap": True}
BWD_VARIANT_CONFIGS["d64_float16_local_gqa_softcap"] = {"head_dim": 64, "dtype": "float16", "causal": False,
                                                        "local": True, "dkv_fp32": True, "softcap": True}
# GQA summed in registers across the group's query heads.
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_gqa_loop"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                        "gqa_loop": True}
BWD_VARIANT_CONFIGS["d64_float16_local_gqa_loop_tma"] = {"head_dim": 64, "dtype": "float16", "causal": False,
                                                         "local": True, "gqa_loop": True, "dq_tma_reduce": True}
# Head dims above 128: the two consumer warpgroups share 64 keys and split the head dim
# (`head_split`; one dS^T / P^T buffer at 256), and the same layout at 128, where the GPU tests
# compare it with the default one.
BWD_VARIANT_CONFIGS["d192_bfloat16_causal"] = {"head_dim": 192, "dtype": "bfloat16", "causal": True}
BWD_VARIANT_CONFIGS["d192_float16_gqa"] = {"head_dim": 192, "dtype": "float16", "causal": False, "dkv_fp32": True}
BWD_VARIANT_CONFIGS["d256_bfloat16_causal"] = {"head_dim": 256, "dtype": "bfloat16", "causal": True}
BWD_VARIANT_CONFIGS["d256_bfloat16_local_softcap_gqa_loop"] = {
    "head_dim": 256, "dtype": "bfloat16", "causal": True, "local": True, "softcap": True, "gqa_loop": True}
BWD_VARIANT_CONFIGS["d256_float16_defer"] = {"head_dim": 256, "dtype": "float16", "causal": False,
                                             "defer_dkv_wait": True}
# Other head dims: 80 (16-byte rows: dQ's halves of 40 columns), 32 with GQA, 160 split.
BWD_VARIANT_CONFIGS["d80_bfloat16_causal"] = {"head_dim": 80, "dtype": "bfloat16", "causal": True}
BWD_VARIANT_CONFIGS["d32_float16_gqa"] = {"head_dim": 32, "dtype": "float16", "causal": False, "dkv_fp32": True}
BWD_VARIANT_CONFIGS["d160_float16_causal"] = {"head_dim": 160, "dtype": "float16", "causal": True}
# Packed sequences (varlen): ragged tensor maps per sequence, rows past a sequence masked.
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_varlen"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                      "varlen": True}
BWD_VARIANT_CONFIGS["d64_float16_local_softcap_gqa_varlen"] = {
    "head_dim": 64, "dtype": "float16", "causal": True, "local": True, "softcap": True, "dkv_fp32": True,
    "varlen": True}
BWD_VARIANT_CONFIGS["d256_bfloat16_varlen"] = {"head_dim": 256, "dtype": "bfloat16", "causal": False,
                                               "varlen": True}
# dQ added in key-block order (deterministic), with a window's first key block per Q block.
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_deterministic"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                             "deterministic": True}
BWD_VARIANT_CONFIGS["d64_float16_local_gqa_loop_deterministic"] = {
    "head_dim": 64, "dtype": "float16", "causal": False, "local": True, "gqa_loop": True, "deterministic": True}
# dQ staged in shared memory and added by the producer warpgroup's second warp (bulk reductions
# of whole rows), alone and with 128 Q rows, GQA's loop, windows and packed sequences.
BWD_VARIANT_CONFIGS["d128_bfloat16_dq_writer"] = {"head_dim": 128, "dtype": "bfloat16", "causal": False,
                                                  "dq_writer": True}
BWD_VARIANT_CONFIGS["d96_float16_causal_local_gqa_loop_dq_writer"] = {
    "head_dim": 96, "dtype": "float16", "causal": True, "local": True, "gqa_loop": True, "dq_writer": True}
BWD_VARIANT_CONFIGS["d64_bfloat16_causal_wide_q_dq_writer"] = {"head_dim": 64, "dtype": "bfloat16", "causal": True,
                                                               "block_m": 128, "dq_writer": True}
BWD_VARIANT_CONFIGS["d192_bfloat16_causal_split_dq_writer"] = {"head_dim": 192, "dtype": "bfloat16", "causal": True,
                                                               "dq_writer": True}
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_varlen_dq_writer"] = {"head_dim": 128, "dtype": "bfloat16",
                                                                "causal": True, "varlen": True, "dq_writer": True}
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_deterministic_dq_writer"] = {
    "head_dim": 128, "dtype": "bfloat16", "causal": True, "deterministic": True, "dq_writer": True}
# A copy of the step without the mask for the tiles that need none (`unmasked_interior`).
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_dq_writer_unmasked_interior"] = {
    "head_dim": 128, "dtype": "bfloat16", "causal": True, "dq_writer": True, "unmasked_interior": True}
BWD_VARIANT_CONFIGS["d64_float16_causal_local_varlen_unmasked_interior"] = {
    "head_dim": 64, "dtype": "float16", "causal": True, "local": True, "varlen": True, "unmasked_interior": True}
# 128 Q rows a step at head dims up to 64 (`wide_q`): dQ's rows split over the warpgroups.
BWD_VARIANT_CONFIGS["d64_bfloat16_wide_q"] = {"head_dim": 64, "dtype": "bfloat16", "causal": False, "block_m": 128}
BWD_VARIANT_CONFIGS["d64_float16_causal_local_gqa_loop_deterministic_wide_q"] = {
    "head_dim": 64, "dtype": "float16", "causal": True, "local": True, "gqa_loop": True, "deterministic": True,
    "block_m": 128}
BWD_VARIANT_CONFIGS["d32_bfloat16_causal_gqa_wide_q"] = {"head_dim": 32, "dtype": "bfloat16", "causal": True,
                                                         "dkv_fp32": True, "block_m": 128}
BWD_VARIANT_CONFIGS["d128_bfloat16_causal_split"] = {"head_dim": 128, "dtype": "bfloat16", "causal": True,
                                                     "head_split": True, "block_n": 64}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    register_variant("attention.sm90_flash_bwd", build_variant, configs=BWD_VARIANT_CONFIGS,
                     requires={"HGMMA", "UTMALDG"})


_register()


# ---- host side ------------------------------------------------------------------------------------


# Score features (`features.FEATURES`) this backward takes. Sinks need nothing of it: the
# forward's lse includes the sink, so P = exp(S - lse) and dS = P (dP - D) are unchanged.
BACKWARD_FEATURES = ("sinks", "softcap")


def supports_backward(problem) -> str | None:
    """None when this backward takes `problem` (an `api.AttentionProblem`), else why not."""
    if str(problem.dtype).removeprefix("torch.") not in _CUTLASS:
        return f"the sm90_flash backward takes float16 and bfloat16, not {problem.dtype}"
    d = problem.head_dim
    if d not in HEAD_DIMS:
        return f"the sm90_flash backward takes head dims that are multiples of 16 up to 256, not {d}"
    if problem.head_dim_v != d:
        return f"the sm90_flash backward needs the value head dim ({problem.head_dim_v}) equal to D ({d})"
    if not (math.isfinite(problem.scale) and problem.scale > 0):
        return f"scale {problem.scale} must be finite and > 0"
    return feature_reason(problem, BACKWARD_FEATURES)


# The warm path's caches (`runtime.plan_cache`; see `backward`): kernel objects and TVM-FFI
# functions per compiled config, the support verdict per (dtype, head dims, scale), and a
# `_Launch` per problem (bounded: problems vary with every sequence length).
_MAX_LAUNCHES = 256
_KERNELS = WarmCache("attention.sm90_flash_bwd.kernels")
_COMPILED = WarmCache("attention.sm90_flash_bwd.tvm_ffi")
_SUPPORTED = WarmCache("attention.sm90_flash_bwd.supported", _MAX_LAUNCHES)
_LAUNCHES = WarmCache("attention.sm90_flash_bwd.launches", _MAX_LAUNCHES)


def _kernel_for(config: FlashSm90BwdConfig) -> FlashAttentionSm90Bwd:
    return memo(_KERNELS, config, FlashAttentionSm90Bwd, config)


def _compile_tvm_ffi(config: FlashSm90BwdConfig):
    """Compile (or load) the TVM-FFI backward for kernel config `config` (prep_kernel False) from
    fake tensors; cache it in `_COMPILED`.

    The fake tensors fix what the `from_torch` path's wrapping does (`_dsl_args`: dtype, rank,
    unit-stride mode, 16-byte alignment; q, k, v, dO and dK, dV 4-D with the head dim
    contiguous, lse2, D and the dQ accumulator flat fp32); sizes and other strides are runtime
    values, so the config is the whole compile key. The function takes torch tensors and
    Python scalars and launches on torch's current stream. The entry is the config's
    (`_entry`): a varlen build's (1, H, T, D) views have strides outside the head dim that are
    multiples of 8 (the ragged tensor maps need it; checked per call) and trailing int32
    cu_seqlens and launch order; a deterministic build's trailing counters."""
    from cute_kernels.runtime import TVM_FFI_OPTION, fake_stream, fake_tensor

    t = _CUTLASS[config.dtype]
    dkv_t = cutlass.Float32 if config.dkv_fp32 else t
    divisible = 8 if config.varlen else 1
    q, k, v, do = [fake_tensor(t, 4, leading_dim=3, assumed_align=16, stride_divisibility=divisible)
                   for _ in range(4)]
    lse2, drow, dq = [fake_tensor(cutlass.Float32, 1, leading_dim=0, assumed_align=16) for _ in range(3)]
    dk, dv = [fake_tensor(dkv_t, 4, leading_dim=3, assumed_align=16) for _ in range(2)]
    fn = compile_kernel(_entry(config), q, k, v, do, lse2, drow, dq, dk, dv, cutlass.Float32(1.0),
                        cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(1), fake_stream(tvm_ffi_env_stream=True),
                        cutlass.Float32(30.0) if config.softcap else None, *_varlen_tail(config, fake_tensor),
                        *_turns_tail(config, fake_tensor), key=("attention.sm90_flash_bwd", "tvm_ffi", config),
                        options=TVM_FFI_OPTION)
    _COMPILED[config] = fn
    return fn


@dataclass(frozen=True)
class _Launch:
    """What `backward` derives from a problem (and config) once: config: the host config;
    kernel_config: the compiled kernel's (prep_kernel is host-side only, so one compiled kernel
    serves both settings); group: query heads per KV head; scale, offset, offset_lo: the
    kernel's runtime scalars (`launch_scalars`, `window_scalars`); softcap: the cap or None;
    seqlen_q: Sq; sq_pad: Sq rounded up to whole Q blocks (also the accumulator's rows per head
    with `dq_writer`, else Sq); prep: whether the `sm90_bwd_prep` kernel runs (the option, and
    32-bit element offsets suffice); dkv_shape: (B, H, Sk, D) of the kernel's dK, dV (H: Hq for the
    fp32 per-query-head results, else Hkv)."""

    config: FlashSm90BwdConfig
    kernel_config: FlashSm90BwdConfig
    group: int
    scale: float
    softcap: float | None
    offset: int
    offset_lo: int
    seqlen_q: int
    sq_pad: int
    prep: bool
    dkv_shape: tuple


def _check_supported(problem) -> None:
    """`supports_backward`, raising ValueError with its reason; a pass is remembered per (dtype,
    head dim, value head dim, scale, features) (bounded, as
    `_LAUNCHES`)."""
    key = (problem.dtype, problem.head_dim, problem.head_dim_v, problem.scale, problem.softcap, problem.seqused_k)
    if key in _SUPPORTED:
        return
    why = supports_backward(problem)
    if why is not None:
        raise ValueError(f"sm90_flash backward: {why}")
    _SUPPORTED.put(key, True)


def gqa_loop_fills(problem, sms: int) -> bool:
    """Whether the default backward of a GQA problem sums dK, dV in the kernel (`gqa_loop`):
    when its grid, a CTA per (`block_n_for` keys, key/value head, batch), still fills the GPU's
    `sms` SMs.
    Measured on the H200 at B4 Hq32 Hkv8 S4096 D128 (1024 CTAs): 0.99x the per-query-head path's
    time causal, 1.09x not, 452 MiB peak against 1028 MiB (FA4: 580). A smaller grid leaves SMs
    idle where the per-query-head path has `group` times more CTAs, so it keeps that path; so
    does a soft cap, whose combination with the loop has not run on a GPU yet."""
    ctas = -(-problem.seqlen_k // block_n_for(problem.head_dim)) * problem.heads_kv * problem.batch
    return problem.softcap is None and sms > 0 and ctas >= sms


def writer_pads_little(seqlen_q: int, block_m: int) -> bool:
    """Whether the default backward of Sq query rows takes the dQ writer warp (`dq_writer`),
    whose accumulator holds whole Q blocks: where that pads Sq by at most an eighth. Short
    sequences keep the consumers' reductions into Sq rows: at ViT-B/16's S197 (128-row blocks,
    30% padding) the writer measured 20% slower than them (0.270 against 0.225 ms, B64 H12 D64,
    H100, 2026-12-06)."""
    pad = -(-seqlen_q // block_m) * block_m - seqlen_q
    return 8 * pad <= seqlen_q


def _sm_count() -> int:
    """The current CUDA device's SM count (0 without CUDA: the default keeps the fp32 buffers)."""
    import torch

    return sm_count() if torch.cuda.is_available() else 0


def _launch_for(problem, config, deterministic: bool = False) -> _Launch:
    """The `_Launch` of `problem` with `config` (None: `bwd_config_for` the problem, with dQ
    added in a fixed order when `deterministic`), cached in `_LAUNCHES` (at most `_MAX_LAUNCHES`
    entries; it then starts afresh). The key leaves out the device: its SM count only chooses
    between two schedules that compute the same gradients (`gqa_loop_fills`), so a warm call
    asks the driver nothing."""
    key = (problem, config, deterministic)
    launch = _LAUNCHES.get(key)
    if launch is not None:
        return launch
    sms = _sm_count() if config is None else 0
    group = problem.heads_q // problem.heads_kv
    dtype_name = str(problem.dtype).removeprefix("torch.")
    upper, local = mask_flags(problem)
    softcap = problem.softcap is not None
    if config is not None:
        config = config.validate()
        # dK, dV of a group: fp32 per query head (summed here) or summed in the kernel (gqa_loop)
        want = (problem.head_dim, dtype_name, upper, local, group > 1 and not config.gqa_loop, softcap)
        if (config.head_dim, config.dtype, config.causal, config.local, config.dkv_fp32, config.softcap) != want:
            raise ValueError(f"config {config} does not match the problem (head_dim, dtype, causal, local, "
                             f"dkv_fp32, softcap) = {want}")
    else:
        loop = group > 1 and gqa_loop_fills(problem, sms)
        config = bwd_config_for(problem.head_dim, dtype_name, upper, dkv_fp32=group > 1 and not loop, local=local,
                                softcap=softcap, gqa_loop=loop, deterministic=deterministic)
        if config.dq_writer and not writer_pads_little(problem.seqlen_q, config.block_m):
            config = replace(config, dq_writer=False)
    scale, offset, _ = launch_scalars(problem)
    offset_lo, _ = window_scalars(problem)
    b, hq, sq, sk, d = problem.batch, problem.heads_q, problem.seqlen_q, problem.seqlen_k, problem.head_dim
    sq_pad = -(-sq // config.block_m) * config.block_m
    launch = _Launch(config=config, kernel_config=replace(config, prep_kernel=False), group=group, scale=scale,
                     softcap=problem.softcap, offset=offset, offset_lo=offset_lo, seqlen_q=sq, sq_pad=sq_pad,
                     prep=config.prep_kernel and b * hq * sq_pad * d < 2**31,
                     dkv_shape=(b, hq if config.dkv_fp32 else problem.heads_kv, sk, d))
    return _LAUNCHES.put(key, launch)


def _dsl_args(launch: _Launch, q, k, v, dout, lse2, d_rows, dq_flat, dk_h, dv_h) -> tuple:
    """The kernel's arguments as DSL tensors and scalars (the path without TVM-FFI); lse2,
    d_rows and dq_flat are flat."""
    from cute_kernels.runtime import from_torch

    t4 = lambda t: from_torch(t, assumed_align=16, leading_dim=3)  # noqa: E731
    t1 = lambda t: from_torch(t, assumed_align=16, leading_dim=0)  # noqa: E731
    return (t4(q), t4(k), t4(v), t4(dout), t1(lse2), t1(d_rows), t1(dq_flat), t4(dk_h), t4(dv_h),
            cutlass.Float32(launch.scale), cutlass.Int32(launch.offset), cutlass.Int32(launch.offset_lo),
            cutlass.Int32(launch.group))


def _softcap_arg(launch: _Launch):
    """The kernel's trailing softcap argument (after the stream): the cap, or None without one."""
    return None if launch.softcap is None else cutlass.Float32(launch.softcap)


def backward(dout, q, k, v, out, lse, problem, *, deterministic: bool = False, config=None):
    """(dq, dk, dv) for 4-D q (B, Hq, Sq, D), k, v (B, Hkv, Sk, D), the forward's out and lse
    (B, Hq, Sq) (natural log, -inf for rows that saw no key) and the output gradient dout, on
    torch's current stream. dq, dk, dv are new tensors of q's dtype stored (B, S, H, D) as the
    forward's out (`api.new_out`); with GQA dk and dv sum over the query heads sharing a
    key/value head.

    dQ is summed with fp32 atomics, so its rounding may differ from run to run; with
    `deterministic=True` each Q block's additions happen in key-block order
    (`FlashSm90BwdConfig.deterministic`).
    `config`: a `FlashSm90BwdConfig` to use instead of `bwd_config_for` (benchmarks, bisection);
    its head dim, dtype, mask flags (causal, local) and dkv_fp32 must match the problem.
    Sliding windows (`problem.window_left` / `window_right`) are taken as the forward takes them.

    With TVM-FFI (`runtime.tvm_ffi_available()`) the compiled kernels (this one and the
    `sm90_bwd_prep` pass) take the torch tensors themselves and read torch's current stream;
    otherwise each tensor is wrapped with `from_torch`. Either way a warm call (a problem seen
    before) derives no config, scalar or compile key: the host work left is the allocations,
    the launches and the post-processing."""
    import torch

    _check_supported(problem)
    launch = _launch_for(problem, config, deterministic)
    config = launch.config
    tvm = tvm_ffi_available()
    q, k, v, dout = rows_aligned(q), rows_aligned(k), rows_aligned(v), rows_aligned(dout)
    if tvm and (q.requires_grad or k.requires_grad or v.requires_grad or out.requires_grad
                or dout.requires_grad or lse.requires_grad):
        # DLPack export refuses tensors that require grad; detached aliases share the storage.
        q, k, v, out, dout, lse = q.detach(), k.detach(), v.detach(), out.detach(), dout.detach(), lse.detach()
    # Pre-processing: D_i = dO_i . O_i; lse in base 2, rows that saw no key enter with +inf (P = 0).
    # D and lse2 are padded to whole Q blocks (lse2 = +inf and D = 0 in the padding, so P = 0
    # there) and passed flat, as is the zeroed dQ accumulator of Sq rows per head.
    b, hq, sq, sk, d = problem.batch, problem.heads_q, problem.seqlen_q, problem.seqlen_k, problem.head_dim
    sq_pad, group = launch.sq_pad, launch.group
    if tvm and launch.prep:  # the path a warm plan replays (`backward_plan`)
        return _run_prepped(launch, _prep.prep_function(d, dout.dtype), _tvm_build(launch.kernel_config), dout, q,
                            k, v, rows_aligned(out), lse.contiguous().float(), problem.heads_kv)
    if launch.prep:  # flat D, lse2 and dQ accumulator, and the accumulator's (B, Hq, Sq_pad, D) view
        d_rows, lse2, dq_flat, dq_acc = _prep.preprocess_flat(dout, out, lse, config.block_m, tvm, _acc_rows(launch))
    else:  # torch ops (also past the prep kernel's 32-bit element offsets)
        d_rows = torch.zeros((b, hq, sq_pad), dtype=torch.float32, device=q.device)
        d_rows[:, :, :sq] = (dout.float() * out.float()).sum(-1)
        lse2 = torch.full((b, hq, sq_pad), math.inf, dtype=torch.float32, device=q.device)
        lse2[:, :, :sq] = torch.where(torch.isneginf(lse), math.inf, lse.float() * LOG2_E)
        dq_acc = torch.zeros((b, hq, _acc_rows(launch), d), dtype=torch.float32, device=q.device)
        d_rows, lse2, dq_flat = d_rows.view(-1), lse2.view(-1), dq_acc.view(-1)
    dk_h, dv_h = _dkv_buffers(launch, q)
    if tvm:
        _tvm_build(launch.kernel_config)(q, k, v, dout, lse2, d_rows, dq_flat, dk_h, dv_h, launch.scale,
                                         launch.offset, launch.offset_lo, group, launch.softcap, *_turns(launch, q))
    else:
        from cute_kernels.runtime import current_stream, from_torch

        args = _dsl_args(launch, q, k, v, dout, lse2, d_rows, dq_flat, dk_h, dv_h)
        stream = current_stream()
        turns = tuple(from_torch(t, assumed_align=4, leading_dim=0) for t in _turns(launch, q))
        fn = compile_kernel(_entry(launch.kernel_config), *args, stream, _softcap_arg(launch), *turns,
                            key=("attention.sm90_flash_bwd", launch.kernel_config))
        fn(*args, stream, _softcap_arg(launch), *turns)
    return _post(launch, dq_acc, dk_h, dv_h, q.dtype, problem.heads_kv)


def _acc_rows(launch: _Launch) -> int:
    """The dQ accumulator's rows per (batch, head): whole Q blocks for the writer's tiles, else Sq."""
    return launch.sq_pad if launch.config.dq_writer else launch.seqlen_q


def _tvm_build(config: FlashSm90BwdConfig):
    """The TVM-FFI build of `config`, compiled on first use."""
    fn = _COMPILED.get(config)
    return fn if fn is not None else _compile_tvm_ffi(config)


def _turns(launch: _Launch, q) -> tuple:
    """The deterministic launch's zeroed int32 counters, one per (batch, query head, Q block)
    (`FlashAttentionSm90Bwd.call_deterministic`), as a one-tuple; () otherwise."""
    if not launch.config.deterministic:
        return ()
    import torch

    blocks = q.shape[0] * q.shape[1] * (launch.sq_pad // launch.config.block_m)  # q: (B, Hq, Sq, D)
    return (torch.zeros(blocks, dtype=torch.int32, device=q.device),)


def _dkv_buffers(launch: _Launch, q):
    """The kernel's dK, dV outputs: fp32 per query head in one buffer (they never leave the
    call: `_post` sums each group), or the results themselves in q's dtype, stored (B, Sk, H, D)
    as the forward's out (`api.new_out`)."""
    import torch

    from .api import new_out

    if launch.config.dkv_fp32:
        dkv_h = torch.empty((2, *launch.dkv_shape), dtype=torch.float32, device=q.device)
        return dkv_h[0], dkv_h[1]
    return new_out(launch.dkv_shape, q.dtype, q.device), new_out(launch.dkv_shape, q.dtype, q.device)


def _post(launch: _Launch, dq_acc, dk_h, dv_h, dtype, heads_kv: int):
    """Post-processing: dQ to the inputs' dtype (one pass over the accumulator, which holds just
    the Sq rows, or `dq_writer`'s tiles: `dq_from_tiles`); GQA's per-query-head fp32 dK, dV
    summed over each group. Every result is stored (B, S, H, D) as the forward's out
    (`api.new_out`)."""
    from .api import new_out

    if launch.config.dq_writer:
        dq = dq_from_tiles(dq_acc, launch.config, launch.seqlen_q, dtype)
    else:
        dq = new_out(tuple(dq_acc.shape), dtype, dq_acc.device).copy_(dq_acc)
    if not launch.config.dkv_fp32:
        return dq, dk_h, dv_h
    b, _, sk, d = launch.dkv_shape
    shape = (b, heads_kv, sk, d)
    dk = new_out(shape, dtype, dq.device).copy_(dk_h.view(b, heads_kv, launch.group, sk, d).sum(2))
    dv = new_out(shape, dtype, dq.device).copy_(dv_h.view(b, heads_kv, launch.group, sk, d).sum(2))
    return dq, dk, dv


def dq_from_tiles(dq_acc, config: FlashSm90BwdConfig, seqlen_q: int, dtype):
    """dQ (B, Hq, Sq, D) in `dtype`, stored (B, S, H, D) as `api.new_out`'s, from `dq_writer`'s
    fp32 accumulator dq_acc (B, Hq, Sq_pad, D in size): per Q block two warpgroup tiles in
    fragment order (`sm90_layouts.dq_tile_layout`: a tile is (k, warp, r8, c4, j, i) outer to
    inner, holding row 16 warp + 8 j + r8 and column 8 k + 2 c4 + i of the warpgroup's 64 rows x
    `dq_tile_cols`). One strided copy un-permutes and converts the whole Q blocks; a last
    partial block goes through a block-sized buffer."""
    import torch

    from .api import new_out

    b, hq, sq_pad, d = dq_acc.shape
    bm = config.block_m
    k, mb, whole = config.dq_tile_cols // 8, sq_pad // bm, seqlen_q // bm
    tiles = dq_acc.view(b, hq, mb, 2, k, 4, 8, 4, 2, 2)
    if bm == 128:  # warpgroup w holds rows 64 w + (0..63) of the block, every column
        src, split = tiles.permute(0, 1, 2, 3, 5, 8, 6, 4, 7, 9), (2, 4, 2, 8, k, 4, 2)
    else:  # warpgroup w holds the block's 64 rows, columns w D / 2 + (0..D / 2 - 1)
        src, split = tiles.permute(0, 1, 2, 5, 8, 6, 3, 4, 7, 9), (4, 2, 8, 2, k, 4, 2)
    dq = new_out((b, hq, seqlen_q, d), dtype, dq_acc.device)
    if whole:
        dq[:, :, :whole * bm].view(b, hq, whole, *split).copy_(src[:, :, :whole])
    if whole < mb:
        last = torch.empty((b, hq, 1, *split), dtype=dtype, device=dq_acc.device).copy_(src[:, :, whole:])
        dq[:, :, whole * bm:].copy_(last.view(b, hq, bm, d)[:, :, :seqlen_q - whole * bm])
    return dq


def _run_prepped(launch: _Launch, prep_fn, fn, dout, q, k, v, out, lse, heads_kv: int):
    """The TVM-FFI backward with the prep kernel, every decision made: dout, q, k, v and out
    with rows aligned as they are (`rows_aligned` returns them), not requiring grad, lse
    contiguous fp32. What `backward` runs on that path and `backward_plan` replays."""
    d_rows, lse2, dq_flat, dq_acc = _prep.run_prepped(prep_fn, dout, out, lse, launch.sq_pad, _acc_rows(launch))
    dk_h, dv_h = _dkv_buffers(launch, q)
    fn(q, k, v, dout, lse2, d_rows, dq_flat, dk_h, dv_h, launch.scale, launch.offset, launch.offset_lo, launch.group,
       launch.softcap, *_turns(launch, q))
    return _post(launch, dq_acc, dk_h, dv_h, q.dtype, heads_kv)


def backward_plan(dout, q, k, v, out, lse, problem, *, deterministic: bool = False):
    """The warm replay of `backward` for tensors of these layouts, or None: `replay(dout, q, k,
    v, out, lse) -> (dq, dk, dv)` for tensors with the same shapes, strides, dtypes and 16-byte
    alignment (the caller's plan signature fixes them), none requiring grad. It launches what
    `backward` launches for them, having decided once what `backward` decides per call (the
    problem's support and launch, the compiled functions, that no operand needs a copy). None
    where `backward` takes another path: no TVM-FFI, the deterministic or torch-prep path, an
    operand it would copy, an lse it would convert (not contiguous fp32)."""
    import functools

    import torch

    if deterministic or not tvm_ffi_available():
        return None
    _check_supported(problem)
    launch = _launch_for(problem, None)
    if not launch.prep or lse.dtype != torch.float32 or not lse.is_contiguous():
        return None
    if any(rows_aligned(t) is not t for t in (dout, q, k, v, out)):
        return None
    return functools.partial(_run_prepped, launch, _prep.prep_function(problem.head_dim, dout.dtype),
                             _tvm_build(launch.kernel_config), heads_kv=problem.heads_kv)


# ---- packed sequences (varlen) --------------------------------------------------------------------


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                    problem, offsets=None):
    """(dq (Tq, Hq, D), dk, dv (Tk, Hkv, D)) of the packed forward: q, out, dout (Tq, Hq, D), k, v
    (Tk, Hkv, D), lse (Hq, Tq) fp32 as the varlen forward returns it, int32 cu_seqlens (B + 1,) and
    max lengths already validated by the caller (`varlen.attention_varlen_backward`); causal
    alignment and window per sequence (`problem`: batch = number of sequences). Two launches: the
    dense backward's prep pass (`sm90_bwd_prep`) over the packed tensors viewed (1, H, T, D), whose
    D and lse2 rows run past each sequence into the next (the kernel masks them), then the backward
    (`FlashSm90BwdConfig.varlen`): a CTA per (key block of the longest sequence, query head,
    sequence), dQ summed in the prep's zeroed fp32 (Hq, Tq, D) accumulator; with GQA dK and dV come
    per query head in fp32 and are summed here. dq, dk, dv are new contiguous tensors of q's dtype,
    zero for rows of sequences with no key or no query. offsets: the validated cu_seqlens as the
    host read them (`varlen.HostOffsets`): the sequences are then launched the most work first
    (`sm90_flash.launch_order`), else in order."""
    import torch

    _check_supported(problem)
    if problem.seqused_k:
        raise ValueError("sm90_flash varlen backward: seqused_k is not taken (sm80_flash's varlen backward is)")
    if max_seqlen_q == 0 or max_seqlen_k == 0 or 0 in (q.shape[0], q.shape[1], k.shape[0], problem.batch):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    config = memo(_VARLEN_CONFIGS, problem, _varlen_config, problem)
    # Detached: DLPack export refuses tensors that require grad (detached aliases share storage).
    q, k, v, dout, out = (rows_aligned(t).detach() for t in (q, k, v, dout, out))
    return _varlen_run(config, _varlen_launcher(config), problem, dout, q, k, v, out, lse.detach(), cu_seqlens_q,
                       cu_seqlens_k, max_seqlen_k, offsets)


def varlen_backward_plan(dout, q, k, v, out, lse, problem):
    """The warm replay of `varlen_backward` for tensors of these layouts, or None:
    `replay(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, offsets) -> (dq,
    dk, dv)` for tensors with the same shapes, strides, dtypes and 16-byte alignment (the
    caller's plan signature fixes them), none requiring grad, and offsets the caller validated
    for them (`varlen.HostOffsets`). It launches what `varlen_backward` launches, having decided
    once what that decides per call. None where `varlen_backward` takes another path: no
    TVM-FFI, an empty problem, seqused_k, an operand it would copy."""
    import functools

    if not tvm_ffi_available() or problem.seqused_k or 0 in (q.shape[0], q.shape[1], k.shape[0], problem.batch,
                                                             problem.seqlen_q, problem.seqlen_k):
        return None
    _check_supported(problem)
    if any(rows_aligned(t) is not t for t in (dout, q, k, v, out)):
        return None
    config = memo(_VARLEN_CONFIGS, problem, _varlen_config, problem)
    return functools.partial(_varlen_run, config, _varlen_launcher(config), problem)


def _varlen_launcher(config: FlashSm90BwdConfig):
    """`launch(tensors, scalars, softcap, varlen_args)` of the packed backward's kernel: the
    TVM-FFI build of `config` on the torch tensors, else the DSL path (each tensor wrapped,
    `compile_kernel` per call, torch's current stream passed)."""
    if tvm_ffi_available():
        fn = _tvm_build(config)
        return lambda tensors, scalars, softcap, varlen_args: fn(*tensors, *scalars, softcap, *varlen_args)

    def launch(tensors, scalars, softcap, varlen_args):
        from cute_kernels.runtime import current_stream, from_torch

        wrap4 = lambda t: from_torch(t, assumed_align=16, leading_dim=3)  # noqa: E731
        wrap1 = lambda t, align=16: from_torch(t, assumed_align=align, leading_dim=0)  # noqa: E731
        args = (*map(wrap4, tensors[:4]), *map(wrap1, tensors[4:7]), *map(wrap4, tensors[7:]),
                cutlass.Float32(scalars[0]), *map(cutlass.Int32, scalars[1:]))
        tail = (None if softcap is None else cutlass.Float32(softcap), *(wrap1(t, 4) for t in varlen_args[:3]),
                *map(cutlass.Int32, varlen_args[3:]))
        stream = current_stream()
        fn = compile_kernel(_entry(config), *args, stream, *tail, key=("attention.sm90_flash_bwd", "varlen", config))
        fn(*args, stream, *tail)

    return launch


def _varlen_run(config: FlashSm90BwdConfig, launch, problem, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                max_seqlen_k: int, offsets):
    """What `varlen_backward` runs once it has decided: the prep pass, the kernel (`launch`, a
    `_varlen_launcher`), dQ's conversion and GQA's sums, on tensors that do not require grad,
    with rows aligned as they are."""
    import torch

    from .problem_checks import bottom_right_flag, varlen_window_scalars

    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    group = hq // hkv
    packed = lambda t: t.permute(1, 0, 2).unsqueeze(0)  # noqa: E731  (T, H, D) -> (1, H, T, D)
    # The dense backward's prep pass over the (1, H, T, D) views: lse2 (base 2, +inf for rows that
    # saw no key) and D, (Hq, Tq padded to whole Q blocks) each, and the zeroed (Hq, Tq, D) fp32
    # dQ accumulator, in one launch that reads dO and O once.
    writer = config.dq_writer
    d_rows, lse2, dq_flat, _ = _prep.preprocess_flat(packed(dout), packed(out), lse.unsqueeze(0), config.block_m,
                                                     tvm_ffi_available(), 0 if writer else None)
    if writer:  # the writer's tiles: every sequence's whole Q blocks, per head (`varlen_tile_rows`)
        tile_rows = varlen_tile_rows(tq, problem.batch, config.block_m)
        dq_flat = torch.zeros(hq * tile_rows * d, dtype=torch.float32, device=q.device)
    dkv_heads, dkv_dtype = (hq, torch.float32) if config.dkv_fp32 else (hkv, q.dtype)
    # Every key row is written: the grid covers the longest sequence's key blocks, and a block no
    # row sees stores zeros.
    dkv = torch.empty((2, tk, dkv_heads, d), dtype=dkv_dtype, device=q.device)
    window_left, window_right = varlen_window_scalars(problem)
    if offsets is not None:
        from .sm90_flash import _order_tensor

        order = _order_tensor(offsets, q.device)
    else:
        order = torch.arange(problem.batch, dtype=torch.int32, device=q.device)
    tensors = (packed(q), packed(k), packed(v), packed(dout), lse2, d_rows, dq_flat, packed(dkv[0]), packed(dkv[1]))
    launch(tensors, (problem.scale, window_right, -window_left, group), problem.softcap,
           (cu_seqlens_q, cu_seqlens_k, order, max_seqlen_k, bottom_right_flag(problem)))
    if writer:  # un-permuted to (rows, Hq, D), then each token's row gathered
        rows = dq_from_tiles(dq_flat.view(1, hq, tile_rows, d), config, tile_rows, q.dtype)[0].transpose(0, 1)
        dq = rows.index_select(0, _token_rows(cu_seqlens_q, tq, config.block_m, offsets))
    else:
        dq = torch.empty_like(q).copy_(dq_flat.view(hq, tq, d).transpose(0, 1))  # converted and transposed at once
    dk, dv = dkv[0], dkv[1]
    if config.dkv_fp32:
        dk = dk.view(tk, hkv, group, d).sum(2).to(q.dtype)
        dv = dv.view(tk, hkv, group, d).sum(2).to(q.dtype)
    return dq, dk, dv


def varlen_tile_rows(total_q: int, sequences: int, block_m: int) -> int:
    """Rows per head of the packed `dq_writer` accumulator: FlashAttention-3's padded offsets put
    sequence b's whole Q blocks from row (cu_q[b] + b block_m) // block_m * block_m, each
    sequence's blocks its own (the next sequence starts at least ceil(len_b / block_m) blocks
    later), all within ceil((Tq + B block_m) / block_m) blocks."""
    return -(-(total_q + sequences * block_m) // block_m) * block_m


def varlen_token_rows(cu_seqlens_q, total_q: int, block_m: int):
    """Each packed query row's row in the writer's accumulator (`varlen_tile_rows`), int64 on
    the offsets' device, computed there (no host read)."""
    import torch

    cu = cu_seqlens_q.long()
    n = cu.numel() - 1
    seq = torch.repeat_interleave(torch.arange(n, device=cu.device), cu[1:] - cu[:-1], output_size=total_q)
    first = (cu[:-1] + torch.arange(n, device=cu.device) * block_m) // block_m * block_m
    return torch.arange(total_q, device=cu.device) - cu[seq] + first[seq]


# (offsets, block_m, device) -> varlen_token_rows: a model's layers pass the same batch.
_TOKEN_ROWS = WarmCache("attention.sm90_flash_bwd.varlen_token_rows", 64)


def _token_rows(cu_seqlens_q, total_q: int, block_m: int, offsets):
    """`varlen_token_rows`, kept per batch where the host read its offsets (`varlen.HostOffsets`),
    so the layers of a step after the first launch nothing for it."""
    if offsets is None:
        return varlen_token_rows(cu_seqlens_q, total_q, block_m)
    from cute_kernels.runtime.lasting import lasting

    return memo(_TOKEN_ROWS, (offsets, block_m, cu_seqlens_q.device), lasting, cu_seqlens_q.device,
                varlen_token_rows, cu_seqlens_q, total_q, block_m)


# problem -> the varlen config (bounded, as `_LAUNCHES`: problems vary with every batch's lengths).
_VARLEN_CONFIGS = WarmCache("attention.sm90_flash_bwd.varlen_configs", _MAX_LAUNCHES)


def _varlen_config(problem) -> FlashSm90BwdConfig:
    """The packed backward's config of `problem`: its mask flags and features; GQA's dK, dV as
    fp32 per query head (no `gqa_loop` for varlen)."""
    upper, local = mask_flags(problem)
    return bwd_config_for(problem.head_dim, str(problem.dtype).removeprefix("torch."), upper,
                          dkv_fp32=problem.heads_q > problem.heads_kv, local=local,
                          softcap=problem.softcap is not None, varlen=True)
