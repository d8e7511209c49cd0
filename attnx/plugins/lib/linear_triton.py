"""Kernelised linear attention as one Triton kernel, shared by ``linear`` and ``cosformer``.

The Triton twin of :mod:`attnx.plugins.lib.linear_core`: a variant supplies its feature map as a
``@triton.jit`` function ``features(x, valid, positions, n_queries, n_keys, FEATURE_ARG)`` that
maps a (rows, BLOCK_D) float32 tile to (rows, PARTS * BLOCK_D) non-negative features, zero
where ``valid`` (the real head dimensions) is False; ``positions`` are 0-based sequence
positions (queries: aligned bottom-right when causal), ``FEATURE_ARG`` a variant constant.
The order of the feature columns is free: only dot products of features are used.

Per (batch, head) the kernel keeps S = sum_j kf_j v_j^T and Z = sum_j kf_j in float32:

* bidirectional: S and Z over every key, then out_i = qf_i S / (qf_i Z + eps) (or max(., eps));
* causal (bottom-right: query i sees key j <= i + n_keys - n_queries): a scan. For a block of
  BLOCK_M queries starting at row r0, S and Z hold the keys j < r0 + offset (all visible to the
  block); the next BLOCK_M keys are the block's diagonal, added as masked qf kf^T products.

A program handles the query blocks pid, pid + P, pid + 2P, ... of its head (P = the tactic's
``PROGRAMS``) and streams the keys once: P = 1 is a single O(N) scan per head, a larger P
runs more programs in parallel, each re-reading the keys before its blocks (O(P N) per head).
Padded keys (key_padding_mask False) get zero features. The op's ``chunk_size`` groups the
torch computation only (the result does not depend on it), so the kernel does not take it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import triton
import triton.language as tl

from attnx.kernels import Shapes, Tactic, TritonKernel, block, per_head_grid, query_key_scalars, static
from attnx.plugins.lib.tiles import load_rows


@triton.jit
def _keys(
    k, v, key_padding_mask, bh, batch, cols, N_Q, N_K,
    FEATURES: tl.constexpr, FEATURE_ARG: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """Features and float32 values of keys ``cols`` (zero for padded, out-of-range or negative positions)."""
    ok = (cols >= 0) & (cols < N_K)
    if key_padding_mask is not None:
        ok = ok & (tl.load(key_padding_mask + batch * N_K + cols, mask=ok, other=0) != 0)
    x = load_rows(k, bh * N_K * D, cols, N_K, D, BLOCK_D).to(tl.float32)
    kf = FEATURES(x, (tl.arange(0, BLOCK_D) < D)[None, :], cols, N_Q, N_K, FEATURE_ARG)
    return tl.where(ok[:, None], kf, 0.0), load_rows(v, bh * N_K * DV, cols, N_K, DV, BLOCK_DV).to(tl.float32)


@triton.jit
def _add_keys(
    kv_sum, k_sum, k, v, key_padding_mask, bh, batch, start, end, N_Q, N_K,
    FEATURES: tl.constexpr, FEATURE_ARG: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """kv_sum + sum_j kf_j v_j^T and k_sum + sum_j kf_j over the keys j in [start, end).

    The loop counts from 0 and offsets by ``start``: compiled on an H200 (triton 3.6), a loop whose
    lower bound was a runtime value carried by the caller's loop dropped or repeated key blocks (the
    interpreter ran it right); see docs/tensorrt.md.
    """
    for step in range(0, tl.cdiv(tl.maximum(end - start, 0), BLOCK_N)):
        cols = start + step * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.where(cols < end, cols, -1)  # -1: no key
        kf, values = _keys(k, v, key_padding_mask, bh, batch, cols, N_Q, N_K,
                           FEATURES, FEATURE_ARG, D, DV, BLOCK_D, BLOCK_DV)  # fmt: skip
        kv_sum += tl.dot(tl.trans(kf), values, input_precision="ieee")
        k_sum += tl.sum(kf, 0)
    return kv_sum, k_sum


@triton.jit
def linear_core_kernel(
    q, k, v, key_padding_mask,
    H, N_Q, N_K,
    out,
    FEATURES: tl.constexpr, FEATURE_ARG: tl.constexpr, PARTS: tl.constexpr,
    CAUSAL: tl.constexpr, EPS: tl.constexpr, CLAMP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PROGRAMS: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(1).to(tl.int64)
    batch = bh // H
    vdims = tl.arange(0, BLOCK_DV)
    kv_sum = tl.zeros([PARTS * BLOCK_D, BLOCK_DV], tl.float32)
    k_sum = tl.zeros([PARTS * BLOCK_D], tl.float32)
    offset = 0
    if CAUSAL:
        offset = N_K - N_Q
    else:  # every key, once, before the queries
        kv_sum, k_sum = _add_keys(kv_sum, k_sum, k, v, key_padding_mask, bh, batch, 0, N_K, N_Q, N_K,
                                  FEATURES, FEATURE_ARG, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N)  # fmt: skip
    for query_block in range(tl.program_id(0), tl.cdiv(N_Q, BLOCK_M), PROGRAMS):
        rows = query_block * BLOCK_M + tl.arange(0, BLOCK_M)
        x = load_rows(q, bh * N_Q * D, rows, N_Q, D, BLOCK_D).to(tl.float32)
        qf = FEATURES(x, (tl.arange(0, BLOCK_D) < D)[None, :], rows + offset, N_Q, N_K, FEATURE_ARG)
        num = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        den = tl.zeros([BLOCK_M], tl.float32)
        if CAUSAL:
            diagonal = query_block * BLOCK_M + offset  # keys before it are seen by every row of the block
            # the sums hold the keys before this program's previous block's diagonal (none before its first)
            previous = (query_block - PROGRAMS) * BLOCK_M + offset
            start = tl.where(query_block >= PROGRAMS, tl.maximum(previous, 0), 0)
            kv_sum, k_sum = _add_keys(
                kv_sum, k_sum, k, v, key_padding_mask, bh, batch, start, diagonal,
                N_Q, N_K, FEATURES, FEATURE_ARG, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N,
            )  # fmt: skip
            cols = diagonal + tl.arange(0, BLOCK_M)
            kf, values = _keys(k, v, key_padding_mask, bh, batch, cols, N_Q, N_K,
                               FEATURES, FEATURE_ARG, D, DV, BLOCK_D, BLOCK_DV)  # fmt: skip
            scores = tl.dot(qf, tl.trans(kf), input_precision="ieee")
            scores = tl.where(cols[None, :] <= rows[:, None] + offset, scores, 0.0)
            num += tl.dot(scores, values, input_precision="ieee")
            den += tl.sum(scores, 1)
        num += tl.dot(qf, kv_sum, input_precision="ieee")
        den += tl.sum(qf * k_sum[None, :], 1)
        den = tl.maximum(den, EPS) if CLAMP else den + EPS
        tl.store(
            out + bh * N_Q * DV + rows[:, None] * DV + vdims[None, :],
            (num / den[:, None]).to(out.dtype.element_ty),
            mask=(rows < N_Q)[:, None] & (vdims[None, :] < DV),
        )


def constants(
    shapes: Shapes, features: Any, parts: int, feature_arg: int, causal: bool, eps: float, clamp: bool
) -> dict[str, Any]:
    """The core's compile-time arguments for a variant's feature map."""
    d, dv = static(shapes["q"][3], "head size"), static(shapes["v"][3], "value head size")
    return {
        "FEATURES": features,
        "FEATURE_ARG": feature_arg,
        "PARTS": parts,
        "CAUSAL": bool(causal),
        "EPS": float(eps),
        "CLAMP": bool(clamp),
        "D": d,
        "DV": dv,
        "BLOCK_D": block(d),
        "BLOCK_DV": block(dv),
    }


def kernel(constants: Callable[[Shapes, Mapping[str, Any]], dict[str, Any]]) -> TritonKernel:
    """The core as a variant's kernel; ``constants`` calls :func:`constants` with its feature map."""
    return TritonKernel(
        fn=linear_core_kernel,
        inputs=("q", "k", "v", "key_padding_mask"),
        scalars=query_key_scalars,
        constants=constants,
        grid=per_head_grid("q"),
        # One scan per head (linear cost), and a parallel form for short sequences and many heads.
        tactics=(
            Tactic("scan-m16", {"BLOCK_M": 16, "BLOCK_N": 16, "PROGRAMS": 1}, num_warps=2),
            Tactic("split4-m32", {"BLOCK_M": 32, "BLOCK_N": 32, "PROGRAMS": 4}, num_warps=4),
        ),
    )
