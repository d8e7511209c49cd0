"""The generated QDP functions and their registration, against a stand-in for tensorrt.plugin.

``tensorrt.plugin`` validates the decorated functions with ``inspect.signature``: register
``(inp0: TensorDesc, ..., attr0: T0, ...) -> TensorDesc`` (annotations required, no
defaults, attribute types int/float/str/bool/bytes or ``NDArray[dtype]``), impl
``(inputs..., attrs..., outputs, stream)``, autotune ``(inputs..., attrs..., outputs)``,
aot_impl ``(inputs..., attrs..., outputs, tactic) -> tuple[str | bytes, str | bytes,
KernelLaunchParams, SymExprs]``. The stand-in (tests/trt/stub_tensorrt.py) checks exactly that;
the expected schemas below are written from the op's ONNX schema, not from attnx.trt.
"""

from __future__ import annotations

import inspect

import numpy as np
import numpy.typing as npt
import pytest

from attnx import kernels
from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.plugins.linear.kernel import LINEAR_STEP_OP
from attnx.plugins.softmax.kernel import SOFTMAX_OP
from attnx.registry import get_registry
from attnx.trt import aot, qdp, tensorrt_missing
from attnx.trt.aot import CompiledKernel
from attnx.trt.qdp import aot_functions, plugin_functions, qdp_type, register_plugins, split_impl_args
from attnx.trt.spec import describe
from tests.conftest import TINY
from tests.trt import stub_tensorrt as stub
from tests.trt.conftest import VARIANTS, tiny_model

ALLOWED_ATTRIBUTE_TYPES = (int, float, str, bool, bytes)
TRTP = stub.plugin_module(stub.PluginStub())
MAIN_OPS = {name: get_registry().variant(name).load().ops[0] for name in VARIANTS}


def schema_names(op):
    schema = op.schema()
    return [p.name for p in schema.inputs], list(schema.attributes)


@pytest.mark.parametrize("variant", VARIANTS)
def test_generated_signatures_follow_the_qdp_schemas(variant):
    for op in assemble(variant, tiny_model(variant), TINY).ops:
        inputs, attributes = schema_names(op)
        register, autotune, impl = plugin_functions(describe(op), TRTP)
        signature = inspect.signature(register)
        params = list(signature.parameters.values())
        order = [a.name for a in op.arguments]
        assert [p.name for p in params] == inputs + sorted(attributes, key=order.index)
        assert all(p.default is inspect.Parameter.empty for p in params)
        assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        assert [p.annotation for p in params[: len(inputs)]] == [stub.TensorDesc] * len(inputs)
        for p in params[len(inputs):]:
            assert p.annotation in ALLOWED_ATTRIBUTE_TYPES or p.annotation in (
                npt.NDArray[np.int32],
                npt.NDArray[np.float32],
            )
        assert signature.return_annotation is stub.TensorDesc
        names = [p.name for p in params]
        assert str(inspect.signature(impl)) == f"({', '.join([*names, 'outputs', 'stream'])})"
        assert str(inspect.signature(autotune)) == f"({', '.join([*inputs, 'outputs'])})"


def test_register_describes_the_output_for_every_input_count():
    register, _, _ = plugin_functions(describe(SOFTMAX_OP), TRTP)
    q, k, v = stub.TensorDesc(("b", "h", "n", 16)), stub.TensorDesc(("b", "h", "m", 16)), stub.TensorDesc(
        ("b", "h", "m", 8)
    )
    mask = stub.TensorDesc(("b", "m"), stub.BOOL)
    for tensors in ((q, k, v, mask), (q, k, v)):
        out = register(*tensors, causal=0, scale=0.25)
        assert [repr(d) for d in out.shape_expr] == ["b", "h", "n", "8"] and out.dtype == stub.FLOAT


def test_autotune_offers_fp32_and_fp16_with_the_mask_as_bool():
    _, autotune, _ = plugin_functions(describe(SOFTMAX_OP), TRTP)
    desc = stub.TensorDesc((1, 1, 1, 1))
    assert autotune(desc, desc, desc, desc, ()) == [
        stub.AutoTuneCombination("FP32|FP16, FP32|FP16, FP32|FP16, BOOL, FP32|FP16", "LINEAR")
    ]
    assert autotune(desc, desc, desc, ()) == [
        stub.AutoTuneCombination("FP32|FP16, FP32|FP16, FP32|FP16, FP32|FP16", "LINEAR")
    ]


