"""``[export] checkpoint``: a recipe names trained weights, relative to the recipe file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnx
from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.recipes import load_recipe
from tests.helpers import assert_one_line_error, run_cli

NO_VERIFY = {"verify.enabled": False}
TINY_LM = {"vocab_size": 50, "d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64}
RECIPE = """
[model]
name = "lm"
vocab_size = 50
d_model = 32
n_heads = 2
n_layers = 1
d_ff = 64

[variant]
name = "linear"

[export]
checkpoint = "{checkpoint}"
"""


def write(folder: Path, checkpoint: str, seed: int | None = 1) -> Path:
    """A recipe in ``folder`` naming ``checkpoint``; with a seed, those weights are written there too."""
    folder.mkdir(parents=True, exist_ok=True)
    if seed is not None:
        attnx.save_checkpoint(assemble("linear", "lm", TINY_LM, seed=seed), folder / checkpoint)
    path = folder / "trained.toml"
    path.write_text(RECIPE.format(checkpoint=checkpoint))
    return path


def test_the_checkpoint_is_found_beside_the_recipe_wherever_it_is_run_from(tmp_path, monkeypatch):
    recipe = write(tmp_path / "recipes", "weights/lm.safetensors")
    monkeypatch.chdir(tmp_path)
    assert load_recipe(recipe).export.checkpoint == str(tmp_path / "recipes" / "weights" / "lm.safetensors")
    result = attnx.export(recipe=str(recipe), out=tmp_path / "out", options=NO_VERIFY)
    exported = load_file(str(result.out / "weights.safetensors"))
    trained = load_file(str(tmp_path / "recipes" / "weights" / "lm.safetensors"))
    seeded = assemble("linear", "lm", TINY_LM, seed=0).module.state_dict()
    name = "blocks.0.attention.q_proj.weight"
    assert torch.equal(exported[name], trained[name]) and not torch.equal(exported[name], seeded[name])


def test_an_explicit_checkpoint_replaces_the_recipes(tmp_path):
    recipe = write(tmp_path, "lm.safetensors", seed=1)
    other = attnx.save_checkpoint(assemble("linear", "lm", TINY_LM, seed=2), tmp_path / "other.safetensors")
    result = attnx.export(recipe=str(recipe), out=tmp_path / "out", checkpoint=other, options=NO_VERIFY)
    name = "blocks.0.ffn.up.weight"
    exported = load_file(str(result.out / "weights.safetensors"))[name]
    assert torch.equal(exported, load_file(str(other))[name])


def test_a_missing_checkpoint_is_a_one_line_error_at_load(tmp_path):
    recipe = write(tmp_path, "gone.safetensors", seed=None)
    with pytest.raises(
        AttnxError, match=r"\[export\] checkpoint 'gone.safetensors' does not exist \(looked for"
    ):
        load_recipe(recipe)
    code, _, stderr = run_cli(["export", "--recipe", str(recipe), "-o", str(tmp_path / "out")])
    assert_one_line_error(
        code, stderr, "recipe 'trained': [export] checkpoint 'gone.safetensors' does not exist"
    )
    assert not (tmp_path / "out").exists()


def test_weights_of_another_model_are_refused_naming_the_mismatch(tmp_path):
    recipe = write(tmp_path, "lm.safetensors")
    code, _, stderr = run_cli(
        ["export", "--recipe", str(recipe), "--set", "d_model=64", "-o", str(tmp_path / "out")]
    )
    assert_one_line_error(code, stderr, "does not fit the model", "shape mismatch")
    assert not (tmp_path / "out").exists()
