"""Model configs and build-time refusals: typed options, one-line errors naming the model's need."""

from __future__ import annotations

import pytest
import torch

from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from tests.helpers import assert_one_line_error, run_cli
from tests.models.cases import REGISTERED, capabilities

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}


@pytest.mark.parametrize(
    ("model", "options", "message"),
    [
        ("lm", {"ff_chunks": 0}, "lm option ff_chunks=0 must be > 0"),
        ("seq2seq", {"n_decoder_layers": 0}, "seq2seq option n_decoder_layers=0 must be > 0"),
        ("encoder", {"num_classes": -1}, "encoder option num_classes=-1 must be >= 0"),
        ("lm", {"reversible": "maybe"}, "reversible='maybe' must be a boolean"),
        (
            "lm",
            {"share_layers": "yes", "d_model": 30, "n_heads": 4},
            "d_model=30 must be divisible by n_heads=4",
        ),
        ("lm", {"num_classes": 2}, "unknown option 'num_classes'"),
        ("encoder", {"d_model": "2.5"}, "encoder option d_model='2.5' must be an integer"),
        # a model computes in float32: nan, inf and what float32 rounds to inf are no option values
        ("encoder", {"scale": "nan"}, "softmax option scale='nan' must be a finite number"),
        ("encoder", {"scale": "1e300"}, "softmax option scale='1e300' must be a finite number"),
        ("encoder", {"scale": float("-inf")}, "softmax option scale=-inf must be a finite number"),
    ],
)
def test_bad_model_options_are_one_line_errors(model, options, message):
    with pytest.raises(AttnxError, match=message) as error:
        assemble("softmax", model, {**TINY, **options})
    assert "\n" not in str(error.value)


def test_same_seed_same_weights_other_seed_other_weights():
    def weights(seed: int) -> dict[str, torch.Tensor]:
        return assemble("softmax", "seq2seq", {**TINY, "reversible": True}, seed=seed).module.state_dict()

    a, b, c = weights(3), weights(3), weights(4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embedding.embed.weight"], c["embedding.embed.weight"])


BIDIRECTIONAL_ONLY = [v for v in REGISTERED if not capabilities(v).causal]


@pytest.mark.parametrize("model", ["lm", "seq2seq"])
@pytest.mark.parametrize(
    "variant",
    BIDIRECTIONAL_ONLY
    or [
        pytest.param(
            "none", marks=pytest.mark.skip(reason="every registered variant supports causal attention")
        )
    ],
)
def test_cli_refuses_a_variant_the_model_cannot_use(tmp_path, model, variant):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--model", model, "--variant", variant, "-o", str(out)])
    assert_one_line_error(
        code, stderr, f"model '{model}' needs causal self-attention", f"variant '{variant}'"
    )
    assert not out.exists()


def test_padding_masks_need_a_variant_that_takes_them(use_registry):
    use_registry(("sigmoid", "tests.third_party.sigmoid_plugin"))
    with pytest.raises(
        AttnxError, match="model 'encoder' passes key padding masks.*set attention_mask=false"
    ):
        assemble("sigmoid_test", "encoder", TINY)
    assert (
        assemble("sigmoid_test", "encoder", {**TINY, "attention_mask": False}).inputs[0].name == "input_ids"
    )
    with pytest.raises(
        AttnxError, match="model 'seq2seq' passes key padding masks, but variant 'sigmoid_test'"
    ):
        assemble("softmax", "seq2seq", TINY, cross_variant="sigmoid_test")


def test_cli_refuses_cross_variant_for_models_without_cross_attention(tmp_path):
    code, _, stderr = run_cli(["export", "--cross-variant", "softmax", "-o", str(tmp_path / "out")])
    assert_one_line_error(code, stderr, "model 'encoder' has no cross-attention")
