"""Kernelised linear attention, shared by the ``linear`` and ``cosformer`` variants.

A variant maps queries and keys to non-negative features qf = phi(q), kf = phi(k)
(float32, or float64 for float64 inputs) and hands them to :func:`kernel_attention` (torch)
or ``LinearCoreAttend`` (ONNX), which compute, per head,

    out_i = qf_i^T (sum_j kf_j v_j^T) / den_i,   den_i = qf_i^T sum_j kf_j

with the denominator guarded by ``eps``: added (``clamp=False``, "Transformers are
RNNs") or as a lower clamp (``clamp=True``, cosFormer). Padded keys get zero features,
so they add nothing to either sum. Both sums come out of one product: V gets a column of
ones, so qf_i^T (sum_j kf_j [v_j, 1]^T) = [num_i, den_i].

Causal attention is bottom-right aligned like ``softmax``: query i of n sees key
j <= i + n_keys - n. It is computed in chunks of ``chunk_size`` positions, never as an
(N, d, d) prefix-sum tensor: after padding the shorter side at the front and both sides
at the back to a multiple of C, each chunk adds its masked C x C products to the sums
of all earlier chunks (an exclusive cumulative sum of per-chunk kf^T v and kf), so
memory is O(N C + (N/C) d^2). The ONNX body does the same without loops (Pad, Reshape,
Trilu, CumSum(exclusive=1)), grouping the sums exactly as the torch code does.
All sums run in float32, so fp16 inputs cannot overflow the normaliser (the ONNX bodies
widen with ``AttnxWiden``, which an fp16 converter that inlines them turns into fp16).

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

from attnx.ops import LIBRARY, at_least_float32

# The stateful step ops return (out, S', Z'); the state is float32 whatever the activations.
STEP_OUTPUT_NAMES = ("output", "kv_sum", "k_sum")
STATE_TYPES = {"kv_sum": "tensor(float)", "k_sum": "tensor(float)"}


def step_fake(
    q: torch.Tensor, v: torch.Tensor, features: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fake outputs of a step op: out like q with v's last dim, float32 S (b, h, f, dv) and Z (b, h, f)
    (float64 for float64 inputs)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    state = q.new_empty((*q.shape[:2], features, v.shape[-1]), dtype=dtype)
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
    values = _with_ones(at_least_float32(v))
    sums = _causal_sums(qf, kf, values, chunk_size) if causal else _full_sums(qf, kf, values)
    return _normalise(sums, eps, clamp)


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
    values = _with_ones(at_least_float32(v))
    sums = _causal_sums(qf, kf, values, chunk_size)
    grown = kf.transpose(-1, -2) @ values  # [S, Z] of the chunk, (b, h, f, dv + 1)
    if kv_sum is not None and k_sum is not None:
        state = torch.cat((kv_sum, k_sum[..., None]), dim=-1)
        sums = sums + qf @ state
        grown = state + grown
    return _normalise(sums, eps, clamp), grown[..., :-1].contiguous(), grown[..., -1].contiguous()


def _with_ones(v: torch.Tensor) -> torch.Tensor:
    """[v, 1]: products with it carry the normaliser's sums as their last column."""
    return torch.cat((v, torch.ones_like(v[..., :1])), dim=-1)


def _normalise(sums: torch.Tensor, eps: float, clamp: bool) -> torch.Tensor:
    """[num, den] -> num / den, ``eps`` guarding den."""
    num, den = sums[..., :-1], sums[..., -1:]
    return num / (den.clamp_min(eps) if clamp else den + eps)


