"""The runtime decoders an lm decode export can carry, one table: manifest section -> how it is laid out.

Each is ``decode.onnx`` under a runtime's state names (:func:`attnx.serve.genai.decoder_layout`), its
state tensors recorded in the manifest section, so parity (:mod:`attnx.serve.genai_parity`) and
``attnx optimize`` (which lays it out again from the new decode graph) need nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import onnx

from attnx.errors import AttnxError
from attnx.exporter.lowering import retarget
from attnx.exporter.manifest import DecodeSection, GenaiSection
from attnx.serve import genai, transformers_js

if TYPE_CHECKING:
    from attnx.ops import AttentionOp


@dataclasses.dataclass(frozen=True)
class RuntimeDecoder:
    """A runtime decoder: its manifest section (and file key), its name in reports, its state's batch
    axis, and the input it takes the positions by, per decode section (``position_ids`` or
    ``attention_mask``)."""

    section: str
    runtime: str
    batch: str
    positions: Callable[[DecodeSection], str]

    def layout(
        self, decode: onnx.ModelProto, section: DecodeSection, held: GenaiSection, ops: Sequence[AttentionOp]
    ) -> onnx.ModelProto:
        """``decode`` (the decode graph of ``section``) as this runtime's decoder with state ``held``, its
        attnx ops (of ``ops``) on the lowering target ``held`` records where it records one, its KV caches
        in shared buffers where ``held`` says so.

        Raises:
            AttnxError: ``held`` shares the caches' buffers and the new decode graph's caches cannot.
        """
        laid_out = genai.decoder_layout(decode, section, held.state, self.batch, self.positions(section))
        if held.target is not None:
            laid_out = retarget(laid_out, ops, held.target.name)
        if not held.shared_kv:
            return laid_out
        shared = genai.shared_kv_buffers(laid_out, held.state)
        if shared is None:
            raise AttnxError(
                f"the new decode graph's KV caches no longer take the buffer {self.runtime} shares between "
                "past and present; optimise without the step that changed the attention layers"
            )
        return shared


DECODERS = {
    d.section: d
    for d in (
        RuntimeDecoder(genai.GENAI.name, "genai", genai.BATCH, genai.position_input),
        RuntimeDecoder(
            transformers_js.TRANSFORMERS_JS.name,
            transformers_js.RUNTIME,
            transformers_js.BATCH,
            lambda section: genai.POSITION_IDS,
        ),
    )
}
