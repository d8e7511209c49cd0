#!/usr/bin/env python
"""The gated / delta-rule family side by side: attnx's op and lightning layer against ONNX Runtime's
native kernels and the pure-torch references, in one run (issue 21, item 6).

    python benchmarks/gated_sidebyside.py --json gated-sidebyside.json   # N = 1024, 4096, 16384
    python benchmarks/gated_sidebyside.py --quick                        # N = 128, every row (smoke run)
    python benchmarks/gated_sidebyside.py --rules gated_delta --shapes qwen3-next --sizes 1024,4096

Per rule (linear, gated scalar, gated per key = GLA, delta, gated delta, KDA) and head shape (``d256``:
2 q/k heads and 4 value heads of 64, a d_model 256 layer's; ``qwen3-next``: Qwen3-Next's linear layers,
16 q/k and 32 value heads of 128, gated delta only), batch 1, rows timed in turns (run i of every row
before run i + 1 of any; median of ``--repeat``, fewer once a row has spent ``--max-time``):

attnx portable   the op's one-node model, portable (standard-op) body, in ONNX Runtime
attnx ort        the same model lowered with the ONNX Runtime kernel bodies (what ``--target ort`` gives)
attnx opset27    the same model at opset 27: the body on the standard ``LinearAttention`` (``--opset 27``)
ORT native       one ``com.microsoft::LinearAttention`` node driven directly, packed (b, n, h*d) inputs,
                 q/kv head counts as attributes (queries and keys repeated to the value heads before the
                 call: the standard op takes no more key than query heads)
ONNX std27       the same node in the default domain at opset 27 (the standard op; ONNX Runtime 1.32
                 expands onnx's function body of it, a Scan over the tokens)
attnx torch      the torch op, eager
HF ... / fla     transformers' and flash-linear-attention's references (benchmarks/references.py)

Inputs are rearranged for each row before timing. Each row's warm-up output is compared with attnx torch's
(max |diff| / max |reference|) before it is timed; a row that disagrees beyond ``--tolerance`` is not
timed. A row whose time, extrapolated linearly from the previous N, exceeds ``--max-call`` s is skipped
with its estimate. Ratios (the "vs native" column, the targets) take each row's fastest run: load from
other jobs on a shared machine only adds time, and adds it unevenly. Decode: ms per one-token step of the
step graph (state in, state out) after a prefill of P tokens through the same graph. Peak memory: at the
largest N each ONNX Runtime row and attnx torch run once in a fresh subprocess of this script (``--peak``),
RSS high-water mark minus the RSS before the call.

The short convolution (``--conv``; Gated DeltaNet's before the rule: 1024 channels, kernel 4, bias,
SiLU): a prefill of N tokens and a one-token step after a carry, as attnx exports it
(:func:`attnx.shortconv.carried_conv` through torch.export: a grouped ``Conv`` over a sequence, the taps'
products in a step) beside one ``com.microsoft::CausalConvWithState`` node and one standard
``CausalConvWithState`` of opset 27 (ONNX Runtime 1.32 expands onnx's function body of it).

The lightning layer (``layer`` rows): transformers' ``MiniMaxLightningAttention`` (d_model 256, 4 heads of
64, the slope buffer of layer 1 of 4) beside the same layer assembled from the op (qkv projection, SiLU,
op with the fixed decay, full-width RMSNorm, sigmoid gate, output projection; its weights copied), in
torch and exported (portable and ORT-kernel bodies). Then the issue's targets, met or missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gated import RULES, Heads, Inputs, inputs, op_session
from references import references
from rich.console import Console
from rich.table import Table
from run import print_targets, target_row
from torch import nn

from attnx.bench.machine import MemoryProbe, machine_info
from attnx.exporter.lowering import lower
from attnx.exporter.opsets import DEFAULT_OPSET, IR_VERSIONS
from attnx.exporter.signature import dynamic_shapes
from attnx.exporter.trace import export_onnx
from attnx.models.spec import TensorSpec
from attnx.parity.runners import ort_session_options
from attnx.plugins.gated.op import (
    GATED_DELTA_RULE_OP,
    GATED_DELTA_RULE_STEP_OP,
    ORT_BODIES,
    default_chunk_size,
    gated_delta_rule,
)
from attnx.plugins.lib.standard import STANDARD_OPSET

SIZES = (1024, 4096, 16384)
QUICK_SIZES = (128, 256)
TARGET_N = 4096
DECODE_POSITIONS = (128, 16384)
DECODE_STEPS = 32
DECODE_ROUNDS = 3  # lowest median of 32 steps, as attnx.bench.decode
SHAPES = {"d256": Heads(2, 4, 64), "qwen3-next": Heads(16, 32, 128)}
SHAPE_RULES = {"d256": tuple(RULES), "qwen3-next": ("gated_delta",)}
PORTABLE, ORT, NATIVE, EAGER = "attnx portable", "attnx ort", "ORT native", "attnx torch"
STANDARD, STANDARD_NATIVE = "attnx opset27", "ONNX std27"
ATTNX_ONNX = (PORTABLE, ORT, STANDARD)
PEAK_ROWS = (PORTABLE, ORT, STANDARD, NATIVE, EAGER)
NATIVE_ROWS = {NATIVE: ("com.microsoft", DEFAULT_OPSET), STANDARD_NATIVE: ("", STANDARD_OPSET)}
# LinearAttention's update rule per attnx rule (a per-key decay is a (b, n, h*dk) decay input)
NATIVE_RULES = {
    "linear": "linear",
    "gated": "gated",
    "gla": "gated",
    "delta": "delta",
    "gated_delta": "gated_delta",
    "kda": "gated_delta",
}
LAYER_D_MODEL, LAYER_HEADS, LAYER_HEAD_DIM = 256, 4, 64
HF_LAYER = "HF MiniMaxLightningAttention"
MiB = 1 << 20


@dataclasses.dataclass
class Row:
    """One contender: ``run`` is the timed call, ``output`` turns its result into (b, hv, n, dv)."""

    run: Callable[[], Any]
    output: Callable[[Any], np.ndarray]


@dataclasses.dataclass
class Result:
    shape: str
    rule: str
    n: int
    name: str
    times_s: list[float] = dataclasses.field(default_factory=list)
    agreement: float | None = None
    peak_bytes: int | None = None
    note: str = ""

    @property
    def median_s(self) -> float | None:
        return float(np.median(self.times_s)) if self.times_s else None

    @property
    def min_s(self) -> float | None:
        return min(self.times_s) if self.times_s else None


def window(x: Inputs, start: int, stop: int) -> Inputs:
    """Tokens ``start`` .. ``stop`` - 1 of ``x``."""
    cut = [t[:, :, start:stop].contiguous() for t in (x.q, x.k, x.v, x.g, x.beta)]
    return Inputs(*cut, x.delta)


# ---------------------------------------------------------------- ONNX Runtime rows


def attnx_session(
    x: Inputs, chunk: int, threads: int, bodies: tuple | None, step: bool, opset: int = DEFAULT_OPSET
) -> Any:
    """The one-node model of the op (``step``: the step op, with a state input) at ``opset`` in ONNX
    Runtime."""
    b, hv, _, dv = x.v.shape
    if step:
        state = torch.zeros(b, hv, x.k.shape[-1], dv)
        args = (x.q, x.k, x.v, x.g, x.beta, state, x.delta, x.scale, chunk)
        outputs = (torch.empty_like(x.v), state)
        return op_session(GATED_DELTA_RULE_STEP_OP, args, outputs, threads, bodies, opset)
    return op_session(GATED_DELTA_RULE_OP, x.args(chunk), torch.empty_like(x.v), threads, bodies, opset)


def attnx_lowering(name: str, step: bool) -> tuple[tuple | None, int]:
    """(bodies, opset) of attnx row ``name``: the ORT kernel bodies, or the op's own at the row's opset."""
    if name == ORT:
        return ORT_BODIES[GATED_DELTA_RULE_STEP_OP.name if step else GATED_DELTA_RULE_OP.name], DEFAULT_OPSET
    return None, STANDARD_OPSET if name == STANDARD else DEFAULT_OPSET


def attnx_feed(x: Inputs, state: np.ndarray | None = None) -> dict[str, np.ndarray]:
    feed = {name: getattr(x, name).numpy() for name in ("q", "k", "v", "g", "beta")}
    return feed if state is None else {**feed, "state": state}


def native_model(rule: str, x: Inputs, name: str = NATIVE) -> bytes:
    """One ``LinearAttention`` node for ``rule`` with a state input and output: ``com.microsoft``'s, or
    the standard op of opset 27 (row ``name``, :data:`NATIVE_ROWS`)."""
    domain, opset = NATIVE_ROWS[name]
    from onnx import TensorProto, helper

    hv = x.v.shape[1]
    names = ["query", "key", "value", "past_state"]
    if rule not in ("linear", "delta"):
        names.append("decay")
    if x.delta:
        names += [""] * (5 - len(names)) + ["beta"]
    node = helper.make_node(
        "LinearAttention",
        names,
        ["output", "present_state"],
        domain=domain,
        q_num_heads=hv,
        kv_num_heads=hv,
        update_rule=NATIVE_RULES[rule],
        scale=x.scale,
    )
    dims = {"query": 3, "key": 3, "value": 3, "past_state": 4, "decay": 3, "beta": 3, "output": 3}
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * dims[name])  # noqa: E731
    graph = helper.make_graph(
        [node],
        f"native_{rule}",
        [value(name) for name in names if name],
        [value("output"), helper.make_tensor_value_info("present_state", TensorProto.FLOAT, [None] * 4)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
        ir_version=IR_VERSIONS[opset],
    )
    return model.SerializeToString()


def native_feed(rule: str, x: Inputs, state: np.ndarray) -> dict[str, np.ndarray]:
    """``x`` packed (b, n, h*d) as LinearAttention takes it: q and k repeated to the value heads, v scaled by
    beta for the additive rules (which take no beta), the decay only where the rule has one."""
    packed = lambda t: t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1).contiguous().numpy()  # noqa: E731
    r = x.v.shape[1] // x.k.shape[1]
    q, k = (t.repeat_interleave(r, dim=1) for t in (x.q, x.k))
    feed = {"query": packed(q), "key": packed(k), "past_state": state}
    feed["value"] = packed(x.v if x.delta else x.v * x.beta[..., None])
    if rule not in ("linear", "delta"):
        feed["decay"] = packed(x.g)
    if x.delta:
        feed["beta"] = x.beta.transpose(1, 2).contiguous().numpy()
    return feed


def native_output(out: list[np.ndarray], x: Inputs) -> np.ndarray:
    b, hv, n, dv = x.v.shape
    return out[0].reshape(b, n, hv, dv).transpose(0, 2, 1, 3)


def empty_state(x: Inputs) -> np.ndarray:
    return np.zeros((x.v.shape[0], x.v.shape[1], x.k.shape[-1], x.v.shape[-1]), np.float32)


def native_session(rule: str, x: Inputs, threads: int, name: str = NATIVE) -> Any:
    import onnxruntime

    return onnxruntime.InferenceSession(native_model(rule, x, name), ort_session_options(threads))


def op_rows(rule: str, x: Inputs, threads: int, use_fla: bool) -> dict[str, Callable[[], Row]]:
    """Every contender of ``rule`` on ``x``, made on demand (an ONNX Runtime session per row)."""
    chunk = default_chunk_size(x.delta, x.g.shape[-1] > 1)
    flat = lambda out: out[0]  # noqa: E731

    def attnx_row(name: str) -> Row:
        bodies, opset = attnx_lowering(name, step=False)
        session = attnx_session(x, chunk, threads, bodies, step=False, opset=opset)
        feed = attnx_feed(x)
        return Row(lambda: session.run(None, feed), flat)

    def native_row(name: str) -> Row:
        session, feed = native_session(rule, x, threads, name), native_feed(rule, x, empty_state(x))
        return Row(lambda: session.run(None, feed), lambda out: native_output(out, x))

    rows: dict[str, Callable[[], Row]] = {
        **{name: lambda name=name: attnx_row(name) for name in ATTNX_ONNX},
        **{name: lambda name=name: native_row(name) for name in NATIVE_ROWS},
        EAGER: lambda: Row(lambda: gated_delta_rule(*x.args(chunk)), lambda out: out.numpy()),
    }
    for name, build in references(rule, use_fla).items():
        rows[name] = lambda build=build: Row(build(x), lambda out: out.numpy())
    return rows


# ---------------------------------------------------------------- the lightning layer


def hf_lightning(seed: int = 0) -> nn.Module:
    """transformers' MiniMaxLightningAttention (layer 1 of 4) with random weights."""
    from transformers.models.minimax.configuration_minimax import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    config = MiniMaxConfig(
        hidden_size=LAYER_D_MODEL,
        num_attention_heads=LAYER_HEADS,
        head_dim=LAYER_HEAD_DIM,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 4,
    )
    torch.manual_seed(seed)
    layer = MiniMaxLightningAttention(config, layer_idx=1).eval()
    with torch.no_grad():
        layer.norm.weight.uniform_(0.5, 1.5)  # not all ones, so a norm that ignores its weight shows
    return layer


