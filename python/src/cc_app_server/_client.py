"""The two clients: `AsyncClient` (asyncio) and `BlockingClient` (scripts). Both wrap the one native
client (pending-request map, timeouts, approval routing all live in Rust) and add what Python needs:
typed methods returning the generated result classes, typed notifications, the SDK's errors, and
waits that never block an event loop (async) or Ctrl-C (blocking).

Notifications: while an iterator runs, one native listener moves whole batches (up to 256 messages
per FFI call) into the client's inbox on its delivery thread, so the native side and the Python
consumer work in parallel. Each notification goes to exactly one reader. What has arrived but was
not yet yielded stays in the inbox (bounded), so breaking out of a loop, Ctrl-C or cancelling the
iterating task loses nothing: the next iteration starts with it.
"""

from __future__ import annotations

import _thread
import asyncio
import json
import queue
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Final, Protocol, TypeVar

from . import _params
from . import protocol as p
from ._approvals import ApprovalHandler, NativeApprovals
from ._errors import Closed, KernelFailed, ProtocolError, Timeout, TurnInterrupted, from_client_error
from ._logging import log
from ._native import ffi
from .protocol import JsonObject



class _ServerLike(Protocol):
    """What a client needs of its server (`cc_app_server.AppServer`): the open native server.
    A protocol, so this module never imports `_server`, which builds clients."""

    def _require(self) -> Any: ...

T = TypeVar("T")

# How long one wait lasts at most: the bound on how late Ctrl-C (blocking) is noticed.
_SLICE_MS = 50
# Notifications held in the Python inbox before the native delivery thread waits (backpressure:
# past this the native queue fills and the server closes a client that never reads).
_INBOX_LIMIT = 4096
_DEFAULT_APPROVAL_TIMEOUT = 30.0


def _dump(value: p.Json) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# Every notification the server sends starts with these bytes (serde writes members in struct order).
_HEAD = '{"jsonrpc":"2.0","method":"'
_DELTA_HEAD = '{"jsonrpc":"2.0","method":"item/delta","params":'


class LazyItemDeltaNotification(p.ItemDeltaNotification):
    """An `ItemDeltaNotification` whose `params` are decoded (and validated) when first read.

    The hot kind of a text turn: thousands per turn, and most consumers only test the class (or
    read a few). `notifications()` yields these for `item/delta`; they are the generated class in
    every respect (`isinstance`, `match`, `==`, `repr`, `dataclasses.replace`) except that a
    message that does not decode raises `DecodeError` on the first read of `params`, not in the
    iterator."""

    # Equal to the eagerly decoded class with the same fields (a dataclass compares classes).
    def __eq__(self, other: object) -> bool:
        if isinstance(other, p.ItemDeltaNotification):
            return (self.jsonrpc, self.method, self.params) == (other.jsonrpc, other.method, other.params)
        return NotImplemented

    __hash__ = p.ItemDeltaNotification.__hash__

    @property
    def params(self) -> p.ItemDeltaParams:
        d = self.__dict__
        value = d.get("_params")
        if value is None:
            text = d.pop("_text")
            try:
                value = _text_delta_params(text) or p.decode_ItemDeltaNotification(json.loads(text)).params
            except ValueError:
                d["_text"] = text
                raise
            d["_params"] = value
        result: p.ItemDeltaParams = value
        return result

    @params.setter
    def params(self, value: p.ItemDeltaParams) -> None:
        # `dataclasses.replace` and the generated `__init__` set fields with object.__setattr__.
        self.__dict__["_params"] = value


# The server's own spelling of the commonest notification, a text delta with exactly the members
# this version knows, in the order and spacing the engine writes them (`sdk_tests` checks that the
# real server's deltas take this path). A message this matches is
# valid JSON of that one shape (no duplicate or unknown member, no leading zero, no raw control
# character), so its values are what `json.loads` + the generated decoder would give; any other
# text is decoded by those.
_ID = r'"([^"\\\x00-\x1f]*)"'
_TEXT_DELTA: Final = re.compile(
    r'\{"jsonrpc":"2\.0","method":"item/delta","params":\{"threadId":' + _ID + r',"eventSeq":(0|[1-9][0-9]*)'
    + r',"delta":\{"text":"((?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*)","type":"text"\}'
    + r',"itemId":' + _ID + r',"turnId":' + _ID + r'\}\}\Z'
)


def _text_delta_params(text: str) -> p.ItemDeltaParams | None:
    """The params of a text delta in the server's spelling, read by one regular expression
    instead of `json.loads` and the generic decoder's per-member calls (a third of the cost);
    `None` for any other text. Builds objects equal to the generated decoder's:
    `sdk_tests/test_turn_stream.py` holds the two equal over accepted and refused shapes."""
    m = _TEXT_DELTA.match(text)
    if m is None:
        return None
    thread_id, seq, body, item_id, turn_id = m.groups()
    if "\\" in body:
        body = json.loads('"' + body + '"')
    new = object.__new__
    delta = new(p.TextDelta)
    delta.__dict__.update({"type_": "text", "text": body, "extra": {}})
    params = new(p.ItemDeltaParams)
    params.__dict__.update(
        {"thread_id": thread_id, "event_seq": int(seq), "turn_id": turn_id, "item_id": item_id, "delta": delta, "extra": {}}
    )
    result: p.ItemDeltaParams = params
    return result


