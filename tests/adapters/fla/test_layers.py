"""The ``fla`` adapter against flash-linear-attention's own forward.

The library has no CPU path; here its layers run **its own Triton kernels in Triton's interpreter**
(``attnx.adapters.fla.cpu``: tests/conftest.py sets ``TRITON_INTERPRET=1`` on a machine without
CUDA; the autotuner keeps one configuration and loop variables are tensors, as compiled Triton
makes them; nothing of the library is changed). In eval mode the library picks its kernel by length:
its ``fused_recurrent_*`` kernel up to 64 tokens (RWKV-7: 63), the layer's ``mode`` (``chunk_*`` here)
above, so each parity case's id names the library function that ran (``fla.ops...``). Lengths 65 and
130 cross the library's chunk of 64.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

fla_layers = pytest.importorskip(
    "fla.layers", reason="flash-linear-attention is not installed (pip install 'attnx[fla]')"
)

from attnx.adapters.fla import cpu  # noqa: E402
from attnx.adapters.fla.convert import convert, needs_adapter  # noqa: E402
from attnx.errors import AttnxError  # noqa: E402
from attnx.state import Step  # noqa: E402
from tests.helpers import assert_one_line_error, run_cli  # noqa: E402

HIDDEN = 32

# name -> (layer factory, library op package, mode above 64 tokens)
LAYERS = {
    "linear-hadamard": (
        lambda: fla_layers.LinearAttention(hidden_size=HIDDEN, num_heads=2),
        "linear_attn",
        "chunk",
    ),
    "linear-elu-normalised-mqa": (
        lambda: fla_layers.LinearAttention(
            hidden_size=HIDDEN,
            num_heads=2,
            num_kv_heads=1,
            feature_map="elu",
            do_feature_map_norm=True,
            output_norm="identity",
            mode="fused_chunk",
        ),
        "linear_attn",
        "fused_chunk",
    ),
    "gla-conv": (
        lambda: fla_layers.GatedLinearAttention(hidden_size=HIDDEN, num_heads=2, use_short_conv=True),
        "gla",
        "chunk",
    ),
    "gla-mqa-unfused-clamp": (
        lambda: fla_layers.GatedLinearAttention(
            hidden_size=HIDDEN,
            num_heads=2,
            num_kv_heads=1,
            fuse_norm=False,
            clamp_min=-0.5,
            feature_map="relu",
        ),
        "gla",
        "chunk",
    ),
    "deltanet": (
        lambda: fla_layers.DeltaNet(hidden_size=HIDDEN, num_heads=2, mode="fused_recurrent"),
        "delta_rule",
        "fused_recurrent",
    ),
    "deltanet-gate-relu-sum-neg": (
        lambda: fla_layers.DeltaNet(
            hidden_size=HIDDEN,
            num_heads=2,
            mode="fused_recurrent",
            use_gate=True,
            qk_activation="relu",
            qk_norm="sum",
            allow_neg_eigval=True,
        ),
        "delta_rule",
        "fused_recurrent",
    ),
    "gated-deltanet": (
        lambda: fla_layers.GatedDeltaNet(hidden_size=HIDDEN, num_heads=2, head_dim=16, expand_v=1),
        "gated_delta_rule",
        "chunk",
    ),
    "gated-deltanet-gva-sigmoid": (
        lambda: fla_layers.GatedDeltaNet(
            hidden_size=HIDDEN,
            num_heads=1,
            num_v_heads=2,
            head_dim=16,
            expand_v=2,
            output_gate_activation="sigmoid",
            use_short_conv=False,
        ),
        "gated_delta_rule",
        "chunk",
    ),
    # the library's chunked DeltaProduct kernel refuses float32 (ChunkGatedDeltaProductFunction), so these
    # run its fused_recurrent path at every length; its chunk kernel: test_deltaproducts_chunk_kernel_agrees
    "gated-deltaproduct": (
        lambda: fla_layers.GatedDeltaProduct(
            hidden_size=HIDDEN, num_heads=2, head_dim=16, expand_v=1, mode="fused_recurrent"
        ),
        "gated_delta_rule",
        "fused_recurrent",
    ),
    "gated-deltaproduct-3-gva-ungated": (
        lambda: fla_layers.GatedDeltaProduct(
            hidden_size=HIDDEN,
            num_heads=1,
            num_v_heads=2,
            head_dim=16,
            expand_v=1,
            num_householder=3,
            use_forget_gate=False,
            use_output_gate=False,
            use_short_conv=False,
            allow_neg_eigval=False,
            mode="fused_recurrent",
        ),
        "gated_delta_rule",
        "fused_recurrent",
    ),
    "hgrn2": (
        lambda: fla_layers.HGRN2Attention(hidden_size=HIDDEN, num_heads=2, expand_ratio=None),
        "gla",
        "chunk",
    ),
    # norm_eps 0.5: the output norm must still use rms_norm_linear's 1e-5 (HGRN2Attention.NORM_EPS)
    "hgrn2-4-heads-conv-eps": (
        lambda: fla_layers.HGRN2Attention(
            hidden_size=HIDDEN, expand_ratio=8, use_short_conv=True, norm_eps=0.5
        ),
        "gla",
        "chunk",
    ),
    "retnet": (lambda: fla_layers.MultiScaleRetention(hidden_size=HIDDEN, num_heads=2), "retention", "chunk"),
    "retnet-mqa-ungated-conv": (
        lambda: fla_layers.MultiScaleRetention(
            hidden_size=HIDDEN, num_heads=2, num_kv_heads=1, use_output_gate=False, use_short_conv=True
        ),
        "retention",
        "chunk",
    ),
    "rwkv6": (lambda: fla_layers.RWKV6Attention(hidden_size=HIDDEN, num_heads=2), "rwkv6", "chunk"),
    # the first layer (it makes v_first), unfused: F.normalize and torch's GroupNorm
    "rwkv7": (lambda: rwkv7_layer(layer_idx=0), "rwkv7", "chunk"),
    # a later layer (mixes in the model's v_first), fused: l2_norm and the library's GroupNorm (its
    # value_dim option is not taken: a later layer with value_dim != hidden_size fails in the library's own
    # initialisation, LoRA.set_bias_value)
    "rwkv7-later-fused": (lambda: rwkv7_layer(layer_idx=1, fuse_norm=True), "rwkv7", "chunk"),
    # Mamba2 runs the library's torch path at every length (no mamba_ssm here), its SSD in chunks of
    # chunk_size (64 here); two groups over four heads: the torch path tiles them (head h, group h % 2)
    "mamba2-groups": (
        lambda: fla_layers.Mamba2(
            hidden_size=HIDDEN, num_heads=4, head_dim=16, state_size=8, n_groups=2, chunk_size=64
        ),
        "mamba2",
        None,
    ),
    "mamba2-hdim-d-norm-first-limit": (
        lambda: fla_layers.Mamba2(
            hidden_size=HIDDEN,
            num_heads=4,
            head_dim=16,
            state_size=8,
            D_has_hdim=True,
            norm_before_gate=True,
            dt_limit=(0.01, 0.5),
            chunk_size=64,
        ),
        "mamba2",
        None,
    ),
    "mamba2-no-norm": (
        lambda: fla_layers.Mamba2(
            hidden_size=HIDDEN, num_heads=2, head_dim=32, state_size=8, rmsnorm=False, chunk_size=64
        ),
        "mamba2",
        None,
    ),
}
# The library's chunked RWKV-6 kernel itself is 1.1e-4 from its own float64 recurrence at 70 tokens
# (values up to 30; its fused_recurrent kernel: 4e-6), so that kernel is compared relative to scale.
RTOL = {"rwkv6": 3e-5}
# So is its chunked RWKV-7 (DPLR) kernel, where the layer runs it (past 64 tokens): 9.3e-4 from float64 at
# 65 tokens with outputs up to 44 (its recurrent kernels and attnx's op: 5.4e-6;
# test_rwkv7_matches_the_librarys_recurrent_kernel_long).
CHUNK_RTOL = {"rwkv7": 1e-4, "rwkv7-later-fused": 1e-4}
ATOL = 2e-5


def rwkv7_layer(**options) -> torch.nn.Module:
    """The library's RWKV-7 layer at hidden 32: two heads of 16, low-rank mixers of 8."""
    ranks = {f"{name}_low_rank_dim": 8 for name in ("decay", "gate", "a", "v")}
    return fla_layers.RWKV7Attention(hidden_size=HIDDEN, head_dim=16, num_hidden_layers=2, **ranks, **options)