class LightningLayer(nn.Module):
    """MiniMax's lightning attention layer from attnx's op: SiLU(qkv projection) split per head, the
    additive rule with the fixed decay g = -slope per head (beta 1, scale 1), RMSNorm over the full width,
    a sigmoid output gate from the input, the output projection. Weights copied from ``hf``."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.heads, self.head_dim = hf.num_attention_heads, hf.head_dim
        self.qkv_proj, self.output_gate, self.out_proj = hf.qkv_proj, hf.output_gate, hf.out_proj
        self.norm_weight, self.eps = hf.norm.weight, hf.norm.variance_epsilon
        self.register_buffer("decay", -hf.slope_rate.reshape(1, -1, 1, 1).clone())
        self.chunk = default_chunk_size(False, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = F.silu(self.qkv_proj(x)).reshape(b, n, self.heads, 3 * self.head_dim).transpose(1, 2)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        g = self.decay.expand(b, self.heads, n, 1)
        beta = torch.ones_like(g[..., 0])
        out = gated_delta_rule(q, k, v, g, beta, False, 1.0, self.chunk)
        out = out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight
        return self.out_proj(torch.sigmoid(self.output_gate(x)) * out)


def layer_onnx(layer: nn.Module, bodies: tuple | None) -> bytes:
    """attnx's export of ``layer`` (torch.export, bare attnx nodes, function lowering) with the op's
    portable bodies or ``bodies`` (the ONNX Runtime kernel ones)."""
    specs = [TensorSpec("x", "float32", ("batch", "seq", LAYER_D_MODEL))]
    outputs = [TensorSpec("y", "float32", ("batch", "seq", LAYER_D_MODEL))]
    example = (torch.randn(1, 64, LAYER_D_MODEL),)
    model = export_onnx(
        layer, example, [GATED_DELTA_RULE_OP], DEFAULT_OPSET, specs, outputs, dynamic_shapes(specs)
    )
    op = GATED_DELTA_RULE_OP if bodies is None else dataclasses.replace(GATED_DELTA_RULE_OP, bodies=bodies)
    model = lower(model, [op], "function")
    from onnx import helper

    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model.SerializeToString()


def layer_rows(threads: int) -> tuple[dict[str, Callable[[torch.Tensor], Row]], str]:
    """The lightning layer's contenders (HF first: the agreement reference) as builders of a row for an
    input x (b, n, d_model); and the layer's description."""
    import onnxruntime

    hf = hf_lightning()
    ours = LightningLayer(hf).eval()
    sessions = {
        name: onnxruntime.InferenceSession(layer_onnx(ours, bodies), ort_session_options(threads))
        for name, bodies in ((PORTABLE, None), (ORT, ORT_BODIES["GatedDeltaRule"]))
    }
    as_array = lambda out: out.numpy()  # noqa: E731

    def session_row(name: str, x: torch.Tensor) -> Row:
        feed = {"x": x.numpy()}
        return Row(lambda: sessions[name].run(None, feed), lambda out: out[0])

    rows: dict[str, Callable[[torch.Tensor], Row]] = {
        HF_LAYER: lambda x: Row(lambda: hf(x, None, None)[0], as_array),
        EAGER: lambda x: Row(lambda: ours(x), as_array),
        PORTABLE: lambda x: session_row(PORTABLE, x),
        ORT: lambda x: session_row(ORT, x),
    }
    slopes = ", ".join(f"{s:.4f}" for s in hf.slope_rate.flatten().tolist())
    return rows, f"d_model {LAYER_D_MODEL}, {LAYER_HEADS} heads of {LAYER_HEAD_DIM}, slopes {slopes}"


