"""Real size, side by side: attnx against mobius-onnx and onnxruntime-genai's model builder on the same
directories (``attnx.testing.real_size``, seeded random weights: the released Qwen3.5 0.8B and 2B text
shapes and LFM2-1.2B; ``toy``: the hybrid tests' 4-layer width-64 ``qwen3_5`` recipe, random weights, to
try the script in minutes). Each directory is made under ``--work`` once (reused when present).

Tools (``--tools``), each in its own child process, one at a time, so its wall time and memory are its
own: peak RSS (``wait4``: the largest resident set of any one process of the child and its descendants)
and peak PSS (the memory of all of them at once, pages they share counted once, sampled each second; an
attnx export makes its decode graphs in a forked process):

* ``attnx``: ``attnx export --from hf:DIR --decode -o OUT`` (its default verify); ``attnx-no-verify``: the
  same with ``--no-verify``;
* ``mobius``: Microsoft's mobius-onnx 0.1.0, ``mobius.build(DIR, dtype="f32").save(OUT)`` (in
  ``--mobius-python``, this interpreter if it imports mobius, else a venv made under ``--work`` with
  ``pip install mobius-onnx==0.1.0``); mobius 0.1.0 does not build LFM2, so its row is skipped there;
* ``builder``: onnxruntime-genai's model builder (``-p fp32 -e cpu``, ``hf_hybrid.build_with_genai``) on
  the directory as saved (LFM2), or for Qwen3.5 on a ``Qwen3_5ForConditionalGeneration`` checkpoint of the
  same weights (``hf_hybrid.conditional_checkpoint``, made once in a child of its own, not counted in the
  builder's time or memory).

Then per tool, each step in a child process again (one copy of the weights in memory at a time):

* bytes on disk of OUT, and peak RSS, peak PSS and bytes as multiples of the fp32 weights' bytes;
* the largest absolute logits error of its full graph in ONNX Runtime (attnx: ``model.onnx``; mobius and
  the builder: their stateful ``model.onnx`` from an empty state) against HF's own float32 forward
  (computed once per shape, in a child, before any tool) at each of ``--lengths`` (one row of seeded ids);
* prefill time of ``--prefill`` tokens in plain ONNX Runtime on the same graph (one run, after the
  logits checks warmed the session);
* decode ms/token in onnxruntime-genai (``hf_hybrid.genai_speed``: ``--steps`` tokens after a
  ``--prefill``-token prompt) over attnx's export (its genai.onnx + genai_config.json), the builder's
  output and mobius's (with the genai_config.json mobius's own ``write_ort_genai_config`` writes, after the
  build was measured); where genai cannot run a graph, the same in plain ONNX Runtime with the states fed
  back (the ``decode_runtime`` column says which);
* each tool's wall time as a multiple of mobius's and of the builder's, where they ran.

``--decode-only NAME=DIR,...``: only the decode timing, side by side on directories made before (e.g. attnx's
export before and after a change, the builder's and mobius's outputs of the same weights): ``--rounds``
interleaved rounds, each running every directory once per ``--contexts`` prompt length (in a child process
of its own, one at a time), each figure its best round, with tokens/s and the ratio to the faster peer
(``--peers``: the names of the peers' rows).

A tool or step that fails gets its one-line error in the row, and the run goes on. Prints one JSON object
per tool as it finishes and a table at the end; ``--json PATH`` writes the rows.

    python benchmarks/scale.py --shapes toy --work /tmp/scale --json scale-toy.json
    python benchmarks/scale.py --shapes 0.8b,2b --work /work/scale-bench --json scale.json
    python benchmarks/scale.py --shapes 0.8b --tools mobius,builder --mobius-python /path/to/venv/bin/python
    python benchmarks/scale.py --shapes lfm2-1.2b --tools builder,attnx-no-verify,attnx --work /work/scale
    python benchmarks/scale.py --decode-only attnx=OUT,builder=B,mobius=M --contexts 256,4096 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from hf_hybrid import build_with_genai, conditional_checkpoint, genai_speed, speed_prompt  # noqa: E402

from attnx.testing import hf_hybrid, real_size  # noqa: E402

TOOLS = ("attnx", "attnx-no-verify", "mobius", "builder")
SHAPES = tuple(real_size.SHAPES)
# model types mobius-onnx 0.1.0 builds, and those the builder takes only inside a conditional-generation
# checkpoint (hf_hybrid.BUILDER_CHECKPOINTS: it takes LFM2 as saved)
MOBIUS_BUILDS = ("qwen3_5_text",)
BUILDER_WRAPS = ("qwen3_5_text",)
MOBIUS = "mobius-onnx==0.1.0"
MOBIUS_BUILD = "import sys, mobius; mobius.build(sys.argv[1], dtype='f32').save(sys.argv[2])"
MOBIUS_GENAI_CONFIG = (
    "import sys, mobius; from mobius.integrations.ort_genai import write_ort_genai_config; "
    "write_ort_genai_config(mobius.build(sys.argv[1], dtype='f32', load_weights=False), sys.argv[2], "
    "local_config_dir=sys.argv[1])"
)
STATE_PREFIX = re.compile(r"^past(_key_values)?\.")  # past.N.conv, past_key_values.N.key -> present.N....


# ---------------------------------------------------------------------------------------------- children


def group_pss(group: int) -> int:
    """Bytes of memory the processes of process group ``group`` hold (the sum of their proportional set
    sizes: pages shared between them, such as an export's weights after a fork, counted once)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group:
                rollup = (stat.parent / "smaps_rollup").read_text()
                total += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
        except (OSError, IndexError, StopIteration, ValueError):  # the process ended meanwhile
            continue
    return total * 1024


RUN_KEYS = ("wall_s", "peak_rss_gb", "peak_pss_gb")  # what timed() measures of a child


def timed(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run ``argv`` as a child in its own process group: its wall time, its peak RSS (``wait4``: the
    largest of any one of its processes) and its peak summed PSS (every process of the group, sampled each
    second; an attnx export forks its decode graphs), its stdout, and on failure its last stderr line (the
    whole group is killed after ``timeout`` s)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True)
        expired, ended, peak = threading.Event(), threading.Event(), [0]

        def sample() -> None:
            while not ended.wait(1.0):
                peak[0] = max(peak[0], group_pss(child.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        def kill() -> None:
            expired.set()
            os.killpg(child.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        _, status, usage = os.wait4(child.pid, 0)
        timer.cancel()
        ended.set()
        sampler.join()
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        lines = [line.strip() for line in err.read().decode(errors="replace").splitlines() if line.strip()]
    run: dict[str, Any] = {
        "wall_s": round(wall, 1),
        "peak_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 2),
        "peak_pss_gb": round(peak[0] / 1e9, 2),
    }
    if expired.is_set():
        run["error"] = f"timed out after {timeout:.0f} s"
    elif status:
        run["error"] = lines[-1][:300] if lines else f"exit status {os.waitstatus_to_exitcode(status)}"
    run["stdout"] = stdout
    return run


def child(name: str, *args: Any, timeout: float, python: str = sys.executable) -> dict[str, Any]:
    """``CHILDREN[name](*args)`` in a child process (this script, ``--child``): the dict it returns, with the
    child's ``wall_s``, ``peak_rss_gb`` and ``peak_pss_gb``, or ``error``."""
    run = timed([python, __file__, "--child", name, *map(str, args)], timeout)
    stdout = run.pop("stdout")
    if "error" in run:
        return run
    return {**run, **json.loads(stdout.strip().splitlines()[-1])}


def one_line(exc: BaseException) -> str:
    """``exc`` as one short line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:240] if text else ''}"


# ------------------------------------------------------------------------------------- what the children do


def make_model(shape: str, path: str) -> dict[str, Any]:
    """Save the model of ``shape`` (seeded random weights, float32) to ``path``, with the hybrid tests'
    tokenizer: the builder saves the input's tokenizer beside its graph and fails without one (no run
    here tokenizes: the prompts are ids below its 512 tokens)."""
    if shape == "toy":
        hf_hybrid.build("qwen3_5").save_pretrained(path)
    else:
        real_size.save(shape, Path(path))
    hf_hybrid.train_tokenizer().save_pretrained(path)
    return {}


def make_conditional(source: str, path: str) -> dict[str, Any]:
    """The builder's input: ``source``'s weights in a ``Qwen3_5ForConditionalGeneration`` checkpoint."""
    conditional_checkpoint(Path(source), Path(path))
    return {}


def run_builder(checkpoint: str, out: str) -> dict[str, Any]:
    """onnxruntime-genai's model builder on ``checkpoint`` (its own wall time, without this child's start)."""
    try:
        return {"builder_s": round(build_with_genai(Path(checkpoint), Path(out)), 1)}
    except subprocess.CalledProcessError as exc:
        lines = [line for line in exc.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise SystemExit(lines[-1] if lines else str(exc)) from None


def reference(source: str, path: str, lengths: str) -> dict[str, Any]:
    """HF's own float32 forward on one row of seeded ids per length, saved to ``path`` (npz)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    found = {}
    for n in map(int, lengths.split(",")):
        ids = np.random.default_rng(n).integers(0, model.config.vocab_size, (1, n), dtype=np.int64)
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(ids), use_cache=False).logits
        found[f"ids_{n}"], found[f"logits_{n}"] = ids, logits.float().numpy()
    np.savez(path, **found)
    return {}


def empty_shape(dims: list[Any], head_dim: int) -> list[int]:
    """An empty state's shape: one row, no past tokens, ``head_dim`` for the builder's ``kv_cache_dim``."""
    shape = []
    for d in dims:
        if isinstance(d, int):
            shape.append(d)
        elif d is None or "batch" in d:
            shape.append(1)
        elif "past" in d or "total" in d or "seq" in d:
            shape.append(0)
        else:
            shape.append(head_dim)
    return shape


def feed(
    session: Any, ids: np.ndarray, start: int, head_dim: int, state: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Inputs of any of the three tools' graphs for ``ids`` (1, n) at positions ``start``.. : attnx's full
    graph (bool mask), mobius's and the builder's stateful ones (int64 mask over past + new tokens, the
    builder's (3, 1, n) multimodal positions); states from ``state``, else empty."""
    n = ids.shape[1]
    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bool)": np.bool_}
    inputs: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        if arg.name == "input_ids":
            inputs[arg.name] = ids
        elif arg.name == "attention_mask":
            inputs[arg.name] = np.ones((1, start + n), dtypes.get(arg.type, np.int64))
        elif arg.name == "position_ids":
            rows = [d for d in arg.shape[:-2] if isinstance(d, int)]
            positions = np.arange(start, start + n, dtype=np.int64)
            inputs[arg.name] = np.broadcast_to(positions, (*rows, 1, n)).copy()
        elif arg.name in state:
            inputs[arg.name] = state[arg.name]
        else:
            inputs[arg.name] = np.zeros(empty_shape(arg.shape, head_dim), dtypes.get(arg.type, np.float32))
    return inputs


def session_of(out: Path) -> Any:
    """An ONNX Runtime CPU session on ``out/model.onnx`` (every tool's full or stateful graph)."""
    import onnxruntime as ort

    return ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])


