"""Hugging Face hybrids (Qwen3.5, Qwen3-Next, LFM2) exported by the ecosystem's own tools, measured
against HF's own forward (docs/benchmarks.md, "Hugging Face hybrids").

On the small trained models of ``attnx.testing.hf_hybrid`` (``examples/train_hf_hybrid.py``):

* **onnxruntime-genai's model builder** (``python -m onnxruntime_genai.models.builder``, 0.18): it
  takes Qwen3.5 only as a ``Qwen3_5ForConditionalGeneration`` checkpoint (with a vision tower), so
  the trained text model is wrapped into one (a one-block vision tower, the text weights copied; its
  text forward is checked equal to the text model's). Measured: build time, the built model's prefill
  logits against HF's forward at several lengths (empty state), greedy tokens and tokens/s in genai
  against HF ``generate``. It takes LFM2 and LFM2-MoE as saved; beside it, attnx's exports of the same model
  (``attnx export --from hf:DIR --decode``, portable, and ``--target ort`` after ``attnx optimize
  --fuse``) measured the same way, then the three's genai decode speed in ``--repeats`` interleaved
  rounds.
* **transformers' own ``OnnxExporter``** (``transformers.exporters.exporter_onnx``): export time,
  which inputs the graph takes (state or not), logits against HF's forward at several lengths.
* **speed** (``--speed``): a Qwen3.5 text model of width 512 (3 Gated DeltaNet + 1 gated attention
  layer, random weights: speed does not depend on training): prefill of 4096 tokens and decode
  ms/token after 4096 tokens of context, HF eager torch (its cache) against the genai builder's model
  and attnx's export (``--decode``, ``--target ort`` and portable; the ort one also after ``attnx
  optimize --fuse``) in onnxruntime-genai and in ``attnx generate``, all on 2 threads; and the floor
  of any float32 prefill of these weights: every ``nn.Linear`` of the model on the same number of
  tokens in torch. Then decode ms/token in ``attnx
  generate`` after 256, 1024 and 4096 tokens (``--positions``), of the hybrid and of the same model
  with linear layers only.

    python benchmarks/hf_hybrid.py [--archs qwen3_5,lfm2,lfm2_moe] [--lengths 7,37,65,130] [--new-tokens 200]
    python benchmarks/hf_hybrid.py --speed [--context 4096] [--steps 32] [--positions 256,1024,4096]
                                   [--fuse ort]

Prints one JSON object per measurement and a summary table.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnx.testing import hf_hybrid

PROMPT = "def fibonacci(n):\n    "


def conditional_checkpoint(text_dir: Path, out: Path) -> Path:
    """A ``Qwen3_5ForConditionalGeneration`` checkpoint holding the trained text model of ``text_dir``.

    Raises:
        AssertionError: its text forward differs from the text model's.
    """
    import transformers

    hf_hybrid.pure_torch_gated_delta()  # the check's forwards, on CPU
    text = transformers.Qwen3_5ForCausalLM.from_pretrained(text_dir).eval()
    settings = text.config.to_dict()
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}
    config = transformers.Qwen3_5Config(
        text_config=settings,
        vision_config={**vision, "out_hidden_size": settings["hidden_size"]},
        tie_word_embeddings=settings["tie_word_embeddings"],
    )
    model = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    ids = torch.randint(0, settings["vocab_size"], (1, 33))
    with torch.no_grad():
        same = torch.equal(text(input_ids=ids).logits, model(input_ids=ids).logits)
    assert same, "the conditional-generation wrapper changed the text forward"
    model.save_pretrained(out)
    if (text_dir / "tokenizer.json").is_file():  # a directory of random weights may have none
        transformers.AutoTokenizer.from_pretrained(text_dir).save_pretrained(out)
    return out


def build_with_genai(checkpoint: Path, out: Path, precision: str = "fp32") -> float:
    """onnxruntime-genai's model builder (``precision``: fp32, fp16 or int4; CPU) on ``checkpoint``; returns
    its wall time (s)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out)]
        + ["-p", precision, "-e", "cpu", "-c", str(out.parent / "builder-cache")],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def model_session(model_dir: Path) -> Any:
    """An ONNX Runtime session (CPU) of ``model_dir``'s ``model.onnx``, made once for every length."""
    import onnxruntime as ort

    return ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])


