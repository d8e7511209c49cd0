"""``attnx.generate``: token ids in, token ids out, through an export's prefill and decode graphs.

No tokenizer: a prompt is a list of ids below the model's ``vocab_size``. The next token
is the argmax of the last logits (greedy) or a draw from softmax(logits / temperature),
optionally restricted to the ``top_k`` largest, with a numpy Generator seeded by ``seed``:
given the same logits, every backend picks the same ids. A variant whose positions are bounded
(``Variant.position_limit``, cosFormer's M) refuses a prompt plus new tokens past the bound, and so does a
module export past the longest input its adapters accept (``module.lengths``: e.g. RecurrentGemma's
attention window, a Hugging Face config's ``max_position_embeddings``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnx.arguments import typed_arguments
from attnx.decode.runtime import decode_section, open_stepper
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import Manifest
from attnx.limits import MAX_NEW_TOKENS, MAX_THREADS, require_range
from attnx.registry import get_registry

Progress = Callable[[str], None]


@dataclasses.dataclass
class Generation:
    """The result of :func:`generate`; times in seconds (the first new token comes from prefill)."""

    backend: str
    prompt: list[int]
    tokens: list[int]
    prefill_seconds: float
    decode_seconds: float

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("inf")

    @property
    def decode_ms_per_token(self) -> float | None:
        steps = len(self.tokens) - 1
        return 1000 * self.decode_seconds / steps if steps > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "tokens_per_second": self.tokens_per_second,
            "decode_ms_per_token": self.decode_ms_per_token,
        }


@dataclasses.dataclass(frozen=True)
class Sampler:
    """Greedy when ``temperature`` is None, else softmax(logits / temperature) over the ``top_k`` best."""

    temperature: float | None = None
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.temperature is not None and not self.temperature > 0:
            raise AttnxError(f"--temperature must be > 0 (got {self.temperature}); use --greedy for argmax")
        if self.top_k < 0:
            raise AttnxError(f"--top-k must be >= 0 (got {self.top_k}); 0 keeps every token")

    def pick(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """The next token from one row of logits (vocab,)."""
        if self.temperature is None:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / self.temperature
        if 0 < self.top_k < scaled.size:
            scaled = np.where(scaled >= np.partition(scaled, -self.top_k)[-self.top_k], scaled, -np.inf)
        weights = np.exp(scaled - scaled.max())
        return int(rng.choice(scaled.size, p=weights / weights.sum()))


def check_prompt(prompt_ids: Sequence[Any], vocab_size: int, what: str = "prompt") -> list[int]:
    """The prompt (or source) as ints in [0, vocab_size).

    Raises:
        AttnxError: an empty prompt, a non-integer or an out-of-range id.
    """
    ids = []
    for value in prompt_ids:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise AttnxError(f"{what} ids must be integers (got {value!r})")
        if not 0 <= value < vocab_size:
            raise AttnxError(f"{what} id {value} is out of range: this model's ids are 0..{vocab_size - 1}")
        ids.append(int(value))
    if not ids:
        raise AttnxError(f"the {what} is empty; give at least one token id")
    return ids


@typed_arguments
def generate(
    out: str | Path,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 32,
    *,
    source_ids: Sequence[int] | None = None,
    backend: str = "ort-cpu",
    temperature: float | None = None,
    top_k: int = 0,
    seed: int = 0,
    threads: int | None = None,
    progress: Progress | None = None,
    on_token: Callable[[int], None] | None = None,
) -> Generation:
    """Continue ``prompt_ids`` by ``max_new_tokens`` tokens with the decode export in ``out``.

    Args:
        prompt_ids: the first tokens (of the target, for a seq2seq export: e.g. its start token).
        source_ids: the source sequence of a seq2seq export (required there, refused for an lm).
        backend: a backend of :data:`attnx.parity.backends.BACKENDS` that runs decode graphs:
            "ort-cpu" (default), "ort-cuda", or "torch" (the model rebuilt from the manifest and
            weights, run step by step).
        temperature: None for greedy decoding, else the sampling temperature (> 0).
        top_k: sample among the ``top_k`` most likely tokens (0: all).
        seed: seed of the sampler's numpy Generator.
        on_token: called with each new token as soon as it is picked.

    Raises:
        AttnxError: not a decode export, a bad prompt, bad sampling settings, or more positions
            than the model handles.
    """
    report = progress or (lambda message: None)
    sampler = Sampler(temperature, top_k)
    require_range("--max-new-tokens", max_new_tokens, 1, MAX_NEW_TOKENS)
    if threads is not None:
        require_range("--threads", threads, 1, MAX_THREADS)
    export = ExportDir.open(out)
    manifest = export.manifest
    vocab = decode_section(export).vocab_size
    prompt = check_prompt(prompt_ids, vocab)
    source = None
    if manifest.model == "seq2seq":
        if source_ids is None:
            raise AttnxError(
                "a seq2seq export translates a source: give it with --source-ids (or source_ids=)"
            )
        ids = np.asarray([check_prompt(source_ids, vocab, "source")], dtype=np.int64)
        source = {"input_ids": ids, "attention_mask": np.ones(ids.shape, dtype=bool)}
    elif source_ids is not None:
        raise AttnxError(f"--source-ids is for seq2seq exports; this one is a '{manifest.model}' model")
    check_positions(manifest, len(prompt) + max_new_tokens)
    rng = np.random.default_rng(seed)
    # one session at a time: the prefill graph's weights are let go before the decode graph's are loaded
    with open_stepper(export, backend, threads, one_at_a_time=True, many_runs=True) as stepper:
        stepper.open("prefill")
        report(f"prefill: {len(prompt)} prompt tokens on {backend}")
        start = time.perf_counter()
        logits, state = stepper.prefill(np.asarray([prompt], dtype=np.int64), source)
        tokens = [sampler.pick(logits[0, -1], rng)]
        prefill_seconds = time.perf_counter() - start
        if on_token:
            on_token(tokens[-1])
        stepper.open("decode")
        report(f"decoding {max_new_tokens - 1} more tokens")
        start = time.perf_counter()
        while len(tokens) < max_new_tokens:
            logits, state = stepper.decode(np.asarray([[tokens[-1]]], dtype=np.int64), state)
            tokens.append(sampler.pick(logits[0, -1], rng))
            if on_token:
                on_token(tokens[-1])
    return Generation(backend, prompt, tokens, prefill_seconds, time.perf_counter() - start)


MODULE_LIMIT = "module"  # position_limits' name of a module export's own limit


def check_positions(manifest: Manifest, positions: int) -> None:
    """Refuse more positions than the export's variants handle (``Variant.position_limit``; the cross
    variant's too, whose queries sit at their target positions) or its adapted module accepts.

    Raises:
        AttnxError: the prompt and the new tokens need more positions than a limit.
    """
    for option, name, limit in position_limits(manifest):
        if positions > limit and name == MODULE_LIMIT:
            raise AttnxError(
                f"the prompt and new tokens need {positions} positions, but this export's model is exact on "
                f"up to {limit} ({option}={limit} in attnx.json: what its adapters accept, e.g. an attention "
                "window); generate fewer tokens"
            )
        if positions > limit:
            raise AttnxError(
                f"the prompt and new tokens need {positions} positions, but this {name} model handles "
                f"{limit} ({option}={limit}); generate fewer tokens or re-export with a larger "
                f"--set {option}=N"
            )


def position_limits(manifest: Manifest) -> list[tuple[str, str, int]]:
    """(option, variant, positions) for each of the export's variants that handles a limited number of
    positions, and ("module.lengths.maximum", :data:`MODULE_LIMIT`, positions) for a module export whose
    adapters accept inputs up to a length."""
    roles = [
        ("", manifest.variant, manifest.variant_config),
        ("cross.", manifest.cross_variant, manifest.cross_variant_config),
    ]
    limits = []
    for scope, name, config in roles:
        if name is None:
            continue
        variant = get_registry().variant(name)
        limit = variant.position_limit(variant.make_config(config))
        if limit is not None:
            limits.append((f"{scope}{variant.position_limit_option}", name, limit))
    module = manifest.module
    if module is not None and module.lengths is not None and module.lengths.maximum is not None:
        limits.append(("module.lengths.maximum", MODULE_LIMIT, module.lengths.maximum))
    return limits
