"""``attnx export --from hf:DIR`` refusals for hybrids: one line, exit 2, nothing written."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnx.testing import hf_hybrid
from tests.adapters.hf_hybrid.conftest import ARCHS
from tests.helpers import assert_one_line_error, run_cli


def copy_of(source: Path, target: Path, **config_changes) -> Path:
    shutil.copytree(source, target)
    if config_changes:
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, **config_changes}))
    return target


def refused(directory: Path, tmp_path: Path, *fragments: str) -> None:
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--from", f"hf:{directory}", "-o", str(out)])
    assert_one_line_error(code, stderr, *fragments)
    assert not out.exists()


def test_an_architecture_attnx_does_not_adapt_is_named_with_the_supported_ones(tmp_path):
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    supported = ("kimi_linear", "minimax", "qwen3_5", "qwen3_5_moe", "qwen3_next", "reformer")
    refused(other, tmp_path, "'llama' model", *supported)


@pytest.mark.parametrize("kind", ["glm5_next", "glm5_next_text"])
def test_glm5_next_is_refused_by_name_with_the_reason(tmp_path, kind):
    """GLM-5-Next is refused before anything loads, with why (docs/importing.md's table says the same)."""
    directory = tmp_path / kind
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": kind}))
    refused(directory, tmp_path, f"'{kind}' model, which attnx does not adapt", "no text-only causal LM")


def test_qwen4_exp_per_layer_ngram_embeddings_are_refused_by_name(initial_dir, tmp_path):
    directory = copy_of(initial_dir("qwen4_exp"), tmp_path / "ple", ple_layer_ids=[1])
    refused(directory, tmp_path, "qwen4_exp with ple_layer_ids [1]", "ple_layer_ids empty")


def test_a_class_attnx_does_not_export_is_named(initial_dir, tmp_path):
    directory = copy_of(
        initial_dir("qwen3_next"), tmp_path / "cls", architectures=["Qwen3NextForTokenClassification"]
    )
    refused(directory, tmp_path, "Qwen3NextForTokenClassification", "Qwen3NextForCausalLM")


@pytest.mark.parametrize(
    "damage,fragment",
    [
        ("pickled", "pickled weights (pytorch_model.bin)"),
        ("missing", "no model.safetensors"),
        ("garbage", "not a readable safetensors file"),
        ("truncated", "file not fully covered"),
    ],
)
def test_weights_that_are_pickled_missing_or_corrupt_are_refused(initial_dir, tmp_path, damage, fragment):
    directory = copy_of(initial_dir("qwen3_5"), tmp_path / damage)
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    if damage == "pickled":
        weights.rename(directory / "pytorch_model.bin")
    elif damage == "missing":
        weights.unlink()
    elif damage == "garbage":
        weights.write_bytes(b"not safetensors at all" * 10)
    else:
        weights.write_bytes(data[: len(data) // 2])
    refused(directory, tmp_path, fragment)


def test_weights_that_do_not_match_the_config_are_refused(initial_dir, tmp_path):
    source = initial_dir("qwen3_next")
    layer_types = json.loads((source / "config.json").read_text())["layer_types"]
    directory = copy_of(
        source, tmp_path / "more", num_hidden_layers=5, layer_types=[*layer_types, "full_attention"]
    )
    refused(directory, tmp_path, "do not match its config.json", "missing keys: model.layers.4")


def test_a_tokenizer_that_does_not_load_is_refused(initial_dir, tmp_path):
    directory = copy_of(initial_dir("qwen3_5"), tmp_path / "tok")
    (directory / "tokenizer.json").write_text("{not json")
    refused(directory, tmp_path, "its tokenizer does not load")


def test_a_rotary_that_rescales_per_forward_is_refused_by_name(initial_dir, tmp_path):
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    directory = copy_of(initial_dir("qwen3_next"), tmp_path / "rope", rope_parameters=rope)
    refused(directory, tmp_path, "rope_type='dynamic'")


def test_a_minimax_sliding_window_is_refused_by_name(initial_dir, tmp_path):
    directory = copy_of(initial_dir("minimax"), tmp_path / "window", sliding_window=32)
    refused(directory, tmp_path, "sliding_window=32")


@pytest.mark.parametrize(
    "change,fragments",
    [
        ({"conv_L_cache": 1}, ("lfm2 with conv_L_cache=1", "conv_L_cache >= 2")),
        (
            {"layer_types": ["conv", "linear_attention", "conv", "full_attention"]},
            ("lfm2 with layer_types linear_attention", "conv, full_attention"),
        ),
    ],
)
def test_lfm2_options_attnx_does_not_reproduce_are_refused_by_name(initial_dir, tmp_path, change, fragments):
    directory = copy_of(initial_dir("lfm2"), tmp_path / "lfm2", **change)
    refused(directory, tmp_path, *fragments)


@pytest.mark.parametrize(
    "change,fragments",
    [
        (
            {"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
            ("olmo_hybrid with layer_types sliding_attention", "linear_attention, full_attention"),
        ),
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
            ("olmo_hybrid with rope_parameters.rope_type='dynamic'",),
        ),
    ],
)
def test_olmo_hybrid_options_attnx_does_not_reproduce_are_refused_by_name(
    initial_dir, tmp_path, change, fragments
):
    """A layer type other than OLMo Hybrid's two (HF would build it an attention layer and find no mask for
    it) and a rotary rescaled per forward (the recipe has none; a config may add one)."""
    directory = copy_of(initial_dir("olmo_hybrid"), tmp_path / "olmo", **change)
    refused(directory, tmp_path, *fragments)


def test_lara_sliding_attention_layers_are_refused_by_name(initial_dir, tmp_path):
    """Lara Mini's sliding_window applies to its sliding_attention layers only (refused, naming the window);
    the recipe's, with none, exports with the config's window of 512 as it is."""
    layer_types = ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]
    directory = copy_of(initial_dir("lara_mini"), tmp_path / "lara", layer_types=layer_types)
    refused(
        directory,
        tmp_path,
        "lara_mini with layer_types sliding_attention",
        "sliding_window=512",
        "linear_attention, full_attention",
    )


def test_a_recurrent_gemma_conv_of_one_tap_is_refused_by_name(initial_dir, tmp_path):
    directory = copy_of(initial_dir("recurrent_gemma"), tmp_path / "rg", conv1d_width=1)
    refused(directory, tmp_path, "recurrent_gemma with conv1d_width=1", "conv1d_width >= 2")


def test_a_recurrent_gemma_export_is_capped_at_its_attention_window(initial_dir, tmp_path):
    """RecurrentGemma's local attention equals attnx's (every earlier token) only up to its window: the
    window is accepted (MiniMax's is refused), named in the export's notes, and is the longest length the
    adapter accepts, so the default verify lengths and the genai context stop there."""
    from attnx.adapters.hf.load import load
    from attnx.adapters.hf_hybrid.convert import lengths
    from attnx.recipes.loader import DEFAULT_SEQ_LENS

    directory = copy_of(initial_dir("recurrent_gemma"), tmp_path / "rg", attention_window_size=48)
    model, _, _, notes = load(directory)
    assert model.config.sliding_window == 48
    assert any("sliding_window=48" in note and "48 tokens" in note for note in notes)
    limit = lengths(model)
    assert limit is not None and limit.maximum == 48
    assert limit.fit(DEFAULT_SEQ_LENS) == (1, 7, 32, 48)


@pytest.mark.parametrize(
    "change,fragments",
    [
        ({"inference_state_dtype": "bfloat16"}, ("xlstm with inference_state_dtype='bfloat16'", "float32")),
        ({"gate_soft_cap": 50.0}, ("xlstm with gate_soft_cap=50.0", "capped at 30")),
    ],
)
def test_xlstm_options_attnx_does_not_reproduce_are_refused_by_name(initial_dir, tmp_path, change, fragments):
    directory = copy_of(initial_dir("xlstm"), tmp_path / "xlstm", **change)
    refused(directory, tmp_path, *fragments)


def test_kimi_key_value_heads_other_than_attention_heads_are_refused_by_name(initial_dir, tmp_path):
    directory = copy_of(initial_dir("kimi_linear"), tmp_path / "kv", num_key_value_heads=2)
    refused(directory, tmp_path, "kimi_linear with num_key_value_heads=2", "set num_key_value_heads to 4")


def test_bailing_key_value_heads_other_than_attention_heads_are_refused_by_name(initial_dir, tmp_path):
    directory = copy_of(initial_dir("bailing_hybrid"), tmp_path / "kv", num_key_value_heads=2)
    refused(directory, tmp_path, "bailing_hybrid with num_key_value_heads=2", "set num_key_value_heads to 4")


def test_a_sharded_save_loads_and_a_missing_shard_is_named(initialised, tmp_path):
    """Sharded safetensors (an index naming the shards) load through every check; a shard the index
    names but the directory lacks is refused by name."""
    from attnx.adapters.hf.load import load

    directory = tmp_path / "sharded"
    initialised("qwen3_5").save_pretrained(directory, max_shard_size="200KB")
    shards = sorted(directory.glob("model-*.safetensors"))
    assert len(shards) > 1
    model, example, _, _ = load(directory)
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and set(example) >= {"input_ids", "attention_mask"}
    shards[-1].unlink()
    refused(directory, tmp_path, f"names {shards[-1].name}, which is missing")


@pytest.mark.parametrize("arch", ARCHS)
def test_the_default_verify_lengths_fit_the_configs_positions(arch):
    """A model whose config allows 100 positions verifies at 1, 7, 32 and 100 (not 129), and its genai
    config declares 100 as its context (the manifest's lengths, read from max_position_embeddings)."""
    from attnx.adapters.hf_hybrid.convert import lengths
    from attnx.recipes.loader import DEFAULT_SEQ_LENS

    model = hf_hybrid.build(arch, max_position_embeddings=100)
    limit = lengths(model)
    assert limit is not None and limit.maximum == 100
    assert limit.fit(DEFAULT_SEQ_LENS) == (1, 7, 32, 100)
    assert lengths(model.get_output_embeddings()) is None  # a layer, not a model (RWKV: `head`)


@pytest.mark.slow  # a fresh interpreter importing torch, transformers and flash-linear-attention: ~30 s here
def test_a_loaded_model_runs_hf_torch_path_in_a_fresh_process(saved_dir):
    """With flash-linear-attention installed, transformers binds its GPU kernels in place of HF's torch
    delta rule at import; ``--from hf:DIR`` loads a model whose own forward (the parity reference) runs
    on a CPU anyway (a fresh process: the tests' own process already uses the torch path)."""
    pytest.importorskip("fla")
    script = (
        "import sys, torch; from attnx.adapters.hf.load import load\n"
        "model, example, _, _ = load(__import__('pathlib').Path(sys.argv[1]))\n"
        "with torch.no_grad(): print(tuple(model(**example).logits.shape))"
    )
    command = [sys.executable, "-c", script, str(saved_dir("kimi_linear"))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("512)")


def test_each_family_is_declared_under_its_model_type_with_its_modeling_files_classes():
    """The table the walk dispatches by: a module is matched with its family by its class's modeling file,
    so every class a declaration names must come from ``transformers.models.<model_type>``'s."""
    from attnx.adapters.hf_hybrid.convert import ARCHITECTURES

    for model_type, architecture in ARCHITECTURES.items():
        assert architecture.model_type == model_type
        modeling = f"transformers.models.{model_type}.modeling_{model_type}"
        classes = [*architecture.models, *architecture.untraceable, *architecture.layers]
        assert {c.__module__ for c in classes} == {modeling}, model_type


def test_the_walk_imports_only_the_families_it_meets():
    """Importing every family imports every one of their modeling files (seconds of every export's start):
    the adapter imports a family when a module of it is met."""
    probe = (
        "import sys\n"
        "from attnx.adapters.hf_hybrid.convert import architecture_of\n"
        "from transformers.models.lfm2.modeling_lfm2 import Lfm2RMSNorm\n"
        "assert architecture_of(Lfm2RMSNorm(4)).model_type == 'lfm2'\n"
        "families = sorted(m for m in sys.modules if m.startswith('attnx.adapters.hf_hybrid.'))\n"
        "models = sorted(m for m in sys.modules if m.startswith('transformers.models.'))\n"
        "print(families, models)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    families, models = result.stdout.strip().split("] [")
    assert "hf_hybrid.lfm2'" in families and "hf_hybrid.mamba'" not in families
    assert "modeling_lfm2'" in models and "mamba2" not in models


def test_a_kernel_package_cannot_be_imported_while_a_family_is_but_is_still_found(
    tmp_path, monkeypatch, request
):
    """transformers binds a GPU-kernel package's functions in place of a modeling file's torch functions
    when it can import the package; attnx calls the torch functions, so it imports modeling files without
    those packages (seconds each). Their specs still resolve (transformers' availability checks read
    versions), the block ends with the import, and a package imported before is left alone."""
    from attnx.adapters.hf_hybrid import convert

    for name in ("kernels_probe", "kernels_loaded"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("VALUE = 1\n")
        (tmp_path / name / "ops.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(convert, "KERNEL_PACKAGES", ("kernels_probe", "kernels_loaded", "kernels_absent"))
    probes = ("kernels_probe", "kernels_probe.ops", "kernels_loaded")  # no module outlives the test
    request.addfinalizer(lambda: [sys.modules.pop(name, None) for name in probes])
    loaded = importlib.import_module("kernels_loaded")
    finders = list(sys.meta_path)

    with convert.without_kernel_packages():
        for name in ("kernels_probe", "kernels_probe.ops"):
            with pytest.raises(ImportError):
                importlib.import_module(name)
            assert name not in sys.modules
        assert importlib.util.find_spec("kernels_probe") is not None
        assert importlib.util.find_spec("kernels_absent") is None
        assert importlib.import_module("kernels_loaded") is loaded

    assert sys.meta_path == finders
    assert importlib.import_module("kernels_probe.ops").VALUE == 2


def test_a_family_is_imported_without_flash_linear_attention():
    """Qwen3.5's modeling file, imported for an export, leaves flash-linear-attention unimported (about 3 s
    of every export's start)."""
    pytest.importorskip("fla")
    probe = (
        "import sys\n"
        "from attnx.adapters.hf_hybrid.convert import ARCHITECTURES\n"
        "ARCHITECTURES['qwen3_5']\n"
        "print('transformers.models.qwen3_5.modeling_qwen3_5' in sys.modules, 'fla' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["True", "False"]
