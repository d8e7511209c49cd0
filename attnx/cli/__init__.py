"""The ``attnx`` command line: a thin Click layer over the Python API.

Every command turns :class:`attnx.AttnxError` and Click usage errors into one
line on stderr and exit code 2; a failed check (parity) exits with 1. Ctrl-C
prints "Interrupted." and exits with 130, SIGTERM (``docker stop``, Kubernetes) "Terminated."
and 143 (what was being written is removed, the lock on OUT released); a
reader that closes stdout early (``attnx list | head -1``) ends the command
quietly with exit code 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import click

from attnx import __version__
from attnx.cli import bench, build, doctor, export, generate, listing, new_plugin, optimize, triton, verify
from attnx.errors import AttnxError
from attnx.registry import get_registry

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM
_received: list[int] = []  # the signal that interrupted the command, if any


class AttnxGroup(click.Group):
    """The command group; a broken pipe on stdout ends the CLI with exit 0 (Click would exit 1)."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _exit_0_on_closed_stdout():  # --help and --version print while parsing
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _exit_0_on_closed_stdout():
            return super().invoke(ctx)


@click.group(
    cls=AttnxGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(__version__, prog_name="attnx")
def cli() -> None:
    """Export efficient-attention Transformers to ONNX/TensorRT and prove they compute the same thing.

    \b
    Quick start:
      attnx list                                  # variants, models, lowerings, plugins
      attnx export --variant linear -o out        # export + parity check (torch vs ORT)
      attnx verify out                            # re-check an export in a new process
    """


for command in (
    listing.command,
    doctor.command,
    export.command,
    verify.command,
    build.command,
    bench.command,
    new_plugin.command,
    generate.command,
    triton.command,
    optimize.command,
):
    cli.add_command(command)


def _add_plugin_commands() -> None:
    get_registry().add_commands(cli)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI and map errors to one line + exit code."""
    _received.clear()
    try:
        with _sigterm_as_interrupt():
            _run(argv)
    except (KeyboardInterrupt, click.Abort):  # Click turns Ctrl-C inside a command into Abort
        terminated = signal.SIGTERM in _received
        click.echo("Terminated." if terminated else "Interrupted.", err=True)
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


def _run(argv: list[str] | None) -> None:
    try:
        _add_plugin_commands()
        with _exit_0_on_closed_stdout():
            cli.main(args=argv, prog_name="attnx", standalone_mode=False)
            sys.stdout.flush()  # a closed pipe shows here when the output fitted the buffer
    except AttnxError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        hint = f" (see 'attnx {exc.ctx.info_name if exc.ctx else ''} --help')".replace("attnx attnx", "attnx")
        click.echo(f"Error: {exc.format_message()}{hint}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.ClickException as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, so it unwinds like Ctrl-C: staging folders are removed and
    locks released by the code that made them (the main thread only: signals are delivered there)."""

    def interrupt(signum: int, frame: object) -> None:
        _received.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave SIGTERM as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _exit_0_on_closed_stdout() -> Iterator[None]:
    """The reader of stdout went away: point stdout at devnull so the exit flush cannot fail again,
    and exit 0 (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    try:
        yield
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):  # stdout may be no real file (tests)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
