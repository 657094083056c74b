"""What every ``reamer`` command shares: the exit codes, one-line errors, choice options whose
choices come from the policy registry (looked up only when shown or parsed, so that ``reamer
--help`` imports none of it), output paths checked before a run, and ``--json -`` (JSON on
stdout, the human output on stderr).

Nothing heavy is imported here at module level: ``reamer --help`` must stay fast
(tests/cli/test_startup.py)."""

from __future__ import annotations

import enum
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from reamer.errors import InputError

log = logging.getLogger(__name__)

# Exit codes (docs/cli.md): the contract scripts can rely on.
EXIT_OK = 0
EXIT_RUNTIME = 1  # the run failed: an OS error (disk full, permission), a cgroup / namespace / API error, a bug
EXIT_INPUT = 2  # bad input, found before any work: options, files, an unwritable output path, an unfit machine
EXIT_INTERRUPTED = 130  # Ctrl-C (or SIGTERM during a real run); everything the run started was removed

STDOUT = "-"  # ``--json -``


# ----------------------------------------------------------------------------- choices
class _LazyChoices(enum.EnumType):
    """An Enum whose members are made on first use from a function (the policy registry).
    Typer reads an Enum option's choices only to show help, complete or parse; building the
    command (``reamer --help`` builds every one) only needs the class."""

    def _members(cls) -> type[enum.Enum]:
        names = tuple(cls._names())
        real = cls.__dict__.get("_real")
        if real is None or tuple(m.value for m in real) != names:  # (a policy registered since: shown too)
            real = enum.Enum(cls.__name__, [(n, n) for n in names], module=cls.__module__)  # type: ignore[misc]
            type.__setattr__(cls, "_real", real)
        return real

    def __iter__(cls) -> Iterator[Any]:
        return iter(cls._members()) if "_names" in cls.__dict__ else super().__iter__()

    def __len__(cls) -> int:
        return len(cls._members()) if "_names" in cls.__dict__ else super().__len__()

    @property
    def __members__(cls):  # type: ignore[override]
        return cls._members().__members__ if "_names" in cls.__dict__ else super().__members__


def lazy_enum(name: str, names: Callable[[], Iterable[str]]) -> type[enum.Enum]:
    """An Enum named ``name`` whose members (value = name) are ``names()``, called on first use."""

    class Choices(enum.Enum, metaclass=_LazyChoices):
        pass

    Choices.__name__ = Choices.__qualname__ = name
    type.__setattr__(Choices, "_names", staticmethod(lambda: list(names())))
    return Choices


def choice_parser(names: Callable[[], Iterable[str]], what: str | None = None,
                  hint: Callable[[str], str | None] | None = None, *,
                  case_sensitive: bool = True) -> Callable[[Any], str]:
    """The parser of an option annotated with an Enum of ``names()`` (``typer.Option(parser=...)``;
    the Enum gives help its choices and the shell its completions): the value arrives as a plain
    ``str``; a bad one is the one-line error ``OPTION: value: expected one of ... [(WHAT)], got 'x'``
    followed by ``hint(x)`` when it has one."""

    def parse(value: Any) -> str:
        value = value.value if isinstance(value, enum.Enum) else str(value)
        if not case_sensitive:
            value = value.lower()
        known = list(names())
        if value not in known:
            extra = hint(value) if hint is not None else None
            raise typer.BadParameter(f"value: expected one of {', '.join(known)}" + (f" ({what})" if what else "")
                                     + f", got {value!r}"
                                     + (f"; {extra}" if extra else ""))
        return value

    return parse


def training_names() -> list[str]:
    from reamer.policies import policy_names

    return policy_names("training")


def harvest_names() -> list[str]:
    from reamer.policies import policy_names

    return policy_names("harvest")


TrainingPolicy = lazy_enum("TrainingPolicy", training_names)  # from the one registry: reamer.policies.REGISTRY
HarvestPolicy = lazy_enum("HarvestPolicy", harvest_names)


def policy_parser(kind: str, other: str | None = None) -> Callable[[Any], str]:
    """The parser of a ``kind`` (``training`` / ``harvest``) policy option; a policy of the
    other kind is named as such, and ``other`` is the option that takes it."""
    mine, theirs = (training_names, harvest_names) if kind == "training" else (harvest_names, training_names)
    other_kind = "harvesting" if kind == "training" else "training"

    def hint(value: str) -> str | None:
        if value not in theirs():
            return None
        return f"{value!r} is a {other_kind} policy" + (f": choose it with {other} {value}" if other else "")

    return choice_parser(mine, f"{kind} policies", hint)


