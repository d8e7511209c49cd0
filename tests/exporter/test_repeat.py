"""Repeated layers (attnx.exporter.repeat): which layers are alike, which are converted, and graphs with
stamped layers that compute the Hugging Face model's forward and decode its state layer by layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from attnx.errors import AttnxError
from attnx.exporter import repeat
from attnx.exporter.repeat import _prototypes, find_stack

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


class _Block(nn.Module):
    def __init__(self, adapters: nn.ModuleList) -> None:
        super().__init__()
        self.proj, self.adapters = nn.Linear(8, 8), adapters

    def forward(self, x: torch.Tensor, adapter: int | None) -> torch.Tensor:
        y = x + torch.relu(self.proj(x))
        return y if adapter is None else y + self.adapters[adapter](y)


class _Stack(nn.Module):
    """Six blocks; ``choose(i)``: the shared adapter block ``i`` is called with (Zamba2's way), or None."""

    def __init__(self, choose) -> None:
        super().__init__()
        adapters = nn.ModuleList(nn.Linear(8, 8) for _ in range(6))
        self.embed, self.layers, self.choose = (
            nn.Linear(4, 8),
            nn.ModuleList(_Block(adapters) for _ in range(6)),
            choose,
        )

    def repeated_layers(self):
        return self, "layers"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for i, layer in enumerate(self.layers):
            h = layer(h, self.choose(i))
        return h


class _Root(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def _stack_of(choose):
    module = _Stack(choose).eval()
    program = torch.export.export(_Root(module), (torch.randn(2, 3, 4),), strict=False)
    return find_stack(module, program, "module")


def test_layers_are_alike_when_their_traced_nodes_are():
    assert _stack_of(lambda i: None).prototypes == (0, 1, 1, 1, 1, 1)


def test_a_constant_the_caller_passes_a_layer_makes_it_another_kind():
    assert _stack_of(lambda i: i % 2).prototypes == (0, 1, 2, 1, 2, 1)  # adapters 0, 1, 0, 1, ...
    assert _stack_of(lambda i: i) is None  # each layer its own adapter: nothing repeats


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
    stack = assembly.layer_stack()
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


@pytest.mark.parametrize("refusal", [repeat.NotStampable, pytest.param(AttnxError, marks=pytest.mark.slow)])
def test_a_graph_that_does_not_stamp_is_converted_whole(eight_layers, monkeypatch, refusal):
    def refuse(model, stamping):
        raise refusal("for the test")

    monkeypatch.setattr("attnx.exporter.trace.stamp", refuse)
    _, assembly = eight_layers
    proto = _model_graph(assembly)
    assert sum(n.op_type == "GatedDeltaRule" for n in proto.graph.node) == 6
    assert len(assembly.layer_stack().owner.layers) == 8  # the whole stack is back
