"""The kernel descriptions: what TensorRT's aot_impl will rely on, checked without a GPU.

Every built-in op declares a kernel; its launch plan lists the kernel's parameters in the
AOT order (inputs, int32 scalars, outputs, constexprs); the shape rules work on symbolic
dimensions (TensorRT's shape expressions support only + - * // and comparisons); dimensions
a kernel is compiled for must be fixed. A slow test compiles every kernel to PTX for sm_90
(Triton needs no GPU for that) and checks the entry's parameter list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install 'attnx[triton]'")

from attnx import kernels  # noqa: E402
from attnx.errors import AttnxError  # noqa: E402
from attnx.plugins.linear.kernel import LINEAR_STEP_OP  # noqa: E402
from attnx.registry import get_registry  # noqa: E402
from tests.kernels.conftest import DEVICE  # noqa: E402

BUILT_IN = ["cosformer", "fastformer", "linear", "reformer", "softmax"]
OPS = {name: get_registry().variant(name).load().ops[0] for name in BUILT_IN}  # each variant's attention op

# Example inputs (batch 2, 4 heads, 77 tokens, head size 64) and attributes per op.
QUERIES, KEYS = (2, 4, 77, 64), (2, 4, 90, 64)
CROSS = {"q": QUERIES, "k": KEYS, "v": KEYS}
EXAMPLES = {
    "softmax": (CROSS, {"causal": True, "scale": 0.125}),
    "linear": (CROSS, {"causal": True, "eps": 1e-6, "chunk_size": 64}),
    "cosformer": (CROSS, {"causal": False, "max_len": 0, "eps": 1e-6, "chunk_size": 64}),
    "fastformer": ({"q": QUERIES, "k": QUERIES, "v": QUERIES, "w_q": (4, 64), "w_k": (4, 64)},
                   {"scale": 0.125}),
    "reformer": ({"qk": QUERIES, "v": QUERIES, "rotations": (4, 64, 2, 4)},
                 {"causal": True, "chunk_size": 64}),
}


def example(name: str, mask: bool, dtype: str = "fp32") -> tuple[dict, dict, dict]:
    """(shapes, Triton dtypes, attributes) of an example call of the op, with or without its mask."""
    shapes, attributes = EXAMPLES[name]
    shapes = dict(shapes)
    if mask:
        shapes["key_padding_mask"] = (2, shapes[OPS[name].input_names[0]][2])
    return shapes, {n: "i1" if n == "key_padding_mask" else dtype for n in shapes}, attributes


class Dim:
    """A stand-in for a TensorRT shape expression: only + - * // (with ints or Dims), no int()."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _op(self, sign: str, other: object, swap: bool = False) -> Dim:
        left, right = (other, self) if swap else (self, other)
        return Dim(f"({_text(left)} {sign} {_text(right)})")

    def __add__(self, other: object) -> Dim:
        return self._op("+", other)

    def __radd__(self, other: object) -> Dim:
        return self._op("+", other, swap=True)

    def __sub__(self, other: object) -> Dim:
        return self._op("-", other)

    def __mul__(self, other: object) -> Dim:
        return self._op("*", other)

    def __rmul__(self, other: object) -> Dim:
        return self._op("*", other, swap=True)

    def __floordiv__(self, other: object) -> Dim:
        return self._op("//", other)


def symbolic_dims(name: str, dims: tuple[int, ...]) -> tuple[object, ...]:
    """Activations with dynamic batch, heads and length (the head size fixed); weights fixed."""
    if name in ("rotations", "w_q", "w_k"):
        return dims
    if name == "key_padding_mask":
        return Dim("batch"), Dim("n")
    return Dim("batch"), Dim("heads"), Dim(f"n_{name}"), dims[3]


def _text(x: object) -> str:
    return x.text if isinstance(x, Dim) else str(x)


def test_every_built_in_variant_op_declares_a_kernel():
    for name, op in OPS.items():
        kernel = kernels.load(op)
        assert kernel is not None, name
        assert list(kernel.inputs) == op.input_names, name
        assert len(kernel.tactics) >= 2, name


@pytest.mark.parametrize("mask", [True, False], ids=["mask", "no-mask"])
@pytest.mark.parametrize("name", BUILT_IN)
def test_plan_lists_the_kernel_parameters_in_aot_order(name, mask):
    """Inputs (an absent one a compile-time None), int32 scalars, outputs, then constexprs: the
    order in which TensorRT passes input pointers, extra args and output pointers."""
    kernel = kernels.load(OPS[name])
    shapes, dtypes, attributes = example(name, mask)
    for tactic in kernel.tactics:
        plan = kernel.plan(shapes, dtypes, attributes, tactic)
        assert list(plan.signature) == list(kernel.fn.arg_names)
        runtime = [p for p, kind in plan.signature.items() if kind != "constexpr"]
        present = [n for n in kernel.inputs if n in shapes]
        assert runtime == [*present, *plan.scalars, kernel.output]
        assert all(plan.signature[n] == "i32" for n in plan.scalars)
        assert plan.signature["key_padding_mask"] == ("*i1" if mask else "constexpr")
        assert plan.constants.get("key_padding_mask", "absent") == ("absent" if mask else None)
        assert set(plan.constants) == {p for p, kind in plan.signature.items() if kind == "constexpr"}
        assert tactic.blocks.items() <= plan.constants.items()


