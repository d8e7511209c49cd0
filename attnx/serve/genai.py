"""onnxruntime-genai decoders: ``genai.onnx`` + ``genai_config.json`` beside an lm's decode graphs.

:data:`GENAI` is the exporter extension that, for every ``--decode`` export of an ``lm``, makes
OUT a model directory ``onnxruntime_genai.Model(OUT)`` loads (a generic ``"decoder"`` model).
``genai.onnx`` is ``decode.onnx`` (which takes any number of new tokens after any state, empty
included) under the names onnxruntime-genai 0.18 gives a hybrid model (its model builder's
``base.py``), derived layer by layer from the roles the layers declare (:mod:`attnx.state`),
through a :class:`attnx.exporter.layout.Layout`:

* ``position_ids`` (batch, seq) int64 replaces ``past_length``: the position of the first new
  token is ``position_ids[0, 0]`` (every row shares it, as in attnx's decode graphs);
* a KV cache layer's ``key``/``value`` are ``past_key_values.<layer>.key/value`` in and
  ``present.<layer>.key/value`` out: one buffer of ``max_length`` positions that past and present share
  (``search.past_present_share_buffer``; genai allocates it once and binds it to both), written in place
  and attended over where it lies (:func:`shared_kv_buffers`, :mod:`attnx.serve.kv_buffer`);
  where a layer's attention does not take it, every cache grows by concatenation as in decode.onnx, and
  genai allocates a grown present each step;
* a recurrent layer's ``recurrent`` tensors are genai's one ``past.<layer>.recurrent`` (batch, H,
  D_k, D_v) in and ``present.<layer>.recurrent`` out: a single 4-d state as it is, several
  concatenated along the last axis (linear/cosFormer: S (batch, heads, F, d) and Z (batch, heads, F)
  as (batch, heads, F, d + 1)); its ``conv`` carry is ``past.<layer>.conv`` (batch, channels,
  kernel - 1). genai 0.18 finds its recurrent layers by their ``past.<layer>.recurrent`` inputs and
  requires a conv next to every one (without one it stops with "Model input was not found:
  past.0.conv"), every dim but batch static and > 0: a layer without a convolution gets a conv
  placeholder the graph passes through unchanged, and a layer whose state is a conv carry alone beside
  recurrent layers (RWKV's channel mix) a recurrent placeholder, without which genai would not bind its
  conv at all.

genai allocates every recurrent layer's state with the first one's shape and dtype, and every conv
with the first conv's (``RecurrentState``: one shape per role, read from the first layer's inputs), so
the layers' real states of one role must agree (:func:`blocker` says when they do not), and a
placeholder takes their shape and dtype: where the model holds no real state of the role, the
smallest, (batch, 1, 1) for a conv and (batch, 1, 1, 1) for a recurrent state, in the activations'
dtype; where it holds some (RWKV: a time mix's WKV state beside a channel mix's lone token-shift
carry), theirs, so every layer's buffer genai allocates is the one its graph input declares.

A model whose every non-attention layer holds a conv carry alone (LFM2's gated short convolutions:
:func:`conv_cache`) gets the contract of onnxruntime-genai's model builder for LFM2 instead, name for
name: ``"type": "lfm2"``, which genai 0.18 runs with its LFM2 cache (a KV cache per attention layer and a
``past.<layer>.conv`` per other layer, told apart by the config's ``layer_types``), so no recurrent
placeholders; and ``attention_mask`` (batch, total_sequence_length) in place of ``position_ids``, the
first new token's position being its length less the new tokens' (the mask's values are not read:
attnx's decode graphs take one sequence, every token real).

Only ONNX Runtime runs ``genai.onnx``, so its attnx ops take the bodies of ONNX Runtime's own kernels
(the ``ort`` lowering target, :mod:`attnx.targets`: ``com.microsoft::LinearAttention`` for a gated
delta-rule step, ``MultiHeadAttention`` for a softmax step, ...) where they declare them, whatever the
export's ``--target``: the same nodes as ``decode.onnx`` with other function bodies
(:func:`runtime_bodies`; the manifest's ``genai.target`` says which). At the released Qwen3.5 0.8B shape
the portable gated body ran its chunked form (``Scan``, ``If``, the chunk padding) for every one-token step
of its 18 layers (docs/benchmarks.md). genai.onnx declares every state's dims, so a gated step takes the
kernel with its heads as they are (:class:`attnx.ops.SiteBodies`): the kernel's new state is the graph's
``present.<layer>.recurrent`` itself, written into the buffer genai binds to it and its past. An export
made with ``--lowering decomposed`` keeps its bodies, as does one whose installed ONNX Runtime lacks a
kernel a target body calls.

genai on CPU binds a recurrent or conv state's input and output to one buffer, so the graph reads
each such input once, by Slice nodes (copies) that every node writing its output depends on: the
state is read before it is overwritten, whatever order ONNX Runtime runs the nodes in. A state that is
one tensor computed from that copy is then written by the node that computes it, not copied into the
output (at the 0.8B Qwen3.5 shape, 36 copies a token: docs/benchmarks.md); one that is not (a token
shift's carry: the last new token) waits for the copy by a data dependency (:func:`_after_read`), not
by node order. Where every node reading such a lone state is an ancestor of the node writing it (Gated
DeltaNet's recurrent state and conv carry), the input copy goes too and the state is read in place
(:func:`attnx.exporter.layout.without_input_copies`): 36 more copies a token at that shape.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from attnx.decode.export import DECODE_FILE, layout_of
from attnx.decode.model import LOGITS, PAST_LENGTH, TOKENS
from attnx.errors import AttnxError
from attnx.exporter.assemble import Assembly, every_op
from attnx.exporter.export import ExportJob, ExtraGraphs
from attnx.exporter.layout import PREFIX, Layout, value, without_input_copies, without_output_copies
from attnx.exporter.lowering import attnx_nodes, retarget
from attnx.exporter.manifest import DecodeSection, GenaiSection, GenaiState, StatePair, TargetSection
from attnx.exporter.module import ModuleAssembly
from attnx.exporter.opsets import model_opset
from attnx.exporter.store import WeightStore
from attnx.exporter.targets import check_target, target_section
from attnx.exporter.trace import attnx_ops, save_onnx
from attnx.recipes import ExportSettings
from attnx.serve.kv_buffer import Cache, share_kv_buffers
from attnx.serve.tokenizer import CONFIG_FILE, TOKENIZER_FILE, describe, load_tokenizer
from attnx.state import CACHE_ROLES
from attnx.targets import PORTABLE

if TYPE_CHECKING:
    from attnx.ops import AttentionOp

GENAI_FILE, GENAI_CONFIG = "genai.onnx", "genai_config.json"
POSITION_IDS, ATTENTION_MASK = "position_ids", "attention_mask"
CONV_MODEL = "lfm2"  # genai 0.18's model type with a conv cache beside attention (model builder: LFM2)
# genai 0.18's name templates, per role (model builder: past_key_names, past_conv_names, ...)
PAST = {
    "key": "past_key_values.%d.key",
    "value": "past_key_values.%d.value",
    "recurrent": "past.%d.recurrent",
    "conv": "past.%d.conv",
}
PRESENT = {role: f"present.%d.{role}" for role in PAST}
BATCH = "batch"  # the batch axis' name in attnx's graphs
# the axes after batch of the state genai needs where a layer lacks it and no layer holds one: a conv
# beside a recurrent state ((channels, kernel - 1)), a recurrent state beside a conv ((heads, d_k, d_v))
PLACEHOLDER = {"conv": (1, 1), "recurrent": (1, 1, 1)}
DEFAULT_CONTEXT = 4096  # max_length when the positions are unbounded (sinusoidal)
RUNTIME_TARGET = "ort"  # the lowering target of ONNX Runtime's kernels: the only runtime of genai.onnx


@dataclasses.dataclass(frozen=True)
class StateNames:
    """How a runtime names a decoder's state tensors.

    Attributes:
        past: per role ("key", "value", "recurrent", "conv"), the input name template (``%d``: layer).
        present: per role, the output name template.
        batch: the batch axis' name on the state inputs (transformers.js makes its empty state by it).
        placeholders: every recurrent layer has both a recurrent and a conv tensor (a placeholder where
            the layer lacks one), all layers' of one role in one shape and dtype (genai allocates them
            from the first layer's).
        numbers: the number the runtime gives each state layer in its names (index: attnx's layer, from
            0), e.g. the model's own layer indices where layers without state are counted too; None:
            attnx's own numbering.
    """

    past: Mapping[str, str]
    present: Mapping[str, str]
    batch: str = BATCH
    placeholders: bool = False
    numbers: Sequence[int] | None = None


GENAI_NAMES = StateNames(PAST, PRESENT, placeholders=True)


def blocker(section: DecodeSection | None) -> str | None:
    """Why onnxruntime-genai cannot run this decode export (None: it can)."""
    if section is None:
        return "it has no decode graphs; re-export with --decode"
    if section.context:
        return (
            "onnxruntime-genai's generic 'decoder' model is decoder-only; this decoder needs its encoder's "
            "output at every step (genai runs encoder-decoders only for built-in model types)"
        )
    try:
        genai_state(section)
    except AttnxError as exc:
        return str(exc)
    return None


def genai_state(section: DecodeSection, names: StateNames = GENAI_NAMES) -> list[GenaiState]:
    """Every state tensor of a runtime's decoder (genai's by default), layer by layer, from the roles of
    the decode state.

    Raises:
        AttnxError: a state the runtime cannot hold (why, in words).
    """
    found: list[GenaiState] = []
    for layer, pairs in section.layer_state().items():
        if section.layers[layer] == "kv-cache":
            found += _cache(layer, pairs, names)
        else:
            found += _recurrent(layer, pairs, names)
    if not names.placeholders:
        return [s for s in found if s.role in CACHE_ROLES or s.carries]
    for role in ("recurrent", "conv"):
        shared_shape(role, section)  # raises where the layers' real states differ
    if conv_cache(section):  # genai's LFM2 model binds the convs alone: no recurrent placeholders
        return [s for s in found if s.role in CACHE_ROLES or s.carries]
    return found


def conv_cache(section: DecodeSection) -> bool:
    """Whether genai runs the model as the builder's LFM2 (model type :data:`CONV_MODEL`): it has layers
    without a KV cache, and each holds one conv carry alone (see the module docstring)."""
    layers = section.layer_state()
    convs = [[p.role for p in pairs] for i, pairs in layers.items() if section.layers[i] != "kv-cache"]
    return bool(convs) and all(roles == ["conv"] for roles in convs)


def position_input(section: DecodeSection) -> str:
    """The input genai gives the positions by: ``attention_mask`` for its LFM2 model (:func:`conv_cache`,
    as the model builder's LFM2 graph takes them), else ``position_ids``."""
    return ATTENTION_MASK if conv_cache(section) else POSITION_IDS


def _names(layer: int, role: str, names: StateNames) -> tuple[str, str]:
    number = layer if names.numbers is None else names.numbers[layer]
    return names.past[role] % number, names.present[role] % number


def _cache(layer: int, pairs: Sequence[StatePair], names: StateNames) -> list[GenaiState]:
    if sorted(p.role for p in pairs) != ["key", "value"]:
        raise AttnxError(
            f"layer {layer}'s KV cache is not one key and one value tensor (genai's past_key/value)"
        )
    return [GenaiState(layer, p.role, *_names(layer, p.role, names), [p.input]) for p in pairs]


def _recurrent(layer: int, pairs: Sequence[StatePair], names: StateNames) -> list[GenaiState]:
    recurrent = [p for p in pairs if p.role == "recurrent"]
    conv = [p for p in pairs if p.role == "conv"]
    packs = _widths(recurrent, 4) is not None or (not recurrent and len(conv) == 1)
    if len(conv) > 1 or not packs:
        raise AttnxError(
            f"layer {layer}'s state tensors {[p.name for p in pairs]} are not what genai holds per layer: "
            "recurrent tensors that share (batch, heads, F) leading axes and a dtype (one "
            "recurrent state), at most one conv carry, one of them at least"
        )
    return [
        GenaiState(layer, "recurrent", *_names(layer, "recurrent", names), [p.input for p in recurrent]),
        GenaiState(layer, "conv", *_names(layer, "conv", names), [p.input for p in conv]),
    ]


def _widths(pairs: Sequence[StatePair], rank: int) -> list[int] | None:
    """The width each tensor takes along the last axis of one packed tensor of ``rank`` (None: they do
    not pack: other leading axes or dtypes, a dynamic dim, a rank neither ``rank`` nor ``rank - 1``)."""
    lead = {tuple(p.axes[: rank - 1]) for p in pairs}
    if len(lead) != 1 or len({p.dtype for p in pairs}) != 1:
        return None
    if not all(
        len(p.axes) in (rank - 1, rank) and all(isinstance(a, int) for a in p.axes[1:]) for p in pairs
    ):
        return None
    return [int(p.axes[-1]) if len(p.axes) == rank else 1 for p in pairs]


def _carried(state: GenaiState, section: DecodeSection) -> list[StatePair]:
    by_input = {p.input: p for p in section.state}
    return [by_input[name] for name in state.carries]


def _packed(pairs: Sequence[StatePair]) -> tuple[list[str | int], str]:
    """The axes and dtype of one genai state holding ``pairs``: packed along the last axis."""
    rank = max(len(p.axes) for p in pairs)
    widths = _widths(pairs, rank)
    assert widths is not None, "genai_state() refuses unpackable states first"
    return [*pairs[0].axes[: rank - 1], sum(widths)], pairs[0].dtype


def shared_shape(role: str, section: DecodeSection) -> tuple[list[str | int], str]:
    """The axes and dtype of every genai ``role`` ("recurrent", "conv") state, placeholders included:
    the layers' real ones, else the smallest placeholder in the activations' (the logits') dtype.

    Raises:
        AttnxError: the layers' real states differ (genai allocates every layer's with the first one's).
    """
    held = {
        (tuple(axes), dtype)
        for layer, pairs in section.layer_state().items()
        if section.layers[layer] != "kv-cache" and any(p.role == role for p in pairs)
        for axes, dtype in [_packed([p for p in pairs if p.role == role])]
    }
    if len(held) > 1:
        raise AttnxError(
            f"its layers' {role} states differ in shape or dtype ({sorted(map(str, held))}), and "
            "genai allocates every layer's with the first one's"
        )
    if held:
        ((axes, dtype),) = held
        return list(axes), dtype
    return [BATCH, *PLACEHOLDER[role]], next(s.dtype for s in section.decode.outputs if s.name == LOGITS)


def genai_layout(proto: onnx.ModelProto, section: DecodeSection) -> onnx.ModelProto:
    """``decode.onnx`` under onnxruntime-genai's names (see the module docstring)."""
    return decoder_layout(proto, section, genai_state(section), positions=position_input(section))


def decoder_layout(
    proto: onnx.ModelProto,
    section: DecodeSection,
    state: Sequence[GenaiState],
    batch: str = BATCH,
    positions: str = POSITION_IDS,
) -> onnx.ModelProto:
    """``decode.onnx`` as a runtime's decoder (genai's layout, see the module docstring): ``positions``
    (``position_ids`` or ``attention_mask``) for ``past_length``, and the decode state under ``state``'s
    names (a genai placeholder where it carries nothing; the parts of one tensor where the runtime splits
    it), its batch axis named ``batch``."""
    layout = Layout(proto)
    layout.keep(TOKENS)
    past_length = layout.feed(PAST_LENGTH)
    if positions == ATTENTION_MASK:  # its length less the new tokens'
        layout.inputs.append(value(ATTENTION_MASK, "int64", ("batch", "total_sequence_length")))
        total, new = (
            layout.node("Shape", [name], f"{PREFIX}{name}/length", start=1, end=2)
            for name in (ATTENTION_MASK, TOKENS)
        )
        layout.node("Sub", [total, new], past_length)
    else:
        layout.inputs.append(value(POSITION_IDS, "int64", ("batch", "seq")))
        corner = [layout.constant("zeros", [0, 0]), layout.constant("ones", [1, 1])]
        first = layout.node("Slice", [POSITION_IDS, *corner], f"{PREFIX}first_position")
        layout.node("Reshape", [first, layout.constant("one", [1])], past_length)
    layout.keep(LOGITS)
    parts: dict[str, list[GenaiState]] = {}
    copies: dict[str, str] = {}
    for held in (s for s in state if s.part is not None):
        parts.setdefault(held.carries[0], []).append(held)
    for held in state:
        if held.part is not None:
            if parts[held.carries[0]][0] is held:  # the tensor's first part lays out all of them
                _split(layout, parts[held.carries[0]], _carried(held, section)[0])
        elif held.role in CACHE_ROLES:
            _rename(layout, held, _carried(held, section)[0])
        elif held.carries:
            copies.update(_pack(layout, held, section))
        else:
            _placeholder(layout, held, *shared_shape(held.role, section))
    built = layout.build("attnx_genai_decoder")
    pasts = {s.past for s in state} | {s.present for s in state}
    for spec in [*built.graph.input, *built.graph.output]:
        for dim in spec.type.tensor_type.shape.dim if spec.name in pasts else ():
            if dim.dim_param == BATCH:
                dim.dim_param = batch
    return without_input_copies(without_output_copies(built), copies)


def shared_kv_buffers(proto: onnx.ModelProto, state: Sequence[GenaiState]) -> onnx.ModelProto | None:
    """``proto`` (genai.onnx, on ONNX Runtime's kernels) with its KV caches in buffers that past and present
    share, as genai holds them with ``past_present_share_buffer`` (:mod:`attnx.serve.kv_buffer`); None where
    a cache layer is not in the form that takes it (genai then grows every cache)."""
    caches = [
        Cache(key.past, value.past, key.present, value.present)
        for key in state
        if key.role == "key"
        for value in state
        if value.role == "value" and value.layer == key.layer
    ]
    return share_kv_buffers(proto, caches, f"{PREFIX}{PAST_LENGTH}", TOKENS)


def runtime_bodies(
    proto: onnx.ModelProto, ops: Sequence[AttentionOp], settings: ExportSettings
) -> TargetSection | None:
    """Give ``proto`` (genai.onnx, function-lowered with the portable bodies, none of them standard ops an
    ``--opset`` chose: :func:`_standard_bodies`) ONNX Runtime's kernels where its ops declare a body for
    them (:data:`RUNTIME_TARGET`), in place; the target's manifest section (None: left as it is: another
    lowering or target, none of its ops declaring one, or a kernel the installed ONNX Runtime lacks)."""
    if settings.lowering != "function" or settings.target != PORTABLE:
        return None
    try:
        check_target(RUNTIME_TARGET, settings.lowering, ops)
    except AttnxError:
        return None
    section = target_section(RUNTIME_TARGET, ops, attnx_ops(proto))
    if section is None or not section.ops:
        return None
    retarget(proto, ops, RUNTIME_TARGET)
    return section


def _standard_bodies(proto: onnx.ModelProto, ops: Sequence[AttentionOp]) -> bool:
    """Whether an attnx node of ``proto`` has a body written for a newer opset than its oldest (a standard
    op that ONNX Runtime runs as a kernel already: ``LinearAttention`` at opset 27, ``Attention`` at 23),
    which the export's ``--opset`` chose and genai.onnx keeps."""
    by_name, opset = {op.name: op for op in ops}, model_opset(proto)
    for node in attnx_nodes(proto):
        op = by_name[node.op_type]
        present = [name for name, value in zip(op.input_names, node.input, strict=False) if value]
        if op.body_for(present, opset) is not op.body_for(present, opset, portable=True):
            return True
    return False


def _rename(layout: Layout, state: GenaiState, pair: StatePair) -> None:
    source_in, source_out = layout.source(pair.input), layout.source(pair.output)
    layout.inputs.append(value(state.past, pair.dtype, _dims(source_in)))
    layout.node("Identity", [state.past], layout.feed(pair.input))
    layout.outputs.append(value(state.present, pair.dtype, _dims(source_out)))
    layout.node("Identity", [layout.take(pair.output)], state.present, after=True)


def _pack(layout: Layout, state: GenaiState, section: DecodeSection) -> dict[str, str]:
    """Slice each carried tensor off the one genai input (copies, read before anything writes the
    shared buffer) and concatenate the next ones into the genai output. A lone one computed from its copy
    is that output: the node computing it writes genai's buffer only after the copy was read. Returns that
    lone copy and the output (:func:`attnx.exporter.layout.without_input_copies` drops the copy where the
    graph reads the state before it writes it)."""
    pairs = _carried(state, section)
    axes, dtype = _packed(pairs)
    rank = len(axes)
    widths = _widths(pairs, rank)
    assert widths is not None, "genai_state() refuses unpackable states first"
    layout.inputs.append(value(state.past, dtype, axes))
    layout.outputs.append(value(state.present, dtype, axes))
    last = layout.constant(f"{state.past}/last_axis", [rank - 1])
    parts, start = [], 0
    for pair, width in zip(pairs, widths, strict=True):
        bounds = [
            layout.constant(f"{pair.input}/{end}", [bound])
            for end, bound in (("start", start), ("end", start + width))
        ]
        output = layout.take(pair.output)  # genai's name may be the decode graph's own (past.0.recurrent)
        if len(pair.axes) == rank:
            layout.node("Slice", [state.past, *bounds, last], layout.feed(pair.input))
        else:
            sliced = layout.node("Slice", [state.past, *bounds, last], f"{PREFIX}{pair.input}/sliced")
            layout.node("Squeeze", [sliced, last], layout.feed(pair.input))
            output = layout.node("Unsqueeze", [output, last], f"{output}/packed", after=True)
        computed = layout.computed_from(pair.output, pair.input)
        if not computed:
            output = _after_read(layout, output, layout.renamed[pair.input])
        parts.append(output)
        start += width
    if len(parts) == 1 and computed:  # written in place
        layout.node("Identity", parts, state.present, after=True)
        return {layout.renamed[pairs[0].input]: state.present} if len(pairs[0].axes) == rank else {}
    layout.node("Concat", parts, state.present, after=True, axis=rank - 1)
    return {}


def _after_read(layout: Layout, part: str, copy: str) -> str:
    """``part`` (a next state not computed from its state's copy: a token shift's carry) once ``copy`` exists:
    an elementwise ``Where`` whose condition is read off the copy's size, so the node writing genai's buffer
    waits for the copy by its inputs, not by ONNX Runtime's node order."""
    size = layout.node("Size", [copy], f"{copy}/size", after=True)
    never = layout.node("Less", [size, layout.constant(f"{copy}/zero", [0])], f"{copy}/read", after=True)
    return layout.node("Where", [never, part, part], f"{part}/after_read", after=True)


def _split(layout: Layout, parts: Sequence[GenaiState], pair: StatePair) -> None:
    """One state tensor held as several runtime states along its axis 1 (its channels): their inputs
    concatenated into it, its next value sliced into their outputs."""
    output, channels = layout.take(pair.output), layout.constant(f"{pair.input}/channel_axis", [1])
    for held in parts:
        assert held.part is not None, "decoder_layout() splits a tensor into its parts only"
        start, stop = held.part
        axes = [pair.axes[0], stop - start, *pair.axes[2:]]
        layout.inputs.append(value(held.past, pair.dtype, axes))
        layout.outputs.append(value(held.present, pair.dtype, axes))
        ends = [
            layout.constant(f"{held.present}/{end}", [at]) for end, at in (("start", start), ("stop", stop))
        ]
        layout.node("Slice", [output, *ends, channels], held.present, after=True)
    layout.node("Concat", [held.past for held in parts], layout.feed(pair.input), axis=1)


def _placeholder(layout: Layout, state: GenaiState, axes: list[str | int], dtype: str) -> None:
    layout.inputs.append(value(state.past, dtype, axes))
    layout.outputs.append(value(state.present, dtype, axes))
    layout.node("Identity", [state.past], state.present, after=True)


def _dims(spec: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in spec.type.tensor_type.shape.dim]


def _heads(section: DecodeSection) -> tuple[int, int]:
    """(heads, head size) of the KV cache (genai sizes its cache by them), else of the recurrent state;
    (1, 1) for conv carries alone (genai sizes no state by them)."""
    by_role = {role: [p for p in section.state if p.role == role] for role in ("key", "recurrent")}
    found = by_role["key"] or by_role["recurrent"]
    if not found:
        return 1, 1
    axes = found[0].axes
    return int(axes[1]), int(axes[-1]) if len(axes) == 4 else 1


def genai_config(
    section: DecodeSection,
    state: Sequence[GenaiState],
    context: int,
    specials: dict[str, Any],
    shared_kv: bool = False,
) -> dict[str, Any]:
    """``genai_config.json`` of an lm decode export, from its decode section: ``state`` its genai state
    (the name templates are those of the roles it holds), ``context`` the longest sequence, ``specials``
    the tokenizer's bos/eos/pad ids (None unknown), ``shared_kv`` whether genai.onnx takes its KV caches
    in buffers that past and present share (genai then allocates them once, ``max_length`` long)."""
    heads, head_size = _heads(section)
    roles = [role for role in PAST if any(s.role == role for s in state)]
    positions = position_input(section)
    model: dict[str, Any] = {
        "type": CONV_MODEL if conv_cache(section) else "decoder",
        "vocab_size": section.vocab_size,
        "context_length": context,
        # No known end token: genai then ends at its pad_token_id (0) or at max_length.
        "eos_token_id": specials.get("eos_token_id") if specials.get("eos_token_id") is not None else [],
        **{k: specials[k] for k in ("bos_token_id", "pad_token_id") if specials.get(k) is not None},
        "decoder": {
            "filename": GENAI_FILE,
            "session_options": {"log_id": "attnx", "provider_options": []},
            "hidden_size": heads * head_size,
            "head_size": head_size,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "num_hidden_layers": len(section.layers),
            "inputs": {
                "input_ids": TOKENS,
                positions: positions,
                **{f"past_{role}_names": PAST[role] for role in roles},
            },
            "outputs": {
                "logits": LOGITS,
                **{f"present_{role}_names": PRESENT[role] for role in roles},
            },
        },
    }
    if conv_cache(section):  # what genai's LFM2 cache reads, as the model builder writes it
        model["decoder"]["layer_types"] = [
            "full_attention" if kind == "kv-cache" else "conv" for kind in section.layers
        ]
        model["decoder"]["conv_cache_size"] = int(shared_shape("conv", section)[0][-1])
    search = {
        "do_sample": False,
        "num_beams": 1,
        "max_length": context,
        "past_present_share_buffer": shared_kv,
    }
    return {"model": model, "search": search}


def model_specials(assembly: Assembly | ModuleAssembly, vocab_size: int) -> dict[str, Any]:
    """The bos/eos/pad ids a loaded Hugging Face model names (its ``generation_config``, else its
    ``config``; ids outside the vocabulary dropped: genai refuses them), for an export without a
    tokenizer: genai without an eos id ends a sequence at its pad id 0, a real token of the vocabulary
    (a flash-linear-attention model's first grey level), so its greedy decoding stopped at the first 0."""
    model = getattr(assembly, "adapted", None)
    found: dict[str, Any] = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        named = [getattr(getattr(model, where, None), key, None) for where in ("generation_config", "config")]
        ids = next((i for i in named if i is not None), None)
        ids = [
            i for i in (ids if isinstance(ids, list) else [ids]) if isinstance(i, int) and 0 <= i < vocab_size
        ]
        if ids:
            found[key] = ids if key == "eos_token_id" and len(ids) > 1 else ids[0]
    return found


def context_length(assembly: Assembly | ModuleAssembly) -> int:
    """The longest sequence genai may generate: the variant's position limit (a module's: what its
    adapters read from it, e.g. a Hugging Face config's ``max_position_embeddings``), else
    :data:`DEFAULT_CONTEXT`."""
    if isinstance(assembly, ModuleAssembly):
        limit = assembly.section.lengths
        return limit.maximum if limit is not None and limit.maximum is not None else DEFAULT_CONTEXT
    return assembly.variant.position_limit(assembly.variant_config) or DEFAULT_CONTEXT


class GenaiDecoder:
    """The onnxruntime-genai extension of an lm decode export, attnx's or a module's (manifest section
    ``genai``)."""

    name = "genai"

    def traces(self, assembly: Assembly | ModuleAssembly) -> int:
        return 0

    def wanted(self, job: ExportJob) -> bool:
        settings = job.settings
        return (
            settings.decode
            and "genai" in settings.state_names
            and (job.plan.model == "lm" or job.module is not None)
        )

    def check(self, job: ExportJob) -> None:
        """Nothing beyond the decode extension's checks."""

    def export(
        self,
        assembly: Assembly | ModuleAssembly,
        directory: Path,
        settings: ExportSettings,
        store: WeightStore | None,
    ) -> ExtraGraphs:
        """Write genai.onnx and genai_config.json from the decode graph already in ``directory``
        (nothing, and no section, when :func:`blocker` names a reason); its weights stay where the decode
        graph keeps them."""
        section = layout_of(assembly).describe()
        if blocker(section) is not None:
            return ExtraGraphs({}, [], None)
        proto = genai_layout(onnx.load(str(directory / DECODE_FILE), load_external_data=False), section)
        ops = every_op(assembly)
        # standard ops an --opset chose stay, with no vendor domain: no kernel bodies, no shared buffers
        standard = _standard_bodies(proto, ops)
        target = None if standard else runtime_bodies(proto, ops, settings)
        state = genai_state(section)
        shared = shared_kv_buffers(proto, state) if settings.lowering == "function" and not standard else None
        proto = proto if shared is None else shared
        save_onnx(proto, directory / GENAI_FILE)
        specials = model_specials(assembly, section.vocab_size)
        if (directory / TOKENIZER_FILE).is_file():
            config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
            tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
            named = vars(describe(tokenizer, config, section.vocab_size, TOKENIZER_FILE))
            specials |= {key: i for key, i in named.items() if i is not None}  # the tokenizer's first
        config = genai_config(section, state, context_length(assembly), specials, shared is not None)
        text = json.dumps(config, indent=2) + "\n"
        (directory / GENAI_CONFIG).write_text(text, encoding="utf-8")
        files = {"genai": GENAI_FILE, "genai_config": GENAI_CONFIG}
        return ExtraGraphs(files, attnx_ops(proto), GenaiSection(state, target, shared is not None))


GENAI = GenaiDecoder()
