"""``attnx export`` of flash-linear-attention models and modules against the library's own forward.

The library's forward runs its own Triton kernels: in Triton's interpreter without CUDA
(``attnx.adapters.fla.cpu``), compiled on CUDA; every test id names that route. In eval mode the library
picks its ``fused_recurrent_*`` kernel up to 64 tokens and the layer's ``mode`` above, so the lengths
here sit on both sides of its chunk of 64 (odd ones included).

* the default run: a user's module holding a GLA layer (``attnx export --module``), unpadded and with
  the library's padding mask (left-padded rows against the library's forward of each row alone);
* the slow set: a user's module of two RWKV-7 layers passing ``v_first``, decode plus greedy generation
  of an RWKV-6 model as the library initialises it (``--from fla:DIR``) at short lengths, and every
  model type of the library's causal LMs, trained
  here (tests/adapters/fla/models.py, cached in pytest's cache), exported with ``--decode``: ONNX
  Runtime at several lengths, on left-padded batches against the library's forward of each row alone,
  a 2000-step decode against the full forward, ``attnx generate``
  against the library's greedy decoding, 200 greedy tokens of onnxruntime-genai and ``attnx generate``
  against the library's (genai's logits against its full forward at every step), and a real tritonserver
  serving two of them token by token.

What the slow set costs, and how it is kept affordable without proving less: the library's forward in
the interpreter takes about 0.05 s per token and sequence (hidden 32, 2 layers, a shared 2-core CPU), so
its 2001-token reference for the 2000-step decode is the largest single cost (run once per model, at
batch 1: every step of one sequence is compared, a second sequence would only double it); the export's
own parity check runs at 1 and 65 tokens (both library kernels; plus its 4 decode steps after each), since
the test itself checks ONNX Runtime at 7, 64, 129 and 200; training is :data:`fla_models.STEPS` steps
(why: that module's docstring).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

pytest.importorskip("fla.layers", reason="flash-linear-attention is not installed (pip install 'attnx[fla]')")

from attnx.adapters.fla.load import load  # noqa: E402
from attnx.decode.runtime import open_stepper  # noqa: E402
from attnx.exporter.directory import ExportDir  # noqa: E402
from tests.adapters.fla import models as fla_models  # noqa: E402
from tests.helpers import run_cli  # noqa: E402

ROUTE = "fla-kernels-compiled-cuda" if torch.cuda.is_available() else "fla-kernels-triton-interpreter"
ATOL, RTOL = 1e-4, 1e-3  # the gated variants' tolerance (float32)

GLA_MODULE = '''
import torch
from fla.layers import GatedLinearAttention


class Block(torch.nn.Module):
    """A user's block around the library's GLA layer (short convolutions, fused gated norm)."""

    def __init__(self):
        super().__init__()
        self.attn = GatedLinearAttention(hidden_size=32, num_heads=2, use_short_conv=True)
        self.head = torch.nn.Linear(32, 32)

    def forward(self, x, attention_mask=None):
        return self.head(x + self.attn(x, attention_mask=attention_mask)[0])


def factory():
    torch.manual_seed(0)
    block = Block().eval()
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return block, (torch.randn(2, 9, 32),)


def padded():
    """The block with the library's padding mask as a second input (True: a real token)."""
    block, (x,) = factory()
    return block, {"x": x, "attention_mask": torch.ones(2, 9, dtype=torch.bool)}
'''

RWKV7_MODULE = '''
import torch
from fla.layers import RWKV7Attention

RANKS = {f"{name}_low_rank_dim": 8 for name in ("decay", "gate", "a", "v")}


