"""The plugin manager: entry points, isolation of broken plugins, conflicts, third-party variants."""

from __future__ import annotations

import pytest

from attnx.errors import AttnxError
from attnx.registry import DISABLE_AUTOLOAD_ENV, EXTRA_PLUGINS_ENV, Registry


def test_builtins_come_from_the_entry_point_group():
    registry = Registry()
    sources = {p.name: p.source for p in registry.plugins}
    assert sources["softmax"].startswith("entry point")
    assert sources["models"].startswith("entry point")
    assert "softmax" in registry.variants and "encoder" in registry.models


def test_autoload_can_be_disabled(monkeypatch):
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    registry = Registry()
    assert registry.variants == {}
    with pytest.raises(AttnxError, match="unknown variant 'softmax'"):
        registry.variant("softmax")


def test_plugin_that_fails_to_import_is_reported_and_others_work(monkeypatch):
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "tests.third_party.broken_plugin")
    registry = Registry()
    (failure,) = [f for f in registry.failures if f.plugin == "tests.third_party.broken_plugin"]
    assert failure.stage == "import"
    assert "flash_attn_9000" in failure.error
    assert registry.variant("softmax").name == "softmax"


def test_plugin_whose_hook_raises_is_reported_and_others_work(monkeypatch):
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "tests.third_party.raising_hook_plugin")
    registry = Registry()
    assert "softmax" in registry.variants
    (failure,) = [f for f in registry.failures if f.plugin == "tests.third_party.raising_hook_plugin"]
    assert failure.stage == "register" and "cannot read my config file" in failure.error


def test_duplicate_variant_names_are_an_error_naming_both_plugins(monkeypatch):
    monkeypatch.setenv(
        EXTRA_PLUGINS_ENV, "tests.third_party.sigmoid_plugin,tests.third_party.duplicate_plugin"
    )
    registry = Registry()
    assert "sigmoid_test" not in registry.variants
    with pytest.raises(AttnxError) as info:
        registry.variant("sigmoid_test")
    assert "tests.third_party.sigmoid_plugin" in str(info.value)
    assert "tests.third_party.duplicate_plugin" in str(info.value)
    assert any(f.stage == "conflict" for f in registry.failures)


def test_unknown_variant_suggests_the_closest_name():
    with pytest.raises(AttnxError, match=r"unknown variant 'sofmax'; did you mean 'softmax'\?"):
        Registry().variant("sofmax")


def test_third_party_variant_registers_without_changes_to_attnx(monkeypatch):
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "tests.third_party.sigmoid_plugin")
    variant = Registry().variant("sigmoid_test")
    assert variant.capabilities.cross and not variant.capabilities.causal
