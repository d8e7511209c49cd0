"""``attnx export --from hf:DIR --decode`` of the trained hybrids: prefill/decode/genai graphs (the KV
cache of the attention layers, conv + recurrent state of the linear layers, onnxruntime-genai 0.18's
names and one state shape per role; LFM2's graph against the model builder's), greedy tokens of
onnxruntime-genai and ``attnx generate`` against HF's own ``generate``, a real tritonserver, text in and
out with the saved tokenizer (slow: whole decode exports)."""

from __future__ import annotations

import copy
import json

import pytest

from attnx.adapters.hf_hybrid.convert import convert, lengths
from attnx.decode.generate import generate
from attnx.decode.module import stepping_layers
from attnx.exporter.opsets import model_opset
from attnx.registry import get_registry
from attnx.serve.genai import DEFAULT_CONTEXT
from attnx.testing import hf_hybrid
from tests.adapters.hf_hybrid.conftest import ARCHS
from tests.helpers import run_cli
from tests.plugins import op_harness as harness
from tests.serve.test_genai import assert_states_read_before_written

TOLERANCE = get_registry().variant("softmax").tolerance
NEW_TOKENS = 200


@pytest.fixture(scope="module")
def decode_export(saved_dir, tmp_path_factory):
    """``decode_export(arch)``: OUT of ``attnx export --from hf:DIR --decode`` (verified), made once."""
    made = {}

    def get(arch: str):
        if arch not in made:
            out = tmp_path_factory.mktemp(f"decode-{arch}") / "out"
            code, stdout, stderr = run_cli(
                ["export", "--from", f"hf:{saved_dir(arch)}", "--decode", "-o", str(out)]
            )
            assert code == 0, stderr
            assert "parity: PASSED on ort-cpu, torch decode, ort-cpu decode, ort-cpu genai" in stdout
            made[arch] = out
        return made[arch]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_genai_config_names_each_layers_state(decode_export, trained, arch):
    """genai_config.json: the KV cache names of the attention layers and the conv/recurrent names of the
    linear layers, as onnxruntime-genai 0.18 reads them, and genai.onnx takes those per layer: a linear
    layer's conv carry beside its recurrent state, a conv placeholder where the layer has no short conv
    (MiniMax's lightning layers; genai 0.18 requires a conv next to every recurrent state), a recurrent
    placeholder where the layer's state is its conv carry alone (RWKV's channel mixes: genai finds its
    recurrent layers by their recurrent inputs). genai allocates every layer's state of a role with the
    first layer's shape, so all of a role's inputs share one shape: the layers' own, the smallest
    ((batch, 1, 1), (batch, 1, 1, 1)) only where no layer holds that role. A model whose every linear
    layer holds a conv carry alone (LFM2's) is genai's "lfm2" model, as the model builder writes it: its
    convs by ``layer_types``, no recurrent state at all, positions from ``attention_mask``."""
    import onnx

    from attnx.exporter.directory import ExportDir

    out = decode_export(arch)
    assert_states_read_before_written(out)  # genai binds each state's input and output to one buffer
    genai_model = json.loads((out / "genai_config.json").read_text())["model"]
    # the adapter's limit: max_position_embeddings (Mamba2: none), RecurrentGemma's attention window
    limit = lengths(trained(arch)).maximum or DEFAULT_CONTEXT
    assert genai_model["context_length"] == limit
    decoder = genai_model["decoder"]
    graph = onnx.load(str(out / "genai.onnx"), load_external_data=False).graph
    dims = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.input}
    # the stateful layers in export order: Nemotron-H's mlp and moe blocks hold none, Falcon-H1's hybrid
    # layers two, RWKV's blocks two (time and channel mix)
    layers = [
        {s.role for s in layer.decode_state()}
        for layer in stepping_layers(convert(copy.deepcopy(trained(arch))))
    ]
    recurrent = {i: roles for i, roles in enumerate(layers) if "key" not in roles}
    convs_alone = all(roles == {"conv"} for roles in recurrent.values())
    assert genai_model["type"] == ("lfm2" if convs_alone else "decoder")
    assert decoder["inputs"]["past_conv_names"] == "past.%d.conv"
    roles = ("conv",) if convs_alone else ("conv", "recurrent")
    for i, held in enumerate(layers):
        wanted = {f"past_key_values.{i}.key", f"past_key_values.{i}.value"} if "key" in held else set()
        assert wanted <= set(dims), (i, held, sorted(dims))
        assert {f"past.{i}.{role}" for role in roles if i in recurrent} <= set(dims), (i, held, sorted(dims))
    if any("key" in held for held in layers):
        assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    # every attention layer's cache in the buffer genai shares between past and present
    shared = any("key" in held for held in layers)
    assert ExportDir.open(out).manifest.genai.shared_kv is shared
    search = json.loads((out / "genai_config.json").read_text())["search"]
    assert search["past_present_share_buffer"] is shared
    if convs_alone:
        assert decoder["layer_types"] == [
            "conv" if i in recurrent else "full_attention" for i in range(len(layers))
        ]
        assert {"input_ids", "attention_mask"} <= set(dims) and "position_ids" not in dims
        assert (
            not any("recurrent" in name for name in dims) and "past_recurrent_names" not in decoder["inputs"]
        )
    else:
        assert decoder["inputs"]["past_recurrent_names"] == "past.%d.recurrent" and "position_ids" in dims
    assert not any(f"past.{len(layers)}.{role}" in dims for role in ("conv", "recurrent"))
    carries = {(s.layer, s.role): bool(s.carries) for s in ExportDir.open(out).manifest.genai.state}
    for role, smallest in (("conv", [1, 1]), ("recurrent", [1, 1, 1]))[: len(roles)]:
        assert all(carries[i, role] == (role in held) for i, held in recurrent.items()), (role, carries)
        shapes = {tuple(dims[f"past.{i}.{role}"]) for i in recurrent}
        assert len(shapes) <= 1, (role, shapes)
        holds = any(role in held for held in recurrent.values())
        assert all((list(shape[1:]) == smallest) != holds for shape in shapes), (role, shapes)


