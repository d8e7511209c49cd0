"""A module export takes every op attnx documents (the step op with a state input included), refuses an op
without an ONNX translation in one line, and draws its parity inputs within a one-signed example's range
(a log-decay input stays <= 0), so a correct export of a module with constrained inputs verifies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnx
from attnx.errors import AttnxError
from attnx.exporter.inputs import random_feed
from attnx.exporter.signature import dynamic_shapes, input_specs
from attnx.exporter.trace import export_onnx
from attnx.models.spec import TensorSpec
from attnx.plugins.gated.op import gated_delta_rule_step, l2norm

B, H, N, D = 2, 2, 9, 16
AXES = {**{name: {0: "batch", 2: "seq"} for name in ("q", "k", "v", "g", "beta")}, "state": {0: "batch"}}


class Step(torch.nn.Module):
    """One call of the documented step op, from a given state (q and k L2-normalised first, the caller's
    part of the delta rule)."""

    def forward(self, q, k, v, g, beta, state):
        return gated_delta_rule_step(l2norm(q), l2norm(k), v, g, beta, state, True, D**-0.5, 64)


def step_example() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    q = torch.nn.functional.normalize(draw(B, H, N, D), dim=-1)
    k = torch.nn.functional.normalize(draw(B, H, N, D), dim=-1)
    log_decay = -torch.rand(B, H, N, 1, generator=generator)  # g <= 0: a decay exp(g) <= 1
    beta = torch.rand(B, H, N, generator=generator)
    return q, k, draw(B, H, N, D), log_decay, beta, draw(B, H, D, D)


def test_the_step_op_exports_from_a_module_and_verifies(tmp_path):
    result = attnx.export_module(
        Step().eval(),
        step_example(),
        tmp_path / "out",
        dynamic_axes=AXES,
        options={"verify.seq_lens": [1, 65, 129]},
    )
    assert result.parity.passed
    assert "attnx::GatedDeltaRuleStep" in result.manifest.ops


def test_a_log_decay_input_is_drawn_within_its_examples_range():
    specs, *_ = input_specs(Step(), step_example(), AXES)
    by_name = {s.name: s for s in specs}
    assert by_name["g"].bounds is not None and by_name["g"].bounds[1] <= 0
    assert by_name["q"].bounds is None  # both signs: a standard normal, as before
    feed = random_feed(specs, {"batch": 2, "seq": 129}, np.random.default_rng(0))
    assert feed["g"].max() <= 0 and feed["beta"].min() >= 0 and feed["beta"].max() <= 1


@settings(max_examples=50, deadline=None)
@given(
    low=st.floats(-1e6, 1e6, allow_nan=False),
    width=st.floats(1e-3, 1e6, allow_nan=False),
    sign=st.sampled_from([-1.0, 1.0]),
)
def test_parity_inputs_keep_a_one_signed_examples_sign_and_range(low, width, sign):
    values = sign * (abs(low) + np.linspace(0, width, 14))
    example = torch.tensor(values, dtype=torch.float32).reshape(2, 7)
    (spec,), *_ = input_specs(torch.nn.Identity(), (example,), {"input": {0: "batch"}})
    drawn = random_feed([spec], {"batch": 3}, np.random.default_rng(1))[spec.name]
    lo, hi = float(example.min()), float(example.max())
    assert spec.bounds == (lo, hi)
    assert np.all(drawn >= lo) and np.all(drawn <= hi) and np.all(np.sign(drawn) * sign >= 0)


def test_an_op_without_an_onnx_translation_is_one_line():
    """torch.onnx failing on an op with no translation in the table (the step op's, before the fix) is one
    AttnxError line naming the op, not torch's report."""
    example = step_example()
    specs, *_ = input_specs(Step(), example, AXES)
    outputs = [TensorSpec("output.0", "float32", ("batch",)), TensorSpec("output.1", "float32", ("batch",))]
    with pytest.raises(AttnxError) as raised:
        export_onnx(Step().eval(), example, [], 18, specs, outputs, dynamic_shapes(specs))
    message = str(raised.value)
    assert "no ONNX translation for" in message and "gated_delta_rule_step" in message
    assert "\n" not in message
