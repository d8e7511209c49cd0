"""Triton Inference Server model repositories: ``attnx triton OUT --repo DIR``.

Each call adds one model to the repository ``DIR`` (made if missing; other models in it are left as they
are): ``DIR/<name>/config.pbtxt`` + ``DIR/<name>/1/model.onnx`` for Triton's onnxruntime backend, a
``DIR/<name>/README.md`` with the ``tritonserver`` command and a client request, and
``DIR/<name>/attnx-triton.json`` (what it was made from). An existing ``<name>`` is refused without
``--force``; ``--force`` replaces only that model's folder, and only one attnx wrote. The model's folder
is staged and renamed into place (:mod:`attnx.atomic`), so one ``tritonserver`` serves every model
written into one repository.

* **dynamic batching** (encoders, full models): ``model.onnx`` as exported; Triton stacks
  requests along the batch axis (``max_batch_size`` N, ``dims`` without the batch axis).
* **sequence batching** (lm decode exports): ``decode.onnx``, which takes any number of new tokens
  after any state, so one model serves the prompt (the request that starts a sequence) and every
  next token. Each state tensor is an implicit ``state`` (Triton feeds a request's state output
  back as the next request's input), the position counter ``past_length`` included, all with a
  zero initial state. On the first request Triton gives a state with a variable axis (a KV cache's
  ``past_seq``) length 1, not 0, so the graph keeps only the last ``past_length`` entries of
  each KV cache input (a Slice before the decode graph; all of them after the first request).
  ``max_batch_size`` is 0: attnx's decode graphs share one position across the rows of a call,
  and a KV cache grows at each sequence's own pace, so Triton must not stack two sequences into
  one call; concurrent sequences run on ``--instances`` model instances. State names keep
  attnx's ``past.*``/``present.*``: Triton pairs a state's output with its input by their
  positions in two name-sorted maps, and a name that prefixes another has led to swapped states,
  so both are checked. ``use_growable_memory`` stays off (it reserves large buffers).

``--backend python`` writes the same model for Triton's python backend instead
(:mod:`attnx.serve.triton_python`): ``model.py`` runs the export's graphs in ONNX Runtime, in a python
environment attnx prepares (:mod:`attnx.serve.pyenv`) and names in the config (``EXECUTION_ENV_PATH``);
a decoder keeps each sequence's state itself, keyed by the sequence batcher's correlation id.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from attnx.atomic import check_output_dir, staged_directory
from attnx.decode.model import LOGITS, PAST_LENGTH
from attnx.decode.runtime import decode_section
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.layout import PREFIX, Layout, copy_graph, save_beside
from attnx.exporter.manifest import MANIFEST, DecodeSection, StatePair
from attnx.models.spec import TensorSpec
from attnx.serve.pyenv import Progress, ensure_environment, python_version
from attnx.serve.tokenizer import CONFIG_FILE, TOKENIZER_FILE
from attnx.serve.triton_python import write_python_model
from attnx.state import GROWING

MARKER = "attnx-triton.json"
VERSION = "1"
SERVED_LOWERINGS = ("function", "decomposed")
BATCHINGS = ("auto", "dynamic", "sequence")
TRITON_BACKENDS = ("onnxruntime", "python")
DEFAULT_MAX_BATCH = 8
IDLE_MICROSECONDS = 60_000_000  # a sequence idle this long is dropped, its state freed
MAX_SEQUENCES = 16  # python backend: live sequences per model instance (the sequence batcher's slots)
_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "bool": "TYPE_BOOL",
}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One input/output of config.pbtxt: ``dims`` as Triton reads them (-1 variable)."""

    name: str
    dtype: str
    dims: tuple[int, ...]

    def text(self, depth: int) -> str:
        fields = [("name", f'"{self.name}"'), ("data_type", _TYPES[self.dtype]), ("dims", _dims(self.dims))]
        return _message(fields, depth)


@dataclasses.dataclass(frozen=True)
class State:
    """One implicit state of the sequence batcher, zero on a sequence's first request."""

    input: str
    output: str
    dtype: str
    dims: tuple[int, ...]

    def text(self, depth: int) -> str:
        first = tuple(1 if d == -1 else d for d in self.dims)  # Triton's shape on the first request
        initial = [
            ("data_type", _TYPES[self.dtype]),
            ("dims", _dims(first)),
            ("zero_data", "true"),
            ("name", '"zero"'),
        ]
        return _message(
            [
                ("input_name", f'"{self.input}"'),
                ("output_name", f'"{self.output}"'),
                ("data_type", _TYPES[self.dtype]),
                ("dims", _dims(self.dims)),
                ("initial_state", _message(initial, depth + 1)),
            ],
            depth,
        )


