"""A third-party plugin whose ops declare bodies for the ``ort`` lowering target (ONNX Runtime's kernels).

Plain causal linear attention, o_t = scale * sum_{j<=t} (q_t . k_j) v_j, the ``"linear"`` update rule
of ONNX Runtime's ``com.microsoft::LinearAttention`` (recurrence S_t = S_{t-1} + k_t v_t^T, o_t =
scale * S_t^T q_t; packed (batch, seq, heads * d) tensors, head counts as attributes):

* ``target_running``: its op's portable body computes the masked matrix form with standard ops; its
  ``ort`` body calls ``LinearAttention`` (onnxruntime 1.32 has it);
* ``target_missing``: the same, but its ``ort`` body calls ``com.microsoft::LinearAttentionV9``, which
  no onnxruntime has: ``--target ort`` must refuse it, naming the kernel and the release it claims.

Both attend causally only (``bidirectional=False``): they serve ``lm`` models.
"""

from __future__ import annotations

import dataclasses
import math

import onnxscript
import torch
from onnxscript import FLOAT
from onnxscript import opset18 as op

import attnx
from attnx.attention import MultiHeadAttention
from attnx.config import Config
from attnx.ops import LIBRARY, OPSET, AttentionOp, TargetBodies, VariantImpl

MSFT = onnxscript.values.Opset("com.microsoft", 1)
NAMES = ("running", "missing")


def _define(name: str) -> object:
    @torch.library.custom_op(f"attnx::target_{name}_attention", mutates_args=())
    def attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, scale: float
    ) -> torch.Tensor:
        return ((q @ k.transpose(-1, -2)) * scale).tril() @ v

    @attention.register_fake
    def _(q, k, v, heads, scale):
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    return attention


@onnxscript.script(LIBRARY, default_opset=op)
def TargetPacked(x: FLOAT) -> FLOAT:
    """(batch, heads, seq, d) -> (batch, seq, heads * d), ONNX Runtime's packed layout."""
    return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))


@onnxscript.script(LIBRARY, default_opset=op)
def TargetUnpacked(packed: FLOAT, like: FLOAT) -> FLOAT:
    """(batch, seq, heads * d) -> (batch, heads, seq, d) shaped as ``like`` (batch, heads, seq, d)."""
    unpacked = op.Reshape(packed, op.Shape(op.Transpose(like, perm=[0, 2, 1, 3])))
    return op.Transpose(unpacked, perm=[0, 2, 1, 3])


@onnxscript.script(OPSET, default_opset=op)
def TargetRunningPortable(q: FLOAT, k: FLOAT, v: FLOAT, heads: int, scale: float) -> FLOAT:
    scaled = op.Mul(q, op.CastLike(op.Constant(value_float=scale), q))
    return op.MatMul(op.Trilu(op.MatMul(scaled, op.Transpose(k, perm=[0, 1, 3, 2])), upper=0), v)


@onnxscript.script(OPSET, default_opset=op)
def TargetRunningOrt(q: FLOAT, k: FLOAT, v: FLOAT, heads: int, scale: float) -> FLOAT:
    out, state = MSFT.LinearAttention(
        TargetPacked(q), TargetPacked(k), TargetPacked(v),
        q_num_heads=heads, kv_num_heads=heads, scale=scale, update_rule="linear",
    )  # fmt: skip
    return TargetUnpacked(out, v)


@onnxscript.script(OPSET, default_opset=op)
def TargetMissingOrt(q: FLOAT, k: FLOAT, v: FLOAT, heads: int, scale: float) -> FLOAT:
    out, state = MSFT.LinearAttentionV9(
        TargetPacked(q), TargetPacked(k), TargetPacked(v),
        q_num_heads=heads, kv_num_heads=heads, scale=scale, update_rule="linear",
    )  # fmt: skip
    return TargetUnpacked(out, v)


OPS = {
    name: AttentionOp(
        name=f"Target{name.capitalize()}Attention",
        torch_op=_define(name),
        bodies=(TargetRunningPortable,),
        targets={
            "ort": TargetBodies(
                (TargetRunningOrt if name == "running" else TargetMissingOrt,),
                since="1.24" if name == "running" else "9.9",
            )
        },
    )
    for name in NAMES
}


class TargetLayer(MultiHeadAttention):
    def __init__(self, name: str, spec: attnx.AttentionSpec) -> None:
        super().__init__(spec)
        self.name, self.scale = name, 1.0 / math.sqrt(spec.head_dim)

    def attend(self, q, k, v, key_padding_mask):
        return OPS[self.name].torch_op(q, k, v, self.spec.n_heads, self.scale)


@dataclasses.dataclass(frozen=True)
class TargetConfig(Config):
    pass


IMPL_RUNNING, IMPL_MISSING = (
    VariantImpl(build=lambda config, spec, name=name: TargetLayer(name, spec), ops=(OPS[name],))
    for name in NAMES
)
VARIANTS = [
    attnx.Variant(
        name=f"target_{name}",
        summary=f"causal running linear attention with an ort body ({name})",
        paper="none (test plugin)",
        config=TargetConfig,
        capabilities=attnx.Capabilities(causal=True, bidirectional=False, key_padding_mask=False, fp16=False),
        tolerance=attnx.Tolerance(atol=1e-4, rtol=1e-3),
        impl=f"{__name__}:IMPL_{name.upper()}",
    )
    for name in NAMES
]


@attnx.hookimpl
def attnx_register_variants() -> list[attnx.Variant]:
    return VARIANTS
