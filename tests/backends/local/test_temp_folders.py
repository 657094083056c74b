"""The temporary folder of a run without a state folder (``reamer demo``): a ``kill -9`` leaves
it behind, and the next run's start (or ``reamer cleanup``) removes it, and only it."""

from __future__ import annotations

from reamer.backends.local.session import TEMP_MARK, TEMP_PREFIX, sweep_temp_folders


def _run_folder(root, name, marked=True):
    d = root / f"{TEMP_PREFIX}{name}"
    (d / "logs").mkdir(parents=True)
    (d / "logs" / "w.log").write_text("...")
    if marked:
        (d / TEMP_MARK).write_text("4242\n")
    return d


def test_only_marked_run_folders_of_dead_runs_are_removed(tmp_path):
    dead, own = _run_folder(tmp_path, "dead"), _run_folder(tmp_path, "own")
    unmarked = _run_folder(tmp_path, "someone-elses", marked=False)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (elsewhere / TEMP_MARK).write_text("1\n")
    link = tmp_path / f"{TEMP_PREFIX}link"
    link.symlink_to(_run_folder(tmp_path / "target", "x"))
    assert sweep_temp_folders(tmp_path, keep=own) == [dead]
    assert not dead.exists() and own.is_dir() and unmarked.is_dir() and elsewhere.is_dir()
    assert link.is_symlink() and (link / TEMP_MARK).is_file()  # a link is not followed
    assert sweep_temp_folders(tmp_path, keep=own) == []