def _message(fields: Sequence[tuple[str, str]], depth: int) -> str:
    """A protobuf text-format message ``{ key: value ... }`` indented for list items at ``depth``."""
    pad = "  " * depth
    body = "".join(f"\n{pad}  {key}: {value}" for key, value in fields)
    return f"{{{body}\n{pad}}}"


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """Everything written for one Triton model (``python_env``: the python backend's environment)."""

    name: str
    batching: str  # "dynamic" or "sequence"
    max_batch_size: int
    inputs: tuple[Entry, ...]
    outputs: tuple[Entry, ...]
    states: tuple[State, ...]
    instances: int
    backend: str = "onnxruntime"
    python_env: str | None = None

    def config(self) -> str:
        """config.pbtxt (protobuf text format of Triton's ModelConfig)."""
        lines = [
            f'name: "{self.name}"',
            f'backend: "{self.backend}"',
            f"max_batch_size: {self.max_batch_size}",
        ]
        lines += [f"input [\n{_join(self.inputs, 1)}\n]", f"output [\n{_join(self.outputs, 1)}\n]"]
        if self.batching == "sequence":
            idle = f"  max_sequence_idle_microseconds: {IDLE_MICROSECONDS}"
            lines.append(f"sequence_batching {{\n{idle}\n{self._slots()}\n}}")
        elif self.max_batch_size > 0:
            lines.append("dynamic_batching { }")
        kind = "\n    kind: KIND_CPU" if self.backend == "python" else ""
        lines.append(f"instance_group [\n  {{\n    count: {self.instances}{kind}\n  }}\n]")
        if self.python_env is not None:
            value = f"{{ string_value: {json.dumps(self.python_env)} }}"
            lines.append(f'parameters: {{ key: "EXECUTION_ENV_PATH" value: {value} }}')
        return "\n".join(lines) + "\n"

    def _slots(self) -> str:
        """The sequence batcher's state (onnxruntime: implicit state tensors; python: the model keeps the
        state, for up to MAX_SEQUENCES sequences per instance, interleaved in any order)."""
        if self.backend == "python":
            return f"  oldest {{ max_candidate_sequences: {MAX_SEQUENCES} }}"
        return f"  state [\n{_join(self.states, 2)}\n  ]"


