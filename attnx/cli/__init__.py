"""The ``attnx`` command line: a thin Click layer over the Python API.

Every command turns :class:`attnx.AttnxError` and Click usage errors into one
line on stderr and exit code 2; a failed check (parity) exits with 1.
"""

from __future__ import annotations

import sys

import click

from attnx import __version__
from attnx.cli import bench, build, doctor, export, generate, listing, new_plugin, triton, verify
from attnx.errors import AttnxError
from attnx.registry import get_registry

EXIT_BAD_INPUT = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="attnx")
def cli() -> None:
    """Export efficient-attention Transformers to ONNX/TensorRT and prove they compute the same thing.

    \b
    Quick start:
      attnx list                                  # variants, models, lowerings, plugins
      attnx export --variant linear -o out        # export + parity check (torch vs ORT)
      attnx verify out                            # re-check an export in a new process
    """


for command in (listing.command, doctor.command, export.command, verify.command, build.command, bench.command,
                new_plugin.command, generate.command, triton.command):
    cli.add_command(command)


def _add_plugin_commands() -> None:
    get_registry().add_commands(cli)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI and map errors to one line + exit code."""
    _add_plugin_commands()
    try:
        cli.main(args=argv, prog_name="attnx", standalone_mode=False)
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
    except click.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