def model_kwargs(name: str, x: torch.Tensor) -> dict:
    """What the library's model passes the layer beside x: a later RWKV-7 layer's v_first (the first
    layer's values, drawn here)."""
    if not name.startswith("rwkv7-later"):
        return {}
    generator = torch.Generator().manual_seed(x.shape[1] + 100)
    return {"v_first": torch.randn(x.shape, generator=generator).to(x.device)}


def library_layer(name: str) -> torch.nn.Module:
    """A library layer with its parameters moved off their initial values (seeded)."""
    torch.manual_seed(0)
    layer = LAYERS[name][0]().eval()
    with torch.no_grad():
        for pname, parameter in layer.named_parameters():
            if pname not in ("A_log", "dt_bias"):
                parameter.add_(0.2 * torch.randn_like(parameter))
    return layer


def route(name: str, length: int) -> str:
    """The library function the layer's forward runs at ``length`` tokens (its own dispatch: the recurrent
    kernel up to 64 tokens, RWKV-7's up to 63)."""
    _, package, mode = LAYERS[name]
    if mode is None:
        return f"fla.layers.{package}.torch_forward"
    recurrent = length < 64 if package == "rwkv7" else length <= 64
    return f"fla.ops.{package}.{'fused_recurrent' if recurrent else mode}"


