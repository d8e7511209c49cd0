"""FLOP counts and memory bounds of attnx.exporter.budget, against torch's own FLOP counter and attnx bench.

FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` runs on the real model of every variant x
model pair the variants support (and a few cross-variant and structure-option cases), and its
count must equal ``model_cost(...).flops`` exactly. The counter counts matrix products only
(mm/bmm/addmm/matmul, 2 per multiply-add), the convention the cost model states. It sees a
``torch.library`` custom op as one opaque op with no formula (the attnx attention ops count 0),
so :class:`RunOpDefinitions` runs each ``attnx::`` op's Python definition in its place, where
the counter sees the op's own matmuls; and it has no formula for SDPA's CPU flash kernel, so
softmax runs SDPA's math backend, whose matmuls it counts. Memory: the estimate bounds the peak
that attnx bench measures for an lm and a seq2seq whose logits dominate, and scales as the
dominant terms do.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._library.custom_ops import OPDEFS
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import attnx
from attnx.cost import FLOAT_BYTES, Shape
from attnx.exporter.budget import SAFETY, model_cost
from attnx.registry import get_registry

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 48, "vocab_size": 100}
LENGTHS = (7, 70)  # odd and below every chunk size; above linear's chunk of 64, padded by every chunking


class RunOpDefinitions(TorchDispatchMode):
    """Run every ``attnx::`` custom op as its Python definition, so an outer FlopCounterMode counts
    the matmuls inside it (ops dispatched from a mode's handler go to the modes outside it)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        definition = OPDEFS[name]._init_fn if name.startswith("attnx::") else func
        return definition(*args, **(kwargs or {}))


def cost_of(
    variant: str,
    model: str,
    model_config: dict,
    batch: int,
    n: int,
    cross: str | None = None,
    variant_config: dict | None = None,
    cross_config: dict | None = None,
    registry=None,
):
    """``model_cost`` of registered names and option dicts (unknown names: a lookup error)."""
    registry = registry or get_registry()
    spec = registry.model(model)
    roles = {"self": registry.variant(variant), "cross": registry.variant(cross or "softmax")}
    configs = {"self": variant_config or {}, "cross": cross_config or {}}
    typed = {role: (v, v.make_config(configs[role])) for role, v in roles.items()}
    return model_cost(spec, spec.make_config(model_config), typed, batch, n)


def _registered(*names: str | None) -> None:
    for name in names:
        if name and name not in get_registry().variants:
            pytest.skip(f"variant {name} is not registered in this checkout")


# (variant, model, cross variant, options): every pair the variants support, then the
# cross variants that can serve seq2seq and the structure options (reformer's own defaults add
# reversible + ff_chunks 4, fastformer's share_layers).
CASES = [
    ("softmax", "encoder", None, {}),
    ("linear", "encoder", None, {}),
    ("cosformer", "encoder", None, {}),
    ("fastformer", "encoder", None, {}),
    ("fastformer", "encoder", None, {"share_qv": True, "num_classes": 3}),
    ("reformer", "encoder", None, {}),
    ("softmax", "lm", None, {}),
    ("linear", "lm", None, {}),
    ("cosformer", "lm", None, {"max_len": 128}),
    ("reformer", "lm", None, {}),
    ("softmax", "seq2seq", None, {}),
    ("linear", "seq2seq", None, {}),
    ("cosformer", "seq2seq", None, {"max_len": 128}),
    ("reformer", "seq2seq", None, {}),
    ("reformer", "seq2seq", "linear", {"cross.chunk_size": 16}),
    ("softmax", "seq2seq", "cosformer", {"max_len": 128}),
    ("linear", "lm", None, {"share_layers": True, "reversible": True, "ff_chunks": 3, "chunk_size": 16}),
    ("softmax", "seq2seq", None, {"n_decoder_layers": 1, "ff_chunks": 4, "share_layers": True}),
    # the gated rules (causal only): RetNet; GLA-like (a per-key decay through a bottleneck, grouped value
    # heads); Gated DeltaNet; Kimi-like (per-key decay, low-rank sigmoid gate, full-width norm, chunks of 8)
    ("retention", "lm", None, {}),
    ("retention", "lm", None, {"decay": "key", "decay_rank": 4, "value_heads": 4, "short_conv": True}),
    # Mamba1-like: a value of width 1 per head, which the rule runs token by token
    ("retention", "lm", None, {"decay": "key", "value_heads": 16, "value_head_dim": 1}),
    ("gated_delta", "lm", None, {}),
    (
        "gated_delta",
        "lm",
        None,
        {
            "decay": "key",
            "decay_rank": 4,
            "output_gate": "sigmoid",
            "gate_rank": 4,
            "output_norm": "full",
            "value_heads": 4,
            "chunk_size": 8,
        },
    ),
]


def _id(case: tuple) -> str:
    variant, model, cross, options = case
    return "-".join([variant, model, *([f"x{cross}"] if cross else []), *map(str, options.values())])


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize(("variant", "model", "cross", "options"), CASES, ids=[_id(c) for c in CASES])
def test_model_flops_equal_the_torch_flop_counter_on_the_real_model(
    variant: str, model: str, cross: str | None, options: dict, n: int
) -> None:
    from attnx.exporter.assemble import assemble
    from attnx.exporter.inputs import random_feed

    _registered(variant, cross)
    batch = 2
    assembly = assemble(variant, model, {**TINY, **options}, seed=0, cross_variant=cross)
    sizes = {"batch": batch, "seq": n, "src_seq": n, "tgt_seq": n}
    feed = random_feed(assembly.inputs, sizes, np.random.default_rng(n))
    inputs = [torch.from_numpy(feed[spec.name]) for spec in assembly.inputs]
    with (
        torch.inference_mode(),
        sdpa_kernel(SDPBackend.MATH),
        FlopCounterMode(display=False) as counter,
        RunOpDefinitions(),
    ):
        assembly.module(*inputs)
    cross_config = assembly.cross_variant_config.to_dict() if assembly.cross_variant_config else None
    cost = cost_of(
        variant,
        model,
        assembly.model_config.to_dict(),
        batch,
        n,
        cross,
        assembly.variant_config.to_dict(),
        cross_config,
    )
    assert cost is not None and cost.flops == counter.get_total_flops()


def _counted(fn, *args) -> int:
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def _elu1(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1


# Naive bidirectional attention from the papers' formulas, products written as matmuls and the
# pooled sums as multiply + sum; the kernel normaliser as a ones column of v (the split the cost model
# states, as attnx.plugins.lib.linear_core computes it).
def naive_softmax(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def naive_kernel(qf, kf, v):
    sums = qf @ (kf.transpose(-1, -2) @ torch.cat([v, torch.ones_like(v[..., :1])], dim=-1))
    return sums[..., :-1] / sums[..., -1:]


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
        return (alpha * x).sum(-2, keepdim=True)  # (b, h, 1, d)

    return pool(pool(q, w_q) * k, w_k) * v


NAIVE = {
    "softmax": naive_softmax,
    "linear": naive_linear,
    "cosformer": naive_cosformer,
    "fastformer": naive_fastformer,
}


@pytest.mark.parametrize("variant", sorted(NAIVE))
@pytest.mark.parametrize(("batch", "heads", "n", "head_dim"), [(1, 1, 1, 4), (2, 4, 17, 8), (3, 2, 64, 16)])
def test_attention_maths_flops_match_a_naive_reference(
    variant: str, batch: int, heads: int, n: int, head_dim: int
) -> None:
    q, k, v = (torch.randn(batch, heads, n, head_dim) for _ in range(3))
    expected = _counted(NAIVE[variant], q, k, v)
    declared = get_registry().variant(variant)
    cost = declared.cost(Shape(batch, n, heads * head_dim, heads), declared.make_config({}))
    assert cost.maths_flops == expected


def _bytes(variant: str, n: int, model: str = "encoder", **config) -> int:
    config = {"d_model": 512, "n_heads": 8, "n_layers": 6, "d_ff": 2048, "vocab_size": 32000, **config}
    cross = variant if model == "seq2seq" else None
    cost = cost_of(variant, model, config, 1, n, cross)
    assert cost is not None
    return cost.working_bytes


def test_memory_bound_is_quadratic_for_softmax_and_linear_for_linear_attention() -> None:
    assert _bytes("softmax", 32768) / _bytes("softmax", 16384) == pytest.approx(4, rel=0.01)
    assert _bytes("linear", 32768) / _bytes("linear", 16384) == pytest.approx(2, rel=0.01)
    # softmax at N=16384, 8 heads: one layer's fp32 scores alone are 8 * 16384^2 * 4 B = 8.6 GB, and two
    # are live at once in a primitive body
    assert _bytes("softmax", 16384) > 2 * 8 * 16384**2 * 4


@pytest.mark.parametrize("variant", ["retention", "gated_delta"])
def test_the_gated_rules_memory_bound_is_linear_and_holds_every_chunks_state(variant: str) -> None:
    """The chunked op keeps one d_k x d_v state per chunk and head: the bound grows linearly in N and holds
    them (Qwen3-Next's linear layer: 16 q/k heads, 32 value heads of 128, chunks of 32)."""
    layer = {"key_heads": 16, "value_heads": 32, "key_head_dim": 128, "value_head_dim": 128, "chunk_size": 32}
    for n in (4096, 16384):
        cost = cost_of(
            variant, "lm", {"d_model": 2048, "n_heads": 16, "n_layers": 1}, 1, n, variant_config=layer
        )
        twice = cost_of(
            variant, "lm", {"d_model": 2048, "n_heads": 16, "n_layers": 1}, 1, 2 * n, variant_config=layer
        )
        assert twice.working_bytes / cost.working_bytes == pytest.approx(2, rel=0.02)
        assert cost.working_bytes > FLOAT_BYTES * 32 * (n // 32) * 128 * 128


@pytest.mark.parametrize("model", ["lm", "seq2seq"])
def test_the_logits_bound_the_estimate_of_a_linear_time_model_and_grow_with_n(model: str) -> None:
    for n in (1024, 4096, 16384):
        logits = FLOAT_BYTES * n * 32000
        assert _bytes("linear", n, model) >= SAFETY * logits
        assert _bytes("linear", 2 * n, model) >= 2 * _bytes("linear", n, model) * 0.99
    # a smaller vocabulary shrinks the estimate by its logits
    assert _bytes("linear", 4096, model) - _bytes("linear", 4096, model, vocab_size=16000) >= (
        SAFETY * FLOAT_BYTES * 4096 * 16000
    )


def test_softmax_seq2seq_memory_is_quadratic_and_its_cross_variant_counts() -> None:
    config = {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128, "vocab_size": 100}
    softmax_cross = [cost_of("linear", "seq2seq", config, 1, n).working_bytes for n in (8192, 16384)]
    assert softmax_cross[1] / softmax_cross[0] == pytest.approx(4, rel=0.05)  # the default cross variant
    linear = [cost_of("linear", "seq2seq", config, 1, n, "linear").working_bytes for n in (8192, 16384)]
    assert linear[1] / linear[0] == pytest.approx(2, rel=0.05)


def test_shared_layers_do_not_change_flops() -> None:
    config = {"d_model": 64, "n_heads": 4, "n_layers": 3, "d_ff": 128, "vocab_size": 100}
    for model in ("encoder", "lm", "seq2seq"):
        plain = cost_of("softmax", model, config, 2, 100)
        shared = cost_of("softmax", model, {**config, "share_layers": True}, 2, 100)
        assert plain == shared


def test_variants_without_a_cost_model_are_bounded_like_softmax_and_models_without_one_are_not_modelled() -> (
    None
):
    registry = get_registry()
    config = {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128, "vocab_size": 100}
    unknown = dataclasses.replace(registry.variant("linear"), name="third-party", cost=None)
    softmax = registry.variant("softmax")
    for name in ("encoder", "lm", "seq2seq"):
        model = registry.model(name)
        roles = {"self": (unknown, unknown.make_config({})), "cross": (softmax, softmax.make_config({}))}
        cost = model_cost(model, model.make_config(config), roles, 2, 300)
        assert cost is not None and cost.flops is None
        assert cost.working_bytes == cost_of("softmax", name, config, 2, 300).working_bytes
    lm = registry.model("lm")
    assert model_cost(dataclasses.replace(lm, cost=None), lm.make_config(config), {}, 2, 300) is None


def test_every_registered_variant_and_model_declares_its_cost_model() -> None:
    registry = get_registry()
    missing = [name for name, v in {**registry.variants, **registry.models}.items() if v.cost is None]
    assert not missing, f"no cost model declared (Variant.cost / ModelSpec.cost): {missing}"


# attnx bench on an lm and a seq2seq whose (B, N, vocab) logits dominate their memory: a short
# length first takes the process's one-off costs (lazy initialisation), then the measured peak of
# the long one must stay under the estimate, on torch and ONNX Runtime.
WIDE = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 8000}
WIDE_MODELS = {"lm": ("softmax", {}), "seq2seq": ("linear", {"cross_variant": "linear"})}  # variant, cross
BENCH_LENGTHS = [64, 1024]


@pytest.fixture(scope="module")
def wide_exports(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``wide_exports(model)`` -> OUT of a softmax lm or a linear seq2seq of WIDE size, made on first use."""
    from attnx.api import export

    root = tmp_path_factory.mktemp("cost")

    @functools.cache
    def made(model: str) -> Path:
        variant, cross = WIDE_MODELS[model]
        export(variant, root / model, model=model, options={**WIDE, "verify.enabled": False}, **cross)
        return root / model

    return made


@pytest.mark.parametrize("model", ["lm", pytest.param("seq2seq", marks=pytest.mark.slow)])
def test_bench_reports_flops_and_an_estimate_that_bounds_the_measured_peak(
    wide_exports: Callable[[str], Path], model: str
) -> None:
    from attnx.exporter.directory import ExportDir

    manifest = ExportDir.open(wide_exports(model)).manifest
    report = attnx.bench(
        wide_exports(model),
        backends=["torch", "ort-cpu"],
        seq_lens=BENCH_LENGTHS,
        batch=4,
        warmup=1,
        repeat=1,
        threads=2,
        seed=0,
    )
    for m in report.measurements:
        assert m.status == "ok", m.reason
        expected = cost_of(
            manifest.variant,
            model,
            manifest.model_config,
            4,
            m.seq_len,
            manifest.cross_variant,
            manifest.variant_config,
            manifest.cross_variant_config,
        )
        assert expected is not None and m.flops == expected.flops and m.flops_per_s > 0
        assert m.estimated_bytes > SAFETY * FLOAT_BYTES * 4 * m.seq_len * WIDE["vocab_size"]
        if m.seq_len == BENCH_LENGTHS[-1] and m.peak_rss_bytes is not None:
            assert m.peak_rss_bytes <= m.estimated_bytes, (m.backend, m.peak_rss_bytes, m.estimated_bytes)
    if model == "seq2seq":  # the bench passed the manifest's cross variant: a softmax one counts N^2 more
        assert manifest.cross_variant == "linear"
        softmax_cross = cost_of(
            "linear", model, manifest.model_config, 4, BENCH_LENGTHS[-1], None, manifest.variant_config
        )
        assert softmax_cross is not None and softmax_cross.flops > report.measurements[-1].flops
