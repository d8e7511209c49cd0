"""TensorRT version detection and the precision decision, for every (TensorRT, export dtype, --fp16)."""

from __future__ import annotations

import pytest

from attnx.errors import AttnxError
from attnx.trt import triton_missing, version_tuple
from attnx.trt.precision import PrecisionPlan, precision_plan


@pytest.mark.parametrize(
    ("text", "expected"),
    [("11.4.0.106", (11, 4)), ("10.14.1.48.post1", (10, 14)), ("10.8.0.43", (10, 8)), ("11.0", (11, 0))],
)
def test_version_tuple(text, expected):
    assert version_tuple(text) == expected


def test_an_unreadable_version_is_one_line():
    with pytest.raises(AttnxError, match="cannot read the TensorRT version 'eleven'; reinstall tensorrt"):
        version_tuple("eleven")


# (TensorRT, export dtype, --fp16) -> (typing, FP16 builder flag), or the refusal
DECISIONS = {
    ((10, 14), "fp32", False): ("weak", False),
    ((10, 14), "fp32", True): ("weak", True),
    ((10, 14), "fp16", False): ("weak", True),
    ((10, 14), "fp16", True): ("weak", True),
    ((11, 4), "fp32", False): ("strong", False),
    ((11, 4), "fp32", True): "refused",
    ((11, 4), "fp16", False): ("strong", False),
    ((11, 4), "fp16", True): ("strong", False),
    ((12, 0), "fp32", True): "refused",
}


@pytest.mark.parametrize(("version", "dtype", "fp16"), list(DECISIONS))
def test_precision_decision(version, dtype, fp16):
    expected = DECISIONS[version, dtype, fp16]
    if expected == "refused":
        with pytest.raises(AttnxError) as info:
            precision_plan(version, dtype, fp16, "out")
        message = str(info.value)
        assert "\n" not in message and message.startswith("--fp16: out is an fp32 export")
        assert "`attnx export --dtype fp16`" in message
        assert "`attnx optimize out -o out-fp16 --fp16`" in message
        return
    plan = precision_plan(version, dtype, fp16, "out")
    assert (plan.typing, plan.fp16_flag, plan.export_dtype) == (*expected, dtype)


def test_strong_typing_never_sets_the_removed_flag():
    for (version, dtype, fp16), expected in DECISIONS.items():
        if version[0] >= 11 and expected != "refused":
            assert not precision_plan(version, dtype, fp16, "out").fp16_flag


def test_too_old_tensorrt_is_refused():
    with pytest.raises(AttnxError, match=r"TensorRT 10.7 is too old for attnx build \(needs >= 10.8\)"):
        precision_plan((10, 7), "fp32", False, "out")
    with pytest.raises(AttnxError, match="TensorRT 8.6 is too old"):
        precision_plan((8, 6), "fp16", True, "out")


def test_descriptions_say_where_the_precision_comes_from():
    assert PrecisionPlan("strong", False, "fp16").describe() == (
        "strongly typed: the engine computes in the export's fp16"
    )
    assert "BuilderFlag.FP16" in PrecisionPlan("weak", True, "fp32").describe()
    assert PrecisionPlan("weak", False, "fp32").describe() == "weakly typed fp32 export, fp32 kernels"


def test_triton_availability(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "TRITON_INTERPRET is set" in triton_missing()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert triton_missing() is None  # triton is in the dev extra
