"""seq2seq decoding with cached cross-attention keys/values.

Prefill projects the encoder output through each decoder layer's cross k/v projections once and
returns the per-head keys/values; decode takes them as context and projects only its own query.
The references here are independent: the encoder output captured from the full forward with a hook,
projected by hand from the layer's weights, and the full forward's logits at every position.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from attnx.decode.export import DECODE_GRAPHS
from attnx.decode.model import DecodeLayout, StepModel, caches_cross
from attnx.decode.runtime import open_stepper
from attnx.exporter import export as steps
from attnx.exporter.assemble import assemble
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import ContextInput
from attnx.plugins.softmax import SoftmaxConfig
from attnx.plugins.softmax.kernel import SoftmaxAttentionLayer
from attnx.recipes import resolve
from tests.decode.conftest import lm_options
from tests.decode.test_decode_lm import full_logits, step_logits
from tests.helpers import assert_one_line_error, run_cli

# (self, cross) variants exported through the CLI with decode parity; (cosformer, softmax) is in
# test_decode_export. cosFormer's cross step needs the queries' target positions (attend_cross_step).
# test_decode_lm runs every (self, cross) pair in torch.
PAIRS = [("linear", "cosformer"), pytest.param("softmax", "linear", marks=pytest.mark.slow)]
SOURCE_AXIS = "src_seq"


def source_projections(path) -> list[onnx.NodeProto]:
    """Top-level MatMul/Gemm nodes multiplying a tensor with a ``src_seq`` axis by a weight (initializer)."""
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
    weights = {t.name for t in graph.initializer}
    values = [*graph.input, *graph.value_info, *graph.output]
    axes = {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim] for v in values}
    return [
        node
        for node in graph.node
        if node.op_type in ("MatMul", "Gemm")
        and weights & set(node.input)
        and any(SOURCE_AXIS in axes.get(name, []) for name in node.input)
    ]


def padded_source(batch=2, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (batch, n), generator=g)
    return ids, torch.arange(n) < torch.tensor([[n], [4]])[:batch]


@pytest.mark.parametrize(("variant", "cross"), PAIRS)
def test_cross_variants_pass_decode_parity_on_torch_and_ort(decode_export, variant, cross):
    out, stdout = decode_export(variant, "seq2seq", cross)
    assert "parity: PASSED on ort-cpu, torch decode, ort-cpu decode" in stdout
    manifest = ExportDir.open(out).manifest
    assert manifest.cross_variant == cross
    rows = {b["backend"]: b["comparisons"] for b in json.loads((out / "parity.json").read_text())["backends"]}
    assert all(r["passed"] for r in rows["ort-cpu decode"]) and len(rows["ort-cpu decode"]) == 2 * 5


def test_verify_reruns_seq2seq_decode_parity(decode_export):
    out, _ = decode_export("linear", "seq2seq", "cosformer")
    argv = ["verify", str(out), "--seq-lens", "2,5", "--json", "--seed", "9", "--no-write"]
    code, stdout, stderr = run_cli(argv)
    assert code == 0, stderr
    statuses = {b["backend"]: b["status"] for b in json.loads(stdout)["backends"]}
    assert statuses == {"ort-cpu": "passed", "torch decode": "passed", "ort-cpu decode": "passed"}


@pytest.mark.parametrize(("variant", "cross"), [("cosformer", None), *PAIRS])
def test_decode_graph_reads_cached_keys_values_and_projects_no_source(decode_export, variant, cross):
    out, _ = decode_export(variant, "seq2seq", cross)
    entry = ExportDir.open(out).manifest.decode
    cached = [f"cross.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert [c.input for c in entry.context] == [*cached, "attention_mask"]
    graph = onnx.load(str(out / "decode.onnx")).graph
    inputs = [v.name for v in graph.input]
    assert "encoder_hidden_states" not in inputs and set(cached) <= set(inputs)
    assert source_projections(out / "decode.onnx") == []
    # the cached tensors go straight into the attention ops, never through a MatMul (a Shape node
    # may read one: decode.onnx takes any number of new tokens, so some sizes are computed)
    readers = {(node.domain, node.op_type) for node in graph.node if set(node.input) & set(cached)}
    assert {domain for domain, op in readers if op != "Shape"} == {"attnx"}
    # prefill is where the cross k/v projections (2 per decoder layer) and the encoder's run
    assert len(source_projections(out / "prefill.onnx")) >= 2 * 2 + 6
    prefill_outputs = [v.name for v in onnx.load(str(out / "prefill.onnx")).graph.output]
    assert "encoder_hidden_states" not in prefill_outputs and set(cached) <= set(prefill_outputs)


def test_prefill_returns_the_cross_projections_of_the_encoder_output(decode_export):
    out, _ = decode_export("linear", "seq2seq", "cosformer")
    export = ExportDir.open(out)
    module = export.rebuild().module
    source, mask = padded_source()
    target = torch.randint(0, 50, (2, 3), generator=torch.Generator().manual_seed(1))
    captured = []
    hook = module.encoder.register_forward_hook(lambda mod, args, output: captured.append(output))
    with torch.inference_mode():
        module(source, mask, target, torch.ones(target.shape, dtype=torch.bool))
    hook.remove()
    (memory,) = captured  # the encoder output the full forward's cross-attention reads
    feed = {"input_ids": source.numpy(), "attention_mask": mask.numpy(), "decoder_input_ids": target.numpy()}
    with open_stepper(export) as stepper:
        ort_outputs = stepper._run("prefill", feed)
    layout = DecodeLayout.of(module)
    with torch.inference_mode():
        results = StepModel(module, layout, False)(source, mask, target)
    torch_outputs = dict(zip([s.name for s in layout.outputs(False)], results, strict=True))
    heads, d_model = 2, 32
    for i in range(2):
        layer = module.decoder.blocks[i].cross_attention
        for kv, projection in (("key", layer.k_proj), ("value", layer.v_proj)):
            flat = memory @ projection.weight.detach().T + projection.bias.detach()  # (b, src, d_model)
            expected = flat.reshape(2, 9, heads, d_model // heads).permute(0, 2, 1, 3).numpy()
            name = f"cross.{i}.{kv}"
            cached = ort_outputs[name]  # decode context: the prefill's, a NumPy array
            assert cached.shape == (2, heads, 9, d_model // heads)
            np.testing.assert_allclose(cached, expected, atol=1e-5, rtol=1e-5)
            np.testing.assert_allclose(torch_outputs[name].numpy(), expected, atol=1e-6, rtol=1e-6)


class Wrapped(nn.Module):
    """A third-party cross layer: the forward signature, but no k_proj/v_proj of its own."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x, context=None, key_padding_mask=None):
        return self.inner(x, context=context, key_padding_mask=key_padding_mask)


