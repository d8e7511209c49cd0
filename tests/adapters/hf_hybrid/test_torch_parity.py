"""The hf_hybrid adapter's modules against Hugging Face's own forward, in torch: each test on the models
as HF initialises them (seeded) in the default run and on the trained models in the slow set (``hybrid``).

Layers alone (Gated DeltaNet / Kimi Delta Attention / lightning, full / latent attention, MoE experts) and
whole models, at lengths inside one chunk of the linear layers (64) and across one and two chunks, batches
left-padded as generate pads (position ids cumsum(mask) - 1); stepping (prefill, then one token at a time)
against the full forward.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from transformers.masking_utils import create_causal_mask
from transformers.models.xlstm import modeling_xlstm as xlstm

from attnx.adapters.hf_hybrid import qwen
from attnx.adapters.hf_hybrid.attention import FullAttention
from attnx.adapters.hf_hybrid.convert import ARCHITECTURES, convert
from attnx.adapters.hf_hybrid.kimi import KimiDeltaAttention
from attnx.adapters.hf_hybrid.latent import LatentAttention
from attnx.adapters.hf_hybrid.lfm2 import GatedShortConv
from attnx.adapters.hf_hybrid.lightning import LightningAttention
from attnx.adapters.hf_hybrid.linear import GatedDeltaNet
from attnx.adapters.hf_hybrid.mamba import SiteAttention
from attnx.adapters.hf_hybrid.model import HandedPadding
from attnx.adapters.hf_hybrid.moe import DenseExperts
from attnx.adapters.hf_hybrid.olmo import OlmoAttention, OlmoGatedDeltaNet
from attnx.adapters.hf_hybrid.rgemma import RecurrentBlock
from attnx.adapters.hf_hybrid.rwkv import TimeMix, TokenShift
from attnx.adapters.hf_hybrid.scan import SelectiveScan
from attnx.adapters.hf_hybrid.ssd import StateSpaceDuality
from attnx.adapters.hf_hybrid.xlstm import MatrixLSTM
from attnx.registry import get_registry
from attnx.state import Step
from attnx.testing import hf_hybrid
from tests.adapters.hf_hybrid.conftest import ARCHS

LENGTHS = (1, 7, 65, 130)
# a test per length: inside one chunk of 64 and across it; the slow set adds one token and two chunks
LENGTH_CASES = [n if n in (7, 65) else pytest.param(n, marks=pytest.mark.slow) for n in LENGTHS]
TOLERANCE = get_registry().variant("softmax").tolerance


def padded(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A (2, n) mask whose second row is left-padded by n // 3, and generate's position ids for it."""
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, : n // 3] = 0
    return mask, padded_positions(mask)


def padded_positions(mask: torch.Tensor) -> torch.Tensor:
    """generate's position ids for a left-padded 2D ``mask``: cumsum(mask) - 1, 0 at padded tokens."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> float:
    torch.testing.assert_close(actual, expected, atol=TOLERANCE.atol, rtol=TOLERANCE.rtol)
    return float((actual - expected).abs().max())


# where each kind's mixer sits in a decoder layer: Qwen keeps the linear ones in ``linear_attn``, Bamba,
# Granite, Jamba and Falcon-H1 in ``mamba``, Mamba2 and Nemotron-H every kind in ``mixer``, MiniMax every
# kind in ``self_attn``, Zamba2's hybrid layers in their mamba decoder and shared transformer, LFM2 its
# short convolutions in ``conv``, RecurrentGemma both its kinds (its local attention "sliding_attention") in
# ``temporal_block``, xLSTM its mLSTM layers in ``mlstm_layer``, RWKV its time mix in ``attention``
MIXERS = {
    "linear_attention": (
        "linear_attn",
        "mamba",
        "mixer",
        "mamba_decoder.mamba",
        "self_attn",
        "temporal_block",
        "mlstm_layer",
        "attention",
    ),
    "conv": ("conv",),
    "full_attention": ("self_attn", "mixer", "shared_transformer.self_attn", "temporal_block"),
}
# layer types that are another kind for these tests: Qwen4-Exp's indexed attention is full attention within
# its indexer's budget (which the recipe sets to its positions' reach), RecurrentGemma's local attention
# within its window (the export's longest length)
KIND_OF = {"indexed_attention": "full_attention", "sliding_attention": "full_attention"}


def kind_of(layer_type: str) -> str:
    """The kind (a key of :data:`MIXERS`, or "hybrid") of a config's layer type."""
    return KIND_OF.get(layer_type, layer_type)


def _at(layer, path: str):
    for name in path.split("."):
        layer = getattr(layer, name, None)
    return layer


def decoder_layers(model) -> list:
    """The model's decoder layers (xLSTM's and RWKV's ``blocks``)."""
    base = model.base_model
    return list(base.layers if hasattr(base, "layers") else base.blocks)


def layers_of(model, kind: str) -> list:
    """The token mixers of the ``kind`` (a config's layer type: "linear_attention", LFM2's "conv",
    "full_attention") layers (Falcon-H1's and Zamba2's "hybrid" layers hold a linear and a full one)."""
    return [
        next(_at(layer, path) for path in MIXERS[kind] if _at(layer, path) is not None)
        for layer, layer_type in zip(decoder_layers(model), hf_hybrid.layer_types(model.config), strict=True)
        if kind_of(layer_type) in (kind, "hybrid")
    ]


