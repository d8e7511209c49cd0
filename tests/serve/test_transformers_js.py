"""transformers.js decoders: transformers-js.onnx, driven the way transformers.js drives it, computes
Hugging Face's forward, and transformers.js itself (Node.js, when installed) generates what HF does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytest.importorskip("transformers")

from attnx.testing import hf_hybrid  # noqa: E402
from tests.helpers import assert_one_line_error, run_cli  # noqa: E402


# transformers.js 4.3's state names per model_type (configs.js getCacheNames), written out here
# independently of attnx.serve.transformers_js: layer -> input names
def _kv(i: int) -> list[str]:
    return [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]


def _ssm(i: int, kind: str) -> list[str]:
    """Granite 4.0-H / Nemotron-H: Mamba2 layers and attention layers, MLP/MoE layers without state."""
    return {"linear_attention": [f"past_conv.{i}", f"past_ssm.{i}"], "full_attention": _kv(i)}.get(kind, [])


EXPECTED = {
    "qwen3_next": lambda i, kind: (
        _kv(i) if kind == "full_attention" else [f"past_conv.{i}", f"past_recurrent.{i}"]
    ),
    "lfm2": lambda i, kind: _kv(i) if kind == "full_attention" else [f"past_conv.{i}"],
    "lfm2_moe": lambda i, kind: _kv(i) if kind == "full_attention" else [f"past_conv.{i}"],
    # OLMo Hybrid: the conv state of a Gated DeltaNet layer split into its q, k and v channels
    "olmo_hybrid": lambda i, kind: (
        _kv(i)
        if kind == "full_attention"
        else [f"past_conv.{i}.key", f"past_conv.{i}.value", f"past_conv.{i}.query", f"past_recurrent.{i}"]
    ),
    "granitemoehybrid": _ssm,
    "nemotron_h": _ssm,
    # every layer runs attention and a Mamba2 mixer side by side ("hybrid")
    "falcon_h1": lambda i, kind: [*_kv(i), f"past_conv.{i}", f"past_ssm.{i}"],
}
ARCHS = list(EXPECTED)  # slow: the default run lays out a hybrid's decode graph (tests/serve/test_hybrid.py)
STEPS = 6


def export(source: Path, out: Path, *flags: str) -> Path:
    code, stdout, stderr = run_cli(
        [
            "export",
            "--from",
            f"hf:{source}",
            "--decode",
            "--state-names",
            "transformers.js",
            "-o",
            str(out),
            *flags,
        ]
    )
    assert code == 0, stderr
    assert "transformers-js.onnx + config.json" in stdout
    return out


def past_name(present: str) -> str:
    """transformers.js's getPastKeyValues: the input an output is fed back as."""
    for kind in ("ssm", "conv", "recurrent"):
        present = present.replace(f"present_{kind}", f"past_{kind}")
    return present.replace("present", "past_key_values")


def empty_cache(session: ort.InferenceSession, names: set[str]) -> dict[str, np.ndarray]:
    """transformers.js's addPastKeyValues: zeros shaped by the input's metadata, ``batch_size`` 1, any
    other symbol 0."""
    return {
        spec.name: np.zeros(
            [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in spec.shape], np.float32
        )
        for spec in session.get_inputs()
        if spec.name in names
    }


def hf_model(arch: str, directory: Path):
    import transformers

    return getattr(transformers, hf_hybrid.RECIPES[arch]["class"]).from_pretrained(directory).eval()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_the_decoder_driven_as_transformers_js_computes_hf_forward(arch, tmp_path):
    import torch
    import transformers

    source = hf_hybrid.make(arch, steps=0)
    out = export(source, tmp_path / "out", "--no-verify")
    config = transformers.AutoConfig.from_pretrained(source)
    expected = {name for i, kind in enumerate(config.layer_types) for name in EXPECTED[arch](i, kind)}
    session = ort.InferenceSession(str(out / "transformers-js.onnx"))
    inputs = {spec.name for spec in session.get_inputs()}
    assert inputs - {"input_ids", "position_ids"} == expected

    ids = np.random.default_rng(3).integers(1, config.vocab_size, (1, 11 + STEPS))
    with torch.no_grad():
        full = hf_model(arch, source)(torch.from_numpy(ids)).logits.numpy()
    cache, start = empty_cache(session, expected), 0
    for stop in [11, *range(12, ids.shape[1] + 1)]:
        positions = np.arange(start, stop)[None]
        outputs = dict(
            zip(
                [o.name for o in session.get_outputs()],
                session.run(None, {"input_ids": ids[:, start:stop], "position_ids": positions, **cache}),
                strict=True,
            )
        )
        np.testing.assert_allclose(outputs["logits"], full[:, start:stop], rtol=1e-4, atol=1e-4)
        cache = {past_name(name): value for name, value in outputs.items() if name.startswith("present")}
        assert set(cache) == expected
        start = stop


