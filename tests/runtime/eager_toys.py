"""The toy plan the eager-path tests share (test_eager.py, test_eager_sequences.py): scale * x @ w,
saving x and w for its backward. Subclasses say what `run` checks and counts."""

from __future__ import annotations

from cute_kernels.runtime.eager import Plan


class ScaledMatmulPlan(Plan):
    __slots__ = ()

    def forward(self, ctx, x, w, scale):
        ctx.save_for_backward(x, w)
        ctx.scale = scale
        return self.run(x, w, scale)

    @staticmethod
    def grads(ctx, g):
        x, w = ctx.saved_tensors
        return ctx.scale * g @ w.T, ctx.scale * x.T @ g, None
