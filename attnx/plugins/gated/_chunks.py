"""The gated / delta-rule recurrence in chunks (torch): the maths behind ``attnx::gated_delta_rule``.

Per batch row and value head, with S the (d_k, d_v) state, D_t = diag(exp(g_t)), g_t <= 0:

    S_t = D_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - (D_t S_{t-1})^T k_t)  (delta)  or  beta_t v_t,
    o_t = scale * S_t^T q_t.

A chunk of C tokens after the state S_0, with G_t = g_1 + ... + g_t (cumulated inside the chunk), is

    S_C = diag(exp(G_C)) S_0 + K~^T U,   K~_j = exp(G_C - G_j) * k_j,
    O   = scale (Q^ S_0 + P U),          Q^_i = exp(G_i) * q_i,   P_ij = q_i . (exp(G_i - G_j) * k_j), j <= i,

and the delta rule's U solves (I + A) U = diag(beta) (V - (exp(G) * K) S_0) with A strictly lower
triangular, A_ij = beta_i k_i . (exp(G_i - G_j) * k_j) (the WY/UT form): U = U_b - W S_0 with
U_b = (I + A)^-1 diag(beta) V and W = (I + A)^-1 diag(beta) (exp(G) * K), both free of S_0. So every
chunk's P, A, U_b, W are computed at once; only S is carried from chunk to chunk (a loop over chunks,
never over tokens), and the outputs of all chunks come out of one product with the stacked states.

Every exponent is <= 0, so nothing overflows however strong the decay (g = -30 per token underflows to
exact zeros). A scalar decay per head gives the (C, C) matrix exp(G_i - G_j) directly. A decay per key
dimension sits inside the dot products; it is never factored as exp(G_i) exp(-G_j) (which overflows):
the chunk is cut into blocks of s tokens (s the largest power of two with s^2 <= C); a pair of tokens
in different blocks is factored through the decay up to the start of the later token's block, both
factors <= 1, and a pair inside one block is summed per key dimension (:func:`per_key_scores`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnx.plugins.gated.config import chunk_plan


def gated_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    *,
    delta: bool,
    scale: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence over q, k (b, hk, n, dk), v (b, hv, n, dv), g (b, hv, n, 1 | dk), beta (b, hv, n)
    after ``state`` (b, hv, dk, dv; None: zeros).

    Returns the output (b, hv, n, dv) and the state after the last token, both in float32 (float64 for
    float64 inputs). q/k head i serves value heads i*r .. i*r + r - 1 (r = hv // hk) without copying q, k.
    """
    dtype = torch.promote_types(v.dtype, torch.float32)
    batch, hk, n, dk = q.shape
    hv, dv = v.shape[1], v.shape[-1]
    per_key = g.shape[-1] != 1

    def grouped(x: torch.Tensor) -> torch.Tensor:  # (b, hv, ...) -> (b, hk, r, ...)
        return x.to(dtype).unflatten(1, (hk, hv // hk))

    start = q.new_zeros((batch, hk, hv // hk, dk, dv), dtype=dtype) if state is None else grouped(state)
    if n == 0:
        return v.new_zeros(v.shape, dtype=dtype), start.flatten(1, 2).clone()
    length, size = chunk_plan(n, chunk_size, per_key)
    pad = -n % length

    def chunks(x: torch.Tensor) -> torch.Tensor:  # (..., n, d) -> (..., n_chunks, C, d)
        return F.pad(x, (0, 0, 0, pad)).unflatten(-2, (-1, length))

    queries, keys = (chunks(x.to(dtype).unsqueeze(2)) for x in (q, k))  # (b, hk, 1, nc, C, dk)
    values, decay = chunks(grouped(v)), chunks(grouped(g)).cumsum(-2)  # (b, hk, r, nc, C, d)
    rate = chunks(grouped(beta).unsqueeze(-1))  # (b, hk, r, nc, C, 1)
    rows = [queries, keys] if delta else [queries]
    inner, *among_keys = (
        per_key_scores(rows, keys, decay, size) if per_key else scalar_scores(rows, keys, decay)
    )
    last = decay[..., -1:, :]
    to_end = keys * (last - decay).exp()  # K~
    if delta:
        weights = rate * among_keys[0].tril(-1)  # A
        known = torch.cat((rate * values, rate * decay.exp() * keys), dim=-1)
        solved = torch.linalg.solve_triangular(weights, known, upper=False, unitriangular=True)
        updates, retrieve = solved.split((dv, dk), dim=-1)  # U_b, W
    else:
        updates, retrieve = rate * values, None
    states, updates, final = carry(start, updates, retrieve, to_end, last.exp().transpose(-1, -2))
    out = scale * ((queries * decay.exp()) @ states + inner @ updates)
    return out.flatten(3, 4)[..., :n, :].flatten(1, 2).contiguous(), final.flatten(1, 2).contiguous()


def carry(
    start: torch.Tensor,
    updates: torch.Tensor,
    retrieve: torch.Tensor | None,
    to_end: torch.Tensor,
    chunk_decay: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Carry the state S through the chunks (axis -3): S' = diag(chunk_decay) S + K~^T U.

    The additive rule's U is ``updates``; the delta rule's is U_b - W S (``updates`` U_b, ``retrieve``
    W), known only once S is. Returns the state before each chunk (..., nc, dk, dv), U and the last state.
    """
    if retrieve is None:
        increments = to_end.transpose(-1, -2) @ updates
        before = []
        for index in range(updates.shape[-3]):
            before.append(start)
            start = chunk_decay[..., index, :, :] * start + increments[..., index, :, :]
        return torch.stack(before, dim=-3), updates, start
    before, solved = [], []
    for index in range(updates.shape[-3]):
        before.append(start)
        update = updates[..., index, :, :] - retrieve[..., index, :, :] @ start
        solved.append(update)
        start = chunk_decay[..., index, :, :] * start + to_end[..., index, :, :].transpose(-1, -2) @ update
    return torch.stack(before, dim=-3), torch.stack(solved, dim=-3), start


def scalar_scores(rows: list[torch.Tensor], keys: torch.Tensor, decay: torch.Tensor) -> list[torch.Tensor]:
    """row_i . (exp(G_i - G_j) keys_j) for j <= i, 0 above, for each of ``rows``, with the cumulated decay G
    (..., C, 1) one scalar per token: (..., C, C) each, from one decay matrix."""
    cumulated = decay[..., 0]
    keep = torch.ones(cumulated.shape[-1], cumulated.shape[-1], dtype=torch.bool, device=keys.device).tril()
    pairwise = (cumulated[..., :, None] - cumulated[..., None, :]).masked_fill(~keep, float("-inf")).exp()
    keys_t = keys.transpose(-1, -2)
    return [(x @ keys_t) * pairwise for x in rows]


def per_key_scores(
    rows: list[torch.Tensor], keys: torch.Tensor, decay: torch.Tensor, size: int
) -> list[torch.Tensor]:
    """:func:`scalar_scores` with the cumulated decay G (..., C, dk) one value per key dimension.

    In blocks of s tokens: for key j in an earlier block than row i, exp(G_i - G_j) = exp(G_i - G_b)
    exp(G_b - G_j), G_b the decay before i's block, so the rows scaled once per block meet the keys scaled
    once per later block in one product; inside a block the pairs are summed per key dimension. Every
    exponent is <= 0 (pairs in no order are clamped to exp(0), then masked).
    """
    length = decay.shape[-2]
    n_blocks = length // size
    key_blocks, decay_blocks = (x.unflatten(-2, (n_blocks, size)) for x in (keys, decay))  # (..., m, s, d)
    before = F.pad(decay_blocks[..., :-1, -1, :], (0, 0, 1, 0))[..., None, :]  # G before each block
    row_decay = (decay_blocks - before).exp()
    scaled_keys = (
        keys[..., None, :, :] * (before - decay[..., None, :, :]).clamp(max=0).exp()
    )  # (..., m, C, dk)
    pair_gap = decay_blocks[..., :, None, :] - decay_blocks[..., None, :, :]  # [i, j] = G_i - G_j
    paired_keys = key_blocks[..., None, :, :] * pair_gap.clamp(max=0).exp()  # (..., m, s, s, dk)
    options = {"dtype": keys.dtype, "device": keys.device}
    blocks = torch.ones(n_blocks, n_blocks, **options).tril(-1)[:, None, :, None]
    earlier_blocks = blocks.expand(n_blocks, size, n_blocks, size).reshape(length, length)
    keep = torch.ones(size, size, dtype=torch.bool, device=keys.device).tril()
    diagonal = torch.eye(n_blocks, **options)[:, None, :, None]  # (m, 1, m, 1)

    def scores(x: torch.Tensor) -> torch.Tensor:
        x_blocks = x.unflatten(-2, (n_blocks, size))
        earlier = ((x_blocks * row_decay) @ scaled_keys.transpose(-1, -2)).flatten(-3, -2) * earlier_blocks
        within = (x_blocks[..., :, None, :] * paired_keys).sum(-1).masked_fill(~keep, 0.0)  # (..., m, s, s)
        return earlier + (within.unsqueeze(-2) * diagonal).flatten(-4, -3).flatten(-2, -1)

    return [scores(x) for x in rows]
