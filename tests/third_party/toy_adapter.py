"""A third-party adapter plugin for tests/third_party/toy_library.py, and a seeded defect of it.

``toy`` converts ``ToyLinearAttention`` into attnx's ``linear`` layer with the library's own
weights (an attnx layer, so causal toy models decode through its own step);
``Swapped`` (registered alone by tests) loads the key weights into the value projection, so
only a parity check against the library's own forward can catch it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import attnx
from attnx.adapter import Adapter, AdapterImpl
from attnx.registry import get_registry
from tests.third_party.toy_library import ToyKernelAttention, ToyLinearAttention, ToyModel


class Converted(nn.Module):
    """The library's layer: its weights in attnx's linear layer (which decodes: it steps itself)."""

    def __init__(self, module: ToyLinearAttention, swapped: bool) -> None:
        super().__init__()
        variant = get_registry().variant("linear")
        spec = attnx.AttentionSpec(module.wq.in_features, module.heads, causal=module.causal)
        self.layer = variant.load().build(variant.make_config({"eps": module.eps}), spec)
        self.layer.q_proj, self.layer.out_proj = module.wq, module.wo
        self.layer.k_proj, self.layer.v_proj = (module.wv, module.wk) if swapped else (module.wk, module.wv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def _converter(swapped: bool):
    def convert(module: nn.Module) -> nn.Module | None:
        return Converted(module, swapped) if isinstance(module, ToyLinearAttention) else None

    return convert


def load(path: Path) -> tuple[nn.Module, dict[str, torch.Tensor], None, list[str]]:
    """``attnx export --from toy:DIR``: a causal ToyModel with the weights DIR/weights.pt."""
    if not (path / "weights.pt").is_file():
        raise attnx.AttnxError(f"'{path}' has no weights.pt; save the toy model there")
    model = ToyModel(causal=True)
    model.load_state_dict(torch.load(path / "weights.pt", weights_only=True))
    return model.eval(), {"input_ids": torch.randint(0, 40, (2, 9))}, None, []


def needs_adapter(module: nn.Module) -> bool:
    return isinstance(module, (ToyLinearAttention, ToyKernelAttention))


IMPL = AdapterImpl(convert=_converter(False), needs_adapter=needs_adapter, load=load)
SWAPPED = AdapterImpl(convert=_converter(True), needs_adapter=needs_adapter)
ADAPTER = Adapter(
    "toy", "toy library linear attention -> linear", "attnx", "tests.third_party.toy_adapter:IMPL", ("toy",)
)


@attnx.hookimpl
def attnx_register_adapters() -> list[Adapter]:
    return [ADAPTER]


class Swapped:
    """The seeded defect, as a plugin object."""

    @attnx.hookimpl
    def attnx_register_adapters(self) -> list[Adapter]:
        return [
            Adapter(
                "toy", "seeded defect: k/v weights swapped", "attnx", "tests.third_party.toy_adapter:SWAPPED"
            )
        ]
