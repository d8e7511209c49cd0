"""Text in, text out: --tokenizer ships a tokenizer.json, generate --prompt encodes and decodes."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

import attnx
from attnx.exporter.directory import ExportDir
from tests.helpers import assert_one_line_error, run_cli
from tests.serve.conftest import word_tokenizer


def test_generate_round_trips_text(serve_export, tokenizer_file):
    from tokenizers import Tokenizer

    out = serve_export("linear")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    prompt = "the cat sat on"
    code, stdout, stderr = run_cli(["generate", str(out), "--prompt", prompt, "-n", "6", "--json", "-q"])
    assert code == 0, stderr
    result = json.loads(stdout)
    ids = tokenizer.encode(prompt).ids
    assert result["prompt"] == ids and result["tokens"] == attnx.generate(out, ids, 6).tokens
    assert result["text"] == tokenizer.decode(result["tokens"])
    code, stdout, _ = run_cli(["generate", str(out), "--prompt", prompt, "-n", "6", "-q"])
    assert stdout.splitlines()[0] == result["text"]


def test_the_export_carries_the_tokenizer(serve_export, tokenizer_file):
    out = serve_export("softmax")
    assert (out / "tokenizer.json").read_bytes() == tokenizer_file.read_bytes()
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "</s>"
    section = json.loads((out / "attnx.json").read_text())["tokenizer"]
    assert section == {"vocab_size": 15, "bos_token_id": None, "eos_token_id": 1, "pad_token_id": None}


def test_a_file_that_is_not_a_tokenizer(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"hello": "world"}')
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--recipe", "tiny-lm", "--tokenizer", str(bad), "-o", str(out)])
    assert_one_line_error(code, stderr, "is not a Hugging Face tokenizer.json")
    assert not out.exists()


def test_a_tokenizer_larger_than_the_vocabulary(tmp_path):
    pytest.importorskip("tokenizers")
    big = word_tokenizer(tmp_path / "tokenizer.json")  # 15 tokens
    out = tmp_path / "out"
    args = [
        "export",
        "--recipe",
        "tiny-lm",
        "--set",
        "vocab_size=10",
        "--tokenizer",
        str(big),
        "-o",
        str(out),
    ]
    code, _, stderr = run_cli(args)
    assert_one_line_error(code, stderr, "outside the vocabulary", "vocab_size=15")
    assert not out.exists()


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--prompt", ""], ["encodes to no tokens"]),
        (["--prompt", "   "], ["encodes to no tokens"]),
        (["--prompt-ids", "3,50"], ["id 50 is out of range", "0..49"]),
        (
            ["--prompt", "the", "--prompt-ids", "3"],
            ["exactly one of --prompt-ids, --prompt-file or --prompt"],
        ),
    ],
)
def test_bad_prompts(serve_export, args, fragments):
    code, _, stderr = run_cli(["generate", str(serve_export("linear")), *args])
    assert_one_line_error(code, stderr, *fragments)


def test_prompt_text_needs_a_tokenizer(serve_export, tmp_path):
    copy = tmp_path / "ids-only"
    shutil.copytree(serve_export("linear"), copy)
    export = ExportDir.open(copy)
    files = {k: v for k, v in export.manifest.files.items() if not k.startswith("tokenizer")}
    export.write_manifest(dataclasses.replace(export.manifest, files=files, tokenizer=None))
    code, _, stderr = run_cli(["generate", str(copy), "--prompt", "the cat"])
    assert_one_line_error(code, stderr, "has no tokenizer", "--prompt-ids")
