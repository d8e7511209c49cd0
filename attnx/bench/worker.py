"""One measurement in a fresh process (``attnx bench --isolate`` and the P7 memory check).

``python -m attnx.bench.worker '<json request>'`` prints the Measurement as JSON on its
last stdout line. A fresh process makes the peak exact: ``process_peak_rss_bytes`` is
the whole process's peak (imports included), and nothing earlier in the sweep (an ORT
arena, a freed heap) can hide or inflate it. ORT backends never import torch here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np

from attnx.bench.machine import lifetime_peak_bytes
from attnx.bench.report import Measurement
from attnx.bench.timing import measure
from attnx.exporter.directory import ExportDir
from attnx.parity.backends import BACKENDS


def request(export: ExportDir, backend: str, *, batch: int, seq_len: int, warmup: int, repeat: int,
            threads: int, seed: int, max_time: float | None) -> dict[str, Any]:
    return {"out": str(export.path), "backend": backend, "batch": batch, "seq_len": seq_len,
            "warmup": warmup, "repeat": repeat, "threads": threads, "seed": seed, "max_time": max_time}


def run_isolated(export: ExportDir, args: dict[str, Any], timeout: float | None = None) -> Measurement:
    """Run ``request(...)`` in a child process; a crash (e.g. killed out of memory) is a failed case."""
    command = [sys.executable, "-m", "attnx.bench.worker", json.dumps(args)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        reason = f"measuring process ran past {timeout:g} s"
    else:
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            return Measurement.from_dict(json.loads(lines[-1]))
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        reason = f"measuring process exited with code {done.returncode}: {tail}"
    return Measurement(export.label, str(export.path), export.manifest.variant, args["backend"],
                       args["batch"], args["seq_len"], "failed", reason, threads=args["threads"])


def main(argv: list[str]) -> None:
    args = json.loads(argv[0])
    export = ExportDir.open(args["out"])
    result = measure(export, BACKENDS[args["backend"]], batch=args["batch"], seq_len=args["seq_len"],
                     warmup=args["warmup"], repeat=args["repeat"], threads=args["threads"],
                     rng=np.random.default_rng(args["seed"]), max_time=args["max_time"])
    result.process_peak_rss_bytes = lifetime_peak_bytes()
    print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1:])
