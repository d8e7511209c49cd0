"""Gradients of every attention op: ``gradcheck`` in float64, and against the naive paper references.

The ops' backward is :func:`attnx.ops.trainable_op`'s: autograd through their own eager code. Two
independent checks per variant and case (bidirectional, causal, padded keys, cross where supported):

* ``torch.autograd.gradcheck`` in float64 (the backward against finite differences of the op);
* the op's vector-Jacobian product against the naive reference each variant's test module checks the
  forward with (imported, not copied), on fresh random inputs and several shapes. The references of
  linear, cosFormer and reformer are tensor code: autograd goes through them and the whole gradient is
  compared. Those of softmax and Fastformer are written with Python scalars (no autograd): the gradient
  is compared along random directions with central differences of the reference.

Reformer: the hash is piecewise constant (an argmax), so both the op and autograd through ``naive_lsh``
hold each input's buckets fixed; the inputs are checked to have no near-tie (``naive_buckets`` asserts
a margin), so finite differences do not cross a bucket boundary either.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from attnx.plugins.cosformer.kernel import cosformer_attention
from attnx.plugins.fastformer.kernel import fastformer_attention
from attnx.plugins.linear.kernel import linear_attention
from attnx.plugins.reformer.kernel import reformer_attention
from attnx.plugins.softmax.kernel import softmax_attention
from tests.plugins import op_harness as harness
from tests.plugins.softmax.test_kernel import naive_softmax_attention
from tests.plugins.test_cosformer import naive_cosformer
from tests.plugins.test_fastformer import naive_fastformer
from tests.plugins.test_linear import naive_linear
from tests.plugins.test_reformer import naive_lsh

EPS = 1e-6
CHUNK = 3  # several chunks (and a padded last one) at the lengths below
MAX_LEN = 16  # cosFormer's fixed M in causal mode
N_HASHES, N_BUCKETS = 2, 4
Tensors = Sequence[torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Case:
    """Shapes and mode of one op call: q (batch, heads, n, d), keys (batch, heads, m, d)."""

    label: str
    batch: int
    heads: int
    n: int
    m: int
    d: int
    causal: bool = False
    mask: str = "none"

    def __str__(self) -> str:
        return f"{self.label}-{self.batch}x{self.heads}x{self.n}x{self.m}x{self.d}"


@dataclasses.dataclass(frozen=True)
class Subject:
    """A variant's op and reference, both as functions of the differentiable inputs.

    ``inputs(case, g)`` draws the float64 inputs that get gradients; ``fixed(case, g)`` whatever else the
    op takes (reformer's rotations); ``arguments`` (the op's, in schema order) and ``reference`` take
    (inputs, fixed, mask, causal). ``autograd``: the reference is tensor code autograd can
    differentiate (else Python scalars).
    """

    torch_op: Any
    arguments: Callable[..., tuple]
    reference: Callable[..., torch.Tensor]
    inputs: Callable[[Case, torch.Generator], list[torch.Tensor]]
    cases: Sequence[Case]
    fixed: Callable[[Case, torch.Generator], list[torch.Tensor]] = lambda case, g: []
    autograd: bool = True

    def op(self, inputs: Tensors, fixed: Tensors, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
        return self.torch_op(*self.arguments(inputs, fixed, mask, causal))


def qkv(case: Case, g: torch.Generator) -> list[torch.Tensor]:
    shapes = [(case.n, case.d), (case.m, case.d), (case.m, case.d)]
    return [torch.randn(case.batch, case.heads, *shape, generator=g, dtype=torch.float64) for shape in shapes]


def qk_v(case: Case, g: torch.Generator) -> list[torch.Tensor]:
    return [
        torch.randn(case.batch, case.heads, case.n, case.d, generator=g, dtype=torch.float64) for _ in "qv"
    ]


def qkv_weights(case: Case, g: torch.Generator) -> list[torch.Tensor]:
    return [*qkv(case, g), *(torch.randn(case.heads, case.d, generator=g, dtype=torch.float64) for _ in "qk")]


def rotations(case: Case, g: torch.Generator) -> list[torch.Tensor]:
    shape = (case.heads, case.d, N_HASHES, N_BUCKETS // 2)
    return [torch.randn(*shape, generator=g, dtype=torch.float64)]


def scale(inputs: Tensors) -> float:
    return 1.0 / math.sqrt(inputs[0].shape[-1])


# Small enough for a full-Jacobian gradcheck in a second or two each.
SELF = [Case("self", 1, 2, 5, 5, 3), Case("padded", 2, 1, 5, 5, 2, mask="prefix")]
CAUSAL = [Case("causal", 1, 2, 7, 7, 2, causal=True), Case("causal-padded", 2, 1, 7, 7, 2, True, "scattered")]
CROSS = [
    Case("cross", 2, 1, 3, 7, 2, mask="scattered"),
    Case("causal-cross", 1, 1, 3, 8, 3, causal=True),  # bottom-right aligned, as in cached decoding
]

SUBJECTS = {
    "softmax": Subject(
        torch_op=softmax_attention,
        arguments=lambda x, _, mask, causal: (*x, mask, causal, scale(x)),
        reference=lambda x, _, mask, causal: naive_softmax_attention(*x, mask, causal, scale(x)),
        inputs=qkv,
        cases=SELF + CAUSAL + CROSS,
        autograd=False,
    ),
    "linear": Subject(
        torch_op=linear_attention,
        arguments=lambda x, _, mask, causal: (*x, mask, causal, EPS, CHUNK),
        reference=lambda x, _, mask, causal: naive_linear(*x, mask, causal, EPS),
        inputs=qkv,
        cases=SELF + CAUSAL + CROSS,
    ),
    "cosformer": Subject(
        torch_op=cosformer_attention,
        arguments=lambda x, _, mask, causal: (*x, mask, causal, MAX_LEN * causal, EPS, CHUNK),
        reference=lambda x, _, mask, causal: naive_cosformer(*x, mask, causal, MAX_LEN if causal else None),
        inputs=qkv,
        cases=SELF + CAUSAL + CROSS,
    ),
    "reformer": Subject(
        torch_op=reformer_attention,
        arguments=lambda x, fixed, mask, causal: (*x, *fixed, mask, causal, CHUNK),
        reference=lambda x, fixed, mask, causal: naive_lsh(*x, *fixed, mask, causal, CHUNK),
        inputs=qk_v,
        fixed=rotations,
        cases=[*SELF, *CAUSAL, Case("padded-rows", 3, 1, 8, 8, 3, mask="empty-row")],
    ),
    "fastformer": Subject(
        torch_op=fastformer_attention,
        arguments=lambda x, _, mask, causal: (*x, mask, scale(x)),
        reference=lambda x, _, mask, causal: naive_fastformer(*x, mask, scale(x)),
        inputs=qkv_weights,
        cases=[*SELF, Case("empty-row", 3, 1, 5, 5, 2, mask="empty-row")],
        autograd=False,
    ),
}
PARAMS = [pytest.param(name, case, id=f"{name}-{case}") for name, s in SUBJECTS.items() for case in s.cases]


def draw(
    name: str, case: Case, seed: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor | None]:
    subject = SUBJECTS[name]
    g = torch.Generator().manual_seed(seed)
    inputs, fixed = subject.inputs(case, g), subject.fixed(case, g)
    return inputs, fixed, harness.padding_mask(case.mask, case.batch, case.m, g)


@pytest.mark.parametrize(("name", "case"), PARAMS)
def test_gradcheck_in_float64(name, case):
    subject = SUBJECTS[name]
    inputs, fixed, mask = draw(name, case, seed=case.n * 13 + case.m)
    leaves = [t.requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(lambda *x: subject.op(x, fixed, mask, case.causal), leaves)


def vjp(function: Callable[[Tensors], torch.Tensor], inputs: Tensors, cotangent: torch.Tensor) -> list:
    """d(function(inputs) . cotangent)/d inputs by autograd, at ``inputs`` in their dtype."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    output = function(leaves)
    assert output.dtype == inputs[0].dtype and torch.isfinite(output).all()
    return list(torch.autograd.grad(output, leaves, cotangent.to(output.dtype)))