# ---------------------------------------------------------------- timing


def agreement(out: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(out - reference).max() / max(np.abs(reference).max(), 1e-30))


def time_rows(
    rows: dict[str, Callable[[], Row]],
    results: dict[str, Result],
    estimates: dict[str, float],
    args: argparse.Namespace,
) -> None:
    """Warm up every row of ``rows`` (its output checked against the first row's), then time them in
    turns; ``estimates``: each row's expected seconds per call (skipped above ``--max-call``)."""
    live: dict[str, Row] = {}
    reference: np.ndarray | None = None
    for name, build in rows.items():
        m = results[name]
        if estimates.get(name, 0.0) > args.max_call:
            m.note = f"skipped: est. {estimates[name]:.0f} s > {args.max_call:g} s per call"
            continue
        try:
            row = build()
            start = time.perf_counter()
            with torch.inference_mode():
                out = row.output(row.run())
            first = time.perf_counter() - start
        except Exception as exc:  # a contender failing is a row to report
            m.note = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            continue
        if reference is None:
            reference = out
        m.agreement = agreement(out, reference)
        if m.agreement > args.tolerance:
            m.note = f"not timed: disagrees ({m.agreement:.1e} > {args.tolerance:g})"
            continue
        live[name] = row
        if first > args.max_call:  # the warm-up alone was too long to repeat
            m.times_s.append(first)
            m.note = f"1 run (the warm-up: {first:.0f} s > {args.max_call:g} s)"
            del live[name]
    spent = dict.fromkeys(live, 0.0)
    for _ in range(args.repeat):
        for name, row in live.items():
            if len(results[name].times_s) >= 3 and spent[name] > args.max_time:
                continue
            start = time.perf_counter()
            with torch.inference_mode():
                row.run()
            results[name].times_s.append(time.perf_counter() - start)
            spent[name] += results[name].times_s[-1]


