"""``attnx bench``: latency, throughput, memory and scaling of exported models per backend."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from attnx.cli.common import parse_int_list, parse_name_list
from attnx.errors import AttnxError
from attnx.limits import MAX_SEED, MAX_THREADS

EPILOG = """\b
Examples:
  attnx bench out
  attnx bench softmax-enc linear-enc --seq-lens 256,1024,4096 --plot bench.png
  attnx bench out --backends torch,ort-cpu --batch 8 --repeat 20 --threads 2 --json results.json
  attnx bench out --seq-lens 16384,32768 --max-memory 8GiB --isolate
"""


@click.command("bench", epilog=EPILOG)
@click.argument("outs", nargs=-1, required=True, metavar="OUT...")
@click.option("--backends", default=None, metavar="NAME,...",
              help="Comma-separated from torch, torch-compile, ort-cpu, ort-cuda, ort-trt, trt "
                   "[default: all]; one that cannot run here is listed as skipped with the reason.")
@click.option("--seq-lens", default="256,1024,4096", show_default=True, metavar="N,N,...",
              help="Sequence lengths to time; the log-log slope of latency vs N is fitted over them.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="Batch size.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0),
              help="Untimed runs per case.")
@click.option("--repeat", default=10, show_default=True, type=click.IntRange(min=1),
              help="Timed runs per case.")
@click.option("--max-time", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Stop a case's timed runs after this long (at least 3 runs).")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
              help="Intra-op threads for torch and ONNX Runtime [default: the usable cores].")
@click.option("--max-memory", default=None, metavar="SIZE",
              help="Skip cases whose estimated peak exceeds SIZE (e.g. 8GiB) "
                   "[default: 80% of available memory].")
@click.option("--isolate", is_flag=True,
              help="Measure each case in a fresh process (exact peak memory; slower).")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=None,
              help="Seed of the random inputs (default: fresh; recorded).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write every measurement (raw timings included), the machine and the settings as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, metavar="FILE.png",
              help="Plot latency vs N (log-log) per model and backend; needs the plot extra (matplotlib).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def command(outs: tuple[str, ...], backends: str | None, seq_lens: str, batch: int, warmup: int,
            repeat: int, max_time: float | None, threads: int | None, max_memory: str | None, isolate: bool,
            seed: int | None, json_path: str | None, plot_path: str | None, quiet: bool) -> None:
    """Time each OUT (from `attnx export`) on each backend and sequence length.

    Each case loads the backend, warms up, then times --repeat runs, each on fresh random
    inputs, and reports median, p90 and min latency, tokens/s, achieved GFLOP/s and the
    peak resident memory over load and runs (RSS delta). The table goes to stdout, the
    progress bar to stderr. Exit code 0: every case ran or was skipped with a reason;
    1: a backend failed on a case; 2: bad input.
    """
    from attnx.bench import bench
    from attnx.config import parse_size

    names = parse_name_list(backends) if backends is not None else None
    lengths = parse_int_list(seq_lens, "--seq-lens")
    limit = parse_size(max_memory, "--max-memory") if max_memory is not None else None
    if plot_path:
        from attnx.bench.plot import require_matplotlib

        require_matplotlib()
    for option, path in (("--json", json_path), ("--plot", plot_path)):
        if path:
            _check_writable(option, Path(path))
    from attnx.bench.report import progress_bar

    with progress_bar(quiet) as progress:
        report = bench(list(outs), backends=names, seq_lens=lengths, batch=batch, warmup=warmup,
                       repeat=repeat, threads=threads, max_memory=limit, max_time=max_time, isolate=isolate,
                       seed=seed, progress=progress)
    from attnx.bench.report import print_report

    print_report(report)
    if json_path:
        report.write_json(json_path)
        click.echo(f"wrote {json_path}")
    if plot_path:
        from attnx.bench.plot import plot_report

        plot_report(report, plot_path)
        click.echo(f"wrote {plot_path}")
    if report.failed:
        sys.exit(1)


def _check_writable(option: str, path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise AttnxError(f"{option} {path}: directory '{parent}' does not exist; create it or choose another")
    if not os.access(parent, os.W_OK):
        raise AttnxError(f"{option} {path}: cannot write to '{parent}' (permission denied)")
