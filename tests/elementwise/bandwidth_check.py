"""Temporary device-side measurement script (not a test): copy bandwidth and GEMM speed."""
import json, os, traceback
import torch
from triton.testing import do_bench

res = {}
def report(k, v):
    res[k] = v
    print(k, v, flush=True)

def section(fn):
    try:
        fn()
    except Exception:
        traceback.print_exc()

def copy_bw():
    from cute_kernels.elementwise import copy, CopyConfig
    n_bytes = 2 * 2**30
    src = torch.randn(n_bytes // 4, device="cuda")
    dst = torch.empty_like(src)
    t = do_bench(lambda: dst.copy_(src), warmup=25, rep=200)
    report("torch_copy_GBps", round(2 * n_bytes / t / 1e6))
    for cfg in [CopyConfig(), CopyConfig(256, 16, 8), CopyConfig(128, 16, 8), CopyConfig(512, 16, 4), CopyConfig(256, 16, 2), CopyConfig(1024, 16, 4)]:
        copy(src, dst, config=cfg)
        torch.cuda.synchronize()
        assert torch.equal(dst, src)
        t = do_bench(lambda: copy(src, dst, config=cfg), warmup=25, rep=200)
        report(f"cute_copy_{cfg.threads}x{cfg.vector_bytes}Bx{cfg.vectors_per_thread}_GBps", round(2 * n_bytes / t / 1e6))
    s2 = torch.randn(2**20, device="cuda"); d2 = torch.empty_like(s2)
    report("copy_4MB_cute_us", round(do_bench(lambda: copy(s2, d2)) * 1e3, 1))
    report("copy_4MB_torch_us", round(do_bench(lambda: d2.copy_(s2)) * 1e3, 1))

def gemm():
    from cute_kernels.gemm import matmul
    torch.backends.cuda.matmul.allow_tf32 = False
    for size in (1024, 4096):
        a = torch.randn(size, size, device="cuda"); b = torch.randn(size, size, device="cuda")
        flop = 2 * size**3
        ref = a.double() @ b.double()
        report(f"cublas_sgemm_{size}_TFLOPs", round(flop / do_bench(lambda: torch.matmul(a, b), warmup=10, rep=100) / 1e9, 2))
        for k in ("naive", "simt_smem"):
            try:
                out = matmul(a, b, kernel=k)
                report(f"{k}_{size}_rel_err", float(((out.double() - ref).norm() / ref.norm()).item()))
                report(f"{k}_{size}_TFLOPs", round(flop / do_bench(lambda: matmul(a, b, kernel=k), warmup=3, rep=100) / 1e9, 2))
            except Exception:
                traceback.print_exc()
    a = torch.randn(4096, 4096, device="cuda").t().contiguous().t(); b = torch.randn(4096, 4096, device="cuda")
    report("simt_smem_4096_nn_colA_TFLOPs", round(2 * 4096**3 / do_bench(lambda: matmul(a, b, kernel="simt_smem"), warmup=3, rep=100) / 1e9, 2))

section(copy_bw)
section(gemm)
out = os.environ.get("OUT")
if out:
    open(os.path.join(out, "bandwidth.json"), "w").write(json.dumps(res, indent=1))