@pytest.mark.slow
def test_olmo_hybrids_conv_parts_are_its_query_key_and_value_channels(tmp_path):
    """After a prompt, past_conv.<i>.query/key/value hold the last kernel - 1 inputs of HF's conv over the
    q, k and v projections (HF's own conv state, its channels in the order of cat(q, k, v))."""
    import torch
    import transformers

    source = hf_hybrid.make("olmo_hybrid", steps=0)
    out = export(source, tmp_path / "out", "--no-verify")
    config = transformers.AutoConfig.from_pretrained(source)
    keys = config.linear_num_key_heads * config.linear_key_head_dim
    channels = {"query": slice(0, keys), "key": slice(keys, 2 * keys), "value": slice(2 * keys, None)}
    session = ort.InferenceSession(str(out / "transformers-js.onnx"))
    expected = {
        name for i, kind in enumerate(config.layer_types) for name in EXPECTED["olmo_hybrid"](i, kind)
    }
    ids = np.random.default_rng(4).integers(1, config.vocab_size, (1, 9))
    feeds = {"input_ids": ids, "position_ids": np.arange(9)[None], **empty_cache(session, expected)}
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    with torch.no_grad():
        cache = hf_model("olmo_hybrid", source)(torch.from_numpy(ids), use_cache=True).past_key_values
    layers = [i for i, kind in enumerate(config.layer_types) if kind == "linear_attention"]
    for i in layers:
        hf = cache.get_conv_state(i).numpy()  # (batch, channels, kernel): the last kernel inputs
        for part, where in channels.items():
            got = outputs[f"present_conv.{i}.{part}"]
            np.testing.assert_allclose(got, hf[:, where, -got.shape[-1] :], rtol=1e-5, atol=1e-6)


def test_an_export_that_is_not_a_hugging_face_model_is_refused(tmp_path):
    code, _, stderr = run_cli(
        [
            "export",
            "--recipe",
            "tiny-lm",
            "--decode",
            "--state-names",
            "transformers.js",
            "-o",
            str(tmp_path / "o"),
        ]
    )
    assert_one_line_error(code, stderr, "--state-names transformers.js", "Hugging Face models", "genai")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("arch", ["kimi_linear", pytest.param("qwen3_5", marks=pytest.mark.slow)])
def test_a_model_type_transformers_js_does_not_run_is_refused(arch, tmp_path):
    source = hf_hybrid.make(arch, steps=0)
    code, _, stderr = run_cli(
        [
            "export",
            "--from",
            f"hf:{source}",
            "--decode",
            "--state-names",
            "transformers.js",
            "-o",
            str(tmp_path / "o"),
        ]
    )
    model_type = json.loads((source / "config.json").read_text())["model_type"]
    assert_one_line_error(code, stderr, f"model_type '{model_type}'", "--state-names genai")
    assert not (tmp_path / "o").exists()


def transformers_js() -> str:
    """The directory where transformers.js is installed (``$ATTNX_TRANSFORMERS_JS``), or skip."""
    where = os.environ.get("ATTNX_TRANSFORMERS_JS")
    if not where or not (Path(where) / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.skip(
            "transformers.js is not installed: run `npm install --ignore-scripts "
            "@huggingface/transformers@4.3.2` in a directory and set ATTNX_TRANSFORMERS_JS to it"
        )
    if shutil.which("node") is None:
        pytest.skip("Node.js (node) is not on PATH")
    return where


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_js_generates_what_hf_generates(arch, tmp_path):
    """transformers.js's own generate on the export, greedy for 60 tokens, equals HF's generate."""
    import torch

    where = transformers_js()
    source = hf_hybrid.make(arch)
    out = export(source, tmp_path / "out", "--no-verify")
    prompt = hf_hybrid.train_tokenizer()(hf_hybrid.PROMPT).input_ids
    expected, _ = hf_hybrid.hf_greedy(hf_model(arch, source), torch.tensor([prompt]), 60)
    script = Path(__file__).with_name("transformers_js_generate.cjs")
    run = subprocess.run(
        ["node", str(script), str(out), ",".join(map(str, prompt)), "60"],
        capture_output=True,
        text=True,
        env={**os.environ, "ATTNX_TRANSFORMERS_JS": where},
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == expected


@pytest.mark.slow
def test_optimize_lays_the_decoder_out_again_and_checks_it(tmp_path):
    source = hf_hybrid.make("lfm2", steps=0)
    out = export(source, tmp_path / "out", "--no-verify", "--state-names", "genai")
    code, _, stderr = run_cli(["optimize", str(out), "-o", str(tmp_path / "opt"), "--fuse"])
    assert code == 0, stderr
    parity = json.loads((tmp_path / "opt" / "parity.json").read_text())
    statuses = {b["backend"]: b["status"] for b in parity["backends"]}
    assert statuses["ort-cpu transformers.js"] == statuses["ort-cpu genai"] == "passed"


@pytest.mark.parametrize(
    "make, key",
    [
        (
            lambda t: t.GraniteMoeHybridConfig(
                num_hidden_layers=2, layer_types=["linear_attention", "full_attention"]
            ),
            "layer_types",
        ),
        (
            lambda t: t.NemotronHConfig(layers_block_type=["linear_attention", "mlp", "full_attention"]),
            "layers_block_type",
        ),
    ],
)
def test_the_config_written_spells_layer_types_as_transformers_js_reads_them(make, key):
    import transformers

    from attnx.serve.transformers_js import js_config

    config = make(transformers)
    written = json.loads(js_config(config))[key]
    assert written == [
        {"linear_attention": "mamba", "full_attention": "attention"}.get(k, k) for k in config.layer_types
    ]
    assert "mamba" in written and "attention" in written
