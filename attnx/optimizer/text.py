"""A language model's quality on text, against its float32 reference: the gate of ``attnx optimize``.

A relative bound on logits says little about a language model: what matters is whether the optimised
model still predicts the same next tokens with the same confidence. So the model reads real text, the
same every run: by default the first :data:`TEXT_TOKENS` tokens of CPython's own documentation
(``pydoc_data.topics``, installed with Python), or a UTF-8 file the user names. It is tokenised by the
export's ``tokenizer.json`` when it carries one, else read as ids (each byte modulo the vocabulary), and
cut into rows of :data:`WINDOW` tokens (fewer where the model accepts only shorter inputs). For every
position the report holds the KL divergence of the optimised model's next-token distribution from the
reference's (nats), whether their most likely tokens agree, and each model's perplexity on the text.
Rows run one at a time, so a real-size vocabulary's logits are held for one row only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from attnx.adapter import Lengths
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.inputs import random_feed
from attnx.models.spec import TensorSpec
from attnx.parity.check import sizes

TEXT_TOKENS = 2048
WINDOW = 256
DEFAULT_TEXT = "pydoc_data.topics"
INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
LOGITS = "logits"
TOKENIZER = "tokenizer"  # the manifest's file key of tokenizer.json
Logits = Callable[[dict[str, np.ndarray]], np.ndarray]  # a feed -> its logits (batch, seq, vocab)


@dataclasses.dataclass
class TextQuality:
    """The optimised model against its reference on ``tokens`` positions of ``text`` (tokenised by
    ``tokenizer``): mean KL divergence per token (nats), top-1 agreement, and both perplexities."""

    text: str
    tokenizer: str
    tokens: int
    kl: float
    top1: float
    perplexity: float
    reference_perplexity: float


def is_language_model(inputs: Sequence[TensorSpec], outputs: Sequence[str]) -> bool:
    """Whether an export reads token ids and predicts next-token logits (what the text gate measures)."""
    return any(spec.name == INPUT_IDS for spec in inputs) and LOGITS in outputs


class EvaluationText(NamedTuple):
    """The gate's text as ``rows`` of ids (rows, window), its ``name`` and how it was tokenised."""

    rows: np.ndarray
    name: str
    tokenizer: str


def text_rows(export: ExportDir, lengths: Lengths | None, path: Path | None = None) -> EvaluationText:
    """The evaluation text of ``export`` (``path``, else :data:`DEFAULT_TEXT`), in rows of :data:`WINDOW`
    ids (fewer where ``lengths`` caps them).

    Raises:
        AttnxError: ``path`` unreadable or not UTF-8, or a text shorter than two windows.
    """
    name = str(path) if path is not None else DEFAULT_TEXT
    spec = next(spec for spec in export.manifest.inputs if spec.name == INPUT_IDS)
    tokenizer_file = export.file(TOKENIZER) if TOKENIZER in export.manifest.files else None
    ids, tokenizer = text_ids(read_text(path), tokenizer_file, spec.high or 256)
    (window,) = (lengths or Lengths()).fit([WINDOW])
    rows = min(len(ids), TEXT_TOKENS) // window
    if rows < 2:
        raise AttnxError(f"--text {name} has {len(ids)} tokens; give a text of at least {2 * window}")
    ids_array = np.asarray(ids[: rows * window], dtype=np.int64).reshape(rows, window)
    return EvaluationText(ids_array, name, tokenizer)


def text_ids(text: str, tokenizer_file: Path | None, vocab: int) -> tuple[list[int], str]:
    """The first :data:`TEXT_TOKENS` or so ids of ``text``: tokenised by ``tokenizer_file`` (a Hugging Face
    ``tokenizer.json``), else each UTF-8 byte modulo ``vocab``; and how it was tokenised.

    Raises:
        AttnxError: a tokenizer to read without the tokenizers package.
    """
    if tokenizer_file is not None:
        try:
            from tokenizers import Tokenizer  # reads JSON only
        except ImportError:
            raise AttnxError(
                "the text gate reads the export's tokenizer.json with tokenizers: pip install 'attnx[text]'"
            ) from None
        return Tokenizer.from_file(str(tokenizer_file)).encode(text[: TEXT_TOKENS * 16]).ids, "tokenizer.json"
    return [byte % vocab for byte in text[: TEXT_TOKENS * 4].encode()], f"bytes modulo {vocab}"


def text_feed(specs: Sequence[TensorSpec], row: np.ndarray) -> dict[str, np.ndarray]:
    """The model's inputs for one text row: its ids, every mask all true, positions 0..n-1; any other input
    as a parity check draws it (seeded)."""
    feed = random_feed(specs, sizes(specs, 1, row.size), np.random.default_rng(0))
    for spec in specs:
        if spec.name == INPUT_IDS:
            feed[spec.name] = row[None].astype(spec.dtype)
        elif spec.dtype == "bool":
            feed[spec.name] = np.ones_like(feed[spec.name])
        elif spec.name == POSITION_IDS:
            feed[spec.name] = np.arange(row.size, dtype=spec.dtype)[None]
    return feed


def divergence(want: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position, from two models' next-token log-probabilities (..., vocab): the KL divergence of
    ``got``'s distribution from ``want``'s (nats), and whether their most likely tokens agree."""
    return (np.exp(want) * (want - got)).sum(-1), want.argmax(-1) == got.argmax(-1)


class TokenComparison:
    """Per-position KL, top-1 agreement and log-likelihoods of one model against a reference, row by row."""

    def __init__(self) -> None:
        self.kl: list[np.ndarray] = []
        self.same: list[np.ndarray] = []
        self.nll: list[np.ndarray] = []
        self.reference_nll: list[np.ndarray] = []

    def add(self, row: np.ndarray, reference: np.ndarray, logits: np.ndarray) -> None:
        """One row of ids (n,) with both models' logits for it (n, vocab)."""
        want, got = log_softmax(reference), log_softmax(logits)
        kl, same = divergence(want, got)
        self.kl.append(kl)
        self.same.append(same)
        targets = row[1:, None]
        self.nll.append(-np.take_along_axis(got[:-1], targets, -1))
        self.reference_nll.append(-np.take_along_axis(want[:-1], targets, -1))

    def quality(self, text: str, tokenizer: str) -> TextQuality:
        return TextQuality(
            text,
            tokenizer,
            int(sum(s.size for s in self.same)),
            float(np.mean(np.concatenate(self.kl))),
            float(np.mean(np.concatenate(self.same))),
            float(np.exp(np.mean(np.concatenate(self.nll)))),
            float(np.exp(np.mean(np.concatenate(self.reference_nll)))),
        )


def measure_text(
    text: EvaluationText, specs: Sequence[TensorSpec], reference: Logits, optimised: Logits
) -> TextQuality:
    """Run both models on each row of ``text`` and compare their next-token distributions."""
    comparison = TokenComparison()
    for row in text.rows:
        feed = text_feed(specs, row)
        comparison.add(row, reference(feed)[0], optimised(feed)[0])
    return comparison.quality(text.name, text.tokenizer)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis, in float64."""
    shifted = np.asarray(logits, dtype=np.float64)
    shifted = shifted - shifted.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def read_text(path: Path | None = None) -> str:
    """The text at ``path`` (UTF-8), or the default one.

    Raises:
        AttnxError: ``path`` unreadable or not UTF-8.
    """
    if path is None:
        from pydoc_data.topics import topics

        return "\n\n".join(topics[key] for key in sorted(topics))
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AttnxError(f"--text {path}: cannot read it as UTF-8 text ({exc.__class__.__name__})") from None
