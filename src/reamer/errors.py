"""One error type for bad input: it always names the source, the place and what was expected."""

from __future__ import annotations


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
