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


@pytest.mark.parametrize(
    ("choice", "fragment"),
    [
        ("dict", "attnx_register_variants() returned dict {'name': 'malformed_test'}, not a list of Variant"),
        ("bare-variant", "returned Variant Variant(name='malformed_test'"),
        ("string", "returned str 'malformed_test', not a list of Variant"),
        ("not-a-variant", "returned a list holding str 'softmax', not a Variant"),
        ("config-not-a-dataclass", "whose config <class "),
        ("config-not-a-config", "whose config <class 'dict'> is not a @dataclass subclass of Config"),
        ("config-instance", "is not a @dataclass subclass of Config"),
        ("capabilities-dict", "whose capabilities {'causal': True} is dict, not Capabilities"),
        ("name-not-a-string", "whose name 7 is int, not str"),
        ("sys-exit", "SystemExit: 3"),
        ("model-config-not-a-config", "attnx_register_models() returned ModelSpec 'malformed_model' whose"),
        ("model-not-a-model", "returned a list holding Variant"),
    ],
)
def test_malformed_hook_results_fail_only_their_plugin(monkeypatch, choice, fragment):
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "tests.third_party.malformed_plugin")
    monkeypatch.setenv("ATTNX_TEST_MALFORMED", choice)
    registry = Registry()
    assert registry.variant("softmax").name == "softmax" and registry.model("encoder").name == "encoder"
    failures = [f for f in registry.failures if f.plugin == "tests.third_party.malformed_plugin"]
    assert [f.stage for f in failures] == ["register"], registry.failures
    assert fragment in failures[0].error
    assert "malformed_test" not in registry.variants and "malformed_model" not in registry.models


def test_a_plugin_calling_sys_exit_at_import_is_reported(monkeypatch):
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "tests.third_party.exiting_plugin")
    registry = Registry()
    (failure,) = [f for f in registry.failures if f.plugin == "tests.third_party.exiting_plugin"]
    assert failure.stage == "import"
    assert "SystemExit: exiting_plugin: cannot find my license file" in failure.error
    assert "softmax" in registry.variants


def test_ctrl_c_in_a_plugin_still_interrupts(monkeypatch):
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "tests.third_party.malformed_plugin")
    registry = Registry()
    (impl,) = [
        i for i in registry.pm.hook.attnx_register_variants.get_hookimpls() if "malformed" in i.plugin_name
    ]

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(impl, "function", interrupted)
    with pytest.raises(KeyboardInterrupt):
        registry.variants  # noqa: B018


def test_a_builtin_name_taken_by_a_plugin_stays_the_builtins(monkeypatch):
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "tests.third_party.intruder_plugin")
    registry = Registry()
    assert registry.variant("softmax").summary != "an impostor"
    (failure,) = [f for f in registry.failures if f.stage == "conflict"]
    assert failure.plugin == "tests.third_party.intruder_plugin"
    assert "built-in plugin 'softmax'" in failure.error
    assert "and by 'tests.third_party.intruder_plugin'" in failure.error
    assert {p.name for p in registry.plugins if p.builtin} >= {"softmax", "models", "linear"}


def test_a_hook_name_with_a_typo_fails_only_its_plugin(monkeypatch):
    monkeypatch.setenv(EXTRA_PLUGINS_ENV, "tests.third_party.typo_plugin")
    registry = Registry()
    (failure,) = registry.failures
    assert failure.plugin == "tests.third_party.typo_plugin" and failure.stage == "register"
    assert failure.error.startswith("implements attnx_register_variant, which is no attnx hook")
    assert "attnx_register_variants" in failure.error and "softmax" in registry.variants
