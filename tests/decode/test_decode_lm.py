"""The stateful torch graphs of a causal LM: prefill + one-token steps give the full forward's logits."""

from __future__ import annotations

import pytest
import torch

from attnx.decode.model import DecodeLayout, StepModel
from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from tests.decode.conftest import DECODERS, lm_options


def step_logits(assembly, ids, prompt, source=()):
    """Logits of ``ids`` from prefill on ids[:, :prompt] (after a seq2seq ``source``: ids, mask), then
    one decode call per later token."""
    layout = DecodeLayout.of(assembly.module)
    prefill, decode = StepModel(assembly.module, layout, False), StepModel(assembly.module, layout, True)
    with torch.inference_mode():
        logits, *state = prefill(*source, ids[:, :prompt])
        made = len(layout.made())  # seq2seq: the cached cross keys/values (or the encoder output)
        context = [*state[:made], source[1]] if source else []  # ... and the source mask
        state = state[made:]
        rows = [logits]
        for t in range(prompt, ids.shape[1]):
            logits, *state = decode(ids[:, t : t + 1], *context, *state)
            rows.append(logits)
    return torch.cat(rows, 1), state


def full_logits(assembly, ids, source=()):
    target_mask = [torch.ones(ids.shape, dtype=torch.bool)] if source else []
    with torch.inference_mode():
        return assembly.module(*source, ids, *target_mask)[0]


@pytest.mark.parametrize("variant", DECODERS)
@pytest.mark.parametrize(("batch", "prompt", "total"), [(1, 1, 9), (2, 5, 12), (3, 11, 14)])
def test_steps_reproduce_the_full_forward_at_every_position(variant, batch, prompt, total):
    assembly = assemble(variant, "lm", lm_options(variant, n_layers=2), seed=prompt)
    ids = torch.randint(0, 50, (batch, total), generator=torch.Generator().manual_seed(total))
    stepped, state = step_logits(assembly, ids, prompt)
    torch.testing.assert_close(stepped, full_logits(assembly, ids), atol=1e-5, rtol=1e-4)
    assert state[0].tolist() == [total]  # present_length


@pytest.mark.parametrize("structure", [{"reversible": True}, {"share_layers": True}, {"ff_chunks": 3}])
@pytest.mark.parametrize("variant", ["softmax", "linear"])
def test_steps_follow_every_layer_structure(variant, structure):
    """Reversible residuals, one attention module shared by all layers (each layer keeps its own state)."""
    assembly = assemble(variant, "lm", lm_options(variant, n_layers=3, **structure), seed=2)
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(5))
    stepped, state = step_logits(assembly, ids, 4)
    torch.testing.assert_close(stepped, full_logits(assembly, ids), atol=1e-5, rtol=1e-4)
    assert len(state) == 1 + 3 * 2  # present_length, then two tensors per layer


def test_positions_continue_from_past_length():
    """A decode step told the wrong past length embeds the token at the wrong position."""
    assembly = assemble("linear", "lm", lm_options("linear"), seed=0)
    layout = DecodeLayout.of(assembly.module)
    prefill, decode = StepModel(assembly.module, layout, False), StepModel(assembly.module, layout, True)
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, length, *state = prefill(ids[:, :5])
        right = decode(ids[:, 5:], length, *state)[0]
        wrong = decode(ids[:, 5:], length + 3, *state)[0]
    torch.testing.assert_close(right, full_logits(assembly, ids)[:, 5:], atol=1e-5, rtol=1e-4)
    assert (right - wrong).abs().max() > 1e-3


@pytest.mark.parametrize("variant", DECODERS)
def test_layout_declares_fixed_or_growing_state(variant):
    assembly = assemble(variant, "lm", lm_options(variant, n_layers=2), seed=0)
    layout = DecodeLayout.of(assembly.module)
    names = [s.input for s in layout.slots]
    assert names[0] == "past_length" and len(names) == 5
    grows = {s.tensor.grows for s in layout.layer_slots}
    declared = assembly.variant.capabilities.decode
    assert grows == {declared == "kv-cache"}
    assert layout.kinds() == [declared, declared]  # each layer's kind follows from its roles


def test_a_layer_without_the_decode_methods_is_refused_by_name():
    """A third-party variant that declares decode but gives its layer no decode_state/step."""
    assembly = assemble("softmax", "lm", lm_options("softmax"), seed=0)
    assembly.module.blocks[0].attention = torch.nn.Identity()
    with pytest.raises(
        AttnxError, match=r"attention layer 0 \(Identity\) does not decode: it lacks decode_state"
    ):
        DecodeLayout.of(assembly.module)


@pytest.mark.parametrize("variant", DECODERS)
@pytest.mark.parametrize("cross", DECODERS)
def test_seq2seq_decoder_steps_reproduce_the_full_forward(variant, cross):
    """The decoder decodes with cached cross keys/values and a padded source mask as fixed context."""
    options = lm_options(variant, n_layers=2, n_decoder_layers=2)
    assembly = assemble(variant, "seq2seq", options, seed=3, cross_variant=cross)
    g = torch.Generator().manual_seed(7)
    source = (torch.randint(0, 50, (2, 9), generator=g), torch.arange(9) < torch.tensor([[9], [4]]))
    ids = torch.randint(0, 50, (2, 8), generator=g)
    stepped, state = step_logits(assembly, ids, 3, source)
    torch.testing.assert_close(stepped, full_logits(assembly, ids, source), atol=1e-5, rtol=1e-4)
    assert state[0].tolist() == [8]
