"""`gemm.gemv` on CPU: which problems the rung takes (and the reasons it gives for the others), the
read plans it derives from shapes, strides and addresses, and the heuristic's configs."""

from __future__ import annotations

import pytest
import torch

from cute_kernels.gemm.gemv_config import SMS, GemvConfig, choose_role, operand_plan, pick_config


def _views(m, n, k, *, l=1, dtype=torch.bfloat16, a_major="k", b_major="k", out_dtype=None):
    """matmul's rung views: a (L, M, K), b (L, K, N), out (L, M, N); a_major "k" or "m", b_major
    "k" (b = w.t() of an (N, K) weight) or "n" (a row-major (K, N) b)."""
    a = torch.empty(l, m, k, dtype=dtype) if a_major == "k" else torch.empty(l, k, m, dtype=dtype).transpose(1, 2)
    b = torch.empty(l, n, k, dtype=dtype).transpose(1, 2) if b_major == "k" else torch.empty(l, k, n, dtype=dtype)
    return a, b, torch.empty(l, m, n, dtype=out_dtype or dtype)


def _rung():
    from cute_kernels.gemm.gemv import RUNG

    return RUNG


# ---- roles and read plans ---------------------------------------------------------------------

@pytest.mark.parametrize("m, n, role", [(1, 4096, "m"), (16, 16, "m"), (16, 3, "n"), (17, 16, "n"), (4096, 1, "n"),
                                        (17, 17, None), (64, 4096, None)])
def test_role(m, n, role):
    assert choose_role(m, n) == role


@pytest.mark.parametrize("shape, stride, ptr, role, want", [
    ((4096, 4096, 1), (4096, 1, 0), 0, "big", ("k", 8)),
    ((4096, 4100, 1), (4100, 1, 0), 0, "big", ("k", 4)),  # K = 4100: 8-byte vectors
    ((4096, 4097, 1), (4097, 1, 0), 0, "big", ("k", 1)),  # odd K: element loads, still served
    ((4096, 64, 1), (72, 1, 0), 6, "big", ("k", 1)),  # base 6 bytes off 16
    ((4096, 64, 1), (1, 4096, 0), 0, "big", ("r", 8)),  # an R-major B
    ((4098, 64, 1), (1, 4098, 0), 0, "big", ("r", 2)),
    ((64, 64, 3), (64, 1, 4100), 0, "big", ("k", 4)),  # a batch stride limits the vector
    ((64, 64, 3), (64, 1, 0), 0, "big", ("k", 8)),  # a broadcast batch does not
    ((8, 4096, 1), (4096, 1, 0), 0, "small", ("k", 8)),
    ((8, 4096, 1), (1, 8, 0), 0, "small", ("s", 1)),  # an S-major A: element loads, any strides
    ((1, 4096, 1), (7, 1, 0), 0, "small", ("k", 8)),  # one row: its stride is never stepped along
    ((1, 4096, 1), (7, 3, 0), 0, "small", ("s", 1)),  # K not unit-stride: element loads
])
def test_operand_plan(shape, stride, ptr, role, want):
    plan = operand_plan(shape, stride, ptr, 2, role)
    assert (plan.major, plan.vector) == want and plan.reason is None


def test_big_operand_without_a_unit_stride_is_declined():
    plan = operand_plan((64, 64, 1), (128, 2, 0), 0, 2, "big")
    assert plan.major is None and "neither K nor the rows have unit stride" in plan.reason


def test_read_plan_roles_and_vectors():
    rung = _rung()
    role, fields, why = rung.read_plan(*_views(1, 4096, 4096))
    assert why is None and role == "m"
    assert fields == dict(big_major="k", small_major="k", out_major="r", k_run=8, r_vec=1, dtype="bfloat16",
                          out_dtype="bfloat16", s16=False)
    # x @ W with W (K, N) row-major: an R-major B
    role, fields, _ = rung.read_plan(*_views(9, 4096, 4096, b_major="n"))
    assert (fields["big_major"], fields["r_vec"], fields["k_run"], fields["s16"]) == ("r", 8, 8, True)
    # odd K: the K-major operands drop to element vectors together
    _, fields, _ = rung.read_plan(*_views(16, 4096, 4101))
    assert fields["k_run"] == 1
    # N <= 16 over many rows (a classifier head): the roles swap, out^T is stored along the small side
    role, fields, _ = rung.read_plan(*_views(4096, 3, 1024))
    assert role == "n" and fields["out_major"] == "s"
    role, fields, _ = rung.read_plan(*_views(4096, 3, 1024, b_major="n"))
    assert role == "n" and fields["small_major"] == "s"
    # a column-major activation matrix as the big operand: rows contiguous
    role, fields, _ = rung.read_plan(*_views(4096, 8, 512, a_major="m"))
    assert role == "n" and (fields["big_major"], fields["r_vec"]) == ("r", 8)


