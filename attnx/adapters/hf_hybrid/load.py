"""``attnx export --from hf:DIR`` of a hybrid model (after :mod:`attnx.adapters.hf.load`'s checks).

The class is the first of ``config.json``'s ``architectures`` that the architecture declares; the
model loads in eval mode with ``use_cache`` off (its decode state goes through attnx's decode
graphs) in float32 whatever dtype its checkpoint is stored in (released checkpoints are bfloat16,
which ONNX Runtime's CPU kernels do not run), its modeling module calling HF's own pure-torch
functions rather than the GPU kernels of flash-linear-attention bound in their place when that is
installed (the forward is the parity reference). The example inputs are what generate passes: token
ids, a bool padding mask and position ids. An architecture that adapts its windowed layers notes its window,
its length limit (:attr:`~attnx.adapters.hf_hybrid.architecture.Architecture.windowed`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from attnx.adapters.hf.load import check_loading_info
from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.convert import ARCHITECTURES
from attnx.errors import AttnxError, first_line

EXAMPLE_LENGTH = 17  # any length >= 2 traces every length (the ops and HF's code take symbolic sizes)
TEXT_TYPES = {
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen4_exp_text": "qwen4_exp",
}  # a text model's config model_type -> its architecture


def architecture(path: Path, raw: dict[str, Any]) -> tuple[Architecture, str]:
    """The architecture of a saved config and the class to load.

    Raises:
        AttnxError: a model type or class the adapter does not export (naming the ones it does).
    """
    kind = TEXT_TYPES.get(raw["model_type"], raw["model_type"])
    if kind not in ARCHITECTURES:
        raise AttnxError(
            f"--from hf:{path}: model_type '{kind}' is not one hf_hybrid adapts ({', '.join(ARCHITECTURES)})"
        )
    arch = ARCHITECTURES[kind]
    named = raw.get("architectures") or [arch.classes[-1]]
    for name in named:
        if name in arch.classes:
            return arch, name
    raise AttnxError(
        f"--from hf:{path} is a {', '.join(named)}; attnx exports {kind} as {', '.join(arch.classes)}"
    )


def load(path: Path) -> tuple[Any, dict[str, Any], None, list[str]]:
    """The model in eval mode and its example inputs.

    Raises:
        AttnxError: see :func:`architecture` and :meth:`Architecture.check_config`;
            weights that do not match the config (missing, unexpected or differently shaped tensors).
    """
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    raw = json.loads((path / "config.json").read_text())
    arch, name = architecture(path, raw)
    config = getattr(transformers, arch.config_class).from_pretrained(path, local_files_only=True)
    arch.check_config(config)
    arch.use_torch_fallbacks()  # HF's forward is the parity reference: its torch path, on any device
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, info = getattr(transformers, name).from_pretrained(
                path, config=config, local_files_only=True, output_loading_info=True, dtype=torch.float32
            )
    except (OSError, ValueError, RuntimeError) as exc:
        raise AttnxError(f"--from hf:{path}: cannot load its weights: {first_line(exc, limit=300)}") from None
    check_loading_info(path, info)
    model.config.use_cache = False
    model.eval()
    if arch.loaded is not None:
        arch.loaded(model)
    ids = torch.randint(0, config.vocab_size, (2, EXAMPLE_LENGTH))
    ids[0, 0] = config.vocab_size - 1  # parity draws ids below the example's largest + 1
    example = {
        "input_ids": ids,
        "attention_mask": torch.ones(2, EXAMPLE_LENGTH, dtype=torch.bool),
        "position_ids": torch.arange(EXAMPLE_LENGTH).expand(2, -1).contiguous(),
        "use_cache": False,
    }
    notes = []
    if arch.windowed in arch.layer_types:
        notes.append(
            f"sliding_window={config.sliding_window}: attnx's attention sees every earlier token, equal to "
            f"HF's local attention on up to {config.sliding_window} tokens, the export's length limit"
        )
    return model.eval(), example, None, notes
