"""The simulator's running jobs' views, in launch order, kept so that a snapshot of them costs
O(chunks + changed chunks), not O(running jobs): a round between two events changes the views
of a few jobs (those started, reshaped or ended) among thousands running."""

from __future__ import annotations

from reamer.domain import JobView
from reamer.domain.snapshot import ChunkedViews

CHUNK = 64  # views per chunk: a changed view costs a copy of its chunk, a snapshot one entry per chunk


class _Chunk:
    __slots__ = ("views", "frozen")

    def __init__(self) -> None:
        self.views: dict[str, JobView | None] = {}
        self.frozen: tuple[JobView, ...] | None = None  # the views as the last snapshot showed them


class RunningViews:
    """Job id -> view (None until the job's first snapshot), in the order the jobs were added,
    in chunks of at most ``size``. A job is added at the end; removing one leaves a hole in its
    chunk, and the chunks are packed again once there are twice as many as the views need."""

    def __init__(self, size: int = CHUNK) -> None:
        self._size = size
        self._chunks: list[_Chunk] = []
        self._of: dict[str, _Chunk] = {}
        self._snap: ChunkedViews | None = None

    def __contains__(self, jid: object) -> bool:
        return jid in self._of

    def __len__(self) -> int:
        return len(self._of)

    def add(self, jid: str) -> None:
        """A job starts running (at the end of the order); its view comes with :meth:`set`."""
        chunks = self._chunks
        if not chunks or len(chunks[-1].views) >= self._size:
            chunks.append(_Chunk())
        c = self._of[jid] = chunks[-1]
        c.views[jid] = None
        c.frozen = self._snap = None

    def set(self, jid: str, view: JobView) -> None:
        c = self._of[jid]
        c.views[jid] = view
        c.frozen = self._snap = None

    def remove(self, jid: str) -> None:
        c = self._of.pop(jid)
        del c.views[jid]
        c.frozen = self._snap = None
        if len(self._chunks) > 2 * (len(self._of) // self._size + 1):
            self._pack()

    def _pack(self) -> None:
        views = [(jid, v) for c in self._chunks for jid, v in c.views.items()]
        self._chunks, self._of = [], {}
        for jid, v in views:
            self.add(jid)
            self._of[jid].views[jid] = v

    def snapshot(self) -> ChunkedViews:
        """The views in order, as an immutable sequence (every view set)."""
        snap = self._snap
        if snap is None:
            parts = []
            for c in self._chunks:
                if c.frozen is None:
                    c.frozen = tuple(c.views.values())  # type: ignore[arg-type]
                if c.frozen:
                    parts.append(c.frozen)
            snap = self._snap = ChunkedViews(tuple(parts))
        return snap