def config_of(source: str | Path) -> dict[str, Any]:
    """The ``config.json`` of the model in ``source``."""
    return json.loads((Path(source) / "config.json").read_text())


def head_dim_of(source: str) -> int:
    """The attention head width of the model in ``source`` (the builder's ``kv_cache_dim``; LFM2's config
    leaves it to width / heads)."""
    config = config_of(source)
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def evaluate(out: str, source: str, path: str, prefill: str) -> dict[str, Any]:
    """Logits error of ``out``'s graph against the reference in ``path`` per length, then the time of one
    ``prefill``-token prefill (empty state) in plain ONNX Runtime."""
    session, head_dim = session_of(Path(out)), head_dim_of(source)
    found: dict[str, Any] = {}
    with np.load(path) as expected:
        for name in expected.files:
            if name.startswith("ids_"):
                n = name.removeprefix("ids_")
                try:
                    logits = session.run(["logits"], feed(session, expected[name], 0, head_dim, {}))[0]
                    found[f"logits_err_{n}"] = float(np.abs(logits - expected[f"logits_{n}"]).max())
                except Exception as exc:  # the tool's graph failing at this length is the measurement
                    found[f"logits_err_{n}"] = one_line(exc)
    ids = np.array([speed_prompt(int(prefill))], dtype=np.int64)
    inputs = feed(session, ids, 0, head_dim, {})
    start = time.perf_counter()
    session.run(["logits"], inputs)
    found[f"prefill_{prefill}_s"] = round(time.perf_counter() - start, 3)
    return found


