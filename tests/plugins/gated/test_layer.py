"""The ``retention`` and ``gated_delta`` layers against their equations, token by token.

The reference below is written from the equations of docs/variants/retention.md and gated_delta.md, in
float64, with the layer's parameters: the projections as plain products, the short convolution as a sum
over each token's window, the decays and gates from their formulas, and the recurrence by
``naive_gated_delta_rule`` (one rank-1 update per token). Every model configuration the docs name
(RetNet, MiniMax lightning, GLA, plain linear, fixed gammas, DeltaNet, Gated DeltaNet, Kimi Delta
Attention) runs at several shapes: one token, odd lengths, lengths across chunk boundaries, grouped
value heads, head dims that differ; with left padding (exact: the padded rows' real outputs equal the
unpadded sequence's), in fp16, and through gradcheck.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnx.errors import AttnxError
from attnx.plugins.gated.config import GatedDeltaConfig, RetentionConfig
from attnx.plugins.gated.layer import GatedLayer
from attnx.plugins.gated.op import naive_gated_delta_rule
from attnx.variant import AttentionSpec
from tests.plugins import op_harness as harness

# Every model configuration the docs pages name, as (config class, options).
MODELS = {
    "retnet": (RetentionConfig, {}),
    "minimax": (
        RetentionConfig,
        {
            "decay": "minimax",
            "activation": "silu",
            "scale": 1.0,
            "output_norm": "full",
            "output_gate": "sigmoid",
        },
    ),
    "gla": (RetentionConfig, {"decay": "key", "decay_gate": "logsigmoid", "decay_rank": 4}),
    "linear": (RetentionConfig, {"decay": "none", "output_gate": "none", "output_norm": "none"}),
    "fixed-conv": (RetentionConfig, {"decay": "fixed", "gammas": (0.9, 0.6, 0.99, 0.3), "short_conv": True}),
    "deltanet": (GatedDeltaConfig, {"decay": "none"}),
    "gated-deltanet": (GatedDeltaConfig, {}),
    "kda": (
        GatedDeltaConfig,
        {"decay": "key", "decay_rank": 8, "output_gate": "sigmoid", "gate_rank": 8},
    ),
}
# batch, length, chunk size, extra options: one token, odd lengths across chunk boundaries, an exact chunk,
# grouped value heads with head dims that differ
SHAPES = [
    (2, 1, 4, {}),
    (2, 7, 4, {}),
    (1, 33, 8, {"value_heads": 4, "key_head_dim": 6, "value_head_dim": 10}),
    (2, 16, 16, {"key_heads": 1, "value_heads": 4}),
]
D_MODEL, HEADS = 16, 2


def build(
    model: str, extra: dict | None = None, seed: int = 0, layer: int = 1, n_layers: int = 3
) -> GatedLayer:
    kind, options = MODELS[model]
    config = kind(**{**options, **(extra or {})})
    config.validate()
    torch.manual_seed(seed)
    spec = AttentionSpec(D_MODEL, HEADS, causal=True, layer=layer, n_layers=n_layers)
    return GatedLayer(config, spec).eval()


# -- the reference, from the equations -------------------------------------------------------------------


def project(layer: GatedLayer, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """x through the weights under ``prefix`` in order (a Linear, or a rank-r bottleneck of two), float64."""
    weights = [p.double() for name, p in layer.named_parameters() if name.startswith(prefix + ".")]
    for weight in weights:
        x = x @ weight.T
    return x


def heads_of(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def reference(layer: GatedLayer, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's output on x (b, n, d_model) from the equations, float64."""
    config, (hk, hv) = layer.config, layer.heads
    x = x.double()
    real = torch.ones(x.shape[:2], dtype=torch.float64) if mask is None else mask.double()
    x = x * real[..., None]
    batch, n = x.shape[:2]
    mixed = project(layer, "qkv_proj", x)
    if config.short_conv:  # y_t = sum_j w_j x_{t - K + 1 + j}, zeros before the first token
        taps = layer.conv1d.weight.double()[:, 0, :]
        width = taps.shape[-1]
        convolved = torch.zeros_like(mixed)
        for t in range(n):
            for j in range(width):
                if t - width + 1 + j >= 0:
                    convolved[:, t] += mixed[:, t - width + 1 + j] * taps[:, j]
        mixed = convolved
    if config.activation == "silu":
        mixed = mixed * torch.sigmoid(mixed)
    q, k, v = (heads_of(part, h) for part, h in zip(mixed.split(layer.widths, -1), (hk, hk, hv), strict=True))
    if config.qk_norm:
        q, k = (t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))
    h = torch.arange(hv, dtype=torch.float64)
    if config.decay == "none":
        g = torch.zeros(batch, hv, n, 1, dtype=torch.float64)
    elif config.decay in ("retnet", "minimax", "fixed"):
        if config.decay == "retnet":
            gamma = 1 - 2.0 ** (-5 - h)
        elif config.decay == "minimax":
            depth = 1 - layer.spec.layer / (layer.spec.n_layers - 1 + 1e-5) + 1e-5
            gamma = torch.exp(-((2 ** (-8 / hv)) ** (h + 1)) * depth)
        else:
            gamma = torch.tensor(config.gammas, dtype=torch.float64).expand(hv)
        g = torch.log(gamma)[None, :, None, None].expand(batch, hv, n, 1)
    else:
        a = heads_of(project(layer, "decay_proj", x) + layer.dt_bias.double(), hv)
        if config.decay_gate == "logsigmoid":
            g = torch.log(torch.sigmoid(a)) / 16
        else:
            g = -torch.exp(layer.A_log.double())[:, None, None] * torch.log1p(torch.exp(a))
    beta = (
        torch.sigmoid(project(layer, "beta_proj", x)).transpose(1, 2)
        if config.delta
        else torch.ones(batch, hv, n, dtype=torch.float64)
    )
    g, beta = g * real[:, None, :, None], beta * real[:, None, :]
    o, _ = naive_gated_delta_rule(q, k, v, g, beta, None, config.delta, layer.scale)
    o = o.transpose(1, 2)  # (b, n, hv, dv)
    if config.output_norm == "full":
        o = o.flatten(2)
    if config.output_norm != "none":
        o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + config.norm_eps) * layer.norm_weight.double()
    o = o.flatten(2)
    if config.output_gate != "none":
        z = project(layer, "gate_proj", x)
        o = o * (z * torch.sigmoid(z) if config.output_gate == "silu" else torch.sigmoid(z))
    return project(layer, "out_proj", o)


