"""onnxruntime-genai decoders: genai.onnx computes the full forward, and genai generates what attnx does."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import attnx
from attnx.decode.model import DecodeLayout
from attnx.decode.parity import DECODE_PARITY, STEPS, decode_cases
from attnx.exporter.assemble import assemble
from attnx.exporter.directory import ExportDir
from attnx.exporter.layout import read_before_written
from attnx.exporter.manifest import DecodeSection, GraphIO, StatePair
from attnx.models.spec import TensorSpec
from attnx.parity.backends import BACKENDS
from attnx.parity.check import Cases
from attnx.parity.runners import Graph
from attnx.serve.genai import (
    blocker,
    conv_cache,
    genai_config,
    genai_state,
    position_input,
    shared_shape,
)
from attnx.serve.genai_parity import GENAI_PARITY, genai_positions
from attnx.serve.kv_buffer import BUFFER_AXIS
from attnx.state import GROWING
from tests.conftest import TINY
from tests.helpers import run_cli
from tests.models.cases import capabilities, decoders, one_per_kind

VARIANTS = one_per_kind(decoders())  # one variant per kind of state in the default run


def full_logits(out, ids: np.ndarray) -> np.ndarray:
    """The reference: model.onnx's full forward over the whole sequence."""
    session = ort.InferenceSession(str(out / "model.onnx"))
    return session.run(["logits"], {"input_ids": ids})[0]


def zero_state(session: ort.InferenceSession, batch: int, capacity: int) -> dict[str, np.ndarray]:
    """genai's empty state: every input but the tokens and positions zero, a KV cache of length 0, or a KV
    buffer of ``capacity`` positions where past and present share it."""
    state, sizes = {}, {"batch": batch, BUFFER_AXIS: capacity}
    for spec in session.get_inputs():
        if spec.name not in ("input_ids", "position_ids"):
            shape = [sizes.get(d, 0) if isinstance(d, str) else d for d in spec.shape]
            state[spec.name] = np.zeros(shape, dtype=np.float32)
    return state


def genai_feeds(config: dict) -> dict[str, str]:
    """genai output -> input, by the name templates of genai_config.json (as genai pairs them)."""
    decoder, feeds = config["model"]["decoder"], {}
    for key, template in decoder["outputs"].items():
        if key.startswith("present_"):
            past = decoder["inputs"][key.replace("present_", "past_", 1)]
            feeds.update({template % i: past % i for i in range(decoder["num_hidden_layers"])})
    return feeds


@pytest.mark.parametrize("variant", VARIANTS)
def test_genai_graph_computes_the_full_forward(serve_export, variant):
    """Drive genai.onnx in ONNX Runtime the way genai does (position_ids, state fed back by the config's
    name templates)."""
    out = serve_export(variant)
    session = ort.InferenceSession(str(out / "genai.onnx"))
    names = [o.name for o in session.get_outputs()]
    feeds = genai_feeds(json.loads((out / "genai_config.json").read_text()))
    for batch, prompt, total in [(1, 1, 6), (2, 5, 9)]:
        ids = np.random.default_rng(prompt).integers(0, 50, size=(batch, total))
        expected = full_logits(out, ids)
        state, start = zero_state(session, batch, total), 0
        for stop in [prompt, *range(prompt + 1, total + 1)]:
            positions = np.broadcast_to(np.arange(start, stop), (batch, stop - start))
            feed = {"input_ids": ids[:, start:stop], "position_ids": np.ascontiguousarray(positions), **state}
            outputs = dict(zip(names, session.run(None, feed), strict=True))
            np.testing.assert_allclose(outputs["logits"], expected[:, start:stop], atol=2e-5, rtol=1e-4)
            state = {feeds[k]: v for k, v in outputs.items() if k != "logits"}
            assert set(state) == set(zero_state(session, batch, total))  # every output feeds an input back
            start = stop


