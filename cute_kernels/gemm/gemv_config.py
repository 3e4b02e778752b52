"""Configs, layouts and host-side choices of the skinny GEMM (`gemm.gemv`), in pure Python.

The problem, in kernel order (as the sm90 rungs: rows first, K second, batch last):

    C (S, R, L) = alpha * A (S, K, L) . B (R, K, L)^T      S <= 16: A small, B big

A is the small operand (the activations of a decode step, or a classifier's weight when the
roles are swapped), B the big one whose bytes set the time. Nothing here imports torch or the
DSL; the kernel converts the layouts below with `runtime.to_cute` while tracing.

How the work maps onto `mma.sync.m16n8k16` (atom SM80_16x8x16_F32BF16BF16F32_TN):

- A is the MMA's A operand (16 x 16: S on M, rows s >= S clamped, or zero above 8 when
  `s16` is off); B is the MMA's B operand (8 x 16: eight rows of B on N). So one lane holds,
  per k16 step, rows g and g + 8 of A and row g of B (g = lane // 4), each at the four logical
  k of its quad position q = lane % 4: {2q, 2q+1, 2q+8, 2q+9}.
- A dot product does not care about the order of K, so a lane's k are chosen to be
  contiguous in memory: within each 32-wide chunk of K, lane q owns 8 "k slots" w that map to
  physical k by `k_slot_layout(k_run)`: runs of `k_run` contiguous k (one vector load of up to
  16 bytes each). Slot w feeds k16 step w // 4 at logical k 2q + (w % 2) + 8 ((w // 2) % 2).
  A and B use the same slot map, so every product pairs A[s, k] with B[r, k] for the same k.
- With B K-major, one 16-byte load of row g fills both k16 steps' B fragments (2 registers
  each) with no data movement. With B R-major (a row-major (K, N) right operand), a load reads
  `r_vec` consecutive rows at one k; lane g owns runs of r_vec rows (`b_row_layout`), and
  pairs of k are interleaved into the fragment registers (PRMT) before the MMA.
- A warp owns `tiles` n8 tiles (8 * tiles rows of B) and walks its share of K in stages of
  `chunks` 32-wide chunks; `warps` warps of a CTA split the CTA's K range stage by stage, and
  `cluster_k` CTAs of a cluster split K further. Partials are summed in a fixed order (warps
  through shared memory, `partial_smem_layout`; CTAs through distributed shared memory), so
  the result is deterministic.

Rows past R (and rows of A past S) are clamped to the last valid one: a row only ever reaches
its own output, which is not stored. The K tail (K not a multiple of the stage) is read with
zero fill. Vectors never straddle the end of a mode: `pick_vector` picks widths that divide
the contiguous extent, every other stride and the base address.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cute_kernels.gemm.ampere_config import pick_vector
from cute_kernels.layouts import Layout

__all__ = [
    "GemvConfig",
    "MAX_SMALL",
    "k_slot_layout",
    "b_row_layout",
    "a_fragment_slots",
    "b_staging_layout",
    "a_staging_layout",
    "partial_smem_layout",
    "output_coord",
    "operand_contract",
    "config_fits",
    "pick_config",
    "streams_whole_sectors",
    "operand_plan",
    "OperandPlan",
    "choose_role",
]

MAX_SMALL = 16  # the MMA's M: the largest small side the kernel takes
CHUNK_K = 32  # K per chunk: 8 slots x 4 quad positions
SLOTS = 8  # k slots per lane per chunk (two k16 steps of 4)
_DTYPES = ("float16", "bfloat16")
_OUT_DTYPES = ("float16", "bfloat16", "float32")
_BIG_MAJORS = ("k", "r")
_SMALL_MAJORS = ("k", "s")
_OUT_MAJORS = ("r", "s")
_SMEM_LIMIT = 227 * 1024


def _pow2(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and x & (x - 1) == 0


# ---- layouts -----------------------------------------------------------------------------------

def k_slot_layout(k_run: int) -> Layout:
    """(q, w) -> k offset inside a 32-wide chunk: quad position q (lane % 4) in [0, 4), slot w
    in [0, 8). Slots come in runs of `k_run` contiguous k (one vector load); run i of lane q
    starts at k_run * q + 4 * k_run * i, so the four lanes of a row read 4 * k_run contiguous k.
    Post-condition: a bijection of [0, 4) x [0, 8) onto [0, 32)."""
    if k_run not in (1, 2, 4, 8):
        raise ValueError(f"k_run must be 1, 2, 4 or 8, got {k_run!r}")
    return Layout((4, (k_run, SLOTS // k_run)), (k_run, (1, 4 * k_run)))


def b_row_layout(tiles: int, r_vec: int = 1) -> Layout:
    """(n, t) -> row offset of B inside a warp's 8 * tiles rows: MMA row n (= lane // 4, the
    row a lane loads) of n8 tile t. r_vec = 1 (B K-major): tile t is rows 8t .. 8t + 7. r_vec > 1
    (B R-major, a load reads r_vec consecutive rows): lane n owns runs of r_vec rows, tile t
    being the (t % r_vec)-th row of run t // r_vec. Post-condition: a bijection onto
    [0, 8 * tiles)."""
    if not _pow2(r_vec) or r_vec > 8 or tiles % r_vec:
        raise ValueError(f"r_vec must be a power of two <= 8 dividing tiles ({tiles}), got {r_vec!r}")
    if r_vec == 1:
        return Layout((8, tiles), (1, 8))
    return Layout((8, (r_vec, tiles // r_vec)), (r_vec, (1, 8 * r_vec)))


def a_fragment_slots() -> Layout:
    """v -> (slot offset w - 4j, row half h) of value v of the MMA's A fragment in k16 step j,
    as the index w' + 8 h (w' in [0, 4)): v = e + 2h + 4hh holds row g + 8h at slot
    4j + 2hh + e (the atom's A layout ((4,8),(2,2,2)):((32,1),(16,8,128)) read with the slot
    map of `k_slot_layout`). The B fragment needs no such table: its value v is slot 4j + v."""
    return Layout((2, 2, 2), (1, 8, 2))


def b_staging_layout(tiles: int, chunks: int, big_major: str, k_run: int, r_vec: int) -> Layout:
    """(slot, tile, chunk) -> register index of the B values a lane loads for one stage.

    K-major B: a load fills k_run consecutive slots of one tile, so slots are innermost, split
    as (k_run, 8 / k_run) (mode (None, i) of slot is run i). R-major B: a load fills r_vec
    consecutive tiles at one slot, so tiles are innermost, split as (r_vec, tiles / r_vec).
    Either way the B fragment of k16 step j and tile t is slots 4j .. 4j + 3 of tile t."""
    if big_major == "k":
        return Layout(((k_run, SLOTS // k_run), tiles, chunks), ((1, k_run), SLOTS, SLOTS * tiles))
    return Layout((SLOTS, (r_vec, tiles // r_vec), chunks), (tiles, (1, r_vec), SLOTS * tiles))


def a_staging_layout(chunks: int, k_run: int) -> Layout:
    """(slot, h, chunk) -> register index of the A values a lane loads for one stage (rows g + 8h;
    slots split as in `b_staging_layout`'s K-major case)."""
    return Layout(((k_run, SLOTS // k_run), 2, chunks), ((1, k_run), SLOTS, 2 * SLOTS))


def partial_smem_layout(rows: int, s_rows: int, warps: int) -> Layout:
    """(r, s, warp) -> fp32 word offset of the per-warp partial sums. r is contiguous, so the
    epilogue reads consecutive rows with consecutive threads; the s stride is an odd multiple of
    8 words, so the accumulator pairs a warp writes (s = lane // 4 (+ 8), two rows at 2 (lane % 4))
    fill 32 distinct banks in two wavefronts."""
    s_stride = rows if (rows // 8) % 2 else rows + 8
    return Layout((rows, s_rows, warps), (1, s_stride, s_stride * s_rows))


def output_coord(idx, rows: int, s_rows: int, out_major: str):
    """(row, s) of output element `idx` of a CTA (0 <= idx < rows * s_rows): consecutive indices
    walk the output's coalescing mode, rows for out_major "r", the small side for "s". Works on
    Python ints and on the kernel's DSL integers alike."""
    if out_major == "r":
        return idx % rows, idx // rows
    return idx // s_rows, idx % s_rows


# ---- config ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemvConfig:
    """One compiled variant of the skinny GEMM (see the module docstring for the mapping).

    tiles: n8 tiles of B rows per warp (a CTA owns 8 * tiles rows).
    chunks: 32-wide K chunks per stage (the loads one warp issues before its MMAs).
    warps: warps per CTA; they split the CTA's K range stage by stage.
    cluster_k: CTAs per cluster splitting K (1: no cluster).
    big_major: "k" (B (R, K) contiguous along K, nn.Linear's weight) or "r" (along R).
    small_major: "k" (A contiguous along K, vector loads) or "s" (any strides, element loads).
    out_major: "r" or "s": the mode consecutive threads store along (either is correct for
        any strides; the one with unit stride coalesces).
    k_run: contiguous k per slot run (the K-major operands' vector width, elements).
    r_vec: rows per load of an R-major B (1 for K-major B).
    s16: the small side exceeds 8 (rows 8-15 of the MMA's A carry data).
    prefetch: double-buffer the staging registers, so a warp issues stage i + 1's loads before
        stage i's MMAs (twice the bytes in flight per warp, more registers).
    stream_b: B's loads bypass L1 (L1::no_allocate), with an L2 prefetch hint of `l2_prefetch`
        bytes (0, 64, 128, 256); False: plain cached loads.
    dtype / out_dtype: "bfloat16" | "float16" inputs; bf16 / fp16 / fp32 output.
    """

    tiles: int = 8
    chunks: int = 1
    warps: int = 4
    cluster_k: int = 1
    big_major: str = "k"
    small_major: str = "k"
    out_major: str = "r"
    k_run: int = 8
    r_vec: int = 1
    s16: bool = True
    prefetch: bool = False
    stream_b: bool = True
    l2_prefetch: int = 0
    dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"

    @property
    def rows(self) -> int:
        """Rows of B (and of the output) one CTA owns."""
        return 8 * self.tiles

    @property
    def stage_k(self) -> int:
        return CHUNK_K * self.chunks

    @property
    def s_rows(self) -> int:
        """Rows of the small side the partials keep (8 or 16)."""
        return 16 if self.s16 else 8

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def smem_bytes(self) -> int:
        return partial_smem_layout(self.rows, self.s_rows, self.warps).cosize() * 4

    def with_(self, **kw) -> "GemvConfig":
        return replace(self, **kw)

    def validate(self) -> "GemvConfig":
        """Raise ValueError naming the first broken rule; return self."""
        name = type(self).__name__
        for f, allowed in (("tiles", (1, 2, 4, 8, 16)), ("chunks", (1, 2, 4)), ("warps", (1, 2, 4, 8, 16)),
                           ("cluster_k", (1, 2, 4, 8)), ("k_run", (1, 2, 4, 8)), ("r_vec", (1, 2, 4, 8)),
                           ("l2_prefetch", (0, 64, 128, 256))):
            v = getattr(self, f)
            if isinstance(v, bool) or v not in allowed:
                raise ValueError(f"{name}.{f} must be one of {allowed}, got {v!r}")
        for f, allowed in (("big_major", _BIG_MAJORS), ("small_major", _SMALL_MAJORS), ("out_major", _OUT_MAJORS),
                           ("dtype", _DTYPES), ("out_dtype", _OUT_DTYPES)):
            if getattr(self, f) not in allowed:
                raise ValueError(f"{name}.{f} must be one of {allowed}, got {getattr(self, f)!r}")
        for f in ("s16", "stream_b", "prefetch"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"{name}.{f} must be a bool, got {getattr(self, f)!r}")
        if self.big_major == "k" and self.r_vec != 1:
            raise ValueError(f"{name}: r_vec {self.r_vec} needs big_major 'r' (a K-major B loads along K)")
        if self.tiles % self.r_vec:
            raise ValueError(f"{name}: tiles {self.tiles} must be a multiple of r_vec {self.r_vec} "
                             "(each lane owns whole runs of r_vec rows)")
        if self.threads > 1024:
            raise ValueError(f"{name}: {self.warps} warps = {self.threads} threads > 1024")
        if self.smem_bytes() > _SMEM_LIMIT:
            raise ValueError(f"{name}: {self.smem_bytes()} bytes of partials exceed the {_SMEM_LIMIT} an SM offers")
        return self

    @property
    def tag(self) -> str:
        """A short name for tables and variant keys."""
        return (f"t{self.tiles}c{self.chunks}w{self.warps}k{self.cluster_k}_{self.big_major}{self.small_major}"
                f"{self.out_major}_run{self.k_run}v{self.r_vec}{'_s16' if self.s16 else '_s8'}"
                f"{'_pre' if self.prefetch else ''}{'' if self.stream_b else '_l1'}"
                f"{f'_pf{self.l2_prefetch}' if self.l2_prefetch else ''}")


def operand_contract(config: GemvConfig, role: str) -> dict:
    """What a build assumes of the caller's a (L, M, K) and b (L, K, N): per tensor (unit-stride
    mode, vector elements), the unit-stride mode None for an operand read element by element
    (any strides). The vector read operand's base is vector-aligned, every other stride and its
    contiguous extent are multiples of the vector (a vector never straddles a mode's end).
    role "m": a is the small operand, b the big one; "n" the other way round."""
    small = (2 if role == "m" else 1, config.k_run) if config.small_major == "k" else (None, 1)
    if config.big_major == "k":
        big = (1 if role == "m" else 2, config.k_run)
    else:
        big = (2 if role == "m" else 1, config.r_vec)
    return {"a": small, "b": big} if role == "m" else {"a": big, "b": small}


# ---- host-side choices (plain ints: testable without a GPU) ------------------------------------

def choose_role(m: int, n: int) -> str | None:
    """Which side of an (M, N) output is the small one: "m" (A = a, M <= 16), "n" (the roles
    swapped: A = b^T, N <= 16), or None when neither is at most 16. With both small, the
    smaller (M on ties)."""
    if m <= MAX_SMALL and (n > MAX_SMALL or m <= n):
        return "m"
    if n <= MAX_SMALL:
        return "n"
    return None


@dataclass(frozen=True)
class OperandPlan:
    """How the kernel reads one operand: its unit-stride mode ("k", "r" / "s") and the widest
    vector (elements) that mode allows, or `reason` why it cannot be read at all."""

    major: str | None
    vector: int
    reason: str | None = None


def _others(shape, stride, lead) -> list:
    """Strides of the modes other than `lead` that a vector must stay aligned to (modes of
    extent 1 and broadcast modes are never stepped along)."""
    return [s for i, (e, s) in enumerate(zip(shape, stride)) if i != lead and e > 1 and s != 0]


def operand_plan(shape, stride, data_ptr: int, elem_bytes: int, role: str) -> OperandPlan:
    """The read plan of a kernel-order operand (rows, K, L) (`role` "big" or "small").

    The big operand must have a unit-stride mode (K: "k", rows: "r"); K is preferred, then the
    mode with the wider vector. The small one is read along K with vectors when K has unit
    stride, else element by element with any strides ("s"). A mode of extent 1 counts as unit
    stride (the caller views it so)."""
    units = [i for i in (1, 0) if stride[i] == 1 or shape[i] == 1]
    if role == "small":
        if 1 in units:
            return OperandPlan("k", pick_vector(shape[1], _others(shape, stride, 1), data_ptr, elem_bytes, 8))
        return OperandPlan("s", 1)
    if not units:
        return OperandPlan(None, 0, f"strides {tuple(stride)} for shape {tuple(shape)}: neither K nor the rows "
                                    "have unit stride")
    best = None
    for i in units:
        v = pick_vector(shape[i], _others(shape, stride, i), data_ptr, elem_bytes, 8)
        if best is None or v > best[1]:
            best = (i, v)
    i, v = best
    return OperandPlan("k" if i == 1 else "r", v)


def config_fits(config: GemvConfig, fields: dict) -> str | None:
    """Why `config` cannot run a problem whose read plan is `fields` (GemvConfig fields: majors,
    widest vectors, dtypes, s16), or None. A config may read narrower than the plan allows
    (a k_run or r_vec dividing the plan's, element loads of a K-major A, 16 MMA rows for a small
    side of at most 8) and store along either mode; everything else must match."""
    problems = []
    for f in ("big_major", "dtype", "out_dtype"):
        if getattr(config, f) != fields[f]:
            problems.append(f"{f} {getattr(config, f)!r} (the problem needs {fields[f]!r})")
    if config.small_major == "k" and fields["small_major"] != "k":
        problems.append("small_major 'k' (the small operand has no unit stride along K: 's')")
    for f in ("k_run", "r_vec"):
        if fields[f] % getattr(config, f):
            problems.append(f"{f} {getattr(config, f)} (must divide the widest vector the operands allow, {fields[f]})")
    if fields["s16"] and not config.s16:
        problems.append("s16 False (the small side exceeds 8)")
    return "; ".join(problems) or None


# ---- the heuristic -----------------------------------------------------------------------------

SMS = 132  # H100 SXM / H200
_WARPS_PER_SM = 16  # the resident warps a config aims to fill each SM with
# The fewest warps a CTA splits its K range over, where K has two stages per warp: a CTA's warps
# read consecutive 64-byte chunks of its rows together. One warp alone reads 64 bytes of each of
# its rows per stage; on the LM heads (R 128k-152k rows, K 2k-8k: blocks enough to fill the GPU
# with one warp each) that ran at 1.7-1.8 TB/s, 0.65x cuBLAS, where four-warp CTAs over rows as
# long reached 2.2-2.5 TB/s (gemm_shapes, H100, 2026-12-05); with four warps a CTA the LM heads
# run at 0.94-0.99x cuBLAS (same device, same day).
_MIN_WARPS = 4


def pick_config(s: int, r: int, k: int, l: int = 1, *, big_major: str = "k", small_major: str = "k",
                out_major: str = "r", k_run: int = 8, r_vec: int = 1, dtype: str = "bfloat16",
                out_dtype: str = "bfloat16", sms: int = SMS, min_warps: int = _MIN_WARPS) -> GemvConfig:
    """The config for an (S, R, K, L) problem with these read plans.

    A warp streams 8 * tiles rows by 32 * chunks k per stage (4 KB of bf16 at 8 x 1). The
    heuristic then
    - uses 4 tiles for a K-major B read in 2- or 4-byte vectors (the registers of 8);
    - shrinks the tiles while a CTA would hold mostly clamped rows (R < 8 * tiles), and while
      the row blocks cannot fill `sms` SMs even with K split (short K);
    - lets B bypass L1 where its loads read whole sectors (`streams_whole_sectors`);
    - splits K into about `_WARPS_PER_SM` warps per SM (two stages per warp where K allows):
      first over `cluster_k` CTAs (up to 8) while the row blocks leave SMs idle, then over
      `warps` warps of a CTA (up to 8), and over at least `min_warps` warps where K allows,
      even past one wave (many rows: the LM heads).
    Post-condition: the result validates.
    """
    min_tiles = max(1, r_vec)
    # element-wide K vectors land one per register before they are paired: half the tiles keep
    # a stage's registers (and the warps per SM) where 16-byte loads have them
    tiles = 4 if big_major == "k" and k_run <= 2 else 8
    chunks = 1
    while tiles > min_tiles and 4 * tiles >= r:  # 8 * tiles / 2 rows would still cover R
        tiles //= 2
    stages = -(-k // CHUNK_K)
    cap = sms * _WARPS_PER_SM
    while True:
        blocks = -(-r // (8 * tiles)) * max(1, l)
        split = max(1, min(cap // blocks, stages // 2 if stages >= 2 else 1, 64))
        if blocks * min(split, 8) >= sms or tiles == min_tiles:
            break
        tiles //= 2
    # cluster CTAs first while the row blocks alone leave SMs idle, then warps within a CTA
    cluster = 1
    while cluster * 2 <= min(split, 8) and blocks * cluster < sms:
        cluster *= 2
    warps = 1
    while warps * 2 <= min(split // cluster, 8):
        warps *= 2
    while warps < min_warps and cluster * warps * 2 <= stages // 2:
        warps *= 2
    return GemvConfig(tiles=tiles, chunks=chunks, warps=warps, cluster_k=cluster, big_major=big_major,
                      small_major=small_major, out_major=out_major, k_run=k_run, r_vec=r_vec, s16=s > 8,
                      stream_b=streams_whole_sectors(big_major, k_run, r_vec), dtype=dtype,
                      out_dtype=out_dtype).validate()


def streams_whole_sectors(big_major: str, k_run: int, r_vec: int) -> bool:
    """Whether one load instruction of B reads whole 32-byte sectors of each row it touches (4
    lanes x k_run elements along K, or 8 lanes x r_vec along R), so B may bypass L1. Narrower
    vectors read a sector over several instructions, which L1 must then hold."""
    if big_major == "k":
        return 4 * k_run * 2 >= 32
    return 8 * r_vec * 2 >= 32