def test_impl_arguments_are_split_by_the_field_count():
    """TensorRT calls impl(*inputs, *field_values, outputs, stream=...) with the node's inputs only."""
    assert split_impl_args(["q", "k", "v", "m", 0, 0.5, ("out",)], ["causal", "scale"]) == (
        ["q", "k", "v", "m"],
        [0, 0.5],
        ("out",),
    )
    three = split_impl_args(["q", "k", "v", 1, 0.5, ("out",)], ["causal", "scale"])
    assert three == (["q", "k", "v"], [1, 0.5], ("out",))
    assert split_impl_args(["q", ("out",)], []) == (["q"], [], ("out",))


def test_field_annotations():
    assert qdp_type("int") is int and qdp_type("float") is float and qdp_type("str") is str
    assert qdp_type("NDArray[int32]") == npt.NDArray[np.int32]
    assert qdp_type("NDArray[float32]") == npt.NDArray[np.float32]


# -- registration through the stand-in ------------------------------------------------------------------


@pytest.fixture
def trtp_stub(monkeypatch):
    """tensorrt / tensorrt.plugin replaced by the stand-in; a fresh registration table and callback log."""
    plugins = stub.PluginStub()
    stub.install(monkeypatch, plugins)
    monkeypatch.setattr(qdp, "_REGISTERED", {})
    monkeypatch.setattr(qdp, "CALLBACKS", qdp.CallbackLog())
    return plugins


def test_jit_registration_defines_register_autotune_impl_only(trtp_stub):
    ops = [MAIN_OPS["softmax"], LINEAR_STEP_OP]
    assert register_plugins(ops) == ["attnx::SoftmaxAttention", "attnx::LinearAttentionStep"]
    assert [(kind, plugin) for kind, plugin, _ in trtp_stub.calls] == [
        ("register", "attnx::SoftmaxAttention"), ("autotune", "attnx::SoftmaxAttention"),
        ("impl", "attnx::SoftmaxAttention"), ("register", "attnx::LinearAttentionStep"),
        ("autotune", "attnx::LinearAttentionStep"), ("impl", "attnx::LinearAttentionStep"),
    ]  # fmt: skip
    assert register_plugins(ops) and len(trtp_stub.calls) == 6  # idempotent


def test_aot_registration_adds_aot_impl_where_the_op_has_a_kernel(trtp_stub):
    ops = [*MAIN_OPS.values(), LINEAR_STEP_OP]
    register_plugins(ops)  # a JIT registration first: AOT is added to it
    register_plugins(ops, aot_kernels=True)
    register_plugins(ops, aot_kernels=True)
    for op in ops:
        plugin = f"attnx::{op.name}"
        has_kernel = op.kernel is not None
        assert len(trtp_stub.functions("aot_impl", plugin)) == has_kernel
        autotunes = trtp_stub.functions("autotune", plugin)
        assert len(autotunes) == 1 + has_kernel  # the tactic autotune replaces the JIT one
        assert len(trtp_stub.functions("impl", plugin)) == 1  # JIT stays available (--jit)
    assert all(op.kernel is not None for op in MAIN_OPS.values())  # every attention op has a kernel


def test_a_jit_build_after_an_aot_one_gets_the_jit_autotune_back(trtp_stub):
    op = MAIN_OPS["softmax"]
    register_plugins([op], aot_kernels=True)
    register_plugins([op])
    jit, aot_autotune, again = trtp_stub.functions("autotune", "attnx::SoftmaxAttention")
    assert again is jit and aot_autotune is not jit
    assert len(trtp_stub.functions("aot_impl", "attnx::SoftmaxAttention")) == 1


class FakeCompiler:
    """Records the plans it is asked to compile; reports ``shared`` bytes per tactic's block sizes."""

    def __init__(self, shared: dict[int, int] | None = None) -> None:
        self.plans, self.shared = [], shared or {}

    def __call__(self, kernel, plan):
        self.plans.append(plan)
        blocks = plan.constants.items()
        number = next(n for n, t in enumerate(kernel.tactics, 1) if t.blocks.items() <= blocks)
        shared = self.shared.get(number, 1024)
        return CompiledKernel(f"{kernel.fn.__name__}_t{number}", f"// ptx {number}", shared, plan.num_warps)


def softmax_descs(mask: bool = True, dtype=stub.FLOAT):
    """q, k, v (batch, heads, length dynamic; head size 64) and the key padding mask."""
    q = stub.TensorDesc(("batch", 4, "n_q", 64), dtype)
    k = v = stub.TensorDesc(("batch", 4, "n_k", 64), dtype)
    return (q, k, v, stub.TensorDesc(("batch", "n_k"), stub.BOOL)) if mask else (q, k, v)