def test_operand_contract_names_each_callers_modes():
    from cute_kernels.gemm.gemv_config import operand_contract

    k = GemvConfig(k_run=4)
    assert operand_contract(k, "m") == {"a": (2, 4), "b": (1, 4)}  # a's K is mode 2, b's K mode 1
    assert operand_contract(k, "n") == {"a": (2, 4), "b": (1, 4)}
    r = GemvConfig(big_major="r", r_vec=8, small_major="s", k_run=2)
    assert operand_contract(r, "m") == {"a": (None, 1), "b": (2, 8)}  # b's rows (N) are its mode 2
    assert operand_contract(r, "n") == {"a": (1, 8), "b": (None, 1)}  # a's rows (M) are its mode 1


def test_config_fits():
    from cute_kernels.gemm.gemv_config import config_fits

    fields = dict(big_major="k", small_major="k", out_major="r", k_run=4, r_vec=1, dtype="bfloat16",
                  out_dtype="float32", s16=False)
    base = GemvConfig(k_run=4, out_dtype="float32", s16=False)
    assert config_fits(base, fields) is None
    assert config_fits(base.with_(k_run=2, small_major="s", out_major="s", s16=True), fields) is None  # narrower
    why = config_fits(base.with_(k_run=8, big_major="r", dtype="float16"), fields)
    assert "k_run 8" in why and "big_major 'r'" in why and "dtype 'float16'" in why
    assert "s16 False" in config_fits(base, dict(fields, s16=True))
    assert "small_major 'k'" in config_fits(base, dict(fields, small_major="s"))


@pytest.mark.parametrize("args, kwargs, reason", [
    ((64, 64, 64), {}, "neither side is at most 16"),
    ((8, 64, 64), {"dtype": torch.float32}, "bf16 or both fp16"),
    ((8, 64, 64), {"out_dtype": torch.float64}, "output dtype"),
    ((8, 64, 64), {}, "CUDA device"),  # every other check passes on CPU: the device reason comes last
])
def test_supports_reasons(args, kwargs, reason):
    why = _rung().supports(*_views(*args, **kwargs))
    assert why is not None and reason in why, why


def test_supports_declines_mixed_dtypes_and_ranks():
    a, b, out = _views(8, 64, 64)
    assert "bf16 or both fp16" in _rung().supports(a, b.half(), out)
    assert "3-D" in _rung().supports(a[0], b[0], out[0])
    assert "do not compose" in _rung().supports(a, b[:, :32], out)
    assert "do not compose" in _rung().supports(a, b, out[:, :4])
    assert "do not compose" in _rung().supports(a.expand(2, 8, 64), b, out)


def test_big_operand_without_unit_stride_names_the_operand():
    a, _, out = _views(8, 64, 64)
    b = torch.empty(1, 128, 128, dtype=torch.bfloat16)[:, ::2, ::2]
    why = _rung().supports(a, b, out)
    assert why.startswith("b (the big operand)") and "unit stride" in why


def test_call_rejects_before_launch():
    with pytest.raises(ValueError, match="gemv: .*neither side"):
        _rung()(*_views(64, 64, 64))
    with pytest.raises(ValueError, match="gemv: .*CUDA device"):
        _rung()(*_views(8, 64, 64))


def test_fit_sets_extent_one_strides():
    from cute_kernels.gemm.gemv import _fit

    t = torch.empty(1, 4096, 8, dtype=torch.bfloat16)  # (L, K, N) with L = 1
    odd = t.as_strided(t.shape, (4099, 8, 1))  # an L = 1 batch stride that is no multiple of 8
    fitted = _fit(odd, 2, 8)
    assert fitted.stride() == (0, 8, 1) and fitted.data_ptr() == odd.data_ptr()
    assert _fit(t, 2, 8) is t  # nothing to change: the caller's own tensor
    column = torch.empty(64, dtype=torch.bfloat16).as_strided((1, 64, 1), (64, 1, 5))  # b (L, K, N = 1)
    assert _fit(column, 1, 8).stride() == (64, 1, 0)
    assert _fit(column, None, 8) is column  # element-read operands take any strides