class Gated(SoftmaxAttentionLayer):
    """A MultiHeadAttention whose forward is not attend() between the projections: not cacheable."""

    def forward(self, x, context=None, key_padding_mask=None):
        return torch.tanh(super().forward(x, context, key_padding_mask))


def seq2seq(variant="linear", cross="softmax", seed=3, **overrides):
    options = lm_options(variant, **{"n_decoder_layers": 2, **overrides})
    return assemble(variant, "seq2seq", options, seed=seed, cross_variant=cross)


@pytest.mark.slow  # a fallback no built-in model takes; the cached path is tested by default
def test_a_cross_layer_that_cannot_be_cached_falls_back_to_the_encoder_output(tmp_path):
    """The documented fallback: decode takes encoder_hidden_states and re-runs the layer (old contract)."""
    assembly = seq2seq()
    for block in assembly.module.decoder.blocks:
        block.cross_attention = Wrapped(block.cross_attention)
    layout = DecodeLayout.of(assembly.module)
    assert layout.memory and layout.cross == ()
    assert [c.name for c in layout.context()] == ["encoder_hidden_states", "attention_mask"]
    job = steps.ExportJob(resolve(model="seq2seq", options={"export.decode": True}), tmp_path / "out")
    (tmp_path / "out").mkdir()
    export = steps.write(assembly, job, tmp_path / "out", [DECODE_GRAPHS])
    assert export.manifest.decode.context[0] == ContextInput("encoder_hidden_states", "prefill output")
    source, mask = padded_source(seed=4)
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(5))
    expected = full_logits(assembly, ids, (source, mask)).numpy()
    with open_stepper(export) as stepper:
        logits, state = stepper.prefill(
            ids[:, :3].numpy(), {"input_ids": source.numpy(), "attention_mask": mask.numpy()}
        )
        rows = [logits]
        for t in range(3, 7):
            logits, state = stepper.decode(ids[:, t : t + 1].numpy(), state)
            rows.append(logits)
    np.testing.assert_allclose(np.concatenate(rows, 1), expected, atol=1e-4, rtol=1e-3)
    assert (
        len(source_projections(tmp_path / "out" / "decode.onnx")) == 2 * 2
    )  # what the cached graphs no longer do