def hf_logits(model: Any, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()


def error_rows(tool: str, arch: str, lengths: list[int], model: Any, run: Any) -> list[dict[str, Any]]:
    """Max abs logit error of ``run(ids)`` against HF's forward at each length (or why it fails to run),
    and the logit range."""
    rows = []
    for n in lengths:
        ids = np.random.default_rng(n).integers(0, model.config.vocab_size, (1, n), dtype=np.int64)
        expected = hf_logits(model, ids)
        try:
            error: float | str = float(np.abs(run(ids) - expected).max())
        except Exception as exc:  # the tool's model failing to run at this length is the measurement
            error = f"fails: {str(exc).splitlines()[0][-160:]}"
        rows.append(
            {
                "tool": tool,
                "arch": arch,
                "length": n,
                "max_abs_error": error,
                "logit_range": float(expected.max() - expected.min()),
            }
        )
    return rows


def greedy_row(
    tool: str, arch: str, model_dir: Path, model: Any, tokenizer: Any, args: Any
) -> dict[str, Any]:
    """Greedy tokens of ``model_dir`` in onnxruntime-genai against HF ``generate`` (float ties reported),
    and genai's tokens/s."""
    prompt = tokenizer(PROMPT).input_ids
    expected, logits = hf_hybrid.hf_greedy(model, torch.tensor([prompt]), args.new_tokens)
    tokens, speed = hf_hybrid.genai_greedy(model_dir, prompt, args.new_tokens)
    try:
        agreed, tie = hf_hybrid.agreement(expected, logits, tokens, 1e-4)
        verdict = f"{agreed} agree" + (f" (tie at {tie})" if tie is not None else "")
    except AssertionError as exc:
        verdict = f"differs: {exc}"
    return {
        "tool": tool,
        "arch": arch,
        "greedy_vs_hf_generate": verdict,
        "genai_tokens_per_s": round(speed, 1),
    }


# what the builder reads for each architecture it takes: Qwen3.5 only as a checkpoint with a vision tower,
# LFM2 and LFM2-MoE as saved
BUILDER_CHECKPOINTS: dict[str, Callable[[Path, Path], Path]] = {
    "qwen3_5": conditional_checkpoint,
    "lfm2": lambda directory, out: directory,
    "lfm2_moe": lambda directory, out: directory,
}


def genai_builder(
    arch: str, arch_dir: Path, model: Any, tokenizer: Any, work: Path, args: Any
) -> list[dict[str, Any]]:
    """onnxruntime-genai's model builder on ``arch``'s trained model: build time, logits against HF's
    forward, greedy tokens and tokens/s in genai."""
    built = work / f"{arch}-builder"
    seconds = build_with_genai(BUILDER_CHECKPOINTS[arch](arch_dir, work / f"{arch}-checkpoint"), built)
    rows = [{"tool": "genai-builder", "arch": arch, "build_s": round(seconds, 1)}]
    head_dim = (
        getattr(model.config, "head_dim", None)
        or model.config.hidden_size // model.config.num_attention_heads
    )
    rows += error_rows(
        "genai-builder",
        arch,
        args.lengths,
        model,
        functools.partial(hf_hybrid.empty_state_logits, model_session(built), free_dim=head_dim),
    )
    return [*rows, greedy_row("genai-builder", arch, built, model, tokenizer, args)]


def attnx_beside_the_builder(
    arch: str, arch_dir: Path, model: Any, tokenizer: Any, work: Path, args: Any
) -> list[dict[str, Any]]:
    """attnx's decode export of the same model, measured as :func:`genai_builder` measures the builder's
    (portable, and ``--target ort`` after ``attnx optimize --fuse``), then the decode speed of the three
    in ``args.repeats`` interleaved rounds (the median per tool): a toy's tokens/s moves by 2x between
    runs on this machine, so only a side-by-side figure means anything."""
    rows, built = [], {"genai-builder": work / f"{arch}-builder"}
    for target in ("portable", "ort"):
        out, tool = work / f"{arch}-attnx-{target}", f"attnx ({target})"
        seconds = export_with_attnx(arch_dir, out, target)
        if target == "ort":
            fused = work / f"{arch}-attnx-fused"
            seconds += fuse_with_attnx(out, fused)
            out, tool = fused, "attnx (ort, --fuse)"
        rows.append({"tool": tool, "arch": arch, "build_s": round(seconds, 1)})
        rows += error_rows(
            tool,
            arch,
            args.lengths,
            model,
            functools.partial(hf_hybrid.empty_state_logits, model_session(out)),
        )
        rows.append(greedy_row(tool, arch, out, model, tokenizer, args))
        built[tool] = out
    prompt = tokenizer(PROMPT).input_ids
    speeds: dict[str, list[float]] = {tool: [] for tool in built}
    for _ in range(args.repeats):
        for tool, directory in built.items():
            speeds[tool].append(hf_hybrid.genai_greedy(directory, prompt, args.new_tokens)[1])
    rows += [
        {
            "tool": tool,
            "arch": arch,
            "genai_tokens_per_s_median": round(float(np.median(s)), 1),
            "rounds": [round(x) for x in s],
        }
        for tool, s in speeds.items()
    ]
    return rows


def transformers_exporter(arch: str, model: Any, args: Any) -> list[dict[str, Any]]:
    import onnxruntime as ort
    from transformers.exporters.exporter_onnx import OnnxConfig, OnnxExporter

    sample = {"input_ids": torch.randint(0, model.config.vocab_size, (1, 37))}
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = OnnxExporter().export(model, sample, config=OnnxConfig(dynamic=True))
    except Exception as exc:  # the exporter's own failure is the measurement
        return [{"tool": "transformers-onnx", "arch": arch, "error": str(exc).splitlines()[0][:200]}]
    seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        import onnx_ir

        onnx_ir.save(exported.program, str(path))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        inputs = [a.name for a in session.get_inputs()]
        outputs = [a.name for a in session.get_outputs()]

        def run(ids: np.ndarray) -> np.ndarray:
            return session.run([outputs[0]], {"input_ids": ids})[0]

        rows = [
            {
                "tool": "transformers-onnx",
                "arch": arch,
                "export_s": round(seconds, 1),
                "inputs": inputs,
                "outputs": len(outputs),
            }
        ]
        return rows + error_rows("transformers-onnx", arch, args.lengths, model, run)


SPEED_TEXT = {
    "vocab_size": hf_hybrid.VOCAB_SIZE,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rope_parameters": {  # mrope sections sum to half the rotary width (64 * 0.25 / 2)
        **hf_hybrid.RECIPES["qwen3_5"]["options"]["rope_parameters"],
        "mrope_section": [4, 2, 2],
    },
}


