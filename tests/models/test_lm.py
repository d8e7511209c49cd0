"""The ``lm`` model: causal through the whole stack, tied output projection, ORT parity."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnx.exporter.assemble import assemble
from attnx.exporter.manifest import MODEL_FILE
from tests.helpers import assert_unchanged
from tests.models.cases import VARIANT_OPTIONS, causal_variants
from tests.models.exports import tiny_export

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, "vocab_size": 50}
VOCAB = TINY["vocab_size"]


def build(variant: str, **options):
    return assemble(variant, "lm", {**TINY, **VARIANT_OPTIONS.get(variant, {}), **options}, seed=1).module


def future_changed(ids: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    changed = ids.clone()
    changed[:, k:] = (
        changed[:, k:] + torch.randint(1, VOCAB, changed[:, k:].shape, generator=generator)
    ) % VOCAB
    return changed


REVERSIBLE = {"reversible": True, "ff_chunks": 3}
# every variant in the plain stack; the reversible stack (the same for every variant) with the first in the
# default run, with every variant under -m slow
CAUSALITY_CASES = [pytest.param(v, {}, id=f"plain-{v}") for v in causal_variants()] + [
    pytest.param(v, REVERSIBLE, id=f"reversible-{v}", marks=[pytest.mark.slow] if i else [])
    for i, v in enumerate(causal_variants())
]


@pytest.mark.parametrize(("variant", "architecture"), CAUSALITY_CASES)
def test_future_tokens_do_not_change_earlier_logits(variant, architecture):
    """Unchanged up to rounding in torch, through embeddings, every layer (plain or reversible, chunked FFN)
    and the head."""
    model = build(variant, **architecture)
    generator = torch.Generator().manual_seed(7)
    for n in (2, 5, 13, 40):
        ids = torch.randint(0, VOCAB, (2, n), generator=generator)
        with torch.no_grad():
            (base,) = model(ids)
            for k in sorted({1, n // 2, n - 1}):
                (changed,) = model(future_changed(ids, k, generator))
                assert_unchanged(changed[:, :k], base[:, :k], f"n={n}, k={k}")
                assert not torch.equal(changed[:, k:], base[:, k:]), "later logits must see the change"


def test_logits_are_the_final_hidden_states_times_the_embedding():
    """Tied projection: one vocabulary matrix, logits_i = LN(h_i) . E_v for every v."""
    model = build("softmax")
    assert [n for n, p in model.named_parameters() if p.shape[0] == VOCAB] == ["embedding.embed.weight"]
    captured = {}
    model.norm.register_forward_hook(lambda module, args, output: captured.update(hidden=output))
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        (logits,) = model(ids)
    hidden, weight = captured["hidden"].double(), model.embedding.embed.weight.detach().double()
    expected = torch.tensor(
        [[[float(hidden[b, i] @ weight[v]) for v in range(VOCAB)] for i in range(9)] for b in range(2)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(logits.double(), expected, atol=1e-5, rtol=1e-5)


def test_logits_have_batch_seq_vocab_axes():
    model = build("softmax")
    assert [(s.name, s.axes) for s in model.output_specs()] == [("logits", ("batch", "seq", VOCAB))]
    assert [(s.name, s.dtype, s.axes) for s in model.input_specs()] == [
        ("input_ids", "int64", ("batch", "seq"))
    ]


@pytest.fixture(scope="module")
def exported():
    """The tiny softmax LM (exported once per test process) and its torch module rebuilt from the weights."""
    from attnx.exporter.directory import ExportDir

    result = tiny_export("softmax", "lm")
    session = ort.InferenceSession(str(result.out / MODEL_FILE), providers=["CPUExecutionProvider"])
    return ExportDir.open(result.out).rebuild().module, session


def test_onnx_lm_is_causal(exported):
    _, session = exported
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (3, 21), generator=generator)
    (base,) = session.run(None, {"input_ids": ids.numpy()})
    for k in (1, 10, 20):
        (changed,) = session.run(None, {"input_ids": future_changed(ids, k, generator).numpy()})
        np.testing.assert_allclose(changed[:, :k], base[:, :k], atol=1e-5, rtol=1e-5)
        assert np.abs(changed[:, k:] - base[:, k:]).max() > 1e-3


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), n=st.integers(1, 80), seed=st.integers(0, 2**16))
def test_property_torch_matches_onnxruntime(exported, batch, n, seed):
    module, session = exported
    ids = np.random.default_rng(seed).integers(0, VOCAB, size=(batch, n))
    with torch.no_grad():
        (expected,) = module(torch.from_numpy(ids))
    (actual,) = session.run(None, {"input_ids": ids})
    np.testing.assert_allclose(actual, expected.numpy(), atol=1e-4, rtol=1e-3)