def estimate(results: list[Result], name: str, n: int) -> float:
    """Seconds per call of row ``name`` at ``n``, linear from its largest timed N below (0: unknown)."""
    timed = [r for r in results if r.name == name and r.n < n and r.median_s]
    last = max(timed, key=lambda r: r.n, default=None)
    return 0.0 if last is None else last.median_s * n / last.n  # type: ignore[operator]


def run_op(shape: str, rule: str, args: argparse.Namespace, console: Console) -> list[Result]:
    out: list[Result] = []
    for n in args.sizes:
        x = inputs(rule, n, seed=n, heads=SHAPES[shape])
        rows = op_rows(rule, x, args.threads, not args.no_fla)
        rows = {EAGER: rows.pop(EAGER), **rows}  # attnx torch first: the agreement reference
        rows = {name: row for name, row in rows.items() if not args.rows or name in args.rows}
        results = {name: Result(shape, rule, n, name) for name in rows}
        time_rows(rows, results, {name: estimate(out, name, n) for name in rows}, args)
        out += results.values()
        console.print(f"· {shape} {rule} N={n}: " + "  ".join(describe(r) for r in results.values()))
    return out


def run_layer(args: argparse.Namespace, console: Console) -> tuple[list[Result], str]:
    builders, description = layer_rows(args.threads)
    out: list[Result] = []
    for n in args.sizes:
        x = torch.randn(1, n, LAYER_D_MODEL, generator=torch.Generator().manual_seed(n))
        rows = {name: lambda build=build, x=x: build(x) for name, build in builders.items()}
        results = {name: Result("layer", "gated", n, name) for name in rows}
        time_rows(rows, results, {name: estimate(out, name, n) for name in rows}, args)
        out += results.values()
        console.print(f"· lightning layer N={n}: " + "  ".join(describe(r) for r in results.values()))
    return out, description


