"""Kernelised linear attention, shared by the ``linear`` and ``cosformer`` variants.

A variant maps queries and keys to non-negative features qf = phi(q), kf = phi(k)
(float32) and hands them to :func:`kernel_attention` (torch) or ``LinearCoreAttend``
(ONNX), which compute, per head,

    out_i = qf_i^T (sum_j kf_j v_j^T) / den_i,   den_i = qf_i^T sum_j kf_j

with the denominator guarded by ``eps``: added (``clamp=False``, "Transformers are
RNNs") or as a lower clamp (``clamp=True``, cosFormer). Padded keys get zero features,
so they add nothing to either sum.

Causal attention is bottom-right aligned like ``softmax``: query i of n sees key
j <= i + n_keys - n. It is computed in chunks of ``chunk_size`` positions, never as an
(N, d, d) prefix-sum tensor: after padding the shorter side at the front and both sides
at the back to a multiple of C, each chunk adds its masked C x C products to the sums
of all earlier chunks (an exclusive cumulative sum of per-chunk kf^T v and kf), so
memory is O(N C + (N/C) d^2). The ONNX body does the same without loops (Pad, Reshape,
Trilu, CumSum(exclusive=1)), grouping the sums exactly as the torch code does.
All sums run in float32, so fp16 inputs cannot overflow the normaliser.

Decoding ("Transformers are RNNs" §3.4) carries the sums of every earlier token as a
state, S = sum_j kf_j v_j^T (b, h, f, dv) and Z = sum_j kf_j (b, h, f), in float32.
:func:`kernel_attention_step` (torch) and ``LinearCoreAttendStep`` (ONNX) run the causal
form over a chunk of new tokens and add qf_i^T S to the numerator and qf_i^T Z to the
denominator, then return the state grown by the chunk: a prompt (prefill) and one token
(decode) are the same computation, and the state's size never depends on the position.
"""

from __future__ import annotations

import onnxscript
import torch
import torch.nn.functional as F
from onnxscript import BOOL, FLOAT, INT64
from onnxscript import opset18 as op

from attnx.ops import LIBRARY

# The stateful step ops return (out, S', Z'); the state is float32 whatever the activations.
STEP_OUTPUT_NAMES = ("output", "kv_sum", "k_sum")
STATE_TYPES = {"kv_sum": "tensor(float)", "k_sum": "tensor(float)"}


