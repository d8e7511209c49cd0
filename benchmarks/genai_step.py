#!/usr/bin/env python
"""One decode step of onnxruntime-genai model directories, in plain ONNX Runtime (states bound as genai
binds them) or in onnxruntime-genai itself.

    python benchmarks/genai_step.py attnx=OUT builder=BUILDER_DIR --context 256
    python benchmarks/genai_step.py a=OUT1 b=OUT2 --context 4096 --rounds 8 --json step.json
    python benchmarks/genai_step.py attnx=OUT builder=BUILDER_DIR --context 4096 --runtime genai --rounds 1

Each directory's decoder graph (``genai_config.json``'s ``model.decoder.filename``) runs one new token after
``--context`` tokens of (random) state. Recurrent and conv states have their input and output bound to one
``OrtValue``, as genai binds them on the CPU; a KV cache is bound the same way where the config shares past
and present (``search.past_present_share_buffer``, a buffer of ``--context`` plus ``--capacity`` tokens),
else its present is a new output each step, as genai's growing cache is. The step is timed without genai's
own work around it (sampling, its cache bookkeeping), so graphs compare on their nodes alone.

``--floor`` adds a row per directory for its decoder's weights alone: every node that multiplies by a stored
weight (``MatMulNBits``, ``MatMul``, ``Gemm``) run once for one token, each on an input of its own and with
nothing between them. No graph over the same weights and kernels steps faster than that, so it bounds what
trimming the rest of a graph can gain (``step / floor``), and one directory's floor against another's step
bounds the ratio any graph over the first's weights can reach.

``--runtime genai`` times what a user gets instead: ``onnxruntime_genai`` generates greedily after a prompt
of ``--context`` random token ids (its ``max_length`` the prompt, the steps and one more, which sizes a
shared KV buffer), each ``generate_next_token`` timed; the prompt's time is printed too.

Prints the median of ``--steps`` steps per round, rounds interleaved over the directories, and the least
median.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

WEIGHT_OPS = {"MatMulNBits": 1, "MatMul": 1, "Gemm": 1}  # op -> the input that holds its stored weight


def step_binding(directory: Path, context: int, capacity: int) -> tuple[ort.InferenceSession, Any]:
    """The decoder's session and an IO binding of one token after ``context`` tokens of state."""
    config = json.loads((directory / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    shared = bool(config.get("search", {}).get("past_present_share_buffer", False))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    session = ort.InferenceSession(
        str(directory / decoder["filename"]), options, providers=["CPUExecutionProvider"]
    )
    head_size = decoder.get("head_size")
    binding, rng = session.io_binding(), np.random.default_rng(0)
    for spec in session.get_inputs():
        if spec.name == "input_ids":
            binding.bind_cpu_input(spec.name, np.array([[5]], dtype=np.int64))
        elif spec.name == "position_ids":  # (batch, seq), or (3, batch, seq) for multimodal rotary
            shape = [axis if isinstance(axis, int) else 1 for axis in spec.shape]
            binding.bind_cpu_input(spec.name, np.full(shape, context, dtype=np.int64))
        elif spec.name == "attention_mask":
            binding.bind_cpu_input(spec.name, np.ones((1, context + 1), dtype=np.int64))
        else:
            cache = spec.name.startswith("past_key_values")
            length = context + capacity if cache and shared else context
            sizes = {"batch": 1, "batch_size": 1, "kv_cache_dim": head_size}
            shape = [axis if isinstance(axis, int) else sizes.get(axis, length) for axis in spec.shape]
            state = ort.OrtValue.ortvalue_from_numpy((rng.standard_normal(shape) * 0.01).astype(np.float32))
            binding.bind_ortvalue_input(spec.name, state)
            present = spec.name.replace("past_key_values", "present").replace("past.", "present.")
            if cache and not shared:
                binding.bind_output(present)
            else:
                binding.bind_ortvalue_output(present, state)
    binding.bind_output("logits")
    return session, binding


def floor_binding(directory: Path) -> tuple[ort.InferenceSession, Any]:
    """The session of ``directory``'s decoder reduced to its weight-reading nodes (:data:`WEIGHT_OPS` whose
    weight is an initializer), each fed one token of its own input, and its binding."""
    config = json.loads((directory / "genai_config.json").read_text())
    path = directory / config["model"]["decoder"]["filename"]
    model = onnx.load(str(path), load_external_data=False)
    stored = {init.name: init for init in model.graph.initializer}
    # a float32 export stores torch's (out, in) weights and transposes them in the graph (folded at load)
    transposed = {
        node.output[0]: node
        for node in model.graph.node
        if node.op_type == "Transpose" and node.input[0] in stored
    }
    nodes, inputs, outputs, kept = [], [], [], {}
    for node in model.graph.node:
        index = WEIGHT_OPS.get(node.op_type)
        if index is None or (node.input[index] not in stored and node.input[index] not in transposed):
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMulNBits":
            width = attributes["K"]
        elif node.input[index] in transposed:
            nodes.append(transposed[node.input[index]])
            width = stored[transposed[node.input[index]].input[0]].dims[-1]
        else:
            width = stored[node.input[index]].dims[-1 if attributes.get("transB") else 0]
        name = f"floor{len(nodes)}"
        inputs.append(helper.make_tensor_value_info(f"{name}/x", onnx.TensorProto.FLOAT, [1, width]))
        outputs.append(helper.make_tensor_value_info(f"{name}/y", onnx.TensorProto.FLOAT, None))
        copy = helper.make_node(
            node.op_type, [f"{name}/x", *node.input[1:]], [f"{name}/y"], domain=node.domain
        )
        copy.attribute.extend(node.attribute)
        nodes.append(copy)
        weights = [*node.input[1:], *(transposed[n].input[0] for n in node.input[1:] if n in transposed)]
        kept.update({n: stored[n] for n in weights if n in stored})
    graph = helper.make_graph(nodes, "floor", inputs, outputs, list(kept.values()))
    floor = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(directory))
    session = ort.InferenceSession(floor.SerializeToString(), options, providers=["CPUExecutionProvider"])
    binding, rng = session.io_binding(), np.random.default_rng(0)
    for spec in session.get_inputs():
        binding.bind_cpu_input(spec.name, rng.standard_normal(spec.shape).astype(np.float32))
    for spec in session.get_outputs():
        binding.bind_output(spec.name)
    read, held = (sum(_bytes(t) for t in tensors) / 2**20 for tensors in (kept.values(), stored.values()))
    print(
        f"{directory}: floor of {len(inputs)} weight nodes,"
        f" {read:.0f} of the decoder's {held:.0f} MiB stored",
        flush=True,
    )
    return session, binding


def _bytes(tensor: onnx.TensorProto) -> int:
    """A stored tensor's bytes, whether inline or external."""
    external = {e.key: e.value for e in tensor.external_data}
    if "length" in external:
        return int(external["length"])
    return (
        len(tensor.raw_data)
        or int(np.prod(tensor.dims)) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    )


def plain_step(run: tuple[ort.InferenceSession, Any], steps: int) -> list[float]:
    """``steps`` one-token steps of a :func:`step_binding` in plain ONNX Runtime (ms), after a warm-up."""
    session, binding = run
    session.run_with_iobinding(binding)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append(1000 * (time.perf_counter() - start))
    return times


def genai_steps(model: Any, directory: Path, context: int, steps: int) -> list[float]:
    """``steps`` greedy tokens of onnxruntime-genai ``model`` (of ``directory``) after a random prompt of
    ``context`` ids (ms each; the first, which follows the prompt, left out)."""
    import onnxruntime_genai as og

    vocab = json.loads((directory / "genai_config.json").read_text())["model"]["vocab_size"]
    prompt = np.random.default_rng(0).integers(1, min(vocab, 1000), size=(1, context)).astype(np.int32)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=context + steps + 2, do_sample=False)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(prompt)
    print(f"{directory}: prompt of {context} tokens {time.perf_counter() - start:.1f} s", flush=True)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        generator.generate_next_token()
        times.append(1000 * (time.perf_counter() - start))
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="+", help="NAME=DIR: an onnxruntime-genai model directory")
    parser.add_argument("--context", type=int, default=256, help="tokens of state before the step")
    parser.add_argument("--capacity", type=int, default=256, help="free tokens of a shared KV buffer")
    parser.add_argument("--steps", type=int, default=15, help="steps per round (their median is kept)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds, interleaved over the models")
    parser.add_argument("--runtime", choices=("ort", "genai"), default="ort", help="what runs the steps")
    parser.add_argument("--floor", action="store_true", help="also time each decoder's weight nodes alone")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    named = {name: Path(path) for name, path in (item.split("=", 1) for item in args.models)}
    if args.runtime == "genai":
        import onnxruntime_genai as og

        models = {name: og.Model(str(directory)) for name, directory in named.items()}
        run = {
            name: functools.partial(genai_steps, models[name], named[name], args.context, args.steps)
            for name in named
        }
    else:
        bound = {name: step_binding(named[name], args.context, args.capacity) for name in named}
        if args.floor:
            bound.update({f"{name} floor": floor_binding(named[name]) for name in named})
        run = {name: functools.partial(plain_step, bound[name], args.steps) for name in bound}
    medians: dict[str, list[float]] = {name: [] for name in run}
    for _ in range(args.rounds):
        for name in run:
            medians[name].append(round(statistics.median(run[name]()), 2))
    rows = {name: {"medians_ms": values, "least_ms": min(values)} for name, values in medians.items()}
    for name, row in rows.items():
        print(f"{name:>16}  least {row['least_ms']:7.2f} ms  rounds {row['medians_ms']}")
    if args.json:
        report = {"context": args.context, "runtime": args.runtime, "rows": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
