"""A module export's torch reference stored as data: loading it never unpickles and never evaluates text.

``torch.export.save``/``load`` is not safe for a directory someone else made: its archive pickles
the sample inputs (``torch.load`` retried with ``weights_only=False`` when the safe load fails) and
any tensor it marks ``use_pickle``, so a planted payload runs on load. Its JSON program is not inert
either: symbolic shapes are parsed with ``sympy.sympify`` (``eval``), ``guards_code`` is ``exec``-ed by
``ExportedProgram.module()``, names are pasted into the Python source FX generates, and a node's
target may be any ``torch`` attribute (``torch.load``, ``aten::from_file``).

So attnx stores the program as torch.export's JSON (``reference.json``, from
``torch._export.serde.serialize``) and its parameters, buffers and constants in safetensors
(``reference.safetensors``), and :func:`load_program` loads them only after :func:`check_program`
has accepted every string of the JSON: symbolic shapes in sympy's ``srepr`` form made of a few
constructors, variable names that are Python identifiers, string arguments of ops (einsum's
equation) in printable ASCII, other strings of letters, digits and ``_.+-``, tree specs of plain
tuples, lists and dicts, targets of ``aten``, ``prims`` and ``attnx`` ops (none that takes a file
name), ``operator`` and ``torch.sym_*``. Source locations and guards are dropped (the reference needs
neither); no sample inputs are stored (so no guard function is generated).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from attnx.errors import AttnxError, first_line
from attnx.exporter.store import WeightStore

PROGRAM_FILE = "reference.json"
TENSORS_FILE = "reference.safetensors"
_STATE, _CONSTANT = "state_dict:", "constants:"
# tensors file metadata: program tensor -> its name in weights.safetensors
FROM_WEIGHTS = "attnx.from_weights"
# Any string of the program but the ones checked below: names, dtypes, devices, versions.
_PLAIN = re.compile(r"[A-Za-z0-9_.+\-]{0,400}")
# Names FX turns into Python variables (a dot would assign to an attribute of a module in scope).
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}")
_IDENTIFIER_KEYS = ("name", "forward_arg_names")
# A string argument of an op (einsum's equation, a reduction or padding mode): a value the op receives, which
# FX writes into its generated source with repr(), so any printable ASCII is inert.
_ARGUMENT = re.compile(r"[ -~]{0,400}")
_ARGUMENT_KEYS = ("as_string", "as_strings")
_TARGET = re.compile(r"torch\.ops\.(aten|prims|attnx)\.\w+(\.\w+)?|_operator\.\w+|torch\.sym_\w+")
_OPS_NAMESPACES = ("aten", "prims", "attnx")
_OPERATORS = tuple((
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne", "lt",
    "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift", "getitem",
))  # fmt: skip
# sympy's srepr of a shape expression, e.g. "Mul(Integer(16), Symbol('s13', positive=True, integer=True))".
_SYMPY_TOKEN = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_]\w*)|(?P<symbol>'[A-Za-z_]\w{0,30}')|(?P<int>-?\d{1,19})|(?P<punct>[(),=]))"
)
_SYMPY_NAMES = frozenset((
    "Symbol", "Integer", "Rational", "Mul", "Add", "Max", "Min", "Mod", "Eq", "Ne", "Lt", "Le", "Gt",
    "Ge", "And", "Or", "Not", "Piecewise", "ExprCondPair", "StrictLessThan", "StrictGreaterThan",
    "LessThan", "GreaterThan", "Equality", "Unequality", "BooleanTrue", "BooleanFalse", "floor",
    "ceiling", "Abs", "oo", "Infinity", "NegativeInfinity", "True", "False", "true", "false",
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "TruncToInt", "RoundToInt", "IntTrueDiv", "Identity", "positive", "negative",
    "nonnegative", "nonpositive", "integer", "real", "finite", "commutative",
))  # fmt: skip
_SYMPY_LIMIT = 4000
_TREE_TYPES = frozenset({None, "builtins.tuple", "builtins.list", "builtins.dict"})
# Dropped before loading: text torch evaluates (guards) or that only describes the source.
_DROPPED = ("guards_code", "metadata")


def save_program(program: Any, directory: Path, store: WeightStore | None = None) -> tuple[str, str]:
    """Write ``program`` (an ``ExportedProgram``) into ``directory``; returns (program file, tensors file).

    A tensor that ``store`` (the export's shared weights file) holds is not written again: the tensors
    file's metadata names it there (:data:`FROM_WEIGHTS`), and :func:`load_program` reads it from that file.

    Raises:
        AttnxError: the program holds a constant that is not a tensor (a script object), which attnx
            cannot store without pickling it.
    """
    from safetensors.torch import save_file
    from torch._export.serde.serialize import serialize

    foreign = _foreign_op(program)
    if foreign is not None:
        raise AttnxError(
            f"the module calls {foreign}, an op outside aten, prims and attnx, which attnx can neither "
            "export nor store; write it with torch operations or an attnx op"
        )
    objects = [name for name, value in program.constants.items() if not isinstance(value, torch.Tensor)]
    if objects:
        raise AttnxError(
            f"the traced module holds {objects[0]}, a constant that is not a tensor, which attnx cannot "
            "store without pickling it; keep only tensors in the module's state"
        )
    # The program as JSON only: its tensors are written below (pickling the state into bytes, torch's
    # default, would hold a second copy of a real-size model's weights).
    light = {"serialize_state_dict": False, "serialize_constants": False, "serialize_example_inputs": False}
    document = json.loads(serialize(program, **light).exported_program)
    _drop(document)
    try:
        check_program(document, PROGRAM_FILE)
    except AttnxError as exc:  # attnx's own trace that its loader would refuse: a gap in that loader
        raise AttnxError(
            f"cannot store the traced module as data: {exc}".replace("re-export", "report it")
        ) from None
    (directory / PROGRAM_FILE).write_text(json.dumps(document), encoding="utf-8")
    tensors = {
        **{_STATE + k: v for k, v in program.state_dict.items()},
        **{_CONSTANT + k: v for k, v in program.constants.items()},
    }
    stored = {k: found.name for k, v in tensors.items() if (found := store and store.find(v.detach()))}
    # Cloned: safetensors refuses tensors that share memory (tied weights), and a reference needs no aliasing.
    save_file(
        {k: v.detach().contiguous().clone() for k, v in tensors.items() if k not in stored},
        str(directory / TENSORS_FILE),
        metadata={FROM_WEIGHTS: json.dumps(stored)} if stored else None,
    )
    return PROGRAM_FILE, TENSORS_FILE


def load_program(program_path: Path, tensors_path: Path, weights_path: Path | None = None) -> Any:
    """The ``ExportedProgram`` stored by :func:`save_program` (the plugins of its attnx ops imported first),
    the tensors its tensors file names in the export's weights file (``weights_path``) read from there.

    Raises:
        AttnxError: the JSON is not a program attnx wrote (naming the first string it refuses), or its
            tensors do not load; each with the fix (re-export).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    try:
        document = json.loads(program_path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise AttnxError(f"{program_path} is not torch.export JSON ({first_line(exc)}); re-export") from None
    if not isinstance(document, dict):
        raise AttnxError(f"{program_path} is not a torch.export program; re-export")
    _drop(document)
    check_program(document, str(program_path))
    try:
        tensors = {**load_file(str(tensors_path)), **_from_weights(tensors_path, weights_path)}
    except (SafetensorError, OSError, ValueError) as exc:
        raise AttnxError(f"cannot read {tensors_path}: {first_line(exc)}; re-export") from None
    for key in tensors:
        if not key.startswith((_STATE, _CONSTANT)) or not _PLAIN.fullmatch(key.partition(":")[2]):
            raise AttnxError(f"{tensors_path} holds tensor {key[:80]!r}, which no program names; re-export")
    parameters = _parameters(document)
    state = {
        k[len(_STATE) :]: torch.nn.Parameter(v, requires_grad=False) if k[len(_STATE) :] in parameters else v
        for k, v in tensors.items()
        if k.startswith(_STATE)
    }
    constants = {k[len(_CONSTANT) :]: v for k, v in tensors.items() if k.startswith(_CONSTANT)}
    try:
        program = ExportedProgramDeserializer().deserialize(
            _dict_to_dataclass(schema.ExportedProgram, document), state, constants, None
        )
    except Exception as exc:  # torch's deserializer fails on a malformed program with any type
        raise AttnxError(
            f"cannot load the reference program {program_path}: {first_line(exc, with_type=True)}; re-export "
            "the module with this attnx and torch"
        ) from None
    check_targets(program, str(program_path))
    return program


def _from_weights(tensors_path: Path, weights_path: Path | None) -> dict[str, torch.Tensor]:
    """The program's tensors that its tensors file names in the weights file (one tensor per stored one:
    tied weights stay tied).

    Raises:
        ValueError: a malformed list, or one naming tensors the weights file lacks.
    """
    from safetensors import safe_open

    with safe_open(str(tensors_path), framework="pt") as handle:
        listed = (handle.metadata() or {}).get(FROM_WEIGHTS)
    if listed is None:
        return {}
    names = json.loads(listed)
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise ValueError(f"its {FROM_WEIGHTS} metadata is not a map of tensor names")
    if weights_path is None:
        raise ValueError("it names tensors of a weights file, and none was given")
    loaded: dict[str, torch.Tensor] = {}
    with safe_open(str(weights_path), framework="pt") as weights:
        present = set(weights.keys())
        for stored in set(names.values()):
            if stored not in present:
                raise ValueError(f"it names {stored[:80]!r}, which {weights_path.name} lacks")
            loaded[stored] = weights.get_tensor(stored)
    return {key: loaded[stored] for key, stored in names.items()}


def check_program(document: dict[str, Any], where: str) -> None:
    """Refuse a program JSON with any string attnx does not load (see the module docstring).

    Raises:
        AttnxError: naming the first refused string and where it sits.
    """
    for path, key, text in _strings(document):
        if key == "expr_str":
            problem = _sympy_problem(text)
        elif key in ("in_spec", "out_spec"):
            problem = _tree_problem(text)
        elif key == "target" and "nodes" in path:
            problem = None if _TARGET.fullmatch(text) else "a call attnx does not run"
        elif key in _IDENTIFIER_KEYS:
            problem = None if _IDENTIFIER.fullmatch(text) else "not a Python name"
        elif key in _ARGUMENT_KEYS and "arg" in path:
            problem = None if _ARGUMENT.fullmatch(text) else "not a printable string argument"
        else:
            problem = None if _PLAIN.fullmatch(text) else "not a plain name"
        if problem:
            raise AttnxError(
                f"{where} holds {text[:60]!r} at {'.'.join(path)[-80:]} ({problem}); attnx loads only the "
                "programs it writes: re-export"
            )
    for path, value in _objects(document):
        if "as_custom_obj" in value or "custom_obj" in value or value.get("custom_obj_values"):
            raise AttnxError(f"{where} holds a script object at {'.'.join(path)[-80:]}; re-export")


def _foreign_op(program: Any) -> str | None:
    """The first op the program calls outside :data:`_OPS_NAMESPACES` (a user's own custom op), if any."""
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                target = node.target
                if isinstance(target, torch._ops.OpOverload) and target.namespace not in _OPS_NAMESPACES:
                    return str(target)
    return None


def check_targets(program: Any, where: str) -> None:
    """Every call in the loaded program is an ``aten``/``prims``/``attnx`` op that reads no file, an
    ``operator`` function or a ``torch.sym_*`` function.

    Raises:
        AttnxError: naming the first other call.
    """
    import operator

    # Arithmetic, comparisons and indexing only: attrgetter, methodcaller and call would reach any object.
    allowed = {getattr(operator, name) for name in _OPERATORS}
    allowed |= {getattr(torch, n) for n in dir(torch) if n.startswith("sym_")}
    graphs = [m.graph for m in program.graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
    for graph in graphs:
        for node in graph.nodes:
            if node.op in ("call_module", "call_method"):
                raise AttnxError(
                    f"{where}: node {node.name} is a {node.op}, which attnx does not run; re-export"
                )
            if node.op != "call_function":
                continue
            target = node.target
            why = "which attnx does not run"
            if isinstance(target, torch._ops.OpOverload) and target.namespace in _OPS_NAMESPACES:
                if not any(a.name == "filename" for a in target._schema.arguments):
                    continue
                why = "which reads a file"
            elif target in allowed:
                continue
            raise AttnxError(f"{where}: node {node.name} calls {target}, {why}; re-export")


def _drop(document: dict[str, Any]) -> None:
    """Remove guards and source metadata (everywhere: nodes and graph modules)."""
    stack: list[Any] = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key in _DROPPED:
                if key in value:
                    value[key] = [] if key == "guards_code" else {}
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _objects(document: Any) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """(path, object) of every JSON object in ``document``, the path being the keys leading to it."""
    stack: list[tuple[list[str], Any]] = [([], document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            yield path, value
            stack.extend(([*path, k], v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((path, v) for v in value)


def _strings(document: Any) -> Iterator[tuple[list[str], str, str]]:
    """(path, key, string) of every string of a JSON document: each value under the nearest key holding
    it, and each key (under the key ""), so that a key is checked as a plain name."""
    stack: list[tuple[list[str], str, Any]] = [([], "", document)]
    while stack:
        path, key, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                yield path, "", k
                stack.append(([*path, k], k, v))
        elif isinstance(value, list):
            stack.extend((path, key, v) for v in value)
        elif isinstance(value, str):
            yield path, key, value


def _sympy_problem(text: str) -> str | None:
    """Why ``text`` is not a shape expression attnx lets sympy parse (None: it is one)."""
    if len(text) > _SYMPY_LIMIT:
        return "a shape expression too long"
    position = 0
    while position < len(text):
        token = _SYMPY_TOKEN.match(text, position)
        if token is None:
            return "not a shape expression"
        if token.group("name") and token.group("name") not in _SYMPY_NAMES:
            return f"a shape expression calling {token.group('name')}"
        position = token.end()
        if not text[position:].strip():
            break
    return None


def _tree_problem(text: str) -> str | None:
    """Why ``text`` is not a tree spec of tuples, lists and dicts of plain keys (None: it is one)."""
    try:
        protocol, root = json.loads(text)
    except (ValueError, TypeError):
        return "not a tree spec"
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or node.get("type") not in _TREE_TYPES:
            return "a tree spec of another type"
        context = node.get("context")
        keys = json.loads(context) if isinstance(context, str) else context
        if keys is not None and not (
            isinstance(keys, list) and all(isinstance(k, str) and _PLAIN.fullmatch(k) for k in keys)
        ):
            return "a tree spec with other keys"
        stack.extend(node.get("children_spec") or [])
    return None if isinstance(protocol, int) else "not a tree spec"


def _parameters(document: dict[str, Any]) -> set[str]:
    """The state-dict names the program's signature lists as parameters."""
    signature = document.get("graph_module", {}).get("signature", {})
    specs = signature.get("input_specs", []) if isinstance(signature, dict) else []
    found = set()
    for spec in specs if isinstance(specs, list) else []:
        parameter = spec.get("parameter") if isinstance(spec, dict) else None
        if isinstance(parameter, dict) and isinstance(parameter.get("parameter_name"), str):
            found.add(parameter["parameter_name"])
    return found
