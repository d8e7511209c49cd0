"""The ``fast_transformers`` adapter against pytorch-fast-transformers' own forward.

Slow and optional: the library builds C++ extensions on install (about 28 minutes on a 2-core
CPU). Run with ``pip install -e '.[fast-transformers]' && pytest -m slow tests/adapters``.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
import torch
from torch import nn

import attnx

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("fast_transformers") is None,
        reason="pytorch-fast-transformers is not installed: pip install -e '.[fast-transformers]' "
        "(builds C++ extensions, minutes)",
    ),
]


class Model(nn.Module):
    """A user's model around a TransformerEncoderBuilder encoder: token and learned position
    embeddings, the library's encoder, a head. Causal models take ``past_length`` to decode;
    bidirectional ones a padding mask (as the library's LengthMask)."""

    def __init__(self, attention_type: str, eps: float | None = None) -> None:
        super().__init__()
        from fast_transformers.builders import TransformerEncoderBuilder

        self.causal = attention_type == "causal-linear"
        self.embed, self.positions = nn.Embedding(50, 32), nn.Embedding(256, 32)
        self.encoder = TransformerEncoderBuilder.from_kwargs(
            n_layers=2,
            n_heads=4,
            query_dimensions=8,
            value_dimensions=8,
            feed_forward_dimensions=64,
            attention_type=attention_type,
            activation="gelu",
        ).get()
        if eps is not None:
            self.encoder.layers[1].attention.inner_attention.eps = eps
        self.head = nn.Linear(32, 50)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_length: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from fast_transformers.masking import FullMask, LengthMask, TriangularCausalMask

        n = input_ids.shape[1]
        start = 0 if past_length is None else past_length
        x = self.embed(input_ids) + self.positions(torch.arange(n) + start)
        if self.causal:
            return self.head(self.encoder(x, attn_mask=TriangularCausalMask(n)))
        lengths = LengthMask(attention_mask.sum(-1), max_len=n)
        # FullMask(N=n), not FullMask(n) (nor None, which makes that): it checks isinstance(n, int), and a
        # traced length is not an int.
        return self.head(self.encoder(x, attn_mask=FullMask(N=n), length_mask=lengths))


def test_only_the_inner_attention_is_replaced_and_the_weights_keep_their_names():
    from fast_transformers.attention import AttentionLayer

    from attnx.adapters.apply import apply_adapters
    from attnx.adapters.fast_transformers.convert import LinearKernel
    from attnx.state import DecodableLayer

    model = Model("causal-linear").eval()
    adapted = apply_adapters(model).module
    layer = adapted.encoder.layers[0].attention
    assert isinstance(layer, AttentionLayer) and isinstance(layer.inner_attention, LinearKernel)
    assert isinstance(layer, DecodableLayer)  # the library's layer, stepping on its own projections
    assert adapted.state_dict().keys() == model.state_dict().keys()


def test_padded_bidirectional_encoder_matches_the_library_at_odd_lengths(tmp_path):
    torch.manual_seed(0)
    model = Model("linear", eps=1e-2).eval()  # a non-default eps on one layer: it is taken over
    example = {
        "input_ids": torch.randint(0, 50, (2, 9)),
        "attention_mask": torch.ones(2, 9, dtype=torch.bool),
    }
    options = {"verify.seq_lens": [1, 7, 33, 64], "verify.batch": 3}  # random padding per row
    result = attnx.export_module(model, example, tmp_path / "o", options=options)
    assert result.parity.passed, result.parity.to_dict()
    assert result.manifest.module.adapters == ["fast_transformers"]
    assert {c.seq_len for c in result.parity.backends[0].comparisons} == {1, 7, 33, 64}


def test_causal_linear_matches_its_own_forward_decodes_and_generates_like_a_greedy_loop(tmp_path):
    torch.manual_seed(1)
    model = Model("causal-linear").eval()
    options = {"export.decode": True, "verify.seq_lens": [1, 7, 33, 64]}
    result = attnx.export_module(
        model, {"input_ids": torch.randint(0, 50, (2, 9))}, tmp_path / "o", options=options
    )
    statuses = {b.backend: b.status for b in result.parity.backends}
    assert statuses == {
        "ort-cpu": "passed",
        "torch decode": "passed",
        "ort-cpu decode": "passed",
        "ort-cpu genai": "passed",
    }
    assert result.manifest.decode.layers == ["recurrent", "recurrent"]
    assert [s.name for s in result.manifest.decode.state][:3] == ["length", "kv_sum", "k_sum"]
    prompt = [3, 14, 15, 9]
    generated = attnx.generate(tmp_path / "o", prompt, max_new_tokens=12)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert generated.tokens == ids[len(prompt) :]
    assert attnx.verify(tmp_path / "o", seq_lens=[5, 19]).passed


def test_the_librarys_own_onnx_export_of_causal_linear_is_wrong(tmp_path):
    """torch.onnx's TorchScript exporter traces the library's C++ causal product as the zeros it
    allocates for the result: the export succeeds and ONNX Runtime returns other numbers."""
    import onnxruntime

    torch.manual_seed(2)
    model = Model("causal-linear").eval()
    ids = torch.randint(0, 50, (1, 12))
    with torch.no_grad():
        expected = model(ids).numpy()
    path = tmp_path / "own.onnx"
    torch.onnx.export(
        model, (ids,), str(path), dynamo=False, input_names=["input_ids"], output_names=["logits"]
    )
    (own,) = onnxruntime.InferenceSession(str(path)).run(None, {"input_ids": ids.numpy()})
    assert np.abs(own - expected).max() > 0.05


@pytest.mark.parametrize(
    ("attention", "fragment"),
    [
        ("favor", "feature map Favor: attnx's linear variant computes phi(x) = elu(x) + 1"),
        (
            "clustered",
            "fast_transformers.attention.clustered_attention.ClusteredAttention (at encoder.layers.0",
        ),
    ],
)
def test_unsupported_library_layers_are_one_line_errors(tmp_path, attention, fragment):
    from fast_transformers.attention import ClusteredAttention, LinearAttention
    from fast_transformers.feature_maps import Favor

    model = Model("linear")
    for layer in model.encoder.layers:
        kernel = (
            LinearAttention(8, feature_map=Favor.factory(8))
            if attention == "favor"
            else ClusteredAttention(4)
        )
        layer.attention.inner_attention = kernel
    example = {
        "input_ids": torch.randint(0, 50, (2, 9)),
        "attention_mask": torch.ones(2, 9, dtype=torch.bool),
    }
    with pytest.raises(attnx.AttnxError, match=re.escape(fragment)):
        attnx.export_module(model.eval(), example, tmp_path / "o")
    assert not (tmp_path / "o").exists()
