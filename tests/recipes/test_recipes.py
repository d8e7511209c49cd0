"""Recipes: every shipped one parses and builds; strict schema errors; --set overrides; listing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.recipes import load_recipe, recipe_names, resolve
from attnx.registry import get_registry
from tests.helpers import assert_one_line_error, run_cli

SHIPPED = recipe_names()
PAPER_RECIPES = [
    "transformer-base",
    "linear-lm",
    "cosformer-lm",
    "reformer-enwik8",
    "fastformer-classifier",
    "retention-lm",
    "gated-delta-lm",
]
# Recipes of 100M+ parameters: building them takes seconds, so they build in the slow run only.
HEAVY = {"retention-lm", "gated-delta-lm"}


def unavailable(recipe: str) -> str | None:
    """Why a shipped recipe's variant cannot be used here (a plugin that failed to load), if so."""
    registry = get_registry()
    failed = {f.plugin: f.error for f in registry.failures}
    for table in ("variant", "cross_variant"):
        name = load_recipe_names(recipe).get(table)
        if name and name not in registry.variants:
            return f"variant {name} unavailable: {failed.get(name, 'not registered')}"
    return None


def load_recipe_names(recipe: str) -> dict[str, str]:
    from attnx.recipes.loader import read_toml, recipe_path

    data = read_toml(recipe_path(recipe))
    return {table: data[table]["name"] for table in ("model", "variant", "cross_variant") if table in data}


def test_a_recipe_per_paper_and_a_tiny_one_per_model():
    assert set(PAPER_RECIPES) <= set(SHIPPED)
    assert {f"tiny-{model}" for model in get_registry().models} <= set(SHIPPED)


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.slow] if name in HEAVY else []) for name in SHIPPED]
)
def test_shipped_recipe_parses_and_builds(name):
    reason = unavailable(name)
    if reason:
        pytest.xfail(reason)
    recipe = load_recipe(name)
    assert recipe.description and len(recipe.description) <= 80
    assembly = assemble(
        recipe.variant, recipe.model, recipe.options, recipe.export.seed, cross_variant=recipe.cross_variant
    )
    for key, value in recipe.options.items():
        scope, _, option = key.partition(".")
        config = {
            "model": assembly.model_config,
            "variant": assembly.variant_config,
            "cross": assembly.cross_variant_config,
        }[scope]
        assert getattr(config, option) == value, key


def test_transformer_base_has_the_papers_size():
    """Table 3 lists 65M parameters for base (their BPE vocabulary differs slightly)."""
    recipe = load_recipe("transformer-base")
    module = assemble(recipe.variant, recipe.model, recipe.options, cross_variant=recipe.cross_variant).module
    parameters = sum(p.numel() for p in module.parameters())
    assert 60e6 < parameters < 66e6
    assert (len(module.encoder.blocks), len(module.decoder.blocks)) == (6, 6)


def test_every_variant_has_a_tiny_recipe():
    """A variant's tiny-* recipe lets users (and the decode and serving tests) try it in seconds."""
    variants = {load_recipe_names(name)["variant"] for name in SHIPPED if name.startswith("tiny-")}
    assert {"retention", "gated_delta"} <= variants


def test_recipe_settings_are_exposed_for_bench_and_verify():
    recipe = load_recipe("linear-lm")
    assert recipe.bench.seq_lens == (784, 3072) and recipe.bench.batch == 1
    assert recipe.verify.seq_lens == (1, 7, 64, 129) and recipe.export.lowering == "function"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "custom.toml"
    path.write_text(text)
    return path