def ort_decode(out: str, source: str, prefill: str, steps: str) -> dict[str, Any]:
    """Decode ms/token in plain ONNX Runtime on ``out``'s stateful graph: a ``prefill``-token prompt, then
    ``steps`` greedy tokens, each step's present states fed back as the next one's past."""
    session, head_dim = session_of(Path(out)), head_dim_of(source)
    names = [o.name for o in session.get_outputs()]
    past = {STATE_PREFIX.sub("present.", a.name): a.name for a in session.get_inputs()}
    ids = np.array([speed_prompt(int(prefill))], dtype=np.int64)
    position, state = 0, {}
    start = None
    for step in range(int(steps) + 1):
        if step == 1:  # the first new token comes from the prefill: time the steps after it
            start = time.perf_counter()
        values = dict(
            zip(names, session.run(names, feed(session, ids, position, head_dim, state)), strict=True)
        )
        position += ids.shape[1]
        state = {past[name]: value for name, value in values.items() if name in past}
        ids = values["logits"][:, -1:].argmax(-1).astype(np.int64)
    assert start is not None
    ms = 1000 * (time.perf_counter() - start) / int(steps)
    return {"decode_ms_per_token": round(ms, 2), "decode_runtime": "onnxruntime (states fed back)"}


def genai_decode(out: str, prefill: str, steps: str) -> dict[str, Any]:
    """Decode ms/token in onnxruntime-genai over ``out`` (``hf_hybrid.genai_speed``)."""
    speed = genai_speed(Path(out), int(prefill), int(steps))
    return {
        "decode_ms_per_token": round(speed["decode_ms_per_token"], 2),
        "genai_prefill_s": round(speed["prefill_s"], 3),
        "decode_runtime": "onnxruntime-genai",
    }


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "make_model": make_model,
    "make_conditional": make_conditional,
    "run_builder": run_builder,
    "reference": reference,
    "evaluate": evaluate,
    "ort_decode": ort_decode,
    "genai_decode": genai_decode,
}


