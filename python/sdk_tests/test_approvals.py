"""Approvals: every decision (as a generated class and as its wire `kind`, from sync and async
handlers), and every fail-closed case with its diagnostic on logger `cc_app_server` and its reason
in the denied tool result."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import cc_app_server as cc
from cc_app_server import protocol as p
from conftest import TOOL_SCRIPT

# (decision, outcome recorded, decision recorded, tool ran, turn status)
DECISIONS: list[tuple[cc.Decision, str, str, bool, str]] = [
    (p.AcceptOnce(), "approved", "acceptOnce", True, "completed"),
    ("acceptOnce", "approved", "acceptOnce", True, "completed"),
    (p.AcceptForTurn(), "approved", "acceptForTurn", True, "completed"),
    ("acceptForTurn", "approved", "acceptForTurn", True, "completed"),
    (p.AcceptForSession(), "approved", "acceptForSession", True, "completed"),
    ("acceptForSession", "approved", "acceptForSession", True, "completed"),
    (p.Decline(reason="not today"), "declined", "decline", False, "completed"),
    ("decline", "declined", "decline", False, "completed"),
    (p.Cancel(), "cancelled", "cancel", False, "interrupted"),
    ("cancel", "cancelled", "cancel", False, "interrupted"),
]


async def run_tool_turn(client: cc.AsyncClient, thread_id: str) -> tuple[p.ApprovalResolvedParams, p.Turn]:
    resolved, turn, _ = await run_tool_turn_with_result(client, thread_id)
    return resolved, turn


async def run_tool_turn_with_result(client: cc.AsyncClient, thread_id: str) -> tuple[
        p.ApprovalResolvedParams, p.Turn, p.ToolResult | None]:
    await client.thread_start(thread_id=thread_id, agent_options=p.AgentOptions(script=TOOL_SCRIPT))
    await client.turn_start(thread_id, "go")
    resolved = None
    result: p.ToolResult | None = None
    async for note in client.notifications(timeout=20):
        if isinstance(note, p.ApprovalResolvedNotification):
            resolved = note.params
        if isinstance(note, p.ToolResultNotification):
            result = note.params.result
        if isinstance(note, p.TurnCompletedNotification):
            assert resolved is not None
            return resolved, note.params.turn, result
    raise AssertionError("unreachable")


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("decision,outcome,recorded,ran,status", DECISIONS,
                         ids=[f"{type(d[0]).__name__}-{d[2]}" for d in DECISIONS])
def test_every_decision(server: cc.AppServer, decision: cc.Decision, outcome: str, recorded: str, ran: bool,
                        status: str, is_async: bool) -> None:
    seen: list[p.ApprovalRequest] = []

    def decide(request: p.ApprovalRequest) -> cc.Decision:
        seen.append(request)
        return decision

    async def adecide(request: p.ApprovalRequest) -> cc.Decision:
        await asyncio.sleep(0)
        return decide(request)

    async def main() -> None:
        async with server.client(approvals=adecide if is_async else decide) as client:
            resolved, turn, result = await run_tool_turn_with_result(client, "d")
            assert resolved.outcome == outcome
            if recorded == "decline":
                # A user's reason reaches the kernel in the denied tool result.
                assert isinstance(result, p.ToolResultDenied), result
                assert result.reason == ("approval declined: not today" if isinstance(decision, p.Decline)
                                         else "the user declined"), result.reason
            assert isinstance(resolved.decision, (p.AcceptOnce, p.AcceptForTurn, p.AcceptForSession, p.Decline,
                                                  p.Cancel))
            assert p.encode_ApprovalDecision(resolved.decision)["kind"] == recorded  # type: ignore[index,call-overload]
            assert turn.status == status
            assert turn.completed_at is not None and turn.terminal_evidence is not None
            assert turn.terminal_evidence.status == ("succeeded" if status == "completed" else "cancelled")

    asyncio.run(main())
    [request] = seen
    assert request.operation.tool == "fs.write" and request.operation.arguments == {"path": "a.txt", "text": "x"}
    assert request.binding.thread_id == "d" and request.binding.nonce
    # The published ApprovalRequest: its id names the binding's nonce, and it says how risky and why.
    assert request.id == "approval-" + request.binding.nonce
    assert request.risk in ("low", "medium", "high", "critical") and request.reason
    assert server.stats().tools_executed == (1 if ran else 0)


def test_blocking_client_with_async_handler(server: cc.AppServer) -> None:
    async def decide(request: p.ApprovalRequest) -> cc.Decision:
        await asyncio.sleep(0.01)
        return p.AcceptOnce()

    with server.blocking_client(approvals=decide) as client:
        client.thread_start(thread_id="ba", agent_options=p.AgentOptions(script=TOOL_SCRIPT))
        client.turn_start("ba", "go")
        for note in client.notifications(timeout=20):
            if isinstance(note, p.ApprovalResolvedNotification):
                assert note.params.outcome == "approved"
            if isinstance(note, p.TurnCompletedNotification):
                break
    assert server.stats().tools_executed == 1


def raising(request: p.ApprovalRequest) -> cc.Decision:
    raise RuntimeError("handler bug")


def wrong_type(request: p.ApprovalRequest) -> Any:
    return 42


def wrong_string(request: p.ApprovalRequest) -> Any:
    return "yes please"


async def async_raising(request: p.ApprovalRequest) -> cc.Decision:
    raise ValueError("async handler bug")


def slow(request: p.ApprovalRequest) -> cc.Decision:
    time.sleep(0.8)
    return "acceptOnce"


async def async_slow(request: p.ApprovalRequest) -> cc.Decision:
    await asyncio.sleep(5)
    return "acceptOnce"


# (name, handler, diagnostic logged, what the denied tool result's reason says; None: either the
# client's deadline or the handler's own, whichever comes first)
FAIL_CLOSED: list[tuple[str, Any, str, str | None]] = [
    ("no-handler", None, "no approval handler", "no approval handler is configured on this client"),
    ("raising", raising, "approval handler raised", "the approval handler failed"),
    ("async-raising", async_raising, "approval handler raised", "the approval handler failed"),
    ("wrong-type", wrong_type, "returned 42 (int)", "it returned 42 (int), not a decision"),
    ("wrong-string", wrong_string, "returned 'yes please' (str)", "it returned 'yes please' (str), not a decision"),
    ("slow", slow, "past the 0.3 s deadline", "the approval handler did not answer in time"),
    ("async-slow", async_slow, "within the 0.3 s deadline", None),
]


@pytest.mark.parametrize("name,handler,diagnostic,reason", FAIL_CLOSED, ids=[c[0] for c in FAIL_CLOSED])
def test_fail_closed_with_a_diagnostic(server: cc.AppServer, caplog: pytest.LogCaptureFixture, name: str,
                                       handler: Any, diagnostic: str, reason: str | None) -> None:
    caplog.set_level(logging.WARNING, logger="cc_app_server")

    async def main() -> None:
        async with server.client(approvals=handler, approval_timeout=0.3) as client:
            resolved, turn, result = await run_tool_turn_with_result(client, "f")
            assert resolved.outcome == "declined", resolved
            assert turn.status == "completed"
            # The decline says why, and the denied tool result carries it.
            assert isinstance(result, p.ToolResultDenied), result
            assert result.reason.startswith("approval declined: "), result.reason
            if reason is not None:
                assert reason in result.reason, result.reason
            if name == "raising":
                assert "RuntimeError: handler bug" in result.reason, result.reason

    asyncio.run(main())
    assert server.stats().tools_executed == 0
    deadline = time.monotonic() + 5  # a slow sync handler is diagnosed when it finally returns
    while time.monotonic() < deadline:
        messages = [r.getMessage() for r in caplog.records if r.name == "cc_app_server"]
        if any(diagnostic in m for m in messages):
            break
        time.sleep(0.05)
    assert any(diagnostic in m and "fs.write" in m for m in messages), messages
    assert all("declined" in m for m in messages if "approval" in m), messages


def test_engine_logs_reach_python_logging(server: cc.AppServer, caplog: pytest.LogCaptureFixture) -> None:
    # The engine's own warning about the failed handler comes through the native log bridge.
    caplog.set_level(logging.WARNING, logger="cc_app_server")

    async def main() -> None:
        async with server.client(approvals=raising) as client:
            await run_tool_turn(client, "logs")

    asyncio.run(main())
    deadline = time.monotonic() + 5
    engine: list[logging.LogRecord] = []
    while time.monotonic() < deadline and not engine:
        engine = [r for r in caplog.records if r.name.startswith("cc_app_server.engine")]
        time.sleep(0.05)
    assert engine, [r.name for r in caplog.records]
    assert any("declining" in r.getMessage() for r in engine), [r.getMessage() for r in engine]
    assert all(r.levelno >= logging.WARNING for r in engine)
