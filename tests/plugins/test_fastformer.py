"""fastformer: the op, its ONNX bodies and the layer against a token-by-token reference from the paper."""

from __future__ import annotations

import math

import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from attnx.errors import AttnxError
from attnx.exporter.export import export
from attnx.exporter.lowering import attach_functions
from attnx.exporter.manifest import MODEL_FILE
from attnx.plugins.fastformer import VARIANT, FastformerConfig
from attnx.plugins.fastformer.kernel import FASTFORMER_OP, fastformer_attention
from attnx.variant import AttentionSpec
from tests.plugins.encoder_parity import assert_encoder_matches_ort, export_encoder

SHAPES = [(1, 1, 1, 4), (2, 3, 7, 8), (3, 2, 16, 5), (2, 4, 33, 16)]  # (batch, heads, N, d_head)
MASKS = ["none", "prefix", "scattered"]
TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "vocab_size": 50}


# -- the reference: Fastformer eqs. (3)-(7), one (batch, head) and one token at a time, float64 ----------


def naive_pool(xs: list[torch.Tensor], w: torch.Tensor, real: list[bool], scale: float) -> torch.Tensor:
    """sum_i alpha_i x_i, alpha_i = exp(w·x_i·scale) / sum_j exp(w·x_j·scale) over real tokens.

    Padded tokens weigh 0; when no token is real every token weighs the same (attnx's finite convention).
    """
    if not any(real):
        weights = [1.0] * len(xs)
    else:
        scores = [float(torch.dot(w, x)) * scale for x in xs]
        top = max(s for s, r in zip(scores, real, strict=True) if r)
        weights = [math.exp(s - top) if r else 0.0 for s, r in zip(scores, real, strict=True)]
    total = sum(weights)
    pooled = torch.zeros_like(xs[0])
    for weight, x in zip(weights, xs, strict=True):
        pooled = pooled + (weight / total) * x
    return pooled


