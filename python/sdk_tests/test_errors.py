"""The SDK's error classes (the cross-SDK table of issue 25): each one made to happen for real and
caught by its class, with its JSON-RPC `code`, and the old catch sites (`Error`,
`ProtocolError`, `ValueError`, `TimeoutError`) still catching it."""

from __future__ import annotations

import asyncio
import os
import pathlib

import pytest

import cc_app_server as cc
from cc_app_server import protocol as p
from conftest import deaf_script


def test_every_class_is_exported_with_its_place_in_the_hierarchy() -> None:
    assert issubclass(cc.NotFound, cc.ProtocolError) and issubclass(cc.Conflict, cc.ProtocolError)
    assert issubclass(cc.InvalidParams, cc.ProtocolError) and issubclass(cc.InvalidParams, ValueError)
    assert issubclass(cc.Timeout, cc.Error) and issubclass(cc.Timeout, TimeoutError)
    for store in (cc.StoreLocked, cc.StoreUnsafe, cc.StoreDamaged):
        assert issubclass(store, cc.StoreError) and issubclass(store, cc.Error)
    for cls in (cc.Overloaded, cc.Closed, cc.StoreError, cc.KernelFailed, cc.TurnInterrupted, cc.ProtocolError):
        assert issubclass(cls, cc.Error)
        assert cls.__name__ in cc.__all__


def test_not_found_from_a_missing_thread(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        with pytest.raises(cc.NotFound) as e:
            client.thread_read("no-such-thread")
        assert e.value.code == -32004 and isinstance(e.value, cc.ProtocolError)

    async def main() -> None:
        async with server.client() as client:
            with pytest.raises(cc.NotFound) as e:
                await client.thread_resume("no-such-thread")
            assert e.value.code == -32004

    asyncio.run(main())


def test_conflict_from_a_busy_thread_and_a_reused_idempotency_key(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        client.thread_start(thread_id="busy", agent_options=p.AgentOptions(
            script={"steps": [{"type": "sleep", "ms": 20_000}]}))
        turn = client.turn_start("busy", "one").turn
        with pytest.raises(cc.Conflict) as e:
            client.turn_start("busy", "two")
        assert e.value.code == -32009 and isinstance(e.value, cc.ProtocolError)
        client.turn_interrupt("busy", turn.id)
        client.thread_start(thread_id="k1", idempotency_key="key-1")
        with pytest.raises(cc.Conflict):
            client.thread_start(thread_id="k2", idempotency_key="key-1")


def test_invalid_params_from_the_server_and_from_the_client(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        with pytest.raises(cc.InvalidParams) as e:
            client.request("thread/start", {"threadId": "not a file-safe id!"})
        assert e.value.code == -32602 and isinstance(e.value, ValueError)
        with pytest.raises(cc.InvalidParams) as e:
            client.request("thread/list", {"limit": "ten"})
        assert e.value.code == -32602
        # Refused before it is sent: params that are not JSON.
        with pytest.raises(cc.InvalidParams) as e:
            client._call("thread/list", {"limit": float("nan")})
        assert e.value.code == -32602


def test_timeout_when_no_answer_comes_in_time(state_dir: str) -> None:
    with cc.AppServer.open(state_dir, durability="buffered", settle_deadline=10) as server:
        async def main() -> None:
            async with server.client(request_timeout=0.2) as client:
                await client.thread_start(thread_id="t", agent_options=p.AgentOptions(script=deaf_script(1500)))
                turn = (await client.turn_start("t", "go")).turn
                async for note in client.notifications(timeout=20):
                    if isinstance(note, p.ItemCompletedNotification):
                        break
                # The interrupt waits for the deaf kernel, longer than the request timeout.
                with pytest.raises(cc.Timeout) as e:
                    await client.turn_interrupt("t", turn.id)
                assert e.value.code == -32010 and isinstance(e.value, TimeoutError)

        asyncio.run(main())


def test_closed_client_and_closed_server(state_dir: str) -> None:
    server = cc.AppServer.open(state_dir, durability="buffered")
    client = server.blocking_client()
    client.close()
    with pytest.raises(cc.Closed):
        client.thread_list()
    live = server.blocking_client()
    server.close()
    with pytest.raises(cc.Closed):
        live.thread_list()
    with pytest.raises(cc.Closed):
        server.blocking_client()


def test_store_locked_by_a_second_open_in_this_process(state_dir: str) -> None:
    with cc.AppServer.open(state_dir) as server:
        with pytest.raises(cc.StoreLocked) as e:
            cc.AppServer.open(state_dir)
        assert e.value.code == -32603 and isinstance(e.value, cc.StoreError)
        with pytest.raises(cc.StoreLocked):
            cc.RolloutStore.open(state_dir)
        # The server's own store reads while it runs.
        with server.blocking_client() as client:
            client.thread_start(thread_id="listed")
        assert [t.thread_id for t in server.store().list().threads] == ["listed"]


def test_store_unsafe_for_a_shared_directory_and_a_regular_file(tmp_path: pathlib.Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(cc.StoreUnsafe) as e:
        cc.AppServer.open(shared)
    assert e.value.code == -32603
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(cc.StoreUnsafe):
        cc.AppServer.open(a_file)
    with pytest.raises(cc.StoreUnsafe):
        cc.RolloutStore.open(a_file)


def test_store_damaged_by_a_tampered_rollout_file(state_dir: str) -> None:
    with cc.AppServer.open(state_dir) as server, server.blocking_client() as client:
        client.thread_start(thread_id="tampered", title="original title", agent_options=p.AgentOptions(
            script={"steps": [{"type": "message", "text": "later events"}]}))
        client.turn("tampered", "go", timeout=20).completion()
    log = pathlib.Path(state_dir) / "threads" / "tampered.jsonl"
    text = log.read_text()
    assert "original title" in text
    log.write_text(text.replace("original title", "forged!! title"))
    with pytest.raises(cc.StoreDamaged) as e:
        with cc.RolloutStore.open(state_dir) as store:
            store.read("tampered")
    assert e.value.code == -32603 and isinstance(e.value, cc.StoreError)
    with cc.RolloutStore.open(state_dir) as store:
        with pytest.raises(cc.StoreDamaged, match="seq 1"):
            store.verify("tampered")
        with pytest.raises(cc.NotFound):
            store.read("no-such-thread")
    with pytest.raises(cc.Closed):
        store.list()


def test_kernel_failed_and_turn_interrupted_from_the_turn_text(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        client.thread_start(thread_id="fails", agent_options=p.AgentOptions(
            script={"steps": [{"type": "message", "text": "so far"}, {"type": "fail", "message": "boom"}]}))
        stream = client.turn("fails", "go", timeout=20)
        with pytest.raises(cc.KernelFailed) as e:
            stream.text()
        assert e.value.reason == "kernelFailed" and "boom" in e.value.message
        assert e.value.turn_id == stream.turn.id and e.value.code == -32603

        client.thread_start(thread_id="stops", agent_options=p.AgentOptions(
            script={"steps": [{"type": "message", "text": "in"}, {"type": "sleep", "ms": 20_000}]}))
        stream = client.turn("stops", "go", timeout=20)
        for note in stream:
            if isinstance(note, p.ItemCompletedNotification):
                break
        client.turn_interrupt("stops", stream.turn.id)
        with pytest.raises(cc.TurnInterrupted) as i:
            stream.text()
        assert i.value.turn_id == stream.turn.id and i.value.code == -32010