def assert_layer_close(found: torch.Tensor, expected: torch.Tensor) -> None:
    """float32 chunked sums against float64 token-by-token ones."""
    torch.testing.assert_close(found.double(), expected, atol=2e-5, rtol=1e-4)


def randomised(layer: GatedLayer, seed: int) -> GatedLayer:
    """The output norm's weights drawn at random, so that a weight read in the wrong place shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if hasattr(layer, "norm_weight"):
            layer.norm_weight.copy_(1 + 0.5 * torch.randn(layer.norm_weight.shape, generator=generator))
    return layer


# -- the tests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "n", "chunk", "extra"), SHAPES, ids=lambda v: str(v) if v != {} else "")
@pytest.mark.parametrize("model", MODELS)
def test_the_layer_computes_its_equations(model, batch, n, chunk, extra):
    if MODELS[model][1].get("gammas") and extra.get("value_heads", HEADS) != 4:
        extra = {**extra, "value_heads": 4}  # four gammas, one per value head
    layer = randomised(build(model, {**extra, "chunk_size": chunk}, seed=n), seed=n)
    x = torch.randn(batch, n, D_MODEL, generator=torch.Generator().manual_seed(n + batch))
    with torch.no_grad():
        assert_layer_close(layer(x), reference(layer, x))


def test_the_reference_can_fail():
    """A decay of the wrong sign, a dropped beta, a convolution without its first tap: each moves the
    output far beyond the tolerance (the comparison above can fail)."""
    layer = build("gated-deltanet", {"chunk_size": 4})
    x = torch.randn(2, 9, D_MODEL, generator=torch.Generator().manual_seed(0))
    expected = reference(layer, x)
    with torch.no_grad():
        layer.A_log.mul_(-1)  # another decay
        assert (layer(x).double() - expected).abs().max() > 1e-2
        layer.A_log.mul_(-1)
        layer.beta_proj.weight.zero_()  # beta = 1/2 everywhere instead of sigmoid(x W_b)
        assert (layer(x).double() - expected).abs().max() > 1e-2


@pytest.mark.parametrize("model", ["retnet", "gated-deltanet", "kda", "fixed-conv"])
def test_left_padding_is_exact(model):
    """Pads before the real tokens (batched generation's layout): every real token's output equals the
    unpadded sequence's; the layer with the mask equals the reference with it."""
    extra = {"chunk_size": 4, "value_heads": 4}
    layer = build(model, extra)
    generator = torch.Generator().manual_seed(3)
    real = torch.randn(1, 9, D_MODEL, generator=generator)
    pads = 5
    x = torch.cat((torch.randn(2, pads, D_MODEL, generator=generator) * 3, real.expand(2, -1, -1)), dim=1)
    mask = torch.ones(2, pads + 9, dtype=torch.bool)
    mask[0, :pads] = False
    x[1, :pads] = real[0, :pads]  # row 1: no padding (other tokens before the real ones)
    with torch.no_grad():
        padded = layer(x, key_padding_mask=mask)
        alone = layer(real)
        torch.testing.assert_close(padded[0, pads:], alone[0], atol=1e-5, rtol=1e-4)
        assert_layer_close(padded, reference(layer, x, mask))


@pytest.mark.parametrize("model", ["minimax", "gated-deltanet", "kda"])
def test_fp16_layers_compute_their_equations(model):
    layer = build(model, {"chunk_size": 8, "value_heads": 4})
    x = torch.randn(2, 21, D_MODEL, generator=torch.Generator().manual_seed(21))
    layer.half()
    expected = reference(layer, x.half())  # the same fp16 inputs and weights, computed in float64
    with torch.no_grad():
        harness.assert_fp16_close({"fp16 layer": layer(x.half())}, expected, rel=1e-2)


@pytest.mark.parametrize("model", ["gla", "kda", "fixed-conv"])
def test_gradcheck_through_the_layer(model):
    """float64 gradients of the whole layer (input and every parameter) against central differences."""
    layer = build(model, {"chunk_size": 2, "value_heads": 4}).double()
    x = torch.randn(1, 5, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    x.requires_grad_()
    parameters = [p for p in layer.parameters()]

    def run(x, *weights):
        state = dict(zip([n for n, _ in layer.named_parameters()], weights, strict=True))
        return torch.func.functional_call(layer, state, (x,))

    assert torch.autograd.gradcheck(
        run, (x, *[p.detach().requires_grad_() for p in parameters]), fast_mode=True
    )


def test_steps_continue_the_forward_with_the_convolution_carry():
    """The layer's own step: a prompt, single tokens and a chunk, each from the state the last returned."""
    layer = build("kda", {"chunk_size": 4, "value_heads": 4})
    x = torch.randn(2, 14, D_MODEL, generator=torch.Generator().manual_seed(14))
    pieces, state, start = [], None, 0
    with torch.no_grad():
        for n in (5, 1, 1, 7):
            y, state = layer.step(x[:, start : start + n], state, torch.tensor([start]))
            pieces.append(y)
            start += n
        assert [tuple(s.shape) for s in state] == [(2, 2 * 2 * 8 + 4 * 8, 3), (2, 4, 8, 8)]
        assert state[1].dtype == torch.float32
        torch.testing.assert_close(torch.cat(pieces, 1), layer(x), atol=1e-5, rtol=1e-4)
        dropped = layer.step(x[:, 5:6], (torch.zeros_like(state[0]), state[1]), torch.tensor([5]))[0]
        assert (dropped - pieces[1]).abs().max() > 1e-3  # the carry matters


def test_minimax_slopes_depend_on_the_layer():
    """MiniMax-01's slope of head h: (2^(-8/H))^(h+1) (1 - l / (L - 1 + 1e-5) + 1e-5), smaller deeper."""
    first, last = (build("minimax", layer=i, n_layers=4).fixed_decay for i in (0, 3))
    heads = first.shape[0]
    base = 2 ** (-8 / heads)
    expected = torch.tensor([-(base ** (h + 1)) * (1 + 1e-5) for h in range(heads)])
    torch.testing.assert_close(first, expected.float())
    assert (last.abs() < 1e-3 * first.abs()).all()  # the last layer barely forgets


def test_retnet_gammas():
    layer = build("retnet", {"value_heads": 4})
    torch.testing.assert_close(layer.fixed_decay.exp(), torch.tensor([1 - 2.0 ** (-5 - h) for h in range(4)]))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"value_heads": 3}, "value_heads=3 must be a multiple of key_heads=2 (the model's n_heads"),
        ({"decay": "fixed", "gammas": (0.5, 0.5, 0.5)}, "gammas has 3 values for 2 value heads"),
    ],
)
def test_options_that_need_the_model_are_refused_when_built(extra, message):
    with pytest.raises(AttnxError, match=message.replace("(", r"\(")):
        build("gated-deltanet", extra)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"value_heads": 6, "key_heads": 4}, "value_heads=6 must be a multiple of key_heads=4"),
        ({"gammas": (1.5,), "decay": "fixed"}, "must be decay factors in (0, 1]"),
        ({"gammas": (0.5,)}, "set decay=fixed"),
        ({"decay": "fixed"}, "decay=fixed needs gammas"),
        ({"conv_kernel": 0}, "conv_kernel=0 must be >= 2"),
        ({"chunk_size": 0}, "chunk_size=0 must be in 1..32768 (none: 32"),
        ({"scale": 0.0}, "scale=0.0 must be > 0"),
    ],
)
def test_bad_options_are_named_with_the_fix(options, message):
    with pytest.raises(AttnxError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        GatedDeltaConfig(**options).validate()
    assert str(caught.value).startswith("gated_delta option ") and "\n" not in str(caught.value)


def test_scale_defaults_to_one_over_sqrt_dk():
    assert build("gated-deltanet", {"key_head_dim": 6}).scale == pytest.approx(1 / math.sqrt(6))
    assert build("minimax").scale == 1.0
