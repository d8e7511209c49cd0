"""``attnx::GatedDeltaRule`` as one Triton kernel: the recurrence token by token, per value head.

A program holds the float32 state S (d_k x BLOCK_DV) of one batch row and value head, for a block of
BLOCK_DV value columns, and walks the tokens in order:

    S = diag(exp(g_t)) S,  u = beta_t (v_t - S^T k_t) (delta) or beta_t v_t,  S += k_t u^T,
    o_t = scale S^T q_t

The value columns of S never mix (column j is updated from v_t[j] and itself), so splitting them across
programs is exact: a tactic's BLOCK_DV sets how many columns a program keeps (fewer columns: more programs
in parallel, each re-reading q, k and g). The q/k head of value head h is h // (hv / hk), as the op's
grouping says. O(N d_k d_v) per head and O(d_k BLOCK_DV) registers, no chunking: simple and exact, but
sequential in N (a chunked kernel would run the chunks' products on tensor cores). The op's
``chunk_size`` groups the torch computation only, so the kernel does not take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import triton
import triton.language as tl

from attnx.kernels import Shapes, Tactic, TritonKernel, block, cdiv, static


@triton.jit
def gated_delta_rule_kernel(
    q, k, v, g, beta,
    HK, HV, N,
    out,
    DELTA: tl.constexpr, SCALE: tl.constexpr, PER_KEY: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(1).to(tl.int64)  # batch * HV + value head
    batch, head = bh // HV, bh % HV
    qk_base = (batch * HK + head // (HV // HK)) * N * DK
    keys = tl.arange(0, BLOCK_DK)
    columns = tl.program_id(0) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    key_ok, column_ok = keys < DK, columns < DV
    state = tl.zeros([BLOCK_DK, BLOCK_DV], tl.float32)
    for t in range(N):
        q_t = tl.load(q + qk_base + t * DK + keys, mask=key_ok, other=0.0).to(tl.float32)
        k_t = tl.load(k + qk_base + t * DK + keys, mask=key_ok, other=0.0).to(tl.float32)
        v_t = tl.load(v + (bh * N + t) * DV + columns, mask=column_ok, other=0.0).to(tl.float32)
        if PER_KEY:
            decay = tl.exp(tl.load(g + (bh * N + t) * DK + keys, mask=key_ok, other=0.0).to(tl.float32))
            state = state * decay[:, None]
        else:
            state = state * tl.exp(tl.load(g + bh * N + t).to(tl.float32))
        rate = tl.load(beta + bh * N + t).to(tl.float32)
        if DELTA:  # noqa: SIM108 (a constexpr branch)
            update = rate * (v_t - tl.sum(state * k_t[:, None], 0))
        else:
            update = rate * v_t
        state = state + k_t[:, None] * update[None, :]
        o_t = tl.sum(state * q_t[:, None], 0) * SCALE
        tl.store(out + (bh * N + t) * DV + columns, o_t.to(out.dtype.element_ty), mask=column_ok)


def _scalars(shapes: Shapes) -> dict[str, Any]:
    return {"HK": shapes["q"][1], "HV": shapes["v"][1], "N": shapes["q"][2]}


def _constants(shapes: Shapes, attributes: Mapping[str, Any]) -> dict[str, Any]:
    dk, dv = static(shapes["q"][3], "key head size"), static(shapes["v"][3], "value head size")
    per_key = static(shapes["g"][3], "decay width") != 1
    return {
        "DELTA": bool(attributes["delta"]),
        "SCALE": float(attributes["scale"]),
        "PER_KEY": per_key,
        "DK": dk,
        "DV": dv,
        "BLOCK_DK": block(dk, least=1),
    }


def _grid(shapes: Shapes, blocks: Mapping[str, int]) -> tuple[Any, Any, int]:
    batch, heads, dv = shapes["v"][0], shapes["v"][1], shapes["v"][3]
    return cdiv(dv, blocks["BLOCK_DV"]), batch * heads, 1


GATED_KERNEL = TritonKernel(
    fn=gated_delta_rule_kernel,
    inputs=("q", "k", "v", "g", "beta"),
    scalars=_scalars,
    constants=_constants,
    grid=_grid,
    tactics=(
        Tactic("columns64", {"BLOCK_DV": 64}, num_warps=4),
        Tactic("columns16", {"BLOCK_DV": 16}, num_warps=2),  # 4x the programs at d_v = 64
    ),
)
