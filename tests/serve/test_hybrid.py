"""A hybrid model (Qwen3-Next's shape): KV-cache layers between recurrent layers with a convolution carry.

Each layer's state is its own declaration, so one export mixes kinds: the manifest, ``attnx generate``,
the onnxruntime-genai layout and the Triton config derive layer by layer. The recurrent layers are
the seeded decode plugin's sound control (a causal depthwise convolution, whose carry is a ``conv``
state, then running linear attention with a ``recurrent`` state); the others are softmax's KV cache.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import attnx
from attnx.exporter.directory import ExportDir
from attnx.registry import Registry, set_registry
from attnx.serve.triton import plan_model
from attnx.variant import AttentionSpec
from tests.decode.test_runtime import check_bound_decoding
from tests.serve.test_genai import genai_greedy
from tests.testing import seeded_decode_plugins

KINDS = ["seeded_decode_sound", "softmax", "seeded_decode_sound"]


class Hybrid(nn.Module):
    """A user's causal LM of attnx layers of two kinds (pre-norm residuals, learned positions)."""

    def __init__(self) -> None:
        super().__init__()
        registry = attnx.get_registry()
        spec = AttentionSpec(32, 2, causal=True)
        self.embed, self.positions, self.head = nn.Embedding(40, 32), nn.Embedding(64, 32), nn.Linear(32, 40)
        self.norms = nn.ModuleList(nn.LayerNorm(32) for _ in KINDS)
        self.layers = nn.ModuleList(
            registry.variant(name).load().build(registry.variant(name).make_config({}), spec)
            for name in KINDS
        )

    def forward(self, input_ids: torch.Tensor, past_length: torch.Tensor | None = None) -> torch.Tensor:
        start = 0 if past_length is None else past_length
        x = self.embed(input_ids) + self.positions(torch.arange(input_ids.shape[1]) + start)
        for norm, layer in zip(self.norms, self.layers, strict=True):
            x = x + layer(norm(x))
        return self.head(x)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """(the module, OUT of its verified decode export)."""
    previous = set_registry(Registry(plugins=[("seeded_decode", seeded_decode_plugins, "test")]))
    try:
        torch.manual_seed(4)
        model = Hybrid().eval()
        out = tmp_path_factory.mktemp("hybrid") / "out"
        options = {"export.decode": True, "verify.seq_lens": [1, 6]}
        result = attnx.export_module(model, {"input_ids": torch.randint(0, 40, (2, 9))}, out, options=options)
        assert result.parity.passed, result.parity.to_dict()
        statuses = {b.backend: b.status for b in result.parity.backends}
        assert statuses == {"ort-cpu": "passed", "torch decode": "passed", "ort-cpu decode": "passed",
                            "ort-cpu genai": "passed"}  # fmt: skip
        yield model, out
    finally:
        set_registry(previous)


def test_each_layer_declares_its_own_state(hybrid):
    _, out = hybrid
    section = ExportDir.open(out).manifest.decode
    assert section.layers == ["recurrent", "kv-cache", "recurrent"]
    assert section.summary() == "hybrid state: 1 kv-cache + 2 recurrent layers"
    roles = {(s.layer, s.name): (s.role, s.axes) for s in section.state if s.layer is not None}
    assert roles == {
        (0, "conv"): ("conv", ["batch", 32, 2]),
        (0, "recurrent"): ("recurrent", ["batch", 2, 16, 16]),
        (1, "key"): ("key", ["batch", 2, "past_seq", 16]),
        (1, "value"): ("value", ["batch", 2, "past_seq", 16]),
        (2, "conv"): ("conv", ["batch", 32, 2]),
        (2, "recurrent"): ("recurrent", ["batch", 2, 16, 16]),
    }


def test_generate_matches_a_greedy_loop_of_the_module_and_genai_follows(hybrid):
    """attnx generate (ONNX Runtime, state fed back by the manifest) equals a greedy loop through the
    module's own full forward; genai 0.18 (its own runtime) generates the same tokens."""
    model, out = hybrid
    prompt = [5, 1, 7, 30]
    generated = attnx.generate(out, prompt, max_new_tokens=12).tokens
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert generated == ids[len(prompt) :]
    assert len(set(generated)) > 1  # a sequence whose next token depends on the state
    tokens = genai_greedy(out, prompt, 12)
    eos = json.loads((out / "genai_config.json").read_text())["model"]["eos_token_id"]
    assert tokens == generated[: len(tokens)] and (len(tokens) == 12 or tokens[-1] in (eos or [0]))


def test_bound_greedy_decoding_of_a_batch_equals_the_numpy_loop_and_the_full_forward(hybrid):
    """ONNX Runtime IO binding carries the KV cache, the recurrent state and the conv carry between
    steps as ``OrtValue``s (tests/decode/test_runtime.py)."""
    model, out = hybrid

    def forward(ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(ids)).numpy()

    check_bound_decoding(out, forward, 40)


