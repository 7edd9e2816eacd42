"""Turns under load and under interruption: interrupt, overload surfaced as `Overloaded`, 50 threads
with concurrent turns, slow consumers, and cancellation of tasks awaiting a response or iterating
notifications."""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict

import pytest

import cc_app_server as cc
from cc_app_server import protocol as p
from cc_app_server.protocol import Json
from conftest import deaf_script, streaming_script


def native_listener_threads() -> int:
    """Delivery threads of native notification listeners alive in this process (Linux thread names
    are cut to 15 bytes)."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "cc-ffi-notifica":
                    count += 1
        except OSError:
            pass
    return count


def test_interrupt_answers_when_the_kernel_has_stopped(server: cc.AppServer) -> None:
    async def main() -> None:
        async with server.client() as client:
            await client.thread_start(thread_id="i", agent_options=p.AgentOptions(
                script={"steps": [{"type": "message", "text": "in"}, {"type": "sleep", "ms": 20_000}]}))
            turn = (await client.turn_start("i", "go")).turn
            async for note in client.notifications(timeout=20):
                if isinstance(note, p.ItemCompletedNotification):
                    break
            started = time.monotonic()
            result = await client.turn_interrupt("i", turn.id)
            assert result.physically_settled is True and result.turn.status == "interrupted"
            assert time.monotonic() - started < 10
            async for note in client.notifications(timeout=20):
                if isinstance(note, p.TurnCompletedNotification):
                    assert note.params.turn.status == "interrupted"
                    break
            resumed = await client.thread_resume("i")
            assert resumed.active_turn is None

    asyncio.run(main())


def test_overload_is_overloaded_with_retry_after(state_dir: str) -> None:
    with cc.AppServer.open(state_dir, durability="buffered", settle_deadline=10) as server:
        async def main() -> None:
            async with server.client(max_pending=1) as client:
                await client.thread_start(thread_id="o", agent_options=p.AgentOptions(script=deaf_script(1500)))
                turn = (await client.turn_start("o", "go")).turn
                async for note in client.notifications(timeout=20):
                    if isinstance(note, p.ItemCompletedNotification):
                        break
                # The interrupt waits for the deaf kernel and holds the one pending slot.
                interrupt = asyncio.create_task(client.turn_interrupt("o", turn.id))
                while client.pending_requests == 0:
                    await asyncio.sleep(0.005)
                with pytest.raises(cc.Overloaded) as e:
                    await client.thread_list()
                assert e.value.retry_after_ms > 0 and e.value.code == -32001
                assert (await interrupt).physically_settled
                # After the retry hint the request goes through.
                await asyncio.sleep(e.value.retry_after_ms / 1000)
                assert (await client.thread_list()).threads

        asyncio.run(main())


def test_compact_profile_admits_eight_connections_and_refuses_the_ninth(state_dir: str) -> None:
    with pytest.raises(ValueError, match="profile must be one of"):
        cc.AppServer.open(state_dir, profile="tiny")  # type: ignore[arg-type]
    with cc.AppServer.open(state_dir, durability="buffered", profile="compact") as server:
        clients = [server.blocking_client() for _ in range(8)]
        try:
            with pytest.raises(cc.Overloaded) as e:
                server.blocking_client()
            assert e.value.code == -32001 and e.value.retry_after_ms > 0
            # One closes: its slot is free again, and what was accepted is still there.
            clients[0].thread_start(thread_id="c")
            clients.pop(0).close()
            again = server.blocking_client()
            assert [t.id for t in again.thread_list().threads] == ["c"]
            again.close()
        finally:
            for c in clients:
                c.close()


def test_fifty_threads_with_concurrent_turns(server: cc.AppServer) -> None:
    n = 50

    async def main() -> None:
        async with server.client(approvals=lambda r: "acceptOnce") as client:
            script: Json = {"steps": [{"type": "message", "text": "one two three", "chunks": 3},
                                {"type": "tool", "tool": "fs.write", "arguments": {"path": "x", "text": "y"}}]}

            async def one(i: int) -> str:
                await client.thread_start(thread_id=f"t{i}", agent_options=p.AgentOptions(script=script))
                return (await client.turn_start(f"t{i}", f"go {i}")).turn.id

            turn_ids = await asyncio.gather(*(one(i) for i in range(n)))
            assert len(set(turn_ids)) == n
            completed: dict[str, str] = {}
            seqs: dict[str, list[int]] = defaultdict(list)
            async for note in client.notifications(timeout=30):
                if isinstance(note, (p.UnknownCase, p.GraphEventNotification)):
                    continue
                seqs[note.params.thread_id].append(note.params.event_seq)
                if isinstance(note, p.TurnCompletedNotification):
                    completed[note.params.thread_id] = note.params.turn.status
                    if len(completed) == n:
                        break
            assert completed == {f"t{i}": "completed" for i in range(n)}
            for thread_id, s in seqs.items():
                assert s == sorted(s) and len(set(s)) == len(s), thread_id
            listed = await client.thread_list(limit=100)
            assert len(listed.threads) == n

    asyncio.run(main())
    assert server.stats().tools_executed == n


def test_a_slow_consumer_gets_everything_in_order(server: cc.AppServer) -> None:
    deltas = 200

    async def main() -> None:
        async with server.client() as client:
            await client.thread_start(thread_id="slow", agent_options=p.AgentOptions(script=streaming_script(deltas)))
            await client.turn_start("slow", "go")
            texts: list[str] = []
            last_seq = 0
            async for note in client.notifications(timeout=20):
                await asyncio.sleep(0.001)  # a consumer slower than the kernel
                if isinstance(note, (p.UnknownCase, p.GraphEventNotification)):
                    continue
                assert note.params.event_seq > last_seq
                last_seq = note.params.event_seq
                if isinstance(note, p.ItemDeltaNotification) and isinstance(note.params.delta, p.TextDelta):
                    texts.append(note.params.delta.text)
                if isinstance(note, p.TurnCompletedNotification):
                    break
            assert texts == [f"part {i}" for i in range(deltas)]

    asyncio.run(main())
    assert server.stats().closed_slow_consumers == 0


def test_a_consumer_that_stops_reading_is_closed_and_the_engine_goes_on(state_dir: str) -> None:
    # A host that takes nothing for `outbound_stall` while its queue is full loses its connection
    # (one that keeps reading, however slowly, never does: test_a_slow_consumer_gets_everything).
    with cc.AppServer.open(state_dir, durability="buffered", outbound_messages=64, outbound_stall=0.5) as server:
        async def main() -> None:
            async with server.client(notification_capacity=8) as deaf, server.client() as reader:
                await deaf.thread_start(thread_id="flood", agent_options=p.AgentOptions(
                    script=streaming_script(600, sleep_ms=1)))
                await deaf.turn_start("flood", "go")
                # `deaf` never reads: once its bounded queues (8 + 64 messages) are full the server
                # closes it. (`reader` is not subscribed to the thread until it asks about it.)
                deadline = time.monotonic() + 20
                while not deaf.closed and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                assert deaf.closed
                assert server.stats().closed_slow_consumers >= 1
                # What was delivered before the close is still readable, then Closed (not Timeout).
                got = 0
                with pytest.raises(cc.Closed):
                    async for _ in deaf.notifications(timeout=5):
                        got += 1
                assert got >= 1
                # The engine kept going: the turn completes and is durable. (`reader` is subscribed
                # by its first question, so it reads what follows.)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    if (await reader.thread_resume("flood", limit=1)).active_turn is None:
                        break
                    try:
                        async for note in reader.notifications(timeout=0.5):
                            if isinstance(note, p.TurnCompletedNotification):
                                break
                    except cc.Timeout:
                        pass
                resumed = await reader.thread_resume("flood", limit=1)
                assert resumed.active_turn is None
                last = await reader.thread_read("flood", after_event_seq=resumed.thread.revision - 1)
                assert [type(e.payload) for e in last.events] == [p.TurnCompletedEvent]

        asyncio.run(main())


def test_cancelling_a_task_awaiting_a_response(state_dir: str) -> None:
    with cc.AppServer.open(state_dir, durability="buffered", settle_deadline=10) as server:
        async def main() -> None:
            async with server.client() as client:
                await client.thread_start(thread_id="c", agent_options=p.AgentOptions(script=deaf_script(800)))
                turn = (await client.turn_start("c", "go")).turn
                async for note in client.notifications(timeout=20):
                    if isinstance(note, p.ItemCompletedNotification):
                        break
                task = asyncio.create_task(client.turn_interrupt("c", turn.id))
                while client.pending_requests == 0:
                    await asyncio.sleep(0.005)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # The client is unharmed; the abandoned request completes on its own.
                assert (await client.thread_list()).threads
                deadline = time.monotonic() + 10
                while client.pending_requests and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                assert client.pending_requests == 0
                async for note in client.notifications(timeout=20):
                    if isinstance(note, p.TurnCompletedNotification):
                        assert note.params.turn.status == "interrupted"
                        break

        asyncio.run(main())


def test_cancelling_the_iterating_task_releases_the_listener_and_loses_nothing(server: cc.AppServer) -> None:
    deltas = 60

    async def main() -> None:
        async with server.client() as client:
            assert native_listener_threads() == 0
            await client.thread_start(thread_id="it", agent_options=p.AgentOptions(
                script=streaming_script(deltas, sleep_ms=5)))
            first: list[str] = []
            reached = asyncio.Event()

            async def consume() -> None:
                async for note in client.notifications():
                    if isinstance(note, p.ItemDeltaNotification) and isinstance(note.params.delta, p.TextDelta):
                        first.append(note.params.delta.text)
                        if len(first) == 10:
                            reached.set()

            task = asyncio.create_task(consume())
            await client.turn_start("it", "go")
            await asyncio.wait_for(reached.wait(), 20)
            assert native_listener_threads() == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            deadline = time.monotonic() + 5
            while native_listener_threads() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert native_listener_threads() == 0, "the native listener was not released"
            # The rest of the stream is there for the next iteration, in order.
            rest: list[str] = []
            async for note in client.notifications(timeout=20):
                if isinstance(note, p.ItemDeltaNotification) and isinstance(note.params.delta, p.TextDelta):
                    rest.append(note.params.delta.text)
                if isinstance(note, p.TurnCompletedNotification):
                    break
            assert first + rest == [f"part {i}" for i in range(deltas)]
            # Breaking out of a loop releases it too (once the generator is closed).
            await client.turn_start("it", "again")
            async for _ in client.notifications(timeout=20):
                break
            await asyncio.sleep(0.3)
            assert native_listener_threads() == 0

    asyncio.run(main())