def linear_layers(model) -> list:
    """The token mixers of every layer but the full attention ones (linear attention, the Mamba mixers, LFM2's
    convs; a hybrid layer's linear one)."""
    kinds = {
        "linear_attention" if kind == "hybrid" else kind_of(kind)
        for kind in hf_hybrid.layer_types(model.config)
    }
    kinds &= MIXERS.keys() - {"full_attention"}
    return [mixer for kind in sorted(kinds) for mixer in layers_of(model, kind)]


def call_linear(layer, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A linear layer's output on ``x`` (HF's and attnx's: Qwen's take x and the mask, MiniMax's the
    rotary too and return a pair, RecurrentGemma's generate's positions and no cache and return a pair;
    xLSTM's and RWKV's return a pair and are called without the mask, which attnx's are handed: the
    reference runs HF's on each row alone)."""
    if isinstance(layer, xlstm.xLSTMLayer):
        return layer(x)[0]
    if isinstance(layer, HandedPadding):
        layer.padding = mask
        try:
            return layer(x)[0]
        finally:
            layer.padding = None
    if hasattr(layer, "output_gate"):
        return layer(x, None, mask)[0]
    if hasattr(layer, "rg_lru"):
        positions = torch.arange(x.shape[1])[None] if mask is None else padded_positions(mask)
        return layer(x, position_ids=positions, attention_mask=mask, use_cache=False)[0]
    return layer(x, attention_mask=mask)


def leaky(model) -> bool:
    """HF's forward of ``model`` lets left padding reach the real tokens (``Architecture.leaky_padding``)."""
    return next(a for a in ARCHITECTURES.values() if isinstance(model, a.models)).leaky_padding


def hf_reference(model, run, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's output for the (left-padded by ``mask``) batch ``x`` and the positions to compare it at.

    ``run(x, mask)`` is HF's forward of a layer or model (``mask`` None: no padding). Its padded forward,
    every position; for a :func:`leaky` model each row alone, its real tokens only, placed at their positions
    (zeros at the padded ones, which are not compared)."""
    if mask is None or not leaky(model):
        out = run(x, mask)
        return out, torch.ones(out.shape[:2], dtype=torch.bool)
    outs = []
    for row, keep in zip(x, mask.bool(), strict=True):
        alone = run(row[keep][None], None)[0]
        zeros = torch.zeros(len(keep), *alone.shape[1:], dtype=alone.dtype)
        outs.append(zeros.index_copy(0, keep.nonzero()[:, 0], alone))
    return torch.stack(outs), mask.bool()


def hf_logits(model, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """HF's forward of ``model`` on ``ids`` (``mask``: left padding, with generate's positions)."""
    positions = None if mask is None else padded_positions(mask)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits


def a_random_bias_reaches_the_routing_and_matches_hf(model, buffer: str, n: int) -> tuple[torch.Tensor, ...]:
    """Set ``model``'s router buffers named ``*buffer`` (zero as HF initialises them) at random: HF's
    logits on a left-padded batch of ``n`` tokens change, and the adapted model's equal them. Returns the
    batch's mask and positions."""
    ids = torch.randint(0, model.config.vocab_size, (2, n), generator=torch.Generator().manual_seed(3))
    mask, positions = padded(n)
    with torch.no_grad():
        unbiased = hf_logits(model, ids, mask)
        for name, values in model.named_buffers():
            if name.endswith(buffer):
                values.copy_(torch.randn(values.shape, generator=torch.Generator().manual_seed(4)))
        expected = hf_logits(model, ids, mask)
        actual = convert(copy.deepcopy(model))(
            input_ids=ids, attention_mask=mask.bool(), position_ids=positions
        )
    assert float((expected - unbiased).abs().max()) > 1e-3
    assert_close(actual.logits, expected)
    return mask, positions


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n", LENGTH_CASES)
def test_linear_layers_match_hf(hybrid, arch, n):
    """Every linear layer (Gated DeltaNet, MiniMax's lightning attention, Mamba2, LFM2's gated short conv),
    padded or not, equals HF's (its chunked / blocked fallback) at every position."""
    if arch == "rwkv":
        pytest.skip("RWKV's HF layers drop the padding mask: test_rwkv_layers_match_hf_on_each_row_alone")
    torch.manual_seed(n)
    mask, _ = padded(n)
    model = hybrid(arch)
    layers = linear_layers(model)
    assert layers
    for layer in layers:
        adapted = convert(layer)
        kinds = (
            GatedDeltaNet,
            LightningAttention,
            StateSpaceDuality,
            SelectiveScan,
            GatedShortConv,
            RecurrentBlock,
            MatrixLSTM,
        )
        assert isinstance(adapted, kinds)
        x = torch.randn(2, n, model.config.hidden_size)
        with torch.no_grad():
            for attention_mask in (None, mask):
                expected, keep = hf_reference(model, functools.partial(call_linear, layer), x, attention_mask)
                assert_close(call_linear(adapted, x, attention_mask)[keep], expected[keep])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n", LENGTH_CASES)
def test_attention_layers_match_hf(hybrid, arch, n):
    """Every full attention layer (Qwen's output gate, partial rotary and q/k norms; grouped KV heads;
    RecurrentGemma's local ones within their window) equals HF's (default SDPA path) on a left-padded batch,
    padded positions included (HF given its own 4D mask, attnx the 2D one)."""
    if arch == "zamba2":
        pytest.skip(
            "Zamba2's shared attention takes its caller's layer index and 2 x width inputs: the whole-model, "
            "padded-row and stepping tests cover it"
        )
    torch.manual_seed(n)
    model = hybrid(arch)
    mask, positions = padded(n)
    x = torch.randn(2, n, model.config.hidden_size)
    layers = layers_of(model, "full_attention")
    kinds = {kind_of(t) for t in hf_hybrid.layer_types(model.config)}
    assert layers or not kinds & {"full_attention", "hybrid"}
    attention_layers_match_hf(model, layers, x, mask, positions)


def attention_layers_match_hf(model, layers, x: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
    """Each of ``layers`` (full attention of ``model``) converted equals HF's on ``x``; HF given its own 4D
    mask, attnx the 2D one; cos/sin from the model's rotary module where it has one (LFM2-MoE names its
    ``pos_emb``), else None (Kimi's MLA; Lara Mini's full attention layers, which HF passes None; OLMo
    Hybrid's and Granite's configs without positions, whose architecture has a rotary class); a layer that
    holds its own rotary module (RecurrentGemma's) takes the positions."""
    kind = next(a.rotary for a in ARCHITECTURES.values() if isinstance(model, a.models))
    module = next((m for m in model.modules() if kind is not None and isinstance(m, kind)), None)
    if module is not None and any(module is m for layer in layers for m in layer.children()):
        rotary = {"position_ids": positions}
    else:
        rotary = {"position_embeddings": None if module is None else module(x, positions)}
    # always a mask (never HF's is_causal skip), as Qwen4-Exp's model builds it for its indexer to read
    full = create_causal_mask(
        config=model.config,
        inputs_embeds=x,
        attention_mask=mask,
        cache=None,
        position_ids=positions,
        allow_is_causal_skip=False,
    )
    for layer in layers:
        with torch.no_grad():
            expected, _ = layer(x, attention_mask=full, **rotary)
            actual, _ = convert(layer)(x, attention_mask=mask.bool(), **rotary)
        assert_close(actual, expected)


@pytest.mark.parametrize("n", (7, 65))
def test_kimi_latent_attention_with_a_low_rank_query_matches_hf(n):
    """Kimi's MLA with ``q_lora_rank`` set (q_a_proj -> RMSNorm -> q_b_proj; the trained recipe has the
    released plain q_proj) equals HF's, random weights, left-padded."""
    import transformers

    options = {**hf_hybrid.RECIPES["kimi_linear"]["options"], "q_lora_rank": 24, "attention_bias": True}
    torch.manual_seed(n)
    model = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**options)).eval()
    layers = layers_of(model, "full_attention")
    assert all(layer.q_proj is None and layer.q_a_proj is not None for layer in layers)
    mask, positions = padded(n)
    attention_layers_match_hf(model, layers, torch.randn(2, n, model.config.hidden_size), mask, positions)


