"""Train a linear-attention language model on 8x8 digits, export it, and generate with ONNX Runtime.

The image-generation setting of "Transformers are RNNs" (arXiv 2006.16236, §4.2.1) at toy scale: each of
scikit-learn's 1,797 8x8 digits (shipped inside scikit-learn, no download) is a sequence of 64 pixel
tokens, its 17 grey levels 0..16, after a start token that names the digit (17 + digit), so the model
draws the digit it is asked for. A causal ``lm`` with ``linear`` attention learns next-pixel
prediction; the script prints the loss falling, saves the weights (safetensors) and a recipe naming
them, exports the model with its O(1)-state decoder (``attnx.export(..., checkpoint=...)`` with the
``export.decode`` setting),
and draws every digit greedily with ONNX Runtime and with torch, which must agree token for token.

    pip install 'attnx[examples]'
    python examples/train_digits.py                    # 2,000 steps: ~5 minutes on one CPU core
    python examples/train_digits.py --quick            # 20 steps, for a smoke test
    python examples/train_digits.py --threads 1        # faster on a busy machine
    attnx generate digits-run/export --prompt-ids 20 -n 64    # a "3", as 64 grey levels

The full run's weights ship with attnx as the ``digits-lm`` recipe (attnx/recipes/digits-lm.*).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional

import attnx

LEVELS = 17  # grey levels 0..16 are tokens 0..16
START = LEVELS  # token 17 + d starts a picture of digit d
VOCAB = START + 10
PIXELS = 64
TRAIN_IMAGES = 1500  # the rest (297 images, the last writers) is held out
NAME = "digits-lm"
ARCHITECTURE = {"vocab_size": VOCAB, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128}
VARIANT = "linear"
RECIPE = f'''# A class-conditional generator of scikit-learn's 8x8 digits, trained by
# examples/train_digits.py: the image-generation setting of "Transformers are RNNs" (sec. 4.2.1)
# at toy scale. Tokens 0..16 are grey levels; 17 + d starts a picture of digit d (20 draws a 3).
description = "linear-attention LM trained on 8x8 digits (with its weights)"
paper = "Transformers are RNNs (arXiv 2006.16236), sec. 4.2.1 image generation"

[model]
name = "lm"
{chr(10).join(f"{key} = {value}" for key, value in ARCHITECTURE.items())}

[variant]
name = "{VARIANT}"

[export]
checkpoint = "{NAME}.safetensors"
decode = true  # prefill.onnx + decode.onnx: `attnx generate` draws digits with an O(1) state

[verify]
seq_lens = [1, 7, 65]
'''


def sequences() -> torch.Tensor:
    """Every digit as [17 + digit, 64 pixels] (1797, 65), int64, in scikit-learn's order."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = torch.from_numpy(digits.images.reshape(-1, PIXELS).astype(np.int64))
    return torch.cat([START + torch.from_numpy(digits.target.astype(np.int64))[:, None], pixels], dim=1)


def pixel_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of each pixel given the start token and the pixels before it."""
    (logits,) = model(batch[:, :-1])
    return functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def train(steps: int, batch_size: int = 32, seed: int = 0, log_every: int = 100) -> torch.nn.Module:
    data = sequences()
    train_set, held_out = data[:TRAIN_IMAGES], data[TRAIN_IMAGES:]
    model = attnx.nn.Model("lm", VARIANT, seed=seed, **ARCHITECTURE)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup = max(1, min(100, steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0)))
    )
    generator = torch.Generator().manual_seed(seed)
    print(
        f"training {VARIANT}-attention lm ({sum(p.numel() for p in model.parameters()):,} parameters) "
        f"on {len(train_set)} digits; uniform guessing costs {math.log(LEVELS):.3f} nats/pixel"
    )
    start = time.perf_counter()
    for step in range(1, steps + 1):
        batch = train_set[torch.randint(len(train_set), (batch_size,), generator=generator)]
        loss = pixel_loss(model, batch)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        if step in (1, steps) or step % log_every == 0:
            with torch.no_grad():
                model.eval()
                held = pixel_loss(model, held_out)
                model.train()
            print(
                f"step {step:5d}  train {loss.item():.3f}  held-out {held.item():.3f} nats/pixel  "
                f"({time.perf_counter() - start:.0f} s)"
            )
    return model.eval()


def picture(tokens: list[int]) -> list[str]:
    """8 rows of text for 64 grey levels (0 blank .. 16 darkest)."""
    shades = " .:-=+*#%@"
    cells = [shades[min(len(shades) - 1, t * len(shades) // LEVELS)] if t < LEVELS else "?" for t in tokens]
    return ["".join(cells[row * 8 : row * 8 + 8]) for row in range(8)]


def draw_all(out: Path) -> bool:
    """Greedy pictures of every digit from ONNX Runtime and torch; True when they agree token for token."""
    same, rows = True, [[] for _ in range(8)]
    for digit in range(10):
        drawn = {
            backend: attnx.generate(out, [START + digit], max_new_tokens=PIXELS, backend=backend).tokens
            for backend in ("ort-cpu", "torch")
        }
        same = same and drawn["ort-cpu"] == drawn["torch"]
        for row, text in zip(rows, picture(drawn["ort-cpu"]), strict=True):
            row.append(f"{text:8s}")
    print("greedy digits 0-9 (ONNX Runtime):")
    print("\n".join("  ".join(row) for row in rows))
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="optimiser steps (default 2000)")
    parser.add_argument("--quick", action="store_true", help="20 steps, for a smoke test")
    parser.add_argument("--out", type=Path, default=Path("digits-run"), help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = 20 if args.quick else args.steps
    model = train(steps, seed=args.seed, log_every=max(1, min(100, steps // 4)))

    args.out.mkdir(parents=True, exist_ok=True)
    weights = attnx.save_checkpoint(model, args.out / f"{NAME}.safetensors")
    (args.out / f"{NAME}.toml").write_text(RECIPE)
    print(f"saved {weights} ({weights.stat().st_size // 1024} KB) and {args.out / f'{NAME}.toml'}")

    export = args.out / "export"
    options = {**ARCHITECTURE, "export.decode": True}
    result = attnx.export(VARIANT, export, model="lm", options=options, checkpoint=weights, force=True)
    parity = "passed" if result.parity.passed else "FAILED"
    print(f"exported {export} (model.onnx, prefill.onnx, decode.onnx); parity torch vs ONNX Runtime {parity}")
    same = draw_all(export)
    print("torch and ONNX Runtime drew the same tokens" if same else "torch and ONNX Runtime DIFFER")
    return 0 if same and result.parity.passed else 1


if __name__ == "__main__":
    sys.exit(main())
