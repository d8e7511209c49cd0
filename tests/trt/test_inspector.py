"""What a built engine holds, read from engine-inspector JSON; the manifest's engine section round trip.

The samples in tests/trt/data are hand-written in the inspector's documented shape (no engine could
be built here): ``engine_info_trt10.json`` uses TensorRT 10's combined "Format/Datatype" strings,
``engine_info_trt11.json`` TensorRT 11's separate "Datatype"/"Format" keys.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import EngineSection, Manifest, PluginLayer, sha256_file
from attnx.trt.inspector import layer_precision, read_engine_information, tensor_precision

DATA = Path(__file__).parent / "data"


def sample(version: int) -> dict:
    return json.loads((DATA / f"engine_info_trt{version}.json").read_text())


def test_trt10_sample_counts_layers_by_output_type():
    layers = read_engine_information(sample(10))
    assert layers.precisions == {"fp32": 4, "fp16": 3, "int64": 1}
    assert layers.layer_types == {"Reformat": 2, "MatrixMultiply": 2, "PluginV3": 1, "Shape": 1,
                                  "ElementWise": 1, "NoOp": 1}  # fmt: skip
    assert layers.plugin_layers == [
        PluginLayer("node_softmax_attention", "PluginV3", "fp16", "0x0000000000000002")
    ]
    assert layers.has_fp16 and layers.describe() == "8 layers (4 fp32, 3 fp16, 1 int64), 1 plugin layer(s)"


def test_trt11_sample_reads_the_separate_datatype_key():
    layers = read_engine_information(json.dumps(sample(11)))  # the inspector returns text
    assert layers.precisions == {"fp32": 5, "bool": 1}
    assert not layers.has_fp16
    assert [(p.name, p.plugin, p.precision, p.tactic) for p in layers.plugin_layers] == [
        ("layers.0.attention", "attnx::SoftmaxAttention", "fp32", "1"),
        ("layers.1.attention", "PluginV3", "fp32", None),
    ]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"Format/Datatype": "Row major linear FP32"}, "fp32"),
        ({"Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}, "fp16"),
        ({"Format/Datatype": "Row major linear Int64 format"}, "int64"),
        ({"Datatype": "Half", "Format": "Row major linear"}, "fp16"),
        ({"Datatype": "Float", "Format": "Row major linear"}, "fp32"),
        ({"Datatype": "BFloat16"}, "bf16"),
        ({"Datatype": "Float8E4M3"}, "fp8"),
        ({"Datatype": "UInt8"}, "uint8"),
        ({"Datatype": "Int8"}, "int8"),
        ({"Datatype": "Bool"}, "bool"),
        ({"Name": "x"}, "unknown"),
    ],
)
def test_tensor_precision(entry, expected):
    assert tensor_precision(entry) == expected


def test_layers_without_outputs_use_their_inputs_and_bare_strings_are_unknown():
    assert layer_precision({"Inputs": [{"Datatype": "Half"}], "Outputs": []}) == "fp16"
    assert layer_precision({"Name": "x"}) == "unknown"
    layers = read_engine_information({"Layers": ["conv1 + relu", "fc"], "Bindings": []})  # DETAILED not set
    assert layers.precisions == {"unknown": 2} and not layers.plugin_layers


def section(model_sha256: str = "0" * 64) -> EngineSection:
    layers = read_engine_information(sample(11))
    return EngineSection(
        model_sha256=model_sha256, tensorrt="11.4.0.106", device="NVIDIA H100", fp16=layers.has_fp16,
        workspace=1 << 30, profiles=[{"input_ids": {"min": [1, 1], "opt": [2, 128], "max": [8, 512]}}],
        plugins=["attnx::SoftmaxAttention"], typing="strong", plugin_mode="aot", needs_python=False,
        precisions=layers.precisions, layer_types=layers.layer_types, plugin_layers=layers.plugin_layers,
    )  # fmt: skip


@pytest.fixture
def softmax_out(plugin_export, tmp_path):
    return shutil.copytree(plugin_export("softmax"), tmp_path / "out")


def test_engine_section_round_trips_through_the_manifest(softmax_out):
    (softmax_out / "engine.plan").write_bytes(b"engine bytes")
    export = ExportDir.open(softmax_out)
    record = section(sha256_file(softmax_out / "model.onnx"))
    export.record_engine("engine.plan", record)
    reopened = ExportDir.open(softmax_out).manifest
    assert reopened.engine == record
    assert reopened.files["engine"].sha256 == sha256_file(softmax_out / "engine.plan")
    data = json.loads((softmax_out / "attnx.json").read_text())["engine"]
    assert data["plugin_layers"][0] == {"name": "layers.0.attention", "plugin": "attnx::SoftmaxAttention",
                                        "precision": "fp32", "tactic": "1"}  # fmt: skip
    assert data["needs_python"] is False and data["plugin_mode"] == "aot" and data["typing"] == "strong"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"plugin_mode": "python"}, "engine: plugin_mode = 'python' must be one of 'aot', 'jit'"),
        ({"typing": "mixed"}, "engine: typing = 'mixed' must be one of 'strong', 'weak'"),
        ({"needs_python": "no"}, "engine: needs_python = 'no' must be a boolean"),
        ({"precisions": {"fp32": "many"}}, "engine: precisions"),
        ({"plugin_layers": [{"name": "x"}]}, "lacks 'plugin'"),
    ],
)
def test_a_mistyped_engine_section_is_refused_in_one_line(softmax_out, change, message):
    manifest = ExportDir.open(softmax_out).manifest
    data = json.loads(dataclasses.replace(manifest, engine=section()).to_json())
    data["engine"].update(change)
    with pytest.raises(AttnxError, match=message) as info:
        Manifest.from_json(json.dumps(data), "attnx.json")
    assert "\n" not in str(info.value)


def test_an_engine_section_without_the_new_fields_is_refused(softmax_out):
    manifest = ExportDir.open(softmax_out).manifest
    data = json.loads(dataclasses.replace(manifest, engine=section()).to_json())
    del data["engine"]["needs_python"]
    with pytest.raises(AttnxError, match="lacks 'needs_python'"):
        Manifest.from_json(json.dumps(data), "attnx.json")
