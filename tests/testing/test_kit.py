"""The conformance kit catches seeded mistakes, each with a message naming the broken promise."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from attnx.errors import AttnxError
from attnx.ops import AttentionOp
from attnx.registry import Registry
from attnx.state import StateTensor, kv_cache
from attnx.testing import CHECKS, ConformanceError, check_variant, conformance_tests
from attnx.testing.checks.causality import ROUNDING_ULPS, rounding_bound
from attnx.testing.checks.decode import state_problem
from attnx.testing.checks.fp16_convert import converters
from attnx.testing.checks.onnx_body import schema_problems
from attnx.testing.checks.plugin import ShapeExpr
from attnx.testing.subject import BATCH
from tests.models.cases import decoders
from tests.testing import seeded_decode_plugins, seeded_plugins

LIGHT = [c.name for c in CHECKS if not c.heavy]


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry(plugins=[("seeded", seeded_plugins, "test")], autoload=True)


def failures(report) -> dict[str, str]:
    return {r.check: "\n".join(r.problems) for r in report.failures}


def test_the_sound_control_passes_every_light_check(registry):
    report = check_variant("seeded_sound", registry=registry, heavy=False)
    assert report.passed, str(report)
    assert [r.check for r in report.results] == LIGHT
    assert all(r.status == "passed" for r in report.results), str(report)


def test_a_fake_impl_that_lies_about_the_shape_is_named(registry):
    report = check_variant("seeded_fake", registry=registry, heavy=False)
    assert set(failures(report)) == {"fake-impl"}, str(report)
    message = failures(report)["fake-impl"]
    assert "fake impl of attnx_seeded::fake_attention returns shape (3, 2, 11, 16)" in message
    assert "but eager returns (3, 2, 11, 8)" in message
    with pytest.raises(ConformanceError, match="register_fake returns the eager output's shape"):
        report.raise_for_failures()


def test_a_body_that_forgets_the_scale_is_named(registry):
    report = check_variant("seeded_scale", registry=registry, heavy=False)
    assert set(failures(report)) == {"onnx-body"}, str(report)
    message = failures(report)["onnx-body"]
    assert "ONNX body of attnx::SeededScaleAttention (opset 18) differs from the torch op" in message
    assert "attnx_seeded::scale_attention: max abs err" in message
    assert "causal=True" in message


def test_a_body_that_computes_in_float32_passes_in_fp32_and_is_named_in_fp16(registry):
    report = check_variant("seeded_upcast", registry=registry, checks=[*LIGHT, "export-fp16"])
    assert set(failures(report)) == {"export-fp16"}, str(report)
    assert "export with the function lowering in fp16 failed" in failures(report)["export-fp16"]
    control = check_variant("seeded_sound", registry=registry, checks=["export-fp16"])
    assert control.passed, str(control)


def test_a_float32_literal_in_a_body_is_named_only_once_a_converter_rewrote_the_export(registry):
    """The body widens with Cast(to=FLOAT) and scales by a float32 literal: right in fp32 and in a native
    fp16 export, but an fp16 converter retypes the inlined Cast's output and the Mul mixes types.
    (causality is left out: it tests the torch op, which is the sound one, and is BLAS-sensitive.)"""
    checks = [c for c in LIGHT if c != "causality"] + ["export-fp16", "fp16-convert"]
    report = check_variant("seeded_float32", registry=registry, checks=checks)
    assert set(failures(report)) == {"fp16-convert"}, str(report)
    message = failures(report)["fp16-convert"]
    for converter in converters():
        assert f"the decomposed-lowered export converted to fp16 by {converter} does not run" in message
    assert "function-lowered" not in message  # converters do not visit function bodies


@pytest.mark.slow
def test_the_sound_control_survives_the_fp16_converters(registry):
    assert converters(), "no fp16 converter installed"
    report = check_variant("seeded_sound", registry=registry, checks=["fp16-convert"])
    assert report.passed, str(report)


def test_a_causal_mode_that_leaks_future_tokens_is_named(registry):
    report = check_variant("seeded_leak", registry=registry, heavy=False)
    assert set(failures(report)) == {"causality"}, str(report)
    message = failures(report)["causality"]
    assert "the causal layer's outputs before position 1 change" in message
    assert "attnx_seeded::leak_attention (torch) in causal mode leaks future tokens" in message
    assert "the ONNX body of attnx::SeededLeakAttention in causal mode leaks future tokens" in message


def test_causality_allows_rounding_and_a_leak_exceeds_it_by_orders_of_magnitude(registry):
    """The bound is ROUNDING_ULPS ulps of the output's magnitude (a correct op moves earlier outputs by
    ~1 ulp on some CPUs); the seeded leak moves them more than 1000 times that."""
    reference = torch.tensor([0.5, -2.0, 1.0])
    assert rounding_bound(reference) == ROUNDING_ULPS * torch.finfo(torch.float32).eps * 2.0
    assert rounding_bound(reference.half()) == ROUNDING_ULPS * torch.finfo(torch.float16).eps * 2.0
    assert rounding_bound(torch.tensor([3, 4])) == 0.0
    report = check_variant("seeded_leak", registry=registry, checks=["causality"])
    found = re.findall(r"by ([0-9.e+-]+) \(allowed ([0-9.e+-]+)", failures(report)["causality"])
    assert found and all(float(change) > 1000 * float(allowed) > 0 for change, allowed in found)


def test_a_backward_that_drops_a_term_is_named(registry):
    report = check_variant("seeded_grad", registry=registry, heavy=False)
    assert set(failures(report)) == {"gradients"}, str(report)
    message = failures(report)["gradients"]
    assert "attnx_seeded::grad_attention has wrong gradients with respect to q: along a random direction" in (
        message
    )
    assert "a central difference" in message and "causal=True" in message


def test_a_variant_that_does_not_declare_trainable_must_refuse_backward(registry):
    sound = seeded_plugins.VARIANTS["sound"]
    undeclared = dataclasses.replace(
        sound, name="seeded_undeclared", capabilities=dataclasses.replace(sound.capabilities, trainable=False)
    )
    report = check_variant(undeclared, checks=["gradients"])
    assert "does not declare trainable, but backward through its self layer returns gradients" in str(report)
    without_backward = check_variant("sigmoid_test", registry=third_party_registry(), checks=["gradients"])
    assert without_backward.passed, str(without_backward)  # no backward registered: torch refuses


def third_party_registry() -> Registry:
    from tests.third_party import sigmoid_plugin

    return Registry(plugins=[("sigmoid", sigmoid_plugin, "test")], autoload=False)


def test_a_library_function_named_like_another_variants_is_named(registry):
    report = check_variant("seeded_clash", registry=registry, checks=["onnx-schema", "onnx-body"])
    assert set(failures(report)) == {"onnx-schema"}, str(report)
    assert (
        "ONNX library function attnx.lib::SoftmaxMix is defined by variant 'seeded_clash' and differently by "
        "'softmax'" in failures(report)["onnx-schema"]
    )


def test_bad_options_must_be_rejected_with_attnx_error(registry):
    report = check_variant("softmax", registry=registry, checks=["contract"], bad_options={"scale": 2.0})
    assert "bad option scale=2.0 is accepted; SoftmaxConfig.validate() must raise AttnxError" in str(report)
    assert check_variant(
        "softmax", registry=registry, checks=["contract"], bad_options={"scale": -1.0}
    ).passed


def test_causality_is_skipped_for_a_variant_that_does_not_declare_it(registry):
    report = check_variant("fastformer", registry=registry, checks=["causality"])
    (result,) = report.results
    assert result.status == "skipped" and "does not declare causal attention" in result.problems[0]
    assert not report.passed  # nothing ran


def test_unknown_check_names_are_refused():
    with pytest.raises(AttnxError, match="unknown conformance check 'onnx-bodies'; did you mean 'onnx-body'"):
        check_variant("softmax", checks=["onnx-bodies"])


def test_conformance_tests_gives_one_pytest_item_per_check(registry):
    slow = pytest.mark.slow
    test = conformance_tests("seeded_leak", registry=registry, heavy_marks=[slow])
    (parametrize,) = [m for m in test.pytestmark if m.name == "parametrize"]
    params = parametrize.args[1]
    assert [p.id for p in params] == [c.name for c in CHECKS]
    assert {p.id for p in params if any(m.name == "slow" for m in p.marks)} == {
        c.name for c in CHECKS if c.heavy
    }
    test("fake-impl")  # passes
    with pytest.raises(pytest.fail.Exception, match="causality: causal mode never reads future tokens"):
        test("causality")


def test_conformance_tests_takes_marks_per_check(registry):
    leak = pytest.mark.xfail(reason="documented limitation", strict=True)
    test = conformance_tests("seeded_leak", registry=registry, marks={"causality": [leak]})
    (parametrize,) = [m for m in test.pytestmark if m.name == "parametrize"]
    assert {p.id: [m.name for m in p.marks] for p in parametrize.args[1]}["causality"] == ["xfail"]
    with pytest.raises(AttnxError, match="unknown conformance check 'causal'"):
        conformance_tests("seeded_leak", registry=registry, marks={"causal": [leak]})


def test_conformance_tests_fails_cleanly_for_an_unknown_variant(registry):
    test = conformance_tests("windo", registry=registry)
    with pytest.raises(pytest.fail.Exception, match="conformance: unknown variant 'windo'"):
        test("contract")


def test_conformance_tests_skips_what_does_not_apply(registry):
    test = conformance_tests("fastformer", registry=registry, checks=["causality"])
    with pytest.raises(pytest.skip.Exception, match="does not declare causal attention"):
        test("causality")


def test_shape_expressions_allow_arithmetic_and_refuse_branching():
    a, b = ShapeExpr(6), ShapeExpr(4)
    assert ((a + b) * 2 - 1).value == 19 and (a // 4 + 3 - b).value == 0 and (12 // a).value == 2
    for refused in (lambda: a == 6, lambda: a > b, lambda: bool(a), lambda: int(a), lambda: range(a)):
        with pytest.raises(TypeError, match="TensorRT shape expressions"):
            refused()


def test_bodies_that_disagree_with_the_schema_are_named():
    from attnx.plugins.linear.kernel import LinearAttentionNoMask
    from attnx.plugins.softmax.kernel import (
        SoftmaxAttention,
        SoftmaxAttentionNoMask,
        SoftmaxAttentionStandard,
        SoftmaxAttentionStandardNoMask,
        softmax_attention,
    )

    def problems(*bodies) -> str:
        return "\n".join(schema_problems(AttentionOp("Probe", softmax_attention, bodies)))

    assert problems(SoftmaxAttention, SoftmaxAttentionNoMask) == ""
    assert problems(SoftmaxAttention, SoftmaxAttentionNoMask, SoftmaxAttentionStandardNoMask) == ""
    unpaired = problems(SoftmaxAttention, SoftmaxAttentionStandard, SoftmaxAttentionStandardNoMask)
    assert (
        "body SoftmaxAttentionStandardNoMask of Probe (opset 23) takes inputs (q, k, v) that no body at the "
        "lowest opset (18) takes" in unpaired
    )
    assert "the first body must take every schema input (q, k, v, key_padding_mask)" in problems(
        SoftmaxAttentionNoMask
    )
    assert "has attributes (causal, chunk_size, eps) but the torch op has (causal, scale)" in problems(
        SoftmaxAttention, LinearAttentionNoMask
    )
    assert "take the same inputs at opset 18; only one would ever be used" in problems(
        SoftmaxAttention, SoftmaxAttentionNoMask, SoftmaxAttentionNoMask
    )


# -- decode: prefill + steps against the full causal forward (tests/testing/seeded_decode_plugins.py) -----

DECODE_AND_LIGHT = [*LIGHT, "decode"]


@pytest.fixture(scope="module")
def decode_registry() -> Registry:
    return Registry(plugins=[("seeded_decode", seeded_decode_plugins, "test")], autoload=True)


def test_the_decode_control_passes_every_light_check_and_decode(decode_registry):
    """A causal-only layer whose step is its own (a convolution carry beside a recurrent state)."""
    report = check_variant("seeded_decode_sound", registry=decode_registry, checks=DECODE_AND_LIGHT)
    assert report.passed, str(report)
    assert {r.check: r.status for r in report.results}["decode"] == "passed"


def test_a_step_that_drops_its_state_is_named_by_decode_only(decode_registry):
    report = check_variant("seeded_decode_forgets", registry=decode_registry, checks=DECODE_AND_LIGHT)
    assert set(failures(report)) == {"decode"}, str(report)
    message = failures(report)["decode"]
    assert "torch: the step of 1 token at position 4 differs from the full causal forward" in message
    assert "ONNX Runtime: the step of 4 tokens at position 7 differs" in message
    assert "the prompt" not in message  # right for the first call: only a check that steps sees it


def test_a_step_body_that_forgets_the_state_is_named_through_onnx_runtime_only(decode_registry):
    report = check_variant("seeded_decode_onnx", registry=decode_registry, checks=DECODE_AND_LIGHT)
    assert set(failures(report)) == {"decode"}, str(report)
    message = failures(report)["decode"]
    assert "ONNX Runtime: the step of 1 token at position 4 differs" in message and "torch:" not in message


def test_a_state_whose_size_follows_the_position_is_named():
    """Only a KV cache's declared growing axis may grow: a recurrent state must keep its declared shape."""
    declared = [StateTensor("recurrent", ("batch", 2, 8, 8), "float32")]
    grown = torch.zeros(BATCH, 2, 9, 8)
    assert "after 9 tokens state 'recurrent' is (3, 2, 9, 8) float32; declared (3, 2, 8, 8) float32" in (
        state_problem(declared, [grown], 9)
    )
    cache = kv_cache(2, 8)
    assert state_problem(cache, [torch.zeros(BATCH, 2, 5, 8)] * 2, 5) is None
    assert "declared (3, 2, 6, 8)" in state_problem(cache, [torch.zeros(BATCH, 2, 5, 8)] * 2, 6)


@pytest.mark.slow  # test_builtins_conform runs decode on every built-in in the slow run too
@pytest.mark.parametrize("variant", decoders())
def test_attnxs_own_decoders_pass_decode(variant):
    """Every built-in that declares decode steps like its full forward, in torch and ONNX Runtime."""
    report = check_variant(variant, checks=["decode"])
    assert report.passed, str(report)


def test_decode_is_skipped_for_a_variant_that_does_not_declare_it(registry):
    (result,) = check_variant("seeded_sound", registry=registry, checks=["decode"]).results
    assert result.status == "skipped" and "does not declare decode" in result.problems[0]
