"""TensorRT for attnx: QDP plugins for every ``attnx::<Op>``, engine building, ONNX wiring.

Nothing here imports ``tensorrt`` (or torch) at import time: ``import attnx.trt`` works on
machines without a GPU. :func:`tensorrt_missing` and :func:`cuda_missing` say precisely
why a TensorRT path cannot run here; the modules that need TensorRT import it lazily.

* :mod:`attnx.trt.spec`: each :class:`attnx.ops.AttentionOp` described as a plugin
  (inputs, fields, output shape rule), pure Python.
* :mod:`attnx.trt.qdp`: ``tensorrt.plugin`` registrations generated from those specs.
* :mod:`attnx.trt.graph`: the ONNX contract of plugin nodes, and the ``trt.plugins`` rewrite
  for ONNX Runtime's TensorRT execution provider.
* :mod:`attnx.trt.build`: ``attnx build`` (Polygraphy) and the engine's manifest record.
"""

from __future__ import annotations

import importlib.util

from attnx.errors import first_line

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


def cuda_missing() -> str | None:
    """Why no CUDA device can be used here (None when one can)."""
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return "no CUDA device (this torch is a CPU-only build)"
        return f"no CUDA device (torch built for CUDA {torch.version.cuda} sees none)"
    return None
