"""A user's ``nn.Module`` as the torch side of an export (``attnx.export_module``).

:func:`build_module` is the module path's build step: it refuses a module in training mode and
example inputs of the wrong kind, applies the registered adapters (:mod:`attnx.adapters.apply`),
derives the graph's TensorSpecs from the example inputs and traces the adapted module once with
``torch.export``. That program is what ``model.onnx`` is made from and what the export stores as
its reference (``reference.json`` + ``reference.safetensors``, :mod:`attnx.exporter.reference`: data
that loads without unpickling), so ``attnx verify`` re-checks it in a fresh process without the
user's code: :func:`load_reference` imports the plugins of the variants whose ``attnx::`` ops it
calls (through the registry) and loads it.

Inputs and outputs:

* example inputs are a dict name -> tensor (the forward is called with keywords) or a tuple of
  tensors (positionally; named after the forward's parameters). A dict's None, bool, int, float
  and str values are constants passed at every call (``use_cache=False``), not graph inputs.
  Dynamic axes are ``{input: {dim: axis name}}``; by default dim 0 is "batch" and dim 1 (if any)
  "seq". Integer inputs are drawn from [0, example max + 1) by parity checks, bool inputs are
  key-padding masks.
* outputs are the forward's return value flattened: a tensor is "output"; a dict (or an HF-style
  ``ModelOutput``, whose None fields are dropped) gives its keys in order, a tuple/list its
  indices ("output.0", "output.1"), nested values join their path with "." ("hidden_states.1").
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import io
import logging
import sys
import sysconfig
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attnx.adapters.apply import adapter_summary, apply_adapters
from attnx.domains import DOMAIN
from attnx.errors import AttnxError, first_line
from attnx.exporter.assemble import distinct_ops, loosest_tolerance
from attnx.exporter.manifest import Manifest, ModuleSection
from attnx.exporter.reference import load_program, save_program
from attnx.exporter.repeat import LayerStack, find_stack
from attnx.exporter.signature import FlatModule, dynamic_shapes, input_specs, output_specs
from attnx.exporter.store import WeightStore
from attnx.models.spec import TensorSpec
from attnx.registry import Registry, get_registry

if TYPE_CHECKING:
    from attnx.ops import AttentionOp, VariantImpl
    from attnx.variant import Variant

DTYPES = {torch.float32: "fp32", torch.float16: "fp16"}
_INTERNAL = (str(Path(torch.__file__).parent), str(Path(__file__).parents[1]))


@dataclasses.dataclass(frozen=True)
class ModuleSource:
    """What ``attnx.export_module`` was given.

    ``entry``: "pkg.mod:factory" when it came from ``attnx export --module`` (None from Python);
    ``notes``: what the adapter that loaded it (``--from``) had to fix, for the manifest;
    ``tokenizer``: the ``tokenizer.json`` saved beside a loaded model (``--from``), which the export carries.
    """

    module: nn.Module
    example: Mapping[str, Any] | Sequence[Any]
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None
    entry: str | None = None
    notes: tuple[str, ...] = ()
    tokenizer: Path | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.module, nn.Module):
            given = f"{self.entry}() returned" if self.entry else "export_module was given"
            raise AttnxError(f"{given} a {type(self.module).__name__} where a torch.nn.Module belongs")


def from_entry(entry: str) -> ModuleSource:
    """The module ``attnx export --module ENTRY`` exports: ``ENTRY`` is "pkg.mod:factory" (importable,
    the current directory included) or "path/to/file.py:factory"; ``factory()`` returns
    ``(module, example_inputs)`` or ``(module, example_inputs, dynamic_axes)``.

    Raises:
        AttnxError: a malformed entry, a module or attribute that cannot be found, user code that raises
            (importing it or calling the factory: "your factory raised X: message", with the user's own
            frames), or a factory that returns something else.
    """
    target, _, name = entry.partition(":")
    if not target or not name:
        raise AttnxError(f"--module takes pkg.mod:factory or path/to/file.py:factory, not '{entry}'")
    try:
        if target.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(target).stem, target)
            if spec is None or not Path(target).is_file():
                raise FileNotFoundError(f"no file {target}")
            module = importlib.util.module_from_spec(spec)
            with user_code(f"importing '{target}' for --module", keep=(ImportError,)):
                spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")  # as `python -m` would: the current directory's modules
            with user_code(f"importing '{target}' for --module", keep=(ImportError,)):
                module = importlib.import_module(target)
    except (ImportError, FileNotFoundError) as exc:
        why = first_line(exc, with_type=True)
        raise AttnxError(f"cannot import '{target}' for --module: {why}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise AttnxError(f"'{target}' has no callable '{name}' for --module")
    with user_code(f"your factory {entry}"):
        made = factory()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise AttnxError(
            f"{entry}() must return (module, example_inputs) or (module, example_inputs, dynamic_axes), "
            f"not {type(made).__name__}"
        )
    return ModuleSource(*made, entry=entry)


@contextlib.contextmanager
def user_code(what: str, keep: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Run a user's code: anything it raises (``sys.exit`` included; not Ctrl-C, an AttnxError, nor the
    ``keep`` types the caller reports) becomes one line, "WHAT raised X: message (file:line in function,
    ...)", naming only the user's own frames."""
    try:
        yield
    except (KeyboardInterrupt, AttnxError, *keep):
        raise
    except BaseException as exc:  # a user's code may raise anything, SystemExit included
        frames = _user_frames(exc)
        at = f" ({', called from '.join(frames[::-1][:3])})" if frames else ""
        raise AttnxError(f"{what} raised {first_line(exc, with_type=True, limit=200)}{at}") from None


