"""Repeated layers (attnx.exporter.repeat): which layers are alike, which are converted, and graphs with
stamped layers that compute the Hugging Face model's forward and decode its state layer by layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from attnx.exporter import repeat
from attnx.exporter.repeat import _prototypes, find_stack, kind

pytest.importorskip("transformers")


@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=30))
def test_every_layer_is_stamped_from_a_converted_layer_of_its_kind(kinds):
    prototypes = _prototypes(kinds)
    prefix = max(prototypes) + 1
    firsts = {k: kinds.index(k, 1) for k in set(kinds[1:])}
    assert prefix == max(firsts.values(), default=0) + 1  # no layer converted that need not be
    for layer, prototype in enumerate(prototypes):
        assert kinds[prototype] == kinds[layer]
        assert prototype == layer if layer < prefix else 1 <= prototype < prefix


class _Layer(nn.Module):
    def __init__(self, width: int, layer_idx: int, window: int = 4) -> None:
        super().__init__()
        self.proj, self.layer_idx, self.window = nn.Linear(width, width), layer_idx, window


def test_layers_are_alike_by_classes_shapes_and_attributes_not_by_their_index():
    assert kind(_Layer(8, 0)) == kind(_Layer(8, 5))
    assert kind(_Layer(8, 0)) != kind(_Layer(16, 0))
    assert kind(_Layer(8, 0)) != kind(_Layer(8, 0, window=8))
    cleared = _Layer(8, 1)
    cleared.stepping = None  # a slot decoding set and cleared: as unset
    assert kind(cleared) == kind(_Layer(8, 2))


# Qwen3.5's pattern twice: layers 4-7 are stamped from layers 2 (linear attention) and 3 (attention)
LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]


@pytest.fixture(scope="module")
def eight_layers(tmp_path_factory):
    """An 8-layer Qwen3.5 test hybrid (random weights) as ``attnx export --from hf:DIR`` builds it."""
    from attnx.exporter.module import build_module, from_source
    from attnx.testing import hf_hybrid

    hf_hybrid.pure_torch_gated_delta()
    model = hf_hybrid.build("qwen3_5", num_hidden_layers=8, layer_types=LAYER_TYPES * 2).eval()
    directory = tmp_path_factory.mktemp("qwen3_5x8")
    model.save_pretrained(directory)
    return model, build_module(from_source(f"hf:{directory}"))


def _session(proto, assembly):
    import onnxruntime as ort

    from attnx.exporter.assemble import every_op
    from attnx.exporter.lowering import lower
    from attnx.recipes import ExportSettings

    settings = ExportSettings()
    lowered = lower(proto, every_op(assembly), settings.lowering, settings.target)
    return ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])


def _hf_logits(model, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    with torch.no_grad():
        given = {"attention_mask": torch.from_numpy(mask)} if mask is not None else {}
        return model(input_ids=torch.from_numpy(ids), **given).logits.numpy()


def test_the_prefix_is_the_first_four_layers(eight_layers):
    _, assembly = eight_layers
    stack = find_stack(assembly.adapted)
    assert stack is not None and stack.prefix == 4
    assert stack.prototypes == (0, 1, 2, 3, 2, 2, 2, 3)


@pytest.fixture
def stamped(monkeypatch):
    """The stampings done during a test."""
    done = []

    def spy(model, stamping):
        repeat.stamp(model, stamping)
        done.append(stamping)

    monkeypatch.setattr("attnx.exporter.trace.stamp", spy)
    return done


def _model_graph(assembly):
    from attnx.exporter.source import UserModule
    from attnx.recipes import ExportSettings

    source = UserModule(None, ExportSettings(), verified=False)
    return source.trace(assembly, source.shapes(assembly), None)


def test_a_stamped_model_graph_computes_the_forward(eight_layers, stamped):
    model, assembly = eight_layers
    proto = _model_graph(assembly)
    assert len(stamped) == 1, "the 8-layer model was not stamped"
    assert sum(n.op_type == "GatedDeltaRule" for n in proto.graph.node) == 6
    session = _session(proto, assembly)
    rng = np.random.default_rng(7)
    for n in (5, 37):
        ids = rng.integers(0, 200, (2, n))
        mask = np.ones((2, n), bool)
        mask[1, :3] = False  # a left-padded row
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        got = session.run(None, {"input_ids": ids, "attention_mask": mask, "position_ids": positions})[0]
        expected = _hf_logits(model, ids, mask.astype(np.int64))
        np.testing.assert_allclose(got[0], expected[0], atol=1e-4, rtol=0)
        np.testing.assert_allclose(got[1, 3:], expected[1, 3:], atol=1e-4, rtol=0)


def test_a_stamped_decode_graph_carries_each_layers_own_state(eight_layers, stamped):
    from attnx.decode.export import layout_of, stamped_step_graph
    from attnx.exporter.assemble import every_op

    model, assembly = eight_layers
    layout = layout_of(assembly)
    proto = stamped_step_graph(assembly, layout, True, every_op(assembly), 18, None)
    assert proto is not None and len(stamped) == 1, "the 8-layer decode graph was not stamped"
    assert [i.name for i in proto.graph.input] == [s.name for s in layout.inputs(True)]
    assert [o.name for o in proto.graph.output] == [s.name for s in layout.outputs(True)]
    session = _session(proto, assembly)
    ids = np.random.default_rng(11).integers(0, 200, (2, 21))
    n = 17  # the prompt; then four one-token steps, each reading every layer's state from the last
    feed = {"input_ids": ids[:, :n], "past_length": np.zeros(1, np.int64)}
    for graph_input in session.get_inputs()[2:]:
        dims = [2 if d == "batch" else 0 if isinstance(d, str) else d for d in graph_input.shape]
        feed[graph_input.name] = np.zeros(dims, np.float32)
    expected = _hf_logits(model, ids)
    names = [o.name for o in session.get_outputs()]
    for end in range(n, ids.shape[1] + 1):
        got = dict(zip(names, session.run(None, feed), strict=True))
        np.testing.assert_allclose(got["logits"][:, -1], expected[:, end - 1], atol=1e-4, rtol=0)
        feed = {"input_ids": ids[:, end : end + 1], "past_length": got["present_length"]}
        feed |= {
            name.replace("present.", "past.", 1): v for name, v in got.items() if name.startswith("present.")
        }


def test_a_graph_that_does_not_stamp_is_converted_whole(eight_layers, monkeypatch):
    def refuse(model, stamping):
        raise repeat.NotStampable("for the test")

    monkeypatch.setattr("attnx.exporter.trace.stamp", refuse)
    _, assembly = eight_layers
    proto = _model_graph(assembly)
    assert sum(n.op_type == "GatedDeltaRule" for n in proto.graph.node) == 6
    assert len(find_stack(assembly.adapted).owner.layers) == 8  # the whole stack is back