def close(actual: torch.Tensor, expected: torch.Tensor, name: str, rtol: float | None = None) -> None:
    """Within ATOL + rtol * max |expected| (rtol: the layer's :data:`RTOL`, else 1e-5)."""
    rtol = rtol or RTOL.get(name, 1e-5)
    torch.testing.assert_close(actual, expected, atol=ATOL + rtol * float(expected.abs().max()), rtol=0)


def test_the_library_runs_in_the_interpreter_here():
    """The route the other tests rely on: no CUDA here, so the kernels are interpreted."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the library's kernels run compiled (tests/gpu)")
    assert cpu.enable()


def test_the_interpreter_changes_touch_only_the_librarys_kernels():
    """The autotuner is pinned to one configuration for the library's kernels only."""
    import triton
    import triton.language as tl
    from fla.ops.common.fused_recurrent import fused_recurrent_fwd_kernel
    from triton.runtime.autotuner import Autotuner

    cpu.enable()

    def kernel(x, BLOCK: tl.constexpr):  # not the library's: keeps every configuration
        pass

    configs = [triton.Config({"BLOCK": b}) for b in (16, 32)]
    ours = Autotuner(triton.jit(kernel), ["x"], configs, [], None, None)
    assert len(ours.prune_configs({})) == 2
    assert cpu.from_library(fused_recurrent_fwd_kernel) and not cpu.from_library(ours)
    autotuner = fused_recurrent_fwd_kernel.fn  # under the library's triton.heuristics
    assert len(autotuner.configs) == 2 and len(autotuner.prune_configs({})) == 1


def test_the_switch_is_restored(monkeypatch):
    monkeypatch.delenv(cpu.ENV, raising=False)
    with cpu.interpreter_switched_on():
        assert os.environ[cpu.ENV] == "1"
    assert cpu.ENV not in os.environ
    monkeypatch.setenv(cpu.ENV, "0")
    with cpu.interpreter_switched_on():
        pass
    assert os.environ[cpu.ENV] == "0"