def _dims(dims: Sequence[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _join(entries: Sequence[Entry | State], depth: int) -> str:
    return ",\n".join("  " * depth + e.text(depth) for e in entries)


def _axes(axes: Sequence[str | int], batch: int | None) -> tuple[int, ...]:
    """Triton dims of manifest axes: the batch axis dropped (``batch`` None: Triton batches) or
    ``batch`` (-1: any; 1: one sequence per call), other named axes variable (-1)."""
    if batch is None:
        axes = axes[1:]
    return tuple(batch if a == "batch" else -1 if isinstance(a, str) else int(a) for a in axes)


def check_state_names(states: Sequence[State]) -> None:
    """Refuse state names Triton may confuse: one a prefix of another, or inputs and outputs in
    different name order (Triton pairs them by position in two sorted maps).

    Raises:
        AttnxError: naming the two states.
    """
    for side in ("input", "output"):
        names = sorted(getattr(s, side) for s in states)
        for a, b in zip(names, names[1:], strict=False):
            if b.startswith(a):
                raise AttnxError(
                    f"state {side} '{a}' is a prefix of '{b}', which Triton's sequence batcher can confuse; "
                    "rename the variant's state tensors (attnx.state.StateTensor.name)"
                )
    by_input = [s.output for s in sorted(states, key=lambda s: s.input)]
    if by_input != sorted(by_input):
        raise AttnxError(
            "the export's state inputs and outputs sort in different orders, so Triton would feed a "
            "state into the wrong input; rename the variant's state tensors"
        )


def plan_model(
    export: ExportDir,
    name: str,
    batching: str,
    max_batch: int | None,
    instances: int,
    backend: str = "onnxruntime",
) -> ModelPlan:
    """What to write for ``export`` (``batching`` "auto": sequence for an lm decode export) for Triton's
    ``backend`` (onnxruntime or python).

    Raises:
        AttnxError: bad settings, a plugin-lowered export, or a batching the export cannot serve.
    """
    manifest = export.manifest
    if max_batch is not None and max_batch < 0:
        raise AttnxError(f"--max-batch must be >= 0 (got {max_batch}); 0 turns batching off")
    if instances < 1:
        raise AttnxError(f"--instances must be >= 1 (got {instances})")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        raise AttnxError(f"model name '{name}' must be letters, digits, '_', '.' or '-' (a directory name)")
    if batching not in BATCHINGS:
        raise AttnxError(f"--batching must be one of {', '.join(BATCHINGS)} (got '{batching}')")
    if backend not in TRITON_BACKENDS:
        raise AttnxError(f"--backend must be one of {', '.join(TRITON_BACKENDS)} (got '{backend}')")
    if manifest.lowering not in SERVED_LOWERINGS:
        raise AttnxError(
            f"'{export.path}' uses the {manifest.lowering} lowering, whose bare attnx nodes ONNX Runtime "
            f"runs only with attnx's own kernels, which Triton's {backend} backend does not load; re-export "
            f"with --lowering {' or '.join(SERVED_LOWERINGS)}"
        )
    why = sequence_blocker(export)
    if batching == "auto":
        batching = "dynamic" if why else "sequence"
    if batching == "dynamic":
        plan = _dynamic(manifest.inputs, manifest.outputs, name, max_batch, instances)
        return dataclasses.replace(plan, backend=backend)
    if why:
        raise AttnxError(f"sequence batching cannot serve '{export.path}': {why}")
    if max_batch:
        raise AttnxError(
            "a sequence-batched decoder runs one sequence per call (max_batch_size 0: its rows share one "
            "position and each KV cache grows at its own pace); drop --max-batch and scale with --instances"
        )
    plan = _sequence(decode_section(export), name, instances)
    if backend == "python":  # model.py pairs the state itself, by the manifest, not by sorted names
        return dataclasses.replace(plan, backend=backend, states=())
    check_state_names(plan.states)
    return plan


def sequence_blocker(export: ExportDir) -> str | None:
    """Why sequence batching cannot serve ``export`` (None: it can)."""
    if export.manifest.decode is None:
        return "it has no decode graphs; re-export with --decode"
    if export.manifest.decode.context:  # a seq2seq decoder (an lm, attnx's or a module, has no context)
        return (
            f"a {export.manifest.model} decoder needs its source at every step (cached cross-attention "
            "context), which implicit state does not carry; serve model.onnx with --batching dynamic"
        )
    return None


def _dynamic(
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    name: str,
    max_batch: int | None,
    instances: int,
) -> ModelPlan:
    batch_first = all(s.axes and s.axes[0] == "batch" for s in [*inputs, *outputs])
    if max_batch and not batch_first:
        raise AttnxError(
            "this export has no dynamic leading batch axis on every input and output (it was fixed at "
            "export), so Triton cannot batch it; pass --max-batch 0 or re-export with a dynamic batch"
        )
    size = (DEFAULT_MAX_BATCH if batch_first else 0) if max_batch is None else max_batch

    def entries(specs: Sequence[TensorSpec]) -> tuple[Entry, ...]:
        return tuple(Entry(s.name, s.dtype, _axes(s.axes, None if size > 0 else -1)) for s in specs)

    return ModelPlan(name, "dynamic", size, entries(inputs), entries(outputs), (), instances)


def _sequence(section: DecodeSection, name: str, instances: int) -> ModelPlan:
    fed = {s.input for s in section.state}
    inputs = tuple(
        Entry(s.name, s.dtype, _axes(s.axes, 1)) for s in section.decode.inputs if s.name not in fed
    )
    logits = next(s for s in section.decode.outputs if s.name == LOGITS)
    states = tuple(State(p.input, p.output, p.dtype, _axes(p.axes, 1)) for p in section.state)
    return ModelPlan(
        name,
        "sequence",
        0,
        inputs,
        (Entry(LOGITS, logits.dtype, _axes(logits.axes, 1)),),
        states,
        instances,
    )


def sequence_layout(proto: onnx.ModelProto, state: Sequence[StatePair]) -> onnx.ModelProto:
    """``decode.onnx`` that reads only the last ``past_length`` entries of each KV cache input (the
    first request's length-1 zero cache is dropped; later requests keep all)."""
    layout = Layout(proto)
    for spec in proto.graph.input:
        pair = next((p for p in state if p.input == spec.name), None)
        if pair is None or GROWING not in pair.axes:
            layout.keep(spec.name)
            continue
        layout.keep(spec.name)
        axis = pair.axes.index(GROWING)
        held = layout.node("Shape", [pair.input], f"{PREFIX}{pair.input}/length", start=axis, end=axis + 1)
        start = layout.node("Sub", [held, PAST_LENGTH], f"{PREFIX}{pair.input}/start")
        ends, axes = (
            layout.constant(f"{pair.input}/end", [np.iinfo(np.int64).max]),
            layout.constant(f"{pair.input}/axis", [axis]),
        )
        layout.node("Slice", [pair.input, start, ends, axes], layout.feed(pair.input))
    for spec in proto.graph.output:
        layout.keep(spec.name)
    return layout.build("attnx_triton_decoder")


@dataclasses.dataclass(frozen=True)
class Repository:
    """A Triton model repository attnx wrote (the result of :func:`write_repository`)."""

    path: Path
    model: ModelPlan
    files: tuple[str, ...]  # relative to the repository


def write_repository(
    out: str | Path,
    repo: str | Path,
    *,
    name: str | None = None,
    max_batch: int | None = None,
    batching: str = "auto",
    instances: int = 1,
    force: bool = False,
    backend: str = "onnxruntime",
    env_cache: str | Path | None = None,
    progress: Progress | None = None,
) -> Repository:
    """Write a Triton model repository serving the export ``out`` into ``repo`` (atomically).

    Args:
        backend: Triton's "onnxruntime" backend, or its "python" backend running ``model.py`` in a
            python environment built (or reused) under ``env_cache`` (default
            :func:`attnx.serve.pyenv.default_cache`).
        progress: told about the long steps (building the python environment).

    Raises:
        AttnxError: ``out`` is not an export, bad settings, a batching it cannot serve, ``repo`` is an
            attnx export, the model's folder ``repo/<name>`` exists (without ``force``, or not written by
            attnx), or the python environment cannot be built.
    """
    export = ExportDir.open(out)
    plan = plan_model(export, name or export.manifest.model, batching, max_batch, instances, backend)
    if backend != "python" and env_cache is not None:
        raise AttnxError("--env-cache is for --backend python (the onnxruntime backend needs no environment)")
    repo = Path(repo)
    if (repo / MANIFEST).exists():
        raise AttnxError(
            f"--repo '{repo}' is an attnx export, not a Triton model repository; choose another --repo"
        )
    if backend == "python":
        check_output_dir(repo / plan.name, force, MARKER)  # before the slow environment build
        plan = dataclasses.replace(plan, python_env=str(ensure_environment(env_cache, progress)))
    with staged_directory(repo / plan.name, force, marker=MARKER) as staging:
        (staging / VERSION).mkdir()
        _write_model(export, plan, staging / VERSION)
        (staging / "config.pbtxt").write_text(plan.config(), encoding="utf-8")
        if export.has("tokenizer"):
            shutil.copyfile(export.file("tokenizer"), staging / TOKENIZER_FILE)
            shutil.copyfile(export.file("tokenizer_config"), staging / CONFIG_FILE)
        (staging / "README.md").write_text(readme(export, plan), encoding="utf-8")
        provenance = {
            "export": str(Path(out).resolve()),
            "manifest": export.manifest.files["model"].sha256,
            "model": plan.name,
            "batching": plan.batching,
            "backend": plan.backend,
            "python_env": plan.python_env,
        }
        (staging / MARKER).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
        files = tuple(
            sorted(f"{plan.name}/{p.relative_to(staging)}" for p in staging.rglob("*") if p.is_file())
        )
    return Repository(repo, plan, files)


def _write_model(export: ExportDir, plan: ModelPlan, folder: Path) -> None:
    """The version folder: the ONNX model the onnxruntime backend runs, or the python backend's model."""
    if plan.backend == "python":
        write_python_model(export, plan.batching, folder)
    elif plan.batching == "sequence":
        proto = onnx.load(str(export.file("decode")), load_external_data=False)
        save_beside(sequence_layout(proto, decode_section(export).state), export.path, folder / "model.onnx")
    else:
        copy_graph(export.model_path, folder / "model.onnx")


def readme(export: ExportDir, plan: ModelPlan) -> str:
    """README.md of the model's folder: what it serves, the server command, an example request."""
    text = export.has("tokenizer")
    inputs = ", ".join(f"`{e.name}` {_TYPES[e.dtype]} {list(e.dims)}" for e in plan.inputs)
    lines = [
        f"# Triton model repository: `{plan.name}`",
        "",
        f"Written by `attnx triton` from `{export.path}` ({export.manifest.model} with "
        f"{export.manifest.variant} attention, {export.manifest.dtype}, {export.manifest.lowering} lowering, "
        f"ONNX opset {export.manifest.opset}), for Triton's {plan.backend} backend.",
        "",
        f"Inputs: {inputs}. Batching: **{plan.batching}** (max_batch_size {plan.max_batch_size}).",
        "",
        "## Start the server",
        "",
        *(_python_server(plan) if plan.python_env else _container_server()),
        "",
        "## Ask it (Python, `pip install 'tritonclient[http]'`)",
        "",
        "```python",
        "import numpy as np",
        "import tritonclient.http as httpclient",
        "",
        'client = httpclient.InferenceServerClient("localhost:8000")',
    ]
    if text:
        lines += [
            "from tokenizers import Tokenizer",
            f'tokenizer = Tokenizer.from_file("{plan.name}/{TOKENIZER_FILE}")',
        ]
    lines += _sequence_client(plan, text) if plan.batching == "sequence" else _dynamic_client(plan, text)
    lines += ["```", ""]
    if plan.batching == "sequence":
        keeper = "the model keeps" if plan.python_env else "Triton keeps"
        lines += [
            "Each sequence has its own id: its first request (`sequence_start=True`) sends the prompt, "
            f"every later one the next token; {keeper} the state (KV cache or recurrent sums, and the "
            "position) between them and frees it at `sequence_end=True` or after "
            f"{IDLE_MICROSECONDS // 1_000_000} s idle. Greedy decoding takes the argmax of the last logits.",
            "",
        ]
    return "\n".join(lines)


def _container_server() -> list[str]:
    return [
        "```bash",
        'docker run --rm -p8000:8000 -p8001:8001 -p8002:8002 -v "$PWD":/models \\',
        "  nvcr.io/nvidia/tritonserver:<release>-py3 tritonserver --model-repository=/models",
        "```",
        "",
        "(or `tritonserver --model-repository=$PWD` where Triton is installed). The backend's ONNX Runtime "
        "must read this opset.",
    ]


def _python_server(plan: ModelPlan) -> list[str]:
    return [
        f"`{plan.name}/1/model.py` runs the export in ONNX Runtime, in the python environment "
        f"`{plan.python_env}` (config.pbtxt's `EXECUTION_ENV_PATH`; numpy < 2 and onnxruntime). The "
        f"server's python backend stub must be built for Python {python_version()}, as that environment is:",
        "",
        "```bash",
        "tritonserver --model-repository=$PWD",
        "```",
        "",
        "(with the `nvidia-pytriton` wheel's server add `--backend-directory=<its tritonserver/backends>`; "
        "docs/deploying.md in attnx shows every step).",
    ]


def _sequence_client(plan: ModelPlan, text: bool) -> list[str]:
    prompt = 'tokenizer.encode("once upon a time").ids' if text else "[1, 2, 3]"
    return [
        "",
        "def step(ids, start, end, sequence_id=42):",
        '    tokens = httpclient.InferInput("input_ids", [1, len(ids)], "INT64")',
        "    tokens.set_data_from_numpy(np.asarray([ids], dtype=np.int64))",
        f'    result = client.infer("{plan.name}", [tokens], sequence_id=sequence_id,',
        "                          sequence_start=start, sequence_end=end)",
        '    return int(result.as_numpy("logits")[0, -1].argmax())',
        "",
        f"tokens = [step({prompt}, start=True, end=False)]",
        "for i in range(15):",
        "    tokens.append(step([tokens[-1]], start=False, end=i == 14))",
        "print(tokenizer.decode(tokens))" if text else "print(tokens)",
    ]


def _dynamic_client(plan: ModelPlan, text: bool) -> list[str]:
    """Every input filled with ones but the tokens (a batch of 1, variable axes as long as the prompt)."""
    batch = [1] if plan.max_batch_size > 0 else []
    table = ", ".join(f'("{e.name}", "{_TYPES[e.dtype][5:]}", {[*batch, *e.dims]})' for e in plan.inputs)
    return [
        "from tritonclient.utils import triton_to_np_dtype",
        "",
        'ids = tokenizer.encode("once upon a time").ids' if text else "ids = [1, 2, 3, 4]",
        "inputs = []",
        f"for name, dtype, dims in [{table}]:",
        "    shape = [len(ids) if d == -1 else d for d in dims]",
        "    data = np.ones(shape, dtype=triton_to_np_dtype(dtype))",
        '    if name == "input_ids":',
        "        data = np.asarray(ids, dtype=np.int64).reshape(shape)",
        "    inputs.append(httpclient.InferInput(name, shape, dtype))",
        "    inputs[-1].set_data_from_numpy(data)",
        f'result = client.infer("{plan.name}", inputs)',
        *(f'print("{e.name}", result.as_numpy("{e.name}").shape)' for e in plan.outputs),
    ]