def directional(
    function: Callable[[Tensors], torch.Tensor], inputs: Tensors, direction: Tensors
) -> torch.Tensor:
    """Central difference of ``function`` at ``inputs`` along ``direction`` (float64, step 1e-6)."""
    step = 1e-6
    ahead = function([x + step * u for x, u in zip(inputs, direction, strict=True)])
    behind = function([x - step * u for x, u in zip(inputs, direction, strict=True)])
    return (ahead - behind) / (2 * step)


def assert_gradients_match(actual: Tensors, expected: Tensors, rel: float) -> None:
    """Every gradient within ``rel`` of the largest gradient entry of any input (an input's own gradient
    may be ~0 by symmetry, e.g. a query whose only visible key makes the output independent of it)."""
    bound = rel * max(float(e.abs().max()) for e in expected)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        error = float((a.double() - e).abs().max())
        assert error <= bound, f"input {index}: max |gradient error| {error:.3g} > {bound:.3g}"


@pytest.mark.parametrize("larger", [False, True], ids=["shape", "larger"])
@pytest.mark.parametrize(("name", "case"), PARAMS)
def test_gradients_match_the_paper_reference(name, case, larger):
    """The op's gradients in float64 (1e-7 of the largest, all rounding) and float32 (1e-4: the training
    dtype) against the float64 reference on fresh inputs; ``larger`` grows lengths and head size."""
    subject = SUBJECTS[name]
    if larger:
        case = dataclasses.replace(case, n=case.n + 6, m=case.m + 6, d=case.d + 1)
    inputs, fixed, mask = draw(name, case, seed=1000 + case.n * 17 + case.m * 3 + case.d)
    g = torch.Generator().manual_seed(case.n)
    shape = subject.op(inputs, fixed, mask, case.causal).shape
    cotangent = torch.randn(shape, generator=g, dtype=torch.float64)

    def reference(x: Tensors) -> torch.Tensor:
        return subject.reference(x, fixed, mask, case.causal)

    def op_in(dtype: torch.dtype) -> list:
        cast = [t.to(dtype) for t in inputs]
        return vjp(lambda x: subject.op(x, [t.to(dtype) for t in fixed], mask, case.causal), cast, cotangent)

    if subject.autograd:  # tensor code: the whole gradient
        expected = vjp(reference, inputs, cotangent)
        for dtype, rel in ((torch.float64, 1e-7), (torch.float32, 1e-4)):
            assert_gradients_match(op_in(dtype), expected, rel)
        return
    for _ in range(3):  # Python-scalar code: the gradient along random directions
        direction = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in inputs]
        expected = (directional(reference, inputs, direction) * cotangent).sum()
        for dtype, rel in ((torch.float64, 1e-6), (torch.float32, 1e-4)):
            got = sum((grad.double() * u).sum() for grad, u in zip(op_in(dtype), direction, strict=True))
            assert abs(got - expected) <= rel * max(1.0, abs(float(expected))), (
                dtype,
                float(got),
                float(expected),
            )