# ---- the heuristic ------------------------------------------------------------------------------

SHAPES = [(s, r, k) for s in (1, 2, 4, 8, 16) for r, k in ((4096, 4096), (14336, 4096), (4096, 14336),
                                                          (128256, 4096), (768, 768), (2048, 8192), (1, 4096),
                                                          (5, 7), (32768, 1024))]


@pytest.mark.parametrize("s, r, k", SHAPES)
@pytest.mark.parametrize("min_warps", [1, 4])
def test_heuristic_configs_are_valid_and_fill_the_gpu(s, r, k, min_warps):
    cfg = pick_config(s, r, k, min_warps=min_warps)
    assert cfg == cfg.validate()
    assert cfg.s16 == (s > 8)
    blocks = -(-r // cfg.rows)
    ctas = blocks * cfg.cluster_k
    stages = -(-k // cfg.stage_k)
    warps_total = ctas * cfg.warps
    # enough CTAs for every SM, unless rows and K are too few to cut that finely
    assert ctas >= SMS or cfg.cluster_k == 8 or cfg.cluster_k * cfg.warps * 2 > stages or cfg.tiles == 1, cfg.tag
    # at most about 16 warps per SM in a single wave, unless the row blocks alone fill it: then
    # the fewest warps per CTA asked for that read consecutive chunks of a row, where K has them
    fewest = max(1, min(min_warps, stages // 2))
    assert warps_total <= 2 * SMS * 16 or (cfg.warps == fewest and cfg.cluster_k == 1), cfg.tag
    assert cfg.warps * cfg.cluster_k >= fewest, cfg.tag
    # no K split finer than the stages (every warp gets work, but a few)
    assert cfg.warps * cfg.cluster_k <= max(1, stages), cfg.tag
    # a CTA holds no more rows than twice the problem's
    assert cfg.rows <= max(8, 2 * r), cfg.tag


def test_heuristic_respects_the_read_plan():
    cfg = pick_config(8, 4096, 4096, big_major="r", r_vec=8, small_major="s", out_major="s", k_run=4,
                      dtype="float16", out_dtype="float32")
    assert (cfg.big_major, cfg.r_vec, cfg.small_major, cfg.out_major, cfg.k_run) == ("r", 8, "s", "s", 4)
    assert cfg.tiles % 8 == 0 and (cfg.dtype, cfg.out_dtype) == ("float16", "float32")
    assert pick_config(1, 3, 64, big_major="r", r_vec=2).tiles == 2  # tiles never below r_vec


def test_config_for_uses_the_read_plan():
    rung = _rung()
    cfg = rung.config_for(*_views(4, 4096, 4100))
    assert (cfg.k_run, cfg.s16, cfg.big_major) == (4, False, "k")
    assert isinstance(cfg, GemvConfig)


# ---- the checked path end to end on CPU: the launch honours the build's contract ---------------

class _Recorder:
    """Stands in for a compiled build: checks the tensors a launch passes against the contract
    the build was compiled for (`operand_contract`: unit stride, vector-aligned base, strides
    and contiguous extent multiples of the vector), then runs the lane-by-lane simulation of
    the kernel (tests/gemm/test_gemv_layouts.py) on them, so the result can be checked too."""

    def __init__(self, config, spec, role):
        from cute_kernels.gemm.gemv_config import operand_contract

        self.config, self.spec, self.role = config, spec, role
        self.contract = operand_contract(config, role)

    def __call__(self, a, b, out, c_src, bias, alpha, beta):
        for name, t in (("a", a), ("b", b)):
            lead, vec = self.contract[name]
            if lead is None:
                continue
            assert t.stride(lead) == 1, (name, t.stride())
            assert all(s % vec == 0 for i, s in enumerate(t.stride()) if i != lead), (name, t.stride(), vec)
            assert t.data_ptr() % (vec * t.element_size()) == 0, (name, t.data_ptr() % 16, vec)
            assert t.shape[lead] % vec == 0, (name, t.shape, vec)
        self.launched = (a, b, out, c_src, bias, alpha, beta)
        if getattr(self, "simulate", False):
            self._run(a, b, out, c_src, bias, alpha, beta)

    def _run(self, a, b, out, c_src, bias, alpha, beta):
        from cute_kernels.gemm.sm90_rung import torch_epilogue
        from tests.gemm.test_gemv_layouts import simulate

        prod = torch.empty(out.shape, dtype=torch.float64)
        for li in range(out.shape[0]):
            if self.role == "m":
                A, B = a[li].double().numpy(), b[li].t().double().numpy()
                prod[li] = torch.from_numpy(simulate(self.config, A, B))
            else:
                A, B = b[li].t().double().numpy(), a[li].double().numpy()
                prod[li] = torch.from_numpy(simulate(self.config, A, B)).t()
        out.copy_(torch_epilogue(alpha * prod, self.spec_user, beta, c_src, bias).to(out.dtype))


@pytest.fixture
def cpu_rung(monkeypatch):
    """The rung with its device check passed and its builds replaced by `_Recorder`s."""
    from cute_kernels.gemm import gemv

    monkeypatch.setattr(gemv._r, "_cuda_reason", lambda *args: None)
    made = []

    def compiled(self, config, spec, role, c_dtype, bias_dtype):
        rec = _Recorder(config, spec, role)
        made.append(rec)
        return rec

    monkeypatch.setattr(gemv.GemvRung, "compiled", compiled)
    rung = gemv.GemvRung()
    rung.made = made
    return rung


def _strided(l, rows, cols, *, unit, pad, offset, bcast, dtype=torch.bfloat16, ints=False):
    lb = 1 if bcast else l
    ld = (cols if unit == "cols" else rows) + pad
    batch = (rows if unit == "cols" else cols) * ld
    storage = (torch.randint(-3, 4, (offset + lb * batch,)) if ints else torch.randn(offset + lb * batch)).to(dtype)
    stride = (batch, ld, 1) if unit == "cols" else (batch, 1, ld)
    t = storage.as_strided((lb, rows, cols), stride, offset)
    return t.expand(l, rows, cols) if bcast else t


@pytest.mark.parametrize("seed", range(40))
def test_launch_honours_the_contract(cpu_rung, seed):
    import random

    g = random.Random(seed)
    small, big, k = g.choice((1, 3, 8, 9, 16)), g.choice((1, 5, 64, 100, 4099)), g.choice((1, 7, 64, 100, 4100))
    m, n = (small, big) if g.random() < 0.5 else (big, small)
    l = g.choice((1, 1, 2))
    a = _strided(l, m, k, unit=g.choice(("cols", "rows")), pad=g.choice((0, 1, 3)), offset=g.choice((0, 1, 2)),
                 bcast=l > 1 and g.random() < 0.3)
    b = _strided(l, k, n, unit=g.choice(("cols", "rows")), pad=g.choice((0, 1, 8)), offset=g.choice((0, 3, 4)),
                 bcast=l > 1 and g.random() < 0.3)
    out = torch.empty(l, m, n, dtype=torch.bfloat16)
    if cpu_rung.supports(a, b, out) is not None:  # only a big operand without a unit stride is declined
        assert "unit stride" in cpu_rung.supports(a, b, out)
        return
    cpu_rung(a, b, out)
    assert cpu_rung.made and cpu_rung.made[-1].launched[0].data_ptr() == a.data_ptr()


@pytest.mark.parametrize("m, n, k, a_unit, b_unit, epi", [
    (5, 40, 37, "cols", "rows", {}),
    (16, 24, 64, "rows", "cols", dict(alpha=0.5, beta=2.0, bias_dim="n", activation="relu")),
    (30, 3, 48, "cols", "rows", dict(bias_dim="n")),  # swapped roles: the bias runs along the small side
    (21, 9, 20, "rows", "cols", dict(beta=-1.0, bias_dim="m", activation="silu")),
])
def test_checked_path_end_to_end_on_cpu(cpu_rung, monkeypatch, m, n, k, a_unit, b_unit, epi):
    """The whole host path (read plan, heuristic, contract, epilogue spec in kernel terms, role
    swap) with the kernel replaced by its simulation: the result is A.B (+ the epilogue)."""
    from cute_kernels.gemm import sm90_rung
    from cute_kernels.hopper.epilogue import EpilogueSpec

    a = _strided(1, m, k, unit=a_unit, pad=1, offset=1, bcast=False, ints=True)
    b = _strided(1, k, n, unit=b_unit, pad=0, offset=0, bcast=False, ints=True)
    out = torch.full((1, m, n), float("nan"), dtype=torch.float32)
    bias_dim = epi.get("bias_dim")
    bias = torch.randint(-3, 4, (n if bias_dim == "n" else m,)).float() if bias_dim else None
    beta = epi.get("beta", 0.0)
    c = torch.randint(-3, 4, (1, m, n)).float() if beta else None
    spec = EpilogueSpec(beta_c=bool(beta), bias=bias_dim, activation=epi.get("activation"))
    monkeypatch.setattr(_Recorder, "simulate", True, raising=False)
    monkeypatch.setattr(_Recorder, "spec_user", spec, raising=False)
    cpu_rung(a, b, out, alpha=epi.get("alpha", 1.0), beta=beta, c=c, bias=bias, bias_dim=bias_dim or "n",
             activation=epi.get("activation"))
    rec = cpu_rung.made[-1]
    if rec.role == "n" and bias_dim:  # the kernel's epilogue sees C^T: bias rows and columns trade places
        assert rec.spec.bias == {"n": "m", "m": "n"}[bias_dim]
    ref = sm90_rung.torch_epilogue(epi.get("alpha", 1.0) * (a.double() @ b.double()), spec, beta, c, bias)
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-6, atol=1e-6)


def test_narrow_vectors_keep_b_in_l1():
    from cute_kernels.gemm.gemv_config import streams_whole_sectors

    assert [streams_whole_sectors("k", p, 1) for p in (1, 2, 4, 8)] == [False, False, True, True]
    assert [streams_whole_sectors("r", 8, v) for v in (1, 2, 4, 8)] == [False, True, True, True]
    assert not pick_config(4, 4096, 4097, k_run=1).stream_b and pick_config(4, 4096, 4096).stream_b


def test_warm_call_replays_the_checked_launch(cpu_rung, monkeypatch):
    """A second call of a signature skips the checks (no new build asked for) and hands the
    build the same kind of arguments, here with an extent-1 batch stride the plan must fix."""
    from cute_kernels.runtime import plan_cache

    monkeypatch.setattr(plan_cache, "PLAN_DEVICES", frozenset({"cuda", "cpu"}))
    storage = torch.randn(4099 + 8 * 1024).bfloat16()
    a = storage.as_strided((1, 8, 1024), (4099, 1024, 1))  # L = 1 with a batch stride no vector divides
    b = torch.randn(1, 512, 1024).bfloat16().transpose(1, 2)
    out = torch.empty(1, 8, 512, dtype=torch.bfloat16)
    bias = torch.randn(512, requires_grad=True)
    cpu_rung(a, b, out, bias=bias, alpha=0.5)
    first = cpu_rung.made[-1].launched
    assert len(cpu_rung._plans) == 1 and first[0].stride() == (0, 1024, 1) and not first[4].requires_grad
    n_builds = len(cpu_rung.made)
    storage2 = torch.randn(4099 + 8 * 1024).bfloat16()
    a2 = storage2.as_strided((1, 8, 1024), (4099, 1024, 1))
    cpu_rung(a2, b, out, bias=bias, alpha=2.0)
    again = cpu_rung.made[-1].launched
    assert len(cpu_rung.made) == n_builds  # the plan: no checks, no build lookup
    assert again[0].data_ptr() == a2.data_ptr() and again[0].stride() == (0, 1024, 1)
    assert again[5] == 2.0 and again[4].data_ptr() == bias.data_ptr()


def test_long_row_counts_still_split_k_over_four_warps():
    assert pick_config(1, 128256, 2048, min_warps=1).warps == 1  # the row blocks alone fill the GPU
    assert pick_config(1, 128256, 2048).warps == 4
    assert pick_config(1, 14336, 4096) == pick_config(1, 14336, 4096, min_warps=1)  # split already >= 4
    assert pick_config(1, 128256, 64).warps < 4  # K too short for two stages a warp

