"""One error type for bad input: it always names the source, the place and what was expected."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad user input. ``str(err)`` is a single line: ``SOURCE: WHERE: expected ...``."""

    def __init__(self, source: str, where: str, expected: str, got: object | None = None):
        self.source = source
        self.where = where
        self.expected = expected
        self.got = got
        msg = f"{source}: {where}: expected {expected}"
        if got is not None:
            msg += f", got {got!r}"
        super().__init__(msg.replace("\n", " "))


def read_user_text(path: str | Path, expected: str) -> str:
    """The text of a user's file (UTF-8, a leading byte-order mark dropped); a missing,
    unreadable or non-UTF-8 file is a one-line InputError naming it."""
    p = Path(path)
    if not p.exists() or p.is_dir():  # (a pipe, such as /dev/stdin, is read like a file)
        raise InputError(str(p), "file", expected, "a directory" if p.is_dir() else None)
    try:
        return p.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise InputError(str(p), "file", expected, e.strerror) from None
    except UnicodeDecodeError:
        raise InputError(str(p), "encoding", "UTF-8 text") from None
