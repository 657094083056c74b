import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.backends.sim.views import RunningViews
from reamer.domain.snapshot import ChunkedViews

# operations on job ids 0..39: add (if absent), set a new view (if present), remove (if present), snapshot
OPS = st.lists(st.tuples(st.sampled_from(["add", "set", "remove", "snap"]), st.integers(0, 39)), max_size=300)


@settings(max_examples=80, deadline=None)
@given(ops=OPS, size=st.integers(1, 5))
def test_running_views_keep_a_dicts_order_and_snapshots_stay_as_taken(ops, size):
    """The views come out in the order a dict keeps (insertion; an update keeps its place),
    through chunks, removals and repacking; a snapshot taken earlier does not change."""
    rv, ref, taken = RunningViews(size), {}, []
    for n, (op, i) in enumerate(ops):
        jid = f"j{i}"
        if op == "add" and jid not in ref:
            rv.add(jid)
            rv.set(jid, (jid, n))
            ref[jid] = (jid, n)
        elif op == "set" and jid in ref:
            rv.set(jid, (jid, n))
            ref[jid] = (jid, n)
        elif op == "remove" and jid in ref:
            rv.remove(jid)
            del ref[jid]
        elif op == "snap":
            taken.append((rv.snapshot(), tuple(ref.values())))
        assert len(rv) == len(ref) and (jid in rv) == (jid in ref)
    taken.append((rv.snapshot(), tuple(ref.values())))
    for snap, want in taken:
        assert tuple(snap) == want and len(snap) == len(want) and snap == want
    assert len(rv._chunks) <= 2 * (len(ref) // size + 1) + 1  # holes are packed away


def test_a_snapshot_is_reused_until_a_view_changes():
    rv = RunningViews(2)
    for jid in "abcde":
        rv.add(jid)
        rv.set(jid, jid)
    first = rv.snapshot()
    assert rv.snapshot() is first
    chunks = first._chunks
    rv.set("e", "E")  # only the last chunk is rebuilt
    second = rv.snapshot()
    assert tuple(second) == ("a", "b", "c", "d", "E") and tuple(first) == ("a", "b", "c", "d", "e")
    assert second._chunks[:2] == chunks[:2] and all(a is b for a, b in zip(second._chunks[:2], chunks[:2]))


def test_chunked_views_are_a_sequence():
    v = ChunkedViews((("a", "b"), ("c",), ("d", "e")))
    assert len(v) == 5 and list(v) == ["a", "b", "c", "d", "e"]
    assert v[0] == "a" and v[2] == "c" and v[-1] == "e" and v[1:4] == ("b", "c", "d")
    assert "d" in v and "z" not in v and v.index("c") == 2
    assert v == ("a", "b", "c", "d", "e") and v != ("a", "b")
    with pytest.raises(IndexError):
        v[5]
    assert not ChunkedViews(())
