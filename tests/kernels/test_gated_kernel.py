"""``attnx::GatedDeltaRule``'s Triton kernel (``retention``, ``gated_delta``; TensorRT's plugin and GPU
benchmarks) against the token-by-token float64 recurrence written from the equations and against the
torch op, and its launch description as TensorRT's AOT plugin reads it.

On CPU the kernel runs in Triton's interpreter (tests/conftest.py), so the cases are tiny: one token,
odd lengths, grouped value heads, d_k != d_v, both rules, both decay widths, fp16, every tactic.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'attnx[triton]'")

from attnx import kernels  # noqa: E402
from attnx.errors import AttnxError  # noqa: E402
from attnx.plugins.gated.op import GATED_DELTA_RULE_OP, naive_gated_delta_rule  # noqa: E402
from tests.kernels.conftest import DEVICE  # noqa: E402
from tests.kernels.test_contract import Dim  # noqa: E402
from tests.kernels.test_kernels import cases, check  # noqa: E402
from tests.plugins.gated.cases import Shape, draw  # noqa: E402

SCALE = 0.5
GATED_CASES = [
    (Shape(batch=1, n=1), torch.float32),
    (Shape(batch=2, hk=1, hv=2, n=7, dk=8, dv=16), torch.float32),  # grouped value heads, d_k != d_v
    (Shape(batch=1, hk=2, hv=4, n=9, dk=4, dv=20, per_key=True, delta=False), torch.float32),  # GLA's rule
    (Shape(batch=2, hk=1, hv=2, n=6, dk=8, dv=8, per_key=True), torch.float32),  # Kimi's rule
    (Shape(batch=2, hk=1, hv=2, n=7, dk=8, dv=8), torch.float16),
]


@pytest.mark.parametrize(
    ("shape", "dtype", "tactic"),
    # the interpreter runs each token's update in Python: the second tactic of each case in the slow run
    [
        p if p.values[-1] == 1 else pytest.param(*p.values, marks=pytest.mark.slow, id=p.id)
        for p in cases(GATED_CASES)
    ],
)
def test_gated_kernel(shape, dtype, tactic):
    q, k, v, g, beta, _ = draw(shape, seed=shape.n, dtype=dtype)
    wide = [t.double() for t in (q, k, v, g, beta)]
    expected, _ = naive_gated_delta_rule(*wide, None, shape.delta, SCALE)
    check(GATED_DELTA_RULE_OP, (q, k, v, g, beta, shape.delta, SCALE, 4), expected, tactic)


def test_the_kernel_is_told_apart_from_a_wrong_decay_sign_and_a_dropped_beta():
    """The cases above can fail: the reference with g of the wrong sign, or with beta = 1, is far off."""
    shape = Shape(batch=1, hk=1, hv=2, n=7, dk=8, dv=8)
    q, k, v, g, beta, _ = draw(shape, seed=3, dtype=torch.float64)
    result = kernels.run(
        GATED_DELTA_RULE_OP, *(t.float().to(DEVICE) for t in (q, k, v, g, beta)), True, SCALE, 4
    )
    result = result.cpu()
    right, _ = naive_gated_delta_rule(q, k, v, g, beta, None, True, SCALE)
    torch.testing.assert_close(result.double(), right, atol=1e-5, rtol=1e-4)
    for wrong_g, wrong_beta in ((-g, beta), (g, torch.ones_like(beta))):
        wrong, _ = naive_gated_delta_rule(q, k, v, wrong_g, wrong_beta, None, True, SCALE)
        assert (wrong - result.double()).abs().max() > 1e-2


EXAMPLE = {
    "q": (2, 4, 77, 64),
    "k": (2, 4, 77, 64),
    "v": (2, 8, 77, 32),
    "g": (2, 8, 77, 1),
    "beta": (2, 8, 77),
}


def test_plan_lists_the_kernel_parameters_in_aot_order():
    kernel = kernels.load(GATED_DELTA_RULE_OP)
    assert list(kernel.inputs) == GATED_DELTA_RULE_OP.input_names and len(kernel.tactics) >= 2
    dtypes = dict.fromkeys(EXAMPLE, "fp32")
    attributes = {"delta": True, "scale": 0.125, "chunk_size": 32}
    for tactic in kernel.tactics:
        plan = kernel.plan(EXAMPLE, dtypes, attributes, tactic)
        assert list(plan.signature) == list(kernel.fn.arg_names)
        runtime = [p for p, kind in plan.signature.items() if kind != "constexpr"]
        assert runtime == [*kernel.inputs, *plan.scalars, kernel.output]
        assert plan.constants["PER_KEY"] is False and plan.constants["DELTA"] is True
        assert tactic.blocks.items() <= plan.constants.items()
    per_key = kernel.plan({**EXAMPLE, "g": (2, 8, 77, 64)}, dtypes, attributes)
    assert per_key.constants["PER_KEY"] is True


def test_scalars_and_grid_work_on_symbolic_dimensions():
    """Batch, heads and length may be TensorRT shape expressions; head sizes and the decay width are fixed."""
    kernel = kernels.load(GATED_DELTA_RULE_OP)
    symbolic = {
        name: (Dim("batch"), Dim("hv" if name in ("v", "g", "beta") else "hk"), Dim("n"), *dims[3:])
        for name, dims in EXAMPLE.items()
    }
    attributes = {"delta": False, "scale": 0.125, "chunk_size": 32}
    plan = kernel.plan(symbolic, dict.fromkeys(EXAMPLE, "fp16"), attributes)
    assert any(isinstance(value, Dim) for value in plan.scalars.values())
    assert any(isinstance(value, Dim) for value in plan.grid)
    with pytest.raises(AttnxError, match="needs a fixed key head size; it is dynamic"):
        kernel.plan(
            {**symbolic, "q": (*symbolic["q"][:3], Dim("d"))}, dict.fromkeys(EXAMPLE, "fp16"), attributes
        )