@pytest.mark.parametrize("arch", ["qwen3_next", "kimi_linear", "nemotron_h"])
@pytest.mark.parametrize("implementation", ["eager", "grouped_mm"])
def test_dense_experts_match_hf_experts(hybrid, arch, implementation):
    """DenseExperts computes HF's sparse sum over each token's chosen experts (both HF paths), for Qwen's
    softmax router, Kimi's and Nemotron-H's DeepSeek-V3 one (grouped top-k, scaled weights; Nemotron-H's
    experts without a gate)."""
    model = copy.deepcopy(hybrid(arch))
    model.set_experts_implementation(implementation)
    blocks = [m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate")]
    assert blocks
    for block in blocks:
        torch.manual_seed(0)
        x = torch.randn(37, model.config.hidden_size)
        _, weights, index = block.gate(x)
        with torch.no_grad():
            assert_close(DenseExperts(block.experts)(x, index, weights), block.experts(x, index, weights))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n", LENGTH_CASES)
def test_whole_models_match_hf_forward(hybrid, arch, n):
    """The adapted model's logits equal HF's forward on generate-style (left-padded) batches, padded
    positions included (RecurrentGemma and RWKV, whose HF forward lets the padding leak: HF's forward of
    each row alone, at the real positions)."""
    torch.manual_seed(n)
    whole_model_matches_hf(hybrid(arch), n)


def whole_model_matches_hf(model, n: int) -> float:
    """``model`` converted equals HF's forward on a left-padded batch of ``n`` random tokens (generate's
    positions), padded positions included where HF honours the mask (:func:`hf_reference`); returns
    the max abs logit error."""
    adapted = convert(copy.deepcopy(model))
    ids = torch.randint(0, model.config.vocab_size, (2, n))
    mask, positions = padded(n)
    with torch.no_grad():
        expected, keep = hf_reference(model, functools.partial(hf_logits, model), ids, mask)
        actual = adapted(input_ids=ids, attention_mask=mask.bool(), position_ids=positions).logits
    return assert_close(actual[keep], expected[keep])


@pytest.mark.parametrize("arch", ARCHS)
def test_a_left_padded_row_equals_the_row_alone(hybrid, arch):
    """The padded tokens of a left-padded row never reach a layer's conv, state or keys: its logits at the
    real tokens equal the same tokens run alone (no mask, positions from 0)."""
    adapted = convert(copy.deepcopy(hybrid(arch)))
    torch.manual_seed(1)
    n, pad = 21, 8
    ids = torch.randint(0, hybrid(arch).config.vocab_size, (2, n))
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, :pad] = 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        batch = adapted(input_ids=ids, attention_mask=mask.bool(), position_ids=positions).logits
        alone = adapted(input_ids=ids[1:, pad:]).logits
    assert_close(batch[1:, pad:], alone)


