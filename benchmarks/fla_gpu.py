#!/usr/bin/env python
"""flash-linear-attention's own CUDA kernels vs attnx's converted layer on CUDA and its ONNX Runtime export.

    python benchmarks/fla_gpu.py                       # N = 4096 and 16384, every mapped layer
    python benchmarks/fla_gpu.py --lengths 4096 --layers gla,gated-deltanet --json out.json

For each layer type (tests/adapters/fla/test_layers.py's configurations, widened to d_model 256, 4 heads) it
times, at batch 1 and each N, the library layer's forward on CUDA (its compiled Triton kernels: the
chunk kernels above 64 tokens), attnx's converted layer (``attnx.adapters.fla.convert``: the torch module
an export traces) on CUDA, and, where ONNX Runtime has its CUDA execution provider (``onnxruntime-gpu``),
attnx's export of the converted layer (``attnx.export_module``, default lowering) on it; each after
checking it agrees with the library. Without that provider the ORT columns are null and the row says
why. Needs a GPU and ``attnx[fla]``; prints one row per (layer, N) and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

WIDTH, HEADS = 256, 4


class OneLayer(nn.Module):
    """A library layer alone, as a module ``attnx.export_module`` takes."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)[0]


def cuda_ms(fn, repeats: int = 5) -> float:
    """Median wall time of ``fn()`` in milliseconds, CUDA synchronised."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def layers() -> dict[str, nn.Module]:
    import fla.layers as L

    return {
        "linear": L.LinearAttention(hidden_size=WIDTH, num_heads=HEADS),
        "gla": L.GatedLinearAttention(hidden_size=WIDTH, num_heads=HEADS),
        "deltanet": L.DeltaNet(hidden_size=WIDTH, num_heads=HEADS, mode="fused_recurrent"),
        "gated-deltanet": L.GatedDeltaNet(hidden_size=WIDTH, num_heads=HEADS, head_dim=64, expand_v=1),
        "retnet": L.MultiScaleRetention(hidden_size=WIDTH, num_heads=HEADS),
        "rwkv6": L.RWKV6Attention(hidden_size=WIDTH, num_heads=HEADS),
    }


def ort_cuda_missing() -> str | None:
    """Why ONNX Runtime cannot run on CUDA here, or None."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        return None
    return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)"


def ort_cuda(model: nn.Module, x: torch.Tensor, out: Path) -> tuple[float, torch.Tensor]:
    """attnx's export of ``model`` in ONNX Runtime's CUDA provider: (ms per forward, output)."""
    import onnxruntime as ort

    import attnx

    attnx.export_module(model.cpu(), (torch.randn(1, 16, WIDTH),), out, options={"export.verify": False})
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CUDAExecutionProvider"])
    feed = {session.get_inputs()[0].name: x.cpu().numpy()}
    actual = torch.from_numpy(session.run(None, feed)[0])
    return cuda_ms(lambda: session.run(None, feed)), actual


def measure(name: str, layer: nn.Module, length: int, work: Path) -> dict:
    from attnx.adapters.fla.convert import convert

    library = OneLayer(layer.eval()).cuda()
    converted = OneLayer(convert(layer.eval())).cuda()
    x = torch.randn(1, length, WIDTH, device="cuda")
    with torch.no_grad():
        fla_ms = cuda_ms(lambda: library(x))
        expected = library(x).float()
        torch_ms = cuda_ms(lambda: converted(x))
        torch_diff = float((converted(x).float() - expected).abs().max())
    row = {
        "layer": name,
        "N": length,
        "fla_cuda_ms": round(fla_ms, 3),
        "attnx_torch_cuda_ms": round(torch_ms, 3),
        "attnx_torch_max_abs_diff": torch_diff,
        "attnx_ort_cuda_ms": None,
        "attnx_ort_max_abs_diff": None,
        "gpu": torch.cuda.get_device_name(),
    }
    reason = ort_cuda_missing()
    if reason:
        return {**row, "ort_cuda_skipped": reason}
    ort_ms, actual = ort_cuda(converted, x, work / f"{name}-{length}")
    return {
        **row,
        "attnx_ort_cuda_ms": round(ort_ms, 3),
        "attnx_ort_max_abs_diff": float((actual - expected.cpu()).abs().max()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--lengths", default="4096,16384")
    parser.add_argument("--layers", default="")
    parser.add_argument("--json", type=Path, default=Path("fla_gpu.json"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fla_gpu.py needs CUDA: flash-linear-attention's compiled kernels run on a GPU")
        return 2
    chosen = layers()
    if args.layers:
        chosen = {k: v for k, v in chosen.items() if k in args.layers.split(",")}
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, layer in chosen.items():
            for length in map(int, args.lengths.split(",")):
                rows.append(measure(name, layer, length, Path(work)))
                print(json.dumps(rows[-1]), flush=True)
    args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
