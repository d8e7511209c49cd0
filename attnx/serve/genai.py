"""onnxruntime-genai decoders: ``genai.onnx`` + ``genai_config.json`` beside an lm's decode graphs.

:data:`GENAI` is the exporter extension that, for every ``--decode`` export of an ``lm``, makes
OUT a model directory ``onnxruntime_genai.Model(OUT)`` loads (a generic ``"decoder"`` model).
``genai.onnx`` is ``decode.onnx`` (which takes any number of new tokens after any state, empty
included) under genai's names, through a :class:`attnx.serve.layout.Layout`:

* ``position_ids`` (batch, seq) int64 replaces ``past_length``: the position of the first new
  token is ``position_ids[0, 0]`` (every row shares it, as in attnx's decode graphs);
* a KV cache layer's two tensors are ``past_key_values.<layer>.key/value`` in and
  ``present.<layer>.key/value`` out;
* a recurrent layer's tensors (linear/cosFormer: S (batch, heads, F, d) and Z (batch, heads, F))
  are packed along their last axis into genai's one ``past_key_values.<layer>.recurrent_state``
  (batch, heads, F, d + 1) and unpacked by Slice nodes, which run before the packed output is
  written (genai on CPU binds a recurrent state's input and output to one buffer); genai also
  requires a ``conv_state`` per recurrent layer (every dim but batch static and > 0), which these
  variants have none of: a (batch, 1, 1) tensor the graph passes through unchanged.

``past_present_share_buffer`` is off: attnx's KV cache grows by concatenation, it does not write
into a buffer of the maximum length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from attnx.decode.export import DECODE_FILE
from attnx.decode.model import LOGITS, PAST_LENGTH, TOKENS, DecodeLayout
from attnx.exporter.assemble import Assembly
from attnx.exporter.export import ExportJob, ExtraGraphs, attnx_ops, save_onnx
from attnx.exporter.manifest import DecodeSection, GenaiSection, StatePair
from attnx.recipes import ExportSettings
from attnx.serve.layout import Layout, value
from attnx.serve.tokenizer import CONFIG_FILE, TOKENIZER_FILE, describe, load_tokenizer
from attnx.state import GROWING

GENAI_FILE, GENAI_CONFIG = "genai.onnx", "genai_config.json"
POSITION_IDS = "position_ids"
PAST, PRESENT = "past_key_values.%d.", "present.%d."
DEFAULT_CONTEXT = 4096  # max_length when the positions are unbounded (sinusoidal)


def layers(section: DecodeSection) -> dict[int, list[StatePair]]:
    """The state tensors of each layer (the position counter left out)."""
    found: dict[int, list[StatePair]] = {}
    for pair in section.state:
        if pair.layer is not None:
            found.setdefault(pair.layer, []).append(pair)
    return found


def blocker(model: str, section: DecodeSection | None) -> str | None:
    """Why onnxruntime-genai cannot run this decode export (None: it can)."""
    if section is None:
        return "it has no decode graphs; re-export with --decode"
    if model != "lm":
        return (
            f"onnxruntime-genai's generic 'decoder' model is decoder-only; a {model} decoder needs its "
            "encoder's output at every step (genai runs encoder-decoders only for built-in model types)"
        )
    for layer, pairs in layers(section).items():
        if section.mode == "kv-cache" and [GROWING in p.axes for p in pairs] != [True, True]:
            return (
                f"layer {layer}'s KV cache is not one key and one value tensor (genai's past_key/value names)"
            )
        if section.mode == "recurrent" and _packing(pairs) is None:
            return (
                f"layer {layer}'s state tensors {[p.name for p in pairs]} do not share (batch, heads, F) "
                "leading axes, so they cannot be packed into genai's one recurrent_state per layer"
            )
    return None


def _packing(pairs: Sequence[StatePair]) -> list[int] | None:
    """The width each tensor takes in a layer's packed recurrent state (None: not packable)."""
    lead = {tuple(p.axes[:3]) for p in pairs}
    if len(lead) != 1 or len({p.dtype for p in pairs}) != 1:
        return None
    if not all(len(p.axes) in (3, 4) and all(isinstance(a, int) for a in p.axes[1:]) for p in pairs):
        return None
    return [int(p.axes[3]) if len(p.axes) == 4 else 1 for p in pairs]


def genai_layout(proto: onnx.ModelProto, section: DecodeSection) -> onnx.ModelProto:
    """``decode.onnx`` under onnxruntime-genai's names (see the module docstring)."""
    layout = Layout(proto)
    layout.keep(TOKENS)
    layout.inputs.append(value(POSITION_IDS, "int64", ("batch", "seq")))
    corner = [layout.constant("zeros", [0, 0]), layout.constant("ones", [1, 1])]
    first = layout.node("Slice", [POSITION_IDS, *corner], "serve/first_position")
    layout.node("Reshape", [first, layout.constant("one", [1])], layout.feed(PAST_LENGTH))
    layout.keep(LOGITS)
    for layer, pairs in layers(section).items():
        if section.mode == "kv-cache":
            for pair, kind in zip(pairs, ("key", "value"), strict=True):
                _rename(layout, pair, f"{PAST % layer}{kind}", f"{PRESENT % layer}{kind}")
        else:
            _pack(layout, layer, pairs)
    return layout.build("attnx_genai_decoder")


