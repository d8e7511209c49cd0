"""``attnx::ReformerAttention`` as one Triton kernel, without a global sort.

The torch op (:mod:`attnx.plugins.reformer.lsh`) hashes, sorts each round by (bucket, position),
chunks and attends within windows. One launch cannot sort (programs cannot share results and
a QDP AOT plugin has no workspace), so each program recomputes what it needs for its
BLOCK_M queries of one (batch, head):

* **sorted ranks without a sort**: in round r, token i's sorted index is
  rank_r(i) = lower_r(i) + before_r(i), the real tokens in a lower bucket plus the real tokens
  of its bucket at earlier positions (padded tokens sort into an extra last bucket, after every
  real one). Pass 1 streams all tokens, hashes them and counts both for the block's queries.
  Pass 2 streams the tokens again as keys, counting each key's ``before`` from per-bucket
  running counts; for a same-bucket pair the ranks share ``lower``, so the window rule of
  ``lsh.in_window`` applies directly: 0 <= rank_i // C - rank_j // C <= 1 (bidirectional),
  0 <= rank_i - rank_j <= C (causal), C = ``chunk_size``;
* **the rounds in one softmax**: query i sees key j in round r iff they share round r's
  bucket, j is in i's round-r window, j != i and both are real; N_ij counts those rounds. The
  op's combination sum_r exp(lse_r - logsumexp_r lse_r) o_r is one softmax over the (round,
  key) pairs, where a key seen in N_ij rounds, each with score q_i·k_j - log N_ij, weighs
  N_ij · exp(q_i·k_j) / N_ij = exp(q_i·k_j). So the kernel takes one online softmax over
  the keys seen in any round, with score q_i·k_j, plus i's own key at ``SELF_SCORE`` (-65504:
  weight 0 unless nothing else is visible, then the output is v_i). Equal to the op up to
  float rounding.

Hashes (argmax of [x R, -x R], first maximum on ties, in float32) and keys (qk / sqrt(|qk|² +
1e-6), rounded to the input dtype as the op does) are computed in the kernel.

Cost: every program hashes all N tokens twice and compares its queries with all of them, so
the kernel is O(N² (d + n_hashes)) per head, like dense attention, with O(BLOCK) memory. The
paper's O(N log N) needs a sort shared by all queries: a hash kernel, a counting sort (bucket
histogram + prefix sums, which give exactly the ranks above) and a chunked-attention kernel
over the sorted order: three launches and a workspace, i.e. not one QDP AOT kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import triton
import triton.language as tl

from attnx.kernels import Shapes, Tactic, TritonKernel, block, row_block_grid, static
from attnx.plugins.lib.tiles import load_rows
from attnx.plugins.reformer.lsh import NORM_EPS, SELF_SCORE

_SELF = tl.constexpr(SELF_SCORE)
_NORM_EPS = tl.constexpr(NORM_EPS)


@triton.jit
def _hash(
    x, rotations, head,
    D: tl.constexpr, ROUNDS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """Buckets (rows, BLOCK_R) int32 of the float32 tile x: argmax([x R_r, -x R_r]) per round r."""
    dims = tl.arange(0, BLOCK_D)
    slots = tl.arange(0, BLOCK_R * BLOCK_HALF)
    round_of, half_of = slots // BLOCK_HALF, slots % BLOCK_HALF
    slot_ok = (round_of < ROUNDS) & (half_of < HALF)
    rotation = tl.load(
        rotations + ((head * D + dims[:, None]) * ROUNDS + round_of[None, :]) * HALF + half_of[None, :],
        mask=(dims[:, None] < D) & slot_ok[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    projected = tl.reshape(tl.dot(x, rotation, input_precision="ieee"), (x.shape[0], BLOCK_R, BLOCK_HALF))
    half_ok = (tl.arange(0, BLOCK_HALF) < HALF)[None, None, :]
    plus = tl.where(half_ok, projected, float("-inf"))
    minus = tl.where(half_ok, -projected, float("-inf"))
    first = tl.argmax(plus, 2, tie_break_left=True)
    second = tl.argmax(minus, 2, tie_break_left=True)
    return tl.where(tl.max(plus, 2) >= tl.max(minus, 2), first, HALF + second).to(tl.int32)


@triton.jit
def _tokens(qk, key_padding_mask, base, batch, rows, N, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """The qk rows (input dtype, zero outside) and whether each is a real token."""
    real = rows < N
    if key_padding_mask is not None:
        real = real & (tl.load(key_padding_mask + batch * N + rows, mask=rows < N, other=0) != 0)
    return load_rows(qk, base, rows, N, D, BLOCK_D), real


@triton.jit
def reformer_attention_kernel(
    qk, v, rotations, key_padding_mask,
    H, N,
    out,
    CAUSAL: tl.constexpr, CHUNK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    ROUNDS: tl.constexpr, HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(1).to(tl.int64)
    batch, head = bh // H, bh % H
    base = bh * N * D
    v_base = bh * N * DV
    vdims = tl.arange(0, BLOCK_DV)
    round_ok = (tl.arange(0, BLOCK_R) < ROUNDS)[None, None, :]
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q_tile, q_real = _tokens(qk, key_padding_mask, base, batch, rows, N, D, BLOCK_D)
    q_bucket = _hash(q_tile.to(tl.float32), rotations, head, D, ROUNDS, HALF, BLOCK_D, BLOCK_R, BLOCK_HALF)

    # pass 1: per round, the real tokens in a lower bucket and those of the same bucket before each query
    lower = tl.zeros([BLOCK_M, BLOCK_R], tl.int32)
    before = tl.zeros([BLOCK_M, BLOCK_R], tl.int32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x, real = _tokens(qk, key_padding_mask, base, batch, cols, N, D, BLOCK_D)
        k_bucket = _hash(x.to(tl.float32), rotations, head, D, ROUNDS, HALF, BLOCK_D, BLOCK_R, BLOCK_HALF)
        real3 = real[None, :, None]
        lower += tl.sum((real3 & (k_bucket[None, :, :] < q_bucket[:, None, :])).to(tl.int32), 1)
        earlier = (cols[None, :] < rows[:, None])[:, :, None]
        before += tl.sum((real3 & earlier & (k_bucket[None, :, :] == q_bucket[:, None, :])).to(tl.int32), 1)
    q_rank = lower + before

    # pass 2: keys in order; ``seen`` counts each bucket's real tokens before the current block
    buckets = tl.arange(0, 2 * BLOCK_HALF)
    seen = tl.zeros([2 * BLOCK_HALF, BLOCK_R], tl.int32)
    top = tl.full([BLOCK_M], _SELF, tl.float32)  # the query's own key, score SELF_SCORE, weight 1
    total = tl.full([BLOCK_M], 1.0, tl.float32)
    acc = load_rows(v, v_base, rows, N, DV, BLOCK_DV).to(tl.float32)
    q_wide = q_tile.to(tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x, real = _tokens(qk, key_padding_mask, base, batch, cols, N, D, BLOCK_D)
        wide = x.to(tl.float32)
        k_bucket = _hash(wide, rotations, head, D, ROUNDS, HALF, BLOCK_D, BLOCK_R, BLOCK_HALF)
        # (keys, buckets, rounds): which bucket each real key falls in, per round
        one_hot = (k_bucket[:, None, :] == buckets[None, :, None]) & real[:, None, None]
        k_before = tl.sum(tl.where(one_hot, seen[None, :, :], 0), 1)
        earlier = (cols[None, :] < cols[:, None])[:, :, None] & real[None, :, None]
        k_before += tl.sum((earlier & (k_bucket[None, :, :] == k_bucket[:, None, :])).to(tl.int32), 1)
        seen += tl.sum(one_hot.to(tl.int32), 0)

        same = (q_bucket[:, None, :] == k_bucket[None, :, :]) & round_ok
        if CAUSAL:
            gap = before[:, None, :] - k_before[None, :, :]
            window = (gap >= 0) & (gap <= CHUNK)
        else:
            chunk_gap = q_rank[:, None, :] // CHUNK - (lower[:, None, :] + k_before[None, :, :]) // CHUNK
            window = (chunk_gap >= 0) & (chunk_gap <= 1)
        visible = tl.max((same & window).to(tl.int32), 2) > 0
        visible = visible & q_real[:, None] & real[None, :] & (rows[:, None] != cols[None, :])

        keys = (wide / tl.sqrt(tl.sum(wide * wide, 1) + _NORM_EPS)[:, None]).to(x.dtype).to(tl.float32)
        scores = tl.where(visible, tl.dot(q_wide, tl.trans(keys), input_precision="ieee"), float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        weights = tl.exp(scores - new_top[:, None])
        rescale = tl.exp(top - new_top)
        values = load_rows(v, v_base, cols, N, DV, BLOCK_DV).to(tl.float32)
        total = total * rescale + tl.sum(weights, 1)
        acc = acc * rescale[:, None] + tl.dot(weights, values, input_precision="ieee")
        top = new_top
    tl.store(
        out + v_base + rows[:, None] * DV + vdims[None, :],
        (acc / total[:, None]).to(out.dtype.element_ty),
        mask=(rows[:, None] < N) & (vdims[None, :] < DV),
    )


def _scalars(shapes: Shapes) -> dict[str, Any]:
    return {"H": shapes["qk"][1], "N": shapes["qk"][2]}


def _constants(shapes: Shapes, attributes: Mapping[str, Any]) -> dict[str, Any]:
    d, dv = static(shapes["qk"][3], "head size"), static(shapes["v"][3], "value head size")
    rounds = static(shapes["rotations"][2], "number of hash rounds")
    half = static(shapes["rotations"][3], "number of buckets")
    block_rounds = block(rounds, least=1)
    return {
        "CAUSAL": bool(attributes["causal"]),
        "CHUNK": int(attributes["chunk_size"]),
        "D": d,
        "DV": dv,
        "ROUNDS": rounds,
        "HALF": half,
        "BLOCK_D": block(d),
        "BLOCK_DV": block(dv),
        "BLOCK_R": block_rounds,
        # rounds x halves >= 16 columns: the hash projection is a tl.dot
        "BLOCK_HALF": max(block(half, least=1), 16 // block_rounds if block_rounds < 16 else 1),
    }


REFORMER_KERNEL = TritonKernel(
    fn=reformer_attention_kernel,
    inputs=("qk", "v", "rotations", "key_padding_mask"),
    scalars=_scalars,
    constants=_constants,
    grid=row_block_grid("qk"),
    tactics=(
        Tactic("m16n16", {"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=2),
        Tactic("m32n32", {"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4),
    ),
)
