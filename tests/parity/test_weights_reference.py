"""The weight check's index of the model's tensors (:class:`attnx.parity.weights.Reference`): a graph tensor
is found as it is or transposed, and only the model tensors of its size are hashed."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from attnx.parity.weights import Reference


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(2, 9), columns=st.integers(2, 9), seed=st.integers(0, 2**16))
def test_a_graph_tensor_is_found_as_it_is_or_transposed_and_an_edit_is_not(rows, columns, seed):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((rows, columns)).astype(np.float32)
    reference = Reference({"w": weight, "bias": rng.standard_normal(columns).astype(np.float32)})
    assert reference.exact(weight.copy()) == ["w"]
    assert reference.exact(np.ascontiguousarray(weight.T)) == ["w"]
    edited = weight.copy()
    edited[rng.integers(rows), rng.integers(columns)] += 1
    assert reference.exact(edited) == []


def test_tensors_of_another_size_are_never_hashed(monkeypatch):
    import attnx.parity.weights as weights

    hashed: list[int] = []
    digest = weights._digest
    monkeypatch.setattr(weights, "_digest", lambda array: hashed.append(array.size) or digest(array))
    big, small = np.ones((64, 32), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    reference = Reference({"big": big, "small": small})
    assert reference.exact(small.copy()) == ["small"]
    assert set(hashed) == {6}
