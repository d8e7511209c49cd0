"""attnx triton: config.pbtxt parses with tritonclient's protobuf, matches the ONNX graph, and a
simulated sequence batcher generates what attnx generate does."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnx
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.serve.triton import State, check_state_names
from tests.helpers import assert_one_line_error, run_cli
from tests.serve.triton_sim import NUMPY, SequenceBatcher, dtype_name, parse_config

pytest.importorskip("tritonclient.grpc")


def graph_values(path):
    graph = onnx.load(str(path), load_external_data=False).graph

    def describe(values):
        return {
            v.name: (
                onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type),
                [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
            )
            for v in values
        }

    return describe(graph.input), describe(graph.output)


def assert_matches(entry, graph, batched: bool):
    """A config input/output/state declares the graph tensor's dtype and a shape it accepts."""
    dtype, dims = graph
    assert np.dtype(NUMPY[dtype_name(entry.data_type)]) == dtype, entry.name
    dims = dims[1:] if batched else dims
    assert len(entry.dims) == len(dims), (entry, dims)
    for declared, actual in zip(entry.dims, dims, strict=True):
        assert declared == actual if isinstance(actual, int) else declared in (-1, 1), (entry, dims)


def repository(tmp_path, out, *args):
    repo = tmp_path / "repo"
    code, stdout, stderr = run_cli(["triton", str(out), "--repo", str(repo), "--json", *args])
    assert code == 0, stderr
    return repo, json.loads(stdout)


@pytest.mark.parametrize(
    "variant", ["softmax", "linear", pytest.param("gated_delta", marks=pytest.mark.slow)]
)
def test_sequence_config_declares_the_graph(serve_export, variant, tmp_path):
    repo, result = repository(tmp_path, serve_export(variant))
    config = parse_config(repo / "lm")
    assert result["batching"] == "sequence" and config.max_batch_size == 0
    assert config.backend == "onnxruntime" and not config.HasField("dynamic_batching")
    inputs, outputs = graph_values(repo / "lm" / "1" / "model.onnx")
    states = config.sequence_batching.state
    for entry in config.input:
        assert_matches(entry, inputs[entry.name], batched=False)
    for entry in config.output:
        assert_matches(entry, outputs[entry.name], batched=False)
    for state in states:
        assert_matches(state, inputs[state.input_name], batched=False)
        assert_matches(state, outputs[state.output_name], batched=False)
        assert state.initial_state[0].zero_data and -1 not in state.initial_state[0].dims
        assert list(state.initial_state[0].dims) == [1 if d == -1 else d for d in state.dims]
    assert {e.name for e in config.input} | {s.input_name for s in states} == set(inputs)
    manifest = ExportDir.open(serve_export(variant)).manifest
    assert [s.input_name for s in states] == [p.input for p in manifest.decode.state]  # length included
    recurrent = [s for s in states if s.input_name.startswith("past.")]
    # fixed-size float32 states; gated_delta: a conv carry and a recurrent S per layer
    if variant != "softmax":
        assert {dtype_name(s.data_type) for s in recurrent} == {"TYPE_FP32"} and all(
            -1 not in s.dims for s in recurrent
        )
    if variant == "gated_delta":
        assert [s.input_name for s in recurrent] == [
            f"past.{i}.{name}" for i in range(2) for name in ("conv", "recurrent")
        ]
    assert (repo / "lm" / "tokenizer.json").is_file() and "tritonserver" in (
        repo / "lm" / "README.md"
    ).read_text()


@pytest.mark.parametrize(
    "variant",
    [
        "softmax",
        "linear",
        *(pytest.param(v, marks=pytest.mark.slow) for v in ("cosformer", "gated_delta", "retention")),
    ],
)
def test_simulated_sequence_batcher_generates_what_attnx_generates(serve_export, variant, tmp_path):
    out = serve_export(variant)
    repo, _ = repository(tmp_path, out)
    for prompt in ([4], [3, 9, 4, 12, 5, 6, 2, 8, 11]):
        batcher = SequenceBatcher(repo / "lm")
        assert batcher.feeds == {s.output_name: s.input_name for s in batcher.config.sequence_batching.state}
        assert batcher.greedy(prompt, 10) == attnx.generate(out, prompt, 10).tokens


