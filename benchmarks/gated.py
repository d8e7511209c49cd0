#!/usr/bin/env python
"""Time the gated / delta-rule op (attnx/plugins/gated/op.py) per rule and length, CPU, batch 1.

    python benchmarks/gated.py                                   # N = 1024, 4096; every rule
    python benchmarks/gated.py --seq-lens 1024,16384 --rules gated_delta --candidates portable
    python benchmarks/gated.py --chunk-sizes 16,32,64 --candidates portable   # tune the chunk size

Shapes: 4 q/k heads and 8 value heads of 64 (grouped as Qwen3-Next), L2-normalised keys, g <= 0 from
-softplus, beta from a sigmoid. Candidates:

portable  the op's portable ONNX body (one-node model, function lowering) in ONNX Runtime
ort       the body on ONNX Runtime's ``LinearAttention`` kernel (attnx.plugins.gated.op.ORT_BODIES)
ort-gdn   the body on ONNX Runtime's ``GatedDeltaNet`` kernel
hf        Hugging Face transformers' reference: ``torch_chunk_gated_delta_rule`` (Qwen3-Next; scalar decay)
          or ``chunk_kimi_delta_attention`` (Kimi; per-key decay), delta rules only
torch     the torch op, eager (on ``--device``)
triton    attnx's Triton kernel of the op (attnx.kernels.run; TensorRT's plugin launches the same kernel),
          with ``--device cuda``
fla       flash-linear-attention's compiled chunk kernel of the rule, with ``--device cuda``

With ``--device cuda`` (``python benchmarks/gated.py --device cuda --candidates torch,triton,fla``) every
timing is synchronised, and each row also prints the largest difference of ``triton`` and ``fla`` from
the torch op's output on the same inputs.

ONNX Runtime and torch get ``--threads`` intra-op threads. Each (rule, N) times its candidates in turn,
round after round, so all of them see the same load on a shared machine; the minimum over rounds is
printed (and written with ``--json``). ``--cpu-time`` times the process's CPU time instead of the wall
clock: with ``--threads 1`` the work itself, which other load on a shared machine inflates far less.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from references import fla_kernel, hf_kimi, hf_qwen3_next

from attnx import kernels
from attnx.exporter.lowering import lower
from attnx.ops import AttentionOp
from attnx.parity.runners import ort_session_options
from attnx.plugins.gated._ort import ORT_GATED_DELTA_NET_BODIES
from attnx.plugins.gated.op import GATED_DELTA_RULE_OP, ORT_BODIES, gated_delta_rule
from attnx.testing.onnx_op import OPSET, node_model
from attnx.testing.subject import Case, OpCall


@dataclasses.dataclass(frozen=True)
class Heads:
    """q/k heads, value heads (a multiple of them), head size (d_k = d_v)."""

    qk: int
    v: int
    dim: int


DEFAULT_HEADS = Heads(4, 8, 64)
RULES = {  # name: (delta, per-key decay, decayed)
    "linear": (False, False, False),
    "gated": (False, False, True),
    "gla": (False, True, True),
    "delta": (True, False, False),
    "gated_delta": (True, False, True),
    "kda": (True, True, True),
}


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    delta: bool

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.q.shape[-1])

    def args(self, chunk_size: int) -> tuple:
        return (self.q, self.k, self.v, self.g, self.beta, self.delta, self.scale, chunk_size)

    def to(self, device: str) -> Inputs:
        moved = {name: getattr(self, name).to(device) for name in ("q", "k", "v", "g", "beta")}
        return Inputs(**moved, delta=self.delta)


def inputs(rule: str, n: int, seed: int, heads: Heads = DEFAULT_HEADS) -> Inputs:
    delta, per_key, decayed = RULES[rule]
    hk, hv, dim = heads.qk, heads.v, heads.dim
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hk, n, dim, generator=gen)
    k = F.normalize(torch.randn(1, hk, n, dim, generator=gen), dim=-1)
    v = torch.randn(1, hv, n, dim, generator=gen)
    g = -F.softplus(torch.randn(1, hv, n, dim if per_key else 1, generator=gen) - 2) * decayed
    beta = (
        torch.sigmoid(torch.randn(1, hv, n, generator=gen))
        if delta or rule != "linear"
        else torch.ones(1, hv, n)
    )
    return Inputs(q, k, v, g, beta, delta)


def op_session(
    op: AttentionOp, args: tuple, outputs: tuple, threads: int, bodies: tuple | None, opset: int = OPSET
) -> Any:
    """An ONNX Runtime session of the one-node model of ``op`` called with ``args`` at ``opset`` (the bodies
    an export at that opset holds, or ``bodies`` in their place: ``ORT_BODIES[op.name]`` is what ``--target
    ort`` lowers it with)."""
    import onnxruntime

    op = op if bodies is None else dataclasses.replace(op, bodies=bodies)
    call = OpCall(Case(op.name), op.overload, op, args, {}, outputs)
    model = lower(node_model(op, call, opset), [op], "function")
    model.opset_import.append(onnx_opset("com.microsoft"))
    return onnxruntime.InferenceSession(model.SerializeToString(), ort_session_options(threads))


def onnx_runner(x: Inputs, chunk_size: int, threads: int, bodies: tuple | None) -> Callable[[], object]:
    session = op_session(GATED_DELTA_RULE_OP, x.args(chunk_size), torch.empty_like(x.v), threads, bodies)
    feed = {name: getattr(x, name).numpy() for name in ("q", "k", "v", "g", "beta")}
    return lambda: session.run(None, feed)


def onnx_opset(domain: str):
    from onnx import helper

    return helper.make_opsetid(domain, 1)


def hf_runner(x: Inputs) -> Callable[[], object] | None:
    """HF's chunked reference of the delta rules with a decay (Qwen3-Next's or Kimi's), else None."""
    if not x.delta:
        return None
    return (hf_qwen3_next if x.g.shape[-1] == 1 else hf_kimi)(x, recurrent=False)