def speed_text_model(out: Path, **changes: Any) -> Any:
    """The width-512 Qwen3.5 text model (seeded random weights; ``changes`` to its config), saved to ``out``
    with the trained tokenizer."""
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**SPEED_TEXT | changes)).eval()
    model.save_pretrained(out)
    hf_hybrid.train_tokenizer().save_pretrained(out)
    return model


def speed_prompt(context: int) -> list[int]:
    """The ``context`` prompt ids every speed row runs (seeded: each runtime sees the same tokens)."""
    return np.random.default_rng(0).integers(1, hf_hybrid.VOCAB_SIZE, context).tolist()


def hf_speed(model: Any, context: int, steps: int) -> dict[str, float]:
    """HF eager: prefill of ``context`` tokens (s) and ms per decoded token after it (its own cache)."""
    ids = torch.tensor([speed_prompt(context)])
    with torch.no_grad():
        start = time.perf_counter()
        out = model(input_ids=ids, use_cache=True)
        prefill = time.perf_counter() - start
        cache, token = out.cache, out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=token, cache=cache, use_cache=True)
            cache, token = out.cache, out.logits[:, -1:].argmax(-1)
        decode = (time.perf_counter() - start) / steps
    return {"prefill_s": prefill, "decode_ms_per_token": 1000 * decode}


