"""Make the small trained Hugging Face hybrids that attnx's tests and benchmarks use.

Each is a small config of its architecture (Qwen3-Next: Gated DeltaNet, gated softmax attention and
MoE; Qwen3.5's text models; Kimi Linear: Kimi Delta Attention, multi-head latent attention, MoE;
MiniMax: lightning attention), a byte-level BPE tokenizer trained on CPython's documentation
(``pydoc_data``), and a few hundred AdamW steps of next-token training on that text on CPU, saved
with ``save_pretrained`` (safetensors) and the tokenizer. The directory is keyed by a hash of the
recipe, so a second run reuses it (attnx.testing.hf_hybrid holds the recipes).

    python examples/train_hf_hybrid.py                     # all, into ~/.cache/attnx/hf-fixtures
    python examples/train_hf_hybrid.py qwen3_5 --out models
    attnx export --from hf:models/qwen3_5-<hash> -o qwen35
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnx.testing import hf_hybrid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archs", nargs="*", help=f"any of {', '.join(hf_hybrid.RECIPES)} (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="root directory (default: the fixture cache)")
    args = parser.parse_args()
    unknown = sorted(set(args.archs) - set(hf_hybrid.RECIPES))
    if unknown:
        parser.error(f"no recipe {', '.join(unknown)}; choose from {', '.join(hf_hybrid.RECIPES)}")
    for arch in args.archs or hf_hybrid.RECIPES:
        print(f"{arch}:")
        print(hf_hybrid.make(arch, args.out, log=lambda line: print(f"  {line}", flush=True)))


if __name__ == "__main__":
    main()