@pytest.mark.parametrize("mask", [True, False], ids=["mask", "no-mask"])
@pytest.mark.parametrize("tactic", [0, 1, 2])
def test_aot_impl_returns_the_kernel_its_launch_and_the_shape_scalars(mask, tactic):
    op = MAIN_OPS["softmax"]
    kernel, compiler = kernels.load(op), FakeCompiler()
    _, aot_impl = aot_functions(describe(op), kernel, TRTP, compiler)
    descs = softmax_descs(mask, stub.HALF)
    name, ptx, params, extra = aot_impl(*descs, 1, 0.125, (stub.TensorDesc(("batch", 4, "n_q", 64)),), tactic)
    chosen = kernel.tactics[max(tactic, 1) - 1]  # 0: TensorRT's default, the first tactic
    assert (name, ptx) == (f"softmax_attention_kernel_t{max(tactic, 1)}", f"// ptx {max(tactic, 1)}")
    (plan,) = compiler.plans
    assert plan.signature["q"] == "*fp16" and plan.signature["out"] == "*fp16"
    assert plan.signature["key_padding_mask"] == ("*i1" if mask else "constexpr")
    assert plan.constants["CAUSAL"] is True and plan.constants["SCALE"] == 0.125 and plan.constants["D"] == 64
    block_m = chosen.blocks["BLOCK_M"]
    assert (repr(params.grid_x), repr(params.grid_y), params.grid_z) == (
        f"((n_q + {block_m - 1}) // {block_m})", "(batch * 4)", 1
    )
    assert params.block_x == chosen.num_warps * 32 and params.shared_mem == 1024
    # H, N_Q, N_K, GROUP (query heads per key/value head): after the input pointers
    assert [repr(s.value) for s in extra] == ["4", "n_q", "n_k", "1"]
    assert isinstance(extra, stub.SymIntExprs) and all(isinstance(s, stub.SymInt32) for s in extra)


def test_aot_impl_of_every_op_builds_its_plan_on_shape_expressions():
    """The kernels' shape rules use only what TensorRT's shape expressions support (no int * expr)."""
    q, mask = softmax_descs()[0], stub.TensorDesc(("batch", "n_q"), stub.BOOL)
    examples = {
        "softmax": (softmax_descs(), (1, 0.125)),
        "linear": (softmax_descs(), (1, 1e-6, 64)),
        "cosformer": (softmax_descs(), (0, 0, 1e-6, 64)),
        "fastformer": ((q, q, q, stub.TensorDesc((4, 64)), stub.TensorDesc((4, 64)), mask), (0.125,)),
        "reformer": ((q, q, stub.TensorDesc((4, 64, 2, 4)), mask), (1, 64)),
    }
    for name, (descs, values) in examples.items():
        op = MAIN_OPS[name]
        _, aot_impl = aot_functions(describe(op), kernels.load(op), TRTP, FakeCompiler())
        _, _, params, extra = aot_impl(*descs, *values, (), 2)
        assert isinstance(params.grid_y, stub.Expr), name
        assert any(isinstance(scalar.value, stub.Expr) for scalar in extra), name


def test_a_dynamic_head_size_cannot_be_compiled_in():
    op = MAIN_OPS["softmax"]
    _, aot_impl = aot_functions(describe(op), kernels.load(op), TRTP, FakeCompiler())
    q = stub.TensorDesc(("batch", 4, "n", "d"))
    with pytest.raises(AttnxError, match="needs a fixed head size; it is dynamic"):
        aot_impl(q, q, q, 0, 0.5, (), 1)


def test_autotune_offers_the_tactics_that_fit_in_48_kib_per_float_type(trtp_stub):
    op = MAIN_OPS["softmax"]
    compiler = FakeCompiler({1: 13 * 1024, 2: 49 * 1024})
    autotune, _ = aot_functions(describe(op), kernels.load(op), TRTP, compiler)
    assert autotune(*softmax_descs(), 1, 0.125, ()) == [
        stub.AutoTuneCombination("FP32, FP32, FP32, BOOL, FP32", "LINEAR", [1]),
        stub.AutoTuneCombination("FP16, FP16, FP16, BOOL, FP16", "LINEAR", [1]),
    ]
    assert {p.signature["q"] for p in compiler.plans} == {"*fp32", "*fp16"}
    assert all(p.constants["D"] == 64 for p in compiler.plans)  # build-time dims compiled in
    fits = FakeCompiler({1: 48 * 1024, 2: 40 * 1024})
    autotune, _ = aot_functions(describe(op), kernels.load(op), TRTP, fits)
    assert [c.tactics for c in autotune(*softmax_descs(False), 0, 0.5, ())] == [[1, 2], [1, 2]]


