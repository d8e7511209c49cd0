"""``attnx export --from fla:DIR``: a flash-linear-attention model from a local ``save_pretrained`` directory.

``import fla`` registers the library's configs and models with transformers' Auto classes; the
model is ``AutoModelForCausalLM`` of the directory's ``model_type`` (no hub access), in eval mode,
with ``use_cache`` off (attnx's decode graphs carry the state). Its example input is token ids
(2, 2 * 64 + 3): across the library's chunk size of 64.
"""

from __future__ import annotations

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
    example = {"input_ids": torch.randint(0, raw["vocab_size"], (2, EXAMPLE_LENGTH)), "use_cache": False}
    return model.eval(), example, None, []
