"""Every registered variant x every model it supports: exports, verifies in ORT, rebuilds from its manifest.

The default run uses the function lowering; the other lowerings are ``slow``.
"""

from __future__ import annotations

import re

import pytest

from attnx.api import verify
from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.registry import get_registry
from tests.models.cases import CASES, MODELS, REGISTERED, SUPPORTED, VARIANT_OPTIONS, covering, cross_for
from tests.models.exports import same_worker, tiny_export

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}


def test_every_registered_model_is_covered():
    assert sorted(get_registry().models) == sorted(MODELS)


UNSUPPORTED = [(v, m) for v in REGISTERED for m in MODELS if m not in SUPPORTED.get(v, ())]


@pytest.mark.parametrize(
    ("variant", "model"),
    UNSUPPORTED
    or [
        pytest.param(
            None, None, marks=pytest.mark.skip(reason="every registered variant supports every model")
        )
    ],
)
def test_unsupported_combination_fails_at_build_naming_model_and_need(variant, model):
    with pytest.raises(AttnxError) as error:
        assemble(variant, model, TINY)
    message = str(error.value)
    assert "\n" not in message
    assert re.search(f"model '{model}' needs (causal|bidirectional) self-attention", message), message
    assert f"variant '{variant}'" in message


def called_ops(variant: str) -> set[str]:
    """The ops a model built with the variant's default options calls (not its conditional ones)."""
    impl = get_registry().variant(variant).load()
    return {f"attnx::{op.name}" for op in impl.ops if op.name not in impl.conditional_ops}


# each case on the worker of the other tests of its export (tests/ecosystem's tools run on the encoders')
@pytest.mark.parametrize(
    ("variant", "model"),
    [pytest.param(*p.values, id=p.id, marks=[*p.marks, same_worker(*p.values)]) for p in covering(CASES)],
)
def test_exports_and_verifies(variant, model):
    result = tiny_export(variant, model)
    worst = max(c.max_abs for b in result.parity.ran for c in b.comparisons)
    assert result.parity.passed, f"max abs error {worst:.3g}"
    manifest = result.manifest
    assert (manifest.variant, manifest.model, manifest.recipe) == (variant, model, f"tiny-{model}")
    for key, value in get_registry().variant(variant).model_defaults.items():
        assert manifest.model_config[key] == value, f"{variant} architecture: {key}"
    ops = called_ops(variant)
    if model == "seq2seq":
        cross = cross_for(variant)
        assert manifest.cross_variant == cross
        ops |= called_ops(cross)
    else:
        assert manifest.cross_variant is None
    assert set(manifest.ops) == ops
    rebuilt = verify(
        result.out, seq_lens=[5], write=False
    )  # rebuilt from attnx.json + weights, as `attnx verify`
    assert rebuilt.passed


LOWERINGS = [
    pytest.param(v, m, lowering, id=f"{v}-{m}-{lowering}", marks=same_worker(v, m, lowering))
    for v, m in CASES
    for lowering in ("decomposed", "plugin")
]


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "model", "lowering"), LOWERINGS)
def test_exports_and_verifies_with_other_lowerings(variant, model, lowering):
    assert tiny_export(variant, model, lowering=lowering).parity.passed


def test_cosformer_options_reach_cross_attention_too():
    """A bare option goes to every attention config that has it (here both cosformer configs)."""
    if "cosformer" not in REGISTERED:
        pytest.xfail("cosformer variant is not registered")
    assembly = assemble(
        "cosformer", "seq2seq", {**TINY, **VARIANT_OPTIONS["cosformer"]}, cross_variant="cosformer"
    )
    expected = VARIANT_OPTIONS["cosformer"]["max_len"]
    assert assembly.variant_config.max_len == assembly.cross_variant_config.max_len == expected
