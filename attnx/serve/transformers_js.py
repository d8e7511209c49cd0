"""transformers.js decoders: ``transformers-js.onnx`` + ``config.json`` beside a Hugging Face hybrid's
decode graphs (``attnx export --from hf:DIR --decode --state-names transformers.js``).

:data:`TRANSFORMERS_JS` is the exporter extension that writes the decode graph under the state names
transformers.js 4.3 gives a hybrid model of the same ``model_type`` (its ``configs.js``
``getCacheNames``, and ``getPastKeyValues`` that feeds ``present*`` outputs back as ``past*``
inputs), through the same layout as the genai decoder (:func:`attnx.serve.genai.decoder_layout`):

* a KV cache layer: ``past_key_values.<layer>.key/value`` in, ``present.<layer>.key/value`` out;
* a short convolution's carry: ``past_conv.<layer>`` in, ``present_conv.<layer>`` out; OLMo Hybrid's
  split along its channels into ``past_conv.<layer>.query/key/value`` (the channels of its q, k and v
  projections, which its one depthwise conv runs over concatenated), concatenated into attnx's one
  carry in the graph and sliced out of the next one;
* a recurrent state: ``past_recurrent.<layer>`` (Qwen3-Next, OLMo Hybrid) or ``past_ssm.<layer>`` (the
  Mamba2 hybrids) in, ``present_*`` out, several tensors packed along the last axis as for genai; no
  placeholders (transformers.js feeds exactly the names it expects);
* ``<layer>`` is the model's own decoder layer (:func:`layer_numbers`: stateless MLP layers keep their
  numbers, a layer with both a KV cache and an SSM has one number);
* the state's batch axis is ``batch_size``, the symbol transformers.js makes its empty state with
  (every other symbolic axis of a state input starts at 0, a KV cache of length 0).

``position_ids`` give the first new token's position (transformers.js derives them from its attention
mask); rows of one batch share it, so transformers.js runs the graph on one sequence at a time. The
Hugging Face ``config.json`` written beside it is the model's own, which transformers.js reads to pick
its model class and cache names, its layer types spelled as transformers.js reads them (:func:`js_config`).
The graph keeps its weights where the decode graph keeps them (the
export's ``weights.safetensors`` when shared), so transformers.js in Node.js loads it from OUT with
``AutoModelForCausalLM.from_pretrained(OUT, {subfolder: "", model_file_name: "transformers-js"})``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
from torch import nn

from attnx.decode.export import DECODE_FILE, layout_of
from attnx.decode.module import stepping_layers
from attnx.errors import AttnxError
from attnx.exporter.assemble import Assembly
from attnx.exporter.export import ExportJob, ExtraGraphs
from attnx.exporter.manifest import DecodeSection, GenaiSection, GenaiState
from attnx.exporter.module import ModuleAssembly
from attnx.exporter.store import WeightStore
from attnx.exporter.trace import attnx_ops, save_onnx
from attnx.recipes import ExportSettings
from attnx.serve.genai import StateNames, decoder_layout, genai_state

RUNTIME = "transformers.js"
DECODER_FILE, HF_CONFIG = "transformers-js.onnx", "config.json"
BATCH = "batch_size"
# transformers 5.24's layer types under the names transformers.js 4.3 reads them by (the older spelling)
OLD_SPELLING = {"linear_attention": "mamba", "full_attention": "attention"}
LAYER_PATH = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


@dataclasses.dataclass(frozen=True)
class JsFamily:
    """What transformers.js 4.3 expects of one ``model_type``'s decoder (its ``configs.js``
    ``getCacheNames``).

    Attributes:
        recurrent: its name of a layer's recurrent state (``past_<recurrent>.<layer>``); None: the
            layers carry a conv state alone.
        spelling: the config's layer types as transformers.js reads them, where transformers 5.24 saves
            them otherwise (``layer_types`` / ``layers_block_type`` in the config.json written).
        conv_parts: the parts it splits a layer's conv carry into along the channels, from the Hugging
            Face config (:func:`split_conv`); None: one ``past_conv.<layer>``.
    """

    recurrent: str | None = None
    spelling: Mapping[str, str] = dataclasses.field(default_factory=dict)
    conv_parts: Callable[[Any], Mapping[str, int]] | None = None


def _qkv_channels(config: Any) -> dict[str, int]:
    """OLMo Hybrid's conv channels, in its order (transformers 5.24 ``OlmoHybridGatedDeltaNet``: the conv
    runs over ``cat(q_proj, k_proj, v_proj)``), under transformers.js's names of the parts."""
    keys = config.linear_num_key_heads * config.linear_key_head_dim
    return {"query": keys, "key": keys, "value": config.linear_num_value_heads * config.linear_value_head_dim}