def test_genai_logits_follow_the_full_forward_with_every_state_fed_back(hybrid):
    """genai's own logits for a forced continuation equal the module's full forward at every position:
    it feeds back the KV cache, the recurrent state and the convolution carry."""
    og = pytest.importorskip("onnxruntime_genai")
    model, out = hybrid
    ids = np.random.default_rng(5).integers(2, 40, size=(1, 11))
    with torch.no_grad():
        expected = model(torch.from_numpy(ids))[0].numpy()
    config = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert {k: v for k, v in config["inputs"].items() if k.startswith("past_")} == {
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
        "past_recurrent_names": "past.%d.recurrent",
        "past_conv_names": "past.%d.conv",
    }
    genai = og.Model(str(out))
    params = og.GeneratorParams(genai)
    params.set_search_options(max_length=32)
    generator = og.Generator(genai, params)
    generator.append_tokens(ids[:, :3].astype(np.int32))
    for position in range(3, 11):
        logits = generator.get_output("logits")[0, -1]
        np.testing.assert_allclose(logits, expected[position - 1], atol=2e-5, rtol=1e-4)
        generator.append_tokens(ids[:, position : position + 1].astype(np.int32))


def test_triton_carries_each_layers_state(hybrid):
    """Sequence batching: an implicit state per declared tensor; only the KV cache's axis is variable."""
    _, out = hybrid
    plan = plan_model(ExportDir.open(out), "hybrid", "auto", None, 1)
    assert plan.batching == "sequence"
    dims = {s.input: s.dims for s in plan.states}
    assert dims == {
        "past_length": (1,),
        "past.0.conv": (1, 32, 2),
        "past.0.recurrent": (1, 2, 16, 16),
        "past.1.key": (1, 2, -1, 16),
        "past.1.value": (1, 2, -1, 16),
        "past.2.conv": (1, 32, 2),
        "past.2.recurrent": (1, 2, 16, 16),
    }


# transformers.js's names of the hybrid's state (layers 0 and 2 recurrent, 1 a KV cache) as Qwen3-Next's and
# as OLMo Hybrid's, whose conv carry it splits along the channels (32 here) into query, key and value parts
OLMO_SHAPE = SimpleNamespace(
    linear_num_key_heads=2, linear_key_head_dim=4, linear_num_value_heads=2, linear_value_head_dim=8
)
JS_STATE = {
    "qwen3_next": lambda i: [f"past_conv.{i}", f"past_recurrent.{i}"],
    "olmo_hybrid": lambda i: (
        [f"past_conv.{i}.{part}" for part in ("query", "key", "value")] + [f"past_recurrent.{i}"]
    ),
}


@pytest.mark.parametrize("model_type", list(JS_STATE))
def test_the_transformers_js_layout_driven_as_transformers_js_follows_the_full_forward(
    hybrid, model_type, tmp_path
):
    """The decode graph under transformers.js's names (conv whole or in parts, packed recurrent, KV cache,
    batch axis batch_size), fed back by transformers.js's own renaming rule, computes the module's
    forward."""
    import onnx
    import onnxruntime as ort

    from attnx.serve.genai import decoder_layout, genai_state
    from attnx.serve.transformers_js import BATCH, family, split_conv, state_names
    from tests.serve.test_transformers_js import empty_cache, past_name

    model, out = hybrid
    section = ExportDir.open(out).manifest.decode
    state = genai_state(section, state_names(model_type))
    parts = family(model_type).conv_parts
    if parts is not None:
        state = split_conv(state, section, parts(OLMO_SHAPE))
    laid_out = decoder_layout(onnx.load(str(out / "decode.onnx")), section, state, BATCH)
    expected_names = {"past_key_values.1.key", "past_key_values.1.value", *JS_STATE[model_type](0)}
    assert {s.past for s in state} == expected_names | set(JS_STATE[model_type](2))
    onnx.save(laid_out, tmp_path / "tjs.onnx")
    session = ort.InferenceSession(str(tmp_path / "tjs.onnx"))
    ids = np.random.default_rng(6).integers(2, 40, size=(1, 12))
    with torch.no_grad():
        full = model(torch.from_numpy(ids)).numpy()
    cache, start = empty_cache(session, {s.past for s in state}), 0
    for stop in [5, *range(6, 13)]:
        feeds = {"input_ids": ids[:, start:stop], "position_ids": np.arange(start, stop)[None], **cache}
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
        np.testing.assert_allclose(outputs["logits"], full[:, start:stop], atol=2e-5, rtol=1e-4)
        cache = {past_name(name): value for name, value in outputs.items() if name.startswith("present")}
        start = stop


def test_a_conv_split_into_parts_of_other_widths_is_refused(hybrid):
    from attnx.errors import AttnxError
    from attnx.serve.genai import genai_state
    from attnx.serve.transformers_js import split_conv, state_names

    section = ExportDir.open(hybrid[1]).manifest.decode
    state = genai_state(section, state_names("olmo_hybrid"))
    with pytest.raises(AttnxError, match="layer 0's conv carry has 32 channels, not the 40 of"):
        split_conv(state, section, {"query": 8, "key": 8, "value": 24})
