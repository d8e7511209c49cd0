"""Where an export's torch model comes from: one :class:`Source` per job (``ExportJob.source``).

:class:`RegisteredModel` builds a registered model from the job's recipe (variants, options, seed,
checkpoint); :class:`UserModule` adapts and traces a user's module (``attnx.export_module``,
``attnx export --module`` or ``--from``). The export steps ask the source and never which kind it
is: the ops known before the build, its own refusals, its memory estimate, the build, the graph's
shapes and trace, and what the manifest records so that verify rebuilds the reference (read back by
:func:`attnx.exporter.reopen.source_for` when the export is reopened).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import onnx

from attnx.adapter import Lengths
from attnx.checkpoint import load_checkpoint
from attnx.errors import AttnxError
from attnx.exporter.assemble import Assembly, assemble, every_op
from attnx.exporter.budget import (
    GiB,
    available_memory,
    check_needs,
    export_weight_copies,
    meta_build,
    ort_weight_copies,
    require_memory,
    shrink_hint,
    weights_within,
)
from attnx.exporter.manifest import MODULE_MODEL
from attnx.exporter.module import ModuleAssembly, ModuleSource, build_module, save_reference, trace_module
from attnx.exporter.repeat import NotStampable, Stamping
from attnx.exporter.signature import FlatModule
from attnx.exporter.store import WeightStore, shares_weights
from attnx.exporter.targets import check_target
from attnx.exporter.trace import export_onnx, export_shapes, to_onnx
from attnx.models.factory import configure
from attnx.models.spec import ModelSpec, TensorSpec
from attnx.ops import AttentionOp
from attnx.recipes import ExportSettings, Recipe
from attnx.registry import get_registry

if TYPE_CHECKING:
    from attnx.variant import Variant

Progress = Callable[[str], None]
Shapes = tuple[list[TensorSpec], list[TensorSpec], dict[str, int]]


class Source(Protocol):
    """What the export steps ask of the job's torch model, before and after it is built."""

    known: bool  # whether :meth:`ops` knows every op before the build

    def ops(self) -> list[AttentionOp]:
        """The attnx ops the job's graphs may hold, as far as known before the build."""

    def check(self) -> None:
        """Refuse, before any work, settings this source does not take (one-line AttnxError)."""

    def check_layers(self, check: Callable[[ModelSpec, Variant], None]) -> None:
        """Run ``check`` on the registered model and variant (a module's layers are checked when its
        graphs are made)."""

    def check_memory(self) -> int:
        """Refuse an export that cannot fit in memory, before the build (one-line AttnxError); returns the
        bytes of the model's weights."""

    def build(self, report: Progress) -> Assembly | ModuleAssembly:
        """The torch model to export."""

    def shapes(self, assembly: Any) -> Shapes:
        """The graph's inputs, outputs and example length per named axis."""

    def trace(self, assembly: Any, shapes: Shapes, store: WeightStore | None) -> onnx.ModelProto:
        """model.onnx as torch.onnx exports it, attnx ops as bare ``attnx::`` nodes (its weights in
        ``store``'s file when given)."""

    def accepted_lengths(self, assembly: Any) -> Lengths | None:
        """The sequence lengths the model accepts, for the default verify lengths (None: any)."""

    def reference(
        self, assembly: Any, directory: Path, store: WeightStore | None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The manifest fields that say how verify rebuilds the torch reference, and the files (key ->
        name) written into ``directory`` for it (what ``store`` holds is not written again)."""


class RegisteredModel:
    """A registered model with its variants, built from the job's recipe: seeded, or a checkpoint's
    weights (``checkpoint``, else the recipe's ``[export] checkpoint``); verify rebuilds it by name from
    the manifest's configs and the saved weights."""

    known = True

    def __init__(self, plan: Recipe, checkpoint: Path | None = None) -> None:
        self.plan, self.settings = plan, plan.export
        self.checkpoint = checkpoint or self.settings.checkpoint

    def ops(self) -> list[AttentionOp]:
        names = [n for n in (self.plan.variant, self.plan.cross_variant) if n]
        return [op for _, op in get_registry().op_index(names, decode=self.settings.decode)]

    def check(self) -> None:
        """Nothing beyond the recipe's own checks."""

    def check_layers(self, check: Callable[[ModelSpec, Variant], None]) -> None:
        registry = get_registry()
        check(registry.model(self.plan.model), registry.variant(self.plan.variant))

    def _assemble(self) -> Assembly:
        plan, settings = self.plan, self.settings
        return assemble(
            plan.variant,
            plan.model,
            plan.options,
            settings.seed,
            cross_variant=plan.cross_variant,
            dtype=settings.dtype,
        )

    def check_memory(self) -> int:
        """The model is built on torch's meta device (no memory) to count its weights (after a floor
        read from its config alone), and the parity check's largest case is costed; returns the bytes of
        its weights.

        Raises:
            AttnxError: the estimate exceeds the memory available, naming both and the fix.
        """
        plan, settings, checks = self.plan, self.settings, self.plan.verify
        what, available = f"exporting this {plan.model}", available_memory()
        fix = shrink_hint(plan.options, bool(settings.example_lengths), checks.batch)
        registry, cross = get_registry(), plan.cross_variant
        spec, config, _ = configure(registry, plan.variant, plan.model, plan.options, cross_variant=cross)
        if spec.weights is not None:  # weights no machine holds are refused before the model is built at all
            floor = spec.weights(config) * (2 if settings.dtype == "fp16" else 4)
            require_memory(
                int(self._copies(floor) * floor),
                f"{what} (at least {floor / GiB:.2f} GiB of weights)",
                fix,
                available,
            )
        copies = self._copies(available or 0)  # as many as a model that fills the memory would hold

        def refusal(counted: int) -> AttnxError:
            return AttnxError(
                f"{what} needs more than {copies * counted / GiB:.1f} GiB of memory, but "
                f"{available / GiB:.1f} GiB is available ({copies:g} copies of its weights, "
                f"{counted / GiB:.2f} GiB each when building stopped); {fix}"
            )

        limit = None if available is None else int(available // copies)
        with weights_within(limit, refusal), meta_build(f"this {plan.model}"):
            assembly = self._assemble()
        tensors = [*assembly.module.parameters(), *assembly.module.buffers()]  # buffers: e.g. LSH rotations
        weights = sum(t.numel() * t.element_size() for t in tensors)
        needed = self._needs(assembly, weights, self._copies(weights))
        require_memory(needed, f"{what} ({weights / GiB:.2f} GiB of weights)", fix, available)
        return weights

    def _copies(self, weights: int) -> float:
        return export_weight_copies(
            shares_weights(self.settings.shared_weights, weights), self.plan.verify.enabled
        )

    def _needs(self, assembly: Assembly, weights: int, copies: float) -> int:
        """The cost model's bytes for the export's trace and the parity check's largest case."""
        checks = self.plan.verify
        roles = {"self": (assembly.variant, assembly.variant_config)}
        if assembly.cross_variant is not None:
            roles["cross"] = (assembly.cross_variant, assembly.cross_variant_config)
        traced = export_shapes(assembly, self.settings)[2]  # the export's trace runs at its example lengths
        batch = max(traced.get("batch", 1), checks.batch if checks.enabled else 1)
        lengths = [n for axis, n in traced.items() if axis != "batch"]
        seq = max([*lengths, *(checks.lengths() if checks.enabled else ())])
        return check_needs(
            assembly.model,
            assembly.model_config,
            roles,
            weights_bytes=weights,
            weight_copies=copies,
            batch=batch,
            seq=seq,
        )

    def build(self, report: Progress) -> Assembly:
        plan, settings = self.plan, self.settings
        assembly = self._assemble()
        parameters = sum(p.numel() for p in assembly.module.parameters())
        report(
            f"built {plan.model} with {plan.variant} attention ({parameters / 1e6:.2f}M parameters, "
            f"{settings.dtype}, seed {settings.seed})"
        )
        if self.checkpoint is not None:
            load_checkpoint(assembly.module, self.checkpoint)
            report(f"loaded weights from {self.checkpoint}")
        return assembly

    def shapes(self, assembly: Assembly) -> Shapes:
        """The model's inputs and outputs with the axes the settings fix made static (see
        :func:`attnx.exporter.trace.export_shapes`)."""
        return export_shapes(assembly, self.settings)

    def trace(self, assembly: Assembly, shapes: Shapes, store: WeightStore | None) -> onnx.ModelProto:
        return to_onnx(assembly, self.settings.opset, *shapes, store=store)

    def accepted_lengths(self, assembly: Assembly) -> None:
        return None

    def reference(
        self, assembly: Assembly, directory: Path, store: WeightStore | None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The model, its variants and their configs (rebuilt by name); no file beyond the weights."""
        cross = assembly.cross_variant
        fields = {
            "variant": assembly.variant.name,
            "variant_config": assembly.variant_config.to_dict(),
            "model": assembly.model.name,
            "model_config": assembly.model_config.to_dict(),
            "cross_variant": cross.name if cross else None,
            "cross_variant_config": assembly.cross_variant_config.to_dict() if cross else None,
            "recipe": self.plan.name or None,
        }
        return fields, {}


class UserModule:
    """A user's module, adapted and traced once with torch.export; that program is model.onnx's source
    and, stored in the export, the reference verify loads without the user's code."""

    known = False  # its ops are known once it is traced; the lowering refuses one without a body

    def __init__(self, given: ModuleSource, settings: ExportSettings, verified: bool) -> None:
        self.given, self.settings, self.verified = given, settings, verified

    def ops(self) -> list[AttentionOp]:
        return []

    def check(self) -> None:
        settings = self.settings
        if settings.example_lengths or settings.dynamic_axes is not None:
            raise AttnxError(
                "a module export takes its example lengths and dynamic axes from its example inputs and "
                "dynamic_axes, not from export.example_lengths/export.dynamic_axes"
            )

    def check_layers(self, check: Callable[[ModelSpec, Variant], None]) -> None:
        """Nothing before the trace."""

    def check_memory(self) -> int:
        """Already built (a Hugging Face checkpoint memory-mapped, not yet read): the copies an export adds
        are counted, no cost model (tied weights once)."""
        tensors = {p.data_ptr(): p for p in self.given.module.parameters()}.values()
        weights = sum(p.numel() * p.element_size() for p in tensors)
        shared = shares_weights(self.settings.shared_weights, weights)
        copies = export_weight_copies(shared, False)
        if self.verified:  # its caller holds the module: ONNX Runtime's copies come on top
            copies += ort_weight_copies(shared)
        require_memory(
            int(copies * weights),
            f"exporting this module ({weights / GiB:.2f} GiB of weights, {copies:g} copies at once)",
            "export it on a machine with more memory, or without verifying (--no-verify)",
        )
        return weights

    def build(self, report: Progress) -> ModuleAssembly:
        report("applying adapters and tracing the module with torch.export")
        built = build_module(self.given)
        adapters = ", ".join(built.section.adapters) or "none"
        report(f"traced {built.section.module_class} ({built.dtype}, adapters: {adapters})")
        return built

    def shapes(self, assembly: ModuleAssembly) -> Shapes:
        """From its example inputs (traced already)."""
        return assembly.inputs, assembly.outputs, assembly.sizes()

    def trace(self, assembly: ModuleAssembly, shapes: Shapes, store: WeightStore | None) -> onnx.ModelProto:
        """The program traced when the module was built, exported; its ops, known now, are checked
        against the target."""
        inputs, outputs, _ = shapes
        ops = every_op(assembly)  # a module may call any op of its variants, a step op included
        proto = self._stamped(assembly, inputs, outputs, ops, store)
        if proto is None:
            proto = export_onnx(assembly.program, (), ops, self.settings.opset, inputs, outputs, store=store)
        check_target(self.settings.target, self.settings.lowering, every_op(assembly))
        return proto

    def _stamped(
        self,
        assembly: ModuleAssembly,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        ops: list[AttentionOp],
        store: WeightStore | None,
    ) -> onnx.ModelProto | None:
        """model.onnx converted from the module with its layer stack's prefix, the later layers stamped
        (:mod:`attnx.exporter.repeat`); None for a module without a stack worth it, or whose prefix does not
        trace or stamp."""
        stack = assembly.layer_stack()
        if stack is None:
            return None
        names = [s.name for s in inputs]
        flat = FlatModule(assembly.adapted, names, assembly.keywords, assembly.constants)
        try:
            with stack.traced_prefix():
                program = trace_module(flat, assembly.example, inputs, assembly.section.module_class)
                stamping = Stamping(stack, flat, inputs, outputs)
                return export_onnx(
                    program, (), ops, self.settings.opset, inputs, outputs, store=store, stamping=stamping
                )
        except (NotStampable, AttnxError):  # the whole module converts, or says why, as before
            return None

    def accepted_lengths(self, assembly: ModuleAssembly) -> Lengths | None:
        return assembly.section.lengths

    def reference(
        self, assembly: ModuleAssembly, directory: Path, store: WeightStore | None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The module's section and its stored program (its tensors that ``store`` holds read from there);
        the manifest names its first variant and the model "module", with no options (its layers carry
        their own)."""
        fields = {
            "variant": assembly.variants[0].name,
            "variant_config": {},
            "model": MODULE_MODEL,
            "model_config": {},
            "module": assembly.section,
        }
        return fields, save_reference(assembly, directory, store)