@pytest.mark.slow
def test_loading_the_library_leaves_triton_as_it_was(tmp_path):
    """In a fresh process without TRITON_INTERPRET (as `attnx export --from fla:DIR` runs): the library's
    kernels run in the interpreter, the variable is unset again afterwards and a kernel decorated later
    is compiled Triton's."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import os, torch\n"
        "from attnx.adapters.fla import cpu\n"
        "cpu.import_library()\n"
        "import fla.layers, triton\n"
        "layer = fla.layers.GatedLinearAttention(hidden_size=32, num_heads=2).eval()\n"
        "with torch.no_grad():\n"
        "    layer(torch.randn(1, 5, 32))\n"
        "@triton.jit\n"
        "def later(x):\n"
        "    pass\n"
        "print(os.environ.get('TRITON_INTERPRET'), type(later).__name__, cpu.interpreted())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != cpu.ENV}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "JITFunction", "True"]


# The default run: one configuration per layer type, across the chunk (65 tokens: the chunk kernels) or
# below it (9: the fused_recurrent kernels); the slow set runs the other configurations and lengths.
CASES = [
    ("linear-hadamard", 65),
    ("gla-conv", 9),
    ("deltanet", 9),
    ("gated-deltanet", 65),
    ("gated-deltaproduct", 9),
    ("hgrn2", 65),
    ("retnet", 65),
    ("rwkv6", 65),
    ("rwkv7", 9),
    ("mamba2-groups", 65),
]
SLOW_CASES = [(name, n) for name in LAYERS for n in (1, 9, 64, 65, 130) if (name, n) not in CASES]


def _cases(quick, slow):
    """The default run's ``quick`` (name, length) cases, then the ``slow`` ones marked slow, each named by
    its layer, length and the library kernel it routes to."""
    return [
        pytest.param(name, n, id=f"{name}-n{n}-{route(name, n)}", marks=marks)
        for cases, marks in ((quick, ()), (slow, pytest.mark.slow))
        for name, n in cases
    ]


@pytest.mark.parametrize("name,length", _cases(CASES, SLOW_CASES))
def test_layer_matches_the_librarys_forward(name, length):
    layer = library_layer(name)
    replacement = convert(layer)
    x = torch.randn(2, length, HIDDEN, generator=torch.Generator().manual_seed(length))
    kwargs = model_kwargs(name, x)
    with torch.no_grad():
        expected = layer(x, **kwargs)[0]
        actual = replacement(x, **kwargs)[0]
    close(actual, expected, name, CHUNK_RTOL.get(name) if route(name, length).endswith(".chunk") else None)


# RWKV-7's in the slow set (the default run keeps one RWKV-7 layer test: its parity case above)
STEPPED = [pytest.param(n, marks=pytest.mark.slow) if n.startswith("rwkv7") else n for n in LAYERS]


@pytest.mark.parametrize("name", STEPPED)
def test_stepping_continues_the_full_forward(name):
    """Prefill 5 tokens, then steps of 1, 3 and 1 tokens: the outputs are the full forward's, and the
    state has the declared shapes (the attnx layer against itself; decode parity against the library
    goes through the decode graphs)."""
    replacement = convert(library_layer(name))
    x = torch.randn(2, 10, HIDDEN, generator=torch.Generator().manual_seed(1))
    kwargs = model_kwargs(name, x)
    with torch.no_grad():
        full = replacement(x, **kwargs)[0]
        past, outs, start = None, [], 0
        for size in (5, 1, 3, 1):
            replacement.stepping = Step(past, torch.tensor([start]))
            part = {key: value[:, start : start + size] for key, value in kwargs.items()}
            outs.append(replacement(x[:, start : start + size], **part)[0])
            past, start = replacement.stepping.present, start + size
        replacement.stepping = None
    close(torch.cat(outs, dim=1), full, name)
    declared = replacement.decode_state()
    assert [s.name for s in declared] == ["conv", "recurrent"][-len(past) :]  # the gated rule's order
    for spec, tensor in zip(declared, past, strict=True):
        assert tuple(tensor.shape) == tuple(2 if a == "batch" else a for a in spec.axes), spec.name
        assert spec.dtype is None or str(tensor.dtype) == f"torch.{spec.dtype}"


def _library_and_attnx(name: str, length: int, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """The library layer's output and its conversion's on the same input (``kwargs``: the model's); converted
    first, which switches the library's kernels onto the CPU route, whatever ran before."""
    layer = library_layer(name)
    replacement = convert(layer)
    x = torch.randn(2, length, HIDDEN, generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        return layer(x, **kwargs)[0], replacement(x, **kwargs)[0]


def test_hgrn2_norm_eps_is_rms_norm_linears(monkeypatch):
    """HGRN2's output RMSNorm runs in ``rms_norm_linear`` with that function's default eps, not the layer's
    ``norm_eps`` (0.5 here): the seeded defect, the layer's eps, is caught."""
    from attnx.adapters.fla.layers import HGRN2Attention

    expected, actual = _library_and_attnx("hgrn2-4-heads-conv-eps", 9)
    close(actual, expected, "hgrn2")
    monkeypatch.setattr(HGRN2Attention, "NORM_EPS", 0.5)
    expected, actual = _library_and_attnx("hgrn2-4-heads-conv-eps", 9)
    with pytest.raises(AssertionError):
        close(actual, expected, "hgrn2")


def test_hgrn2_takes_the_models_lower_bound():
    """In the library's model, layers after the first raise the forget gate to the model's lower bound
    (passed as ``lower_bound``); the first ignores it. Prefill and steps continue the full forward too."""
    from fla.layers import HGRN2Attention

    torch.manual_seed(0)
    layer = HGRN2Attention(hidden_size=HIDDEN, num_heads=2, expand_ratio=None, layer_idx=1).eval()
    replacement = convert(layer)
    bound = torch.rand(HIDDEN, generator=torch.Generator().manual_seed(2)) * 0.9
    x = torch.randn(2, 9, HIDDEN, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = layer(x, lower_bound=bound)[0]
        full = replacement(x, lower_bound=bound)[0]
        unbounded = replacement(x)[0]
        replacement.stepping = Step(None, torch.tensor([0]))
        first = replacement(x[:, :5], lower_bound=bound)[0]
        replacement.stepping = Step(replacement.stepping.present, torch.tensor([5]))
        rest = replacement(x[:, 5:], lower_bound=bound)[0]
        replacement.stepping = None
        layer.layer_idx = replacement.layer_idx = 0
        first_layer = replacement(x, lower_bound=bound)[0]
    close(full, expected, "hgrn2")
    close(torch.cat([first, rest], dim=1), expected, "hgrn2")
    close(first_layer, unbounded, "hgrn2")
    assert (unbounded - expected).abs().max() > 1e-2  # the bound matters at these values


def test_deltaproduct_decays_first_and_reads_last(monkeypatch):
    """Token t's decay scales the state before its first Householder sub-step and its query reads the
    state after the last; the seeded defect, the decay moved to the last sub-step, is caught."""
    import torch.nn.functional as F

    from attnx.adapters.fla import layers

    expected, actual = _library_and_attnx("gated-deltaproduct", 9)
    close(actual, expected, "gated-deltaproduct")

    original = layers.sub_steps

    def decay_last(q, g, m):
        return original(q, g, m)[0], F.pad(g.unsqueeze(2), (0, 0, m - 1, 0)).flatten(1, 2)

    monkeypatch.setattr(layers, "sub_steps", decay_last)
    expected, actual = _library_and_attnx("gated-deltaproduct", 9)
    with pytest.raises(AssertionError):
        close(actual, expected, "gated-deltaproduct")


@pytest.mark.slow
@pytest.mark.parametrize("householder,length", [(2, 65), (3, 130)])
def test_deltaproducts_chunk_kernel_agrees(householder, length, monkeypatch):
    """The library's chunked DeltaProduct kernel (``fla.ops.gated_delta_product.chunk``), which its layer
    runs above 64 tokens in ``mode="chunk"``, computes what the conversion does. Its wrapper refuses
    float32 by an assertion; the test calls the kernel's autograd Function itself, as the wrapper does."""
    import fla.layers.gated_deltaproduct as library_module
    from fla.ops.gated_delta_product.chunk import ChunkGatedDeltaProductFunction

    def float32_chunk(
        q,
        k,
        v,
        g,
        beta,
        num_householder,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
        **_,
    ):
        scale = k.shape[-1] ** -0.5
        return ChunkGatedDeltaProductFunction.apply(
            q,
            k,
            v,
            g,
            beta,
            scale,
            num_householder,
            initial_state,
            output_final_state,
            use_qk_l2norm_in_kernel,
            cu_seqlens,
            None,
            None,
        )

    monkeypatch.setattr(library_module, "chunk_gated_delta_product", float32_chunk)
    torch.manual_seed(0)
    layer = fla_layers.GatedDeltaProduct(
        hidden_size=HIDDEN, num_heads=2, head_dim=16, expand_v=1, num_householder=householder
    ).eval()
    x = torch.randn(2, length, HIDDEN, generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        close(convert(layer)(x)[0], layer(x)[0], "gated-deltaproduct")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rwkv7", "rwkv7-later-fused"])
def test_rwkv7_matches_the_librarys_recurrent_kernel_long(name):
    """Past 64 tokens the library's layer runs ``chunk_rwkv7``, itself 9.3e-4 from its float64 recurrence
    (hence :data:`RTOL`); on its recurrent kernel (``fused_recurrent_rwkv7``, what the fla route runs as
    RWKV-7's reference) at 130 tokens, the conversion matches at the default tolerance (rtol 1e-5)."""
    from attnx.adapters.fla.load import recurrent_reference

    layer = library_layer(name)
    assert recurrent_reference(layer)
    replacement = convert(layer)
    x = torch.randn(2, 130, HIDDEN, generator=torch.Generator().manual_seed(130))
    kwargs = model_kwargs(name, x)
    with torch.no_grad():
        close(replacement(x, **kwargs)[0], layer(x, **kwargs)[0], "tight")


@pytest.mark.slow
def test_a_later_rwkv7_layer_needs_v_first():
    replacement = convert(library_layer("rwkv7-later-fused"))
    with pytest.raises(AttnxError, match="layer 1 mixes in the first layer's values: pass v_first"):
        replacement(torch.randn(1, 3, HIDDEN))


@pytest.mark.parametrize("name", list(LAYERS))
def test_a_layer_converts_on_its_own_device(name):
    """A layer on another device (a GPU; here the meta device, which computes nothing) converts to a
    replacement whose every parameter and buffer is there too: its probes and its own tensors (rotary
    frequencies, decays) included."""
    replacement = convert(library_layer(name).to("meta"))
    tensors = [*replacement.parameters(), *replacement.buffers()]
    assert tensors and {t.device.type for t in tensors} == {"meta"}


def test_library_layers_need_the_adapter():
    layer = fla_layers.GatedLinearAttention(hidden_size=HIDDEN, num_heads=2)
    assert needs_adapter(layer) and needs_adapter(layer.g_norm_swish_gate)
    assert not needs_adapter(layer.q_proj)


@pytest.mark.parametrize(
    "make,fragments",
    [
        (lambda: fla_layers.HGRNAttention(hidden_size=HIDDEN), ("HGRNAttention", "it maps LinearAttention")),
        (
            lambda: fla_layers.GatedDeltaNet(hidden_size=HIDDEN, num_heads=2, num_v_heads=1, head_dim=16),
            ("num_v_heads=1 < num_heads=2",),
        ),
        (
            lambda: fla_layers.GatedLinearAttention(
                hidden_size=HIDDEN, num_heads=2, fuse_norm=False, gate_fn="gelu"
            ),
            ("activation 'gelu'",),
        ),
        (
            lambda: fla_layers.GatedDeltaProduct(hidden_size=HIDDEN, num_heads=2, num_v_heads=1, head_dim=16),
            ("GatedDeltaProduct with num_v_heads=1 < num_heads=2",),
        ),
    ],
    ids=[
        "unmapped-hgrn",
        "gdn-fewer-value-heads",
        "gla-gelu-gate",
        "gdp-fewer-value-heads",
    ],
)
def test_what_attnx_does_not_reproduce_is_refused_by_name(make, fragments):
    with pytest.raises(AttnxError) as error:
        convert(make())
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


# --- padding: the library's 2D attention_mask ----------------------------------------------------

# The default run: one layer per way the library treats padding (it unpads: the gated rule, here a layer
# without short convolutions, whose keys at the padding are not zero by themselves; it runs the padded
# tokens with some inputs zeroed: RWKV-7's generalised rule, Mamba2's SSD); the rest in the slow set.
PADDED_CASES = [("gated-deltanet-gva-sigmoid", 9), ("rwkv7", 9), ("mamba2-groups", 9)]
SLOW_PADDED_CASES = [(name, n) for name in LAYERS for n in (9, 65, 130) if (name, n) not in PADDED_CASES]


def padded(length: int, side: str) -> torch.Tensor:
    """A (3, length) int mask: row 0 all real, rows 1 and 2 with length // 4 + 1 and length // 2 + 1
    padded tokens on ``side`` (left: as generate pads; right: as the export's own parity draws masks)."""
    mask = torch.ones(3, length, dtype=torch.long)
    for row, pads in ((1, length // 4 + 1), (2, length // 2 + 1)):
        if side == "left":
            mask[row, :pads] = 0
        else:
            mask[row, length - pads :] = 0
    return mask


def _check_padded_layer(name: str, length: int, sides: tuple[str, ...] = ("left", "right")) -> None:
    """The conversion equals the library's layer given the same mask at every position (padded ones too:
    the export's own parity compares them), and a left-padded row the library's layer on that row alone."""
    layer = library_layer(name)
    replacement = convert(layer)
    rtol = CHUNK_RTOL.get(name) if route(name, length).endswith(".chunk") else None
    x = torch.randn(3, length, HIDDEN, generator=torch.Generator().manual_seed(length))
    kwargs = model_kwargs(name, x)
    for side in sides:
        mask = padded(length, side)
        with torch.no_grad():
            expected = layer(x, attention_mask=mask, **kwargs)[0]
            actual = replacement(x, attention_mask=mask, **kwargs)[0]
        close(actual, expected, name, rtol)
        if side == "left":
            for row in (1, 2):
                real = mask[row].bool()
                alone = {key: value[row : row + 1, real] for key, value in kwargs.items()}
                with torch.no_grad():
                    expected = layer(x[row : row + 1, real], **alone)[0]
                close(actual[row : row + 1, real], expected, name, rtol)


@pytest.mark.parametrize("name,length", _cases(PADDED_CASES, SLOW_PADDED_CASES))
def test_padded_layer_matches_the_librarys_forward(name, length):
    _check_padded_layer(name, length)


def _no_mask_in(method: str):
    """A seeded defect: ``FlaLayer.<method>`` called without the padding mask."""
    from attnx.adapters.fla import layers

    original = getattr(layers.FlaLayer, method)
    if method == "rule":
        return lambda self, *args, mask=None: original(self, *args)
    return lambda self, xs, past, mask: original(self, xs, past, None)


@pytest.mark.parametrize(
    "method,name,side",
    [
        ("rule", "gated-deltanet-gva-sigmoid", "left"),
        ("convolve", "gla-conv", "left"),
        ("unpads", "gla-conv", "right"),
    ],
    ids=["keys-and-decays", "short-convolutions", "outputs"],
)
def test_each_padding_rule_is_needed(method, name, side, monkeypatch):
    """Each seeded defect fails the padded parity: a padded token's key and log-decay kept (its step then
    changes the state), the short convolutions reading the padding, the output at padded tokens kept
    (the library's is zero)."""
    from attnx.adapters.fla import layers

    _check_padded_layer(name, 9, (side,))
    if method == "unpads":
        monkeypatch.setattr(layers.FlaLayer, "unpads", False)
    else:
        monkeypatch.setattr(layers.FlaLayer, method, _no_mask_in(method))
    with pytest.raises(AssertionError):
        _check_padded_layer(name, 9, (side,))


def test_runtime_arguments_the_export_does_not_take_are_refused():
    replacement = convert(library_layer("gla-conv"))
    x = torch.randn(1, 4, HIDDEN)
    with pytest.raises(AttnxError, match="takes a 2D attention_mask"):
        replacement(x, attention_mask=torch.ones(1, 4, 4))
    with pytest.raises(AttnxError, match="use_cache=False"):
        replacement(x, use_cache=True)
    with pytest.raises(AttnxError, match="cu_seqlens"):
        replacement(x, cu_seqlens=torch.tensor([0, 4]))


# --- attnx export --from fla:DIR refusals ---------------------------------------------------------


def test_from_fla_refuses_a_directory_it_cannot_load(tmp_path):
    code, _, err = run_cli(["export", "--from", f"fla:{tmp_path}", "-o", str(tmp_path / "out")])
    assert_one_line_error(code, err, "no config.json")
    (tmp_path / "config.json").write_text('{"model_type": "hgrn"}')
    code, _, err = run_cli(["export", "--from", f"fla:{tmp_path}", "-o", str(tmp_path / "out")])
    assert_one_line_error(code, err, "'hgrn'", "gla (GatedLinearAttention)", "rwkv7 (RWKV7Attention)")
    assert not (tmp_path / "out").exists()


def test_a_missing_library_names_the_extra(tmp_path, monkeypatch):
    from attnx.adapter import Adapter

    monkeypatch.setattr(Adapter, "library_version", lambda self: None)
    code, _, err = run_cli(["export", "--from", f"fla:{tmp_path}", "-o", str(tmp_path / "out")])
    assert_one_line_error(code, err, "flash-linear-attention", "pip install 'attnx[fla]'")
