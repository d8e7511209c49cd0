"""--plot: a real PNG from a report, and the one-line error without matplotlib."""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import pytest

from attnx.bench.plot import plot_report, require_matplotlib
from attnx.bench.report import BenchReport, Measurement
from attnx.errors import AttnxError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _report() -> BenchReport:
    cases = [
        Measurement("m", "out", variant, backend, 1, n, "ok", timings_s=[c * n**k])
        for variant, k, c in (("softmax", 2.0, 1e-9), ("linear", 1.0, 1e-6))
        for backend in ("torch", "ort-cpu")
        for n in (256, 1024, 4096)
    ]
    cases.append(Measurement("m", "out", "softmax", "ort-cuda", 1, 256, "skipped", reason="no CUDA"))
    return BenchReport({"cpu": "test cpu"}, {}, {"threads": 2}, [], cases)


def _chunks(data: bytes) -> dict[bytes, bytes]:
    """PNG chunks by type, each CRC-checked."""
    chunks, offset = {}, len(PNG_SIGNATURE)
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc
        chunks[kind] = chunks.get(kind, b"") + body
        offset += 12 + length
    return chunks


def test_plot_is_a_valid_non_trivial_png(tmp_path: Path) -> None:
    path = tmp_path / "bench.png"
    plot_report(_report(), path)
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    chunks = _chunks(data)
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert (width, height) == (880, 605)  # 8 x 5.5 inches at 110 dpi
    pixels = zlib.decompress(chunks[b"IDAT"])
    assert len(set(pixels)) > 50  # lines, text and colours, not a blank canvas
    assert b"IEND" in chunks


def test_plot_without_two_lengths_still_writes_a_png(tmp_path: Path) -> None:
    report = _report()
    report.measurements = report.measurements[:1]
    plot_report(report, tmp_path / "one.png")
    assert (tmp_path / "one.png").read_bytes().startswith(PNG_SIGNATURE)


def test_missing_matplotlib_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(AttnxError, match=r"pip install 'attnx\[plot\]'"):
        require_matplotlib()
