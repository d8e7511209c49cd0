"""Every variant attnx ships passes the same conformance kit as third-party plugins.

One pytest item per (variant, check), e.g. ``test_linear_conforms[causality]``. The
export checks (seconds each) are marked slow; the light ones run in the default suite.
"""

from __future__ import annotations

from importlib.metadata import distribution

import pytest

from attnx.registry import ENTRY_POINT_GROUP, Registry
from attnx.testing import conformance_tests

REGISTRY = Registry(autoload=True)
# Every variant attnx ships, with the options its declaration gives the kit (Variant.testing).
SHIPPED = sorted(
    variant.name
    for impl in REGISTRY.pm.hook.attnx_register_variants.get_hookimpls()
    if impl.plugin_name
    in {ep.name for ep in distribution("attnx").entry_points if ep.group == ENTRY_POINT_GROUP}
    for variant in impl.function()
)

for _name in SHIPPED:
    globals()[f"test_{_name}_conforms"] = conformance_tests(
        _name, registry=REGISTRY, heavy_marks=[pytest.mark.slow]
    )


def test_every_shipped_variant_loads_and_is_checked() -> None:
    """A built-in plugin that fails to load would silently drop out of SHIPPED: refuse that."""
    shipped = {ep.name for ep in distribution("attnx").entry_points if ep.group == ENTRY_POINT_GROUP}
    failed = [f for f in REGISTRY.failures if f.plugin in shipped]
    assert not failed, f"built-in plugins failed to load: {failed}"
    built_in = {"softmax", "linear", "cosformer", "reformer", "fastformer", "retention", "gated_delta"}
    assert built_in <= set(SHIPPED)
