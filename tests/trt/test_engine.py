"""The builder settings ``attnx build`` hands TensorRT, against stand-ins of TensorRT 10 and 11's enums."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnx.trt.engine import EngineRequest, configure, network_flags
from attnx.trt.precision import precision_plan
from tests.trt import stub_tensorrt as stub


class Recorder:
    """An IBuilderConfig / IBuilder / IOptimizationProfile stand-in that records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        def record(*args):
            self.calls.append((name, *args))
            return self if name == "create_optimization_profile" else None

        return record

    def __setattr__(self, name, value):
        if name == "calls":
            object.__setattr__(self, name, value)
        else:
            self.calls.append(("set " + name, value))


PROFILE = {"input_ids": {"min": [1, 1], "opt": [2, 128], "max": [8, 512]}}


def request(version: tuple[int, int], dtype: str, fp16: bool, workspace=None, plugins=None) -> EngineRequest:
    precision = precision_plan(version, dtype, fp16, "out")
    return EngineRequest(Path("m.onnx"), PROFILE, workspace, precision, plugins)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_tensorrt_11_builds_touch_no_precision_flag(dtype):
    trt = stub.tensorrt_module("11.4.0.106")
    assert not hasattr(trt.BuilderFlag, "FP16")  # what TensorRT 11 removed
    builder = config = Recorder()
    configure(trt, builder, config, request((11, 4), dtype, fp16=dtype == "fp16"))
    assert ("set_flag", 0) not in config.calls
    assert config.calls == [
        ("set profiling_verbosity", trt.ProfilingVerbosity.DETAILED),
        ("clear_flag", trt.BuilderFlag.TF32),
        ("create_optimization_profile",),
        ("set_shape", "input_ids", [1, 1], [2, 128], [8, 512]),
        ("add_optimization_profile", config),
    ]


@pytest.mark.parametrize(("dtype", "fp16", "flag"), [("fp32", False, False), ("fp32", True, True),
                                                     ("fp16", False, True)])  # fmt: skip
def test_tensorrt_10_builds_keep_the_fp16_flag(dtype, fp16, flag):
    trt = stub.tensorrt_module("10.14.1.48")
    config = Recorder()
    configure(trt, Recorder(), config, request((10, 14), dtype, fp16, workspace=1 << 30))
    assert (("set_flag", trt.BuilderFlag.FP16) in config.calls) == flag
    assert ("set_memory_pool_limit", trt.MemoryPoolType.WORKSPACE, 1 << 30) in config.calls


def test_network_flags_carry_only_the_plugin_preference():
    trt = stub.tensorrt_module("11.4.0.106")
    assert network_flags(trt, "aot") == 1 << 2 and network_flags(trt, "jit") == 1 << 1
    assert network_flags(trt, None) == 0  # never STRONGLY_TYPED: deprecated and ignored on 11
    del trt.NetworkDefinitionCreationFlag.PREFER_AOT_PYTHON_PLUGINS  # a TensorRT without AOT plugins
    assert network_flags(trt, "aot") == 0
