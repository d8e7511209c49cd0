"""docs/plugins.md documents every hook, every conformance check and both environment switches."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from attnx import hookspecs
from attnx.registry import DISABLE_AUTOLOAD_ENV, EXTRA_PLUGINS_ENV
from attnx.testing import CHECKS

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
HOOKS = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(fn, "attnx_spec")]


def section(title: str) -> str:
    text = DOC.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/plugins.md has no '## {title}' section"
    return match.group(1)


def test_the_hooks_are_found():
    assert {"attnx_register_variants", "attnx_register_models", "attnx_register_commands"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_with_its_signature(hook):
    parameters = list(inspect.signature(getattr(hookspecs, hook)).parameters)
    headings = re.findall(r"^### `(\w+)\((.*?)\)", section("Hook reference"), re.M)
    documented = {name: args for name, args in headings}
    assert hook in documented, f"hook {hook} has no '### `{hook}(...)`' heading in docs/plugins.md"
    assert [a.split(":")[0].strip() for a in documented[hook].split(",") if a.strip()] == parameters


@pytest.mark.parametrize("check", [c.name for c in CHECKS])
def test_every_conformance_check_is_documented(check):
    rows = re.findall(r"^\| `([\w-]+)` \|", section("The conformance kit: `attnx.testing`"), re.M)
    assert check in rows, f"check {check} is not in the checks table of docs/plugins.md"


def test_the_environment_switches_are_documented():
    switches = section("Environment switches")
    assert f"`{EXTRA_PLUGINS_ENV}=" in switches and f"`{DISABLE_AUTOLOAD_ENV}=1`" in switches