def _lazy_delta(text: str) -> LazyItemDeltaNotification:
    note = LazyItemDeltaNotification.__new__(LazyItemDeltaNotification)
    note.__dict__["_text"] = text
    return note


def _decode_notification(text: str) -> p.ServerNotification:
    if text.startswith(_DELTA_HEAD):
        return _lazy_delta(text)
    return _decode_value(json.loads(text))


def _decode_value(raw: Any) -> p.ServerNotification:
    try:
        return p.decode_ServerNotification(raw)
    except p.DecodeError as e:
        # A known method in a shape this version cannot read: keep it rather than drop it.
        log.warning("notification kept as UnknownCase, it does not decode: %s", e)
        return p.UnknownCase(raw=raw if isinstance(raw, dict) else {"raw": raw})


def _thread_of(text: str) -> tuple[str | None, Any]:
    """The `params.threadId` of a notification, and its parsed JSON when it took a parse (else
    None). Read from the head of the text when the server wrote it in its usual order."""
    if text.startswith(_HEAD):
        m = text.find('"', len(_HEAD))
        key = ',"params":{"threadId":"'
        if m > 0 and text.startswith(key, m + 1):
            start = m + 1 + len(key)
            end = text.find('"', start)
            if end > 0 and "\\" not in text[start:end]:
                return text[start:end], None
    try:
        raw = json.loads(text)
    except ValueError:
        return None, None
    params = raw.get("params") if isinstance(raw, dict) else None
    thread = params.get("threadId") if isinstance(params, dict) else None
    return (thread if isinstance(thread, str) else None), raw


def _turn_of(note: p.ServerNotification) -> str | None:
    """The turn a notification belongs to: `params.turnId`, or `params.turn.id` (turn/started,
    turn/completed); None for thread-level ones."""
    params = getattr(note, "params", None)
    if params is None:
        if isinstance(note, p.UnknownCase):
            raw = note.raw.get("params")
            if isinstance(raw, dict):
                t = raw.get("turnId")
                if isinstance(t, str):
                    return t
                turn = raw.get("turn")
                if isinstance(turn, dict) and isinstance(turn.get("id"), str):
                    return str(turn["id"])
        return None
    t = getattr(params, "turn_id", None)
    if isinstance(t, str):
        return t
    turn = getattr(params, "turn", None)
    tid = getattr(turn, "id", None)
    return tid if isinstance(tid, str) else None


def _object(text: str, method: str) -> JsonObject:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ProtocolError(p.ErrorCode.INTERNAL, f"the result of {method} is not an object")
    return value


def _ms(seconds: float | None, name: str) -> int | None:
    if seconds is None:
        return None
    if seconds < 0:
        raise ValueError(f"{name} must not be negative (got {seconds})")
    return int(seconds * 1000)


class _Options:
    def __init__(self, request_timeout: float | None, max_pending: int | None, approval_timeout: float | None,
                 notification_capacity: int | None) -> None:
        self.native = ffi.ClientOptions(
            request_timeout_ms=_ms(request_timeout, "request_timeout"), max_pending=max_pending,
            approval_timeout_ms=_ms(approval_timeout, "approval_timeout"),
            notification_capacity=notification_capacity)
        self.approval_deadline = _DEFAULT_APPROVAL_TIMEOUT if approval_timeout is None else approval_timeout


def _connect(server: _ServerLike, handler: NativeApprovals, options: _Options) -> Any:
    try:
        return ffi.Client.connect(server._require(), handler, options.native)
    except ffi.ClientError as e:
        raise from_client_error(e, ffi) from None


class _Inbox:
    """Notifications the native side handed over and nobody has taken yet."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: deque[str] = deque()
        # The native stream ended: the client (or the server) is closed.
        self.ended = False
        self.waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        # The delivery thread is waiting for room.
        self.blocked = False
        # Per-turn streams (`turn()`), by thread id: their thread's notifications go to them.
        self.subs: dict[str, list[_TurnSub]] = {}

    def unblock(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def wake(self) -> None:
        """Wakes every waiting iterator (blocking ones wait on `cond`); call with `cond` held."""
        self.cond.notify_all()
        if not self.waiters:
            return
        waiters, self.waiters = self.waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:
                pass  # that loop is closed; nobody is waiting there any more


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _TurnSub:
    """What one `turn()` handle receives: every notification of its thread from the moment it
    subscribed (before `turn/start` was sent); the handle keeps those of its turn."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        # (text, parsed JSON or None)
        self.items: deque[tuple[str, Any]] = deque()


def _route(inbox: _Inbox, messages: list[str]) -> None:
    """Hands a batch over: a subscribed thread's notifications to its turn stream, the rest to the
    shared inbox. Called with `inbox.cond` held."""
    subs = inbox.subs
    if not subs:
        inbox.items.extend(messages)
        return
    items = inbox.items
    for text in messages:
        thread, raw = _thread_of(text)
        to = subs.get(thread) if thread is not None else None
        if to is None:
            items.append(text)
        else:
            for sub in to:
                sub.items.append((text, raw))