# ----------------------------------------------------------------------------- one-line errors
def error_line(exc: BaseException) -> tuple[str, int]:
    """The one line (without ``error: ``) and the exit code for an exception that ends a command."""
    if isinstance(exc, InputError):
        return str(exc), EXIT_INPUT
    if type(exc) is typer.BadParameter and getattr(exc, "param", None) is not None:  # (not MissingParameter)
        opts = exc.param.opts  # type: ignore[union-attr]
        name = next((o for o in opts if o.startswith("--")), opts[0] if opts else exc.param.name)  # type: ignore[union-attr]
        return f"{name}: {exc.message}".replace("\n", " "), EXIT_INPUT
    if isinstance(exc, typer.TyperException):  # other usage errors (unknown option, missing argument ...)
        ctx = getattr(exc, "ctx", None)
        see = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        return exc.format_message().replace("\n", " ") + see, getattr(exc, "exit_code", EXIT_INPUT)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}".replace("\n", " "), EXIT_RUNTIME
    if type(exc).__module__.startswith("reamer."):  # the package's own errors are one line already
        return str(exc).replace("\n", " "), EXIT_RUNTIME
    return (f"{type(exc).__name__}: {exc} (reamer --log-level debug ... prints the traceback)".replace("\n", " "),
            EXIT_RUNTIME)


def fail(exc: BaseException) -> None:
    """Print ``exc`` as one line on stderr and exit with its code."""
    line, code = error_line(exc)
    if code == EXIT_RUNTIME and not isinstance(exc, typer.TyperException):
        log.debug("traceback", exc_info=exc)
    print(f"error: {line}", file=sys.stderr, flush=True)
    raise SystemExit(code)


class Group(TyperGroup):
    """The ``reamer`` group: every error that ends a command is one line on stderr with the
    exit code of :func:`error_line` (typer would print a usage box or a traceback)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # `reamer` alone: the help (typer may have printed it)
                msg = e.format_message()
                if msg.strip():
                    print(msg, file=sys.stderr)
                raise SystemExit(EXIT_INPUT) from None
            fail(e)
        except typer.Abort:
            print("error: aborted", file=sys.stderr)
            raise SystemExit(EXIT_RUNTIME) from None
        except Exception as e:  # noqa: BLE001 - the point: one line, not a traceback
            fail(e)
        raise SystemExit(rv if isinstance(rv, int) else EXIT_OK)


# ----------------------------------------------------------------------------- outputs
def check_output(path: Path | None, option: str, *, stdout_ok: bool = True) -> None:
    """An output path that the run could not write is an :class:`InputError` now, before the
    run: a folder, a file under a file, a read-only file system, no permission (a temp file
    is made and removed in the folder, as the write will). ``-`` is stdout where ``stdout_ok``."""
    if path is None:
        return
    p = Path(path)
    if str(p) == STDOUT:
        if stdout_ok:
            return
        raise InputError(option, "value", "a file path (only --json writes to stdout, with -)", STDOUT)
    if p.is_dir():
        raise InputError(option, str(p), "a file path", "a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError(option, str(p), "a writable file", _why(p))
    folder = p.parent
    while not folder.exists() and folder != folder.parent:  # written with parents=True: the first that exists decides
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(option, str(p), "a path under a folder", f"{folder} is a file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(option, str(p), "a path in a writable folder", f"{folder}: {_why(folder)}")
    try:  # what the write will do: a temp file in the folder (root passes os.access on /proc, /sys ...)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".reamer-probe-")
    except OSError as e:
        raise InputError(option, str(p), "a path in a writable folder", f"{folder}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)


def _why(p: Path) -> str:
    try:
        if os.statvfs(p).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def to_stdout(path: Path | None) -> bool:
    return path is not None and str(path) == STDOUT


def human(json_out: Path | None):
    """The console for tables and summaries: stdout, or stderr when ``--json -`` owns stdout."""
    from rich.console import Console

    err = to_stdout(json_out)
    if (sys.stderr if err else sys.stdout).isatty():
        return Console(stderr=err)
    return Console(stderr=err, width=160)  # piped: wide enough for the summary tables


def emit_json(path: Path, doc: dict[str, Any]) -> None:
    """``doc`` to ``path`` (atomically) or, for ``-``, to stdout."""
    if to_stdout(path):
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
        sys.stdout.flush()
        return
    from reamer.reports.results import write_json

    write_json(path, doc)


def emit_text(path: Path, text: str) -> None:
    if to_stdout(path):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    from reamer.reports.results import write_atomic

    write_atomic(path, text)