def from_source(source: str, registry: Registry | None = None) -> ModuleSource:
    """The module ``attnx export --from SCHEME:PATH`` exports: loaded by the adapter whose ``sources``
    name SCHEME (``AdapterImpl.load``) from the local directory PATH, with the directory's
    ``tokenizer.json`` if it has one.

    Raises:
        AttnxError: a malformed source, a scheme no adapter loads, an adapter whose library is not
            installed, or the adapter's own refusal of PATH.
    """
    registry = registry or get_registry()
    scheme, _, path = source.partition(":")
    schemes = {s: a for a in registry.adapters.values() for s in a.sources}
    if not path or scheme not in schemes:
        known = ", ".join(f"{s}:DIR" for s in sorted(schemes)) or "none: no adapter loads saved models"
        raise AttnxError(f"--from takes SCHEME:PATH with a scheme an adapter loads ({known}), not '{source}'")
    adapter = schemes[scheme]
    if adapter.library_version() is None:
        raise AttnxError(
            f"--from {scheme}: needs {adapter.library}; install it: {adapter.install_hint()} "
            f"(adapter {adapter.name})"
        )
    load = adapter.load().load
    if load is None:
        raise AttnxError(f"adapter {adapter.name} declares source '{scheme}' but loads nothing")
    module, example, dynamic_axes, notes = load(Path(path))
    tokenizer = Path(path) / "tokenizer.json"
    return ModuleSource(
        module,
        example,
        dynamic_axes,
        entry=source,
        notes=tuple(notes),
        tokenizer=tokenizer if tokenizer.is_file() else None,
    )


@dataclasses.dataclass
class ModuleAssembly:
    """The torch side of a module export, with the attributes :class:`attnx.exporter.assemble.Assembly`
    has for the steps they share (``module``, ``dtype``, ``impls``, ``ops``, ``inputs``, ``outputs``,
    ``tolerance``, ``tensors``, ``every_tensor_exported``).

    ``module`` (graph inputs positionally -> the flattened outputs) is the parity reference: the
    module as given at export (the library's own forward), the stored program at verify.
    ``adapted`` is the module after the adapters (None when loaded from an export), ``program``
    its ``torch.export`` program, ``example`` the example inputs in graph order.
    """

    module: nn.Module
    adapted: nn.Module | None
    program: Any
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    example: tuple[torch.Tensor, ...]
    variants: list[Variant]
    impls: dict[str, VariantImpl]
    section: ModuleSection
    dtype: str = "fp32"
    keywords: bool = True  # the forward takes the inputs as keywords (example inputs were a dict)
    constants: dict[str, Any] = dataclasses.field(default_factory=dict)  # keyword constants of every call
    layers: tuple[nn.Module, str] | None = None  # the adapted module's layer list, as an adapter named it

    every_tensor_exported = False  # model.onnx need not hold every tensor of the program

    @property
    def ops(self) -> list[AttentionOp]:
        return distinct_ops(self.impls.values())

    def layer_stack(self) -> LayerStack | None:
        """The adapted module's layer stack worth stamping (:mod:`attnx.exporter.repeat`), its kinds read
        from the program (traced from ``FlatModule(adapted)``, whose attribute ``module`` it is); None
        when loaded from an export."""
        if self.adapted is None:
            return None
        return find_stack(self.adapted, self.program, "module", named=self.layers)

    def tensors(self) -> dict[str, Any]:
        """The program's tensors by name (its state and constants), for the weight check."""
        return {**self.program.state_dict, **self.program.constants}

    def tolerance(self, dtype: str | None = None) -> dict[str, float]:
        """The loosest parity tolerance of the variants the module calls, in ``dtype`` (default: its own)."""
        return loosest_tolerance(self.variants, dtype or self.dtype)

    def sizes(self) -> dict[str, int]:
        """The example length of each named axis."""
        return {
            axis: size
            for spec, tensor in zip(self.inputs, self.example, strict=True)
            for axis, size in zip(spec.axes, tensor.shape, strict=True)
            if isinstance(axis, str)
        }