def test_a_wrong_projection_split_is_caught(hybrid):
    """Seeded defect: Qwen3.5's b and a projections swapped (decay from b, beta from a) fail the parity
    the layer test above checks."""

    def swapped(layer, x):
        qkv, z, b, a = qwen.project_35(layer, x)
        return qkv, z, a, b

    layer = layers_of(hybrid("qwen3_5"), "linear_attention")[0]
    wrong = GatedDeltaNet(layer, swapped, convert(layer).activation)
    x = torch.randn(1, 65, layer.hidden_size)
    with torch.no_grad(), pytest.raises(AssertionError):
        assert_close(wrong(x), layer(x))


def test_a_kimi_decay_per_head_instead_of_per_key_is_caught(hybrid):
    """Seeded defect: Kimi's per-key-channel decay averaged to one decay per head (Gated DeltaNet's form)
    fails the parity the layer test above checks."""

    class PerHead(KimiDeltaAttention):
        def decay(self, a):
            return super().decay(a).mean(-1, keepdim=True)

    layer = layers_of(hybrid("kimi_linear"), "linear_attention")[0]
    x = torch.randn(1, 65, layer.hidden_size)
    with torch.no_grad():
        assert_close(KimiDeltaAttention(layer)(x), layer(x))
        with pytest.raises(AssertionError):
            assert_close(PerHead(layer)(x), layer(x))


def test_a_kimi_key_with_its_shared_part_first_is_caught(hybrid):
    """Seeded defect: Kimi's MLA keys assembled as [shared, own] instead of HF's [own, shared] (the same
    numbers, another order against the queries) fail the attention layer parity."""

    class SharedFirst(LatentAttention):
        def project(self, x, position_embeddings):
            query, key, value, gate = super().project(x, position_embeddings)
            return query, key.roll(self.shared_dim, dims=-1), value, gate

    model = hybrid("kimi_linear")
    (layer,) = layers_of(model, "full_attention")
    x = torch.randn(1, 33, model.config.hidden_size)
    with torch.no_grad():
        expected, _ = layer(x, attention_mask=None)
        assert_close(LatentAttention(layer)(x)[0], expected)
        with pytest.raises(AssertionError):
            assert_close(SharedFirst(layer)(x)[0], expected)


@pytest.mark.parametrize("arch", ["mamba2", "bamba"])
def test_a_mamba_mixer_that_skips_the_mask_after_its_conv_is_caught(hybrid, arch):
    """Seeded defect: the Mamba2 mixer masking padded tokens only before its conv (the conv's bias then
    gives them non-zero x, B, C that reach the state) fails the padded parity the layer test checks, while
    an unpadded batch still matches (so the test sees the mask, not a broken layer)."""

    class MaskedOnce(StateSpaceDuality):
        def mix(self, x, mask, state):
            return super().mix((x * mask[:, :, None]) if mask is not None else x, None, state)

    layer = copy.deepcopy(layers_of(hybrid(arch), "linear_attention")[0])
    torch.manual_seed(0)
    torch.nn.init.normal_(layer.conv1d.bias)  # HF initialises it to zeros, which hides the defect
    x = torch.randn(2, 20, hybrid(arch).config.hidden_size)
    mask, _ = padded(20)
    with torch.no_grad():
        assert_close(MaskedOnce(layer)(x), layer(x))
        with pytest.raises(AssertionError):
            assert_close(MaskedOnce(layer)(x, attention_mask=mask), layer(x, attention_mask=mask))


def _first_head_of_each_group(layer) -> torch.Tensor:
    """Mamba2's A_log (heads,) with every head of a B/C group given its group's first head's decay."""
    per_group = layer.num_heads // layer.n_groups
    return layer.A_log.data.reshape(layer.n_groups, per_group)[:, :1].expand(-1, per_group).flatten()


def _mean_over_the_state(layer) -> torch.Tensor:
    """Mamba1's A_log (channels, state) averaged over the state dimension: one decay per channel."""
    log = layer.A_log.data
    return log.exp().mean(-1, keepdim=True).log().expand_as(log)


@pytest.mark.parametrize(
    ("arch", "wrong"), [("mamba2", _first_head_of_each_group), ("mamba", _mean_over_the_state)]
)
def test_a_mamba_decay_of_the_wrong_shape_is_caught(hybrid, arch, wrong):
    """Seeded defects: Mamba2's dt A taken per B/C group instead of per head, Mamba1's per channel (a scalar
    decay per head as in Mamba2) instead of per channel and state dimension: each fails the layer parity
    the right layer passes."""
    layer = layers_of(hybrid(arch), "linear_attention")[0]
    broken = copy.deepcopy(layer)
    broken.A_log.data = wrong(layer).clone()
    torch.manual_seed(0)
    x = torch.randn(1, 33, hybrid(arch).config.hidden_size)
    with torch.no_grad():
        assert_close(convert(layer)(x), layer(x))
        with pytest.raises(AssertionError):
            assert_close(convert(broken)(x), layer(x))