@pytest.mark.slow
def test_lfm2_genai_graph_takes_the_model_builders_inputs(decode_export, saved_dir, tmp_path):
    """attnx's LFM2 genai.onnx and genai_config.json follow onnxruntime-genai's model builder's LFM2 (``-p
    fp32 -e cpu`` on the same checkpoint) name for name: the same inputs and outputs, of the same dtypes
    and ranks, their fixed dims equal (the symbolic ones are named differently), the same model type and
    config input names."""
    import subprocess
    import sys

    import onnx

    pytest.importorskip("onnxruntime_genai.models.builder")
    built = tmp_path / "builder"
    args = ["-i", str(saved_dir("lfm2")), "-o", str(built), "-c", str(tmp_path / "cache")]
    builder = [sys.executable, "-m", "onnxruntime_genai.models.builder", *args, "-p", "fp32", "-e", "cpu"]
    subprocess.run(builder, check=True, capture_output=True)
    out = decode_export("lfm2")
    configs = [json.loads((d / "genai_config.json").read_text())["model"] for d in (out, built)]
    graphs = [
        onnx.load(str(d / c["decoder"]["filename"]), load_external_data=False).graph
        for d, c in zip((out, built), configs, strict=True)
    ]
    for side in ("input", "output"):
        specs = [
            {
                v.name: (
                    v.type.tensor_type.elem_type,
                    [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim],
                )
                for v in getattr(g, side)
            }
            for g in graphs
        ]
        assert sorted(specs[0]) == sorted(specs[1]), side
        for name, (dtype, dims) in specs[0].items():
            theirs_dtype, theirs = specs[1][name]
            assert dtype == theirs_dtype and len(dims) == len(theirs), (name, dims, theirs)
            assert all(a == b for a, b in zip(dims, theirs, strict=True) if a and b), (name, dims, theirs)
    assert configs[0]["type"] == configs[1]["type"]
    assert configs[0]["decoder"]["inputs"] == configs[1]["decoder"]["inputs"]
    assert configs[0]["decoder"]["outputs"] == configs[1]["decoder"]["outputs"]
    assert configs[0]["decoder"]["layer_types"] == configs[1]["decoder"]["layer_types"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_genai_and_attnx_generate_equal_hf_generate_for_200_tokens(decode_export, trained, saved_dir, arch):
    """Greedy onnxruntime-genai and ``attnx generate`` (ONNX Runtime) pick HF ``generate``'s tokens (its
    own cache path) for 200 tokens, up to a float tie (HF's top-two logits closer than the tolerance)."""
    assert_greedy_equals_hf(decode_export(arch), trained(arch), saved_dir(arch), arch)


def assert_greedy_equals_hf(out, model, saved, arch: str) -> None:
    """onnxruntime-genai and ``attnx generate`` on the export OUT pick HF ``generate``'s greedy tokens for
    :data:`NEW_TOKENS` tokens, up to a float tie."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(saved)
    prompt = tokenizer(hf_hybrid.PROMPT, return_tensors="pt").input_ids
    expected, logits = hf_hybrid.hf_greedy(model, prompt, NEW_TOKENS)
    runs = {
        "genai": hf_hybrid.genai_greedy(out, prompt[0].tolist(), NEW_TOKENS)[0],
        "attnx generate": generate(out, prompt[0].tolist(), NEW_TOKENS).tokens,
    }
    for name, tokens in runs.items():
        agreed, tie = hf_hybrid.agreement(expected, logits, tokens, TOLERANCE.atol)
        assert agreed == NEW_TOKENS or tie is not None
        print(f"{arch} {name}: {agreed} tokens agree" + ("" if tie is None else f", float tie at step {tie}"))


@pytest.mark.slow
def test_qwen3_5_at_opset_27_decodes_on_the_standard_linear_attention(saved_dir, trained, tmp_path):
    """``--decode --opset 27``: every graph runs its Gated DeltaNet layers on the standard LinearAttention
    (no com.microsoft import), the export's own parity run (prefill, decode steps, genai's layout) passes,
    and onnxruntime-genai and ``attnx generate`` pick HF's greedy tokens."""
    import onnx

    out = tmp_path / "out"
    command = ["export", "--from", f"hf:{saved_dir('qwen3_5')}", "--decode", "--opset", "27", "-o", str(out)]
    code, stdout, stderr = run_cli(command)
    assert code == 0, stderr
    assert "parity: PASSED on ort-cpu, torch decode, ort-cpu decode, ort-cpu genai" in stdout
    for name in ("model", "prefill", "decode", "genai"):
        model = onnx.load(str(out / f"{name}.onnx"), load_external_data=False)
        assert model_opset(model) == 27 and harness.standard_linear_attention_nodes(model), name
        assert not any(o.domain == "com.microsoft" for o in model.opset_import), name
    assert_greedy_equals_hf(out, trained("qwen3_5"), saved_dir("qwen3_5"), "qwen3_5")


