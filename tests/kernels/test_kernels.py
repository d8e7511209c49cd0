"""Each op's Triton kernel against the op's naive paper reference and against the torch op.

On CPU the kernels run in Triton's interpreter (see conftest), so the default cases are tiny;
they still cover several blocks per program (lengths above the smallest tile, 16), odd lengths,
cross attention with n_q != n_k, causal, padded keys with a fully padded row, fp32 and fp16
inputs, and every tactic of every kernel. Larger shapes are marked slow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'attnx[triton]'")

from attnx import kernels  # noqa: E402
from attnx.ops import AttentionOp  # noqa: E402
from attnx.plugins.cosformer.kernel import COSFORMER_OP  # noqa: E402
from attnx.plugins.fastformer.kernel import FASTFORMER_OP  # noqa: E402
from attnx.plugins.linear.kernel import LINEAR_OP  # noqa: E402
from attnx.plugins.reformer.kernel import REFORMER_OP  # noqa: E402
from attnx.plugins.softmax.kernel import SOFTMAX_OP  # noqa: E402
from tests.kernels.conftest import DEVICE  # noqa: E402
from tests.plugins import op_harness as harness  # noqa: E402
from tests.plugins.softmax.test_kernel import naive_softmax_attention  # noqa: E402
from tests.plugins.test_cosformer import naive_cosformer  # noqa: E402
from tests.plugins.test_fastformer import naive_fastformer, op_inputs  # noqa: E402
from tests.plugins.test_linear import naive_linear  # noqa: E402
from tests.plugins.test_reformer import naive_lsh, random_inputs  # noqa: E402

EPS = 1e-6
TACTICS = [1, 2]  # TensorRT's numbering of each kernel's two tactics


def run_kernel(op: AttentionOp, args: Sequence[Any], tactic: int) -> torch.Tensor:
    on_device = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
    return kernels.run(op, *on_device, tactic=tactic).cpu()


def check(op: AttentionOp, args: Sequence[Any], expected: torch.Tensor, tactic: int) -> torch.Tensor:
    """The kernel's output: the torch op's dtype and shape, and close to the float64 reference and to the
    torch op: fp32 at 1e-5 absolute + 1e-4 relative (float32 sums in another order); fp16 within ~10
    fp16 roundoffs (harness.assert_fp16_close: 5e-3 max|ref| + 2e-3) of both."""
    result = run_kernel(op, args, tactic)
    reference = op.torch_op(*args)
    assert result.dtype == reference.dtype and result.shape == reference.shape
    if result.dtype == torch.float16:
        harness.assert_fp16_close({"kernel": result}, expected)
        harness.assert_fp16_close({"kernel": result}, reference.double())
    else:
        torch.testing.assert_close(result, expected.float(), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(result, reference, atol=1e-5, rtol=1e-4)
    return result


def cases(table: list[tuple[Any, ...]]) -> list[Any]:
    """Every case with every tactic."""
    return [pytest.param(*case, tactic, id=f"{case}-t{tactic}") for case in table for tactic in TACTICS]


def qkv(batch: int, heads: int, n: int, m: int, d: int, mask_kind: str, dtype: torch.dtype, seed: int):
    q, k, v, g = harness.random_qkv(batch, heads, n, m, d, seed, dtype=dtype)
    return q, k, v, harness.padding_mask(mask_kind, batch, m, g)


# -- softmax ---------------------------------------------------------------------------------------------

SOFTMAX_CASES = [
    # batch, heads, n_queries, n_keys, d, causal, mask, dtype
    (1, 1, 1, 1, 4, False, "none", torch.float32),
    (2, 3, 7, 7, 8, False, "prefix", torch.float32),
    (2, 2, 37, 37, 16, True, "scattered", torch.float32),  # 3 query and key blocks of 16
    (2, 2, 5, 19, 8, False, "empty-row", torch.float32),  # cross; batch row 0 fully padded
    (2, 1, 5, 19, 8, True, "prefix", torch.float32),  # causal, more keys: bottom-right aligned
    (2, 1, 19, 5, 20, True, "none", torch.float32),  # causal, more queries: the first 14 see no key
    (2, 2, 21, 21, 8, True, "empty-row", torch.float16),
    (1, 2, 6, 33, 64, False, "prefix", torch.float16),
]


@pytest.mark.parametrize(("batch", "heads", "n", "m", "d", "causal", "mask_kind", "dtype", "tactic"),
                         cases(SOFTMAX_CASES))  # fmt: skip
def test_softmax_kernel(batch, heads, n, m, d, causal, mask_kind, dtype, tactic):
    q, k, v, mask = qkv(batch, heads, n, m, d, mask_kind, dtype, seed=n * 31 + m + d)
    args = (q, k, v, mask, causal, 1 / math.sqrt(d))
    # A row that sees no key (causal, more queries than keys) is 0/0 in the formula, 0 in the op.
    expected = naive_softmax_attention(q, k, v, mask, causal).nan_to_num(0.0)
    if mask is None or mask.any(-1).all():
        check(SOFTMAX_OP, args, expected, tactic)
        return
    # A fully padded row is a softmax over scores + MASKED_SCORE: float32 holds -65504 + s only to 2^-7,
    # in torch as in the kernel, so such rows match the torch op closely and the exact reference to ~1e-2.
    empty = ~mask.any(-1)
    result = run_kernel(SOFTMAX_OP, args, tactic)
    reference = SOFTMAX_OP.torch_op(*args)
    torch.testing.assert_close(result[empty], reference[empty], atol=2e-3 if dtype == torch.float16 else 1e-5,
                               rtol=1e-3)  # fmt: skip
    torch.testing.assert_close(result[empty].double(), expected[empty], atol=2e-2, rtol=0)
    rest = [t[~empty] if isinstance(t, torch.Tensor) else t for t in args]  # the rows with a real key
    check(SOFTMAX_OP, rest, expected[~empty], tactic)


@pytest.mark.parametrize(
    ("kv_heads", "n", "m", "causal"), [(1, 19, 19, True), (2, 5, 21, True), (2, 7, 7, False)]
)
def test_softmax_kernel_reads_grouped_key_value_heads(kv_heads, n, m, causal):
    """Keys and values of fewer heads than the queries (grouped-query attention): query head i reads
    key/value head i // (4 / kv_heads)."""
    q, _, _, g = harness.random_qkv(2, 4, n, m, 8, seed=n + m)
    k, v = torch.randn(2, kv_heads, m, 8, generator=g), torch.randn(2, kv_heads, m, 8, generator=g)
    check(SOFTMAX_OP, (q, k, v, None, causal, 0.3), naive_softmax_attention(q, k, v, None, causal, 0.3), 1)


