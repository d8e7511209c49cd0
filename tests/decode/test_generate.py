"""``attnx generate`` and ``attnx.generate``: seeded, backend-independent, one-line errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import attnx
from attnx.decode.generate import Sampler, generate
from attnx.decode.runtime import open_stepper
from attnx.exporter.directory import ExportDir
from tests.decode.conftest import DECODERS
from tests.helpers import assert_one_line_error, run_cli
from tests.models.cases import one_per_kind


def test_public_api_is_lazy_and_points_here():
    assert attnx.generate is generate


@pytest.mark.parametrize("variant", one_per_kind(DECODERS))  # every decoder under -m slow
def test_greedy_ids_are_the_same_on_torch_and_ort_and_follow_the_full_forward(decode_export, variant):
    out, _ = decode_export(variant)
    ort_run = generate(out, [3, 1, 4, 1, 5], 12, backend="ort-cpu")
    torch_run = generate(out, [3, 1, 4, 1, 5], 12, backend="torch")
    assert ort_run.tokens == torch_run.tokens and len(ort_run.tokens) == 12
    module = ExportDir.open(out).rebuild().module
    ids = ort_run.prompt + ort_run.tokens
    with torch.inference_mode():
        logits = module(torch.tensor([ids]))[0][0]
    assert logits[len(ort_run.prompt) - 1 : -1].argmax(-1).tolist() == ort_run.tokens


def test_decode_steps_run_in_a_session_that_does_not_spin(decode_export):
    """A decode step is many small ops: its ONNX Runtime threads sleep between them (the prefill's spin)."""
    key = "session.intra_op.allow_spinning"
    out, _ = decode_export("linear")
    with open_stepper(ExportDir.open(out), threads=2) as stepper:
        options = {graph: runner.sess.get_session_options() for graph, runner in stepper.runners.items()}
    assert options["decode"].get_session_config_entry(key) == "0"
    with pytest.raises(Exception, match="does not have configuration"):  # ORT's default: spin
        options["prefill"].get_session_config_entry(key)


def test_generate_holds_one_session_at_a_time(decode_export, monkeypatch):
    """The prefill graph's session is let go before the decode graph's is made (a real-size model's weights
    once in memory, not twice)."""
    from attnx.decode.runtime import Stepper

    active: list[tuple[bool, bool]] = []
    decode = Stepper.decode

    def spy(stepper, input_ids, state):
        active.append((stepper.runners["prefill"].is_active, stepper.runners["decode"].is_active))
        return decode(stepper, input_ids, state)

    monkeypatch.setattr(Stepper, "decode", spy)
    out, _ = decode_export("linear")
    assert len(generate(out, [3, 1], 5).tokens) == 5
    assert active == [(False, True)] * 4


def test_sampling_is_reproducible_with_a_seed(decode_export):
    out, _ = decode_export("linear")
    runs = [generate(out, [7], 24, temperature=1.5, top_k=20, seed=seed) for seed in (5, 5, 6)]
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].tokens != runs[2].tokens
    torch_run = generate(out, [7], 24, temperature=1.5, top_k=20, seed=5, backend="torch")
    assert torch_run.tokens == runs[0].tokens


def test_sampler_draws_from_the_top_k_softmax():
    logits = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15]))
    rng = np.random.default_rng(0)
    draws = [Sampler(1.0, 2).pick(logits, rng) for _ in range(2000)]
    counts = np.bincount(draws, minlength=5) / len(draws)
    assert set(draws) == {1, 3}
    np.testing.assert_allclose(counts[[1, 3]], [0.4 / 0.7, 0.3 / 0.7], atol=0.04)
    cold = [Sampler(0.05).pick(logits, rng) for _ in range(50)]
    assert set(cold) == {1}
    assert Sampler().pick(logits, rng) == 1


