"""attnx triton --backend python without a server: model.py (run in-process on a stand-in for Triton's
backend module) decodes interleaved sequences as attnx generate does, keeps and frees their state, answers
bad requests one by one; the environment step and bad settings fail in one line."""

from __future__ import annotations

import ast
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import attnx
from attnx.exporter.directory import ExportDir
from attnx.serve import triton_model
from attnx.serve.triton import plan_model
from attnx.serve.triton_model import SequenceStore
from attnx.serve.triton_python import write_python_model
from tests.helpers import REPO, assert_one_line_error, run_cli
from tests.serve.python_backend import END, START, Request, install, load_model

pytest.importorskip("tritonclient.grpc")

_OWN_IMPORTS = {"__future__", "json", "time", "collections", "collections.abc", "pathlib", "typing"}


def python_model(out, tmp_path, batching="auto"):
    """REPO/<model> as `attnx triton --backend python` writes it, without the environment (not needed
    in-process)."""
    export = ExportDir.open(out)
    plan = plan_model(export, "m", batching, None, 1, backend="python")
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    write_python_model(export, plan.batching, model_dir / "1")
    (model_dir / "config.pbtxt").write_text(plan.config())
    return model_dir


def tokens(ids):
    return np.asarray([ids], dtype=np.int64)


def test_model_py_imports_only_numpy_onnxruntime_and_the_backend():
    """The environment holds numpy and onnxruntime only: model.py must not import attnx or anything else."""
    tree = ast.parse(Path(triton_model.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names - _OWN_IMPORTS == {"numpy", "onnxruntime", "triton_python_backend_utils"}


@pytest.mark.parametrize("variant", ["softmax", "linear"])
def test_interleaved_sequences_in_one_batch_generate_what_attnx_generates(
    serve_export, variant, tmp_path, monkeypatch
):
    install(monkeypatch)
    out = serve_export(variant)
    model = load_model(python_model(out, tmp_path))
    prompts = {"a": [3, 9, 4, 12, 5, 6, 2], "b": [4]}
    got = {key: [] for key in prompts}
    for step in range(8):
        keys = list(prompts) if step % 2 else list(reversed(prompts))  # both orders within one call
        requests = [
            Request(
                {"input_ids": tokens(prompts[k] if step == 0 else [got[k][-1]])},
                k,
                (START if step == 0 else 0) | (END if step == 7 else 0),
            )
            for k in keys
        ]
        for key, response in zip(keys, model.execute(requests), strict=True):
            got[key].append(int(response.output("logits")[0, -1].argmax()))
    for key, prompt in prompts.items():
        assert got[key] == attnx.generate(out, prompt, 8).tokens, key
    assert len(model.decoder.store) == 0  # freed at END


def test_forced_tokens_of_two_sequences_follow_the_full_forward(serve_export, tmp_path, monkeypatch):
    """Each sequence's logits at every position equal model.onnx's full forward of that sequence alone:
    a state given to the wrong sequence, or not carried, fails."""
    install(monkeypatch)
    out = serve_export("softmax")
    model = load_model(python_model(out, tmp_path))
    ids = np.random.default_rng(5).integers(0, 50, size=(2, 11))
    full = ort.InferenceSession(str(out / "model.onnx"))
    for key, prompt in ((7, 4), (8, 1)):  # sequence 7 starts with 4 tokens, sequence 8 with one
        model.execute([Request({"input_ids": tokens(ids[key - 7, :prompt])}, key, START)])
    logits = {7: [], 8: []}
    for position in range(4, 11):
        requests = [Request({"input_ids": tokens(ids[0, position : position + 1])}, 7)]
        requests += [Request({"input_ids": tokens(ids[1, position - 3 : position - 2])}, 8)]
        for key, response in zip((7, 8), model.execute(requests), strict=True):
            logits[key].append(response.output("logits")[0])
    for key, row, start in ((7, 0, 4), (8, 1, 1)):
        length = start + len(logits[key])
        expected = full.run(["logits"], {"input_ids": ids[row : row + 1, :length]})[0][0, start:]
        np.testing.assert_allclose(np.concatenate(logits[key]), expected, atol=2e-5, rtol=1e-4)


def test_bad_requests_fail_alone(serve_export, tmp_path, monkeypatch):
    install(monkeypatch)
    model = load_model(python_model(serve_export("linear"), tmp_path))
    replies = model.execute(
        [
            Request({"input_ids": tokens([1, 2])}, "s", START),
            Request({"input_ids": tokens([3])}, "never-started"),
            Request({"input_ids": tokens([3, 50])}, "t", START),
            Request({"input_ids": np.zeros((1, 0), dtype=np.int64)}, "u", START),
        ]
    )
    assert replies[0].error is None
    assert "sequence 'never-started' has no state" in replies[1].error.message()
    assert "ids outside 0..49" in replies[2].error.message()
    assert "is empty" in replies[3].error.message()
    assert list(model.decoder.store.states) == ["s"]
    (reply,) = model.execute([Request({"input_ids": tokens([4])}, "s", END)])
    assert reply.error is None and len(model.decoder.store) == 0
    (reply,) = model.execute([Request({"input_ids": tokens([4])}, "s")])
    assert "has no state" in reply.error.message()


def test_the_store_frees_idle_sequences_and_keeps_a_bound():
    now = [0.0]
    heard = []
    store = SequenceStore(limit=2, idle_seconds=10, notify=heard.append, clock=lambda: now[0])
    store.put("a", {"x": np.zeros(1)})
    now[0] = 5
    store.put("b", {"x": np.ones(1)})
    now[0] = 11
    store.expire()
    assert list(store.states) == ["b"] and "sequence 'a' was idle over 10 s" in heard[-1]
    store.put("c", {})
    store.put("b", {})  # used again: now the most recent
    store.put("d", {})
    assert list(store.states) == ["b", "d"] and "sequence 'c' is freed" in heard[-1]
    now[0] = 100
    store.expire()
    assert len(store) == 0


def test_the_model_reads_its_bounds_from_the_config(serve_export, tmp_path, monkeypatch):
    install(monkeypatch)
    model_dir = python_model(serve_export("linear"), tmp_path)
    config = model_dir / "config.pbtxt"
    text = config.read_text()
    assert "max_candidate_sequences: 16" in text and "max_sequence_idle_microseconds: 60000000" in text
    config.write_text(
        text.replace("max_candidate_sequences: 16", "max_candidate_sequences: 3").replace(
            "60000000", "2500000"
        )
    )
    store = load_model(model_dir).decoder.store
    assert (store.limit, store.idle_seconds) == (3, 2.5)


def test_the_encoder_answers_each_request_of_a_batch(encoder_export, tmp_path, monkeypatch):
    install(monkeypatch)
    model = load_model(python_model(encoder_export, tmp_path))
    rng = np.random.default_rng(1)
    feeds = []
    for batch, length in ((2, 7), (1, 13)):
        mask = np.ones((batch, length), dtype=bool)
        mask[0, length // 2 :] = False
        feeds.append({"input_ids": rng.integers(0, 50, size=(batch, length)), "attention_mask": mask})
    wrong = {
        "input_ids": feeds[0]["input_ids"].astype(np.float32),
        "attention_mask": feeds[0]["attention_mask"],
    }
    replies = model.execute([Request(feeds[0]), Request(wrong), Request(feeds[1])])
    session = ort.InferenceSession(str(encoder_export / "model.onnx"))
    for feed, reply in zip(feeds, (replies[0], replies[2]), strict=True):
        for name, expected in zip(["hidden_states", "logits"], session.run(None, feed), strict=True):
            np.testing.assert_allclose(reply.output(name), expected, atol=1e-5, rtol=1e-5)
    assert "Unexpected input data type" in replies[1].error.message()


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--backend", "tensorrt"], ["--backend must be one of onnxruntime, python"]),
        (["--env-cache", "somewhere"], ["--env-cache is for --backend python"]),
    ],
)
def test_bad_backend_settings_are_one_line(serve_export, tmp_path, args, fragments):
    repo = tmp_path / "repo"
    code, _, stderr = run_cli(["triton", str(serve_export("linear")), "--repo", str(repo), *args])
    assert_one_line_error(code, stderr, *fragments)
    assert not repo.exists()


def test_a_plugin_lowered_export_has_no_onnxruntime_path(serve_export, tmp_path):
    copy = tmp_path / "plugin"
    shutil.copytree(serve_export("linear"), copy)
    export = ExportDir.open(copy)
    export.write_manifest(dataclasses.replace(export.manifest, lowering="plugin"))
    code, _, stderr = run_cli(["triton", str(copy), "--repo", str(tmp_path / "r"), "--backend", "python"])
    assert_one_line_error(
        code, stderr, "plugin lowering", "python backend", "--lowering function or decomposed"
    )
    assert not (tmp_path / "r").exists()


def test_an_environment_that_cannot_be_built_is_one_line_and_resumes(serve_export, tmp_path, monkeypatch):
    """No package index: the build stops at pip in one line, writes no repository, and the next run
    continues the same environment."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no find-links from a pip.conf
    args = ["triton", str(serve_export("linear")), "--repo", str(tmp_path / "r"), "--backend", "python"]
    args += ["--env-cache", str(tmp_path / "envs")]
    code, _, stderr = run_cli(args)
    assert_one_line_error(code, stderr, "cannot build the python environment", "numpy<2", "package index")
    assert not (tmp_path / "r").exists()
    (folder,) = (tmp_path / "envs").glob("py*[!k]")  # the environment, not its .lock
    assert (folder / "bin" / "python").exists() and not (folder / "attnx-env.json").exists()
    code, _, stderr = run_cli(args)
    assert code == 2 and f"resuming the build in {folder}" in stderr


DISTUTILS_AFTER_THE_PIP_CHECK = """
import distutils.core
before = distutils.core.__file__
for name in [m for m in sys.modules if m == "distutils" or m.startswith("distutils.")]:
    del sys.modules[name]
from attnx.serve.pyenv import _has_pip
assert _has_pip()
import distutils.core
print(before, distutils.core.__file__)
"""


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 has no distutils of its own to fall to")
def test_the_pip_check_leaves_setuptools_distutils_shim_alone(tmp_path):
    """Why the check reads pip's metadata: finding pip's module switches setuptools' shim off for the
    process, and torch.compile (inductor imports distutils) then fails in it."""
    run = subprocess.run(
        [sys.executable, "-c", "import sys\n" + DISTUTILS_AFTER_THE_PIP_CHECK],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    before, after = run.stdout.split()
    if "setuptools" not in before:
        pytest.skip(f"this Python's distutils is not setuptools' shim ({before})")
    assert after == before
