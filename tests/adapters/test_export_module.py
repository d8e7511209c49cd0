"""``attnx.export_module`` and ``attnx export --module``: any module, one export path, verify without it."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnx
from attnx.exporter.signature import flatten_outputs, input_specs
from tests.helpers import assert_one_line_error, run_cli
from tests.third_party.toy_library import ToyModel

FACTORIES = Path(__file__).with_name("factories.py")


class ModelOutput(collections.OrderedDict):
    """Like Hugging Face's ModelOutput: a dict whose None fields are left out."""


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (torch.zeros(1), ["output"]),
        ((torch.zeros(1), [torch.zeros(1), None]), ["output.0", "output.1.0"]),
        ({"logits": torch.zeros(1), "past": None, "hidden": (torch.zeros(1),)}, ["logits", "hidden.0"]),
        (ModelOutput(loss=None, logits=torch.zeros(1)), ["logits"]),
    ],
)
def test_outputs_are_flattened_deterministically(value, names):
    assert [name for name, _ in flatten_outputs(value)] == names


def test_a_decode_export_omits_the_inputs_a_forward_can_go_without():
    """The decode graphs take token ids only: a padding mask or position ids the forward has a default for,
    or takes among its ``**kwargs`` (fla: models' position_ids), are omitted; a required one is refused."""
    from attnx.decode.module import _check_omittable
    from attnx.errors import AttnxError
    from attnx.models.spec import TensorSpec

    class Defaults(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, position_ids=None): ...

    class Keywords(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, **kwargs): ...

    class Required(torch.nn.Module):
        def forward(self, input_ids, attention_mask): ...

    specs = [
        TensorSpec("attention_mask", "bool", ("batch", "seq")),
        TensorSpec("position_ids", "int64", ("batch", "seq")),
    ]
    _check_omittable(Defaults(), specs, "Defaults")
    _check_omittable(Keywords(), specs, "Keywords")
    with pytest.raises(AttnxError, match="also takes attention_mask .*required"):
        _check_omittable(Required(), specs[:1], "Required")
    with pytest.raises(AttnxError, match="also takes position_ids"):
        _check_omittable(Required(), specs[1:], "Required")


def test_inputs_are_named_and_a_dicts_plain_values_are_constants():
    ids = torch.randint(3, 17, (2, 9))
    specs, tensors, keywords, constants = input_specs(
        ToyModel(), {"input_ids": ids, "use_cache": False, "mask": torch.ones(2, 9, 4)}, {"mask": {1: "seq"}}
    )
    assert [(s.name, s.dtype, s.axes, s.high) for s in specs] == [
        ("input_ids", "int64", ("batch", "seq"), int(ids.max()) + 1),
        ("mask", "float32", (2, "seq", 4), None),
    ]
    assert keywords and constants == {"use_cache": False} and tensors[0] is ids
    specs, _, keywords, _ = input_specs(ToyModel(), (ids,), None)
    assert not keywords and specs[0].name == "input_ids"  # named after forward's parameter


