"""The additive rule token by token (torch): ``attnx::gated_delta_rule`` for narrow values.

Per batch row and value head, with S the (d_k, d_v) state and g_t one log-decay per head or per key
dimension:

    S_t = diag(exp(g_t)) S_{t-1} + k_t (beta_t v_t)^T,   o_t = scale * S_t^T q_t.

Every step is an elementwise multiply-add on the state: O(d_k d_v) per token and head, no exponent
above 0. The chunked form (:mod:`attnx.plugins.gated._chunks`) pays for (C, C) scores per chunk and
head, which with a value of width 1 (Mamba1's selective scan: one value head per channel) is C times the
work of the state itself; :func:`attnx.plugins.gated.config.by_token` says when this form runs instead.
"""

from __future__ import annotations

import torch


def gated_tokens(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    *,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The additive rule over q, k (b, hk, n, dk), v (b, hv, n, dv), g (b, hv, n, 1 | dk), beta (b, hv, n)
    after ``state`` (b, hv, dk, dv; None: zeros), one token at a time.

    Returns the output (b, hv, n, dv) and the state after the last token, both in float32 (float64 for
    float64 inputs). q/k head i serves value heads i*r .. i*r + r - 1 (r = hv // hk) without copying q, k.
    """
    dtype = torch.promote_types(v.dtype, torch.float32)
    batch, hk, n, dk = q.shape
    hv, dv = v.shape[1], v.shape[-1]

    def grouped(x: torch.Tensor) -> torch.Tensor:  # (b, hv, ...) -> (b, hk, r, ...)
        return x.to(dtype).unflatten(1, (hk, hv // hk))

    s = q.new_zeros((batch, hk, hv // hk, dk, dv), dtype=dtype) if state is None else grouped(state)
    queries, keys = (x.to(dtype)[:, :, None, :, :, None] for x in (q, k))  # (b, hk, 1, n, dk, 1)
    values = (grouped(v) * grouped(beta)[..., None])[..., None, :]  # (b, hk, r, n, 1, dv)
    decays = grouped(g).exp()[..., None]  # (b, hk, r, n, 1 | dk, 1)
    outputs = []
    for t in range(n):
        s = decays[:, :, :, t] * s + keys[:, :, :, t] * values[:, :, :, t]
        outputs.append((s * queries[:, :, :, t]).sum(-2))
    out = torch.stack(outputs, dim=3) if outputs else s.new_zeros((batch, hk, hv // hk, 0, dv))
    return scale * out.flatten(1, 2), s.flatten(1, 2).contiguous()