def test_a_zamba2_attention_with_another_sites_adapters_is_caught(hybrid):
    """Seeded defect: Zamba2's two shared-attention call sites with each other's LoRA adapters (HF picks
    them by the calling layer's index) fail the whole-model parity."""
    model = hybrid("zamba2")
    adapted = convert(copy.deepcopy(model))
    first, second = [m for m in adapted.modules() if isinstance(m, SiteAttention)]
    ids = torch.randint(0, model.config.vocab_size, (1, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False).logits
        assert_close(adapted(input_ids=ids).logits, expected)
        first.adapter, second.adapter = second.adapter, first.adapter
        with pytest.raises(AssertionError):
            assert_close(adapted(input_ids=ids).logits, expected)


def test_an_lfm2_conv_with_b_and_c_swapped_is_caught(hybrid):
    """Seeded defect: LFM2's conv layer reading ``in_proj``'s chunks as C, B, x (y = B conv(C x) instead of
    HF's C conv(B x)) fails the parity the layer test above checks."""
    layer = layers_of(hybrid("lfm2"), "conv")[0]
    right, wrong = convert(layer), convert(copy.deepcopy(layer))
    with torch.no_grad():
        b, c, xs = wrong.in_proj.weight.chunk(3)
        wrong.in_proj.weight.copy_(torch.cat([c, b, xs]))
        # B (C x) and C (B x) differ only through the conv's mixing of tokens: at unit inputs and initialised
        # weights (std 0.02) that is about 1e-4, the tolerance itself; inputs of scale 10 put it 100x above
        x = 10 * torch.randn(1, 33, layer.config.hidden_size, generator=torch.Generator().manual_seed(0))
        assert_close(right(x), layer(x))
        with pytest.raises(AssertionError):
            assert_close(wrong(x), layer(x))


def test_a_recurrent_gemma_block_without_the_reset_is_caught(hybrid):
    """Seeded defect: RecurrentGemma's RG-LRU without HF's reset at position 0 (its first input scaled by
    sqrt(1 - a^2) like every other) fails the layer parity the right block passes."""

    class NoReset(RecurrentBlock):
        def mix(self, x, mask, state, positions=None):
            return super().mix(x, mask, state, torch.arange(1, x.shape[1] + 1)[None])

    layer = layers_of(hybrid("recurrent_gemma"), "linear_attention")[0]
    x = torch.randn(1, 33, layer.hidden_size)
    with torch.no_grad():
        assert_close(call_linear(convert(layer), x, None), call_linear(layer, x, None))
        with pytest.raises(AssertionError):
            assert_close(call_linear(NoReset(layer), x, None), call_linear(layer, x, None))


def test_a_recurrent_gemma_conv_that_reads_padding_as_hf_does_is_caught(hybrid):
    """Seeded defect: RecurrentGemma's recurrent blocks convolving ``linear_x`` of the padded tokens, as
    HF's own forward does (its leak), fail the padded parity (HF's rows alone) the right model passes."""

    class Unmasked(RecurrentBlock):
        def conv_input(self, x, mask):
            return super().conv_input(x, None)

    model = hybrid("recurrent_gemma")
    right, leaking = convert(copy.deepcopy(model)), convert(copy.deepcopy(model))
    for block in [m for m in leaking.modules() if isinstance(m, RecurrentBlock)]:
        block.__class__ = Unmasked
    ids = torch.randint(0, model.config.vocab_size, (2, 21), generator=torch.Generator().manual_seed(0))
    mask, positions = padded(21)
    with torch.no_grad():
        expected, keep = hf_reference(model, functools.partial(hf_logits, model), ids, mask)
        inputs = {"input_ids": ids, "attention_mask": mask.bool(), "position_ids": positions}
        assert_close(right(**inputs).logits[keep], expected[keep])
        with pytest.raises(AssertionError):
            assert_close(leaking(**inputs).logits[keep], expected[keep])


def test_lfm2_moe_routing_with_an_expert_bias_matches_hf_on_padded_batches():
    """LFM2-MoE's router picks the top-k of sigmoid scores plus ``expert_bias`` (a buffer: zero as HF
    initialises it and as training leaves it) but weights by the scores alone; with a random bias that
    changes the choice, the whole model equals HF's on a left-padded batch, and differs from the same model
    without the bias (so the bias reaches the routing)."""
    a_random_bias_reaches_the_routing_and_matches_hf(hf_hybrid.build("lfm2_moe").eval(), "expert_bias", 37)


def test_qwen4_exp_exports_no_longer_than_its_indexer_budget():
    """Qwen4-Exp's QSA indexer keeps every key while a query sees at most ``indexer_budget`` of them, and
    only then is its attention attnx's full attention: with a budget of 16 the adapted model equals HF's
    on a left-padded batch of 16 tokens, differs past it (HF's indexer drops blocks of keys there), and
    the adapter caps the export's lengths at the budget."""
    from attnx.adapters.hf_hybrid.convert import lengths

    model = hf_hybrid.build("qwen4_exp", indexer_budget=16).eval()
    assert lengths(model).maximum == 16
    adapted = convert(copy.deepcopy(model))
    for n, equal in ((16, True), (40, False)):
        ids = torch.randint(0, model.config.vocab_size, (2, n), generator=torch.Generator().manual_seed(n))
        mask, positions = padded(n)
        with torch.no_grad():
            expected = model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).logits
            actual = adapted(input_ids=ids, attention_mask=mask.bool(), position_ids=positions).logits
        if equal:
            assert_close(actual, expected)
        else:
            assert float((actual - expected).abs().max()) > 1e-3