class _Listener(ffi.NotificationListener):  # type: ignore[misc]
    """The native listener of an `AsyncClient`: moves batches into the inbox on the delivery thread,
    waiting while the inbox is full, unless the listener is being released."""

    def __init__(self, inbox: _Inbox) -> None:
        self.inbox = inbox
        self.released = False

    def on_notifications(self, messages: list[str]) -> None:
        inbox = self.inbox
        with inbox.cond:
            while len(inbox.items) >= _INBOX_LIMIT and not self.released:
                inbox.blocked = True
                inbox.cond.wait(_SLICE_MS / 1000)
            inbox.blocked = False
            _route(inbox, messages)
            inbox.wake()

    def on_closed(self) -> None:
        inbox = self.inbox
        with inbox.cond:
            inbox.ended = True
            inbox.wake()


class _Worker:
    """A daemon thread that runs the main thread's blocking native calls (see
    `BlockingClient._interruptible`): a queue in, a lock per call out — lighter than an executor."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Any, list[Any]] | None] = \
            queue.SimpleQueue()
        self.busy = False
        threading.Thread(target=self._run, name="cc-blocking-call", daemon=True).start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            f, args, done, box = job
            try:
                box.append((True, f(*args)))
            except BaseException as e:
                box.append((False, e))
            self.busy = False
            done.release()

    def call(self, f: Callable[..., T], args: tuple[Any, ...]) -> T:
        done = _thread.allocate_lock()
        done.acquire()
        box: list[tuple[bool, Any]] = []
        self.busy = True
        self._jobs.put((f, args, done, box))
        while not done.acquire(timeout=_SLICE_MS / 1000):
            pass
        ok, value = box[0]
        if ok:
            result: T = value
            return result
        raise value

    def retire(self) -> None:
        """Ends the thread once its current call (if any) is done."""
        self._jobs.put(None)


class _AsyncCalls:
    """Runs the async client's native calls on a few reused daemon threads and resolves each
    caller's future on its event loop: no thread per request, and the loop never blocks. A thread
    is added only when every one is busy (requests that wait long, such as an interrupt waiting
    for a kernel, do not hold up the others); idle ones end after a while."""

    _IDLE_SECONDS = 30.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...],
                                            asyncio.AbstractEventLoop, asyncio.Future[Any]]] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, loop: asyncio.AbstractEventLoop, f: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                start = False
            else:
                start = True
        self._jobs.put((f, args, loop, fut))
        if start:
            threading.Thread(target=self._run, name="cc-async-call", daemon=True).start()
        return fut

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            try:
                f, args, loop, fut = jobs.get(timeout=self._IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0 and jobs.empty():
                        self._idle -= 1
                        return
                continue
            try:
                outcome: tuple[bool, Any] = (True, f(*args))
            except BaseException as e:  # handed to the awaiting task
                outcome = (False, e)
            with self._lock:
                self._idle += 1
            try:
                loop.call_soon_threadsafe(_settle, fut, outcome)
            except RuntimeError:
                pass  # that loop is closed; nobody awaits the answer


def _settle(fut: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if fut.done():  # the awaiting task was cancelled
        return
    ok, value = outcome
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


_async_calls = _AsyncCalls()


class _BaseClient:
    _native: Any

    def __init__(self, server: _ServerLike) -> None:
        self._server = server
        self._native = None
        self._initialize: p.InitializeResult | None = None
        self._inbox = _Inbox()
        self._iterators = 0
        self._listener: _Listener | None = None
        self._handle: Any = None
        self._releasing: threading.Thread | None = None

    def _listen(self) -> None:
        """Starts the native listener unless one runs (it serves every iterator of this client)."""
        if self._listener is not None:
            return
        releasing, self._releasing = self._releasing, None
        if releasing is not None:
            releasing.join()  # the previous listener's last batch lands first, so order holds
        native = self._native
        if native is None or self._inbox.ended:
            return
        listener = _Listener(self._inbox)
        try:
            handle = native.listen(listener)
        except ffi.ClientError.Closed:
            with self._inbox.cond:
                self._inbox.ended = True
            return
        self._listener, self._handle = listener, handle

    def _stop_listener(self) -> None:
        """One iterator ended; the last one releases the native listener."""
        self._iterators -= 1
        if self._iterators > 0 or self._listener is None:
            return
        listener, handle = self._listener, self._handle
        self._listener = self._handle = None
        with self._inbox.cond:
            listener.released = True
            self._inbox.cond.notify_all()
        # Joining the delivery thread takes up to one poll interval: never on the caller's thread
        # (an event loop, or a generator being closed by the garbage collector).
        self._releasing = threading.Thread(target=handle.cancel, name="cc-release-listener", daemon=True)
        self._releasing.start()

    def _subscribe(self, thread_id: str) -> _TurnSub:
        """A turn stream's subscription to its thread (the listener runs while it lasts)."""
        sub = _TurnSub(thread_id)
        with self._inbox.cond:
            self._inbox.subs.setdefault(thread_id, []).append(sub)
        self._iterators += 1
        return sub

    def _unsubscribe(self, sub: _TurnSub) -> None:
        with self._inbox.cond:
            subs = self._inbox.subs.get(sub.thread_id)
            if subs is None or sub not in subs:
                return
            subs.remove(sub)
            if not subs:
                del self._inbox.subs[sub.thread_id]
        self._stop_listener()

    def _mark_closed(self) -> None:
        with self._inbox.cond:
            self._inbox.ended = True
            self._inbox.wake()

    #: What a call on a client without a connection is told (each kind says how to get one).
    _not_connected = "the client is closed"

    def _require(self) -> Any:
        if self._native is None:
            raise Closed(self._not_connected)
        return self._native

    @property
    def initialize_result(self) -> p.InitializeResult:
        """The server's answer to the handshake (protocol version, features, schema digest)."""
        if self._initialize is None:
            self._initialize = p.decode_InitializeResult(json.loads(self._require().initialize_result()))
        return self._initialize

    @property
    def pending_requests(self) -> int:
        """Requests now waiting for an answer."""
        return 0 if self._native is None else int(self._native.pending_requests())

    @property
    def closed(self) -> bool:
        """True once closed: by `close`, by a server shutdown, or because the server dropped it."""
        return self._native is None or bool(self._native.is_closed())