def describe(r: Result) -> str:
    return f"{r.name} {r.median_s * 1e3:.1f} ms" if r.median_s else f"{r.name} ({r.note})"


# ---------------------------------------------------------------- the short convolution

CONV_KERNEL = 4
CONV_ATTNX, CONV_MICROSOFT, CONV_STANDARD = "attnx conv", "ORT CausalConvWithState", "ONNX std27 conv"


class CarriedConv(nn.Module):
    """SiLU of :func:`attnx.shortconv.carried_conv` on (batch, n, C) inputs, token-major as attnx's layers
    feed it: after a carry (a step) or from zeros (a prefill)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, step: bool) -> None:
        super().__init__()
        self.weight, self.bias, self.step = nn.Parameter(weight), nn.Parameter(bias), step

    def forward(self, x: torch.Tensor, carry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from attnx.shortconv import carried_conv

        out, grown = carried_conv(x, self.weight, self.bias, carry if self.step else None)
        return F.silu(out), grown


def conv_model(name: str, weight: torch.Tensor, bias: torch.Tensor, step: bool) -> bytes:
    """Row ``name``'s graph of the convolution (inputs x, carry; outputs y, carry'): x and y token-major
    for attnx's row, channel-major for the ``CausalConvWithState`` rows (each op's own layout)."""
    from onnx import TensorProto, helper, numpy_helper

    channels = weight.shape[0]
    shapes = {"x": ["batch", channels, "seq"], "carry": ["batch", channels, CONV_KERNEL - 1]}
    if name == CONV_ATTNX:
        shapes["x"] = ["batch", "seq", channels]
        specs = [TensorSpec(n, "float32", tuple(d)) for n, d in shapes.items()]
        outputs = [
            TensorSpec("y", "float32", tuple(shapes["x"])),
            TensorSpec("grown", "float32", tuple(shapes["carry"])),
        ]
        example = (torch.randn(1, 8, channels), torch.randn(1, channels, CONV_KERNEL - 1))
        module = CarriedConv(weight, bias, step)
        return export_onnx(
            module, example, [], DEFAULT_OPSET, specs, outputs, dynamic_shapes(specs)
        ).SerializeToString()
    domain, opset = ("com.microsoft", DEFAULT_OPSET) if name == CONV_MICROSOFT else ("", STANDARD_OPSET)
    node = helper.make_node(
        "CausalConvWithState",
        ["x", "weight", "bias", "carry" if step else ""],
        ["y", "grown"],
        domain=domain,
        activation="silu",
    )
    value = lambda n, dims: helper.make_tensor_value_info(n, TensorProto.FLOAT, dims)  # noqa: E731
    inputs = [value("x", shapes["x"])] + ([value("carry", shapes["carry"])] if step else [])
    graph = helper.make_graph(
        [node],
        "conv",
        inputs,
        [value("y", shapes["x"]), value("grown", shapes["carry"])],
        initializer=[
            numpy_helper.from_array(weight.numpy(), "weight"),
            numpy_helper.from_array(bias.numpy(), "bias"),
        ],
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSIONS[opset]).SerializeToString()


def conv_ms(sizes: list[int], threads: int, repeat: int, channels: int) -> list[dict[str, Any]]:
    """ms of each convolution row: a prefill of each N and a one-token step, timed in turns (lowest of
    ``repeat`` runs; steps: lowest median of :data:`DECODE_ROUNDS` x :data:`DECODE_STEPS`); each row's
    output against the torch module's first."""
    import onnxruntime

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(channels, 1, CONV_KERNEL, generator=gen) * 0.5
    bias = torch.randn(channels, generator=gen)
    rows = (CONV_ATTNX, CONV_MICROSOFT, CONV_STANDARD)
    found = []
    for n in [1, *sizes]:
        step = n == 1
        x = torch.randn(1, n, channels, generator=gen)
        carry = torch.randn(1, channels, CONV_KERNEL - 1, generator=gen)
        with torch.inference_mode():
            expected = CarriedConv(weight, bias, step)(x, carry)[0].numpy()
        token_major = {"x": x.numpy(), "carry": carry.numpy()}
        channel_major = {"x": x.transpose(1, 2).contiguous().numpy(), "carry": carry.numpy()}
        sessions, feeds = {}, {}
        for name in rows:
            session = onnxruntime.InferenceSession(
                conv_model(name, weight, bias, step), ort_session_options(threads)
            )
            feed = token_major if name == CONV_ATTNX else channel_major
            feeds[name] = {i.name: feed[i.name] for i in session.get_inputs()}
            sessions[name] = session
        times: dict[str, list[float]] = {name: [] for name in rows}
        wanted = {name: expected if name == CONV_ATTNX else expected.transpose(0, 2, 1) for name in rows}
        agreement_of = {
            name: agreement(sessions[name].run(None, feeds[name])[0], wanted[name]) for name in rows
        }
        for _ in range(DECODE_ROUNDS if step else repeat):
            for name in rows:
                if step:
                    laps = []
                    for _ in range(DECODE_STEPS):
                        start = time.perf_counter()
                        sessions[name].run(None, feeds[name])
                        laps.append(time.perf_counter() - start)
                    times[name].append(float(np.median(laps)))
                else:
                    start = time.perf_counter()
                    sessions[name].run(None, feeds[name])
                    times[name].append(time.perf_counter() - start)
        for name in rows:
            found.append({"row": name, "n": n, "ms": min(times[name]) * 1e3, "agreement": agreement_of[name]})
    return found