def naive_fastformer(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """u (batch, heads, N, d) in float64 from q, k, v (batch, heads, N, d), w_q, w_k (heads, d)."""
    q, k, v, w_q, w_k = (t.double() for t in (q, k, v, w_q, w_k))
    batch, heads, n, _ = q.shape
    out = torch.empty_like(v)
    for b in range(batch):
        real = [True if mask is None else bool(mask[b, i]) for i in range(n)]
        for h in range(heads):
            global_query = naive_pool([q[b, h, i] for i in range(n)], w_q[h], real, scale)
            p = [global_query * k[b, h, i] for i in range(n)]
            global_key = naive_pool(p, w_k[h], real, scale)
            for i in range(n):
                out[b, h, i] = global_key * v[b, h, i]
    return out


def naive_layer(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Recompute the whole layer with its own parameters: transform(concat_h u) + Q."""
    params = {name: p.detach().double() for name, p in layer.named_parameters()}
    x = x.double()
    heads, d_head = params["w_q"].shape

    def project(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        projected = x @ params[f"{name}.weight"].T + params[f"{name}.bias"]
        return projected, torch.stack(
            [projected[..., h * d_head : (h + 1) * d_head] for h in range(heads)], 1
        )

    queries, q = project("q_proj")
    _, k = project("k_proj")
    v = q if "v_proj.weight" not in params else project("v_proj")[1]
    u = naive_fastformer(q, k, v, params["w_q"], params["w_k"], mask, 1.0 / math.sqrt(d_head))
    merged = torch.cat([u[:, h] for h in range(heads)], -1)
    return merged @ params["transform.weight"].T + params["transform.bias"] + queries


# -- inputs ----------------------------------------------------------------------------------------------


def make_mask(kind: str, batch: int, n: int, generator: torch.Generator) -> torch.Tensor | None:
    """None, a random-length real prefix per row, or a scattered pattern whose first row is all padding."""
    if kind == "none":
        return None
    if kind == "prefix":
        lengths = torch.randint(1, n + 1, (batch, 1), generator=generator)
        return torch.arange(n) < lengths
    mask = torch.rand(batch, n, generator=generator) > 0.4
    if batch > 1:
        mask[0] = False
    return mask


def op_inputs(
    shape: tuple[int, int, int, int], seed: int, dtype: torch.dtype = torch.float32, magnitude: float = 1.0
) -> tuple[list[torch.Tensor], torch.Generator]:
    """Random q, k, v (batch, heads, N, d) and w_q, w_k (heads, d), plus the generator for masks."""
    batch, heads, n, d = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, d, generator=g) * magnitude for _ in range(3))
    w_q, w_k = (torch.randn(heads, d, generator=g) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v, w_q, w_k)], g


def op_model(dtype: int, with_mask: bool, scale: float) -> bytes:
    """A one-node ONNX model around attnx::FastformerAttention, with attnx's body attached."""
    names = ["q", "k", "v", "w_q", "w_k"] + (["key_padding_mask"] if with_mask else [])
    inputs = [helper.make_tensor_value_info(n, dtype, ["b", "h", "n", "d"]) for n in names[:3]]
    inputs += [helper.make_tensor_value_info(n, dtype, ["h", "d"]) for n in ("w_q", "w_k")]
    if with_mask:
        inputs.append(helper.make_tensor_value_info("key_padding_mask", TensorProto.BOOL, ["b", "n"]))
    node = helper.make_node("FastformerAttention", names, ["u"], domain="attnx", scale=scale)
    output = helper.make_tensor_value_info("u", dtype, None)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("attnx", 1)]
    model = helper.make_model(
        helper.make_graph([node], "fastformer_op", inputs, [output]), opset_imports=opsets
    )
    model.ir_version = 10
    return attach_functions(model, [FASTFORMER_OP]).SerializeToString()


def run_op_in_ort(tensors: list[torch.Tensor], mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    dtype = TensorProto.FLOAT16 if tensors[0].dtype == torch.float16 else TensorProto.FLOAT
    model = op_model(dtype, mask is not None, scale)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feed = dict(zip(["q", "k", "v", "w_q", "w_k"], (t.numpy() for t in tensors), strict=True))
    if mask is not None:
        feed["key_padding_mask"] = mask.numpy()
    return torch.from_numpy(session.run(None, feed)[0])


# -- the op ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("share_qv", [False, True], ids=["qkv", "share_qv"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_op_matches_reference_in_torch_and_ort(shape, mask_kind, share_qv):
    (q, k, v, w_q, w_k), g = op_inputs(shape, seed=sum(shape) + 7 * MASKS.index(mask_kind))
    v = q if share_qv else v
    mask = make_mask(mask_kind, shape[0], shape[2], g)
    scale = 1.0 / math.sqrt(shape[-1])
    expected = naive_fastformer(q, k, v, w_q, w_k, mask, scale).float()
    tensors = [q, k, v, w_q, w_k]
    for result in (fastformer_attention(*tensors, mask, scale), run_op_in_ort(tensors, mask, scale)):
        torch.testing.assert_close(result, expected, atol=1e-5, rtol=1e-4)


def test_padded_tokens_do_not_influence_real_ones():
    (q, k, v, w_q, w_k), g = op_inputs((2, 2, 9, 4), seed=3)
    mask = torch.arange(9) < torch.tensor([[5], [9]])
    before = fastformer_attention(q, k, v, w_q, w_k, mask, 0.5)
    noise = torch.randn(3, *q.shape, generator=g) * 100 * ~mask[:, None, :, None]
    after = fastformer_attention(q + noise[0], k + noise[1], v + noise[2], w_q, w_k, mask, 0.5)
    assert torch.equal(before * mask[:, None, :, None], after * mask[:, None, :, None])


@pytest.mark.parametrize("mask_kind", MASKS)
def test_fp16_op_is_finite_and_close(mask_kind):
    shape = (3, 2, 24, 8)
    tensors, g = op_inputs(shape, seed=11, dtype=torch.float16, magnitude=6.0)
    mask = make_mask(mask_kind, shape[0], shape[2], g)
    scale = 1.0 / math.sqrt(shape[-1])
    expected = naive_fastformer(*tensors, mask, scale)
    for result in (fastformer_attention(*tensors, mask, scale), run_op_in_ort(tensors, mask, scale)):
        assert result.dtype == torch.float16 and torch.isfinite(result).all()
        assert (result.double() - expected).abs().max() <= 2e-2 * expected.abs().max()


# -- the layer -------------------------------------------------------------------------------------------


def build_layer(share_qv: bool, d_model: int = 24, heads: int = 3, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layer = VARIANT.load().build(FastformerConfig(share_qv=share_qv), AttentionSpec(d_model, heads))
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0.0, 0.4)  # sharper than the init, so the poolings are far from uniform
    return layer.eval()


@pytest.mark.parametrize("share_qv", [False, True], ids=["qkv", "share_qv"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize(("batch", "n"), [(1, 1), (2, 7), (3, 20)])
def test_layer_matches_reference(batch, n, mask_kind, share_qv):
    layer = build_layer(share_qv, seed=n)
    g = torch.Generator().manual_seed(100 + n)
    x = torch.randn(batch, n, 24, generator=g)
    mask = make_mask(mask_kind, batch, n, g)
    with torch.no_grad():
        result = layer(x, key_padding_mask=mask)
    torch.testing.assert_close(result, naive_layer(layer, x, mask).float(), atol=1e-4, rtol=1e-4)


def test_layer_parameters_follow_the_paper():
    separate, shared = build_layer(False), build_layer(True)
    assert separate.w_q.shape == separate.w_k.shape == (3, 8)
    assert separate.v_proj is not None and shared.v_proj is None
    saved = sum(p.numel() for p in separate.parameters()) - sum(p.numel() for p in shared.parameters())
    assert saved == 24 * 24 + 24  # exactly the value projection


def test_capabilities_refuse_causal_and_cross():
    assert VARIANT.capabilities.key_padding_mask and VARIANT.capabilities.decode is None
    with pytest.raises(AttnxError, match="does not support causal"):
        VARIANT.check_spec(AttentionSpec(32, 2, causal=True))
    with pytest.raises(AttnxError, match="does not support cross"):
        VARIANT.check_spec(AttentionSpec(32, 2, cross=True))
    with pytest.raises(ValueError, match="cross"):
        build_layer(False)(torch.randn(1, 3, 24), context=torch.randn(1, 4, 24))


# -- export ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lowering", "share_qv"),
    [("function", False), ("function", True), ("decomposed", True), ("plugin", False)],
    ids=["function-qkv", "function-share_qv", "decomposed-share_qv", "plugin-qkv"],
)
def test_export_verifies_in_every_lowering(tmp_path, lowering, share_qv):
    options = {**TINY, "n_layers": 2, "share_qv": share_qv}
    out = tmp_path / "out"
    result = export("fastformer", out, options=options, lowering=lowering, seq_lens=[1, 7, 33], seed=5)
    assert result.parity is not None and result.parity.passed, result.parity
    model = onnx.load(str(out / MODEL_FILE))
    attnx_nodes = [node for node in model.graph.node if node.domain == "attnx"]
    if lowering == "decomposed":
        assert result.attnx_nodes == 0 and not attnx_nodes and not model.functions
        assert {node.domain for node in model.graph.node} <= {"", "ai.onnx"}
        return
    assert result.attnx_nodes == 2 and [n.op_type for n in attnx_nodes] == ["FastformerAttention"] * 2
    assert all(node.input[3].endswith("w_q") and node.input[4].endswith("w_k") for node in attnx_nodes)
    assert all((node.input[0] == node.input[2]) == share_qv for node in attnx_nodes)
    attributes = {a.name for node in attnx_nodes for a in node.attribute}
    assert ({"plugin_namespace", "plugin_version"} <= attributes) == (lowering == "plugin")
    assert bool(model.functions) == (lowering == "function")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[torch.nn.Module, ort.InferenceSession]:
    """One small dynamic-shape export (function lowering), with the torch model rebuilt from its weights."""
    out = tmp_path_factory.mktemp("fastformer") / "out"
    options = {**TINY, "n_layers": 1}
    return export_encoder("fastformer", out, options)


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), n=st.integers(1, 48), seed=st.integers(0, 2**16))
def test_property_torch_matches_onnxruntime(exported, batch, n, seed):
    assert_encoder_matches_ort(exported, batch, n, seed, TINY["vocab_size"], VARIANT.tolerance)
