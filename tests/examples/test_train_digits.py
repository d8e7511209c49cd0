"""The training example's few-step version: the loss falls, it exports, ORT generates what torch does."""

from __future__ import annotations

import re

import pytest
import torch

from tests.examples.example import train_digits


@pytest.mark.slow  # trains; the shipped digits-lm it made is tested by default (test_digits_lm)
def test_quick_run_trains_exports_and_generates_the_same_tokens_in_torch_and_ort(tmp_path, capsys):
    example = train_digits()
    threads = torch.get_num_threads()
    try:  # one thread: on a busy 2-core machine, two threads' barriers make small ops ~10x slower
        assert example.main(["--quick", "--threads", "1", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    losses = [float(loss) for loss in re.findall(r"train (\d+\.\d+)", printed)]
    assert len(losses) >= 3 and losses[-1] < losses[0] - 1.0, printed  # from ~ln 27 towards the marginals
    assert "parity torch vs ONNX Runtime passed" in printed
    assert "torch and ONNX Runtime drew the same tokens" in printed
    assert (tmp_path / "digits-lm.safetensors").is_file()
    assert (tmp_path / "export" / "decode.onnx").is_file()
    assert (tmp_path / "digits-lm.toml").read_text() == example.RECIPE