def print_conv(rows: list[dict[str, Any]], channels: int, console: Console) -> None:
    table = Table(title=f"short convolution ({channels} channels, kernel {CONV_KERNEL}, SiLU; N = 1: a step)")
    for column in ("N", "row", "min ms", "vs ORT kernel", "agreement"):
        table.add_column(column, justify="left" if column == "row" else "right")
    for r in rows:
        base = next(b for b in rows if b["n"] == r["n"] and b["row"] == CONV_MICROSOFT)
        table.add_row(
            str(r["n"]), r["row"], f"{r['ms']:.3f}", f"{r['ms'] / base['ms']:.2f}", f"{r['agreement']:.1e}"
        )
    console.print(table)


# ---------------------------------------------------------------- decode


def decode_ms(shape: str, rule: str, name: str, position: int, threads: int) -> float:
    """ms of a one-token step after ``position`` tokens (lowest of :data:`DECODE_ROUNDS` medians of
    :data:`DECODE_STEPS` steps), through the step graph of row ``name`` with its state fed back."""
    x = inputs(rule, position + DECODE_STEPS + 1, seed=position, heads=SHAPES[shape])
    prompt = window(x, 0, position)
    if name in NATIVE_ROWS:
        session = native_session(rule, x, threads, name)
        step = lambda part, state: session.run(None, native_feed(rule, part, state))[1]  # noqa: E731
    else:
        chunk = default_chunk_size(x.delta, x.g.shape[-1] > 1)
        bodies, opset = attnx_lowering(name, step=True)
        session = attnx_session(prompt, chunk, threads, bodies, step=True, opset=opset)
        step = lambda part, state: session.run(None, attnx_feed(part, state))[1]  # noqa: E731
    state = step(prompt, empty_state(x))
    tokens = [window(x, i, i + 1) for i in range(position, position + DECODE_STEPS + 1)]
    state = step(tokens[0], state)  # warm-up
    medians = []
    for _ in range(DECODE_ROUNDS):  # the same tokens from the same state: a step's cost, not its drift
        times, carried = [], state
        for token in tokens[1:]:
            start = time.perf_counter()
            carried = step(token, carried)
            times.append(time.perf_counter() - start)
        medians.append(float(np.median(times)))
    return min(medians) * 1e3


def decode_rows(shape: str, rule: str, positions: tuple[int, ...], threads: int) -> list[dict[str, Any]]:
    rows = []
    for name in (*ATTNX_ONNX, *NATIVE_ROWS):
        for position in positions:
            rows.append(
                {
                    "shape": shape,
                    "rule": rule,
                    "row": name,
                    "position": position,
                    "ms_per_token": decode_ms(shape, rule, name, position, threads),
                }
            )
    return rows


# ---------------------------------------------------------------- peak memory (in a fresh process)


def peak_here(shape: str, rule: str, name: str, n: int, threads: int) -> int | None:
    """Bytes the first call of row ``name`` adds to this process's RSS at its high-water mark."""
    torch.set_num_threads(threads)
    x = inputs(rule, n, seed=n, heads=SHAPES[shape])
    row = op_rows(rule, x, threads, use_fla=False)[name]()
    probe = MemoryProbe.start()
    with torch.inference_mode():
        row.run()
    return probe.peak_delta()