# ------------------------------------------------------------------------------------------------ the run


def made_once(path: Path, make: Callable[[Path], dict[str, Any]]) -> str | None:
    """``make(partial)`` then rename it to ``path``, unless ``path`` holds a config already; the error, if
    any."""
    if (path / "config.json").is_file():
        return None
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    made = make(partial)
    if "error" in made:
        return made["error"]
    partial.rename(path)
    return None


def mobius_python(given: str | None, work: Path, timeout: float) -> str:
    """An interpreter that imports mobius: ``given``, this one, or a venv under ``work`` (system site
    packages, ``pip install mobius-onnx==0.1.0``) made on first use.

    Raises:
        RuntimeError: the venv or the install failed.
    """
    if given:
        return given
    if subprocess.run([sys.executable, "-c", "import mobius"], capture_output=True).returncode == 0:
        return sys.executable
    venv = work / "mobius-venv"
    python = venv / "bin" / "python"
    if not python.exists() or subprocess.run([python, "-c", "import mobius"], capture_output=True).returncode:
        for argv in (
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
            [str(python), "-m", "pip", "install", "--quiet", MOBIUS],
        ):
            run = timed(argv, timeout)
            if "error" in run:
                raise RuntimeError(f"{' '.join(argv[-2:])}: {run['error']}")
    return str(python)


