"""A long greedy decode of an optimised export beside its float32 source: does the state drift?

A recurrent state (or a KV cache) carries every rounding of every step into the next, so an fp16 or int4
model can match its float32 source on a prompt and still drift over a long generation. Both exports'
prefill and decode graphs run in ONNX Runtime on the same prompt; each step feeds both the float32
model's greedy token (teacher forcing, so they always read the same context), and records the KL
divergence of their next-token distributions and whether their most likely tokens agree. The first step
where they do not is reported with the float32 model's gap between its top two logits there: a gap within
the step's own measured logits error (:data:`TIE_FACTOR` times it) is a float tie, not drift.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from attnx.decode.runtime import open_stepper
from attnx.exporter.directory import ExportDir
from attnx.optimizer.text import divergence, log_softmax

TIE_FACTOR = 2.0
Progress = Callable[[str], None]


@dataclasses.dataclass
class LongDecode:
    """``tokens`` greedy steps after a ``prompt``-token prompt: the mean and largest KL (nats), the share
    of steps whose most likely token agrees, and the first step (0: the token after the prompt) where it
    does not, with the float32 top-two gap there and whether that is a tie (None: they always agree)."""

    prompt: int
    tokens: int
    mean_kl: float
    max_kl: float
    agreement: float
    first_difference: int | None = None
    gap: float | None = None
    tie: bool | None = None


def long_decode(
    source: ExportDir,
    optimised: ExportDir,
    prompt: Sequence[int],
    tokens: int,
    tie_below: float,
    progress: Progress | None = None,
) -> LongDecode:
    """Decode ``tokens`` steps of both exports from ``prompt``, fed the float32 tokens; a first difference
    whose float32 top-two gap is at most ``tie_below`` is a tie."""
    report = progress or (lambda message: None)
    ids = np.asarray([list(prompt)], dtype=np.int64)
    kl, agree = [], []
    first = gap = None
    # one session per export at a time: the prompt's closes before the steps' opens (with all four open,
    # `attnx optimize --fuse` of the 0.8B shape peaked at 23.4 GB here)
    with (
        open_stepper(source, one_at_a_time=True) as reference,
        open_stepper(optimised, one_at_a_time=True) as candidate,
    ):
        want, want_state = reference.prefill(ids)
        got, got_state = candidate.prefill(ids)
        for step in range(tokens):
            expected = log_softmax(want[0, -1])
            step_kl, same = divergence(expected, log_softmax(got[0, -1]))
            kl.append(float(step_kl))
            agree.append(bool(same))
            token = int(expected.argmax())
            if first is None and not agree[-1]:
                top_two = np.sort(np.asarray(want[0, -1], dtype=np.float64))[-2:]
                first, gap = step, float(top_two[1] - top_two[0])
            if step + 1 < tokens:
                next_ids = np.asarray([[token]], dtype=np.int64)
                want, want_state = reference.decode(next_ids, want_state)
                got, got_state = candidate.decode(next_ids, got_state)
            if step and step % 250 == 0:
                report(f"long decode: {step} of {tokens} tokens")
    return LongDecode(
        len(prompt),
        tokens,
        float(np.mean(kl)),
        float(np.max(kl)),
        float(np.mean(agree)),
        first,
        gap,
        None if gap is None else gap <= tie_below,
    )