def test_simulated_sequence_batcher_logits_follow_the_full_forward(serve_export, tmp_path):
    """Forced tokens, every position: the Triton graph's logits equal model.onnx's full forward."""
    import onnxruntime as ort

    out = serve_export("softmax")
    repo, _ = repository(tmp_path, out)
    ids = np.random.default_rng(2).integers(0, 50, size=(1, 12))
    expected = ort.InferenceSession(str(out / "model.onnx")).run(["logits"], {"input_ids": ids})[0][0]
    batcher = SequenceBatcher(repo / "lm")
    got = [batcher.infer(ids[0, :5].tolist())[0]] + [batcher.infer([int(t)])[0] for t in ids[0, 5:]]
    np.testing.assert_allclose(np.concatenate(got), expected, atol=2e-5, rtol=1e-4)


def test_dynamic_batching_serves_model_onnx(serve_export, tmp_path):
    repo, result = repository(tmp_path, serve_export("softmax"), "--batching", "dynamic", "--name", "full")
    config = parse_config(repo / "full")
    assert result["max_batch_size"] == 8 and config.HasField("dynamic_batching")
    assert not config.HasField("sequence_batching")
    inputs, outputs = graph_values(repo / "full" / "1" / "model.onnx")
    assert [e.name for e in config.input] == list(inputs)
    for entry in config.input:
        assert_matches(entry, inputs[entry.name], batched=True)
    for entry in config.output:
        assert_matches(entry, outputs[entry.name], batched=True)
    repo0, _ = repository(
        tmp_path / "nobatch", serve_export("softmax"), "--batching", "dynamic", "--max-batch", "0"
    )
    config = parse_config(repo0 / "lm")
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, -1]


def test_force_replaces_only_a_model_attnx_wrote(serve_export, tmp_path):
    out = serve_export("linear")
    repo, _ = repository(tmp_path, out)
    code, _, stderr = run_cli(["triton", str(out), "--repo", str(repo), "--force", "--batching", "dynamic"])
    assert code == 0, stderr
    assert parse_config(repo / "lm").HasField("dynamic_batching")
    other = tmp_path / "mine"
    (other / "lm").mkdir(parents=True)
    (other / "lm" / "keep.txt").write_text("mine")
    code, _, stderr = run_cli(["triton", str(out), "--repo", str(other), "--force"])
    assert_one_line_error(code, stderr, "holds no attnx-triton.json, so it is not an earlier output")
    assert [p.name for p in (other / "lm").iterdir()] == ["keep.txt"]


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


def test_models_are_added_to_one_repository_and_replaced_one_at_a_time(
    serve_export, encoder_export, tmp_path
):
    """An encoder and a decoder in one repository (as one tritonserver serves them); an existing name
    is refused without --force, and --force rewrites that model's folder alone."""
    repo = tmp_path / "models"
    for out, name in ((encoder_export, "encoder"), (serve_export("linear"), "lm")):
        code, _, stderr = run_cli(["triton", str(out), "--repo", str(repo), "--name", name, "-q"])
        assert code == 0, stderr
    assert sorted(p.name for p in repo.iterdir()) == ["encoder", "lm"]
    encoder = snapshot(repo / "encoder")
    code, _, stderr = run_cli(["triton", str(serve_export("linear")), "--repo", str(repo), "--name", "lm"])
    assert_one_line_error(code, stderr, "already exists; pass --force")
    code, _, stderr = run_cli(
        ["triton", str(serve_export("linear")), "--repo", str(repo), "--name", "lm", "--force", "-q"]
        + ["--batching", "dynamic"]
    )
    assert code == 0, stderr
    assert snapshot(repo / "encoder") == encoder
    assert parse_config(repo / "lm").HasField("dynamic_batching")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    others=st.lists(
        st.tuples(st.sampled_from(["lm2", "enc", "notes", "lm.bak"]), st.binary(max_size=16)),
        max_size=4,
        unique_by=lambda pair: pair[0],
    ),
    forced=st.booleans(),
)
def test_writing_a_model_never_touches_what_else_the_repository_holds(serve_export, tmp_path, others, forced):
    from attnx.serve.triton import write_repository

    repo = Path(tempfile.mkdtemp(dir=tmp_path))
    for name, data in others:
        (repo / name).mkdir()
        (repo / name / "file.bin").write_bytes(data)
    before = snapshot(repo)
    write_repository(serve_export("linear"), repo, name="lm", batching="dynamic", force=forced)
    after = snapshot(repo)
    assert {k: v for k, v in after.items() if k != "lm" and not k.startswith("lm/")} == before