GOOD = """\
[model]
name = "lm"
d_model = 32
n_heads = 2
n_layers = 1
d_ff = 64
vocab_size = 50

[variant]
name = "softmax"
"""


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (
            GOOD + "[exprot]\nopset = 18\n",
            [
                "unknown key 'exprot' at the top level",
                "did you mean 'export'?",
                "valid: description, paper, model",
            ],
        ),
        (
            GOOD.replace("d_ff = 64", "dff = 64"),
            ["unknown key 'dff' in [model]", "did you mean 'd_ff'?", "valid: name, vocab_size, d_model"],
        ),
        (
            GOOD.replace("d_model = 32", 'd_model = "32"'),
            ["[model] d_model = '32' must be an integer, not a string"],
        ),
        (
            GOOD.replace('name = "softmax"', 'name = "sofmax"'),
            ["[variant] unknown variant 'sofmax'", "did you mean 'softmax'?"],
        ),
        (GOOD.replace('name = "lm"', 'name = "lmm"'), ["[model] unknown model 'lmm'", "did you mean 'lm'?"]),
        (GOOD + "scale = true\n", ["[variant] scale = True must be a number, not a boolean"]),
        (GOOD + '[export]\nlowering = "plugn"\n', ["[export] lowering = 'plugn' must be one of 'function'"]),
        (
            GOOD + "[verify]\nseq_lens = 7\n",
            ["[verify] seq_lens = 7 must be an array of integers, not an integer"],
        ),
        (GOOD + "[bench]\nbatch = 1.5\n", ["[bench] batch = 1.5 must be an integer, not a float"]),
        (GOOD + "[verify]\nseq_lens = [0, 3]\n", ["verify setting seq_lens=[0, 3] must be lengths >= 1"]),
        (GOOD.split("[variant]")[0], ["missing table [variant]"]),
        (GOOD + '[cross_variant]\nname = "softmax"\n', ["model 'lm' has no cross-attention"]),
        (GOOD.replace("n_heads = 2", "n_heads = 0"), ["[model] lm option n_heads=0 must be > 0"]),
        ("[model\nname = 1", ["is not valid TOML"]),
        (GOOD + "description = 3\n", ["unknown key 'description' in [variant] (valid: name, scale)"]),
    ],
)
def test_bad_recipe_is_a_one_line_cli_error_and_writes_nothing(tmp_path, text, fragments):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--recipe", str(write(tmp_path, text)), "-o", str(out)])
    assert_one_line_error(code, stderr, *fragments)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--recipe", "tiny-lmm"], ["unknown recipe 'tiny-lmm'", "did you mean 'tiny-lm'?"]),
        (["--recipe", "missing/recipe.toml"], ["recipe file 'missing/recipe.toml' does not exist"]),
        (["--recipe", "tiny-lm", "--set", "export.opset=x"], ["export setting opset='x' must be an integer"]),
        (
            ["--recipe", "tiny-lm", "--set", "export.opst=19"],
            ["unknown export setting 'opst'", "valid: checkpoint, decode, dtype"],
        ),
        (["--recipe", "tiny-lm", "--set", "verify.atol=abc"], ["verify setting atol='abc' must be a number"]),
        (
            ["--recipe", "tiny-lm", "--set", "d_modl=3"],
            ["unknown option 'd_modl'", "did you mean 'd_model'?"],
        ),
        (["--recipe", "tiny-lm", "--set", "export.dtype=bf16"], ["dtype='bf16' must be one of fp32, fp16"]),
        (["--recipe", "tiny-lm", "--dtype", "fp8"], ["dtype='fp8' must be one of fp32, fp16"]),
        (["--recipe", "tiny-lm", "--set", "export.dynamic_axes=batch,sq"], ["dynamic_axes of model lm 'sq'"]),
        (["--recipe", "tiny-lm", "--set", "export.example_lengths=seq"], ["must look like seq=128"]),
    ],
)
def test_bad_recipe_arguments_are_one_line_errors(tmp_path, args, fragments):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", *args, "-o", str(out)])
    assert_one_line_error(code, stderr, *fragments)
    assert not out.exists()


def test_recipe_from_a_path_with_comments_loads(tmp_path):
    recipe = load_recipe(write(tmp_path, "# a comment\n" + GOOD.replace("d_ff = 64", "d_ff = 64  # small")))
    assert recipe.name == "custom" and recipe.model == "lm" and recipe.options["model.d_ff"] == 64


def test_replacing_the_variant_drops_the_recipes_variant_options():
    recipe = resolve("reformer-enwik8", variant="softmax")
    assert recipe.variant == "softmax" and not any(k.startswith("variant.") for k in recipe.options)
    assert recipe.options["model.d_model"] == 1024


def test_overrides_are_applied_after_the_recipe():
    recipe = resolve(
        "tiny-lm",
        options={
            "d_model": "64",
            "model.n_heads": "4",
            "export.opset": "19",
            "verify.seq_lens": "3,5",
            "bench.batch": "4",
        },
    )
    assert recipe.export.opset == 19 and recipe.verify.seq_lens == (3, 5) and recipe.bench.batch == 4
    config = assemble(recipe.variant, recipe.model, recipe.options).model_config
    assert (config.d_model, config.n_heads, config.n_layers) == (64, 4, 1)


def test_cli_recipe_with_overrides_exports(tmp_path):
    """Model option, opset and static-axis overrides on top of tiny-lm, through the CLI."""
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        [
            "export",
            "--recipe",
            "tiny-lm",
            "--set",
            "d_model=48",
            "--set",
            "export.opset=19",
            "--set",
            "export.dynamic_axes=batch",
            "--set",
            "export.example_lengths=seq=12",
            "-o",
            str(out),
        ]
    )
    assert code == 0, stderr
    assert "recipe tiny-lm" in stdout and "parity: PASSED" in stdout
    manifest = json.loads((out / "attnx.json").read_text())
    assert (
        manifest["recipe"] == "tiny-lm"
        and manifest["opset"] == 19
        and manifest["model_config"]["d_model"] == 48
    )
    assert manifest["inputs"][0]["axes"] == ["batch", 12] and manifest["dynamic_axes"]["input_ids"] == {
        "0": "batch"
    }
    assert json.loads((out / "parity.json").read_text())["seq_lens"] == [12]


def test_list_shows_recipes():
    code, stdout, _ = run_cli(["list", "--json"])
    assert code == 0
    recipes = {r["name"]: r for r in json.loads(stdout)["recipes"]}
    assert set(recipes) == set(SHIPPED)
    assert recipes["transformer-base"]["model"] == "seq2seq" and recipes["linear-lm"]["variant"] == "linear"
    code, stdout, _ = run_cli(["list"])
    assert code == 0 and "reformer-enwik8" in stdout


def test_load_recipe_error_names_the_recipe(tmp_path):
    with pytest.raises(AttnxError, match="^recipe 'custom': "):
        load_recipe(write(tmp_path, GOOD + "bogus = 1\n"))


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_RECIPES)
def test_paper_recipe_exports_and_verifies(tmp_path, name):
    reason = unavailable(name)
    if reason:
        pytest.xfail(reason)
    code, stdout, stderr = run_cli(["export", "--recipe", name, "-o", str(tmp_path / "out"), "-q"])
    assert code == 0, stderr
    assert "parity: PASSED" in stdout