class ProgramModule(nn.Module):
    """A loaded ``torch.export`` program as a module the runners can move, cast and put in eval mode."""

    def __init__(self, program: Any) -> None:
        super().__init__()
        self.graph = program.module()

    def train(self, mode: bool = True) -> ProgramModule:
        # An exported module refuses train()/eval(); its graph has no training behaviour to switch.
        self.training = mode
        return self

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.graph(*inputs)


def module_dtype(module: nn.Module) -> str:
    """ "fp32" or "fp16": the dtype of the module's floating-point parameters.

    Raises:
        AttnxError: parameters of another or of mixed floating dtypes.
    """
    found = {p.dtype for p in module.parameters() if p.is_floating_point()}
    if len(found) > 1 or not found <= set(DTYPES):
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in found))
        raise AttnxError(f"the module's parameters are {names}; export a float32 or a float16 module")
    return DTYPES[found.pop()] if found else "fp32"


def build_module(source: ModuleSource, registry: Registry | None = None) -> ModuleAssembly:
    """Adapt and trace ``source.module`` (the module path's build step).

    Raises:
        AttnxError: not a module, a module in training mode, bad example inputs, an unsupported
            third-party module, a forward that cannot be traced (naming the first failing call),
            or a module that calls no attnx op.
    """
    registry = registry or get_registry()
    module = source.module
    kind = f"{type(module).__module__}.{type(module).__qualname__}"
    training = [name or type(module).__name__ for name, m in module.named_modules() if m.training]
    if training:
        raise AttnxError(
            f"{kind} is in training mode ({training[0]}: dropout and batch statistics would change every "
            "run); call .eval() before exporting"
        )
    inputs, example, keywords, constants = input_specs(module, source.example, source.dynamic_axes)
    dtype = module_dtype(module)
    adapted = apply_adapters(module, registry)
    flat = FlatModule(adapted.module, [s.name for s in inputs], keywords, constants)
    program = trace_module(flat, example, inputs, kind)
    variants = _variants(program, registry, kind)
    section = ModuleSection(
        entry=source.entry,
        module_class=kind,
        program="reference",
        tensors="reference_tensors",
        adapters=adapted.adapters,
        variants=[v.name for v in variants],
        notes=list(source.notes),
        lengths=adapted.lengths,
    )
    return ModuleAssembly(
        module=FlatModule(module, [s.name for s in inputs], keywords, constants, reference=True),
        adapted=adapted.module,
        program=program,
        inputs=inputs,
        outputs=output_specs(program, inputs, flat.last.names),
        example=example,
        variants=variants,
        impls={v.name: v.load() for v in variants},
        section=section,
        dtype=dtype,
        keywords=keywords,
        constants=constants,
        layers=adapted.layers,
    )


def trace_module(
    flat: FlatModule, example: tuple[torch.Tensor, ...], inputs: Sequence[TensorSpec], kind: str
) -> Any:
    """``torch.export`` of the adapted module, every named axis dynamic.

    Raises:
        AttnxError: the forward cannot be traced, naming the first failing call (an AttnxError an
            adapter raised while tracing is passed on as it is).
    """
    try:
        # Under no_grad: an inference graph. With grad on, a custom autograd.Function's forward (Hugging
        # Face Reformer's reversible layers) is traced as a nested grad-mode region, not inline.
        with quiet_torch(), unwrap_interrupt(), torch.no_grad():
            return torch.export.export(flat, example, dynamic_shapes=dynamic_shapes(inputs), strict=False)
    except Exception as exc:
        raise untraceable(exc, kind) from None