@pytest.mark.parametrize("name", BUILT_IN)
def test_scalars_and_grid_work_on_symbolic_dimensions(name):
    """Batch and sequence lengths may be TensorRT shape expressions; head sizes are compile-time."""
    kernel = kernels.load(OPS[name])
    shapes, dtypes, attributes = example(name, mask=True)
    symbolic = {name: symbolic_dims(name, dims) for name, dims in shapes.items()}
    plan = kernel.plan(symbolic, dtypes, attributes)
    assert any(isinstance(value, Dim) for value in plan.scalars.values())
    assert any(isinstance(value, Dim) for value in plan.grid)
    first = kernel.inputs[0]
    dynamic_head = {**symbolic, first: (*symbolic[first][:3], Dim("d"))}
    with pytest.raises(AttnxError, match="needs a fixed head size; it is dynamic"):
        kernel.plan(dynamic_head, dtypes, attributes)


def test_tactics_by_number_name_or_default():
    kernel = kernels.load(OPS["softmax"])
    first, second = kernel.tactics[:2]
    assert kernel.tactic(None) is first and kernel.tactic(2) is second
    assert kernel.tactic(second.name) is second and kernel.tactic(first) is first
    with pytest.raises(AttnxError, match=r"unknown tactic 7 \(tactics: m16n16, m64n32, or 1..2\)"):
        kernel.tactic(7)


def test_an_op_without_a_kernel_says_so():
    assert kernels.load(LINEAR_STEP_OP) is None
    with pytest.raises(AttnxError, match="op attnx::LinearAttentionStep has no Triton kernel"):
        kernels.run(LINEAR_STEP_OP)


def test_bfloat16_is_refused_in_the_interpreter():
    if DEVICE != "cpu":
        pytest.skip("on CUDA, bfloat16 runs compiled")
    q = torch.zeros(1, 1, 3, 4, dtype=torch.bfloat16)
    with pytest.raises(AttnxError, match="interpreter computes bfloat16 wrongly"):
        kernels.run(OPS["softmax"], q, q, q, None, False, 0.5)


def test_tile_sizes_and_ceiling_division():
    assert [kernels.block(n) for n in (1, 16, 17, 64, 65)] == [16, 16, 32, 64, 128]
    assert [kernels.block(n, least=1) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    assert [kernels.cdiv(n, 16) for n in (1, 16, 17)] == [1, 1, 2]
    assert kernels.cdiv(Dim("n"), 16).text == "((n + 15) // 16)"


_COMPILE = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from attnx import kernels
from attnx.registry import get_registry
name, shapes, dtypes, attributes = json.loads(sys.argv[1])
kernel = kernels.load(get_registry().variant(name).load().ops[0])
plan = kernel.plan({k: tuple(v) for k, v in shapes.items()}, dtypes, attributes)
source = triton.compiler.ASTSource(fn=kernel.fn, signature=plan.signature, constexprs=plan.constants)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": plan.num_warps, "num_stages": plan.num_stages})
entry = re.search(r"\\.entry\\s+(\\w+)\\(([^)]*)\\)", compiled.asm["ptx"])
params = ["ptr" if ".ptr" in p else p.split()[1] for p in entry.group(2).split(",")]
print(json.dumps({"name": entry.group(1), "params": params, "scalars": len(plan.scalars),
                  "shared": compiled.metadata.shared, "metadata_name": compiled.metadata.name}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT_IN)
def test_kernels_compile_to_ptx_with_the_aot_parameter_list(name):
    """Compiled for sm_90 without a GPU (not interpreted): the PTX entry takes the present inputs'
    pointers, u32 scalars and the output pointer, then only Triton's own scratch pointers."""
    shapes, dtypes, attributes = example(name, mask=True, dtype="fp16")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE, json.dumps([name, shapes, dtypes, attributes])],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = ["ptr"] * len(shapes) + [".u32"] * result["scalars"] + ["ptr"]
    assert result["params"][: len(expected)] == expected
    assert set(result["params"][len(expected):]) <= {"ptr"}  # global/profile scratch (Triton >= 3.3)
    assert result["name"] == result["metadata_name"]  # the kernel name aot_impl returns
