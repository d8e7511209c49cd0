"""Reformer LSH attention in torch: the maths behind ``attnx::reformer_attention``.

Shapes: ``qk``/``v`` (b, h, n, d), rotations (h, d, n_hashes, n_buckets/2); inside,
``r`` indexes hash rounds, ``n_pad`` is n rounded up to a multiple of the chunk size
``c`` and ``nc = n_pad / c``. The ONNX bodies in :mod:`attnx.plugins.reformer.kernel`
follow these steps, so both backends round the same way; only their masks and duplicate
counts are arranged more cheaply, to the same (boolean and integer) values.
"""

from __future__ import annotations

import torch

from attnx.attention import MASKED_SCORE
from attnx.ops import at_least_float32

# Score of a token for itself: it wins only when nothing else is visible (the paper
# subtracts 1e5 instead; either way the token's weight is exactly 0 otherwise).
SELF_SCORE = MASKED_SCORE
# k = qk / sqrt(|qk|^2 + NORM_EPS): the paper's unit-length keys, finite for qk = 0.
NORM_EPS = 1e-6


def hash_buckets(qk: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH: bucket = argmax([x R, -x R]) per head and round -> int64 (b, h, r, n).

    Projected in float32 (float64 stays float64) whatever the input dtype: fp16 rounding would flip
    near-tied buckets.
    """
    heads, d, rounds, half = rotations.shape
    wide = at_least_float32(qk)
    flat = rotations.to(wide.dtype).reshape(heads, d, rounds * half)
    projected = torch.matmul(wide, flat)  # (b, h, n, r*half)
    projected = projected.unflatten(-1, (rounds, half)).transpose(2, 3)  # (b, h, r, n, half)
    return torch.cat([projected, -projected], dim=-1).argmax(dim=-1)


def sort_by_bucket(buckets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per round, sort positions by (bucket, position); returns (perm, rank), both (b, h, r, n).

    ``perm[s]`` is the position at sorted slot s; ``rank`` is its inverse. The key
    ``bucket * n + position`` has no ties, so any sort gives this one order.
    """
    n = buckets.shape[-1]
    positions = torch.arange(n, device=buckets.device).expand_as(buckets)
    perm = torch.argsort(buckets * n + positions, dim=-1)
    rank = torch.zeros_like(perm).scatter(-1, perm, positions)
    return perm, rank


def gather_sorted(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """(b, h, n, f) in original order -> (b, h, r, n, f) in each round's sorted order."""
    shape = (*perm.shape, x.shape[-1])
    return torch.gather(x.unsqueeze(2).expand(shape), 3, perm.unsqueeze(-1).expand(shape))


def chunked(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(b, h, r, n_pad, ...) -> (b, h, r, nc, c, ...)."""
    return x.unflatten(3, (-1, chunk_size))


def look_back(x: torch.Tensor, fill: int | None = None) -> torch.Tensor:
    """Each chunk's keys: the previous chunk then its own, (b, h, r, nc, 2c, ...).

    The first chunk has no previous one (no wrap-around): its look-back half is a chunk of
    ``fill`` where given (positions and buckets: -1 matches nothing), else the last chunk,
    whose keys the -1 buckets and positions then hide.
    """
    first = x[:, :, :, -1:] if fill is None else torch.full_like(x[:, :, :, :1], fill)
    return torch.cat([torch.cat([first, x[:, :, :, :-1]], dim=3), x], dim=4)


def in_window(q_rank: torch.Tensor, k_rank: torch.Tensor, chunk_size: int, causal: bool) -> torch.Tensor:
    """Whether a key at sorted index ``k_rank`` is in the window of a query at ``q_rank`` (one round).

    One rule, 0 <= q // u - k // u <= limit, in two units: bidirectional (the paper), u = chunk_size
    and limit 1, i.e. the query's own sorted chunk or the previous one; causal, u = 1 and
    limit = chunk_size, i.e. the query and its ``chunk_size`` sorted predecessors. For keys of the
    query's bucket the causal gap counts that bucket's tokens at positions in [j, i), so it never
    depends on a later token (the paper's chunks do), and it is > 0 exactly when j < i. The causal
    window lies inside the bidirectional one, so the chunked layout holds every visible key.
    """
    unit, limit = (1, chunk_size) if causal else (chunk_size, 1)
    gap = torch.div(q_rank, unit, rounding_mode="floor") - torch.div(k_rank, unit, rounding_mode="floor")
    return (gap >= 0) & (gap <= limit)


def duplicate_counts(
    buckets: torch.Tensor, rank: torch.Tensor, perm: torch.Tensor, chunk_size: int, causal: bool
) -> torch.Tensor:
    """N_ij: in how many rounds key j shares query i's bucket and is in its :func:`in_window`.

    Returns (b, h, r, nc, c, 2c) in each round's chunked layout. Appendix A's m_ij = log N_ij:
    subtracted from visible scores, so a key found by several rounds counts once.
    """
    per_round = [chunked(gather_sorted(t.transpose(2, 3), perm), chunk_size) for t in (buckets, rank)]
    q_bucket, q_rank = (t.unsqueeze(-2) for t in per_round)  # (b, h, r, nc, c, 1, R)
    k_bucket, k_rank = (look_back(t).unsqueeze(-3) for t in per_round)  # (b, h, r, nc, 1, 2c, R)
    return ((q_bucket == k_bucket) & in_window(q_rank, k_rank, chunk_size, causal)).sum(-1)


def merge_rounds(top: torch.Tensor, mixed: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Undo each round's sort and combine: sum_r e^(m_r - max m) num_r / sum_r e^(m_r - max m) den_r.

    Inputs are chunked per round, (b, h, r, nc, c, ...): the row max m and ``mixed`` =
    sum_j e^(s_j - m) [v_j, 1], i.e. the numerator with the denominator as its last feature;
    the result (b, h, n_pad, f) equals sum_r exp(lse_r - logsumexp_r lse_r) o_r.
    """
    unsort = rank.unsqueeze(-1)
    mixed, top = (t.flatten(3, 4) for t in (mixed, top))
    mixed = torch.gather(mixed, 3, unsort.expand_as(mixed))
    top = torch.gather(top, 3, unsort)
    scaled = (torch.exp(top - top.amax(2, keepdim=True)) * mixed).sum(2)
    return scaled[..., :-1] / scaled[..., -1:]


def lsh_attention(
    qk: torch.Tensor,
    v: torch.Tensor,
    rotations: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    chunk_size: int,
) -> torch.Tensor:
    """Multi-round shared-QK LSH attention (Reformer, arXiv 2001.04451, sec. 2 and appendix A).

    Per round r: sort by (bucket, position), split into chunks of ``chunk_size``, and let
    each query see the keys of its bucket (not itself, not padded) in its :func:`in_window`:
    its own and the previous chunk (the paper), or when ``causal`` its ``chunk_size`` sorted
    predecessors, a subset of those two chunks that no later token can change (the paper's
    causal chunks can); scores q_i . k_j - log N_ij. Rounds are combined with logsumexp weights,
    out = sum_r exp(lse_r - logsumexp_r lse_r) out_r, computed in the equivalent
    (max, sum) form so that no large constant is added to a logarithm.
    Padded tokens (``key_padding_mask`` False, and the internal padding up to a multiple
    of the chunk size) go to an extra last bucket, so real tokens are sorted and
    chunked exactly as if the padding were absent.
    """
    n = qk.shape[-2]
    n_buckets = 2 * rotations.shape[-1]
    n_pad = -(-n // chunk_size) * chunk_size
    qk = torch.nn.functional.pad(qk, (0, 0, 0, n_pad - n))
    v = torch.nn.functional.pad(v, (0, 0, 0, n_pad - n))
    # A ones feature: the softmax denominator comes out of the same matmul as the numerator, a
    # sum over the window in key order wherever the query's keys sit in it. A row sum's rounding
    # depends on their columns, which later tokens can shift: causal outputs would move by 1 ulp.
    v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    real = torch.arange(n_pad, device=qk.device) < n
    if key_padding_mask is not None:
        real = real & torch.nn.functional.pad(key_padding_mask, (0, n_pad - n))[:, None, None, :]
    buckets = torch.where(real, hash_buckets(qk, rotations), n_buckets)
    perm, rank = sort_by_bucket(buckets)

    wide = at_least_float32(qk)  # the squared norm of |qk| > 256 overflows fp16
    keys = (wide / torch.sqrt(wide.square().sum(-1, keepdim=True) + NORM_EPS)).to(qk.dtype)
    q_sorted = chunked(gather_sorted(qk, perm), chunk_size)
    k_window = look_back(chunked(gather_sorted(keys, perm), chunk_size))
    v_window = look_back(chunked(gather_sorted(v, perm), chunk_size))
    q_pos = chunked(perm, chunk_size)
    q_bucket = chunked(torch.gather(buckets, -1, perm), chunk_size)
    k_pos = look_back(q_pos, fill=-1)[..., None, :]
    k_bucket = look_back(q_bucket, fill=-1)[..., None, :]
    q_pos, q_bucket = q_pos[..., None], q_bucket[..., None]

    counts = duplicate_counts(buckets, rank, perm, chunk_size, causal)
    scores = torch.matmul(q_sorted, k_window.transpose(-1, -2)) - torch.log(counts.clamp_min(1).to(qk.dtype))
    # Sorted indices minus the previous chunk's start: keys 0..2c-1, queries c..2c-1. For keys of
    # the query's bucket (not itself) the causal window also implies an earlier position.
    slots = torch.arange(2 * chunk_size, device=qk.device)
    window = in_window(slots[chunk_size:, None], slots, chunk_size, causal)  # (c, 2c)
    visible = (q_bucket == k_bucket) & (q_bucket < n_buckets) & (k_pos != q_pos) & window
    hidden = torch.full_like(scores, float("-inf")).masked_fill(k_pos == q_pos, SELF_SCORE)
    scores = torch.where(visible, scores, hidden)

    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - top)
    out = merge_rounds(top, torch.matmul(weights, v_window), rank)
    return out[:, :, :n]
