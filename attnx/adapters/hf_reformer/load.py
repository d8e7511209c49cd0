"""``attnx export --from hf:DIR``: a Hugging Face Reformer from a local ``save_pretrained`` directory.

No hub access (``local_files_only=True``); the ``hf`` adapter (:mod:`attnx.adapters.hf.load`) checked
the directory and dispatched it here by its ``model_type``. The class is the first of ``config.json``'s
``architectures`` that attnx exports; a model without ``hash_seed`` gets ``DRAWN_SEED`` (HF would
draw new rotations at every forward), which the export notes. Weights load from safetensors only
(``use_safetensors=True``; the ``hf`` adapter refused pickled weights by name, since unpickling a file
someone else made can run code).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from attnx.adapters.hf.load import check_loading_info, read_config
from attnx.errors import AttnxError, first_line

CLASSES = ("ReformerModelWithLMHead", "ReformerForSequenceClassification", "ReformerModel")
DRAWN_SEED = 0


def model_class(path: Path, config: dict[str, Any]) -> str:
    """The first of the config's ``architectures`` that attnx exports (default ``ReformerModel``).

    Raises:
        AttnxError: architectures that are none of :data:`CLASSES`.
    """
    named = config.get("architectures") or ["ReformerModel"]
    for name in named:
        if name in CLASSES:
            return name
    raise AttnxError(f"--from hf:{path} is a {', '.join(named)}; the hf adapter exports {', '.join(CLASSES)}")


def load(path: Path) -> tuple[Any, dict[str, Any], None, list[str]]:
    """The model in eval mode, example inputs (``input_ids`` and a bool ``attention_mask`` of two
    windows of the longest chunk, ``use_cache=False``) and notes.

    Raises:
        AttnxError: see :func:`read_config` and :func:`model_class`; weights that do not match the
            config (missing, unexpected or differently shaped tensors).
    """
    import transformers

    transformers.logging.set_verbosity_error()  # its loading bars and padding notices: attnx reports its own
    transformers.logging.disable_progress_bar()
    raw = read_config(path)
    name = model_class(path, raw)
    try:
        config = transformers.ReformerConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers validates a config's values with any type
        raise AttnxError(
            f"--from hf:{path}: config.json is not a Reformer config: {first_line(exc)}"
        ) from None
    notes = []
    if config.hash_seed is None:
        config.hash_seed = DRAWN_SEED
        notes.append(
            f"config.hash_seed is unset (Hugging Face draws new LSH rotations at every forward): this export "
            f"fixes them, drawn once with hash_seed={DRAWN_SEED} and saved in model.onnx; the parity check "
            "runs the model with that seed"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, info = getattr(transformers, name).from_pretrained(
                path, config=config, local_files_only=True, output_loading_info=True, use_safetensors=True
            )
    except Exception as exc:  # a corrupt file fails in safetensors or transformers with any type
        raise AttnxError(f"--from hf:{path}: cannot load its weights: {first_line(exc, limit=300)}") from None
    check_loading_info(path, info)
    model.config.use_cache = False
    length = 2 * max(config.lsh_attn_chunk_length or 1, config.local_attn_chunk_length or 1)
    example = {
        "input_ids": torch.randint(0, config.vocab_size, (2, length)),
        "attention_mask": torch.ones(2, length, dtype=torch.bool),
    }
    return model.eval(), example, None, notes
