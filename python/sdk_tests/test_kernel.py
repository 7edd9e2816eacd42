"""Python-implemented kernels and tools on the real engine: items, deltas, a tool through the
approval gate, and exceptions turned into a failed turn / a failed tool result with the message."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

import cc_app_server as cc
from cc_app_server import protocol as p
from cc_app_server.protocol import Json, JsonObject


class Calculator(cc.Kernel):
    """Asks for the `add` tool, then says the sum; fails or stops on request."""

    def __init__(self) -> None:
        self.contexts: list[cc.TurnContext] = []

    def run_turn(self, ctx: cc.TurnContext, input: cc.TurnInput) -> None:
        self.contexts.append(ctx)
        if input.text == "fail":
            raise ValueError("the calculator is out of batteries")
        if input.text == "wait":
            while not ctx.sleep(0.02):  # True once the turn is cancelled
                pass
            raise cc.TurnCancelled("stopped on request")
        assert ctx.agent_options == {"mode": "calc"}
        assert input.inputs == [p.TextInput(text=input.text)]
        item_id = ctx.new_item_id()
        call = p.ToolCall(tool="add", arguments={"a": 2, "b": 3})
        ctx.item_started(p.ToolCallItem(id=item_id, call=call, status="inProgress", result=None))
        result = ctx.request_tool(item_id, "add", {"a": 2, "b": 3})
        status: p.ItemStatus = "completed" if isinstance(result, p.ToolResultOk) else "failed"
        ctx.item_completed(p.ToolCallItem(id=item_id, call=call, status=status, result=result))
        answer = f"{input.text}: {result.output['sum'] if isinstance(result, p.ToolResultOk) else result}"  # type: ignore[index,call-overload]
        ctx.say(answer, chunks=[answer[:3], answer[3:]])


def add(arguments: JsonObject) -> Json:
    a, b = arguments["a"], arguments["b"]
    assert isinstance(a, int) and isinstance(b, int)
    return {"sum": a + b}


def broken(arguments: JsonObject) -> Json:
    raise KeyError("no such register")


def run(client: cc.BlockingClient, thread_id: str, text: str) -> list[p.ServerNotification]:
    client.turn_start(thread_id, text)
    seen: list[p.ServerNotification] = []
    for note in client.notifications(timeout=20):
        seen.append(note)
        if isinstance(note, p.TurnCompletedNotification):
            return seen
    raise AssertionError("unreachable")


def test_python_kernel_and_tools(state_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    kernel = Calculator()
    with cc.AppServer.open(state_dir, kernel=kernel, tools={"add": add}) as server, \
            server.blocking_client(approvals=lambda r: "acceptOnce") as client:
        client.thread_start(thread_id="k", agent_options=p.AgentOptions(extra={"mode": "calc"}))
        seen = run(client, "k", "sum")
        done = seen[-1]
        assert isinstance(done, p.TurnCompletedNotification) and done.params.turn.status == "completed"
        assert done.params.error is None
        results = [n.params.result for n in seen if isinstance(n, p.ToolResultNotification)]
        assert results == [p.ToolResultOk(output={"sum": 5})]
        # The kernel reported bodies; clients get them inside the published Item envelope.
        items = [n.params.item for n in seen if isinstance(n, (p.ItemStartedNotification, p.ItemCompletedNotification))]
        tool = [i for i in items if isinstance(i.content, p.ToolCallItem)]
        assert [(i.kind, i.status) for i in tool] == [("tool", "started"), ("tool", "completed")]
        assert all(i.thread_id == "k" and i.turn_id == done.params.turn.id for i in items)
        assert all(isinstance(i.content, (p.ToolCallItem, p.AgentMessageItem)) and i.id == i.content.id for i in items)
        assert tool[-1].completed_at is not None and tool[0].completed_at is None
        text = "".join(n.params.delta.text for n in seen if isinstance(n, p.ItemDeltaNotification)
                       and isinstance(n.params.delta, p.TextDelta))
        assert text == "sum: 5"
        assert server.stats().tools_executed == 1
        # The context lives for its turn only.
        ctx = kernel.contexts[0]
        assert ctx.cancelled
        with pytest.raises(cc.TurnCancelled):
            ctx.new_item_id()

        # A kernel exception is a failed turn carrying its message (and a logged traceback).
        caplog.set_level(logging.ERROR, logger="cc_app_server")
        failed = run(client, "k", "fail")[-1]
        assert isinstance(failed, p.TurnCompletedNotification) and failed.params.turn.status == "failed"
        # Why it failed travels beside the (published, closed) Turn.
        assert failed.params.error is not None
        assert "the calculator is out of batteries" in failed.params.error.message
        assert failed.params.turn.terminal_evidence is not None
        assert failed.params.turn.terminal_evidence.status == "failed"
        assert any("out of batteries" in r.getMessage() and r.exc_info for r in caplog.records)

        # The thread goes on after a failed turn.
        assert isinstance(run(client, "k", "sum")[-1], p.TurnCompletedNotification)


def test_tool_exceptions_become_failed_tool_results(state_dir: str) -> None:
    with cc.AppServer.open(state_dir, kernel=Calculator(), tools={"add": broken}, policy="auto_approve") as server, \
            server.blocking_client() as client:
        client.thread_start(thread_id="t", agent_options=p.AgentOptions(extra={"mode": "calc"}))
        seen = run(client, "t", "sum")
        results = [n.params.result for n in seen if isinstance(n, p.ToolResultNotification)]
        assert len(results) == 1 and isinstance(results[0], p.ToolResultError)
        assert "no such register" in results[0].message
        done = seen[-1]
        assert isinstance(done, p.TurnCompletedNotification) and done.params.turn.status == "completed"


def test_a_tool_executor_class_and_an_unknown_tool(state_dir: str) -> None:
    class Tools(cc.ToolExecutor):
        def __init__(self) -> None:
            self.calls: list[tuple[str, str, Json]] = []

        def execute(self, thread_id: str, tool: str, arguments: Json) -> Json:
            self.calls.append((thread_id, tool, arguments))
            return {"sum": 5}

    tools = Tools()
    script = {"steps": [{"type": "tool", "tool": "add", "arguments": {"a": 2, "b": 3}}]}
    with cc.AppServer.open(state_dir, script=script, tools=tools, policy="auto_approve") as server, \
            server.blocking_client() as client:
        client.thread_start(thread_id="x")
        run(client, "x", "go")
        assert tools.calls == [("x", "add", {"a": 2, "b": 3})]
    with cc.AppServer.open(state_dir, script=script, tools={"mul": add}, policy="auto_approve") as server, \
            server.blocking_client() as client:
        seen = run(client, "x", "go")
        [result] = [n.params.result for n in seen if isinstance(n, p.ToolResultNotification)]
        assert isinstance(result, p.ToolResultError) and "unknown tool 'add'" in result.message


def test_interrupting_a_python_kernel(state_dir: str) -> None:
    kernel = Calculator()
    with cc.AppServer.open(state_dir, kernel=kernel) as server:
        async def main() -> None:
            async with server.client() as client:
                await client.thread_start(thread_id="w")
                turn = (await client.turn_start("w", "wait")).turn
                while not kernel.contexts:
                    await asyncio.sleep(0.01)
                result = await client.turn_interrupt("w", turn.id)
                assert result.physically_settled and result.turn.status == "interrupted"
                assert result.turn.terminal_evidence is not None
                assert result.turn.terminal_evidence.status == "cancelled"

        asyncio.run(main())


def test_a_function_kernel_runs_on_engine_threads(state_dir: str) -> None:
    threads: set[str] = set()

    def echo(ctx: cc.TurnContext, input: cc.TurnInput) -> None:
        threads.add(threading.current_thread().name)
        ctx.say(f"echo: {input.text}")

    with cc.AppServer.open(state_dir, kernel=echo) as server, server.blocking_client() as client:
        client.thread_start(thread_id="e")
        seen = run(client, "e", "hi")
        [completed] = [n for n in seen if isinstance(n, p.ItemCompletedNotification)
                       and isinstance(n.params.item.content, p.AgentMessageItem)]
        item = completed.params.item
        assert item.kind == "assistant_message" and item.status == "completed"
        assert isinstance(item.content, p.AgentMessageItem) and item.content.text == "echo: hi"
        assert item.data_policy.trust == "untrusted_content"
    assert threads and threading.main_thread().name not in threads
