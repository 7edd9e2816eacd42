"""Lifecycle through the public API: open, handshake, every typed request, the escape hatch,
protocol errors with their wire codes, close → reopen → resume, and Closed distinct from Timeout."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import sysconfig
import typing

import pytest

import cc_app_server as cc
from cc_app_server import protocol as p
from conftest import TOOL_SCRIPT


def test_the_import_is_the_installed_wheel() -> None:
    # The suite must exercise what ships, not the source tree.
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert os.path.realpath(cc.__file__).startswith(site), (cc.__file__, site)
    assert os.path.isfile(os.path.join(os.path.dirname(cc.__file__), "py.typed"))
    assert os.path.isfile(os.path.join(os.path.dirname(p.__file__), "py.typed"))
    assert cc.SCHEMA_DIGEST == p.SCHEMA_DIGEST and cc.PROTOCOL_VERSION == 1
    assert sys.version_info >= (3, 10)


def test_a_typed_method_for_every_client_request_in_the_schema() -> None:
    requests = typing.get_args(p.ClientRequest) or p.ClientRequest.split(" | ")  # type: ignore[attr-defined]
    methods = []
    for cls in requests:
        cls = getattr(p, cls) if isinstance(cls, str) else cls
        method = {f.name: f.default for f in dataclasses.fields(cls)}["method"]
        assert isinstance(method, str)
        methods.append(method)
    assert "thread/start" in methods and "turn/interrupt" in methods
    for method in methods:
        if method == "initialize":
            continue  # done for you by connect
        name = method.replace("/", "_")
        assert callable(getattr(cc.AsyncClient, name)), name
        assert callable(getattr(cc.BlockingClient, name)), name


def test_async_lifecycle(server: cc.AppServer) -> None:
    async def main() -> None:
        async with server.client() as client:
            init = client.initialize_result
            assert init.schema_digest == cc.SCHEMA_DIGEST and init.protocol_version == 1
            assert "thread_turn_item" in init.features
            started = await client.thread_start(thread_id="life", title="Life", metadata={"k": "v"})
            assert isinstance(started, p.ThreadStartResult)
            assert (started.thread.id, started.thread.title, started.thread.metadata) == ("life", "Life", {"k": "v"})
            other = await client.thread_start()
            assert other.thread.id != "life" and other.thread.title is None
            listed = await client.thread_list()
            assert sorted(t.id for t in listed.threads) == sorted(["life", other.thread.id])
            read = await client.thread_read("life", limit=1)
            assert read.thread.id == "life" and len(read.events) == 1 and read.events[0].seq == 1
            forked = await client.thread_fork("life", new_thread_id="life-fork", title="Fork")
            assert forked.thread.id == "life-fork" and isinstance(forked.forked_from, p.ForkOrigin)
            assert forked.forked_from.thread_id == "life" and forked.thread.parent_thread_id == "life"
            assert (await client.thread_read("life-fork", limit=1)).forked_from == forked.forked_from
            assert (await client.thread_resume("life", limit=1)).forked_from is None
            archived = await client.thread_archive(other.thread.id)
            assert archived.thread.status == "archived"
            assert other.thread.id not in [t.id for t in (await client.thread_list()).threads]
            assert other.thread.id in [t.id for t in (await client.thread_list(include_archived=True)).threads]
            # The escape hatch: JSON in, JSON out.
            raw = await client.request("thread/list", {"limit": 1})
            assert isinstance(raw["threads"], list) and len(raw["threads"]) == 1
            assert client.pending_requests == 0 and not client.closed
        assert client.closed
        with pytest.raises(cc.Closed):
            await client.thread_list()

    asyncio.run(main())


def test_protocol_errors_carry_wire_codes(server: cc.AppServer) -> None:
    async def main() -> None:
        async with server.client() as client:
            with pytest.raises(cc.ProtocolError) as not_found:
                await client.thread_read("missing")
            assert not_found.value.code == -32004 and not_found.value.message
            with pytest.raises(cc.ProtocolError) as bad:
                await client.thread_start(thread_id="../etc")
            assert bad.value.code == -32602
            assert isinstance(bad.value.data, dict) and bad.value.data["pointer"] == "/params/threadId"
            with pytest.raises(cc.ProtocolError) as unknown:
                await client.request("thread/explode", {})
            assert unknown.value.code == -32601
            await client.thread_start(thread_id="busy", agent_options=p.AgentOptions(
                script={"steps": [{"type": "sleep", "ms": 3000}]}))
            await client.turn_start("busy", "go")
            with pytest.raises(cc.ProtocolError) as conflict:
                await client.turn_start("busy", "again")
            assert conflict.value.code == -32009
            assert isinstance(conflict.value, cc.Error)

    asyncio.run(main())


def test_blocking_lifecycle(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        assert client.initialize_result.schema_digest == cc.SCHEMA_DIGEST
        client.thread_start(thread_id="b", agent_options=p.AgentOptions(
            script={"steps": [{"type": "message", "text": "hello", "chunks": 2}]}))
        turn = client.turn_start("b", [p.TextInput(text="hi")]).turn
        seen: list[p.ServerNotification] = []
        for note in client.notifications(timeout=20):
            seen.append(note)
            if isinstance(note, p.TurnCompletedNotification):
                break
        done = seen[-1]
        assert isinstance(done, p.TurnCompletedNotification)
        assert done.params.turn.id == turn.id and done.params.turn.status == "completed"
        deltas = [n.params.delta for n in seen if isinstance(n, p.ItemDeltaNotification)]
        assert "".join(d.text for d in deltas if isinstance(d, p.TextDelta)) == "hello"
        # Every notification's rollout seq goes up by one: nothing lost, nothing reordered.
        seqs = [n.params.event_seq for n in seen if not isinstance(n, (p.UnknownCase, p.GraphEventNotification))]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        resumed = client.thread_resume("b")
        assert resumed.active_turn is None and resumed.thread.revision == seqs[-1]
        assert resumed.thread.status == "idle" and resumed.thread.parent_thread_id is None
        with pytest.raises(cc.Timeout):
            next(iter(client.notifications(timeout=0.1)))
    assert client.closed
    with pytest.raises(cc.Closed):
        next(iter(client.notifications(timeout=1)))


def test_a_closed_client_says_how_to_get_another_of_its_kind(server: cc.AppServer) -> None:
    with server.blocking_client() as blocking:
        pass
    with pytest.raises(cc.Closed) as closed:
        blocking.thread_list()
    # The blocking client is told about blocking clients, not pointed at `async with`.
    assert "server.blocking_client()" in str(closed.value) and "async with" not in str(closed.value), closed.value
    unconnected = server.client()
    with pytest.raises(cc.Closed) as closed:
        asyncio.run(unconnected.thread_list())
    assert "async with server.client()" in str(closed.value), closed.value


@pytest.mark.parametrize("store", ["jsonl", "sqlite"])
def test_close_reopen_resume(state_dir: str, store: cc.Store) -> None:
    async def first_life() -> tuple[str, int]:
        async with cc.AppServer.open(state_dir, store=store, script=TOOL_SCRIPT) as server:
            async with server.client(approvals=lambda request: "acceptOnce") as client:
                await client.thread_start(thread_id="keep", title="kept")
                turn = (await client.turn_start("keep", "write it")).turn
                async for note in client.notifications(timeout=20):
                    if isinstance(note, p.TurnCompletedNotification):
                        assert note.params.turn.status == "completed"
                        return turn.id, note.params.event_seq
        raise AssertionError("unreachable")

    turn_id, last_seq = asyncio.run(first_life())
    with cc.AppServer.open(state_dir, store=store) as server, server.blocking_client() as client:
        resumed = client.thread_resume("keep")
        assert resumed.thread.title == "kept" and resumed.thread.revision == last_seq
        assert resumed.active_turn is None and not resumed.has_more
        assert resumed.events[-1].seq == last_seq
        stats = server.stats()
        assert stats.indexed_threads == 1 and stats.loaded_threads >= 1 and stats.tail_cache_bytes > 0, stats
        kinds = [type(e.payload).__name__ for e in resumed.events]
        assert "TurnCompletedEvent" in kinds and "ToolResultEvent" in kinds, kinds
        # The thread goes on after the restart.
        client.turn_start("keep", "again")
        for note in client.notifications(timeout=20):
            if isinstance(note, p.TurnCompletedNotification):
                assert note.params.turn.id != turn_id and note.params.event_seq > last_seq
                break


def test_a_closed_server_ends_every_iterator_with_closed(server: cc.AppServer) -> None:
    blocking = server.blocking_client()
    outcomes: dict[str, BaseException] = {}

    async def main() -> None:
        async with server.client() as client:
            # Idle first: a timeout is a Timeout, and the client is still usable after it.
            with pytest.raises(cc.Timeout):
                async for _ in client.notifications(timeout=0.05):
                    pass
            assert not client.closed

            async def iterate() -> None:
                try:
                    async for _ in client.notifications():
                        pass
                except BaseException as e:
                    outcomes["async"] = e

            def iterate_blocking() -> None:
                try:
                    for _ in blocking.notifications():
                        pass
                except BaseException as e:
                    outcomes["blocking"] = e

            task = asyncio.create_task(iterate())
            thread = asyncio.get_running_loop().run_in_executor(None, iterate_blocking)
            await asyncio.sleep(0.2)
            await server.aclose()
            await asyncio.wait_for(task, 5)
            await asyncio.wait_for(thread, 5)
            assert client.closed

    asyncio.run(main())
    assert isinstance(outcomes["async"], cc.Closed), outcomes
    assert isinstance(outcomes["blocking"], cc.Closed), outcomes
    assert not isinstance(outcomes["async"], cc.Timeout)
    with pytest.raises(cc.Closed):
        server.blocking_client()


def test_open_refuses_bad_options(state_dir: str) -> None:
    with pytest.raises(ValueError, match="store"):
        cc.AppServer.open(state_dir, store="csv")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inbound_messages"):
        cc.AppServer.open(state_dir, inbound_messages=0)
    with pytest.raises(ValueError, match="approval_timeout"):
        cc.AppServer.open(state_dir, approval_timeout=-1)
    # A script that could not run is refused when the server opens, naming the step.
    with pytest.raises(ValueError, match=r'script step 1: unknown step type "mesage"'):
        cc.AppServer.open(state_dir, script={"steps": [{"type": "echo"}, {"type": "mesage", "text": "x"}]})
    with pytest.raises(ValueError, match="whole number"):
        cc.AppServer.open(state_dir, script={"steps": [{"type": "sleep", "ms": "5"}]})
    with cc.AppServer.open(state_dir):
        # One server per directory: the second is refused, with what to do — here the holder is
        # this very process, so the message does not send the user after another process.
        with pytest.raises(cc.Error, match="rollout store") as locked:
            cc.AppServer.open(state_dir)
        assert "another store in this process" in str(locked.value), locked.value
    # A regular file where the state directory should be says so (no chmod advice).
    a_file = os.path.join(state_dir, "a-file")
    with open(a_file, "w") as f:
        f.write("x")
    with pytest.raises(cc.Error, match="is a file, not a directory") as not_dir:
        cc.AppServer.open(a_file)
    assert "chmod" not in str(not_dir.value), not_dir.value


def test_results_are_the_generated_classes(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        result = client.thread_start(thread_id="gen")
        assert dataclasses.is_dataclass(result) and type(result) is p.ThreadStartResult
        assert p.encode_ThreadStartResult(result)["thread"]["id"] == "gen"  # type: ignore[index,call-overload]


def test_notifications_this_version_cannot_read_are_kept_not_dropped(caplog: pytest.LogCaptureFixture) -> None:
    # What the iterators do with each message (the engine of this version sends no such message,
    # so the decoding step is driven directly).
    from cc_app_server._client import _decode_notification

    future = _decode_notification('{"jsonrpc":"2.0","method":"thread/renamed","params":{"threadId":"t"}}')
    assert isinstance(future, p.UnknownCase) and future.raw["method"] == "thread/renamed"
    item = _decode_notification('{"jsonrpc":"2.0","method":"item/started","params":{"threadId":"t","eventSeq":3,'
                                '"turnId":"u","item":{"id":"i","threadId":"t","turnId":"u","parentId":null,'
                                '"kind":"artifact","status":"started","content":{"type":"hologram","id":"i"},'
                                '"dataPolicy":{"origin":"kernel","trust":"untrusted_content",'
                                '"sensitivity":"internal","allowedSinks":["host","rollout"]},'
                                '"createdAt":"2026-01-01T00:00:00.000Z","completedAt":null}}}')
    assert isinstance(item, p.ItemStartedNotification) and isinstance(item.params.item.content, p.UnknownCase)
    assert item.params.item.kind == "artifact"
    caplog.set_level(logging.WARNING, logger="cc_app_server")
    broken = _decode_notification('{"jsonrpc":"2.0","method":"turn/completed","params":{"threadId":"t"}}')
    assert isinstance(broken, p.UnknownCase) and broken.raw["method"] == "turn/completed"
    assert any("UnknownCase" in r.getMessage() for r in caplog.records)


def test_thread_compact_with_a_caller_summary(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        client.thread_start(thread_id="long", agent_options=p.AgentOptions(
            script={"steps": [{"type": "message", "text": "a long answer", "chunks": 3}]}))
        client.turn_start("long", "go")
        for note in client.notifications(timeout=20):
            if isinstance(note, p.TurnCompletedNotification):
                break
        before = client.thread_resume("long", limit=1).thread.revision
        done = client.thread_compact("long", summary="the user said go; the agent answered")
        assert done.summary == "the user said go; the agent answered"
        assert done.to_seq == before and done.event_seq == before + 1
        with pytest.raises(cc.ProtocolError) as e:
            client.thread_compact("long", summary="again")
        assert e.value.code == -32602 and "nothing to compact" in e.value.message
        client.turn_start("long", "more")
        for note in client.notifications(timeout=20):
            if isinstance(note, p.TurnCompletedNotification):
                break
        with pytest.raises(cc.ProtocolError) as e:
            client.thread_compact("long")
        assert e.value.code == -32602 and "cannot write summaries" in e.value.message
