"""The lengths an adapter declares for its library's models (``AdapterImpl.lengths``): the default
verify lengths are fitted to them at export and at ``attnx verify``, and recorded in the manifest."""

from __future__ import annotations

import json

import pytest
import torch

from attnx.adapter import Lengths
from tests.helpers import assert_one_line_error, run_cli
from tests.third_party.toy_library import ToyModel

DEFAULT = (1, 7, 32, 129)


@pytest.mark.parametrize(
    ("lengths", "fitted"),
    [
        (Lengths(), DEFAULT),
        (Lengths(maximum=64), (1, 7, 32, 64)),
        (Lengths(maximum=16), (1, 7, 16)),
        (Lengths(multiple=4), (4, 8, 32, 132)),
        (Lengths(maximum=64, multiple=8), (8, 32, 64)),
        (Lengths(maximum=70, multiple=32), (32, 64)),
        (Lengths(maximum=5, multiple=8), (8,)),  # no multiple fits: the smallest one, refused by name later
    ],
)
def test_the_default_lengths_fitted_to_a_model(lengths, fitted):
    assert lengths.fit(DEFAULT) == fitted


def test_two_limited_parts_accept_what_both_accept():
    both = Lengths.of([Lengths(maximum=64), None, Lengths(maximum=128, multiple=4), Lengths(multiple=6)])
    assert both == Lengths(maximum=64, multiple=12)
    assert Lengths.of([None, None]) is None


@pytest.fixture
def toy_model_dir(tmp_path, toy_registry):
    torch.manual_seed(3)
    saved = tmp_path / "saved"
    saved.mkdir()
    torch.save(ToyModel(causal=True).state_dict(), saved / "weights.pt")  # 64 learned positions
    return saved


def test_a_library_model_exports_and_verifies_with_no_flags_at_lengths_it_takes(tmp_path, toy_model_dir):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["export", "--from", f"toy:{toy_model_dir}", "-o", str(out)])
    assert code == 0 and "parity: PASSED" in stdout, stderr
    manifest = json.loads((out / "attnx.json").read_text())
    assert manifest["module"]["lengths"] == {"maximum": 64, "multiple": 1}
    assert json.loads((out / "parity.json").read_text())["seq_lens"] == [1, 7, 32, 64]
    code, stdout, stderr = run_cli(["verify", str(out)])
    assert code == 0 and "parity: PASSED" in stdout, stderr
    assert json.loads((out / "parity.json").read_text())["seq_lens"] == [1, 7, 32, 64]


def test_without_the_declaration_the_default_lengths_are_refused_by_name(
    tmp_path, toy_model_dir, monkeypatch
):
    """The seeded defect: an adapter that does not declare its model's limits leaves 129 tokens, which the
    library's own position table refuses."""
    import dataclasses

    from tests.third_party import toy_adapter

    monkeypatch.setattr(toy_adapter, "IMPL", dataclasses.replace(toy_adapter.IMPL, lengths=None))
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--from", f"toy:{toy_model_dir}", "-o", str(out)])
    assert_one_line_error(code, stderr, "--seq-lens")
    assert not out.exists()