def test_an_overridden_forward_is_not_cached_and_still_decodes():
    assembly = seq2seq(cross="softmax")
    for block in assembly.module.decoder.blocks:
        gated = Gated(SoftmaxConfig(), block.cross_attention.spec)
        gated.load_state_dict(block.cross_attention.state_dict())
        block.cross_attention = gated
    assert not caches_cross(assembly.module.decoder.blocks[0].cross_attention)
    assert DecodeLayout.of(assembly.module).memory
    source = padded_source(seed=6)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(6))
    stepped, _ = step_logits(assembly, ids, 2, source)
    torch.testing.assert_close(stepped, full_logits(assembly, ids, source), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("structure", "caches"),
    [({"share_layers": True}, 1), ({"reversible": True}, 3), ({"ff_chunks": 2}, 3)],
)
@pytest.mark.parametrize("cross", ["softmax", "cosformer"])
def test_every_layer_structure_decodes_with_one_cache_per_cross_module(structure, caches, cross):
    """Shared layers share one cross module, so one cached key/value pair serves every layer."""
    assembly = seq2seq("softmax", cross, n_decoder_layers=3, **structure)
    layout = DecodeLayout.of(assembly.module)
    assert [c.layer for c in layout.cross] == list(range(caches))
    cached = [f"cross.{i}.{kv}" for i in range(caches) for kv in ("key", "value")]
    assert [s.name for s in layout.made()] == cached
    source = padded_source(seed=8)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(8))
    stepped, _ = step_logits(assembly, ids, 4, source)
    torch.testing.assert_close(stepped, full_logits(assembly, ids, source), atol=1e-5, rtol=1e-4)


def test_fp16_cached_keys_values_follow_the_activations():
    options = lm_options("linear", n_decoder_layers=2)
    assembly = assemble("linear", "seq2seq", options, seed=0, cross_variant="cosformer", dtype="fp16")
    layout = DecodeLayout.of(assembly.module)
    made = {s.name: s.dtype for s in layout.made()}
    assert made == {f"cross.{i}.{kv}": "float16" for i in range(2) for kv in ("key", "value")}
    source, mask = padded_source()
    with torch.inference_mode():
        _, *made_tensors = StepModel(assembly.module, layout, False)(source, mask, source[:, :2])[:5]
    assert {t.dtype for t in made_tensors} == {torch.float16}
    assert {s.tensor.dtype for s in layout.layer_slots} == {"float32"}  # the recurrent sums stay float32


def test_cosformer_cross_without_a_fixed_m_is_refused_in_one_line(tmp_path):
    """A seq2seq gets cosFormer's default context length as M; a user who unsets it cannot decode."""
    out = tmp_path / "out"
    settings = {**lm_options("linear"), "cross.max_len": "none"}
    options = [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]
    args = ["export", "--model", "seq2seq", "--variant", "linear", "--cross-variant", "cosformer", "--decode"]
    code, _, stderr = run_cli([*args, "-o", str(out), *options])
    assert_one_line_error(
        code, stderr, "cross-attention decodes token by token only with a fixed M", "cross.max_len"
    )
    assert list(tmp_path.iterdir()) == []


