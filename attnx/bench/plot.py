"""``--plot FILE.png``: median latency vs N per model and backend, log-log.

Drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas, so no GUI
backend is needed and pyplot's global state is left alone. matplotlib is the optional
``plot`` extra.
"""

from __future__ import annotations

from pathlib import Path

from attnx.atomic import write_atomic
from attnx.bench.report import BenchReport
from attnx.errors import AttnxError

INSTALL_HINT = "pip install 'attnx[plot]'"
STYLES = ("-", "--", ":", "-.")  # one per backend; colours are per model


def require_matplotlib() -> None:
    """Raise AttnxError naming the extra when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AttnxError(f"--plot needs matplotlib, which is not installed; {INSTALL_HINT}") from None


def plot_report(report: BenchReport, path: str | Path, title: str | None = None) -> None:
    """Write a log-log PNG of median latency (ms) against N, one line per (model, backend, batch):
    a colour per model, a line style per backend."""
    import io

    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5.5), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    fits = report.scaling
    models, backends = dict.fromkeys(f.model for f in fits), dict.fromkeys(f.backend for f in fits)
    colours = {model: f"C{i % 10}" for i, model in enumerate(models)}
    styles = {backend: STYLES[i % len(STYLES)] for i, backend in enumerate(backends)}
    for fit in fits:
        label = f"{fit.model} · {fit.backend}" + (f" · batch {fit.batch}" if fit.batch != 1 else "")
        latencies_ms = [t * 1e3 for t in fit.median_s]
        axes.plot(fit.seq_lens, latencies_ms, marker="o", color=colours[fit.model],
                  linestyle=styles[fit.backend], label=f"{label} (slope {fit.slope:.2f})")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("sequence length N")
    axes.set_ylabel("median latency (ms)")
    axes.grid(True, which="both", alpha=0.3)
    threads = report.settings.get("threads")
    axes.set_title(title or f"latency vs N — {report.machine.get('cpu')}, {threads} threads")
    if axes.lines:
        axes.legend(fontsize="small")
    else:
        axes.text(0.5, 0.5, "no case measured at two or more lengths", ha="center", transform=axes.transAxes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    write_atomic(Path(path), buffer.getvalue())
