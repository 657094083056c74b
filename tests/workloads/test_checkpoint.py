"""PS checkpoints across re-shards: a manifest names the one complete layout; resume reads
only it, so a job saved with 2 PS at step 5 and with 1 PS at step 9 resumes at step 9 with
every tensor from step 9 (whatever the shard count it resumes with)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reamer.workloads.real.ps_training import MANIFEST, ParameterServer, commit_layout, layout_file, read_manifest

MODEL = "small_cnn"


def _shards(n: int, ckpt, resume=None) -> list[ParameterServer]:
    return [ParameterServer(MODEL, k, n, 1, checkpoint=str(ckpt), resume=resume) for k in range(n)]


def _save_at(servers: list[ParameterServer], step: int) -> None:
    for ps in servers:
        ps.params = [np.full_like(p, float(step)) for p in ps.params]  # every tensor marks its step
        ps.version = step
        ps._save()
        ps.sock.close()


def test_a_resharded_job_resumes_at_the_newest_step_with_every_tensor_of_it(tmp_path):
    _save_at(_shards(2, tmp_path), 5)
    assert read_manifest(tmp_path) == (2, 5)
    one = _shards(1, tmp_path, resume=str(tmp_path))
    assert one[0].version == 5
    _save_at(one, 9)
    assert read_manifest(tmp_path) == (1, 9)
    assert sorted(f.name for f in tmp_path.glob("*.npz")) == [layout_file(1, 0, 9)]  # the old layout is gone
    for n in (1, 2, 3):
        back = _shards(n, tmp_path, resume=str(tmp_path))
        assert {ps.version for ps in back} == {9}
        values = {float(v) for ps in back for p in ps.params for v in np.unique(p)}
        assert values == {9.0}, f"{n} shards: tensors from other steps {values - {9.0}}"
        for ps in back:
            ps.sock.close()


def test_an_incomplete_checkpoint_is_not_committed_and_the_last_complete_one_stays(tmp_path):
    _save_at(_shards(2, tmp_path), 9)
    same = _shards(2, tmp_path, resume=str(tmp_path))
    _save_at(same[:1], 11)  # the same layout, shard 0 only: shard 1 died before it saved
    same[1].sock.close()
    assert read_manifest(tmp_path) == (2, 9)
    back = _shards(2, tmp_path, resume=str(tmp_path))
    assert {ps.version for ps in back} == {9}
    assert {float(v) for ps in back for p in ps.params for v in np.unique(p)} == {9.0}
    for ps in back:
        ps.sock.close()
    _save_at(_shards(1, tmp_path, resume=str(tmp_path)), 9)
    two = _shards(2, tmp_path, resume=str(tmp_path))
    _save_at(two[:1], 12)  # only shard 0 of the new 2-shard layout saved (the other died)
    assert read_manifest(tmp_path) == (1, 9)
    assert not commit_layout(tmp_path, 2, 12)
    back = _shards(1, tmp_path, resume=str(tmp_path))
    assert back[0].version == 9 and {float(np.unique(p)[0]) for p in back[0].params} == {9.0}
    back[0].sock.close()
    two[1].sock.close()


def test_resume_without_a_manifest_or_with_a_bad_one_says_so(tmp_path):
    with pytest.raises(ValueError, match="manifest"):
        _shards(1, tmp_path, resume=str(tmp_path))
    (tmp_path / MANIFEST).write_text(json.dumps({"shards": "two"}))
    with pytest.raises(ValueError, match=MANIFEST):
        read_manifest(tmp_path)
