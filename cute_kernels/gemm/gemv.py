"""`gemv`: the memory-bound GEMM for a small side of at most 16 (GEMV and decode batches).

    C (S, R, L) = act(alpha * A (S, K, L) . B (R, K, L)^T + beta * C_src + bias)    S <= 16

in kernel order (`gemv_config` holds the mapping onto mma.sync.m16n8k16, the layouts and the
heuristic). B, the big operand, is read once, straight from global memory into the MMA's
registers: no shared-memory staging, no TMA, so any base address, leading dimension and K run
at the widest vector they allow (16, 8, 4 or 2 bytes, one build per width).

    CTA (cluster rank, row block, batch), `warps` warps, 8 * tiles rows of B:
    per stage   each warp loads `chunks` 32-wide K chunks of its rows of B and of A's rows
                (vector loads, or element loads for a strided A), then one MMA per n8 tile
                and k16 step; warps take the CTA's stages round-robin, the K tail (a partial
                stage) is read with zero fill by the warp whose turn it is
    partials    every warp's accumulators -> shared memory (`partial_smem_layout`), summed
                over warps in warp order; with cluster_k > 1 each CTA sums its part of the
                outputs over the cluster's CTAs in rank order (distributed shared memory)
    epilogue    alpha, beta * C_src, bias, activation (`hopper.epilogue.fuse`) in fp32, one
                element store per output, consecutive threads along the output's unit stride

The host side (`GemvRung`) takes the matmul rung convention a (L, M, K), b (L, K, N), out
(L, M, N) and picks the role: M <= 16 runs A = a, B = b^T; N <= 16 runs with the roles swapped
(A = b^T, B = a, C = out^T: a classifier head or a router over many rows). The compiled host
function forms the kernel-order views itself, so a call passes the caller's tensors as they are.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm, nvvm
from cutlass.cute.nvgpu import warp
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.memory import SmemAllocator

from cute_kernels.gemm.gemv_config import (
    CHUNK_K,
    MAX_SMALL,
    SLOTS,
    GemvConfig,
    a_fragment_slots,
    a_staging_layout,
    b_row_layout,
    b_staging_layout,
    choose_role,
    config_fits,
    k_slot_layout,
    operand_contract,
    operand_plan,
    output_coord,
    partial_smem_layout,
    pick_config,
)
from cute_kernels.hopper.epilogue import EpilogueSpec, fuse
from cute_kernels.runtime import to_cute
from cute_kernels.runtime.arch import sm_count

__all__ = ["GemvKernel", "GemvRung", "RUNG", "build_variant", "fake_operands", "load_peer_f32"]

_DSL = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}


def _views(role: str, a, b, out, c_src):
    """Kernel-order (A, B, C, C_src) views of the caller's (L, M, K), (L, K, N), (L, M, N) tensors
    (trace time): role "m" reads A = a, B = b^T; role "n" A = b^T, B = a, C = out^T."""
    def sel(t, order):
        return cute.make_tensor(t.iterator, cute.select(t.layout, mode=order))

    if role == "m":
        return sel(a, [1, 2, 0]), sel(b, [2, 1, 0]), sel(out, [1, 2, 0]), sel(c_src, [1, 2, 0])
    return sel(b, [2, 1, 0]), sel(a, [1, 2, 0]), sel(out, [2, 1, 0]), sel(c_src, [2, 1, 0])


_DSMEM = 7  # NVPTX address space of shared::cluster


@dsl_user_op
def load_peer_f32(smem_ptr, rank, *, loc=None, ip=None) -> cutlass.Float32:
    """The fp32 at `smem_ptr` (this CTA's shared memory) in the shared memory of cluster CTA
    `rank` (mapa + ld.shared::cluster; the DSL's dsmem tensors do not load)."""
    remote = nvvm.mapa(llvm.PointerType.get(_DSMEM), smem_ptr.to_llvm_ptr(loc=loc, ip=ip),
                       cutlass.Int32(rank).ir_value(loc=loc, ip=ip), loc=loc, ip=ip)
    return cutlass.Float32(llvm.load(T.f32(), remote, loc=loc, ip=ip))


class GemvKernel:
    """One build of the skinny GEMM: a config, an epilogue (in kernel terms) and a role.

    Layouts it runs (from `gemv_config`, for the workbench): `k_slot_layout`, `b_row_layout`,
    `b_staging_layout`, `a_staging_layout`, `a_fragment_slots`, `partial_smem_layout`.
    """

    def __init__(self, config: GemvConfig, spec: EpilogueSpec = EpilogueSpec(), role: str = "m"):
        if role not in ("m", "n"):
            raise ValueError(f"role must be 'm' or 'n', got {role!r}")
        self.config = config.validate()
        self.spec = spec.validate()
        self.role = role
        cfg = self.config
        self.k_slot_layout = k_slot_layout(cfg.k_run)
        self.b_row_layout = b_row_layout(cfg.tiles, cfg.r_vec)
        self.b_staging_layout = b_staging_layout(cfg.tiles, cfg.chunks, cfg.big_major, cfg.k_run, cfg.r_vec)
        self.a_staging_layout = a_staging_layout(cfg.chunks, cfg.k_run)
        self.a_fragment_slots = a_fragment_slots()
        self.partial_smem_layout = partial_smem_layout(cfg.rows, cfg.s_rows, cfg.warps)
        self.ab_type = _DSL[cfg.dtype]
        self.c_type = _DSL[cfg.out_dtype]

    # ---- host side --------------------------------------------------------------------------

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, c_src: cute.Tensor, bias: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream):
        cfg = self.config
        # the vector-read operands' strides and bases carry the contract's divisibility
        # (`fake_operands`), so every vector load is provably aligned
        mA, mB, mC, mCs = _views(self.role, a, b, out, c_src)
        blocks = cute.ceil_div(mB.shape[0], cfg.rows)
        grid = [blocks * cfg.cluster_k, 1, mC.shape[2]]
        if cutlass.const_expr(cfg.cluster_k > 1):
            self.kernel(mA, mB, mC, mCs, bias, alpha, beta).launch(
                grid=grid, block=[cfg.threads, 1, 1], cluster=[cfg.cluster_k, 1, 1], smem=cfg.smem_bytes() + 64,
                stream=stream)
        else:
            self.kernel(mA, mB, mC, mCs, bias, alpha, beta).launch(
                grid=grid, block=[cfg.threads, 1, 1], smem=cfg.smem_bytes() + 64, stream=stream)

    # ---- device side ------------------------------------------------------------------------

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mCs: cute.Tensor, mBias: cute.Tensor,
               alpha: cutlass.Float32, beta: cutlass.Float32):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, l = cute.arch.block_idx()
        warp_i = tidx // 32
        lane = tidx % 32
        g = lane // 4
        q = lane % 4
        rank = bidx % cfg.cluster_k
        r0 = (bidx // cfg.cluster_k) * cfg.rows
        S, K = mA.shape[0], mA.shape[1]
        R = mB.shape[0]

        # ---- partition: this CTA's stages of K, this lane's rows of A and B
        n_stages = (K + cfg.stage_k - 1) // cfg.stage_k
        first_stage = (rank * n_stages) // cfg.cluster_k
        end_stage = ((rank + 1) * n_stages) // cfg.cluster_k
        full_end = cutlass.min(end_stage, K // cfg.stage_k)
        rows_b = self.lane_rows_b(mB, l, r0, g, R)
        rows_a = self.lane_rows_a(mA, l, g, S)

        acc = cute.make_rmem_tensor(cute.make_layout((4, 1, cfg.tiles)), cutlass.Float32)
        acc.fill(0.0)
        frag_a = cute.make_rmem_tensor(cute.make_layout((8, 1)), self.ab_type)
        frag_a.fill(0.0)  # rows 8-15 stay zero when the small side is at most 8
        frag_b = cute.make_rmem_tensor(cute.make_layout((4, cfg.tiles)), self.ab_type)
        frags = (acc, frag_a, frag_b)
        vals = self.staging()
        lane_rows = (mA, mB, rows_a, rows_b, l, q, K)

        # ---- main loop: full stages, round-robin over warps; then the K tail, zero-filled
        mine = first_stage + warp_i
        if mine < full_end:
            count = (full_end - mine + cfg.warps - 1) // cfg.warps
            if cutlass.const_expr(cfg.prefetch):
                # registers double-buffered: stage i + 1's loads are issued before stage i's MMAs
                ahead = self.staging()
                self.load_stage(lane_rows, mine * cfg.stage_k, vals, False)
                for i in cutlass.range(count - 1, unroll=1):
                    self.load_stage(lane_rows, (mine + (i + 1) * cfg.warps) * cfg.stage_k, ahead, False)
                    self.mma_stage(vals, frags)
                    for x, y in zip(vals, ahead):
                        x.store(y.load())
                self.mma_stage(vals, frags)
            else:
                for i in cutlass.range(count, unroll=1):
                    self.load_stage(lane_rows, (mine + i * cfg.warps) * cfg.stage_k, vals, False)
                    self.mma_stage(vals, frags)
        if full_end < end_stage:
            if warp_i == (full_end - first_stage) % cfg.warps:
                self.load_stage(lane_rows, full_end * cfg.stage_k, vals, True)
                self.mma_stage(vals, frags)

        # ---- partials: per-warp sums in shared memory, reduced in a fixed order
        smem = SmemAllocator()
        sP = smem.allocate_tensor(cutlass.Float32, to_cute(self.partial_smem_layout), 16)
        brow = to_cute(self.b_row_layout)
        for t in cutlass.range_constexpr(cfg.tiles):
            for h in cutlass.range_constexpr(2 if cfg.s16 else 1):
                for e in cutlass.range_constexpr(2):
                    sP[cute.crd2idx((2 * q + e, t), brow), g + 8 * h, warp_i] = acc[e + 2 * h, 0, t]
        cute.arch.sync_threads()
        self.reduce_and_store(sP, mC, mCs, mBias, alpha, beta, tidx, rank, r0, l, S, R)

    @cute.jit
    def lane_rows_b(self, mB: cute.Tensor, l, r0, g, R):
        """K-major B: this lane's row of each n8 tile, as K-vectors ((k_run), K / k_run), rows past
        R clamped to the last. R-major B: the index of this lane's first r_vec-row vector of
        each run (a column is split into r_vec-row vectors), clamped likewise."""
        cfg = self.config
        brow = to_cute(self.b_row_layout)
        out = []
        if cutlass.const_expr(cfg.big_major == "k"):
            for t in cutlass.range_constexpr(cfg.tiles):
                r = cutlass.min(r0 + cute.crd2idx((g, t), brow), R - 1)
                out.append(cute.zipped_divide(mB[r, None, l], (cfg.k_run,)))
        else:
            v = cfg.r_vec
            for run in cutlass.range_constexpr(cfg.tiles // v):
                first = r0 + cute.crd2idx((g, run * v), brow)
                out.append(cutlass.min(first // v, R // v - 1))
        return out

    @cute.jit
    def lane_rows_a(self, mA: cute.Tensor, l, g, S):
        """This lane's rows g and g + 8 of A (clamped to S - 1), as K-vectors when A is K-major."""
        cfg = self.config
        out = []
        for h in cutlass.range_constexpr(2 if cfg.s16 else 1):
            row = mA[cutlass.min(g + 8 * h, S - 1), None, l]
            if cutlass.const_expr(cfg.small_major == "k"):
                row = cute.zipped_divide(row, (cfg.k_run,))
            out.append(row)
        return out

    def load_atom(self, operand: str, bits: int):
        """The copy atom of one vector load: B streams through (not kept in L1, whose room A's
        rows, re-read by every warp, keep: evict-last), with an L2 prefetch hint of
        `cfg.l2_prefetch` bytes when `cfg.stream_b`."""
        cfg = self.config
        nv = cute.nvgpu
        if operand == "b" and cfg.stream_b:
            hint = {0: nv.L2PrefetchSize.NONE, 64: nv.L2PrefetchSize.SIZE_64B, 128: nv.L2PrefetchSize.SIZE_128B,
                    256: nv.L2PrefetchSize.SIZE_256B}[cfg.l2_prefetch]
            return cute.make_copy_atom(nv.CopyG2ROp(), self.ab_type, num_bits_per_copy=bits,
                                       l1c_evict_priority=nv.CacheEvictionPriority.NO_ALLOCATE, l2_prefetch_size=hint)
        if operand == "a":
            return cute.make_copy_atom(nv.CopyG2ROp(), self.ab_type, num_bits_per_copy=bits,
                                       l1c_evict_priority=nv.CacheEvictionPriority.EVICT_LAST)
        return cute.make_copy_atom(nv.CopyUniversalOp(), self.ab_type, num_bits_per_copy=bits)

    @cute.jit
    def load_vector(self, src: cute.Tensor, dst: cute.Tensor, operand: cutlass.Constexpr, bits: cutlass.Constexpr,
                    inside, predicated: cutlass.Constexpr):
        """dst <- src (one vector of `bits`), or zeros where a predicated load falls outside."""
        atom = self.load_atom(operand, bits)
        if cutlass.const_expr(predicated):
            if inside:
                cute.copy(atom, src, dst)
            else:
                dst.fill(0.0)
        else:
            cute.copy(atom, src, dst)

    def staging(self):
        """Register tensors (A values, B values) one stage loads into (`a_staging_layout`,
        `b_staging_layout`)."""
        return (cute.make_rmem_tensor(to_cute(self.a_staging_layout), self.ab_type),
                cute.make_rmem_tensor(to_cute(self.b_staging_layout), self.ab_type))

    @cute.jit
    def load_stage(self, lane_rows, k0, vals, predicated: cutlass.Constexpr):
        """Load the `chunks` 32-wide K chunks of one stage starting at k0 into `vals` (zeros past
        K when `predicated`)."""
        cfg = self.config
        mA, mB, rows_a, rows_b, l, q, K = lane_rows
        vals_a, vals_b = vals
        p = cfg.k_run
        kslot = to_cute(self.k_slot_layout)
        for u in cutlass.range_constexpr(cfg.chunks):
            kc = k0 + CHUNK_K * u
            # ---- B: K-major, run i of each tile's row; R-major, each slot's column in r_vec-row vectors
            if cutlass.const_expr(cfg.big_major == "k"):
                for i in cutlass.range_constexpr(SLOTS // p):
                    kv = (kc + cute.crd2idx((q, (0, i)), kslot)) // p
                    for t in cutlass.range_constexpr(cfg.tiles):
                        self.load_vector(rows_b[t][None, kv], vals_b[(None, i), t, u], "b", 16 * p, kv * p < K,
                                         predicated)
            else:
                v = cfg.r_vec
                for w in cutlass.range_constexpr(SLOTS):
                    k = kc + cute.crd2idx((q, w), kslot)
                    column = cute.zipped_divide(mB[None, cutlass.min(k, K - 1), l], (v,))
                    for run in cutlass.range_constexpr(cfg.tiles // v):
                        self.load_vector(column[None, rows_b[run]], vals_b[w, (None, run), u], "b", 16 * v, k < K,
                                         predicated)
            # ---- A: rows g and g + 8, K-vectors or single elements
            for h in cutlass.range_constexpr(2 if cfg.s16 else 1):
                if cutlass.const_expr(cfg.small_major == "k"):
                    for i in cutlass.range_constexpr(SLOTS // p):
                        kv = (kc + cute.crd2idx((q, (0, i)), kslot)) // p
                        self.load_vector(rows_a[h][None, kv], vals_a[(None, i), h, u], "a", 16 * p, kv * p < K,
                                         predicated)
                else:
                    for w in cutlass.range_constexpr(SLOTS):
                        k = kc + cute.crd2idx((q, w), kslot)
                        if cutlass.const_expr(predicated):
                            x = self.ab_type(0.0)
                            if k < K:
                                x = rows_a[h][k]
                            vals_a[w, h, u] = x
                        else:
                            vals_a[w, h, u] = rows_a[h][k]

    @cute.jit
    def mma_stage(self, vals, frags):
        """acc += the stage's products: per chunk two k16 steps, one m16n8k16 per n8 tile. Value v
        of A's fragment is (slot, row half) `a_fragment_slots`(v) of the step; value v of B's is
        slot 4j + v of its tile."""
        cfg = self.config
        vals_a, vals_b = vals
        acc, frag_a, frag_b = frags
        atom = cute.make_mma_atom(warp.MmaF16BF16Op(self.ab_type, cutlass.Float32, (16, 8, 16)))
        for u in cutlass.range_constexpr(cfg.chunks):
            for j in cutlass.range_constexpr(2):
                for v in cutlass.range_constexpr(8):
                    w, h = self.a_fragment_slots(v) % 8, self.a_fragment_slots(v) // 8
                    if cutlass.const_expr(h == 0 or cfg.s16):
                        frag_a[v, 0] = vals_a[4 * j + w, h, u]
                for t in cutlass.range_constexpr(cfg.tiles):
                    for v in cutlass.range_constexpr(4):
                        frag_b[v, t] = vals_b[4 * j + v, t, u]
                cute.gemm(atom, acc, frag_a, frag_b, acc)

    @cute.jit
    def reduce_and_store(self, sP: cute.Tensor, mC: cute.Tensor, mCs: cute.Tensor, mBias: cute.Tensor, alpha, beta,
                         tidx, rank, r0, l, S, R):
        """Sum the partials in a fixed order and store act(alpha * sum + beta * C_src + bias)."""
        cfg = self.config
        n_out = cfg.rows * cfg.s_rows
        if cutlass.const_expr(cfg.cluster_k == 1):
            for i in cutlass.range_constexpr((n_out + cfg.threads - 1) // cfg.threads):
                idx = tidx + cfg.threads * i
                if cutlass.const_expr(n_out % cfg.threads == 0):
                    self.store_one(sP, mC, mCs, mBias, alpha, beta, idx, False, r0, l, S, R)
                elif idx < n_out:
                    self.store_one(sP, mC, mCs, mBias, alpha, beta, idx, False, r0, l, S, R)
        else:
            # every CTA first sums its warps (into warp slot 0, each element by the thread that
            # reads it), then owns n_out / cluster_k outputs summed over the cluster in rank order
            for i in cutlass.range_constexpr((n_out + cfg.threads - 1) // cfg.threads):
                idx = tidx + cfg.threads * i
                if idx < n_out:
                    r, s = self.output_coord(idx)
                    x = sP[r, s, 0]
                    for w in cutlass.range_constexpr(1, cfg.warps):
                        x = x + sP[r, s, w]
                    sP[r, s, 0] = x
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            share = n_out // cfg.cluster_k
            for i in cutlass.range_constexpr((share + cfg.threads - 1) // cfg.threads):
                j = tidx + cfg.threads * i
                if j < share:
                    self.store_one(sP, mC, mCs, mBias, alpha, beta, rank * share + j, True, r0, l, S, R)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    def output_coord(self, idx):
        cfg = self.config
        return output_coord(idx, cfg.rows, cfg.s_rows, cfg.out_major)

    @cute.jit
    def store_one(self, sP: cute.Tensor, mC: cute.Tensor, mCs: cute.Tensor, mBias: cute.Tensor, alpha, beta, idx,
                  peers: cutlass.Constexpr, r0, l, S, R):
        """Output element `idx` of the CTA: the sum of the warps' partials (peers False) or of
        the cluster CTAs' sums (peers True, read from each CTA's shared memory in rank order)."""
        cfg = self.config
        r, s = self.output_coord(idx)
        if cutlass.const_expr(not peers):
            x = sP[r, s, 0]
            for w in cutlass.range_constexpr(1, cfg.warps):
                x = x + sP[r, s, w]
        else:
            local = sP.iterator + cute.crd2idx((r, s, 0), sP.layout)
            x = load_peer_f32(local, 0)
            for c in cutlass.range_constexpr(1, cfg.cluster_k):
                x = x + load_peer_f32(local, c)
        row = r0 + r
        if s < S and row < R:
            y = fuse(self.spec, x, (s, row, l), (S, R), alpha, beta, mCs, mBias, None, None)  # no fp8 scales
            mC[s, row, l] = y.to(self.c_type)


# ---- compile-only builds (fake tensors with symbolic sizes) -------------------------------------

def fake_operands(config: GemvConfig, role: str = "m", *, c_dtype: str | None = None, bias_dtype: str = "float32"):
    """Fake caller-order (a (L, M, K), b (L, K, N), out, c_src, bias) for `config` and `role`: a
    and b as `operand_contract` says (the unit stride static, base alignment and stride
    divisibility of the vector), every other tensor with dynamic strides (element access)."""
    from cutlass.cute.runtime import make_fake_tensor

    def tensor(dtype, lead, vec, rank=3):
        shape = tuple(cute.sym_int32() for _ in range(rank))
        stride = tuple(1 if i == lead else cute.sym_int64(divisibility=vec) for i in range(rank))
        return make_fake_tensor(dtype, shape, stride, assumed_align=vec * dtype.width // 8)

    ab = _DSL[config.dtype]
    contract = operand_contract(config, role)
    a, b = (tensor(ab, *contract[x]) for x in ("a", "b"))
    out = tensor(_DSL[config.out_dtype], None, 1)
    c_src = tensor(_DSL[c_dtype or config.out_dtype], None, 1)
    return a, b, out, c_src, tensor(_DSL[bias_dtype], None, 1, rank=1)


def build_variant(role: str = "m", beta_c: bool = False, bias: str | None = None, activation: str | None = None,
                  **config):
    """A CompileJob of `GemvKernel(GemvConfig(**config), EpilogueSpec(beta_c, bias, activation), role)`."""
    from cute_kernels.runtime import CompileJob, fake_stream

    cfg = GemvConfig(**config).validate()
    spec = EpilogueSpec(beta_c=beta_c, bias=bias, activation=activation).validate()
    args = (*fake_operands(cfg, role), cutlass.Float32(1.0), cutlass.Float32(0.0), fake_stream())
    return CompileJob(GemvKernel(cfg, spec, role), args, ("gemm.gemv", cfg, spec, role))


# Compile-only variants (`cute-kernels sass gemm.gemv <name>`; tests/gemm/test_gemv_compile.py):
# both majors of B, every vector width, the small side above and below 8, the strided A, the
# fused epilogue, a cluster split and the swapped role.
VARIANT_CONFIGS = {
    "k16_s16": {},
    "k16_s8_prefetch": {"s16": False, "prefetch": True},
    "k8": {"k_run": 4},
    "k4_chunks2": {"k_run": 2, "tiles": 4, "chunks": 2, "stream_b": False},
    "k2_s8": {"k_run": 1, "tiles": 4, "s16": False, "stream_b": False},
    "r16": {"big_major": "r", "r_vec": 8},
    "r8_strided_a": {"big_major": "r", "r_vec": 4, "tiles": 4, "small_major": "s", "k_run": 8},
    "r4": {"big_major": "r", "r_vec": 2, "tiles": 4, "s16": False},
    "r2_strided_a": {"big_major": "r", "r_vec": 1, "tiles": 2, "small_major": "s", "k_run": 1, "stream_b": False},
    "epilogue_fp32": {"beta_c": True, "bias": "n", "activation": "gelu_tanh", "out_dtype": "float32"},
    "cluster4_swapped_fp16": {"cluster_k": 4, "role": "n", "out_major": "s", "bias": "m", "activation": "silu",
                              "dtype": "float16", "out_dtype": "float16", "s16": False},
}
# the vector bits each variant's B loads must show (LDG.*.128 / .64 / 32-bit / .U16)
VARIANT_B_BITS = {"k16_s16": 128, "k16_s8_prefetch": 128, "k8": 64, "k4_chunks2": 32, "k2_s8": 16, "r16": 128,
                  "r8_strided_a": 64, "r4": 32, "r2_strided_a": 16, "epilogue_fp32": 128, "cluster4_swapped_fp16": 128}


def _register() -> None:
    from cute_kernels.runtime import register_variant

    register_variant("gemm.gemv", build_variant, configs=VARIANT_CONFIGS, requires={"HMMA"})


_register()


# ---- the torch-facing side ---------------------------------------------------------------------

_compiled: dict = {}


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _kernel_order(t, role_of_t: str):
    """(shape, stride) of a caller tensor in kernel order (rows, K, L): a (L, M, K) -> (M, K, L),
    b (L, K, N) -> (N, K, L)."""
    if role_of_t == "a":
        return (t.shape[1], t.shape[2], t.shape[0]), (t.stride(1), t.stride(2), t.stride(0))
    return (t.shape[2], t.shape[1], t.shape[0]), (t.stride(2), t.stride(1), t.stride(0))


def _fit(t, lead: int | None, vec: int):
    """`t` (caller order) as the build expects it: the unit-stride mode `lead` with stride 1 and
    every other stride a multiple of `vec`, which the read plan guarantees for modes longer than
    1; an extent-1 mode with another stride gets stride 1 (the lead) or 0 in a view. Returns `t`
    itself when nothing needs changing (the common case)."""
    if lead is None:
        return t
    shape, stride = t.shape, list(t.stride())
    changed = False
    for i in range(3):
        want_ok = stride[i] == 1 if i == lead else stride[i] % vec == 0
        if not want_ok:
            if shape[i] != 1:  # the read plan never picks such a vector; say so rather than misread
                raise ValueError(f"gemv: stride {stride[i]} of mode {i} (extent {shape[i]}) is not a multiple of "
                                 f"the {vec}-element vector the read plan chose")
            stride[i] = 1 if i == lead else 0
            changed = True
    return t.as_strided(shape, stride) if changed else t


class GemvRung:
    """The skinny-GEMM rung: matmul's (L, M, K) x (L, K, N) -> (L, M, N) views with M <= 16 or
    N <= 16 (`supports` says which problems it takes and why not the others).

    The warm call of a signature seen before (tensor shapes, strides, dtypes, devices, pointer
    mod 16, epilogue options) skips the checks and calls the compiled function with the
    caller's tensors (`runtime.plan_cache`).
    """

    name = "gemv"
    min_capability = (9, 0)

    def __init__(self):
        from cute_kernels.runtime.plan_cache import PlanCache

        self._plans = PlanCache("gemm.gemv")

    @property
    def dtypes(self):
        import torch

        return (torch.bfloat16, torch.float16)

    # ---- the checked path -----------------------------------------------------------------

    def read_plan(self, a, b, out):
        """(role, config fields the problem fixes, reason): how this problem would run (the
        `GemvConfig` fields of its read plan), or a reason it cannot (then the others are None)."""
        import torch

        if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
            return None, None, f"inputs must both be bf16 or both fp16, got {a.dtype} and {b.dtype}"
        if out.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            return None, None, f"output dtype {out.dtype} not supported (bf16, fp16, fp32)"
        if a.dim() != 3 or b.dim() != 3 or out.dim() != 3:
            return None, None, "expects 3-D (L, M, K) x (L, K, N) -> (L, M, N) views"
        L, M, K = a.shape
        N = b.shape[2]
        if tuple(b.shape[:2]) != (L, K) or tuple(out.shape) != (L, M, N):
            return None, None, (f"shapes do not compose: a {tuple(a.shape)}, b {tuple(b.shape)}, out "
                                f"{tuple(out.shape)} (expected (L, M, K), (L, K, N), (L, M, N))")
        role = choose_role(M, N)
        if role is None:
            return None, None, f"M = {M} and N = {N}: neither side is at most {MAX_SMALL}"
        if L > 65535:
            return None, None, f"batch {L} exceeds the grid's z limit 65535"
        if max(M, N, K) >= 2**31:
            return None, None, "a dimension exceeds 2**31 - 1 (32-bit coordinates)"
        small, big = (a, b) if role == "m" else (b, a)
        es = a.element_size()
        sp = operand_plan(*_kernel_order(small, "a" if role == "m" else "b"), small.data_ptr(), es, "small")
        bp = operand_plan(*_kernel_order(big, "b" if role == "m" else "a"), big.data_ptr(), es, "big")
        if bp.reason is not None:
            return None, None, f"{'b' if role == 'm' else 'a'} (the big operand): {bp.reason}"
        k_vecs = [p.vector for p in (sp, bp) if p.major == "k"]
        k_run = min(k_vecs) if k_vecs else 8
        r_vec = bp.vector if bp.major == "r" else 1
        c_shape, c_stride = (out.shape[1], out.shape[2]), (out.stride(1), out.stride(2))
        if role == "n":
            c_shape, c_stride = c_shape[::-1], c_stride[::-1]
        # stores walk the small side only where it, and not the rows, has unit stride
        out_major = "s" if c_stride[0] == 1 and c_shape[0] > 1 and c_stride[1] != 1 else "r"
        fields = dict(big_major=bp.major, small_major=sp.major, out_major=out_major, k_run=k_run, r_vec=r_vec,
                      dtype=_dtype_name(a.dtype), out_dtype=_dtype_name(out.dtype), s16=(M if role == "m" else N) > 8)
        return role, fields, None

    def supports(self, a, b, out) -> str | None:
        from cute_kernels.runtime import tvm_ffi_available

        why = self.read_plan(a, b, out)[2]
        if why is not None:
            return why
        if not tvm_ffi_available():
            return "needs apache-tvm-ffi (the kernel is launched through TVM-FFI only)"
        return _r._cuda_reason(a, b, out)  # last: every other reason is checkable on CPU

    def config_for(self, a, b, out) -> GemvConfig:
        """The heuristic's config for this problem (`pick_config` on its read plan)."""
        role, fields, why = self.read_plan(a, b, out)
        if why is not None:
            raise ValueError(f"{self.name}: {why}")
        L, M, K = a.shape
        N = b.shape[2]
        s, r = (M, N) if role == "m" else (N, M)
        sms = sm_count(out.device) if out.is_cuda else 132
        fields = {f: v for f, v in fields.items() if f != "s16"}
        return pick_config(s, r, K, L, sms=sms, **fields)

    def compiled(self, config: GemvConfig, spec: EpilogueSpec, role: str, c_dtype, bias_dtype):
        """The TVM-FFI function of this build (compiled on first use, then from the cache):
        fn(a, b, out, c_src, bias, alpha, beta) on torch's current stream."""
        key = ("gemm.gemv", config, spec, role, _dtype_name(c_dtype), _dtype_name(bias_dtype))
        fn = _compiled.get(key)
        if fn is None:
            from cute_kernels.runtime import TVM_FFI_OPTION, compile_kernel, fake_stream

            args = fake_operands(config, role, c_dtype=_dtype_name(c_dtype), bias_dtype=_dtype_name(bias_dtype))
            fn = _compiled[key] = compile_kernel(
                GemvKernel(config, spec, role), *args, cutlass.Float32(1.0), cutlass.Float32(0.0),
                fake_stream(tvm_ffi_env_stream=True), key=key, options=TVM_FFI_OPTION)
        return fn

    def plan_for(self, a, b, out, *, alpha=1.0, beta=0.0, c=None, config=None, bias=None, bias_dim: str = "n",
                 activation=None, scale_a=None, scale_b=None):
        """The stored plan of a call with these arguments in the Hopper rungs' protocol
        (`Sm90Rung.plan_for`): `plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b)` on
        any tensors whose storage holds this call's 3-D views at the same offsets (so
        `matmul` may pass the 2-D tensors it was given: the recorded views are formed with
        `as_strided`), or None."""
        if scale_a is not None or scale_b is not None:
            return None
        sig = self._signature(a, b, out, alpha, beta, c, bias, bias_dim, activation, config)
        try:
            launch = None if sig is None else self._plans.get(sig)
        except TypeError:
            return None
        if launch is None:
            return None
        use_c = beta != 0
        layouts = [(tuple(t.shape), t.stride()) for t in (a, b, out)]
        c_layout = (tuple(c.shape), c.stride()) if use_c else None
        (sa, ta), (sb, tb), (so, to) = layouts

        def plan(a, b, out, alpha, beta, c, bias, scale_a, scale_b):
            launch(a.as_strided(sa, ta), b.as_strided(sb, tb), out.as_strided(so, to),
                   c.as_strided(*c_layout) if use_c else None, bias, alpha, beta)

        return plan

    def __call__(self, a, b, out, *, alpha: float = 1.0, beta: float = 0.0, c=None, bias=None, bias_dim: str = "n",
                 activation: str | None = None, config: GemvConfig | None = None, scale_a=None, scale_b=None):
        """out = act(alpha * a @ b + beta * c + bias) for (L, M, K) x (L, K, N) -> (L, M, N) views
        with M <= 16 or N <= 16. c (L, M, N) is read only when beta != 0; bias is (N,) for
        bias_dim "n" (per output column, nn.Linear's) or (M,) for "m"; activation None, "relu",
        "gelu", "gelu_tanh" or "silu". config: a GemvConfig to run instead of the heuristic's; it must fit
        the problem's read plan (`gemv_config.config_fits`: same majors of B and dtypes, vectors
        no wider than the operands allow; `config_for` gives the heuristic's). scale_a/scale_b:
        fp8 dequantization scales, which this rung (16-bit inputs) never takes. Returns out."""
        if scale_a is not None or scale_b is not None:
            raise ValueError(f"{self.name}: takes bf16/fp16 inputs, so no fp8 scales (scale_a, scale_b)")
        sig = self._signature(a, b, out, alpha, beta, c, bias, bias_dim, activation, config)
        if sig is not None:
            try:
                plan = self._plans.get(sig)
            except TypeError:
                plan = sig = None
            if plan is not None:
                plan(a, b, out, c, bias, alpha, beta)
                return out
        role, fields, why = self.read_plan(a, b, out)
        if why is None:
            why = self.supports(a, b, out)
        if why is not None:
            raise ValueError(f"{self.name}: {why}")
        spec = _r._check_epilogue(self.name, out, beta, c, bias, bias_dim, activation)
        L, M, K = a.shape
        N = b.shape[2]
        if M == 0 or N == 0 or L == 0:
            return out
        if K == 0:
            import torch

            out.copy_(_r.torch_epilogue(torch.zeros(out.shape, device=out.device), spec, beta, c, bias))
            return out
        if config is None:
            config = self.config_for(a, b, out)
        else:
            why = config_fits(config.validate(), fields)
            if why is not None:
                raise ValueError(f"{self.name}: the config given does not fit this problem: {why}")
        kspec = spec if role == "m" else _skinny.swapped_spec(spec)
        contract = operand_contract(config, role)
        c_t = c if spec.beta_c else None
        dummy = _r._dummy_bias(out.device)
        fn = self.compiled(config, kspec, role, (c_t if c_t is not None else out).dtype,
                           (bias if bias is not None else dummy).dtype)
        launch = _launcher(fn, contract, a, b, out, c_t, bias, dummy)
        launch(a, b, out, c, bias, alpha, beta)
        if sig is not None:
            from cute_kernels.runtime.plan_cache import plain_tensors

            if plain_tensors(a, b, out, c_t, bias):
                self._plans.put(sig, launch)
        return out

    def _signature(self, a, b, out, alpha, beta, c, bias, bias_dim, activation, config):
        """Everything that decides the checked path of a call, or None (no plan possible)."""
        from cute_kernels.runtime.plan_cache import tensor_signature

        if alpha.__class__ not in (float, int) or beta.__class__ not in (float, int):
            return None
        use_c = beta != 0
        try:
            return (tensor_signature(a), tensor_signature(b), tensor_signature(out), use_c,
                    tensor_signature(c) if use_c else None, None if bias is None else tensor_signature(bias),
                    bias_dim, activation, config)
        except (TypeError, RuntimeError):
            return None


def _launcher(fn, contract: dict, a, b, out, c, bias, dummy):
    """launch(a, b, out, c, bias, alpha, beta): the compiled call on the caller's tensors, for
    every call with the signature of this one (a, b, out, c or None when beta is 0, bias or
    None). What depends only on the signature is decided here once: which operands need a
    view with fixed extent-1 strides (`_fit`), which require grad (DLPack refuses those: their
    detached alias is passed), and the stand-ins for an absent C or bias."""
    fits = []
    for t, (lead, vec) in ((a, contract["a"]), (b, contract["b"])):
        fitted = _fit(t, lead, vec)
        fits.append(None if fitted is t else fitted.stride())
    fit_a, fit_b = fits
    da, db, dout = a.requires_grad, b.requires_grad, out.requires_grad
    use_c, use_bias = c is not None, bias is not None
    dc, dbias = use_c and c.requires_grad, use_bias and bias.requires_grad

    def launch(a, b, out, c, bias, alpha, beta):
        if da:
            a = a.detach()
        if db:
            b = b.detach()
        if dout:
            out = out.detach()
        if fit_a is not None:
            a = a.as_strided(a.shape, fit_a)
        if fit_b is not None:
            b = b.as_strided(b.shape, fit_b)
        cs = (c.detach() if dc else c) if use_c else out
        bs = (bias.detach() if dbias else bias) if use_bias else dummy
        fn(a, b, out, cs, bs, float(alpha), float(beta))

    return launch


RUNG = GemvRung()


from cute_kernels.gemm import sm90_rung as _r  # noqa: E402 (heavy; the checks and stand-ins it owns)
from cute_kernels.gemm import sm90_skinny as _skinny  # noqa: E402
