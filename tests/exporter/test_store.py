"""The weights file is written one tensor at a time (attnx.exporter.store.write_safetensors) and is what
``safetensors.torch.save_model`` writes for any state (dtypes, shapes, tied tensors): the same header and
the same bytes after it. Only the order of the tied names in the header's metadata may differ: safetensors
keeps them in a hash map, attnx sorts them."""

from __future__ import annotations

import json

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_model

from attnx.exporter.store import WeightStore

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool)


@st.composite
def states(draw) -> torch.nn.Module:
    """A module whose buffers have random dtypes and shapes, some under two names (tied)."""
    module = torch.nn.Module()
    made = []
    for index in range(draw(st.integers(1, 6))):
        if made and draw(st.booleans()):
            tensor = draw(st.sampled_from(made))  # the same tensor under another name
        else:
            shape = draw(st.lists(st.integers(1, 4), max_size=3))
            dtype = draw(st.sampled_from(DTYPES))
            tensor = (torch.randn(shape) * 5).to(dtype)
            made.append(tensor)
        module.register_buffer(f"{draw(st.sampled_from('abz'))}{index}", tensor)
    return module


@given(states())
@settings(max_examples=40, deadline=None)
def test_the_weights_file_is_save_models_byte_for_byte(tmp_path_factory, module):
    root = tmp_path_factory.mktemp("store")
    WeightStore.save(module, root / "streamed.safetensors")
    save_model(module, str(root / "library.safetensors"))
    streamed, library = (split(root / f"{name}.safetensors") for name in ("streamed", "library"))
    assert streamed == library


def split(path) -> tuple[int, dict, bytes]:
    """(header length, header, data) of a safetensors file."""
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    return length, json.loads(raw[8 : 8 + length]), raw[8 + length :]
