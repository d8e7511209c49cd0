"""The rest of the hostile tour: user code under --module, numbers no one means, manifests describing
models that cannot fit, wrong types through the Python API, pickled Hugging Face weights, SIGTERM."""

from __future__ import annotations

import signal
import sys
import textwrap

import pytest

import attnx
from attnx.errors import AttnxError
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli
from tests.security.conftest import MARKER, RunsCode, edit_manifest

TINY_SET = tuple(arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}"))

# --- user code under --module ----------------------------------------------------------------------

FACTORIES = {
    "raises": (
        """
        def helper():
            raise ValueError("no weights for layer 3")

        def make():
            return helper()
        """,
        [
            "your factory f.py:make raised ValueError: no weights for layer 3",
            "f.py:3 in helper",
            "called from",
            "f.py:6 in make",
        ],
    ),
    "exits": ("import sys\ndef make():\n    sys.exit(5)\n", ["raised SystemExit: 5", "f.py:3 in make"]),
    "syntax": ("def make(:\n    pass\n", ["importing 'f.py' for --module raised SyntaxError", "line 1"]),
    "raises-on-import": (
        "import json\njson.loads('{')\ndef make():\n    pass\n",
        ["importing 'f.py' for --module raised JSONDecodeError", "f.py:2 in <module>"],
    ),
    "not-a-module": (
        "def make():\n    return [1, 2], {}\n",
        ["f.py:make() returned a list where a torch.nn.Module"],
    ),
    "missing-import": (
        "def make():\n    import flash_attn_9000\n",
        ["your factory f.py:make raised ModuleNotFoundError: No module named 'flash_attn_9000'"],
    ),
}


@pytest.mark.parametrize(("code", "fragments"), FACTORIES.values(), ids=list(FACTORIES))
def test_user_code_that_fails_is_one_line_with_its_own_frames(code, fragments, workdir):
    (workdir / "f.py").write_text(textwrap.dedent(code))
    status, _, stderr = run_cli(["export", "--module", "f.py:make", "-o", "out"])
    assert_one_line_error(status, stderr, *fragments)
    line = stderr.strip().splitlines()[-1]
    assert "attnx/" not in line and "importlib" not in line and "<frozen" not in line
    assert not (workdir / "out").exists()


# --- numbers no one means --------------------------------------------------------------------------

BIG = str(2**63)
BOUNDS = [
    (["generate", "e", "--prompt-ids", "1", "-n", BIG], "'--max-new-tokens' / '-n'"),
    (["generate", "e", "--prompt-ids", "1", "--threads", str(10**6)], "'--threads'"),
    (["bench", "e", "--threads", str(10**6)], "'--threads'"),
    (["optimize", "e", "-o", "o", "--slim", "--seed", "-1"], "'--seed'"),
    (["verify", "e", "--seed", BIG], "'--seed'"),
    (["triton", "e", "--repo", "r", "--max-batch", str(10**9)], "'--max-batch'"),
    (["triton", "e", "--repo", "r", "--max-batch", "-1"], "'--max-batch'"),
    (["triton", "e", "--repo", "r", "--instances", str(10**6)], "'--instances'"),
    (["triton", "e", "--repo", "r", "--instances", "0"], "'--instances'"),
    (["triton", "e", "--repo", "r", "--name", ""], "'' is not a model name"),
    (["triton", "e", "--repo", "r", "--name", "x" * 300], "is not a model name"),
    (["triton", "e", "--repo", "r", "--name", "lm\nx"], "'lm\\nx' is not a model name"),
    (["triton", "e", "--repo", "r", "--name", "../up"], "is not a model name"),
]


@pytest.mark.parametrize(("argv", "fragment"), BOUNDS, ids=[" ".join(a[:1] + a[-2:])[:40] for a, _ in BOUNDS])
def test_numbers_and_names_out_of_bounds_are_one_line(argv, fragment, copy, workdir):
    copy("lm")
    before = sorted(p.name for p in workdir.iterdir())
    code, _, stderr = run_cli(argv)
    assert_one_line_error(code, stderr, fragment)
    assert sorted(p.name for p in workdir.iterdir()) == before


@pytest.mark.parametrize("repo", ["/proc", "/proc/attnx-repo", "/sys/kernel"])
def test_a_repository_in_a_system_directory_is_one_line(repo, copy, workdir):
    copy("lm")
    code, _, stderr = run_cli(["triton", "e", "--repo", repo])
    assert_one_line_error(code, stderr, repo)


def test_the_python_api_bounds_them_too(made):
    with pytest.raises(AttnxError, match=r"--max-new-tokens must be an integer in 1\.\.1000000"):
        attnx.generate(made("lm"), [1], 2**63)
    with pytest.raises(AttnxError, match=r"--threads must be an integer in 1\.\.1024"):
        attnx.generate(made("lm"), [1], 2, threads=10**6)


# --- models that cannot fit ------------------------------------------------------------------------


@pytest.fixture
def four_gib(monkeypatch):
    """The memory available is 4 GiB, whatever this machine has."""
    from attnx import cost

    monkeypatch.setattr(cost, "_meminfo", lambda: 4 << 30)
    monkeypatch.setattr(cost, "_cgroup_headroom", lambda: None)
    monkeypatch.setattr(cost, "_address_space_headroom", lambda: None)


@pytest.mark.timeout(120)
def test_a_million_layers_are_refused_before_they_are_built(four_gib, workdir):
    code, _, stderr = run_cli(["export", "-o", "out", "--no-verify", "--set", "n_layers=1000000"])
    assert_one_line_error(code, stderr, "of memory, but 4.0 GiB is available", "n_layers")
    assert not (workdir / "out").exists()


