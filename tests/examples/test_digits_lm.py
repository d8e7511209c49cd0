"""The trained model attnx ships (recipe ``digits-lm``): it loads, exports, generates the same tokens in
torch and ONNX Runtime, and has learnt digits (measured, not eyeballed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import attnx
from attnx.checkpoint import load_checkpoint
from attnx.recipes import load_recipe
from tests.examples.example import train_digits


@pytest.fixture(scope="module")
def example():
    return train_digits()


@pytest.fixture(scope="module")
def model(example) -> torch.nn.Module:
    module = attnx.nn.Model("lm", example.VARIANT, **example.ARCHITECTURE).eval()
    load_checkpoint(module, load_recipe(example.NAME).export.checkpoint)
    return module


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digits") / "out"
    result = attnx.export(recipe="digits-lm", out=out, options={"export.decode": True})
    assert result.parity.passed
    return out


def test_the_shipped_recipe_is_what_the_example_writes(example):
    shipped = Path(load_recipe(example.NAME).source)
    assert shipped.read_text() == example.RECIPE
    assert Path(load_recipe(example.NAME).export.checkpoint) == shipped.with_suffix(".safetensors")
    assert shipped.with_suffix(".safetensors").stat().st_size < 600_000


def class_position_baseline(data: torch.Tensor, train_images: int) -> float:
    """Held-out loss (nats/pixel) of the best model that ignores the pixels drawn so far: a smoothed
    histogram of grey levels per digit and position, counted on the training digits."""
    train, held_out = data[:train_images], data[train_images:]
    counts = torch.ones(10, 64, 17, dtype=torch.float64)
    positions = torch.arange(64)
    counts.index_put_((train[:, :1] - 17, positions, train[:, 1:]), torch.ones(()).double(), accumulate=True)
    probabilities = counts / counts.sum(-1, keepdim=True)
    return float(-probabilities[held_out[:, :1] - 17, positions, held_out[:, 1:]].log().mean())


def test_the_model_predicts_held_out_digits_from_the_pixels_so_far(example, model):
    """Far below uniform guessing (ln 17) and below the best context-free predictor: it uses the image."""
    data = example.sequences()
    with torch.no_grad():
        loss = float(example.pixel_loss(model, data[example.TRAIN_IMAGES :]))
    baseline = class_position_baseline(data, example.TRAIN_IMAGES)
    assert loss < 0.5 * math.log(17), loss  # the full run: 1.27 nats/pixel; uniform 2.83
    assert loss < baseline - 0.15, (loss, baseline)  # the baseline: 1.53


@pytest.fixture(scope="module")
def greedy(exported) -> dict[int, dict[str, list[int]]]:
    """Each digit drawn greedily, 64 pixels after its start token, by ONNX Runtime and by torch."""
    return {
        digit: {
            backend: attnx.generate(exported, [17 + digit], max_new_tokens=64, backend=backend).tokens
            for backend in ("ort-cpu", "torch")
        }
        for digit in range(10)
    }


def test_ort_draws_exactly_what_torch_draws(greedy):
    for digit, drawn in greedy.items():
        assert drawn["ort-cpu"] == drawn["torch"], digit
        assert all(0 <= token <= 16 for token in drawn["ort-cpu"]), digit  # grey levels only


def test_greedy_digits_look_like_their_class(example, greedy):
    """Each greedily drawn digit is nearer (cosine) to the mean image of the digit asked for than to any
    other digit's mean, for at least 8 of 10 digits (the full run: all but 8 and 9, whose greedy strokes
    thin out; sampling draws them better)."""
    data = example.sequences()
    means = torch.stack([data[data[:, 0] == 17 + d, 1:].double().mean(0) for d in range(10)])
    means = means / means.norm(dim=1, keepdim=True)
    nearest = {}
    for digit, drawn in greedy.items():
        pixels = torch.tensor(drawn["ort-cpu"], dtype=torch.float64)
        nearest[digit] = int(torch.argmax(means @ (pixels / pixels.norm())))
    assert sum(nearest[d] == d for d in nearest) >= 8, nearest


def test_greedy_tokens_are_not_near_ties(model, greedy):
    """Token-for-token equality of two backends holds on any machine only if no greedy choice is a near
    tie: along every digit's greedy path the top two logits differ by far more than fp32 rounding."""
    margins = []
    for digit, drawn in greedy.items():
        ids = torch.tensor([[17 + digit, *drawn["torch"][:-1]]])
        with torch.no_grad():
            (logits,) = model(ids)
        top = logits[0].topk(2, dim=-1).values
        assert torch.equal(logits[0].argmax(-1), torch.tensor(drawn["torch"]))  # the path is greedy
        margins.extend((top[:, 0] - top[:, 1]).tolist())
    assert min(margins) > 1e-4, sorted(margins)[:5]


def genai_directory(exported: Path, target: Path, state_kept: bool = True) -> Path:
    """genai.onnx and genai_config.json of the export in ``target``, ending at a start token (the export
    has no tokenizer: genai would end at its pad id 0, the commonest grey level). Without ``state_kept``
    the control: every recurrent state genai.onnx returns is zeroed (a runtime that does not carry it)."""
    target.mkdir()
    config = json.loads((exported / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = 17  # "draw a 0": never inside a picture
    (target / "genai_config.json").write_text(json.dumps(config))
    proto = onnx.load(str(exported / "genai.onnx"))
    for output in [] if state_kept else [o.name for o in proto.graph.output if o.name.endswith(".recurrent")]:
        for node in proto.graph.node:
            node.output[:] = [f"{name}/kept" if name == output else name for name in node.output]
        proto.graph.node.append(onnx.helper.make_node("Sub", [f"{output}/kept"] * 2, [output]))
    onnx.save(proto, str(target / "genai.onnx"))
    return target


def test_genai_draws_what_attnx_draws_by_feeding_the_state_back(exported, greedy, tmp_path):
    """onnxruntime-genai 0.18 runs genai.onnx with its own state handling (past.<i>.recurrent and
    past.<i>.conv, by genai_config.json's names) and draws the pixels attnx draws; the control, whose
    recurrent state never reaches the next step, draws other pixels: the test sees the state."""
    og = pytest.importorskip("onnxruntime_genai")

    def draw(directory: Path, digit: int) -> list[int]:
        model = og.Model(str(directory))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=65, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray([[17 + digit]], dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(0)[1:]]

    kept, dropped = (
        genai_directory(exported, tmp_path / "kept"),
        genai_directory(exported, tmp_path / "x", False),
    )
    for digit in (3, 7):
        assert draw(kept, digit) == greedy[digit]["ort-cpu"], digit
        assert draw(dropped, digit) != greedy[digit]["ort-cpu"], digit
