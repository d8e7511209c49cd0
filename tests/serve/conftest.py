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