def test_autotune_without_a_fitting_tactic_is_an_error_the_build_can_report(trtp_stub):
    op = MAIN_OPS["cosformer"]
    autotune, _ = aot_functions(describe(op), kernels.load(op), TRTP, FakeCompiler({1: 65_000, 2: 66_000}))
    with pytest.raises(AttnxError, match="CosformerAttention: every tactic .* more than 48 KiB .* --jit"):
        autotune(*softmax_descs(), 0, 0, 1e-6, 64, ())
    assert [str(e) for e in qdp.CALLBACKS.errors] and "48 KiB" in str(qdp.CALLBACKS.errors[0])


def test_aot_impl_calls_are_counted_per_plugin(trtp_stub):
    op = MAIN_OPS["softmax"]
    _, aot_impl = aot_functions(describe(op), kernels.load(op), TRTP, FakeCompiler())
    aot_impl(*softmax_descs(), 0, 0.5, (), 1)
    aot_impl(*softmax_descs(), 0, 0.5, (), 2)
    assert qdp.CALLBACKS.aot_calls == {"attnx::SoftmaxAttention": 2}


def test_desc_dims_keep_build_time_sizes_and_hide_run_time_ones():
    desc = stub.TensorDesc(("batch", 4, "n", 64))
    assert aot.desc_dims(desc, symbolic=False) == (aot.DYNAMIC, 4, aot.DYNAMIC, 64)
    symbolic = aot.desc_dims(desc, symbolic=True)
    assert [repr(d) for d in symbolic] == ["batch", "4", "n", "64"] and symbolic[1] == 4
    assert aot.DYNAMIC * 3 + 1 is aot.DYNAMIC and 2 * aot.DYNAMIC // 4 is aot.DYNAMIC
    with pytest.raises(AttnxError, match="no TensorRT INT8 tensors"):
        aot.triton_type("INT8")


# -- when a build can be AOT ------------------------------------------------------------------------------


def test_plugin_mode_choice_and_its_reasons():
    choose = aot.choose_plugin_mode
    softmax, step = MAIN_OPS["softmax"], LINEAR_STEP_OP
    assert choose([], None, None, None) == (None, "no attnx plugin nodes in the graph")
    assert choose([softmax], None, None, None) == ("aot", "every plugin op has a Triton kernel")
    assert choose([softmax], "aot", None, None) == ("aot", "--aot")
    assert choose([softmax], "jit", None, None) == ("jit", "--jit")
    no_kernel = "attnx::LinearAttentionStep has no Triton kernel"
    assert choose([softmax, step], None, None, None) == ("jit", no_kernel)
    assert choose([softmax], None, "triton is not installed", None) == ("jit", "triton is not installed")
    assert choose([softmax], None, None, "no AOT plugins") == ("jit", "no AOT plugins")
    assert choose([softmax], None, None, None, lambda: "needs 52 KiB") == ("jit", "needs 52 KiB")
    with pytest.raises(AttnxError, match=f"^--aot: {no_kernel}; build with --jit"):
        choose([softmax, step], "aot", None, None)
    with pytest.raises(AttnxError, match="^--aot: needs 52 KiB; build with --jit"):
        choose([softmax], "aot", None, None, lambda: "needs 52 KiB")
    checked = []
    choose([softmax], "jit", None, None, lambda: checked.append(1))
    choose([softmax], None, "no triton", None, lambda: checked.append(1))
    assert checked == []  # kernels are compiled only when everything else allows AOT


@pytest.mark.parametrize("variant", ["softmax", "cosformer", "reformer"])
def test_kernel_blocker_compiles_each_node_for_its_recorded_shapes(plugin_export, variant):
    import onnx

    model = onnx.load(str(plugin_export(variant) / "model.onnx"))
    op = MAIN_OPS[variant]
    compiler = FakeCompiler()
    assert aot.kernel_blocker(model, [op], compiler) is None
    first = kernels.load(op).inputs[0]
    head = TINY["d_model"] // TINY["n_heads"]
    assert {p.constants["D"] for p in compiler.plans} == {head}  # the build-time head size, compiled in
    assert {p.signature[first] for p in compiler.plans} == {"*fp32"}
    assert len(compiler.plans) == TINY["n_layers"] * len(kernels.load(op).tactics)
    too_big = FakeCompiler({1: 52 * 1024, 2: 72 * 1024})
    reason = aot.kernel_blocker(model, [op], too_big)
    assert reason.startswith(f"attnx::{op.name}'s Triton kernel needs 52 KiB of shared memory for node ")
    assert reason.endswith("(AOT launches get 48 KiB)")


