"""The choices and defaults of ``attnx optimize`` that its command line shows (no heavy imports)."""

from __future__ import annotations

PRECISIONS = ("int4", "int8", "fp32")  # of a layer kind under weight-only quantisation
ALGORITHMS = ("rtn", "hqq")  # round to nearest; half-quadratic (int4 only)
BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits takes powers of two from 16
DEFAULT_BLOCK_SIZE = 32  # onnxruntime-genai's model builder's int4 default
DEFAULT_SEED = 0  # of the random prompts: the same command gives the same report
DEFAULT_DECODE_TOKENS = 1000  # greedy steps of the long decode beside the float32 source
# A language model's default gate per step, on the text: (largest mean KL in nats per token, smallest top-1
# agreement). Measured on the trained Qwen3.5 test hybrid (width 64) with the default text: int4 RTN blocks
# of 32 KL 0.006, top-1 90%; weight-only int8 KL 2e-5, top-1 99.3%; the exact steps far below. Steps taken
# together are held to the loosest of their bounds.
TEXT_BOUNDS = {
    "int4": (0.05, 0.85),
    "int8": (2e-3, 0.98),
    "dynamic-int8": (0.05, 0.85),
    "fp16": (2e-3, 0.98),
    "slim": (1e-4, 0.99),
    "fuse": (1e-4, 0.99),
}
