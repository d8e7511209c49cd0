"""The stepper on ONNX Runtime binds a decode step's buffers (IO binding): the state stays ``OrtValue``s
between steps, only the logits come back as NumPy arrays (a prefill's state is NumPy, owning its memory),
and greedy decoding picks what a plain ``session.run`` loop with every state through NumPy (the path before
the binding) picks, and what the full forward recomputed over the whole sequence (no state at all) picks,
in a batch of 2."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from attnx.decode.generate import generate
from attnx.decode.runtime import open_stepper, state_bytes
from attnx.exporter.directory import ExportDir
from tests.decode.test_decode_export import full_forward, run, sessions

Step = Callable[[np.ndarray, dict], tuple[np.ndarray, dict]]


def greedy(
    prefill: Callable[[np.ndarray], tuple[np.ndarray, dict]], decode: Step, prompt: np.ndarray, new: int
):
    """Greedy tokens (batch, new) after ``prompt`` (batch, n) and the logits each was picked from."""
    logits, state = prefill(prompt)
    rows = [logits[:, -1]]
    for _ in range(new - 1):
        logits, state = decode(rows[-1].argmax(-1)[:, None], state)
        rows.append(logits[:, -1])
    chosen = np.stack(rows, 1)
    return chosen.argmax(-1), chosen


def numpy_greedy(out: Path, prompt: np.ndarray, new: int):
    """:func:`greedy` through plain ``session.run`` calls, each state returned and fed as NumPy arrays."""
    section = ExportDir.open(out).manifest.decode
    feeds, (prefill, decode) = section.feeds(), sessions(out)

    def split(outputs: dict) -> tuple[np.ndarray, dict]:
        return outputs["logits"], {feeds[k]: v for k, v in outputs.items() if k in feeds}

    return greedy(
        lambda ids: split(run(prefill, {section.tokens: ids})),
        lambda ids, state: split(run(decode, {section.tokens: ids, **state})),
        prompt,
        new,
    )


def check_bound_decoding(out: Path, forward: Callable[[np.ndarray], np.ndarray], vocab: int) -> None:
    """The stepper's greedy decoding of a batch of 2 keeps its state in ONNX Runtime and equals the numpy
    loop's and the full forward's; decoding every step from the prompt's state instead (not carried)
    leaves the full forward, so the comparison can fail."""
    prompt, new = np.random.default_rng(7).integers(0, vocab, size=(2, 5)), 10
    tolerance = ExportDir.open(out).manifest.tolerance
    with open_stepper(ExportDir.open(out)) as stepper:
        logits, state = stepper.prefill(prompt)
        assert isinstance(logits, np.ndarray) and state
        assert all(isinstance(value, np.ndarray) for value in state.values())  # owning its memory
        _, stepped = stepper.decode(prompt[:, -1:], state)
        assert all(isinstance(value, ort.OrtValue) for value in stepped.values())
        assert state_bytes(stepped) == sum(v.numpy().nbytes for v in stepped.values())
        tokens, chosen = greedy(stepper.prefill, stepper.decode, prompt, new)
        stale = [stepper.decode(tokens[:, t : t + 1], state)[0][:, -1] for t in range(new - 1)]
    numpy_tokens, numpy_chosen = numpy_greedy(out, prompt, new)
    np.testing.assert_array_equal(tokens, numpy_tokens)
    np.testing.assert_allclose(chosen, numpy_chosen, atol=1e-6, rtol=1e-6)
    expected = forward(np.concatenate([prompt, tokens], 1))[:, prompt.shape[1] - 1 : -1]
    np.testing.assert_allclose(chosen, expected, atol=tolerance["atol"], rtol=tolerance["rtol"])
    np.testing.assert_array_equal(tokens, expected.argmax(-1))
    assert not np.allclose(
        np.stack(stale[1:], 1), expected[:, 2:], atol=tolerance["atol"], rtol=tolerance["rtol"]
    )
    assert generate(out, prompt[0].tolist(), new).tokens == tokens[0].tolist()  # the CLI's path, batch 1


@pytest.mark.parametrize("variant", ["softmax", "linear"])  # a KV cache; a recurrent state
def test_bound_greedy_decoding_equals_the_numpy_loop_and_the_full_forward(decode_export, variant):
    out, _ = decode_export(variant)
    check_bound_decoding(out, lambda ids: full_forward(out, ids), 50)


def test_state_outlives_the_session_that_made_it(decode_export):
    """``attnx generate`` lets the prefill session go before it makes the decode session: the prefill's
    state stays valid (NumPy arrays holding their own memory, not the session's)."""
    out, _ = decode_export("softmax")
    ids = np.random.default_rng(3).integers(0, 50, size=(2, 9))
    with open_stepper(ExportDir.open(out), one_at_a_time=True) as stepper:
        _, state = stepper.prefill(ids[:, :6])
        stepper.open("decode")
        gc.collect()
        assert not stepper.runners["prefill"].is_active
        steps = []
        for t in range(6, 9):
            logits, state = stepper.decode(ids[:, t : t + 1], state)
            steps.append(logits)
    expected = full_forward(out, ids)[:, 6:]
    np.testing.assert_allclose(np.concatenate(steps, 1), expected, atol=1e-4, rtol=1e-3)
