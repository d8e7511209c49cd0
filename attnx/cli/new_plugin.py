"""``attnx new-plugin``: scaffold an installable attention-variant plugin with a working example."""

from __future__ import annotations

import click

EPILOG = """\b
Examples:
  attnx new-plugin window -o window-plugin
  pip install -e ./window-plugin && attnx export --variant window -o out
  attnx new-plugin local_window --force      # replaces ./attnx-local-window
"""


@click.command("new-plugin", epilog=EPILOG)
@click.argument("name")
@click.option(
    "--out", "-o", default=None, type=click.Path(), help="Directory to create (default: ./attnx-NAME)."
)
@click.option("--force", is_flag=True, help="Replace OUT if it is an earlier scaffold of NAME or empty.")
def command(name: str, out: str | None, force: bool) -> None:
    """Create a plugin package for attention variant NAME (lower-case, e.g. window).

    The package is a working sliding-window attention (torch custom op, ONNX bodies,
    layer) with tests that use attnx's conformance kit; edit the maths to make it yours.
    `pip install -e OUT` registers it: `attnx list` shows it and `attnx export --variant
    NAME` uses it, with no change to attnx.
    """
    from attnx.scaffold import scaffold

    result = scaffold(name, out, force=force)
    plugin = result.plugin
    click.echo(
        f"created {result.out}/ (package {plugin.package}, variant '{plugin.name}', "
        f"op attnx::{plugin.camel}Attention)"
    )
    for path in result.files:
        click.echo(f"  {path}")
    click.echo(
        f"next:\n  pip install -e {result.out}\n  attnx export --variant {plugin.name} -o out\n"
        f"  pytest {result.out}"
    )
