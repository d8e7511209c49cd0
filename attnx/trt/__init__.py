"""TensorRT for attnx: QDP plugins for every ``attnx::<Op>``, engine building, ONNX wiring.

Nothing here imports ``tensorrt`` (or torch) at import time: ``import attnx.trt`` works on
machines without a GPU. :func:`tensorrt_missing` and :func:`cuda_missing` say precisely
why a TensorRT path cannot run here; the modules that need TensorRT import it lazily.

* :mod:`attnx.trt.spec`: each :class:`attnx.ops.AttentionOp` described as a plugin
  (inputs, fields, output shape rule), pure Python.
* :mod:`attnx.trt.qdp`: ``tensorrt.plugin`` registrations generated from those specs (JIT: the
  variant's torch op; AOT: :mod:`attnx.trt.aot`, the op's Triton kernel compiled to PTX).
* :mod:`attnx.trt.graph`: what TensorRT's ONNX parser needs from a graph (plugin nodes, opset,
  standard ``Attention`` nodes), and the ``trt.plugins`` rewrite for ONNX Runtime's TensorRT EP.
* :mod:`attnx.trt.precision`: strongly (TensorRT 11) or weakly (TensorRT 10) typed builds.
* :mod:`attnx.trt.engine`, :mod:`attnx.trt.inspector`, :mod:`attnx.trt.build`: ``attnx build``:
  the TensorRT calls, what the built engine holds, and the manifest record.
"""

from __future__ import annotations

import importlib.util
import os
import re

from attnx.errors import AttnxError, first_line

GPU_EXTRA_HINT = "pip install 'attnx[gpu]' on a machine with an NVIDIA GPU and CUDA"


def tensorrt_missing() -> str | None:
    """Why ``import tensorrt`` fails here (None when it works); see :data:`GPU_EXTRA_HINT` for the fix."""
    if importlib.util.find_spec("tensorrt") is None:
        return "tensorrt is not installed"
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:  # the bindings wheel installs, but libnvinfer may be missing
        return f"tensorrt not importable: {first_line(exc)}"
    return None


def tensorrt_version() -> str | None:
    """The importable TensorRT's version, or None."""
    if tensorrt_missing():
        return None
    import tensorrt

    return str(tensorrt.__version__)


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a TensorRT version string ("11.4.0.106", "10.14.1.48.post1").

    Raises:
        AttnxError: a string that does not start with "<major>.<minor>".
    """
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise AttnxError(f"cannot read the TensorRT version {version!r}; reinstall tensorrt")
    return int(match.group(1)), int(match.group(2))


def triton_missing() -> str | None:
    """Why Triton cannot compile kernels to PTX here (None when it can)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'attnx[triton]')"
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET is set (Triton's interpreter compiles nothing); unset it"
    return None


def cuda_missing() -> str | None:
    """Why no CUDA device can be used here (None when one can)."""
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return "no CUDA device (this torch is a CPU-only build)"
        return f"no CUDA device (torch built for CUDA {torch.version.cuda} sees none)"
    return None
