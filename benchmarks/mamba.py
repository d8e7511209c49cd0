"""Pure Mamba models exported by attnx: decode flat in position, and the selective scan on the gated op
(docs/benchmarks.md, "Mamba").

Two models at the released 130M shapes, fewer layers (random weights, seeded: speed does not depend on
training), the trained tokenizer's 512-token vocabulary:

* Mamba2 (SSD): width 768, 24 heads of 64, state 128, one B/C group, conv 4;
* Mamba1 (selective scan): width 768, 1536 channels, state 16, dt rank 48, conv 4.

Each is exported with ``attnx export --from hf:DIR --decode --no-verify`` (the tests verify these
exports), then measured at each context: prefill (s) and decode ms/token after it, HF eager torch (its
own cache) against attnx's export in onnxruntime-genai and in ``attnx generate``, all on 2 threads.
A recurrent model's decode costs the same at any position; the ratio 4096 / 256 shows it.

    python benchmarks/mamba.py [--layers 12] [--contexts 256,4096] [--steps 32]

Prints one JSON object per measurement and a summary table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_hybrid import attnx_generate_speed, export_with_attnx, genai_speed, hf_speed  # noqa: E402

from attnx.testing import hf_hybrid  # noqa: E402

SHAPES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mamba2": (
        "Mamba2ForCausalLM",
        "Mamba2Config",
        {"hidden_size": 768, "num_heads": 24, "head_dim": 64, "state_size": 128, "n_groups": 1, "expand": 2},
    ),
    "mamba": (
        "MambaForCausalLM",
        "MambaConfig",
        {"hidden_size": 768, "state_size": 16, "expand": 2, "time_step_rank": 48},
    ),
}


def build(arch: str, layers: int, out: Path) -> Any:
    """``arch``'s model at its 130M shape with ``layers`` layers, seeded, saved to ``out`` with the trained
    tokenizer."""
    import transformers

    name, config, shape = SHAPES[arch]
    options = {**shape, "num_hidden_layers": layers, "vocab_size": hf_hybrid.VOCAB_SIZE, "conv_kernel": 4}
    torch.manual_seed(0)
    model = getattr(transformers, name)(getattr(transformers, config)(**options)).eval()
    model.save_pretrained(out)
    hf_hybrid.train_tokenizer().save_pretrained(out)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--contexts", default="256,4096")
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    torch.set_num_threads(2)
    hf_hybrid.pure_torch_gated_delta()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in SHAPES:
            saved, out = Path(tmp) / f"{arch}-hf", Path(tmp) / f"{arch}-attnx"
            model = build(arch, args.layers, saved)
            export_s = export_with_attnx(saved, out, "portable")
            print(json.dumps({"arch": arch, "export_s": round(export_s, 1)}), flush=True)
            for context in contexts:
                for tool, measure, where in (
                    ("HF eager", hf_speed, model),
                    ("attnx genai", genai_speed, out),
                    ("attnx generate", attnx_generate_speed, out),
                ):
                    start = time.perf_counter()
                    measured = measure(where, context, args.steps)
                    row = {"arch": arch, "tool": tool, "context": context, **measured}
                    row["wall_s"] = round(time.perf_counter() - start, 1)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    print(f"\n{'arch':8} {'tool':15} {'context':>7} {'prefill s':>10} {'decode ms/token':>16}")
    for row in rows:
        print(
            f"{row['arch']:8} {row['tool']:15} {row['context']:7d} {row['prefill_s']:10.3f} "
            f"{row['decode_ms_per_token']:16.2f}"
        )


if __name__ == "__main__":
    main()
