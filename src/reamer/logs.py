"""Logging: one logger per component (``logging.getLogger(__name__)``), configured once by
the CLI. A record's ``extra`` fields are appended as ``key=value`` so that lines can be
grepped and parsed; nothing else in the package prints diagnostics."""

from __future__ import annotations

import logging
from typing import IO

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message key=value ...`` (the record's extra fields, sorted)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        return line + "".join(f" {k}={v}" for k, v in sorted(extra.items()))


def configure(level: str = "warning", stream: IO[str] | None = None) -> None:
    """Send the package's records at ``level`` and above to ``stream`` (default stderr)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("reamer")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
