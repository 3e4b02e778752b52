"""The score features models add to attention: logit soft-capping and learnable sinks, plus the
key-padding lengths of the varlen entry. Their definitions, argument checks, the rungs'
"does not implement" reason, and the sink gradient. DSL-free (torch imported inside the
functions), so the PyTorch reference and the operators' fakes use it where the DSL is absent.

Definitions (row i of a query head h, scores s_ij before masking):

- softcap c > 0 (Gemma 2): s_ij = c * tanh(scale * q_i . k_j / c), applied before the mask.
  Gradient: ds/d(q.k) = scale * (1 - tanh^2), so dS_raw = dS * (1 - t^2) with t the tanh.
- sinks (Hq,) (gpt-oss's `s_aux`): one logit per query head, in the units of s, that joins the
  softmax denominator and nothing else:
      p_ij = exp(s_ij - m_i) / (sum_j exp(s_ij - m_i) + exp(sink_h - m_i)),
  m_i the max over the row's visible scores and the sink, so the log-sum-exp the forward
  returns, lse_i = log(sum_j exp(s_ij) + exp(sink_h)), includes the sink and the backward of
  q, k, v is unchanged (P = exp(S - lse)). A row that sees no key has out 0 and lse = sink_h.
  Gradient: dsink_h = -sum over the rows of head h (every batch) of p_sink,i * D_i with
  p_sink,i = exp(sink_h - lse_i) and D_i = rowsum(dO_i * O_i) (`sinks_gradient`).
- seqused_k (B,) int32 (varlen only): sequence b uses the first seqused_k[b] of its
  cu_seqlens_k rows as keys (its key length for the mask alignment too), so a padded batch
  viewed as packed sequences needs no unpadding.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["check_softcap", "check_sinks", "feature_reason", "sinks_gradient", "FEATURES"]

# The names `feature_reason` knows, as rungs list what they take.
FEATURES = ("softcap", "sinks", "seqused_k")


def check_softcap(softcap, who: str) -> float | None:
    """softcap as a float (None: no capping). TypeError for a non-number, ValueError for a
    value that is not finite and > 0."""
    if softcap is None:
        return None
    if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool):
        raise TypeError(f"{who}: softcap must be a positive float or None, got {type(softcap).__name__}")
    value = float(softcap)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{who}: softcap must be finite and > 0 (s = softcap * tanh(scale * q.k / softcap)), "
                         f"got {softcap!r}")
    return value


def check_sinks(sinks, heads_q: int, q, who: str):
    """Validate sinks against the query (a tensor, 1-D of shape (Hq,), float32 or the query's
    dtype, on the query's device); return it (None stays None). TypeError/ValueError name the
    problem."""
    if sinks is None:
        return None
    import torch

    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"{who}: sinks must be a torch.Tensor of shape ({heads_q},) or None, got "
                        f"{type(sinks).__name__}")
    if sinks.dim() != 1 or sinks.shape[0] != heads_q:
        raise ValueError(f"{who}: sinks must have shape ({heads_q},) (one logit per query head), got "
                         f"{tuple(sinks.shape)}")
    if sinks.dtype not in (torch.float32, q.dtype) or not sinks.dtype.is_floating_point:
        raise TypeError(f"{who}: sinks must be float32 or the query's dtype ({q.dtype}), got {sinks.dtype}")
    if sinks.device != q.device:
        raise ValueError(f"{who}: sinks is on {sinks.device} but the query is on {q.device}")
    return sinks


def feature_reason(problem, takes=()) -> str | None:
    """Why a rung that implements only the features in `takes` (names of `FEATURES`) cannot run
    `problem` (an `api.AttentionProblem`), or None."""
    used = []
    if getattr(problem, "softcap", None) is not None:
        used.append("softcap")
    if getattr(problem, "sinks", False):
        used.append("sinks")
    if getattr(problem, "seqused_k", False):
        used.append("seqused_k")
    missing = [name for name in used if name not in takes]
    if not missing:
        return None
    return f"{' and '.join(missing)} not implemented on this rung"


def sinks_gradient(dout, out, lse, sinks, *, packed: bool = False):
    """dsinks (Hq,) in sinks' dtype: -sum over every row of head h of exp(sink_h - lse) *
    rowsum(dout * out), from the forward's out and lse (which includes the sink). Dense:
    out, dout (..., Hq, Sq, Dv), lse (..., Hq, Sq); packed (varlen): out, dout (Tq, Hq, Dv),
    lse (Hq, Tq). Accumulated in fp32 (fp64 for fp64 inputs)."""
    import torch

    acc = torch.promote_types(torch.promote_types(out.dtype, torch.float32), sinks.dtype)
    d = torch.einsum("...d,...d->...", dout.to(acc), out.to(acc))
    if packed:
        d = d.transpose(0, 1)
    lse = lse.to(acc)
    sink = sinks.to(acc)[:, None]  # against (..., Hq, rows)
    # A sink of -inf takes no share (exp(-inf - lse) would be NaN where lse is -inf too).
    p_sink = torch.where(torch.isneginf(sink), 0.0, torch.exp(sink - lse))
    dims = [i for i in range(lse.dim()) if i != lse.dim() - 2]
    return (-(p_sink * d).sum(dim=dims)).to(sinks.dtype)
