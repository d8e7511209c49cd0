"""``--from hf:DIR``: check a Hugging Face ``save_pretrained`` directory, then hand it to the loader of
its ``model_type``.

Checked here, for every architecture: ``config.json`` (present, JSON, a ``model_type`` attnx adapts),
the weights (``model.safetensors`` or a sharded index of safetensors files whose headers read; a
pickled ``pytorch_model.bin`` is refused) and the tokenizer (when the directory holds one, it must
load with ``transformers.AutoTokenizer``). Each problem is one :class:`attnx.errors.AttnxError` line.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from attnx.adapter import AdapterImpl
from attnx.errors import AttnxError, first_line
from attnx.variant import load_object

# model_type -> "module:function" loading such a directory (path -> (model, example, axes, notes))
LOADERS: dict[str, str] = {
    "reformer": "attnx.adapters.hf_reformer.load:load",
    "qwen3_next": "attnx.adapters.hf_hybrid.load:load",
    "qwen3_5": "attnx.adapters.hf_hybrid.load:load",
    "qwen3_5_text": "attnx.adapters.hf_hybrid.load:load",
    "qwen3_5_moe": "attnx.adapters.hf_hybrid.load:load",
    "qwen3_5_moe_text": "attnx.adapters.hf_hybrid.load:load",
    "qwen4_exp": "attnx.adapters.hf_hybrid.load:load",
    "qwen4_exp_text": "attnx.adapters.hf_hybrid.load:load",
    "kimi_linear": "attnx.adapters.hf_hybrid.load:load",
    "minimax": "attnx.adapters.hf_hybrid.load:load",
    "mamba2": "attnx.adapters.hf_hybrid.load:load",
    "bamba": "attnx.adapters.hf_hybrid.load:load",
    "granitemoehybrid": "attnx.adapters.hf_hybrid.load:load",
    "nemotron_h": "attnx.adapters.hf_hybrid.load:load",
    "falcon_h1": "attnx.adapters.hf_hybrid.load:load",
    "zamba2": "attnx.adapters.hf_hybrid.load:load",
    "mamba": "attnx.adapters.hf_hybrid.load:load",
    "falcon_mamba": "attnx.adapters.hf_hybrid.load:load",
    "jamba": "attnx.adapters.hf_hybrid.load:load",
    "lfm2": "attnx.adapters.hf_hybrid.load:load",
    "rwkv": "attnx.adapters.hf_hybrid.load:load",
    "lfm2_moe": "attnx.adapters.hf_hybrid.load:load",
    "olmo_hybrid": "attnx.adapters.hf_hybrid.load:load",
    "lara_mini": "attnx.adapters.hf_hybrid.load:load",
    "bailing_hybrid": "attnx.adapters.hf_hybrid.load:load",
    "recurrent_gemma": "attnx.adapters.hf_hybrid.load:load",
    "xlstm": "attnx.adapters.hf_hybrid.load:load",
}
# model_type -> why attnx does not adapt it (refused by name before anything loads)
NOT_ADAPTED: dict[str, str] = {
    kind: "transformers 5.24 gives it no text-only causal LM (Glm5NextForConditionalGeneration carries a "
    "vision tower, Glm5NextTextModel no LM head), and its KDA layers (one conv over q/k/v, a bounded forget "
    "gate), NoPE MLA behind a DSA k-pool indexer and Sinkhorn hyper-connections are not mapped onto attnx ops"
    for kind in ("glm5_next", "glm5_next_text")
}
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def read_config(path: Path) -> dict[str, Any]:
    """``DIR/config.json``.

    Raises:
        AttnxError: no such file, not a JSON object, a ``model_type`` attnx refuses (with the reason, from
            :data:`NOT_ADAPTED`), or one no loader takes (naming the ones that exist).
    """
    file = path / "config.json"
    if not file.is_file():
        raise AttnxError(
            f"--from hf:{path}: no config.json there; give a directory written by save_pretrained"
        )
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise AttnxError(f"--from hf:{path}: cannot read config.json: {first_line(exc)}") from None
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind in NOT_ADAPTED:
        raise AttnxError(
            f"--from hf:{path} holds a '{kind}' model, which attnx does not adapt: {NOT_ADAPTED[kind]}"
        )
    if kind not in LOADERS:
        raise AttnxError(
            f"--from hf:{path} holds a '{kind}' model; attnx adapts the Hugging Face model types "
            f"{', '.join(sorted(LOADERS))} (export other models from Python with attnx.export_module)"
        )
    return config


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of the directory, each with a readable header.

    Raises:
        AttnxError: pickled weights only, no weights, a sharded index naming missing files, or a file
            that is not safetensors.
    """
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise AttnxError(f"--from hf:{path}: cannot read {index.name}: {first_line(exc)}") from None
        files = [path / name for name in names]
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    else:
        pickled = [name for name in PICKLES if (path / name).is_file()]
        if pickled:
            raise AttnxError(
                f"--from hf:{path} holds pickled weights ({pickled[0]}); attnx loads safetensors only "
                "(unpickling runs code): re-save with save_pretrained(DIR, safe_serialization=True)"
            )
        raise AttnxError(f"--from hf:{path}: no model.safetensors there; save the model with save_pretrained")
    from safetensors import safe_open

    for file in files:
        if not file.is_file():
            raise AttnxError(f"--from hf:{path}: {index.name} names {file.name}, which is missing")
        try:
            with safe_open(str(file), framework="pt") as weights:
                weights.keys()
        except Exception as exc:  # safetensors raises its own SafetensorError for a damaged file
            raise AttnxError(
                f"--from hf:{path}: {file.name} is not a readable safetensors file ({first_line(exc)})"
            ) from None
    return files


def check_loading_info(path: Path, info: dict[str, Any], scheme: str = "hf") -> None:
    """Refuse weights that do not match the config (``from_pretrained``'s ``output_loading_info``) of the
    directory ``--from SCHEME:PATH`` named.

    Raises:
        AttnxError: naming the missing, unexpected or differently shaped tensors (three of each).
    """
    wrong = {
        k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v
    }
    if wrong:
        found = "; ".join(
            f"{k.replace('_', ' ')}: {', '.join(map(str, sorted(v)[:3]))}" for k, v in wrong.items()
        )
        raise AttnxError(
            f"--from {scheme}:{path}: its weights do not match its config.json ({found}); save model and "
            "config together with save_pretrained"
        )


def check_tokenizer(path: Path) -> bool:
    """Whether the directory holds a tokenizer; one that is there must load.

    Raises:
        AttnxError: a tokenizer file that ``transformers.AutoTokenizer`` cannot load.
    """
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return False
    import transformers

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # tokenizers and transformers raise many kinds for a bad file
        raise AttnxError(
            f"--from hf:{path}: its tokenizer does not load ({first_line(exc, with_type=True, limit=200)}); "
            "save it with the tokenizer's save_pretrained or remove the tokenizer files"
        ) from None
    return True


def load(path: Path) -> tuple[Any, Any, Any, list[str]]:
    """The model of ``path`` as its architecture's loader returns it, after the checks above."""
    config = read_config(path)
    weight_files(path)
    check_tokenizer(path)
    return load_object(LOADERS[config["model_type"]], f"loader of model_type '{config['model_type']}'")(path)


IMPL = AdapterImpl(convert=lambda module: None, needs_adapter=lambda module: False, load=load)
