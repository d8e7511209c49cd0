"""The attnx plugin hooks. Plugins implement them with ``@attnx.hookimpl``.

Every hook is called with keyword arguments only. Built-in variants and models
are plugins registered through the same ``attnx`` entry-point group as
third-party ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import click

    from attnx.adapter import Adapter
    from attnx.models.spec import ModelSpec
    from attnx.variant import Variant

PROJECT = "attnx"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def attnx_register_variants() -> list[Variant]:
    """Return the attention variants this plugin provides.

    Calling rule: every implementation is called (one at a time, so a failing
    plugin is reported without hiding the others); results are concatenated.
    A variant name registered by two plugins is an error naming both.
    Keep the module that implements this hook free of heavy imports: put the
    torch/ONNX code behind :attr:`attnx.variant.Variant.impl`.
    """


@hookspec
def attnx_register_models() -> list[ModelSpec]:
    """Return the model architectures (encoder, lm, ...) this plugin provides.

    Calling rule: as for :func:`attnx_register_variants`.
    """


@hookspec
def attnx_register_adapters() -> list[Adapter]:
    """Return adapters that take models of other libraries into attnx (``attnx.adapter``).

    Calling rule: as for :func:`attnx_register_variants`; keep the implementing module light
    (the library and torch load behind :attr:`attnx.adapter.Adapter.impl`).
    """


@hookspec
def attnx_register_commands(cli: click.Group) -> None:
    """Add Click commands to the ``attnx`` command group (``cli.add_command(...)``).

    Calling rule: every implementation is called once when the CLI starts; an
    implementation that raises is reported by ``attnx list``/``doctor`` and skipped.
    """
