"""The choices and defaults of ``attnx optimize`` that its command line shows (no heavy imports)."""

from __future__ import annotations

PRECISIONS = ("int4", "int8", "fp32")  # of a layer kind under weight-only quantisation
ALGORITHMS = ("rtn", "hqq")  # round to nearest; half-quadratic (int4 only)
BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits takes powers of two from 16
DEFAULT_BLOCK_SIZE = 32  # onnxruntime-genai's model builder's int4 default
DEFAULT_SEED = 0  # of the random prompts: the same command gives the same report
DEFAULT_DECODE_TOKENS = 1000  # greedy steps of the long decode beside the float32 source