def test_cli_exports_a_module_of_attnx_layers_and_verify_needs_no_user_code(tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        ["export", "--module", f"{FACTORIES}:attnx_layers", "-o", str(out), "--seq-lens", "1,8"]
    )
    assert code == 0, stderr
    assert "module factories.AttnxLayers (linear attention)" in stdout
    manifest = json.loads((out / "attnx.json").read_text())
    assert manifest["model"] == "module"
    assert manifest["module"]["variants"] == ["linear"] and manifest["module"]["adapters"] == []
    assert manifest["module"]["entry"] == f"{FACTORIES}:attnx_layers"
    assert [o["name"] for o in manifest["outputs"]] == ["logits", "aux.0"]
    assert manifest["outputs"][0]["axes"] == ["batch", "seq", 30]
    assert {"model", "weights", "reference"} <= set(manifest["files"])
    # A fresh process that cannot import the tests package (nor the factory) re-checks the export.
    verify = subprocess.run(
        [sys.executable, "-m", "attnx", "verify", str(out), "--seq-lens", "3,17", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert verify.returncode == 0, verify.stderr
    report = json.loads(verify.stdout)
    assert report["passed"] and {c["seq_len"] for c in report["backends"][0]["comparisons"]} == {3, 17}


def test_adapted_causal_model_matches_its_library_and_generates_like_a_greedy_loop(tmp_path, toy_registry):
    torch.manual_seed(1)
    model = ToyModel(causal=True).eval()
    options = {"export.decode": True, "verify.seq_lens": [1, 6, 13]}
    result = attnx.export_module(
        model, {"input_ids": torch.randint(0, 40, (2, 9))}, tmp_path / "o", options=options
    )
    assert result.manifest.module.adapters == ["toy"]
    assert result.manifest.decode.layers == ["recurrent", "recurrent"]
    ran = {b.backend: b.status for b in result.parity.backends}
    assert ran == {
        "ort-cpu": "passed",
        "torch decode": "passed",
        "ort-cpu decode": "passed",
        "ort-cpu genai": "passed",
    }
    prompt = [5, 1, 7]
    generated = attnx.generate(tmp_path / "o", prompt, max_new_tokens=10)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(10):  # a greedy loop through the library's own model, whole sequence each time
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert generated.tokens == ids[len(prompt) :]
    # Later, from the stored program: the decode graphs against the full forward; no torch step model.
    report = attnx.verify(tmp_path / "o", seq_lens=[4], write=False)
    assert report.passed and {b.backend: b.status for b in report.backends}["torch decode"] == "skipped"
    with pytest.raises(attnx.AttnxError, match="not a torch step model"):
        attnx.generate(tmp_path / "o", prompt, max_new_tokens=2, backend="torch")


def test_from_loads_a_saved_library_model_through_its_adapter(tmp_path, toy_registry):
    torch.manual_seed(3)
    saved = tmp_path / "saved"
    saved.mkdir()
    torch.save(ToyModel(causal=True).state_dict(), saved / "weights.pt")
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["export", "--from", f"toy:{saved}", "-o", str(out), "--seq-lens", "5"])
    assert code == 0, stderr
    assert "through adapter toy" in stdout and "parity: PASSED" in stdout
    assert json.loads((out / "attnx.json").read_text())["module"]["entry"] == f"toy:{saved}"
    cases = [("nope:x", "hf:DIR, toy:DIR)"), (f"toy:{tmp_path / 'none'}", "has no weights.pt")]
    for source, fragment in cases:
        code, _, stderr = run_cli(["export", "--from", source, "-o", str(tmp_path / "o2")])
        assert_one_line_error(code, stderr, fragment)


def test_a_wrong_adapter_is_caught_by_parity_against_the_library(tmp_path, swapped_registry):
    result = attnx.export_module(
        ToyModel().eval(),
        {"input_ids": torch.randint(0, 40, (2, 9))},
        tmp_path / "o",
        options={"verify.seq_lens": [7]},
    )
    assert not result.parity.passed


@pytest.mark.parametrize(
    ("factory", "fragments"),
    [
        ("training", ["AttnxLayers is in training mode", ".eval()"]),
        ("untraceable", ["cannot trace", "factories.py", "if input_ids.sum() > 10"]),
        ("no_attnx", ["calls no attnx op", "adapters: fast_transformers"]),
        ("not_a_pair", ["must return (module, example_inputs)"]),
        ("missing", ["has no callable 'missing'"]),
    ],
)
def test_bad_modules_are_one_line_errors_and_write_nothing(tmp_path, factory, fragments):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--module", f"{FACTORIES}:{factory}", "-o", str(out)])
    assert_one_line_error(code, stderr, *fragments)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unsupported_library_module_and_bad_inputs(tmp_path, toy_registry):
    out = tmp_path / "out"
    ids = torch.randint(0, 40, (2, 9))
    cases = [
        (ToyModel(unsupported=True).eval(), {"input_ids": ids}, "ToyKernelAttention (at extra)"),
        (ToyModel().eval(), ids, "example_inputs must be a mapping (e.g. a dict) or a list or tuple"),
        (ToyModel().eval(), {"input_ids": ids.tolist()}, "example input 'input_ids' is a list"),
        (ToyModel().eval(), {"input_ids": ids[:1]}, "is 1 long in dynamic axis 'batch'"),
    ]
    for module, example, fragment in cases:
        with pytest.raises(attnx.AttnxError, match=re.escape(fragment)):
            attnx.export_module(module, example, out)
    with pytest.raises(attnx.AttnxError, match="recipe settings only"):
        attnx.export_module(ToyModel().eval(), {"input_ids": ids}, out, options={"d_model": 8})
    assert not out.exists()
    code, _, stderr = run_cli(
        ["export", "--module", f"{FACTORIES}:attnx_layers", "--variant", "linear", "-o", str(out)]
    )
    assert_one_line_error(code, stderr, "drop --variant")
