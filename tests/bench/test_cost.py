"""FLOP counts and memory bounds of attnx.bench.cost, against torch's own FLOP counter.

The projections and FFN are counted by ``torch.utils.flop_counter`` on the real model
(it sees every nn.Linear but not inside attnx custom ops); the attention maths are
counted by the same counter on naive reference implementations written here from the
papers' formulas. Lengths are multiples of 4 because the Reformer's chunked FFN pads the
sequence to a multiple of its chunk count, work the cost model does not count.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from attnx.bench.cost import FAMILIES, Shape, model_cost
from attnx.registry import get_registry

ENCODER = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 48, "vocab_size": 50}


def _counted(fn, *args) -> int:
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def _registered(name: str) -> None:
    if name not in get_registry().variants:
        pytest.skip(f"variant {name} is not registered in this checkout")


def _cases() -> list[tuple[str, dict]]:
    return [("softmax", {}), ("linear", {}), ("cosformer", {}), ("fastformer", {}),
            ("fastformer", {"share_qv": True}), ("reformer", {})]


@pytest.mark.parametrize(("variant", "options"), _cases())
@pytest.mark.parametrize(("batch", "n"), [(1, 4), (2, 24), (3, 36)])  # multiples of reformer's ff_chunks
def test_projection_and_ffn_flops_match_torch_flop_counter(variant: str, options: dict, batch: int,
                                                           n: int) -> None:
    from attnx.exporter.assemble import assemble

    _registered(variant)
    assembly = assemble(variant, "encoder", {**ENCODER, **options}, seed=0)
    ids = torch.randint(0, ENCODER["vocab_size"], (batch, n))
    mask = torch.ones(batch, n, dtype=torch.bool)
    counted = _counted(assembly.module, ids, mask)
    variant_config = assembly.variant_config.to_dict()
    cost = model_cost(variant, variant_config, "encoder", assembly.model_config.to_dict(), batch, n)
    shape = Shape(batch, n, ENCODER["d_model"], ENCODER["n_heads"])
    maths = FAMILIES[variant](shape, variant_config).maths_flops
    assert cost is not None and cost.flops is not None
    assert cost.flops - ENCODER["n_layers"] * maths == counted


def _elu1(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1


def naive_softmax(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def naive_kernel(qf, kf, v):
    return (qf @ (kf.transpose(-1, -2) @ v)) / (qf @ kf.sum(-2)[..., None])


def naive_linear(q, k, v):
    return naive_kernel(_elu1(q), _elu1(k), v)


def naive_cosformer(q, k, v):
    n = q.shape[-2]
    angle = torch.pi / 2 * torch.arange(1, n + 1) / n
    def features(x):
        return torch.cat([x.relu() * angle.sin()[:, None], x.relu() * angle.cos()[:, None]], dim=-1)
    return naive_kernel(features(q), features(k), v)


def naive_fastformer(q, k, v):
    w_q, w_k = torch.randn(q.shape[-1], 1), torch.randn(q.shape[-1], 1)
    def pool(x, w):
        alpha = torch.softmax(x @ w / x.shape[-1] ** 0.5, dim=-2)  # (b, h, n, 1)
        return alpha.transpose(-1, -2) @ x  # (b, h, 1, d)
    return pool(pool(q, w_q) * k, w_k) * v


NAIVE = {"softmax": naive_softmax, "linear": naive_linear, "cosformer": naive_cosformer,
         "fastformer": naive_fastformer}


@pytest.mark.parametrize("variant", sorted(NAIVE))
@pytest.mark.parametrize(("batch", "heads", "n", "head_dim"), [(1, 1, 1, 4), (2, 4, 17, 8), (3, 2, 64, 16)])
def test_attention_maths_flops_match_a_naive_reference(variant: str, batch: int, heads: int, n: int,
                                                       head_dim: int) -> None:
    q, k, v = (torch.randn(batch, heads, n, head_dim) for _ in range(3))
    expected = _counted(NAIVE[variant], q, k, v)
    assert FAMILIES[variant](Shape(batch, n, heads * head_dim, heads), {}).maths_flops == expected


def _bytes(variant: str, n: int) -> int:
    config = {"d_model": 512, "n_heads": 8, "n_layers": 6, "d_ff": 2048}
    cost = model_cost(variant, {}, "encoder", config, 1, n)
    assert cost is not None
    return cost.working_bytes


def test_memory_bound_is_quadratic_for_softmax_and_linear_for_linear_attention() -> None:
    assert _bytes("softmax", 32768) / _bytes("softmax", 16384) == pytest.approx(4, rel=0.01)
    assert _bytes("linear", 32768) / _bytes("linear", 16384) == pytest.approx(2, rel=0.01)
    # softmax at N=16384, 8 heads: one layer's fp32 scores alone are 8 * 16384^2 * 4 B = 8.6 GB
    assert _bytes("softmax", 16384) > 3 * 8 * 16384**2 * 4


def test_unknown_variants_are_bounded_like_softmax_and_other_models_are_not_modelled() -> None:
    config = {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128}
    unknown = model_cost("third-party", {}, "encoder", config, 2, 300)
    assert unknown is not None and unknown.flops is None
    assert unknown.working_bytes == model_cost("softmax", {}, "encoder", config, 2, 300).working_bytes
    assert model_cost("softmax", {}, "causal-lm", config, 2, 300) is None