@pytest.mark.skipif(tensorrt_missing() is None, reason="tensorrt is importable: see the gpu test below")
def test_registration_needs_tensorrt():
    with pytest.raises(ImportError):
        register_plugins([SOFTMAX_OP])


@pytest.mark.gpu
def test_registration_with_tensorrt_is_idempotent():
    reason = tensorrt_missing()
    if reason:
        pytest.skip(reason)
    ops = assemble("softmax", "encoder", TINY).ops
    assert register_plugins(ops) == register_plugins(ops) == ["attnx::SoftmaxAttention"]


_COMPILE_AOT = """
import functools, json, re, sys
from triton.backends.compiler import GPUTarget
from attnx import kernels
from attnx.registry import get_registry
from attnx.trt import aot
from attnx.trt.qdp import aot_functions
from attnx.trt.spec import describe
from tests.trt import stub_tensorrt as stub

trtp = stub.plugin_module(stub.PluginStub())
compiler = functools.partial(aot.compile_plan, target=GPUTarget("cuda", 90, 32))
q, mask = stub.TensorDesc(("batch", 4, "n", 64), stub.HALF), stub.TensorDesc(("batch", "n"), stub.BOOL)
w, rotations = stub.TensorDesc((4, 64), stub.HALF), stub.TensorDesc((4, 64, 2, 4), stub.HALF)
decay = stub.TensorDesc(("batch", 4, "n", 1), stub.HALF)  # the gated rules' log-decay, one per head
strength = stub.TensorDesc(("batch", 4, "n"), stub.HALF)  # the delta rule's write strength
calls = {
    "gated_delta": ((q, q, q, decay, strength), (1, 0.125, 64)),
    "retention": ((q, q, q, decay, strength), (0, 0.125, 64)),
    "softmax": ((q, q, q, mask), (1, 0.125)),
    "linear": ((q, q, q, mask), (1, 1e-6, 64)),
    "cosformer": ((q, q, q, mask), (0, 0, 1e-6, 64)),
    "fastformer": ((q, q, q, w, w, mask), (0.125,)),
    "reformer": ((q, q, rotations, mask), (1, 64)),
}
results = {}
for name, (descs, values) in calls.items():
    op = get_registry().variant(name).load().ops[0]
    autotune, aot_impl = aot_functions(describe(op), kernels.load(op), trtp, compiler)
    tactics = autotune(*descs, *values, ()) if name == "softmax" else None
    kernel_name, ptx, params, extra = aot_impl(*descs, *values, (), 1)
    entry = re.search(r"\\.entry\\s+(\\w+)\\(([^)]*)\\)", ptx)
    results[name] = {
        "name": kernel_name, "entry": entry.group(1),
        "params": ["ptr" if ".ptr" in p else p.split()[1] for p in entry.group(2).split(",")],
        "extra": len(extra), "inputs": len(descs), "block_x": params.block_x, "shared": params.shared_mem,
        "tactics": None if tactics is None else [c.tactics for c in tactics],
    }
print(json.dumps(results))
"""


@pytest.mark.slow
def test_aot_impl_compiles_every_op_to_ptx_with_the_aot_parameter_list():
    """Through the stand-in, compiled for sm_90 without a GPU (Triton's compiler, not its interpreter):
    the returned name is the PTX entry; it takes the input pointers, one u32 per extra arg, the output
    pointer, then only Triton's own (null-padded) scratch pointers; shared memory fits in 48 KiB."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _COMPILE_AOT], capture_output=True, text=True, env=env,
                          cwd=root, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results) == set(VARIANTS)
    for name, result in results.items():
        assert result["name"] == result["entry"], name
        expected = ["ptr"] * result["inputs"] + [".u32"] * result["extra"] + ["ptr"]
        assert result["params"][: len(expected)] == expected, name
        assert set(result["params"][len(expected):]) <= {"ptr"}, name
        assert 0 < result["shared"] <= aot.SHARED_MEMORY_LIMIT and result["block_x"] % 32 == 0, name
    assert results["softmax"]["tactics"] == [[1, 2], [1, 2]]  # fp32 and fp16 tactics all fit at head size 64
