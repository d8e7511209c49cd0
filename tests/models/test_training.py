"""Training attnx models from Python: ``attnx.nn.Model``, ``attnx.nn.Attention``, ``loss.backward()``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnx
from attnx.errors import AttnxError
from attnx.exporter.inputs import random_feed
from tests.models.cases import CASES, VARIANT_OPTIONS, covering, cross_for

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, "vocab_size": 50}


def build(variant: str, model: str, seed: int = 0) -> torch.nn.Module:
    cross = {"cross_variant": cross_for(variant)} if model == "seq2seq" else {}
    return attnx.nn.Model(model, variant, seed=seed, **cross, **TINY, **VARIANT_OPTIONS.get(variant, {}))


def inputs(module: torch.nn.Module, seed: int) -> list[torch.Tensor]:
    specs = module.input_specs()
    sizes = {"batch": 3, "seq": 13, "src_seq": 11, "tgt_seq": 9}
    feed = random_feed(specs, sizes, np.random.default_rng(seed))
    return [torch.from_numpy(feed[spec.name]) for spec in specs]


def loss_of(outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return sum(out.square().mean() for out in outputs)


@pytest.mark.parametrize(("variant", "model"), covering(CASES))
def test_loss_backward_reaches_every_parameter(variant, model):
    module = build(variant, model)
    assert module.training
    loss = loss_of(module(*inputs(module, seed=1)))
    loss.backward()
    missing = [name for name, p in module.named_parameters() if p.grad is None]
    assert not missing, f"parameters without a gradient: {missing}"
    for name, parameter in module.named_parameters():
        assert torch.isfinite(parameter.grad).all(), name
    assert any(parameter.grad.abs().max() > 0 for parameter in module.parameters())


@pytest.mark.parametrize(
    "variant",
    ["linear", *(pytest.param(v, marks=pytest.mark.slow) for v in ("reformer", "softmax", "cosformer"))],
)
def test_a_few_steps_of_adam_lower_the_lm_loss(variant):
    """Next-token cross-entropy on one fixed batch of a repeating pattern falls by half in 30 steps."""
    torch.manual_seed(0)
    module = build(variant, "lm")
    ids = torch.arange(24).remainder(5).repeat(4, 1) + torch.arange(4)[:, None]
    optimiser = torch.optim.Adam(module.parameters(), lr=3e-3)

    def loss() -> torch.Tensor:
        (logits,) = module(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    first = float(loss())
    for _ in range(30):
        optimiser.zero_grad()
        loss().backward()
        optimiser.step()
    assert float(loss()) < 0.5 * first


SLOW = [("softmax", "lm"), ("cosformer", "lm"), ("reformer", "lm"), ("fastformer", "encoder")]
COMPILED = [
    pytest.param("linear", "lm", "aot_eager", id="linear-lm"),
    *(pytest.param(v, m, "aot_eager", id=f"{v}-{m}", marks=pytest.mark.slow) for v, m in SLOW),
    pytest.param("reformer", "lm", "inductor", id="reformer-lm-inductor", marks=pytest.mark.slow),  # ~2 min
]


@pytest.mark.parametrize(("variant", "model", "backend"), COMPILED)
def test_compiled_gradients_equal_eager_ones(variant, model, backend):
    """torch.compile traces the recomputing backward (AOTAutograd) and gives eager's gradients."""
    module = build(variant, model)
    arguments = inputs(module, seed=2)
    eager = torch.autograd.grad(loss_of(module(*arguments)), list(module.parameters()))
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    traced = torch.autograd.grad(loss_of(compiled(*arguments)), list(module.parameters()))
    for a, b in zip(traced, eager, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_build_is_seeded_and_matches_the_export_assembly():
    """The same arguments give the same weights, which are the ones ``attnx export`` builds."""
    from attnx.exporter.assemble import assemble

    a, b = build("cosformer", "lm", seed=3), build("cosformer", "lm", seed=3)
    exported = assemble("cosformer", "lm", {**TINY, **VARIANT_OPTIONS["cosformer"]}, seed=3).module
    states = [m.state_dict() for m in (a, b, exported)]
    for name, tensor in states[0].items():
        assert torch.equal(tensor, states[1][name]) and torch.equal(tensor, states[2][name]), name
    other = build("cosformer", "lm", seed=4)
    assert not torch.equal(a.embedding.weight, other.embedding.weight)


def test_build_refuses_bad_input_in_one_line():
    cases = [
        ("lm", "fastformer", {}, "model 'lm' needs causal self-attention"),
        ("lm", "linear", {"d_modle": 8}, "unknown option 'd_modle'; did you mean 'd_model'?"),
        ("lm", "lineer", {}, "unknown variant 'lineer'; did you mean 'linear'?"),
        ("lmm", "linear", {}, "unknown model 'lmm'; did you mean 'lm'?"),
        ("lm", "linear", {"eps": -1}, "linear option eps=-1.0 must be > 0"),
    ]
    for model, variant, options, message in cases:
        with pytest.raises(AttnxError) as error:
            attnx.nn.Model(model, variant, **options)
        assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("variant", "causal", "cross"),
    [
        ("softmax", True, True),
        ("cosformer", False, True),
        ("reformer", True, False),
        ("fastformer", False, False),
    ],
)
def test_attention_layer_trains_in_a_model_of_ones_own(variant, causal, cross):
    torch.manual_seed(0)
    layer = attnx.nn.Attention(variant, d_model=16, n_heads=2, causal=causal, cross=cross)
    assert layer.training and layer.spec.causal == causal
    x = torch.randn(2, 7, 16, requires_grad=True)
    context = torch.randn(2, 5, 16) if cross else None
    mask = torch.arange(5 if cross else 7) < torch.tensor([[3], [5]])
    layer(x, context=context, key_padding_mask=mask).square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().max() > 0
    assert all(p.grad is not None for p in layer.parameters())


def test_attention_layer_refuses_bad_input_in_one_line():
    cases = [
        ("lineer", {}, "unknown variant 'lineer'; did you mean 'linear'?"),
        ("linear", {"esp": 1e-6}, "unknown linear option 'esp'; did you mean 'eps'?"),
        ("linear", {"chunk_size": 0}, "chunk_size=0"),
        ("fastformer", {"causal": True}, "variant 'fastformer' does not support causal attention"),
        ("reformer", {"cross": True}, "variant 'reformer' does not support cross attention"),
        ("linear", {"n_heads": 3}, "d_model=16 must be divisible by n_heads=3"),
        ("linear", {"d_model": True}, "d_model=True must be an integer >= 1"),
        ("softmax", {"n_heads": 2.0}, "n_heads=2.0 must be an integer >= 1"),
        ("cosformer", {"causal": "yes"}, "causal='yes' must be True or False"),
        ("softmax", {"scale": float("nan")}, "scale=nan must be a finite number"),
        # sized on the meta device first: 2 x 4 x 2^80 bytes of weights are refused, not allocated
        ("linear", {"d_model": 2**40}, "choose a smaller d_model"),
    ]
    for variant, options, message in cases:
        arguments = {"d_model": 16, "n_heads": 2, **options}
        with pytest.raises(AttnxError) as error:
            attnx.nn.Attention(variant, **arguments)
        assert message in str(error.value) and "\n" not in str(error.value)