def _full_sums(qf: torch.Tensor, kf: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return qf @ (kf.transpose(-1, -2) @ v)


def _causal_sums(qf: torch.Tensor, kf: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
    n_queries, n_keys = qf.shape[-2], kf.shape[-2]
    length = max(n_queries, n_keys)
    chunk = min(chunk_size, length)
    padded = -(-length // chunk) * chunk

    def chunks(x: torch.Tensor, n: int) -> torch.Tensor:  # (b, h, n, f) -> (b, h, n_chunks, C, f)
        return F.pad(x, (0, 0, length - n, padded - length)).unflatten(-2, (-1, chunk))

    qc, kc, vc = chunks(qf, n_queries), chunks(kf, n_keys), chunks(v, n_keys)
    keep = torch.ones(chunk, chunk, dtype=torch.bool, device=qf.device).tril()
    scores = (qc @ kc.transpose(-1, -2)).masked_fill(~keep, 0.0)
    sums = scores @ vc + qc @ _exclusive_cumsum(kc.transpose(-1, -2) @ vc)
    return sums.flatten(-3, -2)[..., length - n_queries : length, :]


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Sum over earlier chunks (axis 2): shift then cumsum, so no subtraction cancels digits."""
    return F.pad(x, (0, 0, 0, 0, 1, 0))[:, :, :-1].cumsum(2)


# ---------------------------------------------------------------- ONNX library functions


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreMaskKeys(kf: FLOAT, key_padding_mask: BOOL) -> FLOAT:
    return op.Mul(kf, op.CastLike(op.Unsqueeze(key_padding_mask, [1, 3]), kf))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreValues(v: FLOAT, like: FLOAT) -> FLOAT:
    """[v, 1] in ``like``'s type (the features': float32), so one product gives numerator and denominator."""
    values = op.CastLike(v, like)
    one = op.CastLike(op.Constant(value_float=1.0), values)
    return op.Pad(values, op.Constant(value_ints=[0, 0, 0, 0, 0, 0, 0, 1]), one)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreFullSums(qf: FLOAT, kf: FLOAT, v: FLOAT) -> FLOAT:
    return op.MatMul(qf, op.MatMul(op.Transpose(kf, perm=[0, 1, 3, 2]), v))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreChunks(x: FLOAT, pads: INT64, chunk: INT64) -> FLOAT:
    """Pad the sequence axis, then (b, h, n, f) -> (b, h, n_chunks, C, f)."""
    batch_heads = op.Shape(x, start=0, end=2)
    shape = op.Concat(batch_heads, op.Constant(value_ints=[-1]), chunk, op.Shape(x, start=3), axis=0)
    return op.Reshape(op.Pad(x, pads), shape)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreCausalSums(qf: FLOAT, kf: FLOAT, v: FLOAT, chunk_size: INT64) -> FLOAT:
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    zeros = op.Constant(value_ints=[0, 0])
    n_queries = op.Shape(qf, start=2, end=3)
    n_keys = op.Shape(kf, start=2, end=3)
    length = op.Max(n_queries, n_keys)
    chunk = op.Max(op.Min(chunk_size, length), one)  # >= 1 for empty sequences too
    back = op.Sub(op.Mul(op.Div(op.Sub(op.Add(length, chunk), one), chunk), chunk), length)
    start = op.Sub(length, n_queries)
    q_pads = op.Concat(zeros, start, zero, zeros, back, zero, axis=0)
    k_pads = op.Concat(zeros, op.Sub(length, n_keys), zero, zeros, back, zero, axis=0)
    qc = LinearCoreChunks(qf, q_pads, chunk)
    kc = LinearCoreChunks(kf, k_pads, chunk)
    vc = LinearCoreChunks(v, k_pads, chunk)
    kc_t = op.Transpose(kc, perm=[0, 1, 2, 4, 3])
    ones = op.Expand(op.CastLike(op.Constant(value_float=1.0), qf), op.Concat(chunk, chunk, axis=0))
    scores = op.Mul(op.MatMul(qc, kc_t), op.Trilu(ones, upper=0))
    earlier = op.CumSum(op.MatMul(kc_t, vc), op.Constant(value_int=2), exclusive=1)
    sums = op.Add(op.MatMul(scores, vc), op.MatMul(qc, earlier))
    rows = op.Concat(op.Shape(qf, start=0, end=2), op.Constant(value_ints=[-1]), op.Shape(v, start=3), axis=0)
    return op.Slice(op.Reshape(sums, rows), start, length, op.Constant(value_ints=[2]))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreSplitLast(x: FLOAT) -> tuple[FLOAT, FLOAT]:
    """x (..., m + 1) -> (x[..., :m], x[..., m:]): [num, den] or [S, Z] apart."""
    last = op.Constant(value_ints=[-1])
    end = op.Constant(value_ints=[9223372036854775807])
    return op.Slice(x, op.Constant(value_ints=[0]), last, last), op.Slice(x, last, end, last)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreNormalise(sums: FLOAT, eps: float, clamp: int) -> FLOAT:
    """[num, den] -> num / (den + eps), or num / max(den, eps) when ``clamp`` is set.

    den is guarded as (b, h, n), not (b, h, n, 1): ONNX Runtime's element-wise kernels are tens of
    times slower per element when the innermost axis has length 1.
    """
    num, den = LinearCoreSplitLast(sums)
    den = op.Squeeze(den, [-1])
    epsilon = op.CastLike(op.Constant(value_float=eps), den)
    clamped = op.Cast(op.Constant(value_int=clamp), to=BOOL.dtype)
    return op.Div(num, op.Unsqueeze(op.Where(clamped, op.Max(den, epsilon), op.Add(den, epsilon)), [-1]))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreTake(x: FLOAT, taken: INT64) -> FLOAT:
    """x when ``taken`` (1), else its empty prefix (0) along the sequence axis.

    ``taken`` is a constant, so the Slice's end is one too and ONNX Runtime drops a Slice of everything.
    """
    end = op.Mul(op.Constant(value_ints=[9223372036854775807]), taken)
    return op.Slice(x, op.Constant(value_ints=[0]), end, op.Constant(value_ints=[2]))


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreAttend(
    qf: FLOAT, kf: FLOAT, v: FLOAT, causal: int, chunk_size: int, eps: float, clamp: int
) -> FLOAT:
    """ONNX twin of :func:`kernel_attention`; returns the features' type (float32).

    Causal or bidirectional without an ``If``: both forms run, the one not chosen on empty
    sequences (the fp16 converter of ONNX Runtime breaks the Casts it puts around CumSum inside
    an If branch). The bidirectional form keeps its O(d^2) state instead of paying for chunks.
    """
    values = LinearCoreValues(v, qf)
    chunk = op.Reshape(op.Constant(value_int=chunk_size), [1])
    chunked = op.Reshape(op.Constant(value_int=causal), [1])
    full = op.Sub(op.Constant(value_ints=[1]), chunked)
    causal_sums = LinearCoreCausalSums(
        LinearCoreTake(qf, chunked), LinearCoreTake(kf, chunked), LinearCoreTake(values, chunked), chunk
    )
    full_sums = LinearCoreFullSums(
        LinearCoreTake(qf, full), LinearCoreTake(kf, full), LinearCoreTake(values, full)
    )
    return LinearCoreNormalise(op.Concat(causal_sums, full_sums, axis=2), eps=eps, clamp=clamp)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreStepSums(qf: FLOAT, kf: FLOAT, v: FLOAT, chunk_size: int) -> tuple[FLOAT, FLOAT]:
    """The chunk's causal [num, den] and its own state [kf^T v, sum kf] (b, h, f, dv + 1); v is [v, 1]."""
    chunk = op.Reshape(op.Constant(value_int=chunk_size), [1])
    sums = LinearCoreCausalSums(qf, kf, v, chunk)
    return sums, op.MatMul(op.Transpose(kf, perm=[0, 1, 3, 2]), v)


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreAttendStep(
    qf: FLOAT, kf: FLOAT, v: FLOAT, kv_sum: FLOAT, k_sum: FLOAT, chunk_size: int, eps: float, clamp: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """ONNX twin of :func:`kernel_attention_step` with a state: (out, S', Z'), all float32."""
    sums, grown = LinearCoreStepSums(qf, kf, LinearCoreValues(v, qf), chunk_size=chunk_size)
    state = op.Concat(kv_sum, op.Unsqueeze(k_sum, [-1]), axis=-1)
    out = LinearCoreNormalise(op.Add(sums, op.MatMul(qf, state)), eps=eps, clamp=clamp)
    kv, k = LinearCoreSplitLast(op.Add(state, grown))
    return out, kv, op.Squeeze(k, [-1])


@onnxscript.script(LIBRARY, default_opset=op)
def LinearCoreAttendFirst(
    qf: FLOAT, kf: FLOAT, v: FLOAT, chunk_size: int, eps: float, clamp: int
) -> tuple[FLOAT, FLOAT, FLOAT]:
    """ONNX twin of :func:`kernel_attention_step` without a state (the prompt): (out, S, Z), float32."""
    sums, grown = LinearCoreStepSums(qf, kf, LinearCoreValues(v, qf), chunk_size=chunk_size)
    kv, k = LinearCoreSplitLast(grown)
    return LinearCoreNormalise(sums, eps=eps, clamp=clamp), kv, op.Squeeze(k, [-1])