class AsyncClient(_BaseClient):
    """An initialized connection for asyncio code. Use `async with server.client(...) as client`."""

    _not_connected = "the client is not connected (use `async with server.client() as client:`) or is closed"

    def __init__(self, server: _ServerLike, approvals: ApprovalHandler | None, options: _Options) -> None:
        super().__init__(server)
        self._approvals = approvals
        self._options = options

    async def connect(self) -> AsyncClient:
        """Connects and performs the `initialize` handshake (done for you by `async with`)."""
        if self._native is not None:
            return self
        loop = asyncio.get_running_loop()
        handler = NativeApprovals(self._approvals, self._options.approval_deadline, loop)
        self._native = await loop.run_in_executor(None, _connect, self._server, handler, self._options)
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Closes now: requests in flight end with `Closed`, iterators end with `Closed` once they
        have yielded what had already arrived. Idempotent."""
        native, self._native = self._native, None
        if native is not None:
            native.close()
        self._mark_closed()

    # -- requests --------------------------------------------------------------------------------

    async def _call(self, method: str, params: p.Json) -> str:
        native = self._require()
        try:
            text: str = await _async_calls.submit(asyncio.get_running_loop(), native.request_blocking, method,
                                                  _dump(params))
            return text
        except ffi.ClientError as e:
            raise from_client_error(e, ffi) from None

    async def request(self, method: str, params: JsonObject | None = None) -> JsonObject:
        """Any request by wire method name, params and result as JSON objects (the escape hatch;
        prefer the typed methods)."""
        return _object(await self._call(method, params or {}), method)

    async def thread_start(self, *, title: str | None = None, thread_id: str | None = None,
                           metadata: JsonObject | None = None, agent_options: p.AgentOptions | None = None,
                           idempotency_key: str | None = None,
                           traceparent: str | None = None) -> p.ThreadStartResult:
        """`thread/start`: a new thread (your `thread_id`, or one the server picks). `traceparent`:
        a W3C trace context its header is recorded under (docs/rollout-format.md)."""
        params = _params.thread_start(title, thread_id, metadata, agent_options, idempotency_key, traceparent)
        return p.decode_ThreadStartResult(json.loads(await self._call("thread/start", params)))

    async def thread_read(self, thread_id: str, *, after_event_seq: int | None = None,
                          limit: int | None = None) -> p.ThreadReadResult:
        """`thread/read`: the thread and its rollout events after a cursor, a bounded page
        (`thread.revision` is the seq of its last durable event: the cursor to read on from)."""
        params = _params.thread_read(thread_id, after_event_seq, limit)
        return p.decode_ThreadReadResult(json.loads(await self._call("thread/read", params)))

    async def thread_resume(self, thread_id: str, *, after_event_seq: int | None = None,
                            limit: int | None = None) -> p.ThreadResumeResult:
        """`thread/resume`: events after a cursor plus the active turn, if any."""
        params = _params.thread_resume(thread_id, after_event_seq, limit)
        return p.decode_ThreadResumeResult(json.loads(await self._call("thread/resume", params)))

    async def thread_fork(self, thread_id: str, *, new_thread_id: str | None = None, at_event_seq: int | None = None,
                          title: str | None = None, idempotency_key: str | None = None) -> p.ThreadForkResult:
        """`thread/fork`: a new, independent thread from this one's history (`forked_from`, beside
        `thread`, says where it came from; `thread.parent_thread_id` names the source thread)."""
        params = _params.thread_fork(thread_id, new_thread_id, at_event_seq, title, idempotency_key)
        return p.decode_ThreadForkResult(json.loads(await self._call("thread/fork", params)))

    async def thread_list(self, *, include_archived: bool | None = None, cursor: str | None = None,
                          limit: int | None = None) -> p.ThreadListResult:
        """`thread/list`: a page of threads (archived ones only when asked)."""
        params = _params.thread_list(include_archived, cursor, limit)
        return p.decode_ThreadListResult(json.loads(await self._call("thread/list", params)))

    async def thread_archive(self, thread_id: str) -> p.ThreadArchiveResult:
        """`thread/archive` (refused with -32009 while a turn is active): the thread, now with
        `status == "archived"`."""
        params = _params.thread_archive(thread_id)
        return p.decode_ThreadArchiveResult(json.loads(await self._call("thread/archive", params)))

    async def thread_compact(self, thread_id: str, *, summary: str | None = None) -> p.ThreadCompactResult:
        """`thread/compact`: later turns see `summary` instead of the history before it (every
        event stays in the rollout). Without `summary` the server's kernel writes it (the
        OpenAI-compatible one can; others answer -32602)."""
        params = _params.thread_compact(thread_id, summary)
        return p.decode_ThreadCompactResult(json.loads(await self._call("thread/compact", params)))

    async def graph_validate(self, definition: p.GraphDefinition | JsonObject, *,
                             grant: p.GraphRunGrant | None = None) -> p.GraphValidateResult:
        """`graph/validate`: compiles a graph without running it; `errors` name each rule broken,
        with a JSON pointer (docs/graph.md)."""
        params = _params.graph_validate(definition, grant)
        return p.decode_GraphValidateResult(json.loads(await self._call("graph/validate", params)))

    async def graph_run_start(self, definition: p.GraphDefinition | JsonObject, *, run_id: str | None = None,
                              inputs: JsonObject | None = None, grant: p.GraphRunGrant | None = None,
                              options: p.GraphRunOptions | None = None,
                              idempotency_key: str | None = None) -> p.GraphRunStartResult:
        """`graph/run/start`: compiles and starts a durable run; it reports through `graph/event`
        notifications (`GraphEventNotification`, params `GraphNodeUpdatedParams` or
        `GraphRunUpdatedParams` by `type`)."""
        params = _params.graph_run_start(definition, run_id, inputs, grant, options, idempotency_key)
        return p.decode_GraphRunStartResult(json.loads(await self._call("graph/run/start", params)))

    async def graph_run_read(self, run_id: str, *, include_content: bool | None = None,
                             after_event_seq: int | None = None, limit: int | None = None) -> p.GraphRunReadResult:
        """`graph/run/read`: the run's state (content hidden unless `include_content`)."""
        params = _params.graph_run_read(run_id, include_content, after_event_seq, limit)
        return p.decode_GraphRunReadResult(json.loads(await self._call("graph/run/read", params)))

    async def graph_run_cancel(self, run_id: str, *, reason: str | None = None) -> p.GraphRunCancelResult:
        """`graph/run/cancel`: fences every outstanding attempt; a late result cannot cross it."""
        params = _params.graph_run_cancel(run_id, reason)
        return p.decode_GraphRunCancelResult(json.loads(await self._call("graph/run/cancel", params)))

    async def turn_start(self, thread_id: str, input: str | Sequence[p.UserInput], *,
                         idempotency_key: str | None = None, traceparent: str | None = None) -> p.TurnStartResult:
        """`turn/start`: returns at once; the turn runs and reports through notifications.
        `traceparent`: a W3C trace context (`00-<trace id>-<span id>-<flags>`) every event of the
        turn is recorded under, its first naming your span (else the turn starts its own trace)."""
        params = _params.turn_start(thread_id, input, idempotency_key, traceparent)
        return p.decode_TurnStartResult(json.loads(await self._call("turn/start", params)))

    async def turn_interrupt(self, thread_id: str, turn_id: str) -> p.TurnInterruptResult:
        """`turn/interrupt`: answers once the kernel has physically stopped (else -32010); `error`,
        beside `turn`, says why it ended when it did not complete."""
        params = _params.turn_interrupt(thread_id, turn_id)
        return p.decode_TurnInterruptResult(json.loads(await self._call("turn/interrupt", params)))

    async def turn(self, thread_id: str, input: str | Sequence[p.UserInput], *, idempotency_key: str | None = None,
                   timeout: float | None = None, traceparent: str | None = None) -> TurnStream:
        """Starts a turn and returns its stream: subscribed before `turn/start` is sent, so nothing
        of the turn is missed; see `TurnStream` (`await stream.text()`, `await
        stream.completion()`). While the stream lasts, its thread's notifications go to it, not to
        `notifications()`. `timeout`: most seconds to wait for each next notification."""
        sub = self._subscribe(thread_id)
        try:
            await self._start_listener()
            started = await self.turn_start(thread_id, input, idempotency_key=idempotency_key,
                                            traceparent=traceparent)
        except BaseException:
            self._unsubscribe(sub)
            raise
        return TurnStream(self, sub, started.turn, timeout)

    # -- notifications ---------------------------------------------------------------------------

    async def notifications(self, *, timeout: float | None = None) -> AsyncIterator[p.ServerNotification]:
        """Every server notification, decoded into the generated classes (unknown methods arrive
        as `UnknownCase`). `timeout`: most seconds to wait for the next one, else `Timeout`. Ends
        with `Closed` once the client or the server is closed and everything before it was yielded.
        Cancelling the iterating task (or leaving the loop) releases the native listener; what had
        arrived but was not yielded waits for the next iteration."""
        items = self._inbox.items
        self._iterators += 1
        try:
            await self._start_listener()
            while True:
                text = items.popleft() if items else None
                if text is None:
                    await self._wait(timeout)
                    continue
                if self._inbox.blocked and len(items) < _INBOX_LIMIT // 2:
                    self._inbox.unblock()
                yield _decode_notification(text)
        finally:
            self._stop_listener()

    async def raw_notifications(self, *, timeout: float | None = None) -> AsyncIterator[str]:
        """`notifications`, undecoded: each a whole JSON-RPC message as text (for relays, and for
        consumers that decode only the methods they need)."""
        items = self._inbox.items
        self._iterators += 1
        try:
            await self._start_listener()
            while True:
                text = items.popleft() if items else None
                if text is None:
                    await self._wait(timeout)
                    continue
                if self._inbox.blocked and len(items) < _INBOX_LIMIT // 2:
                    self._inbox.unblock()
                yield text
        finally:
            self._stop_listener()

    async def _wait(self, timeout: float | None, items: deque[Any] | None = None) -> None:
        """Waits until the inbox (or `items`, a turn stream's) has something; `Closed` once it
        never will, `Timeout` after `timeout` seconds."""
        inbox = self._inbox
        watched = inbox.items if items is None else items
        loop = asyncio.get_running_loop()
        with inbox.cond:
            if watched:
                return
            if inbox.ended:
                raise Closed("the client is closed (by close(), a server shutdown, or a connection the "
                             "server dropped); open a new client to go on")
            fut: asyncio.Future[None] = loop.create_future()
            inbox.waiters.append((loop, fut))
            inbox.cond.notify_all()
        try:
            if timeout is None:
                await fut
            else:
                await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"no notification within {timeout} s") from None
        finally:
            with inbox.cond:
                inbox.waiters = [w for w in inbox.waiters if w[1] is not fut]

    async def _start_listener(self) -> None:
        releasing = self._releasing
        if self._listener is None and releasing is not None:
            # The previous listener may still be handing over its last batch: wait off the loop.
            await asyncio.get_running_loop().run_in_executor(None, releasing.join)
        self._listen()


