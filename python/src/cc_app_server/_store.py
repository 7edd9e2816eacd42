"""`RolloutStore`: a state directory's rollout read and verified without a server (the offline
reader of docs/rollout-format.md), or the running server's (`AppServer.store()`). Every failure is
one of the SDK's classes: `StoreLocked`, `StoreUnsafe`, `StoreDamaged`, `StoreError`, `NotFound`,
`InvalidParams`, `Closed`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from ._errors import from_store_error
from ._native import ffi

StoreKind = Literal["jsonl", "sqlite"]


@dataclass(frozen=True)
class ThreadSummary:
    thread_id: str
    title: str | None
    created_at: str
    updated_at: str
    archived: bool
    last_seq: int
    head_hash: str


@dataclass(frozen=True)
class ThreadPage:
    threads: list[ThreadSummary]
    next_cursor: str | None
    #: Threads that could not be listed, with why (thread id, reason).
    unreadable: list[tuple[str, str]]


@dataclass(frozen=True)
class RolloutEvent:
    seq: int
    #: The payload's `type` tag.
    kind: str
    #: The whole event as JSON text.
    json: str
    hash: str
    prev_hash: str
    time: str


@dataclass(frozen=True)
class EventPage:
    events: list[RolloutEvent]
    has_more: bool


@dataclass(frozen=True)
class VerifyReport:
    thread_id: str
    ok: bool
    events: int
    head_seq: int
    head_hash: str
    first_bad_seq: int | None
    reason: str | None
    repairs: list[str]
    warnings: list[str]
    keyed: bool
    authenticated_through: int | None


class RolloutStore:
    """`RolloutStore.open(state_dir)` (a directory no server holds), or `server.store()`. Use it as
    a context manager or call `close()`, which releases the directory at once."""

    def __init__(self, native: Any) -> None:
        self._native = native

    @classmethod
    def open(cls, state_dir: str | os.PathLike[str], *, store: StoreKind = "jsonl", key: bytes | None = None,
             accept_unanchored: bool = False) -> RolloutStore:
        """Opens the store (repairing torn tails). `key`: the 32-byte rollout key, to check keyed
        threads' anchors and seals."""
        kinds = {"jsonl": ffi.StoreKind.JSONL, "sqlite": ffi.StoreKind.SQLITE}
        if store not in kinds:
            raise ValueError(f"store must be one of {sorted(kinds)}, got {store!r}")
        try:
            return cls(ffi.RolloutStore.open(os.fspath(state_dir), kinds[store], key, accept_unanchored))
        except ffi.StoreError as e:
            raise from_store_error(e, ffi) from None

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._native, name)(*args)
        except ffi.StoreError as e:
            raise from_store_error(e, ffi) from None

    def list(self, *, include_archived: bool = False, cursor: str | None = None, limit: int = 100) -> ThreadPage:
        page = self._call("list", include_archived, cursor, limit)
        return ThreadPage(
            threads=[ThreadSummary(t.thread_id, t.title, t.created_at, t.updated_at, bool(t.archived), int(t.last_seq),
                                   t.head_hash) for t in page.threads],
            next_cursor=page.next_cursor, unreadable=[(u.thread_id, u.reason) for u in page.unreadable])

    def read(self, thread_id: str, *, after_seq: int = 0, limit: int = 100) -> EventPage:
        """Events with seq > `after_seq`, at most `limit`. A damaged log raises `StoreDamaged`."""
        page = self._call("read", thread_id, after_seq, limit)
        return EventPage(events=[RolloutEvent(int(e.seq), e.kind, e.json, e.hash, e.prev_hash, e.time)
                                 for e in page.events], has_more=bool(page.has_more))

    def verify(self, thread_id: str) -> VerifyReport:
        """Checks the thread's whole hash chain and its anchor (a bad one is `ok=False`)."""
        r = self._call("verify", thread_id)
        return VerifyReport(thread_id=r.thread_id, ok=bool(r.ok), events=int(r.events), head_seq=int(r.head_seq),
                            head_hash=r.head_hash, first_bad_seq=r.first_bad_seq, reason=r.reason,
                            repairs=list(r.repairs), warnings=list(r.warnings), keyed=bool(r.keyed),
                            authenticated_through=r.authenticated_through)

    def close(self) -> None:
        """Flushes and closes (a server's store is only flushed: the server owns it)."""
        self._call("close")

    def __enter__(self) -> RolloutStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
