"""Result files are written all or nothing, with the permissions a plain write would give."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from reamer.reports.results import write_atomic


def _mode(p) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_a_new_file_gets_the_umask_s_mode_and_a_rewritten_one_keeps_its_own(tmp_path):
    # in a child process, so that setting the umask does not touch the test runner's
    code = ("import os, sys; os.umask(0o022); from reamer.reports.results import write_atomic; "
            "write_atomic(sys.argv[1], 'x')")
    new = tmp_path / "new.json"
    subprocess.run([sys.executable, "-c", code, str(new)], check=True)
    assert _mode(new) == 0o644  # what open(path, "w") gives under umask 022; a temp file would be 0o600
    os.chmod(new, 0o640)
    write_atomic(new, "y")
    assert new.read_text() == "y" and _mode(new) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["new.json"]  # no temp file left
