"""The adapter walk: top-down replacement on a parameter-sharing copy, leftovers refused, listing."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from attnx.adapters.apply import apply_adapters
from attnx.cli import cli
from attnx.errors import AttnxError
from tests.third_party.toy_adapter import Converted
from tests.third_party.toy_library import ToyLinearAttention, ToyModel


def test_walk_replaces_library_layers_in_a_copy_that_shares_the_weights(toy_registry):
    model = ToyModel().eval()
    adapted = apply_adapters(model, toy_registry)
    assert adapted.adapters == ["toy"]
    assert all(isinstance(b, Converted) for b in adapted.module.blocks)
    assert all(isinstance(b, ToyLinearAttention) for b in model.blocks)  # the user's object is untouched
    assert adapted.module.blocks[0].layer.q_proj.weight is model.blocks[0].wq.weight  # no weight copy
    ids = torch.randint(0, 40, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(adapted.module(ids), model(ids), atol=1e-5, rtol=1e-4)


def test_one_module_used_twice_stays_one_module(toy_registry):
    model = ToyModel().eval()
    model.blocks[1] = model.blocks[0]
    adapted = apply_adapters(model, toy_registry).module
    assert adapted.blocks[0] is adapted.blocks[1]


def test_a_module_that_needs_an_adapter_and_got_none_is_named(toy_registry):
    with pytest.raises(AttnxError) as caught:
        apply_adapters(ToyModel(unsupported=True).eval(), toy_registry)
    message = str(caught.value)
    assert "tests.third_party.toy_library.ToyKernelAttention (at extra)" in message
    assert "toy (attnx " in message and "\n" not in message


def test_list_and_doctor_show_adapters(toy_registry):
    listed = CliRunner().invoke(cli, ["list", "--json"])
    adapters = {a["name"]: a for a in json.loads(listed.output)["adapters"]}
    assert adapters["toy"]["library"] == "attnx" and adapters["toy"]["installed"]
    assert (
        "fast_transformers" in adapters
        and adapters["fast_transformers"]["library"] == "pytorch-fast-transformers"
    )
    doctor = CliRunner().invoke(cli, ["doctor"])
    assert "adapter      toy: attnx" in doctor.output