def dense_floor(model: Any, context: int) -> dict[str, float]:
    """Every ``nn.Linear`` of ``model`` (projections, MLPs, the head) on ``context`` tokens in torch: the
    float32 matrix products any prefill of these weights computes, HF's and the exports' alike (s)."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {n: torch.randn(1, context, n) for n in {layer.in_features for layer in layers}}
    with torch.no_grad():
        start = time.perf_counter()
        for layer in layers:
            layer(inputs[layer.in_features])
    return {"prefill_s": time.perf_counter() - start}


def genai_speed(model_dir: Path, context: int, steps: int) -> dict[str, float]:
    """onnxruntime-genai: prefill of ``context`` tokens (s) and ms per decoded token after it."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    total = context + steps
    params.set_search_options(do_sample=False, max_length=total, min_length=total)
    generator = og.Generator(model, params)
    prompt = speed_prompt(context)
    start = time.perf_counter()
    generator.append_tokens(prompt)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
    decode = (time.perf_counter() - start) / steps
    return {"prefill_s": prefill, "decode_ms_per_token": 1000 * decode}


def run_attnx(*args: str) -> float:
    """``attnx ARGS`` in a fresh process; its wall time (s)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnx", *args], check=True, capture_output=True)
    return time.perf_counter() - start


def export_with_attnx(text_dir: Path, out: Path, target: str) -> float:
    """``attnx export --from hf:DIR --decode --target TARGET`` (not verified: the tests verify these
    exports); returns its wall time (s)."""
    return run_attnx(
        "export", "--from", f"hf:{text_dir}", "--decode", "--no-verify", "--target", target, "-o", str(out)
    )


def fuse_with_attnx(source: Path, out: Path) -> float:
    """``attnx optimize SOURCE -o OUT --fuse`` (its accuracy and parity checks included); wall time (s)."""
    return run_attnx("optimize", str(source), "-o", str(out), "--fuse", "--quiet")


def attnx_generate_speed(out: Path, context: int, steps: int) -> dict[str, float]:
    """``attnx generate`` (ONNX Runtime, 2 threads): prefill of ``context`` tokens (s) and ms per decoded
    token after it."""
    import attnx

    prompt = speed_prompt(context)
    run = attnx.generate(out, prompt, steps + 1, threads=2)  # the first new token comes from prefill
    return {"prefill_s": run.prefill_seconds, "decode_ms_per_token": 1000 * run.decode_seconds / steps}


# (tool, context, measure, arguments): one speed row
Measurement = tuple[str, int, Callable[..., dict[str, float]], tuple[Any, ...]]


def speed(args: Any, work: Path) -> Iterator[dict[str, Any]]:
    """The speed rows: every model built and exported first, then ``args.repeats`` rounds that measure
    each runtime once in turn, and each figure's best round. Interleaved, the rows share the shared
    machine's load phases (its other jobs moved HF's prefill from 5 to 21 s between runs); the best
    round is what a runtime does when the machine lets it."""
    model = speed_text_model(work / "text")
    build_with_genai(conditional_checkpoint(work / "text", work / "conditional"), work / "speed-builder")
    context, steps = args.context, args.steps
    measurements: list[Measurement] = [
        ("hf-eager", context, hf_speed, (model, context, steps)),
        ("dense-floor (torch)", context, dense_floor, (model, context)),
        ("genai-builder", context, genai_speed, (work / "speed-builder", context, steps)),
    ]
    for target in args.targets.split(","):
        out = work / f"speed-attnx-{target}"
        yield {"tool": f"attnx-{target} export", "export_s": export_with_attnx(work / "text", out, target)}
        exports = [(f"attnx-{target}", out)]
        if target in args.fuse.split(","):
            fused = work / f"speed-attnx-{target}-fused"
            yield {"tool": f"attnx-{target} optimize --fuse", "optimize_s": fuse_with_attnx(out, fused)}
            exports.append((f"attnx-{target}+fuse", fused))
        for name, path in exports:
            measurements += [
                (f"{name} genai", context, genai_speed, (path, context, steps)),
                (f"{name} attnx-generate", context, attnx_generate_speed, (path, context, steps)),
            ]
    measurements += position_measurements(args, work, hybrid=work / "speed-attnx-ort")
    rounds = [[measure(*arguments) for _, _, measure, arguments in measurements] for _ in range(args.repeats)]
    for index, (tool, at, _, _) in enumerate(measurements):
        figures = [found[index] for found in rounds]
        yield {"tool": tool, "context": at, **{key: min(f[key] for f in figures) for key in figures[0]}}


def position_measurements(args: Any, work: Path, hybrid: Path) -> list[Measurement]:
    """Decode ms/token in ``attnx generate`` after each of ``args.positions`` prompt tokens: the hybrid's
    ``--target ort`` export ``hybrid`` (its attention layer reads a longer KV cache each token; exported
    here when ``args.targets`` has no ort) and the same model with linear layers only (a fixed-size state:
    flat in position)."""
    if not hybrid.exists():
        export_with_attnx(work / "text", hybrid, "ort")
    linear_only = work / "linear-only"
    speed_text_model(linear_only / "text", layer_types=["linear_attention"] * SPEED_TEXT["num_hidden_layers"])
    export_with_attnx(linear_only / "text", linear_only / "attnx", "ort")
    return [
        (f"attnx-ort attnx-generate ({name})", position, attnx_generate_speed, (out, position, args.steps))
        for name, out in (("hybrid", hybrid), ("linear layers only", linear_only / "attnx"))
        for position in args.positions
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(hf_hybrid.RECIPES))
    parser.add_argument("--lengths", default="7,37,65,130")
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--skip", default="", help="comma list of: builder, transformers")
    parser.add_argument("--speed", action="store_true", help="the speed run instead (width 512)")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--targets", default="ort,portable", help="attnx export targets of the speed run")
    parser.add_argument("--fuse", default="ort", help="targets whose export is also measured after --fuse")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of speed measurements")
    parser.add_argument("--positions", default="256,1024,4096", help="contexts of the per-position rows")
    args = parser.parse_args()
    args.lengths = [int(n) for n in args.lengths.split(",")]
    args.positions = [int(n) for n in args.positions.split(",")]
    skip = set(args.skip.split(","))
    torch.set_num_threads(2)
    import transformers

    hf_hybrid.pure_torch_gated_delta()  # HF's CPU path, also where flash-linear-attention is installed

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        if args.speed:
            for row in speed(args, work):
                print(json.dumps(row), flush=True)
            return
        for arch in args.archs.split(","):
            directory = hf_hybrid.make(arch)
            model = getattr(transformers, hf_hybrid.RECIPES[arch]["class"]).from_pretrained(directory).eval()
            tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
            if arch in BUILDER_CHECKPOINTS and "builder" not in skip:
                rows += genai_builder(arch, directory, model, tokenizer, work, args)
                if arch != "qwen3_5":  # attnx's own Qwen3.5 figures: the tests and the speed run
                    rows += attnx_beside_the_builder(arch, directory, model, tokenizer, work, args)
            if "transformers" not in skip:
                rows += transformers_exporter(arch, model, args)
            for row in rows:
                print(json.dumps(row), flush=True)
            rows.clear()


if __name__ == "__main__":
    main()
