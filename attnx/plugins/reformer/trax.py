"""The trax layout of Reformer attention in torch: ``attnx::reformer_trax_attention`` and
``attnx::reformer_local_attention``.

This is what the authors' trax code and Hugging Face transformers' ``LSHSelfAttention`` /
``LocalSelfAttention`` compute, so that models trained with them export unchanged
(``layout="trax"``; the paper's rule is :mod:`attnx.plugins.reformer.lsh`):

* the rounds are sorted jointly: round r's sorted chunks follow round r - 1's, and a chunk's
  window is the ``before`` chunks before it and the ``after`` chunks after it in that joint
  sequence, cyclically (the first chunk of round r sees the last chunk of round r - 1, and the
  first chunk of round 0 the last chunk of the last round), as a multiset: a key that falls in
  the window twice counts twice, and no duplicate correction across rounds is made;
* every key of the window is visible, whatever its bucket; padded keys score
  :data:`MASKED_SCORE`, and so do later keys when causal (by original position, within the
  window); a query's own key scores :data:`SELF_SCORE` (LSH only);
* keys are the shared QK vectors normalised as trax does, x / sqrt(mean(x²) + 1e-6) / sqrt(d);
* padded tokens (the mask and the padding up to a multiple of the chunk size) hash into an
  extra last bucket, as in trax; a padded query still attends to the real keys of its window.

Local attention is the same chunked window over unsorted positions, with its own key
projection, keys scaled by 1/sqrt(d) and no self mask. For n <= chunk size a round is one
chunk and the window is that chunk alone: the full attention these libraries switch to there.
"""

from __future__ import annotations

import math

import torch

from attnx.plugins.reformer.lsh import gather_sorted, hash_buckets, sort_by_bucket

SELF_SCORE = -1e5  # trax / HF: a query's own key, float32 (HF uses -1e3 in float16)
MASKED_SCORE = -1e9  # trax / HF: padded and (causal) later keys, float32 (-1e4 in float16)
LEN_NORM_EPS = 1e-6  # trax / HF ``_len_norm``: x / sqrt(mean(x²) + eps)


def trax_keys(qk: torch.Tensor) -> torch.Tensor:
    """Shared-QK keys as trax normalises them: x · rsqrt(mean(x²) + 1e-6) / sqrt(d)."""
    variance = qk.square().mean(-1, keepdim=True)
    return qk * torch.rsqrt(variance + LEN_NORM_EPS) / math.sqrt(qk.shape[-1])


def window_index(chunks: int, before: int, after: int, device: torch.device) -> torch.Tensor:
    """(chunks, before + 1 + after): the chunks of each chunk's window, cyclically, in key order."""
    offsets = torch.arange(-before, after + 1, device=device)
    return torch.remainder(torch.arange(chunks, device=device)[:, None] + offsets, chunks)


def window_span(n_pad: int, chunk_size: int, before: int, after: int) -> tuple[int, int]:
    """The chunks before and after a chunk's own that its window holds: none when a round is one chunk.

    Then every neighbour is the same tokens again (in another round's order), so the window is the
    full attention trax switches to for n <= chunk size, each key once: a key seen twice is the
    same softmax, but a query that sees only itself twice scores ``SELF_SCORE`` + log 2 in float32,
    which rounds (its output would be 0.998 v_i, not v_i).
    """
    return (0, 0) if n_pad == chunk_size else (before, after)


