"""attnx.bench.roundrobin: runs alternate; skips, failures and the memory guard are rows, not crashes."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from polygraphy.backend.base import BaseRunner

from attnx.bench.roundrobin import Contender, round_robin


class Recorder(BaseRunner):
    """Appends its name to ``log`` on every run; raises from ``fail_at`` tokens on."""

    def __init__(self, name: str, log: list[str], fail_at: int | None = None) -> None:
        super().__init__(name=name)
        self.log, self.fail_at = log, fail_at

    def activate_impl(self) -> None:
        self.log.append(f"load {self.name}")

    def deactivate_impl(self) -> None:
        self.log.append(f"unload {self.name}")

    def get_input_metadata_impl(self):  # pragma: no cover - check_inputs=False never asks
        raise NotImplementedError

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict:
        n = feed_dict["x"].shape[1]
        if self.fail_at is not None and n >= self.fail_at:
            raise ValueError(f"cannot take {n} tokens")
        self.log.append(self.name)
        return OrderedDict(y=feed_dict["x"])


def contender(name: str, log: list[str], **kwargs) -> Contender:
    estimate = kwargs.pop("estimate", lambda n: None)
    return Contender(name, "case", "v", lambda: Recorder(name, log, **kwargs),
                     lambda n, rng: {"x": rng.standard_normal((1, n), dtype=np.float32)}, estimate)


def test_contenders_take_turns_and_bad_ones_become_rows() -> None:
    log: list[str] = []
    contenders = [
        contender("a", log),
        contender("b", log, fail_at=8),
        contender("big", log, estimate=lambda n: n * 1000),
        Contender("absent", "case", "v", None, None, skip="not installed (absent)"),
    ]
    rows = round_robin(contenders, [4, 8], warmup=1, repeat=3, threads=1, rng=np.random.default_rng(0),
                       limit=6000)
    by = {(m.backend, m.seq_len): m for m in rows}
    runs = [entry for entry in log if " " not in entry]
    assert runs[:3] == ["a", "b", "big"] and runs[3:9] == ["a", "b", "big"] * 2  # warm-ups, then turns
    assert [len(by[name, 4].timings_s) for name in ("a", "b", "big")] == [3, 3, 3]
    assert by["a", 8].ok and len(by["a", 8].timings_s) == 3
    assert by["b", 8].status == "failed" and "cannot take 8 tokens" in by["b", 8].reason
    assert by["big", 8].status == "skipped" and by["big", 8].reason.startswith("memory guard")
    for n in (4, 8):
        assert by["absent", n].status == "skipped" and "not installed" in by["absent", n].reason


def test_contenders_that_fit_only_alone_are_timed_one_at_a_time_each_loaded_only_while_it_runs() -> None:
    """Each fits the limit, together they do not (a runtime keeps its largest run's memory)."""
    log: list[str] = []
    contenders = [contender(name, log, estimate=lambda n: 1000 * n) for name in ("a", "b")]
    rows = round_robin(contenders, [2, 4], warmup=1, repeat=2, threads=1, rng=np.random.default_rng(0),
                       limit=5000)
    by = {(m.backend, m.seq_len): m for m in rows}
    assert log[:2] == ["load a", "load b"] and log[2:8] == ["a", "b"] * 3  # N=2: together 4000, in turns
    assert log[8:] == ["unload a", "unload b", "load a", "a", "a", "a", "unload a", "load b", "b", "b", "b",
                       "unload b"]  # N=4: together 8000 > 5000, one at a time
    assert all(by[name, 4].ok and len(by[name, 4].timings_s) == 2 for name in ("a", "b"))
    assert by["a", 4].reason == "timed alone: together 0.0 GiB > limit" and by["a", 2].reason == ""