def version(python: str, module: str) -> str:
    """``module.__version__`` in ``python``."""
    argv = [python, "-c", f"import {module}; print({module}.__version__)"]
    found = subprocess.run(argv, capture_output=True, text=True)
    return found.stdout.strip() or "?"


def build(tool: str, source: Path, out: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``tool``'s export of ``source`` into an empty ``out``: wall time, peak RSS, version, or error."""
    shutil.rmtree(out, ignore_errors=True)
    if tool.startswith("attnx"):
        argv = [sys.executable, "-m", "attnx", "export", "--from", f"hf:{source}", "--decode", "-o", str(out)]
        run = timed(argv + (["--no-verify"] if tool == "attnx-no-verify" else []), args.timeout)
        run.pop("stdout")
        return {**run, "version": version(sys.executable, "attnx")}
    if tool == "mobius":
        try:
            python = mobius_python(args.mobius_python, work, args.timeout)
        except RuntimeError as exc:
            return {"error": str(exc)}
        run = timed([python, "-c", MOBIUS_BUILD, str(source), str(out)], args.timeout)
        run.pop("stdout")
        return {**run, "version": version(python, "mobius")}
    checkpoint = source
    if config_of(source)["model_type"] in BUILDER_WRAPS:
        checkpoint = work / f"{source.name}-conditional"
        error = made_once(checkpoint, lambda p: child("make_conditional", source, p, timeout=args.timeout))
        if error:
            return {"error": f"conditional checkpoint: {error}"}
    run = child("run_builder", checkpoint, out, timeout=args.timeout)
    if "builder_s" in run:  # the builder's own time, not this child's start-up
        run["wall_s"] = run.pop("builder_s")
    return {**run, "version": version(sys.executable, "onnxruntime_genai")}


def decode(tool: str, source: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Decode ms/token of ``tool``'s export: in onnxruntime-genai, else in plain ONNX Runtime."""
    genai_error = None
    if tool == "mobius":  # mobius's own genai_config.json (written after the build was measured)
        python = mobius_python(args.mobius_python, Path(args.work), args.timeout)
        run = timed([python, "-c", MOBIUS_GENAI_CONFIG, str(source), str(out)], args.timeout)
        genai_error = run.get("error")
    if genai_error is None:
        found = child("genai_decode", out, args.prefill, args.steps, timeout=args.timeout)
        if "error" not in found:
            return {k: v for k, v in found.items() if k not in RUN_KEYS}
        genai_error = found["error"]
    if tool.startswith("attnx"):  # attnx's model.onnx is stateless: genai is its decode path
        return {"decode_error": f"onnxruntime-genai: {genai_error}"}
    found = child("ort_decode", out, source, args.prefill, args.steps, timeout=args.timeout)
    if "error" in found:
        return {"decode_error": f"onnxruntime-genai: {genai_error}; onnxruntime: {found['error']}"}
    found["decode_runtime"] += f" (onnxruntime-genai: {genai_error[:120]})"
    return {k: v for k, v in found.items() if k not in RUN_KEYS}


def measure(shape: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every tool's row on ``shape``'s directory (made once under ``--work``)."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = work / shape
    error = made_once(source, lambda p: child("make_model", shape, p, timeout=args.timeout))
    if error:
        return [{"shape": shape, "tool": tool, "error": f"model directory: {error}"} for tool in args.tools]
    weights = sum(f.stat().st_size for f in source.glob("*.safetensors"))
    expected = work / f"{shape}-reference.npz"
    known = child("reference", source, expected, args.lengths, timeout=args.timeout)
    rows = []
    for tool in args.tools:
        if tool == "mobius" and (kind := config_of(source)["model_type"]) not in MOBIUS_BUILDS:
            print(f"{shape}: mobius-onnx 0.1.0 does not build {kind}; skipped", flush=True)
            continue
        out = work / f"{shape}-{tool}"
        row: dict[str, Any] = {"shape": shape, "tool": tool, "weights_gb": round(weights / 1e9, 3)}
        row |= build(tool, source, out, work, args)
        if "error" not in row:
            disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
            row |= {"disk_gb": round(disk / 1e9, 3), "disk_x_weights": round(disk / weights, 3)}
            row["peak_rss_x_weights"] = round(row["peak_rss_gb"] * 1e9 / weights, 2)
            row["peak_pss_x_weights"] = round(row["peak_pss_gb"] * 1e9 / weights, 2)
            if "error" in known:
                row["eval_error"] = f"HF reference: {known['error']}"
            else:
                found = child("evaluate", out, source, expected, args.prefill, timeout=args.timeout)
                found["eval_peak_rss_gb"] = found.pop("peak_rss_gb", None)
                found.pop("peak_pss_gb", None)
                found.pop("wall_s", None)
                row |= {"eval_error" if k == "error" else k: v for k, v in found.items()}
            row |= decode(tool, source, out, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    for peer in ("mobius", "builder"):
        ran = next((r for r in rows if r["tool"] == peer and "error" not in r), None)
        for row in rows:
            if ran and "error" not in row:
                row[f"wall_x_{peer}"] = round(row["wall_s"] / ran["wall_s"], 2)
    return rows


def cell(key: str, value: Any) -> str:
    """A table cell: logits errors in e-notation, other floats rounded, failures as ``fails`` (spelled out
    under the table), missing as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1e}" if key.startswith("logits_err") else f"{value:.2f}"
    return "fails" if key.startswith(("logits_err", "error")) else str(value)


def table(rows: list[dict[str, Any]], lengths: list[str], prefill: str) -> str:
    """The rows as a Markdown table, then each row's errors in full."""
    head = ["shape", "tool", "wall s", "x mobius", "x builder", "peak RSS GB", "x weights", "peak PSS GB"]
    head += ["x weights", "disk GB", "x weights"]
    head += [f"err @{n}" for n in lengths] + [f"prefill {prefill} s", "decode ms/tok", "decode in"]
    keys = ["shape", "tool", "wall_s", "wall_x_mobius", "wall_x_builder", "peak_rss_gb", "peak_rss_x_weights"]
    keys += ["peak_pss_gb", "peak_pss_x_weights", "disk_gb"]
    keys += ["disk_x_weights"] + [f"logits_err_{n}" for n in lengths]
    keys += [f"prefill_{prefill}_s", "decode_ms_per_token", "decode_runtime"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in rows:
        runtime = row.get("decode_runtime", "")
        row = {**row, "decode_runtime": "genai" if runtime == "onnxruntime-genai" else runtime and "ort"}
        lines.append("| " + " | ".join(cell(k, row.get(k)) for k in keys) + " |")
        for key in ("error", "eval_error", "decode_error", *[k for k in keys if k.startswith("logits_err")]):
            if isinstance(row.get(key), str):
                notes.append(f"{row['shape']} {row['tool']} {key}: {row[key]}")
        if runtime.startswith("onnxruntime ("):
            notes.append(f"{row['shape']} {row['tool']} decode in: {runtime}")
    return "\n".join(lines + [""] + notes)


def _better(run: dict[str, Any], kept: dict[str, Any] | None) -> bool:
    """Whether ``run`` replaces ``kept`` as a figure's best round (a failure only when nothing ran)."""
    if kept is None or "error" in kept:
        return kept is None or "error" not in run
    return "error" not in run and run["decode_ms_per_token"] < kept["decode_ms_per_token"]


def decode_side_by_side(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--decode-only``: every named directory's genai decode ms/token at each context, ``--rounds``
    interleaved rounds (each figure its best round), with tokens/s and the ratio to the faster peer."""
    named = dict(item.split("=", 1) for item in args.decode_only.split(","))
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for turn in range(args.rounds):
        for context in map(int, args.contexts.split(",")):
            for name, out in named.items():
                run = child("genai_decode", out, context, args.steps, timeout=args.timeout)
                print(json.dumps({"round": turn, "name": name, "context": context, **run}), flush=True)
                if _better(run, best.get((name, context))):
                    best[(name, context)] = run
    rows = []
    for (name, context), run in best.items():
        peers = [best[(p, context)] for p in args.peers.split(",") if (p, context) in best]
        faster = min((p["decode_ms_per_token"] for p in peers if "error" not in p), default=None)
        row: dict[str, Any] = {"name": name, "context": context, **run}
        if "error" not in run:
            row["tokens_per_s"] = round(1000 / run["decode_ms_per_token"], 2)
            if faster:
                row["x_faster_peer"] = round(faster / run["decode_ms_per_token"], 3)
        rows.append(row)
    return rows


def decode_table(rows: list[dict[str, Any]]) -> str:
    """``--decode-only``'s rows as a Markdown table (best round of each)."""
    lines = [
        "| directory | context | decode ms/token | tokens/s | x the faster peer's tokens/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in sorted(rows, key=lambda r: (r["context"], r["name"])):
        cells = [
            row.get(k, row.get("error", "-"))
            for k in ("decode_ms_per_token", "tokens_per_s", "x_faster_peer")
        ]
        lines.append(f"| {row['name']} | {row['context']} | " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":  # one step in a child process: its result as JSON
        hf_hybrid.pure_torch_gated_delta()  # HF's torch path (attnx's reference), never fla's GPU kernels
        print(json.dumps(CHILDREN[sys.argv[2]](*sys.argv[3:])), flush=True)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="0.8b,2b", help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma list of {', '.join(TOOLS)}")
    parser.add_argument("--work", type=Path, default=Path("scale-work"), help="model directories and outputs")
    parser.add_argument("--lengths", default="37,130", help="lengths of the logits check")
    parser.add_argument("--prefill", default="512", help="prompt tokens of the prefill and decode timings")
    parser.add_argument("--steps", default="32", help="decoded tokens of the decode timing")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per tool and per step")
    parser.add_argument("--mobius-python", help="an interpreter that imports mobius (mobius-onnx 0.1.0)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--decode-only", help="NAME=DIR,...: only genai decode, side by side (see above)")
    parser.add_argument("--contexts", default="256,4096", help="--decode-only: prompt lengths")
    parser.add_argument("--rounds", type=int, default=2, help="--decode-only: interleaved rounds")
    parser.add_argument("--peers", default="builder,mobius", help="--decode-only: the peers' names")
    args = parser.parse_args()
    if args.decode_only:
        rows = decode_side_by_side(args)
        print(decode_table(rows))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
        return
    args.tools = args.tools.split(",")
    for name, given, known in (("shape", args.shapes.split(","), SHAPES), ("tool", args.tools, TOOLS)):
        if unknown := sorted(set(given) - set(known)):
            parser.error(f"unknown {name} {', '.join(unknown)} (of {', '.join(known)})")
    args.work = args.work.resolve()
    rows = []
    for shape in args.shapes.split(","):
        rows += measure(shape, args)
    print(table(rows, args.lengths.split(","), args.prefill))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
