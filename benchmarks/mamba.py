"""Pure Mamba models exported by attnx: decode flat in position, and the selective scan on the gated op
(docs/benchmarks.md, "Mamba").

Two models at the released 130M shapes, fewer layers (random weights, seeded: speed does not depend on
training), the trained tokenizer's 512-token vocabulary:

* Mamba2 (SSD): width 768, 24 heads of 64, state 128, one B/C group, conv 4;
* Mamba1 (selective scan): width 768, 1536 channels, state 16, dt rank 48, conv 4.

Each is exported with ``attnx export --from hf:DIR --decode --no-verify`` (the tests verify these
exports), then measured at each context: prefill (s) and decode ms/token after it, HF eager torch (its
own cache) against attnx's export in onnxruntime-genai and in ``attnx generate``, all on 2 threads.
A recurrent model's decode costs the same at any position; the ratio 4000 / 256 shows it (4000 + the
decoded tokens stay within the 4096-token context attnx's genai config declares for a model without a
position limit).

``--peers``: the small trained models of every Mamba type (``attnx.testing.hf_hybrid``) built by attnx
(``attnx export --from hf:DIR --no-verify``) and by Microsoft's mobius-onnx (``mobius.build(DIR).save``)
where it takes them: build time, and each ``model.onnx``'s logits from the empty state against HF's
forward at several lengths (one unpadded row: mobius's graphs take no padding mask), or the first line
of the peer's error.

    python benchmarks/mamba.py [--layers 12] [--contexts 256,4000] [--steps 32] [--archs mamba2,mamba]
    python benchmarks/mamba.py --peers [--lengths 1,7,65,130]

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

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_hybrid import attnx_generate_speed, export_with_attnx, genai_speed, hf_speed, run_attnx  # noqa: E402

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


PEER_ARCHS = (
    "mamba2",
    "bamba",
    "granitemoehybrid",
    "nemotron_h",
    "falcon_h1",
    "mamba",
    "falcon_mamba",
    "jamba",
)


def logit_errors(onnx_path: Path, model: Any, lengths: list[int]) -> float:
    """The largest |logits - HF's| of ``onnx_path`` from the empty state over ``lengths`` (seeded ids)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for n in lengths:
        ids = np.random.default_rng(n).integers(0, model.config.vocab_size, (1, n))
        with torch.no_grad():
            expected = model(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()
        actual = hf_hybrid.empty_state_logits(session, ids)
        worst = max(worst, float(np.abs(actual - expected).max()))
    return worst


def build_with_mobius(saved: Path, out: Path) -> float:
    """mobius-onnx's build of ``saved`` into ``out``; its wall time (s)."""
    import mobius

    start = time.perf_counter()
    mobius.build(str(saved)).save(str(out))
    return time.perf_counter() - start


def peers(lengths: list[int], work: Path) -> list[dict[str, Any]]:
    """Every Mamba type's trained model through attnx and mobius-onnx (module docstring)."""
    import transformers

    from attnx.errors import first_line

    rows = []
    for arch in PEER_ARCHS:
        saved = hf_hybrid.make(arch)
        model = getattr(transformers, hf_hybrid.RECIPES[arch]["class"]).from_pretrained(saved).eval()
        for tool, build_it in (("attnx", export_with_attnx_plain), ("mobius-onnx", build_with_mobius)):
            out = work / f"{arch}-{tool}"
            row: dict[str, Any] = {"arch": arch, "tool": tool}
            try:
                row["build_s"] = round(build_it(saved, out), 1)
                row["max_abs_error"] = logit_errors(out / "model.onnx", model, lengths)
            except Exception as exc:  # a peer that fails is a result, reported by its first line
                row["error"] = first_line(exc, limit=160)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def export_with_attnx_plain(saved: Path, out: Path) -> float:
    """``attnx export --from hf:DIR --no-verify`` (the tests verify it); wall time (s)."""
    return run_attnx("export", "--from", f"hf:{saved}", "--no-verify", "-o", str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--contexts", default="256,4000")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--peers", action="store_true", help="attnx beside mobius-onnx on every Mamba type")
    parser.add_argument("--lengths", default="1,7,65,130")
    parser.add_argument("--archs", default=",".join(SHAPES), help=f"which of {', '.join(SHAPES)} to time")
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    torch.set_num_threads(2)
    hf_hybrid.pure_torch_gated_delta()
    if args.peers:
        with tempfile.TemporaryDirectory() as tmp:
            rows = peers([int(n) for n in args.lengths.split(",")], Path(tmp))
        print(f"\n{'arch':17} {'tool':12} {'build s':>8} {'max |logits - HF|':>18}")
        for row in rows:
            result = f"{row['max_abs_error']:18.2e}" if "error" not in row else f"  fails: {row['error']}"
            print(f"{row['arch']:17} {row['tool']:12} {row.get('build_s', float('nan')):8.1f} {result}")
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs.split(","):
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