def peak_in_subprocess(shape: str, rule: str, name: str, n: int, threads: int) -> int | None:
    command = [sys.executable, __file__, "--peak", f"{shape}:{rule}:{name}:{n}", "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1])["peak_bytes"] if done.returncode == 0 and lines else None


# ---------------------------------------------------------------- report


def find(results: list[Result], shape: str, rule: str, name: str, n: int) -> Result | None:
    found = [r for r in results if (r.shape, r.rule, r.name, r.n) == (shape, rule, name, n) and r.median_s]
    return found[0] if found else None


def print_results(results: list[Result], console: Console, title: str) -> None:
    table = Table(title=title)
    for column in (
        "shape",
        "rule",
        "N",
        "row",
        "median ms",
        "min ms",
        "vs native",
        "agreement",
        "peak MiB",
        "note",
    ):
        table.add_column(
            column,
            justify="right" if column in ("N", "median ms", "min ms", "vs native", "peak MiB") else "left",
        )
    for r in results:
        base = find(results, r.shape, r.rule, NATIVE, r.n) or find(results, r.shape, r.rule, HF_LAYER, r.n)
        ratio = f"{r.min_s / base.min_s:.2f}" if r.min_s and base else ""  # type: ignore[operator]
        table.add_row(
            r.shape,
            r.rule,
            str(r.n),
            r.name,
            f"{r.median_s * 1e3:.1f}" if r.median_s else "",
            f"{r.min_s * 1e3:.1f}" if r.min_s else "",
            ratio,
            "" if r.agreement is None else f"{r.agreement:.1e}",
            "" if r.peak_bytes is None else f"{r.peak_bytes / MiB:.0f}",
            "; ".join(filter(None, [f"{len(r.times_s)} runs" if r.times_s else "", r.note])),
        )
    console.print(table)


def ratio_target(
    target: str, rule: str, top: Result | None, bottom: Result | None, limit: float
) -> dict[str, Any] | None:
    if top is None or bottom is None:
        return None
    ratio = top.min_s / bottom.min_s  # type: ignore[operator]
    detail = f"{top.name} {top.min_s * 1e3:.1f} ms / {bottom.name} {bottom.min_s * 1e3:.1f} ms"  # type: ignore[operator]
    return target_row(target, rule, ratio, f"≤ {limit:g}", ratio <= limit, detail)


def targets(results: list[Result], decode: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """The issue's targets per (shape, rule), measured where this run has both sides."""
    n = TARGET_N if TARGET_N in sizes else max(sizes)
    short, long = min(sizes), max(sizes)
    rows: list[dict[str, Any] | None] = []
    for shape, rule in dict.fromkeys((r.shape, r.rule) for r in results):
        label = f"{rule} ({shape})"
        get = lambda name, k=n, shape=shape, rule=rule: find(results, shape, rule, name, k)  # noqa: E731
        hf = [r for r in results if (r.shape, r.rule, r.n) == (shape, rule, n) and r.name.startswith("HF")]
        hf_best = min((r for r in hf if r.min_s), key=lambda r: r.min_s, default=None)  # type: ignore[arg-type,return-value]
        portable, native = get(PORTABLE), get(NATIVE)
        rows.append(ratio_target(f"portable / ORT native N={n}", label, portable, native, 2.0))
        rows.append(ratio_target(f"portable / HF eager N={n}", label, portable, hf_best, 0.05))
        fastest = min((r for r in (portable, get(ORT)) if r), key=lambda r: r.min_s, default=None)  # type: ignore[arg-type,return-value]
        rows.append(ratio_target(f"fastest attnx / ORT native N={n}", label, fastest, native, 1.0))
        for name in ATTNX_ONNX:
            if long > short:
                rows.append(
                    ratio_target(f"{name} t({long})/t({short})", label, get(name, long), get(name, short), 18)
                )
            row, eager = get(name, long), find(results, shape, rule, EAGER, long)
            if row and eager and row.peak_bytes and eager.peak_bytes:
                ratio = row.peak_bytes / eager.peak_bytes
                detail = f"{row.peak_bytes / MiB:.0f} / {eager.peak_bytes / MiB:.0f} MiB"
                rows.append(
                    target_row(
                        f"{name} peak / torch eager N={long}", label, ratio, "≤ 1.5", ratio <= 1.5, detail
                    )
                )
        for name in ATTNX_ONNX:
            points = sorted(
                (d["position"], d["ms_per_token"])
                for d in decode
                if (d["shape"], d["rule"], d["row"]) == (shape, rule, name)
            )
            if len(points) >= 2:
                (p0, t0), (p1, t1) = points[0], points[-1]
                detail = f"{t1:.3f} / {t0:.3f} ms"
                rows.append(
                    target_row(
                        f"{name} decode P={p1} / P={p0}", label, t1 / t0, "≤ 1.1", t1 / t0 <= 1.1, detail
                    )
                )
    return [r for r in rows if r is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 128, 256, decode at 16 and 64, no peaks")
    parser.add_argument("--sizes", default=None, help="comma-separated N (default 1024,4096,16384)")
    parser.add_argument("--rules", default=",".join(RULES), help="comma-separated of " + ", ".join(RULES))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated of " + ", ".join(SHAPES))
    parser.add_argument("--no-layer", action="store_true", help="leave out the lightning layer rows")
    parser.add_argument("--conv", action="store_true", help="add the short convolution's rows")
    parser.add_argument(
        "--conv-channels",
        type=int,
        default=1024,
        help="channels of the convolution rows (the 0.8B Qwen3.5: 6144)",
    )
    parser.add_argument("--no-fla", action="store_true", help="leave out flash-linear-attention's references")
    parser.add_argument("--no-peak", action="store_true", help="leave out the peak-memory subprocesses")
    parser.add_argument(
        "--rows",
        default="",
        help="comma-separated row names to keep (default all; the first is the agreement reference)",
    )
    parser.add_argument("--decode-positions", default=None, help="comma-separated; empty: no decode rows")
    parser.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime intra-op threads")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per row and N (median)")
    parser.add_argument("--max-time", type=float, default=20.0, help="s of timed runs per row and N")
    parser.add_argument("--max-call", type=float, default=30.0, help="skip a row estimated slower (s)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="max |diff| / max |reference|")
    parser.add_argument("--json", type=Path, default=None, help="write every number to this JSON file")
    parser.add_argument("--peak", default=None, help=argparse.SUPPRESS)  # shape:rule:row:n, in a subprocess
    args = parser.parse_args(argv)
    args.rows = [name for name in args.rows.split(",") if name]
    if args.peak:
        shape, rule, name, n = args.peak.split(":")
        print(json.dumps({"peak_bytes": peak_here(shape, rule, name, int(n), args.threads)}))
        return 0
    torch.set_num_threads(args.threads)
    args.sizes = [
        int(n) for n in (args.sizes or ",".join(map(str, QUICK_SIZES if args.quick else SIZES))).split(",")
    ]
    positions = args.decode_positions
    if positions is None:
        positions = "16,64" if args.quick else ",".join(map(str, DECODE_POSITIONS))
    decode_positions = tuple(int(p) for p in positions.split(",") if p)
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(f"gated side by side: {args.threads} threads, N {args.sizes}, machine {machine_info()}")
    started = time.perf_counter()
    results: list[Result] = []
    decode: list[dict[str, Any]] = []
    wanted = args.rules.split(",")
    for shape in args.shapes.split(","):
        for rule in (r for r in SHAPE_RULES[shape] if r in wanted):
            op = run_op(shape, rule, args, console)
            if not (args.quick or args.no_peak):
                long = max(args.sizes)
                for r in (r for r in op if r.n == long and r.name in PEAK_ROWS and r.times_s):
                    r.peak_bytes = peak_in_subprocess(shape, rule, r.name, long, args.threads)
            results += op
            if decode_positions:
                decode += decode_rows(shape, rule, decode_positions, args.threads)
            if args.json:  # as it goes: a long run killed late keeps its figures
                write_json(args.json, args, results, decode, time.perf_counter() - started)
    conv = conv_ms(args.sizes, args.threads, args.repeat, args.conv_channels) if args.conv else []
    description = ""
    if not args.no_layer:
        layer, description = run_layer(args, console)
        results += layer
    print_results(
        results,
        console,
        "gated / delta rules side by side (batch 1; ms; agreement vs attnx torch, layer vs HF)",
    )
    if description:
        console.print(f"lightning layer: {description}")
    for d in decode:
        console.print(
            f"decode {d['shape']} {d['rule']} {d['row']} P={d['position']}: {d['ms_per_token']:.3f} ms/token"
        )
    if conv:
        print_conv(conv, args.conv_channels, console)
    rows = targets(results, decode, args.sizes)
    print_targets(rows, console)
    elapsed = time.perf_counter() - started
    console.print(f"total wall time {elapsed / 60:.1f} min")
    if args.json:
        write_json(args.json, args, results, decode, elapsed, conv)
        console.print(f"wrote {args.json}")
    return 0


def write_json(
    path: Path,
    args: argparse.Namespace,
    results: list[Result],
    decode: list[dict[str, Any]],
    elapsed: float,
    conv: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> None:
    data = {
        "machine": machine_info(),
        "threads": args.threads,
        "sizes": args.sizes,
        "elapsed_s": elapsed,
        "results": [{**dataclasses.asdict(r), "median_s": r.median_s, "min_s": r.min_s} for r in results],
        "decode": decode,
        "conv": list(conv),
        "targets": targets(results, decode, args.sizes),
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