class BlockingClient(_BaseClient):
    """An initialized connection for plain (non-async) code. Every wait can be interrupted with
    Ctrl-C within about 50 ms. Use `with server.blocking_client(...) as client`."""

    # Connected from the start, so only ever closed.
    _not_connected = ("the client is closed (by close(), the end of its `with` block or a server shutdown); "
                      "open another with `server.blocking_client()`")

    def __init__(self, server: _ServerLike, approvals: ApprovalHandler | None, options: _Options) -> None:
        super().__init__(server)
        handler = NativeApprovals(approvals, options.approval_deadline, None)
        self._native = _connect(server, handler, options)
        self._worker: _Worker | None = None

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Closes now: requests in flight end with `Closed`. Idempotent."""
        native, self._native = self._native, None
        if native is not None:
            native.close()
        self._mark_closed()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.retire()

    def _interruptible(self, f: Callable[..., T], *args: Any) -> T:
        """Runs a blocking native call so that Ctrl-C still gets through: Python only raises
        KeyboardInterrupt between bytecodes of the main thread, so there the call runs on a worker
        thread and the main thread waits on a lock in short slices. (Other threads never see
        Ctrl-C: they call directly.) An interrupted request still finishes in the background; its
        answer is dropped and the next call gets a fresh worker."""
        if threading.current_thread() is not threading.main_thread():
            return f(*args)
        worker = self._worker
        if worker is None:
            worker = self._worker = _Worker()
        try:
            return worker.call(f, args)
        except BaseException:
            if worker.busy:  # interrupted while the call runs: leave it that worker, then retire it
                worker.retire()
                self._worker = None
            raise

    def _call(self, method: str, params: p.Json) -> str:
        native = self._require()
        try:
            text: str = self._interruptible(native.request_blocking, method, _dump(params))
            return text
        except ffi.ClientError as e:
            raise from_client_error(e, ffi) from None

    def request(self, method: str, params: JsonObject | None = None) -> JsonObject:
        """Any request by wire method name, params and result as JSON objects (the escape hatch)."""
        return _object(self._call(method, params or {}), method)

    def thread_start(self, *, title: str | None = None, thread_id: str | None = None,
                     metadata: JsonObject | None = None, agent_options: p.AgentOptions | None = None,
                     idempotency_key: str | None = None, traceparent: str | None = None) -> p.ThreadStartResult:
        params = _params.thread_start(title, thread_id, metadata, agent_options, idempotency_key, traceparent)
        return p.decode_ThreadStartResult(json.loads(self._call("thread/start", params)))

    def thread_read(self, thread_id: str, *, after_event_seq: int | None = None,
                    limit: int | None = None) -> p.ThreadReadResult:
        params = _params.thread_read(thread_id, after_event_seq, limit)
        return p.decode_ThreadReadResult(json.loads(self._call("thread/read", params)))

    def thread_resume(self, thread_id: str, *, after_event_seq: int | None = None,
                      limit: int | None = None) -> p.ThreadResumeResult:
        params = _params.thread_resume(thread_id, after_event_seq, limit)
        return p.decode_ThreadResumeResult(json.loads(self._call("thread/resume", params)))

    def thread_fork(self, thread_id: str, *, new_thread_id: str | None = None, at_event_seq: int | None = None,
                    title: str | None = None, idempotency_key: str | None = None) -> p.ThreadForkResult:
        params = _params.thread_fork(thread_id, new_thread_id, at_event_seq, title, idempotency_key)
        return p.decode_ThreadForkResult(json.loads(self._call("thread/fork", params)))

    def thread_list(self, *, include_archived: bool | None = None, cursor: str | None = None,
                    limit: int | None = None) -> p.ThreadListResult:
        params = _params.thread_list(include_archived, cursor, limit)
        return p.decode_ThreadListResult(json.loads(self._call("thread/list", params)))

    def thread_archive(self, thread_id: str) -> p.ThreadArchiveResult:
        params = _params.thread_archive(thread_id)
        return p.decode_ThreadArchiveResult(json.loads(self._call("thread/archive", params)))

    def thread_compact(self, thread_id: str, *, summary: str | None = None) -> p.ThreadCompactResult:
        params = _params.thread_compact(thread_id, summary)
        return p.decode_ThreadCompactResult(json.loads(self._call("thread/compact", params)))

    def graph_validate(self, definition: p.GraphDefinition | JsonObject, *,
                       grant: p.GraphRunGrant | None = None) -> p.GraphValidateResult:
        params = _params.graph_validate(definition, grant)
        return p.decode_GraphValidateResult(json.loads(self._call("graph/validate", params)))

    def graph_run_start(self, definition: p.GraphDefinition | JsonObject, *, run_id: str | None = None,
                        inputs: JsonObject | None = None, grant: p.GraphRunGrant | None = None,
                        options: p.GraphRunOptions | None = None,
                        idempotency_key: str | None = None) -> p.GraphRunStartResult:
        params = _params.graph_run_start(definition, run_id, inputs, grant, options, idempotency_key)
        return p.decode_GraphRunStartResult(json.loads(self._call("graph/run/start", params)))

    def graph_run_read(self, run_id: str, *, include_content: bool | None = None,
                       after_event_seq: int | None = None, limit: int | None = None) -> p.GraphRunReadResult:
        params = _params.graph_run_read(run_id, include_content, after_event_seq, limit)
        return p.decode_GraphRunReadResult(json.loads(self._call("graph/run/read", params)))

    def graph_run_cancel(self, run_id: str, *, reason: str | None = None) -> p.GraphRunCancelResult:
        params = _params.graph_run_cancel(run_id, reason)
        return p.decode_GraphRunCancelResult(json.loads(self._call("graph/run/cancel", params)))

    def turn_start(self, thread_id: str, input: str | Sequence[p.UserInput], *,
                   idempotency_key: str | None = None, traceparent: str | None = None) -> p.TurnStartResult:
        params = _params.turn_start(thread_id, input, idempotency_key, traceparent)
        return p.decode_TurnStartResult(json.loads(self._call("turn/start", params)))

    def turn_interrupt(self, thread_id: str, turn_id: str) -> p.TurnInterruptResult:
        params = _params.turn_interrupt(thread_id, turn_id)
        return p.decode_TurnInterruptResult(json.loads(self._call("turn/interrupt", params)))

    def turn(self, thread_id: str, input: str | Sequence[p.UserInput], *, idempotency_key: str | None = None,
             timeout: float | None = None, traceparent: str | None = None) -> BlockingTurnStream:
        """Starts a turn and returns its stream (see `AsyncClient.turn`): `for note in stream`,
        `stream.text()`, `stream.completion()`."""
        sub = self._subscribe(thread_id)
        try:
            self._listen()
            started = self.turn_start(thread_id, input, idempotency_key=idempotency_key, traceparent=traceparent)
        except BaseException:
            self._unsubscribe(sub)
            raise
        return BlockingTurnStream(self, sub, started.turn, timeout)

    def notifications(self, *, timeout: float | None = None) -> Iterator[p.ServerNotification]:
        """Every server notification, decoded (see `AsyncClient.notifications`). `timeout`: most
        seconds to wait for the next one, else `Timeout`; `Closed` once the client or the server is
        closed and everything before it was yielded. Ctrl-C interrupts the wait."""
        for text in self.raw_notifications(timeout=timeout):
            yield _decode_notification(text)

    def raw_notifications(self, *, timeout: float | None = None) -> Iterator[str]:
        """`notifications`, undecoded: each a whole JSON-RPC message as text."""
        items = self._inbox.items
        self._iterators += 1
        try:
            self._listen()
            while True:
                text = items.popleft() if items else None
                if text is None:
                    self._wait(timeout)
                    continue
                if self._inbox.blocked and len(items) < _INBOX_LIMIT // 2:
                    self._inbox.unblock()
                yield text
        finally:
            self._stop_listener()

    def _wait(self, timeout: float | None, items: deque[Any] | None = None) -> None:
        """Waits (in slices, so Ctrl-C gets through) until the inbox (or `items`, a turn
        stream's) has something."""
        inbox = self._inbox
        watched = inbox.items if items is None else items
        deadline = None if timeout is None else time.monotonic() + timeout
        with inbox.cond:
            while not watched:
                if inbox.ended:
                    raise Closed("the client is closed (by close(), a server shutdown, or a connection the "
                                 "server dropped); open a new client to go on")
                wait = _SLICE_MS / 1000
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise Timeout(f"no notification within {timeout} s")
                    wait = min(wait, left)
                inbox.cond.notify_all()  # a delivery thread waiting for room
                inbox.cond.wait(wait)


class _TurnState:
    """What the two turn streams share: the filter, the assistant's text, the completion."""

    def __init__(self, client: _BaseClient, sub: _TurnSub, turn: p.Turn, timeout: float | None) -> None:
        self.turn = turn
        self._client = client
        self._sub = sub
        self._timeout = timeout
        self._texts: list[str] = []
        self._completed: p.TurnCompletedParams | None = None
        self._ended = False

    def _take(self) -> p.ServerNotification | None:
        """The next notification of this turn already received, or None (skipping others)."""
        items = self._sub.items
        while items:
            text, raw = items.popleft()
            note = _decode_notification(text) if raw is None else _decode_value(raw)
            if _turn_of(note) != self.turn.id:
                continue  # another turn of the thread, or a thread-level notification
            if isinstance(note, p.ItemCompletedNotification):
                item = note.params.item.content
                if isinstance(item, p.AgentMessageItem):
                    self._texts.append(item.text)
            elif isinstance(note, p.TurnCompletedNotification):
                self._completed = note.params
                self._end()
            return note
        return None

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._client._unsubscribe(self._sub)

    def _result_text(self) -> str:
        done = self._completed
        assert done is not None
        if done.turn.status == "failed":
            error = done.error
            raise KernelFailed(error.code if error else "failed", error.message if error else "the turn failed",
                               done.turn.id)
        if done.turn.status == "interrupted":
            raise TurnInterrupted(done.turn.id)
        return "\n".join(self._texts)

    def _not_completed(self) -> Closed:
        return Closed(f"the client closed before turn {self.turn.id} completed")

    def close(self) -> None:
        """Stops following the turn (the turn itself goes on). Idempotent; done for you when the
        stream ends."""
        self._end()

    def __del__(self) -> None:
        try:
            self._end()
        except Exception:
            pass


class TurnStream(_TurnState):
    """One turn's notifications (`AsyncClient.turn`): `async for note in stream` yields only this
    turn's (same thread and turn id) and ends after its `turn/completed`, inclusive. `turn` is the
    `Turn` that `turn/start` returned. Approvals are answered by the client's handler meanwhile."""

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> p.ServerNotification:
        client = self._client
        assert isinstance(client, AsyncClient)
        while True:
            if self._completed is not None:
                raise StopAsyncIteration
            note = self._take()
            if note is not None:
                return note
            try:
                await client._wait(self._timeout, self._sub.items)
            except Closed:
                self._end()
                raise self._not_completed() from None

    async def completion(self) -> p.TurnCompletedParams:
        """Reads the turn to its end and returns the `turn/completed` params (whatever the
        status)."""
        async for _ in self:
            pass
        if self._completed is None:
            raise self._not_completed()
        return self._completed

    async def text(self) -> str:
        """Reads the turn to its end and returns the assistant's text: the `text` of its
        `agentMessage` items, in order, joined with "\\n". A failed turn raises `KernelFailed`, an
        interrupted one `TurnInterrupted`."""
        await self.completion()
        return self._result_text()


class BlockingTurnStream(_TurnState):
    """`TurnStream` for the blocking client: `for note in stream`, `.text()`, `.completion()`.
    Ctrl-C interrupts its waits."""

    def __iter__(self) -> BlockingTurnStream:
        return self

    def __next__(self) -> p.ServerNotification:
        client = self._client
        assert isinstance(client, BlockingClient)
        while True:
            if self._completed is not None:
                raise StopIteration
            note = self._take()
            if note is not None:
                return note
            try:
                client._wait(self._timeout, self._sub.items)
            except Closed:
                self._end()
                raise self._not_completed() from None

    def completion(self) -> p.TurnCompletedParams:
        """Reads the turn to its end and returns the `turn/completed` params."""
        for _ in self:
            pass
        if self._completed is None:
            raise self._not_completed()
        return self._completed

    def text(self) -> str:
        """Reads the turn to its end and returns the assistant's text (see `TurnStream.text`)."""
        self.completion()
        return self._result_text()