GENAI_NAMES = {  # onnxruntime-genai 0.18's model builder: names and config keys per kind of layer
    "kv-cache": {"past_key_values.%d.key": "past_key_names", "past_key_values.%d.value": "past_value_names"},
    "recurrent": {"past.%d.recurrent": "past_recurrent_names", "past.%d.conv": "past_conv_names"},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_genai_names_and_config(serve_export, variant):
    out = serve_export(variant)
    graph = onnx.load(str(out / "genai.onnx"), load_external_data=False).graph
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    config = json.loads((out / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "decoder" and decoder["filename"] == "genai.onnx"
    shared = capabilities(variant).decode == "kv-cache"  # genai holds a KV cache in one buffer
    assert decoder["num_hidden_layers"] == 2 and config["search"]["past_present_share_buffer"] is shared
    assert config["model"]["eos_token_id"] == 1  # "</s>" of the tokenizer
    names = GENAI_NAMES[capabilities(variant).decode]
    assert set(shapes) == {"input_ids", "position_ids"} | {name % i for i in (0, 1) for name in names}
    assert {key: decoder["inputs"][key] for key in names.values()} == {v: k for k, v in names.items()}
    manifest = ExportDir.open(out).manifest
    assert {"genai", "genai_config", "tokenizer", "tokenizer_config"} <= set(manifest.files)
    assert manifest.genai.shared_kv is shared
    for state in manifest.genai.state:  # what each genai tensor carries, from the layer's roles
        carried = [s for s in manifest.decode.state if s.input in state.carries]
        assert {s.role for s in carried} <= {state.role} and state.past in shapes
        if len(carried) == 1:  # one tensor (a gated layer's S, its conv carry) is carried as it is
            buffer = [BUFFER_AXIS if axis == GROWING else axis for axis in carried[0].axes[1:]]
            assert shapes[state.past][1:] == buffer if shared else list(carried[0].axes[1:])
        elif state.role in ("recurrent", "conv") and carried:  # packed along the last axis
            assert shapes[state.past][-1] == sum(s.axes[-1] if len(s.axes) == 4 else 1 for s in carried)
    declares_conv = any(s.role == "conv" for s in manifest.decode.state)
    if capabilities(variant).decode == "recurrent" and not declares_conv:
        assert shapes["past.0.conv"] == ["batch", 1, 1]  # the placeholder genai needs: no conv declared


def genai_greedy(out, prompt: list[int], new: int) -> list[int]:
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([prompt], dtype=np.int32))
    tokens: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


@pytest.mark.parametrize("variant", VARIANTS)
def test_genai_generates_what_attnx_generates(serve_export, variant):
    out = serve_export(variant)
    eos = json.loads((out / "genai_config.json").read_text())["model"]["eos_token_id"]
    for prompt in ([7], [3, 9, 4, 12, 5, 6, 2]):
        tokens = genai_greedy(out, prompt, 12)
        expected = attnx.generate(out, prompt, 12).tokens
        assert tokens == expected[: len(tokens)]
        assert len(tokens) == 12 or tokens[-1] == eos  # genai stops early only at the end token


def test_genai_follows_forced_tokens_at_every_position(serve_export):
    """genai's own logits for a forced continuation equal the full forward's (catches a wrong position)."""
    og = pytest.importorskip("onnxruntime_genai")
    out = serve_export("linear")
    ids = np.random.default_rng(5).integers(2, 50, size=(1, 11))
    expected = full_logits(out, ids)[0]
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32)
    generator = og.Generator(model, params)
    generator.append_tokens(ids[:, :4].astype(np.int32))
    for position in range(4, 11):
        logits = generator.get_output("logits")[0, -1]
        np.testing.assert_allclose(logits, expected[position - 1], atol=2e-5, rtol=1e-4)
        generator.append_tokens(ids[:, position : position + 1].astype(np.int32))


@pytest.mark.parametrize("variant", ["softmax", "linear"])
def test_verify_rechecks_genai_onnx_against_the_torch_model(serve_export, variant):
    report = attnx.verify(serve_export(variant), seq_lens=[1, 6], write=False)
    genai = next(r for r in report.backends if r.backend == "ort-cpu genai")
    assert genai.status == "passed"
    assert [c.output for c in genai.comparisons][:2] == ["prefill logits", "logits @ 1"]
    assert len(genai.comparisons) == 2 * (1 + STEPS)  # the prompt and each decoded position, per length


def test_genai_parity_fails_where_the_logits_differ(serve_export):
    """The rows hold genai.onnx to the reference: a reference moved by 1e-2 at one position fails there."""
    export = ExportDir.open(serve_export("linear"))
    cases = Cases.make(export, [5], None, None, None)
    (run,) = decode_cases(export.manifest.decode, export.rebuild(), cases)
    run.full[:, 6] += 1e-2
    graph = Graph(export, "genai", (), (), lambda: None)
    with BACKENDS["ort-cpu"].runner(graph, None) as runner:
        state = export.manifest.genai.state
        rows = {c.output: c.passed for c in genai_positions(runner, state, run, cases.tolerance)}
    assert rows == {"prefill logits": True, "logits @ 5": True, "logits @ 6": False} | {
        f"logits @ {p}": True for p in range(7, 5 + STEPS)
    }


def test_genai_parity_reuses_the_full_forwards_decode_parity_ran(serve_export):
    """Both checks compare with the full forward at each length: after decode parity's reference phase,
    genai parity's runs the torch model no more (at real size each is a forward of the model and hundreds
    of MB of logits); on a model decode parity has not run, it runs one forward per length."""
    export = ExportDir.open(serve_export("linear"))
    cases = Cases.make(export, [3, 5], None, None, 0)
    ort_cpu = [BACKENDS["ort-cpu"]]
    calls = []
    fresh = export.rebuild()
    fresh.module.register_forward_hook(lambda *_: calls.append(1))
    GENAI_PARITY.reference(export, fresh, ort_cpu, cases)
    assert len(calls) == 2
    checked = export.rebuild()
    DECODE_PARITY.reference(export, checked, ort_cpu, cases)
    checked.module.register_forward_hook(lambda *_: calls.append(1))
    GENAI_PARITY.reference(export, checked, ort_cpu, cases)
    assert len(calls) == 2
    section = export.manifest.decode
    assert decode_cases(section, checked, cases) is decode_cases(section, checked, cases)
    assert decode_cases(section, checked, cases) is not decode_cases(section, fresh, cases)


def test_seq2seq_and_plain_exports_are_not_genai_decoders(serve_export):
    section = ExportDir.open(serve_export("softmax")).manifest.decode
    assert blocker(section) is None
    options = {**TINY, "n_decoder_layers": 1}
    seq2seq = DecodeLayout.of(assemble("softmax", "seq2seq", options, seed=0).module).describe()
    assert "decoder-only" in blocker(seq2seq)
    assert "--decode" in blocker(None)


def test_doctor_names_every_target(serve_export):
    code, stdout, stderr = run_cli(["doctor", str(serve_export("softmax")), "--json"])
    assert code == 0, stderr
    targets = {t["name"]: t["reason"] for t in json.loads(stdout)["targets"]}
    assert set(targets) == {
        "onnxruntime",
        "onnxruntime decode",
        "onnxruntime-genai",
        "triton dynamic batching",
        "triton sequence batching",
        "tensorrt",
    }
    assert targets["onnxruntime"] is None and targets["triton sequence batching"] is None


def recurrent_section(layers: dict[int, dict[str, tuple]]) -> DecodeSection:
    """A decode section of recurrent layers holding ``{layer: {role: axes}}`` float32 states, float16
    logits."""
    state = [
        StatePair(f"past.{layer}.{role}", f"present.{layer}.{role}", layer, role, role, list(axes), "float32")
        for layer, roles in layers.items()
        for role, axes in roles.items()
    ]
    tokens = TensorSpec("input_ids", "int64", ("batch", "seq"), high=50)
    io = GraphIO([tokens], [TensorSpec("logits", "float16", ("batch", "seq", 50))])
    return DecodeSection(["recurrent"] * len(layers), "input_ids", io, io, state, [], [])


def test_a_placeholder_takes_the_shape_of_its_roles_real_states():
    """genai 0.18 allocates every layer's recurrent (and conv) state with the first layer's shape: a
    placeholder takes the layers' real shape and dtype where some layer holds its role (RWKV-4: a time
    mix's WKV state beside a channel mix's lone token-shift carry), the smallest in the activations' dtype
    where none does; real states that differ are refused."""
    carry, wkv = ("batch", 8, 1), ("batch", 8, 1, 2)
    rwkv = recurrent_section({0: {"conv": carry, "recurrent": wkv}, 1: {"conv": carry}})
    placeholders = [(s.layer, s.role) for s in genai_state(rwkv) if not s.carries]
    assert placeholders == [(1, "recurrent")]
    assert shared_shape("recurrent", rwkv) == (list(wkv), "float32")
    assert shared_shape("conv", rwkv) == (list(carry), "float32")
    convs = recurrent_section({0: {"conv": carry}, 1: {"conv": carry}})  # LFM2's: no recurrent layer
    assert shared_shape("recurrent", convs) == (["batch", 1, 1, 1], "float16")
    differ = recurrent_section({0: {"conv": carry, "recurrent": wkv}, 1: {"recurrent": ("batch", 4, 1, 2)}})
    assert "recurrent states differ in shape" in blocker(differ)
    assert blocker(rwkv) is None


def test_convs_alone_are_genais_lfm2_model_as_the_builder_writes_it():
    """A model whose every non-attention layer holds a conv carry alone (LFM2) gets onnxruntime-genai's
    "lfm2" model, the model builder's LFM2 contract: no recurrent placeholders, the convs told apart by
    ``layer_types``, positions from ``attention_mask``; one recurrent state anywhere keeps the generic
    decoder (position_ids, a recurrent placeholder per conv layer)."""
    carry = ("batch", 8, 2)
    convs = recurrent_section({0: {"conv": carry}, 1: {"conv": carry}})
    assert conv_cache(convs) and position_input(convs) == "attention_mask"
    assert [(s.layer, s.role) for s in genai_state(convs)] == [(0, "conv"), (1, "conv")]
    model = genai_config(convs, genai_state(convs), 64, {})["model"]
    assert model["type"] == "lfm2" and model["decoder"]["layer_types"] == ["conv", "conv"]
    assert model["decoder"]["conv_cache_size"] == 2
    assert model["decoder"]["inputs"] == {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "past_conv_names": "past.%d.conv",
    }
    mixed = recurrent_section({0: {"conv": carry, "recurrent": ("batch", 8, 1, 2)}, 1: {"conv": carry}})
    assert not conv_cache(mixed) and position_input(mixed) == "position_ids"
    model = genai_config(mixed, genai_state(mixed), 64, {})["model"]
    assert model["type"] == "decoder" and "layer_types" not in model["decoder"]
    assert model["decoder"]["inputs"]["past_recurrent_names"] == "past.%d.recurrent"
    widths = recurrent_section({0: {"conv": carry}, 1: {"conv": ("batch", 4, 2)}})
    assert "conv states differ in shape" in blocker(widths)  # genai's LFM2 cache allocates one shape too


def _kernels(model: onnx.ModelProto) -> set[str]:
    """The com.microsoft ops a graph's function bodies call."""
    return {n.op_type for f in model.functions for n in f.node if n.domain == "com.microsoft"}


def test_genai_onnx_runs_onnx_runtimes_kernels_and_records_them(serve_export):
    """genai.onnx (only ONNX Runtime runs it) takes the ort target's bodies where an op declares them,
    decode.onnx keeps the export's portable ones, and the manifest says so; an export whose ops declare
    none keeps its bodies (the numbers: the full-forward and generate tests above)."""
    out = serve_export("gated_delta")
    graphs = {
        name: onnx.load(str(out / name), load_external_data=False) for name in ("genai.onnx", "decode.onnx")
    }
    assert "LinearAttention" in _kernels(graphs["genai.onnx"]) and not _kernels(graphs["decode.onnx"])
    steps = [n for n in graphs["genai.onnx"].graph.node if n.op_type == "GatedDeltaRuleStep"]
    assert steps and all("v_heads" in n.overload for n in steps)  # the kernel's heads as they are, bound
    manifest = ExportDir.open(out).manifest
    assert manifest.target is None  # the export itself: portable
    assert manifest.genai.target.name == "ort" and manifest.genai.target.ops == ["attnx::GatedDeltaRuleStep"]
    plain = serve_export("softmax")  # its step op declares no ort body
    assert ExportDir.open(plain).manifest.genai.target is None
    assert not _kernels(onnx.load(str(plain / "genai.onnx"), load_external_data=False))


@pytest.mark.parametrize(
    ("variant", "name"),
    [
        ("softmax", "decode.onnx"),
        ("softmax", "prefill.onnx"),
        ("softmax", "genai.onnx"),
        ("gated_delta", "genai.onnx"),
    ],
)
def test_no_graph_output_is_a_copy_of_a_value_the_graph_computes(serve_export, name, variant):
    """A decode step returns its grown KV cache, and genai its recurrent and conv states, from the node that
    made them, not through a copy (an Identity, or a Concat of one tensor: ONNX Runtime copies the whole
    state for one at every step)."""
    graph = onnx.load(str(serve_export(variant) / name), load_external_data=False).graph
    produced = {o for n in graph.node for o in n.output}
    outputs = {v.name for v in graph.output}
    copies = [
        n
        for n in graph.node
        if (n.op_type == "Identity" or (n.op_type == "Concat" and len(n.input) == 1))
        and n.output[0] in outputs
    ]
    assert not [n.output[0] for n in copies if n.input[0] in produced]


def test_an_export_without_a_tokenizer_ends_at_the_models_own_end_token():
    """genai without an eos id ends at its pad id 0, a real token; so a loaded model's own ids are used
    (its generation config first, its config for what that lacks), ids outside the vocabulary dropped (genai
    refuses them), several end tokens kept as a list; a module without a config names none."""
    from types import SimpleNamespace

    from attnx.serve.genai import model_specials

    config = SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=None)
    loaded = SimpleNamespace(adapted=SimpleNamespace(config=config, generation_config=None))
    assert model_specials(loaded, 27) == {"bos_token_id": 1, "eos_token_id": 2}
    loaded.adapted.generation_config = SimpleNamespace(eos_token_id=[5, 30, 7], pad_token_id=40)
    assert model_specials(loaded, 27) == {"bos_token_id": 1, "eos_token_id": [5, 7]}
    assert model_specials(SimpleNamespace(adapted=torch.nn.Linear(2, 2)), 27) == {}
    assert model_specials(SimpleNamespace(), 27) == {}