def test_softmax_reference_catches_top_left_causal_alignment():
    """The comparison can fail: a top-left causal mask (query i sees keys j <= i) is far from the kernel."""
    q, k, v, _ = qkv(1, 1, 5, 9, 8, "none", torch.float32, seed=1)
    result = run_kernel(SOFTMAX_OP, (q, k, v, None, True, 0.5), 1)
    top_left = naive_softmax_attention(q, k[..., :5, :], v[..., :5, :], None, True, 0.5)
    assert (result.double() - top_left).abs().max() > 0.1


# -- linear and cosformer --------------------------------------------------------------------------------

LINEAR_CASES = [
    # batch, heads, n_queries, n_keys, d, causal, mask, dtype
    (1, 1, 1, 1, 4, False, "none", torch.float32),
    (1, 2, 1, 1, 8, True, "none", torch.float32),
    (2, 3, 7, 7, 8, False, "prefix", torch.float32),
    (2, 2, 37, 37, 16, True, "scattered", torch.float32),  # several query blocks and key blocks
    (2, 2, 5, 19, 8, False, "empty-row", torch.float32),  # cross; a fully padded row gives 0
    (2, 1, 5, 19, 8, True, "prefix", torch.float32),  # causal with more keys: bottom-right aligned
    (2, 1, 19, 5, 20, True, "none", torch.float32),  # causal with more queries: the first 14 see no key
    (2, 2, 21, 21, 8, True, "empty-row", torch.float16),
    (1, 2, 6, 33, 64, False, "prefix", torch.float16),
]


@pytest.mark.parametrize(("batch", "heads", "n", "m", "d", "causal", "mask_kind", "dtype", "tactic"),
                         cases(LINEAR_CASES))  # fmt: skip