def test_bailing_unbounded_gate_low_rank_query_and_expert_bias_match_hf_on_padded_batches():
    """Bailing's options the trained recipe leaves at their released values, with random weights: the
    unbounded forget gate (``kda_safe_gate`` false: -exp(A_log) softplus), a low-rank query (``q_lora_rank``)
    and a random ``e_score_correction_bias`` (zero as HF initialises it; it changes the routing here): every
    layer and the whole model equal HF's on a left-padded batch across a chunk."""
    model = hf_hybrid.build("bailing_hybrid", kda_safe_gate=False, q_lora_rank=24).eval()
    n = 65
    mask, positions = a_random_bias_reaches_the_routing_and_matches_hf(model, "e_score_correction_bias", n)
    torch.manual_seed(n)
    for layer in layers_of(model, "linear_attention"):
        assert not layer.forget_gate.safe_gate
        x = torch.randn(2, n, model.config.hidden_size)
        with torch.no_grad():
            assert_close(call_linear(convert(layer), x, mask), call_linear(layer, x, mask))
    layers = layers_of(model, "full_attention")
    assert all(layer.q_proj is None and layer.q_a_proj is not None for layer in layers)
    attention_layers_match_hf(model, layers, torch.randn(2, n, model.config.hidden_size), mask, positions)


def test_a_bailing_rotary_on_halves_instead_of_pairs_is_caught(hybrid):
    """Seeded defect: Bailing's MLA rotated as Llama rotates (``rotate_half``: channel i with i + d/2)
    instead of HF's interleaved pairs (2i, 2i + 1) fails the attention layer parity."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = hybrid("bailing_hybrid")
    (layer,) = layers_of(model, "full_attention")
    mask, positions = padded(33)
    x = torch.randn(2, 33, model.config.hidden_size)
    rotary = {"position_embeddings": model.model.rotary_emb(x, positions)}
    with torch.no_grad():
        expected, _ = layer(x, attention_mask=None, **rotary)
        assert_close(convert(layer)(x, **rotary)[0], expected)
        halves = LatentAttention(layer, rotate=apply_rotary_pos_emb, head_gate=True)
        with pytest.raises(AssertionError):
            assert_close(halves(x, **rotary)[0], expected)


@pytest.mark.parametrize("n", (7, 65))
def test_lfm2_convs_with_biases_match_hf_on_padded_batches(n):
    """LFM2 with ``conv_bias`` (the released configs have none; random weights and biases): a padded
    token's B x is the product of the projection's biases, which HF convolves unmasked; the layers and the
    whole model equal HF's on left-padded batches."""
    model = hf_hybrid.build("lfm2", conv_bias=True).eval()
    torch.manual_seed(n)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.5)
    mask, _ = padded(n)
    for layer in layers_of(model, "conv"):
        x = torch.randn(2, n, model.config.hidden_size)
        with torch.no_grad():
            assert_close(call_linear(convert(layer), x, mask), call_linear(layer, x, mask))
    whole_model_matches_hf(model, n)


class PerHeadNorms(OlmoAttention):
    """OLMo's attention with its q/k RMSNorms taken per head (Qwen's and LFM2's form: one mean square per
    head) instead of over the whole projection."""

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def per_head(norm, t: torch.Tensor) -> torch.Tensor:
            heads = t.view(*t.shape[:-1], -1, self.head_dim)
            scale = torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
            return norm.weight * (heads * scale).flatten(-2)

        return per_head(self.q_norm, self.q_proj(x)), per_head(self.k_norm, self.k_proj(x)), self.v_proj(x)


class SigmoidBeta(OlmoGatedDeltaNet):
    """OLMo's Gated DeltaNet with Qwen's beta = sigmoid(b), ignoring ``linear_allow_neg_eigval``."""

    def beta(self, b: torch.Tensor) -> torch.Tensor:
        return b.sigmoid()


@pytest.mark.parametrize(
    ("kind", "wrong"), [("full_attention", PerHeadNorms), ("linear_attention", SigmoidBeta)]
)
def test_an_olmo_layer_in_qwens_form_is_caught(hybrid, kind, wrong):
    """Seeded defects: OLMo Hybrid's attention with q/k norms per head, its Gated DeltaNet with beta =
    sigmoid(b) (Qwen's forms, where OLMo normalises the whole projection and doubles beta) each fail the
    parity the right layer passes."""
    model = hybrid("olmo_hybrid")
    layer = layers_of(model, kind)[0]
    x = torch.randn(2, 33, model.config.hidden_size, generator=torch.Generator().manual_seed(0))

    def run(module) -> torch.Tensor:  # (x, no cos/sin or no cache, no mask): both kinds, HF's and attnx's
        out = module(x, None, None)
        return out[0] if isinstance(out, tuple) else out

    with torch.no_grad():
        expected = run(layer)
        assert_close(run(convert(layer)), expected)
        with pytest.raises(AssertionError):
            assert_close(run(wrong(layer)), expected)