def test_sizes_torch_cannot_describe_are_one_line(workdir):
    code, _, stderr = run_cli(
        ["export", "-o", "out", "--no-verify", "--set", f"d_model={2**62}", "--set", "n_heads=1"]
    )
    assert_one_line_error(code, stderr, "of memory, but", f"d_model={2**62}")


@pytest.mark.timeout(120)
def test_a_manifest_describing_a_million_layers_is_refused_before_building(copy, workdir):
    out = copy("lm")
    edit_manifest(out, lambda m: m["model_config"].__setitem__("n_layers", 10**6))
    code, _, stderr = run_cli(["verify", "e", "--no-write"])
    assert_one_line_error(code, stderr, "describes a model whose weights pass", "re-export")


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("seed", 2**64, "seed = 18446744073709551616 must be in 0.."),
        ("seed", -1, "seed = -1"),
        ("opset", 10**9, "opset = 1000000000"),
        ("tolerance", {"atol": float("nan"), "rtol": 0.0}, "tolerance.atol"),
    ],
)
def test_manifest_numbers_out_of_range_are_one_line(field, value, fragment, copy, workdir):
    out = copy("lm")
    edit_manifest(out, lambda m: m.__setitem__(field, value))
    code, _, stderr = run_cli(["verify", "e", "--no-write"])
    assert_one_line_error(code, stderr, fragment, "re-export")


def test_available_memory_counts_the_address_space_limit(monkeypatch):
    import resource

    from attnx import cost

    monkeypatch.setattr(resource, "getrlimit", lambda kind: (cost._address_space_size() + (1 << 30), -1))
    headroom = cost._address_space_headroom()
    assert headroom is not None and 0 < headroom <= 1 << 30


# --- the Python API given the wrong types ----------------------------------------------------------

WRONG_TYPES = [
    (
        lambda: attnx.export("softmax", "out", options=[("d_model", 8)]),
        "attnx.export: options must be a mapping",
    ),
    (lambda: attnx.export(["softmax"], "out"), "attnx.export: variant must be a str or None, not list"),
    (lambda: attnx.verify("e", backends="ort-cpu"), "attnx.verify: backends must be a list of str, not str"),
    (
        lambda: attnx.verify("e", seq_lens=[1.5]),
        "attnx.verify: seq_lens must be a list of int or None, not list holding float",
    ),
    (lambda: attnx.verify(3), "attnx.verify: out must be a str or Path, not int"),
    (lambda: attnx.generate("e", "1,2,3"), "attnx.generate: prompt_ids must be a list of int, not str"),
    (lambda: attnx.triton("e", "r", instances="2"), "attnx.triton: instances must be an int, not str"),
    (lambda: attnx.bench("e", batch=True), "attnx.bench: batch must be an int, not bool"),
    (lambda: attnx.verify("e", bogus=1), "attnx.verify: got an unexpected keyword argument 'bogus'"),
]


@pytest.mark.parametrize(
    ("call", "message"), WRONG_TYPES, ids=[m.split(":")[1][1:20] for _, m in WRONG_TYPES]
)
def test_wrong_types_are_a_type_error_naming_the_argument(call, message, workdir):
    with pytest.raises(TypeError, match=message) as raised:
        call()
    assert isinstance(raised.value, AttnxError)
    assert not (workdir / "out").exists()


# --- Hugging Face directories ----------------------------------------------------------------------


@pytest.fixture
def hf_dir(workdir):
    """A Reformer config.json with nothing else yet."""
    import json

    directory = workdir / "hf"
    directory.mkdir()
    config = {"model_type": "reformer", "architectures": ["ReformerModelWithLMHead"], "hash_seed": 0}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_pickled_hf_weights_are_refused_by_name_and_never_unpickled(hf_dir, workdir):
    import pickle

    (hf_dir / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": RunsCode()}))
    code, _, stderr = run_cli(["export", "--from", f"hf:{hf_dir}", "-o", "out"])
    assert_one_line_error(code, stderr, "pickled weights (pytorch_model.bin)", "safe_serialization=True")
    assert not (workdir / MARKER).exists() and not (workdir / "out").exists()


def test_corrupt_hf_safetensors_are_one_line(hf_dir, workdir):
    pytest.importorskip("transformers")
    (hf_dir / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{garbage")
    (hf_dir / "pytorch_model.bin").write_bytes(b"ignored: safetensors win")
    code, _, stderr = run_cli(["export", "--from", f"hf:{hf_dir}", "-o", "out"])
    assert_one_line_error(code, stderr, "model.safetensors is not a readable safetensors")
    assert not (workdir / "out").exists()


# --- SIGTERM ---------------------------------------------------------------------------------------


@pytest.mark.slow  # the same handler as Ctrl-C, which tests/cli/test_bad_input.py runs by default
def test_sigterm_during_an_export_is_like_ctrl_c_and_exits_143(tmp_path):
    from tests.cli.test_bad_input import snapshot, start_export

    (tmp_path / "keep.txt").write_text("mine")
    before = snapshot(tmp_path)
    child = start_export(tmp_path)
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert child.returncode == 143 and lines[-1] == "Terminated.", stderr
    assert "Traceback" not in stderr
    assert snapshot(tmp_path) == before  # no staging folder, no lock


@pytest.mark.skipif(sys.platform != "linux", reason="signals to a child process")
def test_sigterm_restores_the_previous_handler_after_the_cli(workdir):
    before = signal.getsignal(signal.SIGTERM)
    run_cli(["list", "--json"])
    assert signal.getsignal(signal.SIGTERM) is before