def test_linear_kernel(batch, heads, n, m, d, causal, mask_kind, dtype, tactic):
    q, k, v, mask = qkv(batch, heads, n, m, d, mask_kind, dtype, seed=n * 37 + m + d)
    expected = naive_linear(q, k, v, mask, causal)
    check(LINEAR_OP, (q, k, v, mask, causal, EPS, 4), expected, tactic)


COSFORMER_CASES = [
    # batch, heads, n_queries, n_keys, d, causal, mask, max_len (None: M per call), dtype
    (1, 1, 1, 1, 4, False, "none", None, torch.float32),
    (2, 3, 7, 7, 8, False, "prefix", None, torch.float32),
    (2, 2, 37, 37, 16, True, "scattered", 40, torch.float32),
    (2, 2, 20, 20, 8, False, "none", 64, torch.float32),  # bidirectional with a fixed M
    (2, 2, 5, 19, 8, False, "empty-row", None, torch.float32),  # cross, M = n_keys
    (2, 2, 19, 5, 8, False, "none", None, torch.float32),  # cross, M = n_queries
    (2, 1, 5, 19, 8, True, "prefix", 32, torch.float32),  # causal, more keys: queries at positions 15..19
    (2, 1, 19, 5, 8, True, "none", 32, torch.float32),
    (2, 2, 21, 21, 8, True, "empty-row", 24, torch.float16),
    (1, 2, 6, 33, 64, False, "prefix", None, torch.float16),
]


@pytest.mark.parametrize(
    ("batch", "heads", "n", "m", "d", "causal", "mask_kind", "max_len", "dtype", "tactic"),
    cases(COSFORMER_CASES),
)
def test_cosformer_kernel(batch, heads, n, m, d, causal, mask_kind, max_len, dtype, tactic):
    q, k, v, mask = qkv(batch, heads, n, m, d, mask_kind, dtype, seed=n * 41 + m + d)
    expected = naive_cosformer(q, k, v, mask, causal, max_len)
    check(COSFORMER_OP, (q, k, v, mask, causal, max_len or 0, EPS, 4), expected, tactic)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_eps_is_added_for_linear_and_a_clamp_for_cosformer(causal):
    """Features so small that the denominator is about eps: linear adds eps, cosFormer clamps at it."""
    q, k, v, _ = qkv(2, 1, 3, 3, 1, "none", torch.float32, seed=7)
    small_q, small_k = q.abs() * 5e-4, k.abs() * 5e-4
    expected = naive_cosformer(small_q, small_k, v, causal=causal, max_len=4)
    without_eps = naive_cosformer(small_q, small_k, v, causal=causal, max_len=4, eps=0.0)
    assert (expected - without_eps).abs().max() > 0.05
    result = run_kernel(COSFORMER_OP, (small_q, small_k, v, None, causal, 4, EPS, 2), 1)
    torch.testing.assert_close(result.double(), expected, atol=1e-6, rtol=1e-3)
    negative_q, negative_k = -q.abs() - 12, -k.abs() - 12  # elu + 1 ~ 1e-5: the denominator ~ eps
    expected = naive_linear(negative_q, negative_k, v, causal=causal)
    result = run_kernel(LINEAR_OP, (negative_q, negative_k, v, None, causal, EPS, 2), 1)
    torch.testing.assert_close(result.double(), expected, atol=1e-6, rtol=1e-3)


# -- fastformer ------------------------------------------------------------------------------------------

FASTFORMER_CASES = [
    # (batch, heads, N, d_head), mask, shared q and v, dtype
    ((1, 1, 1, 4), "none", False, torch.float32),
    ((2, 3, 7, 8), "prefix", True, torch.float32),
    ((2, 2, 37, 20), "empty-row", False, torch.float32),  # several token blocks; row 0 pools uniformly
    ((2, 2, 21, 64), "scattered", False, torch.float16),
]


@pytest.mark.parametrize(("shape", "mask_kind", "share_qv", "dtype", "tactic"), cases(FASTFORMER_CASES))
def test_fastformer_kernel(shape, mask_kind, share_qv, dtype, tactic):
    (q, k, v, w_q, w_k), g = op_inputs(shape, seed=sum(shape), dtype=dtype)
    v = q if share_qv else v
    mask = harness.padding_mask(mask_kind, shape[0], shape[2], g)
    scale = 1 / math.sqrt(shape[-1])
    expected = naive_fastformer(q, k, v, w_q, w_k, mask, scale)
    check(FASTFORMER_OP, (q, k, v, w_q, w_k, mask, scale), expected, tactic)


