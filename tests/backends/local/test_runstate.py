"""The durable record of a real run (run.json) and what a new run does with the one it finds in
its state folder: resume it, refuse one of another scenario, or discard it with ``fresh``
(the resume itself, with real processes: tests/runtime/test_local_run.py)."""

from __future__ import annotations

import pytest

from reamer.backends.local import session
from reamer.backends.local.runstate import JobRecordFile, RunState, read_state, scenario_digest, set_status
from reamer.backends.local.runstate import write_state
from reamer.config.local import parse_local
from reamer.errors import InputError

SC = {"name": "t", "hosts": [{"name": "a", "cores": 1.0}],
      "jobs": [{"id": "j", "model": "small_cnn", "samples": 64, "ps": 1, "workers": 1, "ps_cores": 0.5,
                "worker_cores": 0.5}]}


def _record(sc, status="running") -> RunState:
    return RunState(scenario=sc.name, digest=scenario_digest(session._scenario_json(sc)), controller_pid=1,
                    started_wall=100.0, status=status, jobs=[JobRecordFile(id="j", status="running")])


def test_the_record_round_trips_and_is_replaced_atomically(tmp_path):
    st = _record(parse_local(SC, "t"))
    write_state(tmp_path, st)
    assert read_state(tmp_path) == st
    set_status(tmp_path, "interrupted")
    assert read_state(tmp_path).status == "interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temp file left
    assert read_state(tmp_path / "none") is None


@pytest.mark.parametrize("text,where", [("{", "line 1"), ('{"scenario": "t"}', "field digest"),
                                        ('{"scenario": "t", "digest": "d", "controller_pid": 1, "started_wall": 0, '
                                         '"status": "exploded"}', "field status")])
def test_a_damaged_record_is_one_line_naming_the_file_and_field(tmp_path, text, where):
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(InputError) as e:
        read_state(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / "run.json")) and where in msg and "--fresh" in msg


def test_an_unfinished_run_of_another_scenario_is_refused_and_left_as_it_was(tmp_path):
    sc = parse_local(SC, "t")
    write_state(tmp_path, _record(sc))
    other = parse_local({**SC, "jobs": [{**SC["jobs"][0], "samples": 128}]}, "t")
    with pytest.raises(InputError, match="--fresh"):
        session._previous(other, tmp_path, False, executor=None)
    assert read_state(tmp_path) == _record(sc)


def test_fresh_discards_an_unfinished_run_and_says_so(tmp_path):
    sc = parse_local(SC, "t")
    write_state(tmp_path, _record(sc))
    (tmp_path / "checkpoints" / "j").mkdir(parents=True)
    (tmp_path / "mine.txt").write_text("the user's")
    prev, said = session._previous(sc, tmp_path, True, executor=None)
    assert prev is None and said == [f"discarded the crashed run of 't' in {tmp_path} (--fresh): j was running"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]  # only what a run wrote is removed


def test_a_finished_record_is_not_resumed(tmp_path):
    sc = parse_local(SC, "t")
    write_state(tmp_path / "s", _record(sc, "finished"))
    assert session._previous(sc, tmp_path / "s", False, executor=None) == (None, [])
    assert not (tmp_path / "s").exists()
