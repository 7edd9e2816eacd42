"""Approval handlers: a plain or `async def` callable gets the typed `approval/decide` params (the
published `ApprovalRequest`: id, binding, operation, risk, reason) and returns a decision (a
generated decision class, or its wire `kind`). The native client answers the server with the bare
decision. Everything else fails closed — no handler, an exception, a wrong return value, an answer
past the deadline — and says why twice: on logger `cc_app_server`, and in the decline's reason,
which the denied tool result carries ("approval declined: <why>"), so a declined tool is never a
mystery.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Union

from . import protocol as p
from ._logging import log
from ._native import ffi

DecisionName = Literal["acceptOnce", "acceptForTurn", "acceptForSession", "decline", "cancel"]
Decision = Union[p.ApprovalDecision, DecisionName]
ApprovalHandler = Callable[[p.ApprovalRequest], Union[Decision, Awaitable[Decision]]]

# The decline reason when a client has no handler: the Rust client's own words for the same case.
NO_HANDLER = "no approval handler is configured on this client"
# The engine's bound for a handler's failure text in a decline reason.
_MAX_REASON = 1024


def to_native(decision: object) -> Any:
    """The native decision for `decision`, or `None` when it is not one."""
    D = ffi.ApprovalDecision
    if isinstance(decision, str):
        decision = {"acceptOnce": p.AcceptOnce(), "acceptForTurn": p.AcceptForTurn(),
                    "acceptForSession": p.AcceptForSession(), "decline": p.Decline(),
                    "cancel": p.Cancel()}.get(decision)
    if isinstance(decision, p.AcceptOnce):
        return D.ACCEPT_ONCE()
    if isinstance(decision, p.AcceptForTurn):
        return D.ACCEPT_FOR_TURN()
    if isinstance(decision, p.AcceptForSession):
        return D.ACCEPT_FOR_SESSION()
    if isinstance(decision, p.Decline):
        reason = decision.reason if isinstance(decision.reason, str) else None
        return D.DECLINE(reason=reason)
    if isinstance(decision, p.Cancel):
        return D.CANCEL()
    return None


def _describe(request: p.ApprovalRequest) -> str:
    b = request.binding
    return (f"{request.operation.tool!r} (risk {request.risk}, thread {b.thread_id}, turn {b.turn_id}, "
            f"item {b.item_id})")


def _failed(why: str) -> Any:
    """The native error that makes the client decline with `why` as the reason."""
    return ffi.HandlerError.Failed(reason=why[:_MAX_REASON])


class NativeApprovals(ffi.ApprovalHandler):  # type: ignore[misc]
    """Adapts a Python handler (or none) to the native one. `loop` runs `async def` handlers (the
    async client's event loop); without one they run on a private loop in the calling thread."""

    def __init__(self, handler: ApprovalHandler | None, deadline: float,
                 loop: asyncio.AbstractEventLoop | None) -> None:
        self._handler = handler
        self._deadline = deadline
        self._loop = loop

    def decide(self, native_request: Any) -> Any:
        try:
            request = p.decode_ApprovalRequest(json.loads(native_request.params_json))
        except (ValueError, p.DecodeError) as e:
            log.error("approval request could not be decoded (%s); declining", e)
            raise _failed(f"the approval request could not be decoded: {e}") from None
        what = _describe(request)
        if self._handler is None:
            log.warning("approval requested for %s but this client has no approval handler; declined "
                        "(pass approvals=... to server.client())", what)
            return ffi.ApprovalDecision.DECLINE(reason=NO_HANDLER)
        started = time.monotonic()
        try:
            decision = self._run(request)
        except (concurrent.futures.TimeoutError, asyncio.TimeoutError, concurrent.futures.CancelledError):
            # Cancelled: the client's event loop stopped waiting (it is closing, after the native
            # client already declined at the deadline, which runs from before this thread started).
            log.warning("approval handler did not answer %s within the %.3g s deadline; declined", what,
                        self._deadline)
            raise _failed(f"it did not answer within the {self._deadline:.3g} s deadline") from None
        except Exception as e:
            log.error("approval handler raised for %s; declined: %s: %s", what, type(e).__name__, e,
                      exc_info=True)
            raise _failed(f"it raised {type(e).__name__}: {e}") from None
        elapsed = time.monotonic() - started
        if elapsed > self._deadline:
            log.warning("approval handler answered %s after %.3g s, past the %.3g s deadline; the request "
                        "was already declined", what, elapsed, self._deadline)
            raise _failed(f"it answered after {elapsed:.3g} s, past the {self._deadline:.3g} s deadline")
        native = to_native(decision)
        if native is None:
            log.error("approval handler returned %r (%s) for %s; expected a decision class from "
                      "cc_app_server.protocol (AcceptOnce(), Decline(), ...) or one of 'acceptOnce', "
                      "'acceptForTurn', 'acceptForSession', 'decline', 'cancel'; declined",
                      decision, type(decision).__name__, what)
            raise _failed(f"it returned {decision!r} ({type(decision).__name__}), not a decision")
        return native

    def _run(self, request: p.ApprovalRequest) -> object:
        handler = self._handler
        assert handler is not None
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
            coro = handler(request)
            assert inspect.isawaitable(coro)
            return self._await(coro)
        result = handler(request)
        if inspect.isawaitable(result):
            return self._await(result)
        return result

    def _await(self, awaitable: Awaitable[Decision]) -> object:
        async def run() -> object:
            return await awaitable

        loop = self._loop
        if loop is not None and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(run(), loop)
            try:
                return future.result(timeout=self._deadline)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise
        # A blocking client: run the coroutine on a private loop in this (native) thread, with the
        # same deadline.
        return asyncio.run(asyncio.wait_for(run(), self._deadline))


