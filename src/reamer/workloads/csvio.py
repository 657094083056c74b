"""Strict CSV/JSONL row readers: every problem is one line naming file, row and field."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path

from reamer.errors import InputError


def read_rows(path: Path, required: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(row_number, row)`` of a CSV (header = row 1) or JSONL file (line numbers)."""
    if not path.is_file():
        raise InputError(str(path), "file", "an existing file")
    try:
        yield from _jsonl(path, required) if path.suffix == ".jsonl" else _csv(path, required)
    except UnicodeDecodeError as e:
        raise InputError(str(path), "encoding", "UTF-8 text") from None  # (e.start counts within a read chunk)


def _csv(path: Path, required: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(newline="", encoding="utf-8-sig") as f:  # a spreadsheet's byte-order mark is dropped
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(str(path), "header", f"columns {', '.join(required)} (missing {', '.join(missing)})")
        for i, row in enumerate(reader, start=2):
            if None in row or any(v is None for v in row.values()):
                raise InputError(str(path), f"row {i}", f"{len(header)} comma-separated fields")
            yield i, row


def _jsonl(path: Path, required: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(encoding="utf-8-sig") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(str(path), f"line {i}", f"a JSON object ({e.msg})") from None
            if not isinstance(row, dict):
                raise InputError(str(path), f"line {i}", "a JSON object")
            missing = [c for c in required if c not in row]
            if missing:
                raise InputError(str(path), f"line {i}", f"keys {', '.join(required)} (missing {', '.join(missing)})")
            yield i, {k: "" if v is None else str(v) for k, v in row.items()}


def _where(path: Path, i: int) -> str:
    return f"line {i}" if path.suffix == ".jsonl" else f"row {i}"


def number(path: Path, i: int, row: dict[str, str], field: str, *, minimum: float = 0.0,
           strict: bool = False, default: float | None = None) -> float:
    """Parse ``row[field]`` as a finite number ≥ minimum (> minimum when ``strict``)."""
    raw = row.get(field, "")
    if raw.strip() == "" and default is not None:
        return default
    op = ">" if strict else "≥"
    expected = f"a number {op} {minimum:g}"
    try:
        v = float(raw)
    except ValueError:
        raise InputError(str(path), f"{_where(path, i)}, field {field}", expected, raw) from None
    if not math.isfinite(v) or v < minimum or (strict and v == minimum):
        raise InputError(str(path), f"{_where(path, i)}, field {field}", expected, raw)
    return v


def integer(path: Path, i: int, row: dict[str, str], field: str, *, minimum: int = 0,
            default: int | None = None) -> int:
    v = number(path, i, row, field, minimum=minimum, default=default)
    if v != int(v):
        raise InputError(str(path), f"{_where(path, i)}, field {field}", f"an integer ≥ {minimum}", row.get(field))
    return int(v)
