"""The attention mask rule in plain Python (no DSL, torch only inside `dense_mask`): which
(query i, key j) pairs a row may attend to, and how a public `window_size` becomes the bounds.

`mask` re-exports these names next to the kernel-side implementation (`mask.apply_mask`), whose
module imports the DSL; the PyTorch reference (`cute_kernels.ops.attention_reference`) and the
argument checks (`api`, `varlen`) use this module, so they run where the DSL is not installed.

Definitions, for seqlen_q rows and seqlen_k columns:

- Sequence end: j < seqlen_k always.
- Causal, aligned top-left (PyTorch's `is_causal=True`): j <= i.
- Causal, aligned bottom-right (`torch.nn.attention.bias.causal_lower_right`, FlashAttention's
  convention): j <= i + (seqlen_k - seqlen_q).
- Sliding window (FlashAttention's `window_size=(left, right)`): also
  i + base - left <= j <= i + base + right for the bounds that are given, where `base` is the
  diagonal's alignment offset (0 top-left, seqlen_k - seqlen_q bottom-right); a window without
  causality is aligned bottom-right, as in FlashAttention. Causality is the right bound 0.

Rows with no allowed key have output 0 and log-sum-exp -inf.
"""

from __future__ import annotations

import numbers

__all__ = ["ALIGNMENTS", "causal_offset", "window_offsets", "allowed", "dense_mask", "canonical_window"]

ALIGNMENTS = ("top_left", "bottom_right")


def causal_offset(seqlen_q: int, seqlen_k: int, align: str) -> int:
    """The column shift of the causal diagonal: row i sees columns j <= i + offset."""
    if align == "top_left":
        return 0
    if align == "bottom_right":
        return seqlen_k - seqlen_q
    raise ValueError(f"causal alignment must be one of {ALIGNMENTS}, got {align!r}")


def window_offsets(seqlen_q: int, seqlen_k: int, *, causal: bool = False, align: str = "top_left",
                   window_left: int | None = None, window_right: int | None = None):
    """(upper, lower): row i may attend to j <= i + upper and j >= i + lower; None where that
    side is unbounded. Windows without causality are aligned bottom-right."""
    for name, w in (("window_left", window_left), ("window_right", window_right)):
        if w is not None and (not isinstance(w, int) or w < 0):
            raise ValueError(f"{name} must be None or an int >= 0, got {w!r}")
    if causal:
        if window_right not in (None, 0):
            raise ValueError(f"a causal mask bounds the window on the right at 0; got window_right={window_right}")
        base = causal_offset(seqlen_q, seqlen_k, align)
        window_right = 0
    else:
        base = seqlen_k - seqlen_q
    upper = None if window_right is None else base + window_right
    lower = None if window_left is None else base - window_left
    return upper, lower


def allowed(i: int, j: int, seqlen_q: int, seqlen_k: int, *, causal: bool = False, align: str = "top_left",
            window_left: int | None = None, window_right: int | None = None) -> bool:
    """Whether query row i may attend to key column j (the module docstring's definition)."""
    upper, lower = window_offsets(seqlen_q, seqlen_k, causal=causal, align=align, window_left=window_left,
                                  window_right=window_right)
    if not (0 <= i < seqlen_q and 0 <= j < seqlen_k):
        return False
    if upper is not None and j > i + upper:
        return False
    return lower is None or j >= i + lower


def dense_mask(seqlen_q: int, seqlen_k: int, *, causal: bool = False, align: str = "top_left",
               window_left: int | None = None, window_right: int | None = None, device=None):
    """The boolean (seqlen_q, seqlen_k) torch tensor of `allowed` (True = attend)."""
    import torch

    upper, lower = window_offsets(seqlen_q, seqlen_k, causal=causal, align=align, window_left=window_left,
                                  window_right=window_right)
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if upper is not None:
        keep &= j <= i + upper
    if lower is not None:
        keep &= j >= i + lower
    return keep


def canonical_window(window_size, causal, who: str) -> tuple[str | None, int | None, int | None]:
    """(causal, window_left, window_right) of a public (causal, `window_size`) pair, as
    `AttentionProblem` stores them: None for an unbounded side.

    window_size: None (no window) or a pair (left, right) of ints >= -1, -1 meaning unbounded
    (FlashAttention's convention). With a causal mask the right bound is the diagonal, so right
    may only be -1 or 0 and is stored as None (causality bounds it). A window without
    causality whose right bound is 0 is bottom-right causality (its diagonal is aligned
    bottom-right), and is stored so. One mask, one form: problems, configs and plans key alike.
    Raises TypeError for anything but a pair of ints, ValueError for values below -1 and for a
    causal mask with right > 0; `who` names the entry point in the message. `causal` itself is
    not checked here."""
    if window_size is None:
        return causal, None, None
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or not all(
            isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in window_size):
        raise TypeError(f"{who}: window_size must be None or a pair of ints (left, right), -1 for an unbounded "
                        f"side; got {window_size!r}")
    left, right = (int(w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"{who}: window_size values must be >= -1 (-1 = unbounded), got ({left}, {right})")
    if causal is not None and right > 0:
        raise ValueError(f"{who}: a causal mask bounds the window on the right at 0 (keys after the diagonal are "
                         f"masked), so window_size=({left}, {right}) contradicts it; pass right -1 or 0")
    if causal is None and right == 0:
        causal = "bottom_right"
    left = None if left == -1 else left
    right = None if right == -1 or causal is not None else right
    return causal, left, right