OPCHECKS = [
    pytest.param(("test_schema", "test_autograd_registration", "test_faketensor"), id="registration"),
    pytest.param(("test_aot_dispatch_dynamic",), id="aot-dispatch", marks=pytest.mark.slow),  # ~10 s each
]


@pytest.mark.parametrize("utils", OPCHECKS)
@pytest.mark.parametrize("name", SUBJECTS)
def test_opcheck(name, utils):
    """torch.library.opcheck on a padded (causal where supported) float32 call whose inputs need
    gradients: the schema, the autograd registration, the fake kernel's shapes and strides (which
    torch.compile relies on), and (slow) the backward as AOTAutograd traces it against eager."""
    subject = SUBJECTS[name]
    case = max(subject.cases, key=lambda c: (c.mask != "none", c.causal))
    inputs, fixed, mask = draw(name, case, seed=11)
    leaves = [t.float().requires_grad_() for t in inputs]
    arguments = subject.arguments(leaves, [t.float() for t in fixed], mask, case.causal)
    results = torch.library.opcheck(subject.torch_op, arguments, test_utils=utils)
    assert set(results.values()) == {"SUCCESS"}, results


def test_second_order_gradients():
    """create_graph=True makes the recomputed backward differentiable (gradgradcheck)."""
    inputs, _, mask = draw("linear", CAUSAL[1], seed=3)
    leaves = [t.requires_grad_() for t in inputs]
    assert torch.autograd.gradgradcheck(lambda *x: linear_attention(*x, mask, True, EPS, CHUNK), leaves)


def test_masks_and_options_get_no_gradient():
    """Only float tensors are differentiated: a mask is a bool input, reformer's rotations reach the
    output only through the argmax hash (zero gradient, as finite differences that flip no bucket see)."""
    case = Case("padded", 2, 2, 7, 7, 3, causal=True, mask="prefix")
    inputs, fixed, mask = draw("reformer", case, seed=5)
    rotations_leaf = fixed[0].clone().requires_grad_()
    output = reformer_attention(*inputs, rotations_leaf, mask, True, CHUNK)
    (gradient,) = torch.autograd.grad(output.sum(), rotations_leaf, allow_unused=True)
    assert gradient is None or not gradient.any()
