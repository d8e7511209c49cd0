"""Tiny decode exports with a tokenizer the tests build themselves (one per variant, made on first use)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import run_cli

SENTENCES = ["the cat sat on the mat", "a dog ran to the park", "the end of the story"]


def word_tokenizer(path: Path, special: tuple[str, ...] = ("[UNK]", "</s>")) -> Path:
    """A word-level tokenizer.json trained on :data:`SENTENCES` (ids 0.. for ``special`` first)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=list(special)))
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory) -> Path:
    pytest.importorskip("tokenizers")
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


@pytest.fixture(scope="session")
def serve_export(tmp_path_factory, tokenizer_file) -> Callable[[str], Path]:
    """``serve_export(variant)`` -> OUT of ``attnx export --recipe tiny-lm --variant V --decode
    --tokenizer T`` with two layers (not verified: the decode tests verify decode exports)."""
    made: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in made:
            out = tmp_path_factory.mktemp(f"serve-{variant}") / "out"
            args = ["export", "--recipe", "tiny-lm", "--variant", variant, "--decode", "--no-verify"]
            args += ["--tokenizer", str(tokenizer_file), "--set", "n_layers=2", "--seed", "3", "-o", str(out)]
            code, _, stderr = run_cli(args)
            assert code == 0, stderr
            made[variant] = out
        return made[variant]

    return get


@pytest.fixture(scope="session")
def encoder_export(tmp_path_factory) -> Path:
    """OUT of ``attnx export --recipe tiny-encoder`` (input_ids and attention_mask; not verified)."""
    out = tmp_path_factory.mktemp("serve-encoder") / "out"
    code, _, stderr = run_cli(
        ["export", "--recipe", "tiny-encoder", "--no-verify", "--seed", "3", "-o", str(out)]
    )
    assert code == 0, stderr
    return out


@pytest.fixture(scope="session")
def python_repositories(triton_build, triton_cache, serve_export, encoder_export, tmp_path_factory):
    """``attnx triton --backend python`` models, by name, all written into one repository (its path):
    "encoder" (dynamic batching), "kv" (softmax decode: KV cache) and "rnn" (linear decode: recurrent
    sums)."""
    root = tmp_path_factory.mktemp("python-repositories") / "models"
    exports = {"encoder": encoder_export, "kv": serve_export("softmax"), "rnn": serve_export("linear")}
    for name, out in exports.items():
        args = ["triton", str(out), "--repo", str(root), "--backend", "python", "--name", name, "-q"]
        code, _, stderr = run_cli([*args, "--env-cache", str(triton_cache / "python-env")])
        assert code == 0, stderr
    return dict.fromkeys(exports, root)


@pytest.fixture(scope="session")
def triton_server(triton_build, python_repositories, tmp_path_factory):
    """One tritonserver for the session, serving the repository of :func:`python_repositories`;
    stopped at the end of the session, whatever happened."""
    from tests.serve.tritonserver import running

    log = tmp_path_factory.mktemp("tritonserver") / "server.log"
    with running(triton_build, sorted(set(python_repositories.values())), log) as server:
        yield server