@pytest.mark.parametrize(
    "change",
    [
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        {"linear_allow_neg_eigval": False},
    ],
    ids=["rope", "sigmoid-beta"],
)
def test_olmo_hybrid_off_its_recipe_matches_hf(change):
    """OLMo Hybrid with a rotary (the released checkpoints and the recipe have none) and with beta =
    sigmoid(b) (``linear_allow_neg_eigval`` false), random weights: the attention layers and the whole model
    equal HF's on left-padded batches, and prefill then steps (cos/sin from the model's rotary module)
    equals the full forward."""
    model = hf_hybrid.build("olmo_hybrid", **change).eval()
    assert (model.model.rotary_emb is None) == ("rope_parameters" not in change)
    torch.manual_seed(0)
    mask, positions = padded(65)
    x = torch.randn(2, 65, model.config.hidden_size)
    attention_layers_match_hf(model, layers_of(model, "full_attention"), x, mask, positions)
    whole_model_matches_hf(model, 65)
    steps_match_the_full_forward(model, 9)


@pytest.mark.parametrize("n", LENGTH_CASES)
def test_rwkv_layers_match_hf_on_each_row_alone(hybrid, n):
    """RWKV's time and channel mixes equal HF's; on a left-padded batch (HF's layers drop the mask, attnx's
    are handed it) each row's real tokens equal HF's layer on those tokens alone."""
    model = hybrid("rwkv")
    mask, _ = padded(n)
    real = mask.bool()
    torch.manual_seed(n)
    for block in decoder_layers(model):
        for layer in (block.attention, block.feed_forward):
            adapted = convert(layer)
            assert isinstance(adapted, TokenShift)
            x = torch.randn(2, n, model.config.hidden_size)
            with torch.no_grad():
                assert_close(call_linear(adapted, x, None), layer(x)[0])
                actual = call_linear(adapted, x, real)
                for row in range(2):
                    assert_close(actual[row, real[row]], layer(x[row : row + 1, real[row]])[0][0])


def test_an_rwkv_wkv_that_reads_the_state_after_the_token_is_caught(hybrid):
    """Seeded defect: the gated op fed token t itself, so its output reads the state after t's decay and
    update (e^w a_{t-1} + e^k v) where RWKV reads a_{t-1} before adding e^(u + k) v: fails the layer parity
    the shifted feed passes."""

    class Unshifted(TimeMix):
        def wkv_inputs(self, weighted, pair, decay):
            return weighted.transpose(1, 2)[..., None], pair.transpose(1, 2), decay.transpose(1, 2)[..., None]

    layer = decoder_layers(hybrid("rwkv"))[1].attention
    x = torch.randn(1, 33, layer.config.hidden_size)
    with torch.no_grad():
        assert_close(TimeMix(layer)(x)[0], layer(x)[0])
        with pytest.raises(AssertionError):
            assert_close(Unshifted(layer)(x)[0], layer(x)[0])


@pytest.mark.parametrize("rescale_every", (0, 1, 3))
def test_rwkv_rescaling_matches_hf(rescale_every):
    """HF halves RWKV's hidden states every ``rescale_every`` blocks in inference (and divides the later
    blocks' output weights to match, in place, at its first eval forward); the adapted model, converted
    before HF's first forward from a copy sharing its parameters (as attnx's walk copies), equals HF's on a
    left-padded batch whatever the setting, and leaves HF's weights as they were."""
    model = hf_hybrid.build("rwkv", rescale_every=rescale_every).eval()
    weights = {name: p.clone() for name, p in model.named_parameters()}
    adapted = convert(copy.deepcopy(model, memo={id(p): p for p in model.parameters()}))
    ids = torch.randint(0, model.config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(5))
    mask, positions = padded(23)
    with torch.no_grad():
        actual = adapted(input_ids=ids, attention_mask=mask.bool(), position_ids=positions).logits
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())
    with torch.no_grad():  # HF divides its weights here
        expected, keep = hf_reference(model, functools.partial(hf_logits, model), ids, mask)
    assert_close(actual[keep], expected[keep])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompt", [pytest.param(p, marks=pytest.mark.slow) for p in (1, 9)] + [66])
def test_prefill_then_steps_equal_the_full_forward(hybrid, arch, prompt):
    """Stepping every layer (the conv and recurrent state of the linear layers, the KV cache of the
    attention layers): prefill ``prompt`` tokens, then one token at a time, equals the full forward."""
    steps_match_the_full_forward(hybrid(arch), prompt)


def steps_match_the_full_forward(model, prompt: int, adapted=None, steps: int = 4) -> None:
    """``adapted`` (default: ``model`` converted), every layer stepping: prefill ``prompt`` tokens, then
    ``steps`` one at a time, equals HF's full forward."""
    adapted = convert(copy.deepcopy(model)) if adapted is None else adapted
    layers = [m for m in adapted.modules() if hasattr(m, "stepping")]
    torch.manual_seed(prompt)
    ids = torch.randint(0, model.config.vocab_size, (2, prompt + steps))
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False).logits
        past, start = None, 0
        for end in (prompt, *range(prompt + 1, prompt + steps + 1)):
            position = torch.tensor([start])
            for i, layer in enumerate(layers):
                layer.stepping = Step(None if past is None else past[i], position)
            logits = adapted(input_ids=ids[:, start:end], past_length=position).logits
            past = [layer.stepping.present for layer in layers]
            assert_close(logits, expected[:, start:end])
            start = end
    for layer in layers:
        layer.stepping = None