def test_state_names_that_triton_would_confuse_are_refused():
    with pytest.raises(AttnxError, match="prefix"):
        check_state_names(
            [State("a", "a_out", "float32", (1,)), State("a_len", "a_len_out", "float32", (1,))]
        )
    with pytest.raises(AttnxError, match="different orders"):
        check_state_names([State("x_a", "y_b", "float32", (1,)), State("x_b", "y_a", "float32", (1,))])
    check_state_names(
        [
            State("past.0.k_sum", "present.0.k_sum", "float32", (1,)),
            State("past.0.kv_sum", "present.0.kv_sum", "float32", (1,)),
        ]
    )


def without_decode(out, tmp_path):
    """A copy of ``out`` whose manifest lists no decode graphs (an export made without --decode)."""
    copy = tmp_path / "plain"
    shutil.copytree(out, copy)
    export = ExportDir.open(copy)
    files = {k: v for k, v in export.manifest.files.items() if k in ("model", "weights")}
    export.write_manifest(
        dataclasses.replace(export.manifest, files=files, decode=None, genai=None, tokenizer=None)
    )
    return copy


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--max-batch", "-1"], ["'--max-batch'", "0<=x<=65536"]),
        (["--max-batch", "4"], ["one sequence per call", "--instances"]),
        (["--instances", "0"], ["'--instances'", "1<=x<=256"]),
        (["--batching", "stream"], ["--batching must be one of"]),
        (["--name", "a/b"], ["'a/b' is not a model name"]),
    ],
)
def test_bad_settings_are_one_line_and_write_nothing(serve_export, tmp_path, args, fragments):
    repo = tmp_path / "repo"
    code, _, stderr = run_cli(["triton", str(serve_export("linear")), "--repo", str(repo), *args])
    assert_one_line_error(code, stderr, *fragments)
    assert not repo.exists()


def test_repository_over_an_existing_one_needs_force(serve_export, tmp_path):
    out = serve_export("linear")
    repo, _ = repository(tmp_path, out)
    before = sorted(p.name for p in repo.rglob("*"))
    code, _, stderr = run_cli(["triton", str(out), "--repo", str(repo)])
    assert_one_line_error(code, stderr, "already exists", "--force")
    assert sorted(p.name for p in repo.rglob("*")) == before


def test_sequence_batching_of_an_export_without_decode_graphs(serve_export, tmp_path):
    plain = without_decode(serve_export("linear"), tmp_path)
    code, _, stderr = run_cli(["triton", str(plain), "--repo", str(tmp_path / "r"), "--batching", "sequence"])
    assert_one_line_error(code, stderr, "sequence batching cannot serve", "--decode")
    assert not (tmp_path / "r").exists()
    repo, result = repository(tmp_path, plain)  # auto: dynamic
    assert result["batching"] == "dynamic"


def test_plugin_lowered_exports_are_refused(serve_export, tmp_path):
    copy = tmp_path / "plugin"
    shutil.copytree(serve_export("linear"), copy)
    export = ExportDir.open(copy)
    export.write_manifest(dataclasses.replace(export.manifest, lowering="plugin"))
    code, _, stderr = run_cli(["triton", str(copy), "--repo", str(tmp_path / "r")])
    assert_one_line_error(code, stderr, "plugin lowering", "--lowering function or decomposed")
