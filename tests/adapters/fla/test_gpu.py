"""The ``fla`` adapter against flash-linear-attention's compiled Triton kernels on CUDA.

The same layers as tests/adapters/fla/test_layers.py, on a GPU: the library's real kernels, its chunked
training kernels included (``mode="chunk"``, and the forward under autograd, which the library always
runs in chunk mode) and, with the padding mask, its varlen kernels, against the converted layer (converted
on the GPU, where the layer lives). Skipped without CUDA,
with that reason; on a CPU the interpreter route of test_layers.py carries the proof. Run:
``pytest -m gpu tests/adapters/fla/test_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="no CUDA here: flash-linear-attention's compiled kernels need a GPU (the CPU route of "
        "tests/adapters/fla/test_layers.py, its kernels in Triton's interpreter, carries the proof)",
    ),
]

fla_layers = pytest.importorskip(
    "fla.layers", reason="flash-linear-attention is not installed (pip install 'attnx[fla]')"
)

from attnx.adapters.fla.convert import convert  # noqa: E402
from tests.adapters.fla.test_layers import HIDDEN, LAYERS, library_layer, model_kwargs, padded  # noqa: E402

# GPU kernels use approximate exp2/softplus (the library's inline PTX) and TF32 dots: looser than CPU.
GPU_RTOL = 2e-3


@pytest.mark.parametrize("length", [9, 65, 130, 1000])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_matches_the_librarys_cuda_kernels(name, length):
    layer = library_layer(name).cuda()
    replacement = convert(layer)
    x = torch.randn(2, length, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(length))
    kwargs = model_kwargs(name, x)
    with torch.no_grad():
        expected = layer(x, **kwargs)[0]
        actual = replacement(x, **kwargs)[0]
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=GPU_RTOL)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("length", [65, 130])
@pytest.mark.parametrize("name", list(LAYERS))
def test_padded_layer_matches_the_librarys_cuda_kernels(name, length, side):
    """With the padding mask: the library's compiled varlen kernels (the layers that unpad) or its masked
    inputs (RWKV, Mamba2), every position."""
    layer = library_layer(name).cuda()
    replacement = convert(layer)
    x = torch.randn(3, length, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(length))
    kwargs, mask = model_kwargs(name, x), padded(length, side).cuda()
    with torch.no_grad():
        expected = layer(x, attention_mask=mask, **kwargs)[0]
        actual = replacement(x, attention_mask=mask, **kwargs)[0]
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=GPU_RTOL)


@pytest.mark.parametrize("name", [n for n in LAYERS if "deltanet" not in n or "gated" in n])
def test_layer_matches_the_librarys_chunked_training_kernels(name):
    """Under autograd the library runs its chunk kernels at any length (the training path)."""
    layer = library_layer(name).cuda()
    replacement = convert(layer)
    x = torch.randn(2, 130, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    kwargs = model_kwargs(name, x)
    expected = layer(x.requires_grad_(), **kwargs)[0]
    actual = replacement(x, **kwargs)[0]
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=GPU_RTOL)