@contextlib.contextmanager
def unwrap_interrupt() -> Iterator[None]:
    """Re-raise Ctrl-C that torch.onnx or torch.export wrapped: a KeyboardInterrupt inside their lazy
    imports surfaces as an exporter error caused by an AttributeError whose context is the interrupt."""
    try:
        yield
    except Exception as exc:
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise KeyboardInterrupt from exc
        raise


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence torch.export's and torch.onnx's prints, warnings and logs (a failed trace dumps its
    graph); attnx reports its own progress and errors."""
    disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            with contextlib.redirect_stderr(io.StringIO()):
                yield
    finally:
        logging.disable(disabled)


def untraceable(exc: BaseException, kind: str) -> AttnxError:
    """The one-line error of a failed trace: the AttnxError in its causes, else the error's first line
    and the first call outside torch and attnx that was running when it was raised."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, AttnxError):
            return cause
        cause = cause.__cause__ or cause.__context__
    where = _quoted_call(str(exc)) or _user_frame(exc)
    at = f" at {where}" if where else ""
    return AttnxError(
        f"cannot trace {kind}.forward with torch.export{at}: {first_line(exc, with_type=True, limit=200)}; "
        "make that call traceable (no data-dependent Python control flow, no untraceable extension kernels)"
    )


def _quoted_call(message: str) -> str | None:
    """torch.export's own "The following call raised this error:" location, when it gives one."""
    lines = message.splitlines()
    for i, line in enumerate(lines):
        if "The following call raised this error" in line and i + 2 < len(lines):
            return f"{lines[i + 1].strip()}: {lines[i + 2].strip()}"
    return None


def _user_frame(exc: BaseException) -> str | None:
    """The innermost frame of the traceback outside torch and attnx ("file:line in func: code")."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_INTERNAL)]
    if not frames:
        return None
    frame = frames[-1]
    return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}: {(frame.line or "").strip()}'


def _user_frames(exc: BaseException) -> list[str]:
    """The frames of the traceback in the user's own files ("file:line in func"): outside torch, attnx,
    Python's library and the installed packages, outermost first."""
    library = (*_INTERNAL, sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], "<")
    frames = traceback.extract_tb(exc.__traceback__)
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames if not f.filename.startswith(library)]


def _variants(program: Any, registry: Registry, kind: str) -> list[Variant]:
    """The variants whose ops the program calls, in order of first use.

    Raises:
        AttnxError: the program calls no attnx op.
    """
    owners: dict[Any, Variant] = {}
    for variant, op in registry.op_index():
        owners.setdefault(op.overload, variant)
    calls = [n.target for n in program.graph.nodes if n.op == "call_function"]
    used = list(dict.fromkeys(t for t in calls if getattr(t, "namespace", None) == DOMAIN))
    if not used:
        raise AttnxError(
            f"{kind} calls no attnx op, so its attention is not attnx's: build it from attnx layers or "
            f"use a library an adapter converts (adapters: {adapter_summary(registry)})"
        )
    missing = [str(op) for op in used if op not in owners]
    if missing:
        raise AttnxError(f"{kind} calls {', '.join(missing)}, which no installed variant provides")
    return list({owners[op].name: owners[op] for op in used}.values())


def save_reference(assembly: ModuleAssembly, directory: Path, store: WeightStore | None) -> dict[str, str]:
    """Write the adapted module's program into ``directory`` (what ``store`` holds read from there); returns
    its manifest file keys -> names."""
    program, tensors = save_program(assembly.program, directory, store)
    return {assembly.section.program: program, str(assembly.section.tensors): tensors}


def load_reference(
    manifest: Manifest, file: Callable[[str], Path], registry: Registry | None = None
) -> ModuleAssembly:
    """The stored reference of the module export ``manifest`` describes (``file``: the path of a manifest
    file key, :meth:`attnx.exporter.directory.ExportDir.file`), its variants' plugins imported first.

    Raises:
        AttnxError: a variant that is not installed, or a program that attnx does not load.
    """
    registry = registry or get_registry()
    section = manifest.module
    variants = [registry.variant(name) for name in section.variants]
    impls = {v.name: v.load() for v in variants}  # registers the attnx:: torch ops the program calls
    program = load_program(file(section.program), file(str(section.tensors)), file("weights"))
    return ModuleAssembly(
        module=ProgramModule(program),
        adapted=None,
        program=program,
        inputs=list(manifest.inputs),
        outputs=list(manifest.outputs),
        example=(),
        variants=variants,
        impls=impls,
        section=section,
        dtype=manifest.dtype,
    )