@pytest.mark.slow
def test_generate_takes_text_with_the_saved_tokenizer(decode_export, saved_dir):
    """``attnx generate OUT --prompt TEXT`` on an HF export needs no extra flag: the text is HF's
    tokenizer's decoding of the greedy tokens."""
    import transformers

    out = decode_export("qwen3_next")
    code, stdout, stderr = run_cli(
        ["generate", str(out), "--prompt", hf_hybrid.PROMPT, "-n", "12", "--json", "-q"]
    )
    assert code == 0, stderr
    result = json.loads(stdout)
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved_dir("qwen3_next"))
    assert result["prompt"] == tokenizer(hf_hybrid.PROMPT).input_ids
    assert result["text"] == tokenizer.decode(result["tokens"])


@pytest.mark.slow
def test_generate_past_recurrent_gemmas_attention_window_is_refused_by_name(decode_export, trained):
    """RecurrentGemma's export is exact up to its attention window (HF's attention is local, attnx's sees
    every earlier token): ``attnx generate`` refuses a prompt and new tokens past it, naming the limit."""
    out = decode_export("recurrent_gemma")
    window = trained("recurrent_gemma").config.attention_window_size
    code, _, stderr = run_cli(["generate", str(out), "--prompt-ids", "5,17,230", "-n", str(window - 2)])
    assert code == 2, stderr
    assert f"need {window + 1} positions" in stderr and f"module.lengths.maximum={window}" in stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first run fetches the server wheel and builds the backend's environment
@pytest.mark.parametrize("arch", ARCHS)
def test_a_real_triton_server_serves_the_hybrid_token_by_token(
    decode_export, triton_build, triton_cache, tmp_path, arch
):
    """``attnx triton --backend python`` of each architecture's decode export, served by a real
    tritonserver with the state kept per sequence: a prompt then one token per request gives ``attnx
    generate``'s greedy tokens."""
    pytest.importorskip("tritonclient.http")
    from tests.serve.tritonserver import triton_tokens

    out = decode_export(arch)
    prompt = [5, 17, 230, 41, 9, 88, 3]
    served, _ = triton_tokens(out, triton_build, triton_cache / "python-env", tmp_path, prompt, 16)
    assert served == generate(out, prompt, 16).tokens