# The model types whose checkpoints of transformers 5.24 transformers.js runs as a decoder of input_ids
# and position_ids. Not here (docs/deploying.md): qwen3_5_text, whose model class generates through
# Qwen2-VL's multimodal positions (get_rope_index reads config.vision_config, which a text model has not);
# qwen3_5_moe_text and the Mamba2 hybrids (bamba, zamba2, jamba, mamba2), which it has no model class for.
FAMILIES = {
    "lfm2": JsFamily(),
    "lfm2_moe": JsFamily(),
    "qwen3_next": JsFamily("recurrent"),
    "olmo_hybrid": JsFamily("recurrent", conv_parts=_qkv_channels),
    "granitemoehybrid": JsFamily("ssm", OLD_SPELLING),
    "nemotron_h": JsFamily("ssm", OLD_SPELLING),
    "falcon_h1": JsFamily("ssm"),  # no layer types saved: every layer has both a KV cache and an SSM
}


def family(model_type: str) -> JsFamily:
    """transformers.js's expectations of a Hugging Face ``model_type``.

    Raises:
        AttnxError: a model type whose hybrid cache transformers.js does not name.
    """
    if model_type not in FAMILIES:
        raise AttnxError(
            f"--state-names {RUNTIME}: transformers.js 4.3 decodes {', '.join(FAMILIES)} models by their "
            f"state names, not model_type '{model_type}' (docs/deploying.md); export with --state-names genai"
        )
    return FAMILIES[model_type]


def state_names(model_type: str, numbers: Sequence[int] | None = None) -> StateNames:
    """transformers.js's state names for a Hugging Face ``model_type``, its layers numbered ``numbers``
    (:func:`layer_numbers`).

    Raises:
        AttnxError: a model type whose hybrid cache transformers.js does not name.
    """
    recurrent = family(model_type).recurrent or "recurrent"
    past = {"key": "past_key_values.%d.key", "value": "past_key_values.%d.value", "conv": "past_conv.%d"}
    present = {"key": "present.%d.key", "value": "present.%d.value", "conv": "present_conv.%d"}
    past["recurrent"], present["recurrent"] = f"past_{recurrent}.%d", f"present_{recurrent}.%d"
    return StateNames(past, present, batch=BATCH, numbers=numbers)


def layer_numbers(model: nn.Module) -> list[int]:
    """The Hugging Face decoder layer (``...layers.<i>``) of each of ``model``'s state layers, in attnx's
    order: transformers.js numbers a state by the model's layer, stateless layers (an MLP) counted too.

    Raises:
        AttnxError: a state layer outside a ``layers.<i>`` module.
    """
    paths = {id(module): path for path, module in model.named_modules()}
    numbers = []
    for layer in stepping_layers(model):
        found = LAYER_PATH.search(paths[id(layer)])
        if found is None:
            raise AttnxError(
                f"--state-names {RUNTIME}: the state layer {paths[id(layer)]!r} is not inside a decoder "
                "layer (layers.<i>), which transformers.js numbers its state by; use --state-names genai"
            )
        numbers.append(int(found.group(1)))
    return numbers