def test_cli_prints_ids_and_speed(decode_export, tmp_path):
    out, _ = decode_export("cosformer")
    code, stdout, stderr = run_cli(["generate", str(out), "--prompt-ids", "1,2,3", "--max-new-tokens", "9"])
    assert code == 0, stderr
    ids_line, speed_line = stdout.strip().splitlines()
    assert len(ids_line.split(",")) == 9 and all(0 <= int(i) < 50 for i in ids_line.split(","))
    assert "tokens/s" in speed_line and "ms/token" in speed_line
    assert "prefill" in stderr  # progress goes to stderr
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("1, 2\n3\n")
    code, stdout, _ = run_cli(["generate", str(out), "--prompt-file", str(prompt), "-n", "9", "--json"])
    data = json.loads(stdout)
    assert code == 0 and data["prompt"] == [1, 2, 3] and ",".join(map(str, data["tokens"])) == ids_line


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--prompt-ids", "1,x,3"], ["integer token ids", "'x'"]),
        (["--prompt-ids", "1,2.5"], ["integer token ids"]),
        (["--prompt-ids", "1,50"], ["prompt id 50 is out of range", "0..49"]),
        (["--prompt-ids", "-1"], ["prompt id -1 is out of range"]),
        (["--prompt-ids", " , "], ["the prompt is empty"]),
        ([], ["exactly one of --prompt-ids, --prompt-file or --prompt"]),
        (["--prompt-ids", "1", "--max-new-tokens", "0"], ["'--max-new-tokens'", "1<=x<=1000000"]),
        (["--prompt-ids", "1", "--temperature", "0"], ["--temperature must be > 0"]),
        (["--prompt-ids", "1", "--greedy", "--temperature", "0.7"], ["--greedy"]),
        (["--prompt-ids", "1", "--prompt-file", "nowhere.txt"], ["exactly one of"]),
        (["--prompt-file", "nowhere.txt"], ["prompt file 'nowhere.txt' does not exist"]),
        (["--prompt-ids", "1", "--backend", "trt"], ["backend trt does not run decode graphs", "ort-cpu"]),
        (["--prompt-ids", "1", "--backend", "ort"], ["unknown backend 'ort'", "ort-cpu"]),
        (["--prompt-ids", "1", "--threads", "-1"], ["'--threads'", "1<=x<=1024"]),
    ],
)
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(decode_export, args, fragments):
    out, _ = decode_export("linear")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    code, _, stderr = run_cli(["generate", str(out), *args])
    assert_one_line_error(code, stderr, *fragments)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before


def test_generation_stays_within_the_variants_position_limit(decode_export):
    """A causal cosFormer has one fixed M (its context length, 2048 unless set): generate refuses more."""
    out, _ = decode_export("cosformer")
    code, _, stderr = run_cli(["generate", str(out), "--prompt-ids", "1,2", "-n", "2047"])
    assert_one_line_error(
        code, stderr, "need 2049 positions", "handles 2048 (max_len=2048)", "--set max_len=N"
    )
    assert len(generate(out, [1, 2], 5).tokens) == 5


def test_cli_refuses_an_export_without_decode_graphs(decode_export, tmp_path):
    out, _ = decode_export("linear")
    plain = shutil.copytree(out, tmp_path / "plain")
    data = json.loads((plain / "attnx.json").read_text())
    data.pop("decode")
    for key in ("prefill", "decode"):
        (plain / data["files"].pop(key)["path"]).unlink()
    (plain / "attnx.json").write_text(json.dumps(data))
    code, _, stderr = run_cli(["generate", str(plain), "--prompt-ids", "1"])
    assert_one_line_error(code, stderr, "has no decode export", "--decode")
    code, _, stderr = run_cli(["generate", str(tmp_path / "missing"), "--prompt-ids", "1"])
    assert_one_line_error(code, stderr, "is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]


def test_seq2seq_generation_needs_a_source(decode_export):
    out, _ = decode_export("cosformer", "seq2seq")
    code, stdout, stderr = run_cli(
        ["generate", str(out), "--source-ids", "4,8,15,16", "--prompt-ids", "0", "-n", "6"]
    )
    assert code == 0, stderr
    ids = [int(i) for i in stdout.splitlines()[0].split(",")]
    assert generate(out, [0], 6, source_ids=[4, 8, 15, 16], backend="torch").tokens == ids
    code, _, stderr = run_cli(["generate", str(out), "--prompt-ids", "0"])
    assert_one_line_error(code, stderr, "give it with --source-ids")
    code, _, stderr = run_cli(["generate", str(out), "--prompt-ids", "0", "--source-ids", "1,99"])
    assert_one_line_error(code, stderr, "source id 99 is out of range")
    lm, _ = decode_export("linear")
    code, _, stderr = run_cli(["generate", str(lm), "--prompt-ids", "0", "--source-ids", "1"])
    assert_one_line_error(code, stderr, "--source-ids is for seq2seq exports")