def best_of(
    runners: dict[str, Callable[[], object]], rounds: int, clock: Callable[[], float]
) -> dict[str, float]:
    for run in runners.values():
        run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            start = clock()
            run()
            times[name].append(clock() - start)
    return {name: min(values) * 1e3 for name, values in times.items()}


def synchronised(run: Callable[[], object]) -> Callable[[], object]:
    """``run`` that returns only once the GPU has finished its work."""

    def call() -> object:
        result = run()
        torch.cuda.synchronize()
        return result

    return call


def device_runners(
    x: Inputs, rule: str, chunk: int, candidates: list[str]
) -> dict[str, Callable[[], object]]:
    """The candidates that run on ``x``'s device: the torch op, attnx's Triton kernel, fla's kernel."""
    runners: dict[str, Callable[[], object]] = {}
    if "torch" in candidates:
        runners["torch"] = lambda: gated_delta_rule(*x.args(chunk))
    if "triton" in candidates:
        runners["triton"] = lambda: kernels.run(GATED_DELTA_RULE_OP, *x.args(chunk))
    if "fla" in candidates and rule != "linear":
        runners["fla"] = fla_kernel(rule, x)
    return runners


def differences(runners: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Largest |difference| of each non-torch candidate's output from the torch op's."""
    if "torch" not in runners:
        return {}
    expected = runners["torch"]()
    return {
        name: float((run() - expected).abs().max())
        for name, run in runners.items()
        if name in ("triton", "fla")
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seq-lens", default="1024,4096")
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--candidates", default="portable,ort,ort-gdn,hf,torch")
    parser.add_argument("--chunk-sizes", default="", help="portable body chunk sizes (default: the op's)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for torch, triton and fla")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu-time", action="store_true", help="process CPU time instead of wall time")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    candidates = args.candidates.split(",")
    results = []
    for rule in args.rules.split(","):
        default = default_chunk(rule)
        sizes = [int(c) for c in args.chunk_sizes.split(",")] if args.chunk_sizes else [default]
        for n in (int(s) for s in args.seq_lens.split(",")):
            x = inputs(rule, n, seed=n)
            runners: dict[str, Callable[[], object]] = {}
            if args.device != "cpu":
                on_device = device_runners(x.to(args.device), rule, default, candidates)
                with torch.no_grad():
                    diffs = differences(on_device)
                    best = best_of(
                        {k: synchronised(r) for k, r in on_device.items()}, args.rounds, time.perf_counter
                    )
                line = "  ".join(f"{name} {ms:9.3f} ms" for name, ms in best.items())
                agree = "  ".join(f"|{name}-torch| {d:.1e}" for name, d in diffs.items())
                print(f"{rule:12s} N={n:6d}  {line}  {agree}", flush=True)
                results.append({"rule": rule, "n": n, "ms": best, "max_abs_diff": diffs})
                continue
            for size in sizes if "portable" in candidates else []:
                runners[f"portable@{size}"] = onnx_runner(x, size, args.threads, None)
            if "ort" in candidates:
                runners["ort"] = onnx_runner(x, default, args.threads, ORT_BODIES["GatedDeltaRule"])
            if "ort-gdn" in candidates:
                bodies = ORT_GATED_DELTA_NET_BODIES["GatedDeltaRule"]
                runners["ort-gdn"] = onnx_runner(x, default, args.threads, bodies)
            if "hf" in candidates and (hf := hf_runner(x)) is not None:
                runners["hf"] = hf
            if "torch" in candidates:
                runners["torch"] = lambda x=x, c=default: gated_delta_rule(*x.args(c))
            with torch.no_grad():
                best = best_of(
                    runners, args.rounds, time.process_time if args.cpu_time else time.perf_counter
                )
            line = "  ".join(f"{name} {ms:9.2f} ms" for name, ms in best.items())
            print(f"{rule:12s} N={n:6d}  {line}", flush=True)
            results.append({"rule": rule, "n": n, "ms": best})
    if args.json:
        with open(args.json, "w") as f:
            device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
            summary = {
                "device": device,
                "threads": args.threads,
                "cpu_time": args.cpu_time,
                "results": results,
            }
            json.dump(summary, f, indent=1)


def default_chunk(rule: str) -> int:
    from attnx.plugins.gated.op import default_chunk_size

    delta, per_key, _ = RULES[rule]
    return default_chunk_size(delta, per_key)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