def tampered(out, tmp_path, change):
    """A copy of export ``out`` whose manifest's decode entry went through ``change``."""
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    data = json.loads((copy / "attnx.json").read_text())
    change(data["decode"])
    (copy / "attnx.json").write_text(json.dumps(data))
    return copy


def drop_context(name):
    def change(entry):
        entry["context"] = [c for c in entry["context"] if c["input"] != name]

    return change


def rename(old, new):
    """Rename a tensor consistently in the entry: it still describes a loop, not the graphs."""

    def change(entry):
        for graph in ("prefill", "decode"):
            for side in ("inputs", "outputs"):
                for spec in entry[graph][side]:
                    spec["name"] = new if spec["name"] == old else spec["name"]
        for c in entry["context"]:
            c["input"] = new if c["input"] == old else c["input"]

    return change


def set_source(name, source):
    def change(entry):
        for c in entry["context"]:
            c["source"] = source if c["input"] == name else c["source"]

    return change


@pytest.mark.parametrize(
    ("change", "backend", "fragments"),
    [
        (lambda entry: entry.pop("context"), "ort-cpu", ["decode lacks 'context'"]),
        (
            drop_context("cross.1.key"),
            "ort-cpu",
            ["decode inputs not fed by tokens/state/context: ['cross.1.key']"],
        ),
        (
            set_source("cross.0.value", "prefill input"),
            "ort-cpu",
            ["'cross.0.value' is not a 'prefill input'"],
        ),
        (set_source("attention_mask", "encoder"), "torch", ["source = 'encoder' must be one of"]),
        (lambda entry: entry["state"].pop(), "ort-cpu", ["decode inputs not fed", "past.1.k_sum"]),
        (lambda entry: entry["context"][0].pop("source"), "ort-cpu", ["context[0] lacks 'source'"]),
        (
            lambda entry: entry["state"][0].update(layer="one"),
            "ort-cpu",
            ["layer = 'one' must be an integer"],
        ),
        (
            rename("cross.0.key", "encoder_hidden_states"),
            "ort-cpu",
            [
                "prefill.onnx and attnx.json disagree on its outputs",
                "not produced: ['encoder_hidden_states']",
            ],
        ),
        (
            rename("cross.0.key", "encoder_hidden_states"),
            "torch",
            ["the torch decode graph and attnx.json disagree", "not taken: ['encoder_hidden_states']"],
        ),
    ],
)
def test_generate_refuses_a_malformed_or_mismatched_decode_entry_in_one_line(
    decode_export, tmp_path, change, backend, fragments
):
    out, _ = decode_export("linear", "seq2seq", "cosformer")
    copy = tampered(out, tmp_path, change)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in copy.iterdir())
    code, _, stderr = run_cli(
        [
            "generate",
            str(copy),
            "--source-ids",
            "4,8,15",
            "--prompt-ids",
            "0",
            "-n",
            "3",
            "--backend",
            backend,
        ]
    )
    assert_one_line_error(code, stderr, *fragments)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in copy.iterdir()) == before


@pytest.mark.parametrize("backend", ["ort-cpu", "torch"])
def test_generate_drives_the_cached_loop_and_both_backends_agree(decode_export, backend):
    out, _ = decode_export("linear", "seq2seq", "cosformer")
    args = ["--source-ids", "4,8,15,16,23", "--prompt-ids", "0", "-n", "7", "--backend", backend]
    code, stdout, stderr = run_cli(["generate", str(out), *args])
    assert code == 0, stderr
    ids = [int(i) for i in stdout.splitlines()[0].split(",")]
    module = ExportDir.open(out).rebuild().module
    source, target = torch.tensor([[4, 8, 15, 16, 23]]), torch.tensor([[0, *ids]])
    masks = [torch.ones(t.shape, dtype=torch.bool) for t in (source, target)]
    with torch.inference_mode():
        logits = module(source, masks[0], target, masks[1])[0]
    assert logits[0, :-1].argmax(-1).tolist() == ids  # greedy: each id is the full forward's argmax
