"""What the hybrid adapter knows about one Hugging Face architecture, and what all of them share.

An :class:`Architecture` is declared once per ``model_type`` (``qwen.py``, ``kimi.py``,
``minimax.py``): the classes ``--from hf:DIR`` loads, the whole-model classes the adapter wraps
(:class:`attnx.adapters.hf_hybrid.model.HybridModel`), and per HF layer class the attnx module that
replaces it. Shared code keys on these declarations, never on an architecture's name.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from attnx.adapters.hf_hybrid.attention import FullAttention, no_positions
from attnx.adapters.hf_hybrid.model import HybridModel, convert_layers
from attnx.errors import AttnxError

LAYER_TYPES = ("linear_attention", "full_attention")
# Rotary types whose frequencies HF recomputes from the input length at every forward (dynamic_rope_update)
RESCALED_ROPE = ("dynamic", "longrope")


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One ``model_type`` the adapter exports.

    Attributes:
        model_type: ``config.json``'s ``model_type``.
        config_class: the transformers config class ``--from`` reads it with.
        classes: the model classes ``--from`` loads, best first (``architectures`` picks one).
        models: the whole-model classes the adapter wraps (causal LM, text model).
        layers: HF layer class -> the attnx module made from it (same parameters).
        untraceable: HF classes that cannot be exported as they are (refused if left unconverted).
        rotary: the model's rotary embedding class (its cos/sin for positions), which the attention
            layers of a converted model use to step on their own; None: the model has no positions
            (Kimi Linear, Mamba2). A model built without its rotary module (Granite 4.0-H's
            ``position_embedding_type`` null) has none either.
        check: refuses, by name, the architecture's own options the adapter does not reproduce
            (after :func:`check_config`'s shared ones).
        mask_by_layer_type: the model takes a mapping layer type -> mask (the hybrids); False: one 2D
            padding mask (Mamba2, which has only one layer type).
        layer_types: the config's ``layer_types`` the adapter reproduces (Nemotron-H's blocks add
            ``mlp`` and ``moe``, which hold no token mixer).
        loaded: runs on the model ``--from`` loads (eval mode) before anything traces or runs it: RWKV's
            inference rescaling, which HF's first eval forward would otherwise do in place mid-export.
        prepare: runs on the whole model (the walk's private copy) before its layers are converted, to
            record what a layer's converter needs from the model around it (Zamba2's call sites).
        longest: the longest sequence (prompt and generated tokens) the adapted model reproduces exactly,
            from the config, below its positions' reach (Qwen4-Exp's indexer budget, past which HF's
            indexer drops keys; RecurrentGemma's attention window); None: no limit of the architecture's own.
        windowed: the layer type the config's ``sliding_window`` applies to, refused unless in
            ``layer_types`` (Lara Mini's "sliding_attention"), else adapted as attention over every earlier
            token, which equals HF's local attention up to the window, where ``longest`` caps the export
            (RecurrentGemma's); None: the full attention layers (MiniMax), so a window is refused.
        leaky_padding: HF's forward lets left-padded tokens reach the real ones (RecurrentGemma's
            recurrent blocks and RWKV's layers take no mask, xLSTM's model ignores it); the adapter masks
            them (a padded row equals the row alone), so on a padded batch it matches HF's forward of each row
            alone, not HF's padded forward. Padding after a row's real tokens reaches none of them and runs
            unmasked, as in HF.
        whole: replaces the whole model (its layers converted) with a module of the same parameters whose
            forward traces where HF's would not (xLSTM's, which chunks long inputs behind a Python length
            comparison); None: HF's forward runs. (Where HF's model drops the padding mask, its layers are
            handed it: :class:`~attnx.adapters.hf_hybrid.model.HandedPadding`.)
    """

    model_type: str
    config_class: str
    classes: tuple[str, ...]
    models: tuple[type, ...]
    layers: Mapping[type, Callable[[nn.Module], nn.Module]]
    untraceable: tuple[type, ...]
    rotary: type | None
    check: Callable[[Any], None] | None = None
    mask_by_layer_type: bool = True
    layer_types: tuple[str, ...] = LAYER_TYPES
    prepare: Callable[[nn.Module], None] | None = None
    longest: Callable[[Any], int | None] | None = None
    windowed: str | None = None
    leaky_padding: bool = False
    whole: Callable[[nn.Module], nn.Module] | None = None
    loaded: Callable[[nn.Module], None] | None = None

    def check_config(self, config: Any) -> None:
        """Refuse, by name, the options of ``config`` that the adapter does not reproduce.

        Raises:
            AttnxError: see :func:`check_config` and the architecture's own ``check``.
        """
        check_config(config, self.model_type, self.layer_types, self.windowed)
        if self.check is not None:
            self.check(config)

    def use_torch_fallbacks(self) -> None:
        """Make the architecture's modeling module call its own pure-torch functions, for this process.

        transformers binds flash-linear-attention's (or causal-conv1d's) kernels in their place at import
        when those libraries are installed (``use_kernel_func_from_hub_with_fallback``: Qwen's
        ``torch_chunk_gated_delta_rule``, Kimi's ``chunk_kimi_delta_attention``, the short convolutions);
        they need a GPU, and HF's torch path is the reference attnx's parity is checked against.
        """
        modeling = sys.modules[self.models[0].__module__]
        for name, value in list(vars(modeling).items()):
            # HF's kernel-or-fallback wrappers are functools.wraps of the module's own torch function
            if getattr(value, "__module__", None) == modeling.__name__ and hasattr(value, "__wrapped__"):
                setattr(modeling, name, inspect.unwrap(value))

    def convert(self, module: nn.Module) -> nn.Module | None:
        """The attnx replacement of a whole model or of one layer of this architecture, or None."""
        if isinstance(module, self.models):
            self.check_config(module.config)
            if self.prepare is not None:
                self.prepare(module)
            converted = convert_layers(module, self.layers)
            if self.whole is not None:
                converted = self.whole(converted)
            rotary = next((m for m in module.modules() if self.rotary and isinstance(m, self.rotary)), None)
            for layer in converted.modules():
                if isinstance(layer, FullAttention):
                    layer.rotary = no_positions if rotary is None else rotary.forward
            # the model's mask mapping: its layer types and the two mask kinds (Falcon-H1's "hybrid" layers
            # read both)
            kinds = [*module.config.layer_types, *LAYER_TYPES] if self.mask_by_layer_type else None
            return HybridModel(converted, kinds)
        make = self.layers.get(type(module))
        return None if make is None else make(module)