class Block(torch.nn.Module):
    """A user's block of two RWKV-7 layers, the second mixing in the first's values (v_first)."""

    def __init__(self):
        super().__init__()
        self.first = RWKV7Attention(hidden_size=32, head_dim=16, layer_idx=0, num_hidden_layers=2, **RANKS)
        self.second = RWKV7Attention(
            hidden_size=32, head_dim=16, layer_idx=1, num_hidden_layers=2, fuse_norm=True, **RANKS
        )

    def forward(self, x):
        y, _, _, v_first = self.first(x)
        return x + y + self.second(x + y, v_first=v_first)[0]


def factory():
    torch.manual_seed(0)
    block = Block().eval()
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return block, (torch.randn(2, 9, 32),)
'''


@pytest.fixture(scope="session")
def model_cache(request, tmp_path_factory) -> Path:
    """Trained models kept between runs (pytest's cache; a session folder without it)."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("attnx-fla-models") if cache is not None else tmp_path_factory.mktemp("fla-models")


def export(source: list[str], out: Path, *extra: str) -> None:
    """``attnx export SOURCE -o OUT EXTRA`` (exit 0 asserted; its parity check passed, if it ran one)."""
    code, _, stderr = run_cli(["export", *source, "-o", str(out), *extra])
    assert code == 0, stderr[-3000:]
    if "--no-verify" not in extra:
        parity = json.loads((out / "parity.json").read_text())
        assert parity["passed"], json.dumps(parity)[:3000]


def ort_run(out: Path, **inputs: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {name: t.numpy() for name, t in inputs.items()})[0]


def ort_logits(out: Path, ids: torch.Tensor, mask: torch.Tensor | None = None) -> np.ndarray:
    """model.onnx of an ``--from fla:`` export on token ids with their padding mask (None: every token
    real) and generate's positions cumsum(mask) - 1."""
    mask = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    return ort_run(out, input_ids=ids, attention_mask=mask, position_ids=positions)


def close(actual: np.ndarray, expected: torch.Tensor, what: str) -> float:
    """Asserted within the gated variants' tolerance; the max abs difference (printed by the slow tests)."""
    actual = torch.from_numpy(np.asarray(actual))
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL, msg=what)
    return float((actual - expected).abs().max())


def library_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def ids_of(length: int, seed: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, fla_models.VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padded(length: int) -> torch.Tensor:
    """A (3, length) bool mask as generate pads: row 0 all real, rows 1 and 2 with length // 4 + 1 and
    length // 2 + 1 padded tokens first."""
    pads = torch.tensor([0, length // 4 + 1, length // 2 + 1])
    return torch.arange(length)[None, :] >= pads[:, None]


def check_rows_alone(
    padded: np.ndarray, mask: torch.Tensor, inputs: torch.Tensor, forward, what: str
) -> float:
    """Each row of ``padded`` (batch, n, ...), the export's outputs on ``inputs`` (batch, n, ...) with the
    padding ``mask``, equals at its real tokens ``forward`` (the library's) of that row's real tokens alone;
    the max abs difference."""
    worst = 0.0
    for row, real in enumerate(mask):
        with torch.no_grad():
            expected = forward(inputs[row : row + 1, real])
        worst = max(worst, close(padded[row : row + 1, real.numpy()], expected, f"{what}, row {row}"))
    return worst


# --- default run ----------------------------------------------------------------------------------


def check_module_export(
    tmp_path: Path, export_lengths: str, lengths: tuple[int, ...], module: str = GLA_MODULE
) -> None:
    """``--module`` with the library's layers inside (GLA's by default): the export's own parity check at
    ``export_lengths`` and ONNX Runtime at ``lengths`` on fresh inputs, against the library's forward."""
    source = tmp_path / "users_block.py"
    source.write_text(module)
    out = tmp_path / "out"
    export(["--module", f"{source}:factory"], out, "--seq-lens", export_lengths)
    namespace: dict = {}
    exec(compile(module, str(source), "exec"), namespace)
    block, _ = namespace["factory"]()
    for length in lengths:
        x = torch.randn(2, length, 32, generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            expected = block(x)
        close(ort_run(out, x=x), expected, f"{length} tokens")


@pytest.mark.parametrize("route", [f"gla-fused_recurrent-{ROUTE}"])
def test_a_users_module_exports_with_the_librarys_numbers(route, tmp_path):
    check_module_export(tmp_path, "9", (5, 13))


@pytest.mark.parametrize("route", [f"gla-fused_recurrent-{ROUTE}"])
def test_a_users_module_takes_left_padded_batches(route, tmp_path):
    """``--module`` whose forward passes the library's padding mask on: its own parity check (right-padded
    masks, every position against the library's forward with the mask) passes, and ONNX Runtime on
    left-padded batches equals the library's block on each row alone; the unpadded row equals the same
    row run alone."""
    source = tmp_path / "users_block.py"
    source.write_text(GLA_MODULE)
    out = tmp_path / "out"
    export(["--module", f"{source}:padded"], out, "--seq-lens", "9")
    namespace: dict = {}
    exec(compile(GLA_MODULE, str(source), "exec"), namespace)
    block, _ = namespace["padded"]()
    for length in (5, 13):
        x = torch.randn(3, length, 32, generator=torch.Generator().manual_seed(length))
        mask = left_padded(length)
        padded = ort_run(out, x=x, attention_mask=mask)
        check_rows_alone(padded, mask, x, block, f"{length} tokens")
        close(padded[:1], torch.from_numpy(ort_run(out, x=x[:1], attention_mask=mask[:1])), "unpadded row")


@pytest.mark.slow
@pytest.mark.parametrize("route", [f"gla-chunk-{ROUTE}"])
def test_a_users_module_exports_with_the_librarys_numbers_across_its_chunk(route, tmp_path):
    check_module_export(tmp_path, "1,65", (63, 67, 130))


@pytest.mark.slow
@pytest.mark.parametrize("route", [f"rwkv7-fused_recurrent-{ROUTE}"])
def test_a_users_rwkv7_block_passes_v_first_through_the_export(route, tmp_path):
    """Two RWKV-7 layers in a user's module, v_first handed from the first to the second (below the
    library's chunk route: a user's module keeps the library's dispatch, whose float32 chunk kernel is off the
    rule; attnx.adapters.fla.load.recurrent_reference)."""
    check_module_export(tmp_path, "1,9", (5, 63), module=RWKV7_MODULE)


def test_a_deep_library_model_names_its_decoder_layers(tmp_path):
    """Four layers: the adapter names the model's decoder layers (AdapterImpl.layers), so the export
    would convert the first two and stamp the others from the second (the export itself: the slow test
    below)."""
    from attnx.exporter.module import build_module, from_source

    fla_models.build("gated_deltanet", num_hidden_layers=4).eval().save_pretrained(tmp_path / "saved")
    stack = build_module(from_source(f"fla:{tmp_path / 'saved'}")).layer_stack()
    assert stack is not None and stack.prototypes == (0, 1, 1, 1)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["gated_deltanet", "rwkv6"])
def test_a_deep_library_model_converts_one_layer_of_each_kind_and_stamps_the_rest(
    model_type, tmp_path, monkeypatch
):
    """Four layers: the export converts the first two and stamps the others from the second
    (attnx.exporter.repeat), its own parity against the library's whole forward passes, and the graph
    gives the library's logits across its chunk."""
    from attnx.exporter import repeat
    from attnx.exporter.module import build_module, from_source

    stampings = []

    def spy(model, stamping):
        repeat.stamp(model, stamping)
        stampings.append(stamping)

    monkeypatch.setattr("attnx.exporter.trace.stamp", spy)
    model = fla_models.build(model_type, num_hidden_layers=4).eval()
    model.save_pretrained(tmp_path / "saved")
    stack = build_module(from_source(f"fla:{tmp_path / 'saved'}")).layer_stack()
    assert stack is not None and stack.prototypes == (0, 1, 1, 1)
    export(["--from", f"fla:{tmp_path / 'saved'}"], tmp_path / "out")
    assert len(stampings) == 1, "model.onnx was converted whole"
    ids = ids_of(70, seed=70)
    close(ort_logits(tmp_path / "out", ids), library_logits(model, ids), f"{model_type}, 4 layers stamped")


@pytest.fixture(scope="module")
def rwkv6_untrained(tmp_path_factory) -> tuple[Path, Path]:
    """An RWKV-6 model as the library initialises it (no training: the default run stays short), saved
    and exported with ``--decode`` (``--no-verify``: the tests below compare with the library instead)."""
    saved = tmp_path_factory.mktemp("rwkv6") / "saved"
    fla_models.build("rwkv6").eval().save_pretrained(saved)
    out = saved.parent / "out"
    export(["--from", f"fla:{saved}"], out, "--decode", "--no-verify")
    return saved, out


@pytest.mark.slow  # the fixture's --decode export of an RWKV-6 model: ~2 min on 2 cores
@pytest.mark.parametrize("route", [f"rwkv6-{ROUTE}"])
def test_decode_continues_the_librarys_forward(route, rwkv6_untrained):
    saved, out = rwkv6_untrained
    check_decode(saved, out, prompt=3, steps=12)


@pytest.mark.slow
@pytest.mark.parametrize("route", [f"rwkv6-{ROUTE}"])
def test_generate_equals_the_librarys_greedy_decoding(route, rwkv6_untrained):
    check_generate(*rwkv6_untrained, new=6)


# --- shared checks --------------------------------------------------------------------------------


def check_decode(saved: Path, out: Path, prompt: int, steps: int, batch: int = 2) -> float:
    """Prefill ``prompt`` tokens, then ``steps`` single-token decode steps in ONNX Runtime (teacher-forced):
    every step's logits equal the library's full forward over the whole sequence; the max abs difference."""
    model = load(saved)[0]
    ids = ids_of(prompt + steps, seed=7, batch=batch)
    expected = library_logits(model, ids)
    with open_stepper(ExportDir.open(out)) as stepper:
        logits, state = stepper.prefill(ids[:, :prompt].numpy())
        worst = close(logits, expected[:, :prompt], "prefill")
        for t in range(prompt, prompt + steps):
            logits, state = stepper.decode(ids[:, t : t + 1].numpy(), state)
            worst = max(worst, close(logits[:, -1], expected[:, t], f"decode step {t - prompt + 1}"))
    return worst


def library_greedy(model: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    """Greedy continuation by the library's full forward on the growing sequence (no cache)."""
    ids = torch.tensor([prompt])
    for _ in range(new):
        ids = torch.cat([ids, library_logits(model, ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt) :].tolist()


def attnx_generate(out: Path, prompt: list[int], new: int) -> list[int]:
    ids = ",".join(map(str, prompt))
    code, stdout, stderr = run_cli(
        ["generate", str(out), "--prompt-ids", ids, "-n", str(new), "--greedy", "--json"]
    )
    assert code == 0, stderr
    return json.loads(stdout)["tokens"]


def check_generate(saved: Path, out: Path, new: int) -> None:
    """``attnx generate --greedy`` equals the library's greedy decoding by its full forward (digit 3's start
    token and two pixels as the prompt). Not its model's ``generate``: under transformers 5.24 its steps do
    not carry the library's state (docs/importing.md)."""
    model = load(saved)[0]
    prompt = [20, 0, 0]
    assert attnx_generate(out, prompt, new) == library_greedy(model, prompt, new)


# --- slow: the trained models ---------------------------------------------------------------------

MODEL_IDS = [f"{t}-{ROUTE}" for t in fla_models.MODELS]


@pytest.fixture(scope="module")
def trained_export(model_cache, tmp_path_factory):
    """model type -> (saved model, its ``--decode`` export checked at 1 and 65 tokens), made once."""
    made: dict[str, tuple[Path, Path]] = {}

    def get(model_type: str) -> tuple[Path, Path]:
        if model_type not in made:
            saved = fla_models.trained(model_type, model_cache)
            out = tmp_path_factory.mktemp(model_type) / "out"
            export(["--from", f"fla:{saved}"], out, "--decode", "--seq-lens", "1,65")
            made[model_type] = saved, out
        return made[model_type]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(fla_models.MODELS), ids=MODEL_IDS)
def test_trained_model_exports_with_the_librarys_numbers(model_type, trained_export):
    """ONNX Runtime against the library's forward on fresh ids at 7, 64, 129 and 200 tokens."""
    saved, out = trained_export(model_type)
    model = load(saved)[0]
    for length in (7, 64, 129, 200):
        ids = ids_of(length, seed=length)
        expected = library_logits(model, ids)
        worst = close(ort_logits(out, ids), expected, f"{model_type} at {length} tokens")
        print(f"{model_type}: {length} tokens, max abs logit difference {worst:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(fla_models.MODELS), ids=MODEL_IDS)
def test_trained_model_left_padded_rows_equal_the_rows_alone(model_type, trained_export):
    """model.onnx takes the hf: exports' inputs (token ids, a bool padding mask, position ids), and on
    left-padded batches (3 rows: 0, n // 4 + 1 and n // 2 + 1 padded tokens, so real lengths on both sides
    of the library's chunk of 64) at 7, 65 and 130 tokens each row equals the library's forward of that row
    alone; the unpadded row equals the same row run alone."""
    saved, out = trained_export(model_type)
    assert [s.name for s in ExportDir.open(out).manifest.inputs] == [
        "input_ids",
        "attention_mask",
        "position_ids",
    ]
    model = load(saved)[0]
    for length in (7, 65, 130):
        ids, mask = ids_of(length, seed=length, batch=3), left_padded(length)
        padded = ort_logits(out, ids, mask)
        worst = check_rows_alone(
            padded, mask, ids, functools.partial(library_logits, model), f"{length} tokens"
        )
        close(padded[:1], torch.from_numpy(ort_logits(out, ids[:1])), "unpadded row")
        print(f"{model_type}: {length} tokens left-padded, max abs logit difference {worst:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(fla_models.MODELS), ids=MODEL_IDS)
def test_trained_model_decodes_2000_steps_as_the_full_forward(model_type, trained_export):
    worst = check_decode(*trained_export(model_type), prompt=1, steps=2000, batch=1)
    print(f"{model_type}: 2000 decode steps, max abs logit difference {worst:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("route", [f"rwkv7-chunk-{ROUTE}"])
def test_rwkv7_chunk_kernel_is_the_difference(route, model_cache):
    """Why the fla route runs RWKV-7's recurrent kernel as the reference (``recurrent_reference``): on the
    trained model at 130 tokens, the library's chunk kernel's logits are more than 1e-3 from the adapted
    model's (its float32 arithmetic), its recurrent kernel's within 1e-5."""
    import transformers

    from attnx.adapters.apply import apply_adapters

    model, *_, notes = load(fla_models.trained("rwkv7", model_cache))
    assert notes and "recurrent kernel" in notes[0]
    adapted = apply_adapters(model).module
    ids = ids_of(130, seed=130)
    with torch.no_grad():
        ours = adapted(input_ids=ids, use_cache=False).logits
    recurrent = library_logits(model, ids)
    library = transformers.AutoModelForCausalLM.from_pretrained(fla_models.trained("rwkv7", model_cache))
    chunked = library_logits(library.eval(), ids)  # the library's own dispatch: its chunk kernel
    chunk_gap, recurrent_gap = (float((t - ours).abs().max()) for t in (chunked, recurrent))
    print(
        f"rwkv7 at 130 tokens: chunk kernel {chunk_gap:.2e}, recurrent kernel {recurrent_gap:.2e} from attnx"
    )
    assert chunk_gap > 1e-3
    torch.testing.assert_close(ours, recurrent, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("route", [f"rwkv7-{ROUTE}"])
def test_a_trained_rwkv7_verifies_by_default_on_its_recurrent_kernel(route, model_cache, tmp_path):
    """The product's claim: ``attnx export --from fla:DIR`` of a trained RWKV-7 passes its default verify
    (1, 7, 32, 129 tokens: the last past the library's chunk switch) against the library's recurrent
    kernel, and its manifest says that kernel was the reference."""
    out = tmp_path / "out"
    export(["--from", f"fla:{fla_models.trained('rwkv7', model_cache)}"], out)
    (note,) = ExportDir.open(out).manifest.module.notes
    assert "recurrent kernel" in note and "fused_recurrent" in note


def test_only_the_loaded_rwkv7s_chunk_calls_take_the_recurrent_kernel(monkeypatch):
    """``recurrent_reference``: inside the marked RWKV-7 layers' no-grad calls the library's chunk kernel is
    its recurrent one; another RWKV-7 model and calls with gradients keep the library's dispatch; a model
    without RWKV-7 layers gets no note."""
    import fla.layers.rwkv7 as library_layer

    from attnx.adapters.fla.load import recurrent_reference

    class Reached(Exception):
        """A kernel was called (its name the argument); the stubs stop the layer there."""

    def kernel(name: str):
        def reached(*_, **__):
            raise Reached(name)

        return reached

    monkeypatch.setattr(library_layer, "chunk_rwkv7", kernel("chunk"))
    monkeypatch.setattr("fla.ops.rwkv7.fused_recurrent_rwkv7", kernel("recurrent"))
    routed, other = fla_models.build("rwkv7"), fla_models.build("rwkv7")
    assert recurrent_reference(fla_models.build("gla")) == []
    (note,) = recurrent_reference(routed)
    assert "RWKV7Attention" in note and "recurrent kernel" in note
    chunk = library_layer.chunk_rwkv7
    for model, grad, expected in (
        (routed, False, "recurrent"),
        (other, False, "chunk"),
        (routed, True, "chunk"),
    ):
        layer = next(m for m in model.modules() if type(m).__name__ == "RWKV7Attention")
        with torch.set_grad_enabled(grad), pytest.raises(Reached) as reached:
            layer(torch.randn(1, 70, layer.hidden_size))
        assert reached.value.args == (expected,), grad
    assert library_layer.chunk_rwkv7 is chunk  # routed once per process
    recurrent_reference(other)
    assert library_layer.chunk_rwkv7 is chunk


# --- slow: 200 greedy tokens in onnxruntime-genai and attnx generate; a real tritonserver --------------

NEW_TOKENS = 200
# a "3" (its start token) and its first 16 grey levels: genai's prefill takes 17 tokens at once
LONG_PROMPT = [20, 0, 0, 7, 15, 13, 1, 0, 0, 0, 8, 13, 6, 15, 4, 0, 0]


def genai_forced_logits(out: Path, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """onnxruntime-genai's logits at each position from the prompt's last to the continuation's second to
    last ((len(continuation), vocab)): the prompt in one call, then one token per call (its state)."""
    import onnxruntime_genai as og

    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + len(continuation))
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    rows = [generator.get_output("logits")[0, -1]]
    for token in continuation[:-1]:
        generator.append_tokens([token])
        rows.append(generator.get_output("logits")[0, -1])
    return np.stack(rows)


def full_forward_logits(model: torch.nn.Module, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """The library's full forward over the prompt and ``continuation``: the logits each continuation
    token was chosen from ((len(continuation), vocab)), in one call (the forward is causal)."""
    ids = torch.tensor([prompt + continuation[:-1]])
    return library_logits(model, ids)[0, len(prompt) - 1 :]


def assert_greedy(tokens: list[int], logits: torch.Tensor) -> int:
    """Every token is the argmax of the logits it was chosen from, up to a float tie (the top two closer
    than the tolerance; then either may come first): greedy decoding by ``logits``' model. The number of
    ties."""
    top = logits.topk(2).values
    ties = (top[:, 0] - top[:, 1] < ATOL).tolist()
    chosen = logits.argmax(-1).tolist()
    wrong = [i for i, (t, c, tie) in enumerate(zip(tokens, chosen, ties, strict=True)) if t != c and not tie]
    assert not wrong, (
        f"steps {wrong[:5]}: {[tokens[i] for i in wrong[:5]]} where {[chosen[i] for i in wrong[:5]]}"
    )
    return sum(ties)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(fla_models.MODELS), ids=MODEL_IDS)
def test_trained_model_generates_200_tokens_in_genai_and_attnx_as_the_library(model_type, trained_export):
    """onnxruntime-genai 0.18 loads the ``--decode`` export's genai.onnx and genai_config.json (its end
    token the model's own, not genai's default 0, a grey level) and, like ``attnx generate --greedy``, picks
    the library's greedy tokens for 200 tokens: by its full forward (one call over the continuation: each
    token the argmax at the position before, up to float ties). genai's logits, the prompt in one call and
    then one token per call, are the full forward's at every step.

    Not the library model's own ``generate``: with transformers 5.24 its steps after the prompt do not
    carry the state (trained rwkv6 after this prompt: every step's logits are those of the one token 0
    from an empty state, 3.53 / 0.36 for 0 / 1, where its full forward's move on), so it agrees with the
    forward only where the continuation does not depend on the state (the 16-token test's prompt)."""
    pytest.importorskip("onnxruntime_genai")
    from attnx.testing.hf_hybrid import genai_greedy

    saved, out = trained_export(model_type)
    model = load(saved)[0]
    genai_model = json.loads((out / "genai_config.json").read_text())["model"]
    assert genai_model["eos_token_id"] == model.config.eos_token_id
    tokens = attnx_generate(out, LONG_PROMPT, NEW_TOKENS)
    assert [int(t) for t in genai_greedy(out, LONG_PROMPT, NEW_TOKENS)[0]] == tokens
    expected = full_forward_logits(model, LONG_PROMPT, tokens)
    ties = assert_greedy(tokens, expected)
    worst = close(genai_forced_logits(out, LONG_PROMPT, tokens), expected, "genai's logits")
    print(
        f"{model_type}: 200 greedy tokens equal ({len(set(tokens))} distinct, {ties} float ties), "
        f"genai's logits max abs difference {worst:.2e}"
    )


TRITON_MODELS = ["rwkv7", "mamba2"]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first run fetches the server wheel and builds the backend's environment
@pytest.mark.parametrize("model_type", TRITON_MODELS, ids=[f"{t}-{ROUTE}" for t in TRITON_MODELS])
def test_a_real_triton_server_serves_the_trained_model(
    model_type, trained_export, triton_build, triton_cache, tmp_path
):
    """``attnx triton --backend python`` of the ``--decode`` export, served by a real tritonserver (the state
    kept per sequence): the prompt, then one token per request, gives ``attnx generate``'s greedy tokens,
    each chosen from the library's full-forward logits at that position."""
    pytest.importorskip("tritonclient.http")
    from tests.serve.tritonserver import triton_tokens

    saved, out = trained_export(model_type)
    served, logits = triton_tokens(out, triton_build, triton_cache / "python-env", tmp_path, LONG_PROMPT, 16)
    assert served == attnx_generate(out, LONG_PROMPT, 16)
    expected = full_forward_logits(load(saved)[0], LONG_PROMPT, served)
    worst = close(logits, expected, "served logits")
    print(f"{model_type}: tritonserver's 16 tokens equal, logits max abs difference {worst:.2e}")
