"""What a file of an export must be before anything uses it: a plain file inside OUT (no symbolic
link is followed) that holds what its name claims.

Every file the manifest lists is hashed through a descriptor opened with ``O_NOFOLLOW`` (a link,
even one to another file inside OUT, is refused, and so is a file with a second hard link: an export's files
are plain files it wrote), then
its content is checked by kind, without running or unpickling anything:

* ``.onnx``: parses as an ONNX model with a graph; every tensor stored as external data names a
  plain file of OUT that the manifest lists, within that file's size.
* ``.safetensors``: a sane header (a JSON object of known dtypes, shapes whose byte sizes match
  their offsets, which tile the data exactly).
* ``.json``: parses as JSON.

Each refusal is one :class:`AttnxError` line naming the file and the fix (re-export).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnx.errors import AttnxError, first_line

REEXPORT = "re-export it with `attnx export`"
_HEADER_LIMIT = 100 << 20  # safetensors' own cap on the JSON header
_SAFETENSORS_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


def open_plain(path: Path) -> int:
    """A read-only descriptor of ``path``, which must be a regular file and not a symbolic link.

    Raises:
        AttnxError: ``path`` is missing, a link, or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK)
    except FileNotFoundError:
        raise AttnxError(f"'{path.parent}' lacks {path.name}; {REEXPORT}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AttnxError(
                f"{path} is a symbolic link (to '{os.readlink(path)}'); attnx reads only plain files inside "
                f"an export and does not follow links: {REEXPORT} (or copy the file there)"
            ) from None
        raise AttnxError(f"cannot read {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise AttnxError(f"{path} is not a regular file; {REEXPORT}")
    if info.st_nlink > 1:  # onnx would refuse it as external data later, with a traceback's worth of words
        os.close(fd)
        raise AttnxError(
            f"{path} has {info.st_nlink} hard links; attnx reads an export's files only as files of their "
            "own (onnx refuses external data with more than one, as a possible hard-link attack): copy the "
            "export (cp -r) rather than linking its files"
        )
    return fd


def read_plain(path: Path, limit: int) -> bytes:
    """The bytes of the plain file ``path`` (see :func:`open_plain`), at most ``limit`` of them.

    Raises:
        AttnxError: as :func:`open_plain`, or a file larger than ``limit``.
    """
    fd = open_plain(path)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise AttnxError(
            f"{path} is larger than {limit >> 20} MiB, too large for what it claims to be; {REEXPORT}"
        )
    return data


def sha256_plain(path: Path) -> str:
    """The SHA-256 of the plain file ``path`` (see :func:`open_plain`)."""
    digest = hashlib.sha256()
    with os.fdopen(open_plain(path), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_content(path: Path, listed: Iterable[str]) -> None:
    """Check that ``path`` holds what its suffix claims (``listed``: the file names the manifest lists,
    where an ONNX model's external data must be).

    Raises:
        AttnxError: naming the file, what is wrong and the fix.
    """
    if path.suffix == ".onnx":
        check_onnx(path, set(listed))
    elif path.suffix == ".safetensors":
        check_safetensors(path)
    elif path.suffix == ".json":
        check_json(path)


def check_onnx(path: Path, listed: set[str]) -> Any:
    """``path`` parses as an ONNX model with a graph whose external data stays in listed files of OUT;
    returns the model (external data not loaded).

    Raises:
        AttnxError: naming the file and the fix.
    """
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(read_plain(path, 2 << 30))
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise AttnxError(f"{path} is not an ONNX model ({first_line(exc)}); {REEXPORT}") from None
    if not model.graph.node or not model.graph.output:
        raise AttnxError(
            f"{path} is not a complete ONNX model (its graph has no nodes or outputs); {REEXPORT}"
        )
    from onnx.external_data_helper import _get_all_tensors

    for tensor in _get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        if location not in listed or Path(location).name != location:
            raise AttnxError(
                f"{path} keeps tensor {tensor.name} in '{location[:80]}', which is not a file the export "
                f"lists; {REEXPORT}"
            )
        size = os.fstat(fd := open_plain(path.parent / location)).st_size
        os.close(fd)
        try:
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
        except ValueError:
            end = -1
        if not 0 <= end <= size:
            raise AttnxError(f"{path} keeps tensor {tensor.name} past the end of {location}; {REEXPORT}")
    return model


def check_safetensors(path: Path) -> tuple[int, dict[str, Any]]:
    """``path`` has a sane safetensors header; returns where its data starts (every ``data_offsets`` is
    from there) and the header.

    Raises:
        AttnxError: naming the file, the first problem and the fix.
    """
    fd = open_plain(path)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= length <= min(_HEADER_LIMIT, size - 8):
            raise AttnxError(
                f"{path} is not a safetensors file (no header of a plausible length); {REEXPORT}"
            )
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise AttnxError(f"{path} is not a safetensors file (its header is not a JSON object); {REEXPORT}")
    data = size - 8 - length
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _entry_problem(entry)
        if problem is None:
            begin, end = entry["data_offsets"]
            if end > data:
                problem = "data past the end of the file"
            spans.append((begin, end))
        if problem:
            raise AttnxError(f"{path}: tensor {name[:80]!r} has {problem}, so the header lies; {REEXPORT}")
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            raise AttnxError(f"{path}: its tensors overlap or leave gaps, so the header lies; {REEXPORT}")
        covered = end
    if covered != data:
        raise AttnxError(f"{path} holds {data - covered} bytes no tensor describes; {REEXPORT}")
    return 8 + length, header


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict) or entry.get("dtype") not in _SAFETENSORS_BYTES:
        return "no known dtype"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return "a malformed shape"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        return "malformed data offsets"
    begin, end = offsets
    if not 0 <= begin <= end or end - begin != math.prod(shape) * _SAFETENSORS_BYTES[entry["dtype"]]:
        return f"a shape {shape} that does not match its {end - begin} bytes"
    return None


def check_json(path: Path) -> Any:
    """``path`` parses as JSON; returns it.

    Raises:
        AttnxError: naming the file and the fix.
    """
    try:
        return json.loads(read_plain(path, 1 << 30))
    except (ValueError, RecursionError) as exc:
        raise AttnxError(f"{path} is not valid JSON ({first_line(exc)}); {REEXPORT}") from None