# -- reformer --------------------------------------------------------------------------------------------

REFORMER_CASES = [
    # batch, heads, n, d, n_hashes, n_buckets, chunk_size, causal, mask
    (1, 1, 1, 4, 2, 8, 64, False, "none"),  # N = 1: the token sees only itself
    (2, 2, 7, 8, 1, 4, 4, False, "prefix"),  # one round, N not a multiple of the chunk
    (2, 3, 13, 8, 3, 8, 4, True, "random"),  # three rounds, causal
    (1, 2, 37, 8, 2, 2, 1, True, "none"),  # chunks of one token; three key blocks of 16
    (1, 2, 41, 8, 2, 2, 4, True, "prefix"),  # buckets larger than a chunk: not the paper's causal window
    (2, 2, 21, 16, 2, 8, 8, False, "empty-row"),  # a row with no real token: each token is its own value
]


@pytest.mark.parametrize(("batch", "heads", "n", "d", "n_hashes", "n_buckets", "chunk", "causal", "mask_kind",
                          "tactic"), cases(REFORMER_CASES))  # fmt: skip
def test_reformer_kernel(batch, heads, n, d, n_hashes, n_buckets, chunk, causal, mask_kind, tactic):
    """naive_lsh hashes in float64 and asserts that no input is within rounding of a bucket boundary."""
    qk, v, rotations, g = random_inputs(batch, heads, n, d, n_hashes, n_buckets, seed=n * 7 + d + n_hashes)
    mask = harness.padding_mask(mask_kind, batch, n, g)
    expected = naive_lsh(qk, v, rotations, mask, causal, chunk)
    check(REFORMER_OP, (qk, v, rotations, mask, causal, chunk), expected, tactic)


@pytest.mark.parametrize("tactic", TACTICS)
def test_reformer_kernel_fp16(tactic):
    """fp16 inputs (d = 64, |qk| ~ 8): hashes in float32 as the op does, scores and sums in float32."""
    qk, v, rotations, g = random_inputs(2, 2, 21, 64, 2, 8, seed=5)
    qk, v, rotations = (4 * qk).half(), v.half(), rotations.half()
    mask = harness.padding_mask("prefix", 2, 21, g)
    expected = naive_lsh(qk, v, rotations, mask, True, 4)
    check(REFORMER_OP, (qk, v, rotations, mask, True, 4), expected, tactic)


# -- larger shapes ---------------------------------------------------------------------------------------


def large_softmax():
    q, k, v, mask = qkv(2, 2, 300, 333, 64, "prefix", torch.float32, seed=3)
    return SOFTMAX_OP, (q, k, v, mask, True, 0.125), naive_softmax_attention(q, k, v, mask, True, 0.125)


def large_linear():
    q, k, v, mask = qkv(2, 2, 257, 257, 64, "scattered", torch.float32, seed=4)
    return LINEAR_OP, (q, k, v, mask, True, EPS, 64), naive_linear(q, k, v, mask, True)


def large_cosformer():
    q, k, v, mask = qkv(2, 2, 200, 257, 32, "prefix", torch.float32, seed=5)
    return COSFORMER_OP, (q, k, v, mask, True, 512, EPS, 64), naive_cosformer(q, k, v, mask, True, 512)


def large_fastformer():
    (q, k, v, w_q, w_k), g = op_inputs((2, 2, 301, 64), seed=6)
    mask = harness.padding_mask("random", 2, 301, g)
    return FASTFORMER_OP, (q, k, v, w_q, w_k, mask, 0.125), naive_fastformer(q, k, v, w_q, w_k, mask, 0.125)


def large_reformer():
    qk, v, rotations, g = random_inputs(1, 2, 130, 16, 2, 8, seed=130 * 7 + 16 + 2)
    mask = harness.padding_mask("prefix", 1, 130, g)
    return REFORMER_OP, (qk, v, rotations, mask, True, 64), naive_lsh(qk, v, rotations, mask, True, 64)


@pytest.mark.slow
@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize(
    "make",
    [large_softmax, large_linear, large_cosformer, large_fastformer, large_reformer],
    ids=lambda f: f.__name__,
)
def test_kernels_on_larger_shapes(make, tactic):
    op, args, expected = make()
    check(op, args, expected, tactic)