def _rename(layout: Layout, pair: StatePair, past: str, present: str) -> None:
    source_in, source_out = layout.source(pair.input), layout.source(pair.output)
    layout.inputs.append(value(past, pair.dtype, _dims(source_in)))
    layout.node("Identity", [past], layout.feed(pair.input))
    layout.outputs.append(value(present, pair.dtype, _dims(source_out)))
    if present != pair.output:
        layout.node("Identity", [pair.output], present, after=True)


def _pack(layout: Layout, layer: int, pairs: Sequence[StatePair]) -> None:
    widths = _packing(pairs)
    assert widths is not None, "blocker() refuses unpackable states first"
    dtype, lead = pairs[0].dtype, pairs[0].axes[:3]
    past, present = f"{PAST % layer}recurrent_state", f"{PRESENT % layer}recurrent_state"
    axes = [*lead, sum(widths)]
    layout.inputs.append(value(past, dtype, axes))
    layout.outputs.append(value(present, dtype, axes))
    last = layout.constant(f"{layer}/last_axis", [3])
    parts, start = [], 0
    for pair, width in zip(pairs, widths, strict=True):
        bounds = [
            layout.constant(f"{pair.input}/{end}", [bound])
            for end, bound in (("start", start), ("end", start + width))
        ]
        if len(pair.axes) == 4:
            layout.node("Slice", [past, *bounds, last], layout.feed(pair.input))
            parts.append(pair.output)
        else:
            sliced = layout.node("Slice", [past, *bounds, last], f"serve/{pair.input}/sliced")
            layout.node("Squeeze", [sliced, last], layout.feed(pair.input))
            parts.append(
                layout.node("Unsqueeze", [pair.output, last], f"serve/{pair.output}/packed", after=True)
            )
        start += width
    layout.node("Concat", parts, present, after=True, axis=3)
    conv = [pairs[0].axes[0], 1, 1]
    layout.inputs.append(value(f"{PAST % layer}conv_state", dtype, conv))
    layout.outputs.append(value(f"{PRESENT % layer}conv_state", dtype, conv))
    layout.node("Identity", [f"{PAST % layer}conv_state"], f"{PRESENT % layer}conv_state", after=True)


def _dims(spec: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in spec.type.tensor_type.shape.dim]


def genai_config(assembly: Assembly, section: DecodeSection, specials: dict[str, Any]) -> dict[str, Any]:
    """``genai_config.json`` of an lm decode export (``specials``: bos/eos/pad ids, None unknown)."""
    config = assembly.model_config
    heads = config.n_heads
    context = assembly.variant.position_limit(assembly.variant_config) or DEFAULT_CONTEXT
    model: dict[str, Any] = {
        "type": "decoder",
        "vocab_size": config.vocab_size,
        "context_length": context,
        # No known end token: genai stops at max_length, as `attnx generate` does.
        "eos_token_id": specials.get("eos_token_id") if specials.get("eos_token_id") is not None else [],
        **{k: specials[k] for k in ("bos_token_id", "pad_token_id") if specials.get(k) is not None},
        "decoder": {
            "filename": GENAI_FILE,
            "session_options": {"log_id": "attnx", "provider_options": []},
            "hidden_size": config.d_model,
            "head_size": config.d_model // heads,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "num_hidden_layers": len(layers(section)),
            "inputs": {
                "input_ids": TOKENS,
                "position_ids": POSITION_IDS,
                "past_key_names": f"{PAST}key",
                "past_value_names": f"{PAST}value",
            },
            "outputs": {
                "logits": LOGITS,
                "present_key_names": f"{PRESENT}key",
                "present_value_names": f"{PRESENT}value",
            },
        },
    }
    search = {"do_sample": False, "num_beams": 1, "max_length": context, "past_present_share_buffer": False}
    return {"model": model, "search": search}


class GenaiDecoder:
    """The onnxruntime-genai extension of an lm decode export (manifest section ``genai``)."""

    name = "genai"

    def wanted(self, job: ExportJob) -> bool:
        return job.settings.decode and job.plan.model == "lm"

    def check(self, job: ExportJob) -> None:
        """Nothing beyond the decode extension's checks."""

    def export(self, assembly: Assembly, directory: Path, settings: ExportSettings) -> ExtraGraphs:
        """Write genai.onnx and genai_config.json from the decode graph already in ``directory``
        (nothing, and no section, when :func:`blocker` names a reason)."""
        section = DecodeLayout.of(assembly.module, assembly.variant.capabilities.decode).describe()
        if blocker("lm", section) is not None:
            return ExtraGraphs({}, [], None)
        proto = genai_layout(onnx.load(str(directory / DECODE_FILE)), section)
        save_onnx(proto, directory / GENAI_FILE)
        specials: dict[str, Any] = {}
        if (directory / TOKENIZER_FILE).is_file():
            config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
            tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
            specials = vars(describe(tokenizer, config, assembly.model_config.vocab_size, TOKENIZER_FILE))
        text = json.dumps(genai_config(assembly, section, specials), indent=2) + "\n"
        (directory / GENAI_CONFIG).write_text(text, encoding="utf-8")
        packed = [] if section.mode == "kv-cache" else [p.input for p in section.state if p.layer is not None]
        files = {"genai": GENAI_FILE, "genai_config": GENAI_CONFIG}
        return ExtraGraphs(files, attnx_ops(proto), GenaiSection(section.mode, packed))


GENAI = GenaiDecoder()