def test_a_lara_full_attention_layer_that_rotates_is_caught(hybrid):
    """Seeded defect: Lara Mini's full attention layers take no positions (HF passes cos/sin only to its
    sliding layers); stepped with cos/sin from the model's rotary module, as a declaration with
    ``rotary=LaraMiniRotaryEmbedding`` would wire them, the adapted model no longer equals HF's forward
    (the whole-sequence call is unchanged: HF's model passes the layer None)."""
    model = hybrid("lara_mini")
    adapted = convert(copy.deepcopy(model))
    steps_match_the_full_forward(model, 9, adapted)
    layers = [m for m in adapted.modules() if isinstance(m, FullAttention)]
    assert layers
    for layer in layers:
        layer.rotary = model.base_model.rotary_emb.forward
    with pytest.raises(AssertionError):
        steps_match_the_full_forward(model, 9, adapted)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_steps_equal_hf_generate_for_200_tokens(trained, saved_dir, arch):
    """Stepping the adapted model (prefill, then one token per step) picks HF generate's greedy tokens
    (HF's own cache path: its recurrent rule and conv update) for 200 tokens, up to a float tie."""
    import transformers

    model = trained(arch)
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved_dir(arch))
    prompt = tokenizer("def fibonacci(n):\n    ", return_tensors="pt").input_ids
    expected, logits = hf_hybrid.hf_greedy(model, prompt, 200)
    adapted = convert(copy.deepcopy(model))
    layers = [m for m in adapted.modules() if hasattr(m, "stepping")]
    tokens, past, ids, start = [], None, prompt, 0
    with torch.no_grad():
        while len(tokens) < 200:
            position = torch.tensor([start])
            for i, layer in enumerate(layers):
                layer.stepping = Step(None if past is None else past[i], position)
            logits_now = adapted(input_ids=ids, past_length=position).logits[0, -1]
            past = [layer.stepping.present for layer in layers]
            start += ids.shape[1]
            tokens.append(int(logits_now.argmax()))
            ids = torch.tensor([[tokens[-1]]])
    agreed, tie = hf_hybrid.agreement(expected, logits, tokens, TOLERANCE.atol)
    assert agreed == 200 or tie is not None
    print(f"{arch}: {agreed} tokens agree" + (f", float tie at step {tie}" if tie is not None else ""))


@pytest.mark.parametrize("arch", ARCHS)
def test_each_layer_steps_on_its_own(hybrid, arch):
    """``step(x, state, position)`` of every converted layer (the layer's own decode protocol: the
    attention layers take cos/sin from the model's rotary module, where it has one): a prompt of 9, then one
    token at a time, equals the layer's full forward on the whole sequence."""
    adapted = convert(copy.deepcopy(hybrid(arch)))
    torch.manual_seed(0)
    for layer in [m for m in adapted.modules() if hasattr(m, "step")]:
        width = next(m.in_features for m in layer.modules() if isinstance(m, torch.nn.Linear))  # Zamba2: 2x
        x = torch.randn(2, 12, width)
        with torch.no_grad():
            if isinstance(layer, FullAttention):
                expected = layer.attend(x, layer.embeddings_at(x, torch.tensor([0])), None, None)[0]
            else:
                expected = call_linear(layer, x, None)
            out, state = layer.step(x[:, :9], None, torch.tensor([0]))
            outs = [out]
            for i in range(9, 12):
                out, state = layer.step(x[:, i : i + 1], state, torch.tensor([i]))
                outs.append(out)
        assert_close(torch.cat(outs, dim=1), expected)


def test_an_xlstm_normaliser_without_its_floor_of_one_is_caught(hybrid):
    """Seeded defect: the mLSTM's h = q.C / |q.n| without HF's max(|q.n|, 1) (exp(-m) stabilised) fails the
    layer parity (HF initialises the input gates at exp(-10), so |q.n| is far below 1)."""

    class Unfloored(MatrixLSTM):
        def normalise(self, out):
            return out[..., :-1] / out[..., -1:].abs()

    layer = layers_of(hybrid("xlstm"), "linear_attention")[0]
    x = torch.randn(1, 33, hybrid("xlstm").config.hidden_size)
    with torch.no_grad():
        expected = layer(x)[0]
        assert_close(MatrixLSTM(layer)(x)[0], expected)
        with pytest.raises(AssertionError):
            assert_close(Unfloored(layer)(x)[0], expected)


def test_xlstm_left_padding_reaches_hf_but_not_attnx(hybrid):
    """HF's xLSTM ignores ``attention_mask`` (its padding enters the state); attnx masks it: the padded row
    differs from the row alone in HF and equals it in attnx."""
    model = hybrid("xlstm")
    ids = torch.randint(0, model.config.vocab_size, (1, 21), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(1, 21, dtype=torch.long)
    mask[:, :8] = 0
    with torch.no_grad():
        alone = model(input_ids=ids[:, 8:], use_cache=False).logits
        padded_hf = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, 8:]
        padded = convert(copy.deepcopy(model))(input_ids=ids, attention_mask=mask.bool()).logits[:, 8:]
    assert float((padded_hf - alone).abs().max()) > 1e-3
    assert_close(padded, alone)