@pytest.mark.parametrize("variant", ["gated_delta", "softmax"])
def test_genai_reads_its_states_in_place_from_one_buffer(serve_export, variant):
    """genai binds each recurrent and conv state's input and output to one buffer, and a KV cache's where
    the config shares them (past_present_share_buffer). genai.onnx reads those states without a copy where
    its nodes read them before writing them, and with both names bound to one buffer, as genai binds them,
    every step's logits are still the full forward's."""
    out = serve_export(variant)
    graph = onnx.load(str(out / "genai.onnx"), load_external_data=False).graph
    states = [v.name for v in graph.input if v.name.startswith("past")]
    assert states and not [n for n in graph.node if n.op_type == "Slice" and n.input[0] in states]
    session = ort.InferenceSession(str(out / "genai.onnx"))
    feeds = {
        past: present
        for present, past in genai_feeds(json.loads((out / "genai_config.json").read_text())).items()
    }
    ids = np.random.default_rng(11).integers(0, 50, size=(2, 9))
    expected = full_logits(out, ids)
    buffers = {name: np.ascontiguousarray(value) for name, value in zero_state(session, 2, 9).items()}
    shared = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in buffers.items()}
    start = 0
    for stop in [5, 6, 7, 8, 9]:
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids[:, start:stop]))
        positions = np.broadcast_to(np.arange(start, stop), (2, stop - start))
        binding.bind_cpu_input("position_ids", np.ascontiguousarray(positions))
        for name, buffer in shared.items():
            binding.bind_ortvalue_input(name, buffer)
            binding.bind_ortvalue_output(feeds[name], buffer)
        binding.bind_output("logits")
        session.run_with_iobinding(binding)
        logits = binding.copy_outputs_to_cpu()[-1]
        np.testing.assert_allclose(logits, expected[:, start:stop], atol=2e-5, rtol=1e-4)
        start = stop
    assert all(np.abs(array).max() > 0 for array in buffers.values())  # written where they were read


def assert_states_read_before_written(out) -> None:
    """Every recurrent and conv state of OUT's genai.onnx is read, by every node that reads it, before the
    node writing its output runs, by the graph's data dependencies (genai binds the two to one buffer)."""
    model = onnx.load(str(out / "genai.onnx"), load_external_data=False)
    states = [v.name for v in model.graph.input if v.name.startswith("past.")]
    assert states
    late = [s for s in states if not read_before_written(model, s, s.replace("past.", "present.", 1))]
    assert not late, f"read after genai's buffer may be written: {late}"


@pytest.mark.parametrize("variant", ["cosformer", "gated_delta"])  # two packed tensors; a conv and a state
def test_every_state_is_read_before_genai_writes_it(serve_export, variant):
    assert_states_read_before_written(serve_export(variant))
