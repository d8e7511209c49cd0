"""Model weights in and out of attnx: safetensors (preferred) or a plain PyTorch state dict.

A PyTorch file is read with ``torch.load(..., weights_only=True)``, which rebuilds
tensors and plain containers only and refuses any other pickled object, so a
checkpoint can never run code. A checkpoint must match the built model exactly: a
mismatch is reported in one line (missing keys, unexpected keys, shape mismatches).
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnx.arguments import typed_arguments
from attnx.atomic import check_output_file, write_atomic
from attnx.errors import AttnxError

SAFETENSORS_SUFFIX = ".safetensors"
LISTED = 5  # names shown per mismatch kind before "..."
# What the weights-only unpickler says when a file pickles more than tensors (not when it is garbage).
_REFUSED = re.compile(r"GLOBAL|reduce|object|build", re.IGNORECASE)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors in ``path``: safetensors, or a torch state dict (``{"state_dict": ...}`` is unwrapped).

    Raises:
        AttnxError: missing/unreadable file, or a pickle holding anything but tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise AttnxError(f"checkpoint '{path}' does not exist or is not a file")
    if path.suffix == SAFETENSORS_SUFFIX or _looks_like_safetensors(path):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise AttnxError(f"cannot read safetensors checkpoint '{path}': {_first_line(exc)}") from None
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = _unpickler_reason(exc)
        if not _REFUSED.search(reason):
            raise AttnxError(f"cannot read checkpoint '{path}' as a PyTorch state dict: {reason}") from None
        raise AttnxError(
            f"refusing checkpoint '{path}': it pickles objects other than tensors ({reason}); "
            "save a state dict of tensors or use .safetensors"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise AttnxError(
            f"cannot read checkpoint '{path}' as a PyTorch state dict: {_first_line(exc)}"
        ) from None
    except Exception as exc:  # the file is user input: torch.load fails on garbage with any type
        raise AttnxError(
            f"cannot read checkpoint '{path}' as a PyTorch state dict: not a torch.save file "
            f"({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    if isinstance(data, Mapping) and set(data) == {"state_dict"}:
        data = data["state_dict"]
    if not isinstance(data, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()
    ):
        raise AttnxError(f"checkpoint '{path}' is not a state dict (a mapping of names to tensors)")
    return dict(data)


def load_checkpoint(module: nn.Module, path: str | Path) -> None:
    """Load ``path`` into ``module``; names and shapes must match exactly.

    A name the file lacks is accepted when it shares storage with one it has (tied
    weights, which ``safetensors.torch.save_model`` stores once).

    Raises:
        AttnxError: unreadable file, or a mismatch, listed in one line.
    """
    state = read_state_dict(path)
    expected = module.state_dict()
    aliases: dict[int, list[str]] = {}
    for name, tensor in expected.items():
        aliases.setdefault(tensor.data_ptr(), []).append(name)
    for names in aliases.values():
        present = [n for n in names if n in state]
        for name in names:
            if present and name not in state:
                state[name] = state[present[0]]
    missing = [name for name in expected if name not in state]
    unexpected = [name for name in state if name not in expected]
    shapes = [
        f"{name} {tuple(state[name].shape)} vs model {tuple(tensor.shape)}"
        for name, tensor in expected.items()
        if name in state and state[name].shape != tensor.shape
    ]
    problems = [
        _listing(f"missing {len(missing)} key{'s' * (len(missing) != 1)}", missing),
        _listing(f"unexpected {len(unexpected)} key{'s' * (len(unexpected) != 1)}", unexpected),
        _listing(f"{len(shapes)} shape mismatch{'es' * (len(shapes) != 1)}", shapes),
    ]
    problems = [p for p in problems if p]
    if problems:
        raise AttnxError(f"checkpoint '{path}' does not fit the model: {'; '.join(problems)}")
    module.load_state_dict(state, strict=True)


@typed_arguments
def save_checkpoint(model: Any, path: str | Path) -> Path:
    """Write the weights of ``model`` (an ``nn.Module`` or an export ``Assembly``) to ``path``, atomically.

    ``.safetensors`` (recommended) or any other suffix for a ``torch.save`` state dict;
    both load back with ``attnx export --checkpoint``. Returns the path written.
    """
    module = getattr(model, "module", model)
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"save_checkpoint expects an nn.Module or an attnx Assembly, got {type(model).__name__}"
        )
    check_checkpoint_target(path, force=True)
    path = Path(path)
    state = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in module.state_dict().items()}
    if path.suffix == SAFETENSORS_SUFFIX:
        from safetensors.torch import save

        data = save(state, metadata={"format": "pt"})
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    return path


def check_checkpoint_target(path: str | Path, force: bool) -> None:
    """Refuse a ``save_checkpoint`` target before any work: a directory, an existing file
    (without ``force``), or a path that cannot be created.

    Raises:
        AttnxError: naming the path and the fix.
    """
    check_output_file(path, force, what="checkpoint file")


def _looks_like_safetensors(path: Path) -> bool:
    """safetensors files start with an 8-byte header length, then a JSON object."""
    with open(path, "rb") as handle:
        head = handle.read(9)
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size


def _listing(title: str, names: list[str]) -> str:
    if not names:
        return ""
    shown = ", ".join(names[:LISTED])
    return f"{title}: {shown}{', ...' if len(names) > LISTED else ''}"


def _unpickler_reason(exc: BaseException) -> str:
    """The weights-only unpickler's own sentence in torch's long message, without torch's advice
    (which suggests ``weights_only=False``), e.g. "Unsupported global: GLOBAL os.system"."""
    text = str(exc).partition("Check the documentation of torch.load")[0]
    text = text.rpartition("WeightsUnpickler error:")[2]
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and "weights_only" not in line and not line.startswith("Weights only load failed")
    ]
    if not lines:
        return type(exc).__name__
    return re.sub(r"\s+(was not an allowed global|whose module)\b.*", "", lines[-1])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