def split_conv(
    state: Sequence[GenaiState], section: DecodeSection, widths: Mapping[str, int]
) -> list[GenaiState]:
    """``state`` with each conv carry split along its channels into the parts of ``widths`` (name ->
    channels, in the carry's order), each named ``<past>.<name>`` / ``<present>.<name>``.

    Raises:
        AttnxError: a conv carry whose channels are not the parts' together.
    """
    axes = {p.input: p.axes for p in section.state}
    split: list[GenaiState] = []
    for held in state:
        if held.role != "conv":
            split.append(held)
            continue
        (carried,) = held.carries
        if axes[carried][1] != sum(widths.values()):
            raise AttnxError(
                f"--state-names {RUNTIME}: layer {held.layer}'s conv carry has {axes[carried][1]} channels, "
                f"not the {sum(widths.values())} of transformers.js's {'/'.join(widths)} parts; use "
                "--state-names genai"
            )
        start = 0
        for name, width in widths.items():
            part = [start, start + width]
            split.append(
                dataclasses.replace(
                    held, past=f"{held.past}.{name}", present=f"{held.present}.{name}", part=part
                )
            )
            start += width
    return split


def js_config(config: Any) -> str:
    """The Hugging Face config as JSON, its layer types spelled as transformers.js reads them."""
    data = json.loads(config.to_json_string(use_diff=False))
    spelling = family(config.model_type).spelling
    for key in ("layer_types", "layers_block_type"):
        if isinstance(data.get(key), list):
            data[key] = [spelling.get(kind, kind) for kind in data[key]]
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def hf_config(module: Any) -> Any | None:
    """The Hugging Face config of the model in ``module`` (its own or a submodule's), or None."""
    return next(
        (m.config for m in module.modules() if hasattr(getattr(m, "config", None), "model_type")), None
    )


class TransformersJsDecoder:
    """The transformers.js extension of a Hugging Face lm's decode export (manifest section
    ``transformers_js``)."""

    name = "transformers_js"

    def traces(self, assembly: Assembly | ModuleAssembly) -> int:
        return 0

    def wanted(self, job: ExportJob) -> bool:
        return job.settings.decode and RUNTIME in job.settings.state_names

    def check(self, job: ExportJob) -> None:
        """Refuse a model transformers.js has no hybrid cache names for, before any work.

        Raises:
            AttnxError: not a Hugging Face model, or a model type transformers.js does not name.
        """
        config = None if job.module is None else hf_config(job.module.module)
        if config is None:
            raise AttnxError(
                f"--state-names {RUNTIME} names the state of Hugging Face models (--from hf:DIR); this "
                "export is not one: use --state-names genai"
            )
        family(config.model_type)

    def export(
        self,
        assembly: Assembly | ModuleAssembly,
        directory: Path,
        settings: ExportSettings,
        store: WeightStore | None,
    ) -> ExtraGraphs:
        """Write transformers-js.onnx and config.json from the decode graph already in ``directory``.

        Raises:
            AttnxError: a decode state transformers.js cannot hold (why, in words).
        """
        section = layout_of(assembly).describe()
        if section.context:
            raise AttnxError(f"--state-names {RUNTIME}: its decoder needs an encoder's output at every step")
        config = hf_config(assembly.module)
        assert isinstance(assembly, ModuleAssembly) and assembly.adapted is not None, "check() refuses others"
        numbers = layer_numbers(assembly.adapted)
        state = genai_state(section, state_names(config.model_type, numbers))
        parts = family(config.model_type).conv_parts
        if parts is not None:
            state = split_conv(state, section, parts(config))
        decode = onnx.load(str(directory / DECODE_FILE), load_external_data=False)
        proto = decoder_layout(decode, section, state, BATCH)
        save_onnx(proto, directory / DECODER_FILE)
        (directory / HF_CONFIG).write_text(js_config(config), encoding="utf-8")
        files = {self.name: DECODER_FILE, "hf_config": HF_CONFIG}
        return ExtraGraphs(files, attnx_ops(proto), GenaiSection(state))


TRANSFORMERS_JS = TransformersJsDecoder()
