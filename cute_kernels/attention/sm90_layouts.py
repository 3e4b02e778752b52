"""The static shape of the `sm90_flash` forward, and the register views it relies on.

Pure Python (`cute_kernels.layouts` only; neither the DSL nor torch is imported here), so the
tile arithmetic and the layout derivations are checked on the CPU.

`FlashSm90Config`: one compiled kernel. A CTA is three warpgroups: warpgroup 0 produces (one
warp issues the TMA loads), warpgroups 1 and 2 consume, each owning 64 of the CTA's
`block_m` = 128 query rows (192 with a third consumer, `consumer_warpgroups=3`); K/V blocks of
`block_n` rows flow through `stages` smem slots.

The register views (all index maps over this thread's registers; nothing moves):

- `accumulator_value_layout(n)`: the wgmma m64nN accumulator's value mode, (2, 2, N/8) ->
  offset (m + 64 n) in the warpgroup's 64 x N tile (from `layouts.atoms_sm90.c_layout`).
- `p_as_a_layout(n)`: the accumulator S (64 x n), converted to 16 bits, re-viewed as the A
  operand of `n / 16` m64k16 wgmma steps (RS form): ((2, 2, 2), 1, n / 16) -> index into the
  accumulator fragment ((2, 2, N/8), 1, 1). Derived, not assumed: it is
  left_inverse(C values) o (A values, k step), see `derive_p_as_a`.
- `mn_view_layout(n)`: the accumulator fragment as (rows, columns) of this thread's share:
  rows (2,) = the two rows 8 apart, columns (2, N/8) = adjacent pairs every 8 columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from cute_kernels.layouts import Layout, composition, left_inverse

__all__ = ["FlashSm90Config", "config_for", "short_rows", "HEAD_DIMS", "BLOCK_M", "accumulator_value_layout",
           "a_value_layout", "derive_p_as_a", "p_as_a_layout", "mn_view_layout", "num_m_blocks",
           "SMEM_LIMIT", "dq_tile_layout"]

HEAD_DIMS = (64, 96, 128, 192, 256)
_DTYPES = ("float16", "bfloat16")
BLOCK_M = 128  # two consumer warpgroups x 64 rows (one wgmma M each)
SMEM_LIMIT = 227 * 1024  # sm_90's opt-in dynamic shared memory per block
_REGS = 65536  # 32-bit registers per SM


@dataclass(frozen=True)
class FlashSm90Config:
    """The static shape of one compiled `sm90_flash` kernel.

    head_dim: D of Q, K and V (a multiple of 16 in [16, 256]); dtype: "float16" | "bfloat16";
    causal: whether the causal diagonal is tested (its alignment is a runtime column offset);
    block_n: K/V rows per step (a multiple of 16 up to 256: the N of S = Q K^T and the K of
    O += P V); stages: smem slots of each of the K and V pipelines; pingpong: the two consumer
    warpgroups take turns issuing their GEMMs (named barriers), so one's softmax runs under the
    other's tensor-core work; producer_regs / consumer_regs: the setmaxnreg budgets;
    k_lead: the producer loads in the consumers' order of use (K of the first block before Q,
    then K of block n before V of block n + 1, since S of block n is issued together with P V
    of block n + 1) rather than K and V of one block together; lpt: the grid is one dimension
    walked longest-first (`block_info.lpt_tile`: groups of heads whose K/V fit L2, last Q block
    first) rather than (Q blocks, heads, batch); consumer_warpgroups: 2 or 3 consumers of 64
    rows each (block_m = 128 or 192), taking turns in a ring when `pingpong`. Three need the
    budgets cut to 160 (+ 32 for the producer): at D = 64 that holds block_n up to 128 without
    spills since P is converted in register pairs (`sm90_softmax.to_16bit`).
    local: a sliding window's left bound is tested too (j >= i + offset_lo, a runtime value):
    K/V blocks below the first row's first key are skipped and every visited block is masked.
    rescale_threshold: 0 rescales O by each block's exact max change; t > 0 keeps a row's
    running max until a block raises it by more than t (log2 units of the scaled scores, so P
    stays below 2^t) and skips O's rescale whenever no row of the warp moved (FA4's
    conditional rescale: the same softmax, P merely runs against a stale max).
    rescale_early: O is rescaled by block n + 1's factors after S_n's GEMM is issued and before
    O += P_{n+1} V (under the tensor cores' work on S), rather than after that GEMM retired.
    exp2_poly: of every 4 register pairs of a score row, how many (0 to 3) take their
    exponential from a degree-3 polynomial on the FMA units (`sm90_softmax.exp2_poly`) instead
    of the MUFU (16 results per clock and SM).
    The last three are off in `config_for`: each measured slower on the suite's cases (the
    `sm90_flash` docstring has the figures); they stay as tested options for other shapes.
    softcap: scores are soft-capped (`softmax.apply_softcap`; the cap is a runtime value);
    sinks: a per-head sink logit joins each row's denominator (`softmax.OnlineSoftmax.finalize`);
    varlen: the packed launch (`sm90_flash`'s varlen docstring; never `lpt`).
    """

    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    block_n: int = 128
    stages: int = 2
    pingpong: bool = True
    producer_regs: int = 24
    consumer_regs: int = 240
    k_lead: bool = True
    lpt: bool = False
    consumer_warpgroups: int = 2
    local: bool = False
    rescale_threshold: float = 0.0
    rescale_early: bool = False
    exp2_poly: int = 0
    softcap: bool = False
    sinks: bool = False
    varlen: bool = False

    def validate(self) -> "FlashSm90Config":
        d = self.head_dim
        if not isinstance(d, int) or d < 16 or d > 256 or d % 16:
            raise ValueError(f"FlashSm90Config.head_dim must be a multiple of 16 in [16, 256], got {d!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"FlashSm90Config.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        for name in ("causal", "pingpong", "k_lead", "lpt", "local", "rescale_early", "softcap", "sinks", "varlen"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FlashSm90Config.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.block_n, int) or self.block_n % 16 or not 16 <= self.block_n <= 256:
            raise ValueError(f"FlashSm90Config.block_n must be a multiple of 16 in [16, 256], got {self.block_n!r}")
        t = self.rescale_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 15.0:
            # P <= 2^t is converted to 16 bits: fp16's largest finite value is 65504 < 2^16.
            raise ValueError(f"FlashSm90Config.rescale_threshold must be a number in [0, 15], got {t!r}")
        if isinstance(self.exp2_poly, bool) or self.exp2_poly not in (0, 1, 2, 3):
            raise ValueError(f"FlashSm90Config.exp2_poly must be 0, 1, 2 or 3 (pairs of every 4), got {self.exp2_poly!r}")
        if self.varlen and self.lpt:
            raise ValueError("FlashSm90Config: the varlen launch orders its own work (lpt must be False)")
        if self.stages not in (1, 2, 3, 4):
            raise ValueError(f"FlashSm90Config.stages must be 1 to 4, got {self.stages!r}")
        if self.consumer_warpgroups not in (2, 3):
            raise ValueError(f"FlashSm90Config.consumer_warpgroups must be 2 or 3, got {self.consumer_warpgroups!r}")
        for name in ("producer_regs", "consumer_regs"):
            r = getattr(self, name)
            if not isinstance(r, int) or r % 8 or not 24 <= r <= 256:
                raise ValueError(f"FlashSm90Config.{name} must be a multiple of 8 in [24, 256], got {r!r}")
        wgs = self.consumer_warpgroups
        if 128 * (self.producer_regs + wgs * self.consumer_regs) > _REGS:
            raise ValueError(
                f"setmaxnreg budgets {self.producer_regs} + {wgs} x {self.consumer_regs} per thread exceed the "
                f"{_REGS} registers of an SM for {wgs + 1} warpgroups")
        if self.accumulator_regs > self.consumer_regs - 32:
            raise ValueError(
                f"the fp32 accumulators S and O and the 16-bit P take {self.accumulator_regs} registers per "
                f"consumer thread, too close to its budget {self.consumer_regs}: lower block_n")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"FlashSm90Config needs {self.smem_bytes} bytes of shared memory (Q + {self.stages} "
                             f"stages of K and V), over sm_90's {SMEM_LIMIT}: lower block_n or stages")
        return self

    @property
    def block_m(self) -> int:
        return 64 * self.consumer_warpgroups

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumer_warpgroups)

    @property
    def accumulator_regs(self) -> int:
        """Registers per consumer thread held across the main loop: S (64 x block_n fp32), O
        (64 x D fp32) and P (64 x block_n 16-bit) over 128 threads."""
        return (64 * self.block_n + 64 * self.head_dim) // 128 + 64 * self.block_n // 256

    @property
    def smem_bytes(self) -> int:
        """Q (also O's staging buffer) plus `stages` slots of K and of V, 16-bit elements, plus
        the mbarriers (8 bytes each: full and empty per slot, Q's pair)."""
        return 2 * self.head_dim * (self.block_m + 2 * self.stages * self.block_n) + 8 * (2 + 4 * self.stages) + 1024

    @property
    def tx_bytes_q(self) -> int:
        return 2 * self.block_m * self.head_dim

    @property
    def tx_bytes_kv(self) -> int:
        return 2 * self.block_n * self.head_dim


# 128 x 128 tiles run at this fraction of 192 x 128's rate at D <= 64 (measured at B8 H16 S2048:
# 0.81x against 0.94x FA4), so they win only where 192-row tiles pad Q much more
_ROWS_128_RATE = 0.86


def short_rows(seqlen_q: int, head_dim: int) -> bool:
    """Whether a dense problem of `seqlen_q` query rows at `head_dim` takes 128-row tiles
    (`config_for`'s `short`) where the head dim would give it 192: when whole 192-row tiles
    would pad Q by more than the 128-row tile's slower rate costs. ViT-B/16's 197 rows make
    two 192-row tiles (51% of the rows real) against two 128-row ones (77%): measured 0.069
    against 0.081 ms at B64 H12 D64 (H200); EVA-02's 257 rows are 384 either way and keep 192
    (0.099 against 0.114 ms); at 577 rows the two measured within 1%, at 1024 192 won by 6%."""
    if head_dim > 64 or seqlen_q <= 0:
        return False
    return -(-seqlen_q // 128) * 128 < _ROWS_128_RATE * (-(-seqlen_q // 192) * 192)


def config_for(head_dim: int, dtype: str, causal: bool, local: bool = False, softcap: bool = False,
               sinks: bool = False, varlen: bool = False, short: bool = False) -> FlashSm90Config:
    """The tile for a head dim: 192 x 128 with three consumer warpgroups of 160 registers up to
    D = 64 (FA3's tile; measured 0.94x FA4 against 0.81x for 128 x 128 at B8 H16 S2048; with
    `short`, `short_rows`' verdict for the problem's Q length, 128 x 128), 128 x
    128 up to D = 128, 128 x 96 up to 192 and 128 x 80 above (shared memory: Q plus two slots of
    K and V must fit 227 KiB, and the registers S + O + P must leave room in the consumers'
    240). `causal`: the upper diagonal is
    tested (`problem_checks.mask_flags`); `local`: the window's lower one too. Causal problems
    without a left bound launch longest-first (`lpt`); with one, every Q block's work is about
    the window's width, so the plain grid serves. `softcap` takes 96-key blocks up to D = 64
    (128 spill there); otherwise the features keep the tile."""
    roles = {}
    if head_dim <= 64 and short:
        block_n = 128
    elif head_dim <= 64:
        # A soft cap's tanh needs registers the three 160-register consumers lack at 128 keys.
        block_n = 96 if softcap else 128
        roles = {"consumer_warpgroups": 3, "producer_regs": 32, "consumer_regs": 160}
    elif head_dim <= 128:
        block_n = 128
    elif head_dim <= 192:
        block_n = 96
    else:
        block_n = 80
    return FlashSm90Config(head_dim=head_dim, dtype=dtype, causal=causal, block_n=block_n,
                           lpt=causal and not local and not varlen, local=local, softcap=softcap, sinks=sinks,
                           varlen=varlen, **roles).validate()


def num_m_blocks(seqlen_q: int, block_m: int = BLOCK_M) -> int:
    """Q tiles of one (batch, head): the grid's x extent (without `lpt`)."""
    return (seqlen_q + block_m - 1) // block_m


# ---- register views --------------------------------------------------------------------------------


def _c_values(n: int) -> Layout:
    from cute_kernels.layouts.atoms_sm90 import c_layout

    return c_layout(n)[1]


def accumulator_value_layout(n: int) -> Layout:
    """The value mode of the m64nN accumulator TV layout: (2, 2, N/8) -> m + 64 n (N a
    multiple of 8, as wgmma's)."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"the accumulator needs N a multiple of 8 in [8, 256], got {n}")
    return _c_values(n)


def dq_tile_layout(n: int) -> Layout:
    """The m64nN accumulator of a warpgroup laid out flat in fragment order, as the backward's
    `dq_writer` stages dQ_blk and keeps its fp32 accumulator: float f = (k * 128 + t) * 4 + e
    holds value 4 k + e of thread t, so ((e (2, 2), t (4, 8, 4), k (N/8)) -> m + 64 n. Each
    thread's 4 values of a column block (rows r, r + 8 x two adjacent columns) are one 16-byte
    store and a warp's stores are 512 contiguous bytes (no bank conflicts), and the tile is one
    contiguous bulk reduction; the host undoes the order when it converts the accumulator."""
    from cute_kernels.layouts.atoms_sm90 import c_layout

    acc = accumulator_value_layout(n)
    threads = c_layout(n)[0]
    return Layout((acc.shape[:2], threads.shape, n // 8), (acc.stride[:2], threads.stride, acc.stride[2]))


def a_value_layout(n: int) -> Layout:
    """The register A of `n / 16` m64k16 steps side by side: ((2, 2, 2), k step) -> m + 64 k,
    k counted over the n columns (step kb starts at column 16 kb)."""
    from cute_kernels.layouts.atoms_sm90 import rs_a_layout

    if n % 16 or not 16 <= n <= 256:
        raise ValueError(f"the re-view needs N a multiple of 16 in [16, 256] (whole k16 steps), got {n}")

    a = rs_a_layout(16)[1]
    return Layout((a.shape, n // 16), (a.stride, 64 * 16))


def derive_p_as_a(n: int) -> Layout:
    """((2, 2, 2), k step) -> index of the accumulator value holding that A value.

    For every thread the thread modes of the two TV layouts agree (the same (4, 8, 4) lanes with
    the same row/column offsets), so A value (v, kb) lies at accumulator offset a(v, kb), and the
    accumulator value there is left_inverse(C values)(a(v, kb)). Post-condition (tested): for all
    threads t, C(t, g(v, kb)) == A(t, v) + 64 * 16 * kb.
    """
    return composition(left_inverse(accumulator_value_layout(n)), a_value_layout(n))


def p_as_a_layout(n: int) -> Layout:
    """`derive_p_as_a(n)` with the (size 1) MMA_M mode inserted: ((2, 2, 2), 1, n / 16) ->
    index into a fragment ((2, 2, N/8), 1, 1). Compose the fragment's layout with it."""
    g = derive_p_as_a(n)
    return Layout((g.shape[0], 1, g.shape[1]), (g.stride[0], 0, g.stride[1]))


def mn_view_layout(n: int) -> Layout:
    """(rows (2,), columns (2, N/8)) -> index into a fragment ((2, 2, N/8), 1, 1): row r of this
    thread is accumulator value mode 1 (8 rows apart), columns are mode 0 (adjacent) then mode 2
    (every 8 columns). Post-condition: increasing row / column index = increasing tile row /
    column (tested against `accumulator_value_layout`)."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"N must be a multiple of 8 in [8, 256], got {n}")
    return Layout((2, (2, n // 8)), (2, (1, 4)))
