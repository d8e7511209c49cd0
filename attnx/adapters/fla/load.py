"""``attnx export --from fla:DIR``: a flash-linear-attention model from a local ``save_pretrained`` directory.

``import fla`` registers the library's configs and models with transformers' Auto classes; the
model is ``AutoModelForCausalLM`` of the directory's ``model_type`` (no hub access), in eval mode,
with ``use_cache`` off (attnx's decode graphs carry the state). Its example inputs are those of the
``hf:`` exports (what generate passes), at (2, 2 * 64 + 3), across the library's chunk size of 64:
token ids, a bool padding mask (True: a real token; the library unpads by it, or zeroes the padded
tokens' inputs: docs/importing.md) and position ids. The library's models take no positions (RetNet's
rotary counts each row's real tokens): ``position_ids`` reaches their layers among the keyword arguments
they pass on and is not read, so a graph fed as an ``hf:`` export is fed runs.
"""

from __future__ import annotations

import contextvars
import json
import warnings
from pathlib import Path
from typing import Any

import torch

from attnx.adapters.fla import cpu
from attnx.adapters.hf.load import check_loading_info
from attnx.errors import AttnxError, first_line

# model_type -> the layer the library's causal LM of that type is built of (checked by the walk).
MODEL_TYPES = {
    "linear_attn": "LinearAttention",
    "gla": "GatedLinearAttention",
    "delta_net": "DeltaNet",
    "gated_deltanet": "GatedDeltaNet",
    "gated_deltaproduct": "GatedDeltaProduct",
    "hgrn2": "HGRN2Attention",
    "retnet": "MultiScaleRetention",
    "rwkv6": "RWKV6Attention",
    "rwkv7": "RWKV7Attention",
    "mamba2": "Mamba2",
}
EXAMPLE_LENGTH = 2 * 64 + 3


def read_config(path: Path) -> dict[str, Any]:
    """``DIR/config.json`` of a model type the adapter exports.

    Raises:
        AttnxError: no such file, not JSON, or another model type.
    """
    file = path / "config.json"
    if not file.is_file():
        raise AttnxError(f"--from fla:{path}: no config.json there; give a save_pretrained directory")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise AttnxError(f"--from fla:{path}: cannot read config.json: {first_line(exc)}") from None
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind not in MODEL_TYPES:
        known = ", ".join(f"{t} ({layer})" for t, layer in MODEL_TYPES.items())
        raise AttnxError(f"--from fla:{path} holds a '{kind}' model; the fla adapter exports {known}")
    return config


def load(path: Path) -> tuple[Any, dict[str, Any], None, list[str]]:
    """The model in eval mode and example token ids (no notes).

    Raises:
        AttnxError: see :func:`read_config`; weights that do not match the config.
    """
    raw = read_config(path)
    cpu.import_library()  # registers its models with the Auto classes; without CUDA, kernels interpreted
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, output_loading_info=True
            )
    except (OSError, ValueError, RuntimeError) as exc:
        why = first_line(exc, limit=300)
        raise AttnxError(f"--from fla:{path}: cannot load its weights: {why}") from None
    check_loading_info(path, info, scheme="fla")
    model.config.use_cache = False
    example = {
        "input_ids": torch.randint(0, raw["vocab_size"], (2, EXAMPLE_LENGTH)),
        "attention_mask": torch.ones(2, EXAMPLE_LENGTH, dtype=torch.bool),
        "position_ids": torch.arange(EXAMPLE_LENGTH).expand(2, -1).contiguous(),
        "use_cache": False,
    }
    return model.eval(), example, None, recurrent_reference(model)


RECURRENT_ONLY = "RWKV7Attention"
_RECURRENT: contextvars.ContextVar[bool] = contextvars.ContextVar("attnx_fla_recurrent", default=False)


def recurrent_reference(model: torch.nn.Module) -> list[str]:
    """Make ``model``'s RWKV-7 layers run the library's recurrent DPLR kernel (``fused_recurrent_rwkv7``, the
    same rule and arguments) where the library's layer calls its chunk kernel (from 64 tokens, whatever its
    ``mode``): in float32 that kernel is 0.05 and 0.27 off the exact recurrence on trained weights, the
    recurrent one 1e-5 (docs/importing.md), and the library's forward is the parity reference.

    Only these layers' own no-grad calls are routed (hooks mark the call); other models of the library, and
    training, keep its dispatch. Returns the manifest's note, or none when the model has no such layer."""
    layers = [m for m in model.modules() if type(m).__name__ == RECURRENT_ONLY]
    if not layers:
        return []
    _route_chunk_calls()
    for layer in layers:
        layer.register_forward_pre_hook(lambda *_: _mark(True))
        layer.register_forward_hook(lambda *_: _mark(False), always_call=True)
    return [
        f"the library's {RECURRENT_ONLY} layers ran its recurrent kernel (fused_recurrent_rwkv7) as the "
        "parity reference at every length: its float32 chunk kernel is 0.05-0.27 off the exact recurrence"
    ]


def _mark(inside: bool) -> None:
    _RECURRENT.set(inside)


def _route_chunk_calls() -> None:
    """Once per process: the library layer's ``chunk_rwkv7`` becomes the recurrent kernel inside a marked,
    no-grad call, and stays itself everywhere else."""
    import fla.layers.rwkv7 as library_layer
    from fla.ops.rwkv7 import fused_recurrent_rwkv7

    chunk = library_layer.chunk_rwkv7
    if getattr(chunk, "attnx_routed", False):
        return

    def routed(r, w, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens=None, **options):  # type: ignore[no-untyped-def]
        if _RECURRENT.get() and not torch.is_grad_enabled():
            return fused_recurrent_rwkv7(
                r, w, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens
            )
        return chunk(r, w, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens, **options)

    routed.attnx_routed = True  # type: ignore[attr-defined]
    library_layer.chunk_rwkv7 = routed
