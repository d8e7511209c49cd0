"""Which ONNX opsets attnx writes, and the IR version every graph it writes states.

Measured by loading a one-node model in each ONNX Runtime release (CPU wheels from PyPI):

| onnxruntime | IR versions | ai.onnx opsets | standard ``Attention`` (CPU) |
|---|---|---|---|
| 1.22 | <= 10 | <= 22 | no |
| 1.23 | <= 11 | <= 23 | opset 23 |
| 1.24 | <= 13 | <= 25 | opsets 23, 24 |
| 1.25 | <= 13 | <= 26 | opsets 23, 24 |
| 1.32 | <= 14 | <= 28 | opsets 23, 24 |

(a newer opset or IR is refused at session creation: "Unsupported model IR version", "Current
official support for domain ai.onnx is till opset N"); attnx's own softmax lm exports with --decode at
opsets 18/22/23/24/25 (model, prefill, decode, genai graphs) load exactly where this table says in
onnxruntime 1.22.1, 1.23.2, 1.24.1 and 1.32.0). TensorRT 11.5's ONNX parser reads opsets
<= 25 (10.15: <= 24). onnx stamps the IR version of its own release (1.23: IR 14), which ORT 1.31
and older refuse, so every graph states the lowest IR version that carries its opset and
attnx's function overloads (IR 10): :data:`IR_VERSIONS`.

Policy: opsets 18..27; the default, 18, loads in every supported ONNX Runtime (>= 1.22) and TensorRT;
23..27 need the ONNX Runtime named in :data:`MIN_ONNXRUNTIME` (softmax lowers to the standard
``Attention`` op from 23, ``attnx.plugins.softmax``; the gated and linear families to the standard
``LinearAttention`` at 27, docs/variants/gated.md); 26 and 27 are newer than TensorRT 11.5 parses (25).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import onnx

from attnx.errors import AttnxError

if TYPE_CHECKING:
    from attnx.ops import AttentionOp

DEFAULT_OPSET = 18
# ai.onnx opset -> the IR version a graph at that opset states: max(10, the IR of the onnx release
# that introduced the opset); IR 10 is what ONNX function overloads (attnx's bodies) need.
IR_VERSIONS = {18: 10, 19: 10, 20: 10, 21: 10, 22: 10, 23: 11, 24: 12, 25: 13, 26: 13, 27: 13}
OPSETS = tuple(IR_VERSIONS)
# ai.onnx opset -> the oldest ONNX Runtime that loads a graph at it (with its IR version).
# 1.25..1.31 load opset 27 only behind an environment variable (docs/architecture.md).
MIN_ONNXRUNTIME = {
    **dict.fromkeys(range(18, 23), "1.22"),
    23: "1.23",
    24: "1.24",
    25: "1.24",
    26: "1.25",
    27: "1.32",
}


def model_opset(proto: onnx.ModelProto | onnx.FunctionProto) -> int:
    """The ai.onnx opset a model (or function) imports."""
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def state_ir_version(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Set ``proto.ir_version`` to the policy's IR version for its opset (in place); returns it."""
    proto.ir_version = IR_VERSIONS[model_opset(proto)]
    return proto


def check_opset(opset: int, lowering: str, ops: Sequence[AttentionOp] = ()) -> None:
    """Refuse, in one line, an opset attnx does not write or that ``lowering`` cannot serve ``ops`` at.

    Raises:
        AttnxError: an opset outside :data:`OPSETS`, one the installed onnx package does not know,
            or (function/decomposed lowering) an op none of whose ONNX bodies can be written at it.
    """
    if opset not in IR_VERSIONS:
        raise AttnxError(
            f"opset {opset} is not supported (choose {OPSETS[0]}..{OPSETS[-1]}: {DEFAULT_OPSET} loads in "
            f"every onnxruntime >= {MIN_ONNXRUNTIME[DEFAULT_OPSET]}, 25 is TensorRT 11's newest)"
        )
    known = onnx.defs.onnx_opset_version()
    if opset > known:
        raise AttnxError(
            f"opset {opset} is newer than the installed onnx {onnx.__version__} knows ({known}); "
            f"upgrade onnx or choose --opset {known}"
        )
    if lowering == "plugin":
        return
    for op in ops:
        needed = min(op.body_opsets())
        if needed > opset:
            raise AttnxError(
                f"the {lowering} lowering of attnx::{op.name} needs opset >= {needed} (its ONNX bodies use "
                f"newer ops); choose --opset {needed}..{OPSETS[-1]} or the plugin lowering"
            )


def check_onnxruntime(opset: int, version: str) -> None:
    """Refuse an opset the ONNX Runtime ``version`` (e.g. the installed one, which verifies) cannot load.

    Raises:
        AttnxError: ``version`` is older than :data:`MIN_ONNXRUNTIME` for ``opset``.
    """
    if not onnxruntime_loads(opset, version):
        loadable = [o for o in OPSETS if onnxruntime_loads(o, version)]
        raise AttnxError(
            f"opset {opset} needs onnxruntime >= {MIN_ONNXRUNTIME[opset]} to load (installed: {version}); "
            f"upgrade it, export with --opset {max(loadable, default=DEFAULT_OPSET)} or skip verification "
            "with --no-verify"
        )


def onnxruntime_loads(opset: int, version: str) -> bool:
    """Whether ONNX Runtime ``version`` loads graphs at ``opset`` (one of :data:`OPSETS`)."""
    return _release(version) >= _release(MIN_ONNXRUNTIME[opset])


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as "1.23.2" or "1.24.0.dev20250101"."""
    return tuple(int(part) for part in version.split(".")[:2])
