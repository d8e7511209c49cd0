"""Text in, text out: a Hugging Face ``tokenizer.json`` that travels with an export.

:data:`TOKENIZER` is the exporter extension of ``[export] tokenizer`` (``attnx export
--tokenizer PATH``): it checks the file before any work (it must load with the ``tokenizers``
library and its ids must fit the model's vocabulary), copies it into OUT as manifest file
"tokenizer", and writes ``tokenizer_config.json`` beside it ("tokenizer_config": the one next to
the given file if there is one, else a minimal one naming the special tokens), which is what
onnxruntime-genai's ``og.Tokenizer`` loads from a model directory. :func:`export_tokenizer`
and :func:`encode` turn text into ids for ``attnx generate --prompt`` (and ``decode`` back).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from attnx.errors import AttnxError, first_line
from attnx.exporter.assemble import Assembly, assemble
from attnx.exporter.directory import ExportDir
from attnx.exporter.export import ExportJob, ExtraGraphs
from attnx.exporter.manifest import TokenizerSection
from attnx.exporter.store import WeightStore
from attnx.recipes import ExportSettings

TOKENIZER_FILE, CONFIG_FILE = "tokenizer.json", "tokenizer_config.json"
# Spellings of the special tokens, for a tokenizer.json without a tokenizer_config.json beside it.
_SPECIAL = {
    "bos_token": ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]"),
    "eos_token": ("</s>", "<eos>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "[SEP]"),
    "pad_token": ("<pad>", "[PAD]", "<|pad|>"),
}


def load_tokenizer(path: str | Path) -> Any:
    """The ``tokenizers.Tokenizer`` saved at ``path``.

    Raises:
        AttnxError: the ``tokenizers`` package is missing, or the file is not a tokenizer.json.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise AttnxError(
            "text needs the Hugging Face tokenizers package: pip install 'attnx[text]'"
        ) from None
    path = Path(path)
    if not path.is_file():
        raise AttnxError(f"tokenizer file '{path}' does not exist; pass a Hugging Face tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exceptions with serde messages
        raise AttnxError(
            f"'{path}' is not a Hugging Face tokenizer.json ({first_line(exc)}); save one with "
            "tokenizers' Tokenizer.save() or a transformers tokenizer's save_pretrained()"
        ) from None


def _config_beside(path: Path) -> dict[str, Any]:
    """The ``tokenizer_config.json`` next to ``path`` ({} when there is none).

    Raises:
        AttnxError: it exists but is not a JSON object.
    """
    beside = path.with_name(CONFIG_FILE)
    if not beside.is_file():
        return {}
    try:
        data = json.loads(beside.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise AttnxError(f"{beside} is not valid JSON ({first_line(exc)}); fix or remove it") from None
    if not isinstance(data, dict):
        raise AttnxError(f"{beside} must hold a JSON object; fix or remove it")
    return data


def special_ids(tokenizer: Any, config: dict[str, Any]) -> dict[str, int | None]:
    """bos/eos/pad token ids: the tokens ``config`` (a tokenizer_config.json) names, else the
    tokenizer's special tokens of a usual spelling; None where neither names one."""
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    found: dict[str, int | None] = {}
    for key, spellings in _SPECIAL.items():
        named = config.get(key)
        content = named.get("content") if isinstance(named, dict) else named
        candidates = [content] if isinstance(content, str) else [s for s in spellings if s in specials]
        ids = [tokenizer.token_to_id(c) for c in candidates]
        found[key.replace("_token", "_token_id")] = next((i for i in ids if i is not None), None)
    return found


def describe(tokenizer: Any, config: dict[str, Any], vocab_size: int, where: str) -> TokenizerSection:
    """The manifest section of a tokenizer for a model of ``vocab_size`` ids.

    Raises:
        AttnxError: the tokenizer makes ids the model does not have.
    """
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise AttnxError(
            f"tokenizer '{where}' has {size} tokens but the model's vocabulary is {vocab_size} ids, so its "
            f"ids {vocab_size}..{size - 1} are outside the vocabulary; export with --set vocab_size={size}"
        )
    return TokenizerSection(size, **special_ids(tokenizer, config))


def vocabulary(assembly: Assembly) -> int:
    """The model's vocabulary size: its config's, or a module's logits' last axis (its first output).

    Raises:
        AttnxError: a module whose first output has no fixed last axis (not a language model's logits).
    """
    config = getattr(assembly, "model_config", None)  # a module export (ModuleAssembly) has none
    if config is not None:
        return config.vocab_size
    logits = assembly.outputs[0]
    if not logits.axes or not isinstance(logits.axes[-1], int):
        raise AttnxError(
            f"a tokenizer travels with a language model; this module's first output '{logits.name}' has "
            f"axes {logits.axes}, not (batch, seq, vocab)"
        )
    return logits.axes[-1]


class TokenizerFile:
    """The tokenizer extension of an export (manifest section ``tokenizer``)."""

    name = "tokenizer"

    def traces(self, assembly: Assembly) -> int:
        return 0

    def wanted(self, job: ExportJob) -> bool:
        return job.settings.tokenizer is not None

    def check(self, job: ExportJob) -> None:
        """Refuse, before any work, a file that is not a tokenizer or makes ids the model lacks (the
        model is built on torch's meta device, which allocates nothing, to know its vocabulary; a
        module's vocabulary is known once it is traced, and checked then)."""
        import torch

        path, plan = Path(str(job.settings.tokenizer)), job.plan
        tokenizer = load_tokenizer(path)
        if job.module is not None:
            return
        with torch.device("meta"):
            built = assemble(plan.variant, plan.model, plan.options, cross_variant=plan.cross_variant)
        describe(tokenizer, _config_beside(path), built.model_config.vocab_size, str(path))

    def export(
        self, assembly: Assembly, directory: Path, settings: ExportSettings, store: WeightStore | None
    ) -> ExtraGraphs:
        """Copy the tokenizer (and write its tokenizer_config.json) into ``directory``."""
        path = Path(str(settings.tokenizer))
        tokenizer, config = load_tokenizer(path), _config_beside(path)
        section = describe(tokenizer, config, vocabulary(assembly), str(path))
        shutil.copyfile(path, directory / TOKENIZER_FILE)
        if not config:
            config = {"tokenizer_class": "PreTrainedTokenizerFast"}
            for key in ("bos_token", "eos_token", "pad_token"):
                token_id = getattr(section, f"{key}_id")
                if token_id is not None:
                    config[key] = tokenizer.id_to_token(token_id)
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return ExtraGraphs({"tokenizer": TOKENIZER_FILE, "tokenizer_config": CONFIG_FILE}, [], section)


TOKENIZER = TokenizerFile()


def export_tokenizer(out: str | Path) -> Any:
    """The tokenizer the export ``out`` carries.

    Raises:
        AttnxError: ``out`` is not an export, or has no tokenizer (naming the fix).
    """
    export = ExportDir.open(out)
    if not export.has("tokenizer"):
        raise AttnxError(
            f"'{export.path}' has no tokenizer; re-export with --tokenizer tokenizer.json, or give "
            "token ids with --prompt-ids"
        )
    return load_tokenizer(export.file("tokenizer"))


def encode(tokenizer: Any, text: str) -> list[int]:
    """The ids of ``text``.

    Raises:
        AttnxError: ``text`` encodes to no ids.
    """
    ids = list(tokenizer.encode(text).ids)
    if not ids:
        raise AttnxError(f"the prompt {text[:40]!r} encodes to no tokens; give some text")
    return ids
