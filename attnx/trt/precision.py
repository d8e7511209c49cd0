"""In which precision ``attnx build`` builds, per TensorRT version (pure Python, no tensorrt).

TensorRT 11 removed weak typing: ``BuilderFlag.FP16/BF16/INT8``, ``OBEY_PRECISION_CONSTRAINTS``,
INT8 calibrators and ``platform_has_fast_fp16`` are gone and every network is strongly typed, so an
engine computes in the dtypes its ONNX declares. An fp16 engine is therefore an fp16 export
(``attnx export --dtype fp16``) or an fp16 conversion of one (``attnx optimize --fp16``), which
says so in its manifest (``dtype: "fp16"``). ``--fp16`` on an fp32 export is refused rather than
silently building fp32.

TensorRT 10 keeps its weakly typed path: the FP16 builder flag lets TensorRT pick fp16 kernels
(for ``--fp16`` and for fp16 exports), as attnx has always built there.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from attnx.errors import AttnxError

STRONG_TYPING_MAJOR = 11  # first TensorRT without weak typing
MIN_VERSION = (10, 8)  # the tensorrt.plugin (QDP) API attnx's plugins use

Typing = Literal["strong", "weak"]


@dataclasses.dataclass(frozen=True)
class PrecisionPlan:
    """How an engine gets its precision.

    Attributes:
        typing: "strong" (TensorRT >= 11: the ONNX dtypes decide) or "weak" (TensorRT 10: flags).
        fp16_flag: set ``BuilderFlag.FP16`` (weak typing only; the flag does not exist on 11).
        export_dtype: what the export's graph computes in ("fp32", "fp16").
    """

    typing: Typing
    fp16_flag: bool
    export_dtype: str

    def describe(self) -> str:
        if self.typing == "strong":
            return f"strongly typed: the engine computes in the export's {self.export_dtype}"
        kernels = "fp16 kernels allowed (BuilderFlag.FP16)" if self.fp16_flag else "fp32 kernels"
        return f"weakly typed {self.export_dtype} export, {kernels}"


def precision_plan(version: tuple[int, int], export_dtype: str, fp16: bool, out: str) -> PrecisionPlan:
    """The precision of a build with TensorRT ``version`` of an ``export_dtype`` export, ``--fp16`` or not.

    Raises:
        AttnxError: TensorRT older than :data:`MIN_VERSION`, or ``--fp16`` on an fp32 export with
            TensorRT >= 11 (naming the two ways to an fp16 export).
    """
    if version < MIN_VERSION:
        raise AttnxError(
            f"TensorRT {version[0]}.{version[1]} is too old for attnx build (needs >= "
            f"{MIN_VERSION[0]}.{MIN_VERSION[1]}); install a newer one with pip install 'attnx[gpu]'"
        )
    if version[0] >= STRONG_TYPING_MAJOR:
        if fp16 and export_dtype != "fp16":
            raise AttnxError(
                f"--fp16: {out} is an {export_dtype} export and TensorRT {version[0]} builds the precision "
                "the ONNX declares; make an fp16 export with `attnx export --dtype fp16` or convert this one "
                f"with `attnx optimize {out} -o {out}-fp16 --fp16`, then build that"
            )
        return PrecisionPlan("strong", False, export_dtype)
    return PrecisionPlan("weak", fp16 or export_dtype == "fp16", export_dtype)