def step_fake(
    q: torch.Tensor, v: torch.Tensor, features: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fake outputs of a step op: out like q with v's last dim, float32 S (b, h, f, dv) and Z (b, h, f)."""
    state = q.new_empty((*q.shape[:2], features, v.shape[-1]), dtype=torch.float32)
    return q.new_empty((*q.shape[:-1], v.shape[-1])), state, state.new_empty(state.shape[:-1])


def mask_keys(kf: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """Zero the features of padded keys; mask is bool (batch, n_keys), True = real token."""
    if key_padding_mask is None:
        return kf
    return kf * key_padding_mask[:, None, :, None].to(kf.dtype)


def kernel_attention(
    qf: torch.Tensor,
    kf: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    chunk_size: int,
    eps: float,
    clamp: bool,
) -> torch.Tensor:
    """Linear attention over features qf (b, h, nq, f), kf (b, h, nk, f); float32 (b, h, nq, dv)."""
    v = v.float()
    num, den = _causal_sums(qf, kf, v, chunk_size) if causal else _full_sums(qf, kf, v)
    return _normalise(num, den, eps, clamp)


def kernel_attention_step(
    qf: torch.Tensor,
    kf: torch.Tensor,
    v: torch.Tensor,
    kv_sum: torch.Tensor | None,
    k_sum: torch.Tensor | None,
    *,
    chunk_size: int,
    eps: float,
    clamp: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk of new tokens after the state (S, Z) of earlier ones (None: none).

    Returns the float32 output (b, h, n, dv) and the state after the chunk.
    """
    v = v.float()
    num, den = _causal_sums(qf, kf, v, chunk_size)
    grown_kv, grown_k = kf.transpose(-1, -2) @ v, kf.sum(-2)
    if kv_sum is not None and k_sum is not None:
        num = num + qf @ kv_sum
        den = den + qf @ k_sum[..., None]
        grown_kv, grown_k = kv_sum + grown_kv, k_sum + grown_k
    return _normalise(num, den, eps, clamp), grown_kv, grown_k


def _normalise(num: torch.Tensor, den: torch.Tensor, eps: float, clamp: bool) -> torch.Tensor:
    return num / (den.clamp_min(eps) if clamp else den + eps)


def _full_sums(qf: torch.Tensor, kf: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    num = qf @ (kf.transpose(-1, -2) @ v)
    den = (qf * kf.sum(-2, keepdim=True)).sum(-1, keepdim=True)
    return num, den


def _causal_sums(
    qf: torch.Tensor, kf: torch.Tensor, v: torch.Tensor, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    n_queries, n_keys = qf.shape[-2], kf.shape[-2]
    length = max(n_queries, n_keys)
    chunk = min(chunk_size, length)
    padded = -(-length // chunk) * chunk

    def chunks(x: torch.Tensor, n: int) -> torch.Tensor:  # (b, h, n, f) -> (b, h, n_chunks, C, f)
        return F.pad(x, (0, 0, length - n, padded - length)).unflatten(-2, (-1, chunk))

    qc, kc, vc = chunks(qf, n_queries), chunks(kf, n_keys), chunks(v, n_keys)
    keep = torch.ones(chunk, chunk, dtype=torch.bool, device=qf.device).tril()
    scores = (qc @ kc.transpose(-1, -2)).masked_fill(~keep, 0.0)
    earlier_kv = _exclusive_cumsum(kc.transpose(-1, -2) @ vc)
    earlier_k = _exclusive_cumsum(kc.sum(-2, keepdim=True))
    num = scores @ vc + qc @ earlier_kv
    den = scores.sum(-1, keepdim=True) + (qc * earlier_k).sum(-1, keepdim=True)
    rows = slice(length - n_queries, length)
    return num.flatten(-3, -2)[..., rows, :], den.flatten(-3, -2)[..., rows, :]


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Sum over earlier chunks (axis 2): shift then cumsum, so no subtraction cancels digits."""
    return F.pad(x, (0, 0, 0, 0, 1, 0))[:, :, :-1].cumsum(2)


# ---------------------------------------------------------------- ONNX library functions

_ONE = onnxscript.ir.tensor([1.0], dtype=onnxscript.ir.DataType.FLOAT)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreMaskKeys(kf: FLOAT, key_padding_mask: BOOL) -> FLOAT:
    return op.Mul(kf, op.CastLike(op.Unsqueeze(key_padding_mask, [1, 3]), kf))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreFullSums(qf: FLOAT, kf: FLOAT, v: FLOAT) -> tuple[FLOAT, FLOAT]:
    num = op.MatMul(qf, op.MatMul(op.Transpose(kf, perm=[0, 1, 3, 2]), v))
    den = op.ReduceSum(op.Mul(qf, op.ReduceSum(kf, [-2], keepdims=1)), [-1], keepdims=1)
    return num, den


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreChunks(x: FLOAT, pads: INT64, chunk: INT64) -> FLOAT:
    """Pad the sequence axis, then (b, h, n, f) -> (b, h, n_chunks, C, f)."""
    batch_heads = op.Shape(x, start=0, end=2)
    shape = op.Concat(batch_heads, op.Constant(value_ints=[-1]), chunk, op.Shape(x, start=3), axis=0)
    return op.Reshape(op.Pad(x, pads), shape)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreCausalSums(qf: FLOAT, kf: FLOAT, v: FLOAT, chunk_size: INT64) -> tuple[FLOAT, FLOAT]:
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    zeros = op.Constant(value_ints=[0, 0])
    n_queries = op.Shape(qf, start=2, end=3)
    n_keys = op.Shape(kf, start=2, end=3)
    length = op.Max(n_queries, n_keys)
    chunk = op.Min(chunk_size, length)
    back = op.Sub(op.Mul(op.Div(op.Sub(op.Add(length, chunk), one), chunk), chunk), length)
    start = op.Sub(length, n_queries)
    q_pads = op.Concat(zeros, start, zero, zeros, back, zero, axis=0)
    k_pads = op.Concat(zeros, op.Sub(length, n_keys), zero, zeros, back, zero, axis=0)
    qc = LinearCoreChunks(qf, q_pads, chunk)
    kc = LinearCoreChunks(kf, k_pads, chunk)
    vc = LinearCoreChunks(v, k_pads, chunk)
    kc_t = op.Transpose(kc, perm=[0, 1, 2, 4, 3])
    ones = op.ConstantOfShape(op.Concat(chunk, chunk, axis=0), value=_ONE)
    scores = op.Mul(op.MatMul(qc, kc_t), op.Trilu(ones, upper=0))
    chunk_axis = op.Constant(value_int=2)
    earlier_kv = op.CumSum(op.MatMul(kc_t, vc), chunk_axis, exclusive=1)
    earlier_k = op.CumSum(op.ReduceSum(kc, [-2], keepdims=1), chunk_axis, exclusive=1)
    num = op.Add(op.MatMul(scores, vc), op.MatMul(qc, earlier_kv))
    den_inter = op.ReduceSum(op.Mul(qc, earlier_k), [-1], keepdims=1)
    den = op.Add(op.ReduceSum(scores, [-1], keepdims=1), den_inter)
    rows = op.Concat(op.Shape(qf, start=0, end=2), op.Constant(value_ints=[-1]), axis=0)
    num_rows = op.Reshape(num, op.Concat(rows, op.Shape(v, start=3), axis=0))
    den_rows = op.Reshape(den, op.Concat(rows, one, axis=0))
    seq_axis = op.Constant(value_ints=[2])
    return op.Slice(num_rows, start, length, seq_axis), op.Slice(den_rows, start, length, seq_axis)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreNormalise(num: FLOAT, den: FLOAT, eps: float, clamp: int) -> FLOAT:
    """num / (den + eps), or num / max(den, eps) when ``clamp`` is set."""
    epsilon = op.Constant(value_float=eps)
    clamped = op.Cast(op.Constant(value_int=clamp), to=BOOL.dtype)
    return op.Div(num, op.Where(clamped, op.Max(den, epsilon), op.Add(den, epsilon)))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreAttend(
    qf: FLOAT, kf: FLOAT, v: FLOAT, causal: int, chunk_size: int, eps: float, clamp: int
) -> FLOAT:
    """ONNX twin of :func:`kernel_attention`; returns float32.

    The causal/bidirectional choice is an ``If`` on a constant: runtimes fold it, and
    the bidirectional form keeps its O(d^2) state instead of paying for chunks. Each
    branch assigns one value: onnxscript orders the outputs of an ``If`` that assigns
    several by a set of their names, so the bytes would depend on PYTHONHASHSEED.
    """
    values = op.Cast(v, to=FLOAT.dtype)
    chunk = op.Reshape(op.Constant(value_int=chunk_size), [1])
    if op.Cast(op.Constant(value_int=causal), to=BOOL.dtype):
        num, den = LinearCoreCausalSums(qf, kf, values, chunk)
        out = LinearCoreNormalise(num, den, eps=eps, clamp=clamp)
    else:
        num, den = LinearCoreFullSums(qf, kf, values)
        out = LinearCoreNormalise(num, den, eps=eps, clamp=clamp)
    return out


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreStepSums(qf: FLOAT, kf: FLOAT, v: FLOAT, chunk_size: int) -> tuple[FLOAT, FLOAT, FLOAT, FLOAT]:
    """The chunk's causal (num, den) and its own state (kf^T v, sum kf); v is float32."""
    chunk = op.Reshape(op.Constant(value_int=chunk_size), [1])
    num, den = LinearCoreCausalSums(qf, kf, v, chunk)
    kv = op.MatMul(op.Transpose(kf, perm=[0, 1, 3, 2]), v)
    return num, den, kv, op.ReduceSum(kf, [-2], keepdims=0)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreAttendStep(
    qf: FLOAT, kf: FLOAT, v: FLOAT, kv_sum: FLOAT, k_sum: FLOAT, chunk_size: int, eps: float, clamp: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """ONNX twin of :func:`kernel_attention_step` with a state: (float32 out, S', Z')."""
    values = op.Cast(v, to=FLOAT.dtype)
    num, den, kv, k = LinearCoreStepSums(qf, kf, values, chunk_size=chunk_size)
    num_all = op.Add(num, op.MatMul(qf, kv_sum))
    den_all = op.Add(den, op.MatMul(qf, op.Unsqueeze(k_sum, [-1])))
    out = LinearCoreNormalise(num_all, den_all, eps=eps, clamp=clamp)
    return out, op.Add(kv_sum, kv), op.Add(k_sum, k)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreAttendFirst(
    qf: FLOAT, kf: FLOAT, v: FLOAT, chunk_size: int, eps: float, clamp: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """ONNX twin of :func:`kernel_attention_step` without a state (the prompt): (float32 out, S, Z)."""
    values = op.Cast(v, to=FLOAT.dtype)
    num, den, kv, k = LinearCoreStepSums(qf, kf, values, chunk_size=chunk_size)
    return LinearCoreNormalise(num, den, eps=eps, clamp=clamp), kv, k
