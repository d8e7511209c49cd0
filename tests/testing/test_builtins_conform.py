"""Every variant attnx ships passes the same conformance kit as third-party plugins.

One pytest item per (variant, check), e.g. ``test_linear_conforms[causality]``. The
export checks (seconds each) are marked slow; the light ones run in the default suite.
"""

from __future__ import annotations

from importlib.metadata import distribution
from typing import Any

import pytest

from attnx.registry import ENTRY_POINT_GROUP, Registry
from attnx.testing import conformance_tests

# Every variant attnx ships, with the options and bad options its conformance run uses.
BUILTINS: dict[str, dict[str, Any]] = {
    "softmax": {"bad_options": {"scale": -1.0}},
    "linear": {"bad_options": {"eps": 0.0, "chunk_size": 0}},
    # Causal cosFormer needs a fixed re-weighting length M >= every length the kit uses (up to 19).
    "cosformer": {"options": {"max_len": 32}, "bad_options": {"max_len": 0, "eps": -1.0, "chunk_size": 0}},
    # Chunks of 4 so that the kit's length-11 inputs span several LSH chunks.
    "reformer": {
        "options": {"chunk_size": 4},
        "bad_options": {"n_hashes": 0, "n_buckets": 3, "chunk_size": 0},
    },
    "fastformer": {"bad_options": {"share_qv": "maybe"}},
}
REGISTRY = Registry(autoload=True)

for _name, _case in BUILTINS.items():
    globals()[f"test_{_name}_conforms"] = conformance_tests(
        _name, registry=REGISTRY, heavy_marks=[pytest.mark.slow], **_case
    )


def test_every_shipped_variant_is_in_the_table():
    """A variant added to attnx's entry points fails here until it is in BUILTINS (and so checked)."""
    shipped = {ep.name for ep in distribution("attnx").entry_points if ep.group == ENTRY_POINT_GROUP}
    failed = [f for f in REGISTRY.failures if f.plugin in shipped]
    assert not failed, f"built-in plugins failed to load: {failed}"
    provided = {
        variant.name
        for impl in REGISTRY.pm.hook.attnx_register_variants.get_hookimpls()
        if impl.plugin_name in shipped
        for variant in impl.function()
    }
    assert provided == set(BUILTINS), (
        f"variants not in the conformance table: {sorted(provided - set(BUILTINS))}"
    )