def windowed(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(b, h, g, c, ...) chunks -> (b, h, g, w·c, ...) windows (``index`` from :func:`window_index`)."""
    picked = x[:, :, index]  # (b, h, g, w, c, ...)
    return picked.flatten(3, 4)


def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    real: torch.Tensor,
    causal: bool,
    chunk_size: int,
    before: int,
    after: int,
    self_masked: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each chunk to its cyclic window, with trax's masks.

    ``q``, ``k``, ``v`` (b, h, g·c, f) in chunk order; ``q_pos`` (b, h, g·c) the original position
    of each slot; ``real`` (b, n_pad) whether a position is a real token. Returns the output
    (b, h, g·c, f) and the row logsumexp (b, h, g·c), both in chunk order.
    """
    chunks = q.shape[2] // chunk_size
    index = window_index(chunks, before, after, q.device)
    q, k, v, pos = (t.unflatten(2, (chunks, chunk_size)) for t in (q, k, v, q_pos))
    k_window, v_window, k_pos = windowed(k, index), windowed(v, index), windowed(pos, index)
    scores = torch.matmul(q, k_window.transpose(-1, -2))  # (b, h, g, c, w·c)
    k_real = torch.gather(real[:, None, None, :].expand(*k_pos.shape[:3], -1), 3, k_pos)
    visible = k_real[..., None, :]
    if causal:
        visible = visible & (pos[..., :, None] >= k_pos[..., None, :])
    scores = torch.where(visible, scores, torch.tensor(MASKED_SCORE, dtype=scores.dtype))
    if self_masked:
        is_self = pos[..., :, None] == k_pos[..., None, :]
        scores = torch.where(is_self, torch.tensor(SELF_SCORE, dtype=scores.dtype), scores)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    out = torch.matmul(torch.exp(scores - lse), v_window)
    return out.flatten(2, 3), lse.squeeze(-1).flatten(2, 3)


def padded_to_chunks(
    x: torch.Tensor, key_padding_mask: torch.Tensor | None, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (b, h, n, f) zero-padded to a multiple of ``chunk_size``, and which positions are real."""
    n = x.shape[-2]
    n_pad = -(-n // chunk_size) * chunk_size
    real = (torch.arange(n_pad, device=x.device) < n).expand(x.shape[0], n_pad)
    if key_padding_mask is not None:
        real = real & torch.nn.functional.pad(key_padding_mask, (0, n_pad - n))
    return torch.nn.functional.pad(x, (0, 0, 0, n_pad - n)), real


def trax_lsh_attention(
    qk: torch.Tensor,
    v: torch.Tensor,
    rotations: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
) -> torch.Tensor:
    """Shared-QK LSH attention in the trax layout (see the module docstring).

    qk, v (b, h, n, d); rotations (h, d, n_hashes, n_buckets/2). Per round: hash (padded tokens to
    the extra last bucket), sort by (bucket, position), attend within the joint cyclic window;
    rounds are combined with weights softmax_r(logsumexp_r), as trax does.
    """
    n = qk.shape[-2]
    qk, real = padded_to_chunks(qk, key_padding_mask, chunk_size)
    v, _ = padded_to_chunks(v, None, chunk_size)
    n_pad, rounds = qk.shape[-2], rotations.shape[2]
    before, after = window_span(n_pad, chunk_size, chunks_before, chunks_after)
    buckets = torch.where(real[:, None, None, :], hash_buckets(qk, rotations), 2 * rotations.shape[-1])
    perm, rank = sort_by_bucket(buckets)  # (b, h, r, n_pad)
    q_sorted = gather_sorted(qk, perm).flatten(2, 3)  # rounds one after the other: (b, h, r·n_pad, d)
    k_sorted = gather_sorted(trax_keys(qk), perm).flatten(2, 3)
    v_sorted = gather_sorted(v, perm).flatten(2, 3)
    out, lse = chunk_attention(
        q_sorted, k_sorted, v_sorted, perm.flatten(2, 3), real, causal, chunk_size, before, after,
        self_masked=True,
    )  # fmt: skip
    out = torch.gather(
        out.unflatten(2, (rounds, n_pad)), 3, rank.unsqueeze(-1).expand(*rank.shape, v.shape[-1])
    )
    lse = torch.gather(lse.unflatten(2, (rounds, n_pad)), 3, rank)
    if n_pad == chunk_size:  # every round is the same full attention: take round 0 (no log-weights to round)
        lse = (
            lse
            + torch.where(torch.arange(rounds, device=lse.device) > 0, float("-inf"), 0.0).to(lse.dtype)[
                :, None
            ]
        )
    weights = torch.exp(lse - torch.logsumexp(lse, dim=2, keepdim=True))
    return (out * weights.unsqueeze(-1)).sum(2)[:, :, :n]


def local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    chunk_size: int,
    chunks_before: int,
    chunks_after: int,
) -> torch.Tensor:
    """Chunked local attention in the trax layout: q, k, v (b, h, n, d) by position, keys scaled by
    1/sqrt(d), each chunk attending its cyclic window of chunks; padded (and, causal, later) keys
    score :data:`MASKED_SCORE`; no self mask."""
    n = q.shape[-2]
    q, real = padded_to_chunks(q, key_padding_mask, chunk_size)
    k, _ = padded_to_chunks(k / math.sqrt(k.shape[-1]), None, chunk_size)
    v, _ = padded_to_chunks(v, None, chunk_size)
    positions = torch.arange(q.shape[-2], device=q.device).expand(*q.shape[:2], -1)
    before, after = window_span(q.shape[-2], chunk_size, chunks_before, chunks_after)
    out, _ = chunk_attention(q, k, v, positions, real, causal, chunk_size, before, after, self_masked=False)
    return out[:, :, :n]