def check_config(
    config: Any, model_type: str, layer_types: tuple[str, ...], windowed: str | None = None
) -> None:
    """Refuse, by name, the options of a hybrid config that the adapter does not reproduce.

    Raises:
        AttnxError: a rotary type HF rescales per forward, a layer type not in ``layer_types``, or a
            sliding window on the full attention layers (MiniMax's ``sliding_window``; not where it
            applies to its own layer type ``windowed``, which ``layer_types`` accepts or refuses).
    """
    if windowed is None and getattr(config, "sliding_window", None) is not None:
        raise AttnxError(
            f"{model_type} with sliding_window={config.sliding_window}: attnx's full attention layers attend "
            "to every earlier token; export a config with sliding_window null"
        )
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope in RESCALED_ROPE:
        raise AttnxError(
            f"{model_type} with rope_parameters.rope_type='{rope}': Hugging Face recomputes its rotary "
            "frequencies from the input length at every forward, which an exported graph cannot follow; "
            f"attnx exports the other rotary types (not {', '.join(RESCALED_ROPE)})"
        )
    # a config without layer_types has one kind of layer (xLSTM), which its architecture converts
    unknown = sorted(set(getattr(config, "layer_types", None) or ()) - set(layer_types))
    if unknown:
        window = (
            f" (they attend to the last sliding_window={config.sliding_window} keys; attnx's attention and "
            "its KV cache keep every earlier key)"
            if windowed in unknown
            else ""
        )
        raise AttnxError(
            f"{model_type} with layer_types {', '.join(unknown)}{window}: attnx adapts "
            f"{', '.join(layer_types)} layers"
        )
