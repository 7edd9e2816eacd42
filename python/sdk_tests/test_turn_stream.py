"""`client.turn(thread_id, text)`: one turn's notifications, subscribed before `turn/start`, ending
with its `turn/completed`; `text()` and `completion()`. With the scripted kernel. Also the typed
notifications' lazy `item/delta` and the Python rough edges of issue 25 item 11."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib

import pytest

import cc_app_server as cc
from cc_app_server import protocol as p
from conftest import TOOL_SCRIPT


def script(*texts: str, chunks: int = 3) -> p.AgentOptions:
    return p.AgentOptions(script={"steps": [{"type": "message", "text": t, "chunks": chunks} for t in texts]})


def test_a_turn_with_deltas_yields_only_its_events_and_its_text(server: cc.AppServer) -> None:
    async def main() -> None:
        async with server.client() as client:
            await client.thread_start(thread_id="d", agent_options=script("hello world", "second"))
            stream = await client.turn("d", "go", timeout=20)
            assert stream.turn.thread_id == "d" and stream.turn.status in ("running", "queued")
            notes = [note async for note in stream]
            assert isinstance(notes[0], p.TurnStartedNotification)
            assert isinstance(notes[-1], p.TurnCompletedNotification)
            assert notes[-1].params.turn.id == stream.turn.id
            deltas = [n for n in notes if isinstance(n, p.ItemDeltaNotification)]
            assert len(deltas) == 6
            text = "".join(d.params.delta.text for d in deltas if isinstance(d.params.delta, p.TextDelta))
            assert text == "hello worldsecond"
            for n in notes:
                assert getattr(n, "params").thread_id == "d"
            # The stream is over; text() and completion() read what it saw.
            assert await stream.text() == "hello world\nsecond"
            assert (await stream.completion()).turn.status == "completed"
            # The next turn is a new stream, and nothing of this one leaks into notifications().
            assert await (await client.turn("d", "again", timeout=20)).text() == "hello world\nsecond"
            with pytest.raises(cc.Timeout):
                async for _ in client.notifications(timeout=0.2):
                    pass

    asyncio.run(main())


def test_an_approval_is_answered_by_the_handler_during_the_turn(server: cc.AppServer) -> None:
    asked: list[p.ApprovalRequest] = []

    def approve(request: p.ApprovalRequest) -> cc.DecisionName:
        asked.append(request)
        return "acceptOnce"

    async def main() -> None:
        async with server.client(approvals=approve) as client:
            await client.thread_start(thread_id="a", agent_options=p.AgentOptions(script=TOOL_SCRIPT))
            stream = await client.turn("a", "write it", timeout=20)
            assert await stream.text() == "done"
            done = await stream.completion()
            assert done.turn.status == "completed" and done.error is None
    asyncio.run(main())
    assert len(asked) == 1


def test_a_failing_kernel_raises_kernel_failed_async(server: cc.AppServer) -> None:
    async def main() -> None:
        async with server.client() as client:
            await client.thread_start(thread_id="f", agent_options=p.AgentOptions(
                script={"steps": [{"type": "fail", "message": "the model is down"}]}))
            stream = await client.turn("f", "go", timeout=20)
            with pytest.raises(cc.KernelFailed) as e:
                await stream.text()
            assert e.value.reason == "kernelFailed" and e.value.turn_id == stream.turn.id
            assert "the model is down" in e.value.message
            completed = await stream.completion()
            assert completed.turn.status == "failed" and completed.error is not None

    asyncio.run(main())


def test_an_interrupted_turn_raises_turn_interrupted_async(server: cc.AppServer) -> None:
    async def main() -> None:
        async with server.client() as client:
            await client.thread_start(thread_id="i", agent_options=p.AgentOptions(
                script={"steps": [{"type": "message", "text": "in"}, {"type": "sleep", "ms": 20_000}]}))
            stream = await client.turn("i", "go", timeout=20)
            async for note in stream:
                if isinstance(note, p.ItemCompletedNotification):
                    break
            await client.turn_interrupt("i", stream.turn.id)
            with pytest.raises(cc.TurnInterrupted) as e:
                await stream.text()
            assert e.value.turn_id == stream.turn.id

    asyncio.run(main())


def test_two_concurrent_turns_on_two_threads_each_see_only_their_own(server: cc.AppServer) -> None:
    async def one(client: cc.AsyncClient, thread_id: str) -> tuple[str, set[str], set[str]]:
        stream = await client.turn(thread_id, "go", timeout=20)
        threads: set[str] = set()
        turns: set[str] = set()
        async for note in stream:
            params = getattr(note, "params")
            threads.add(params.thread_id)
            turns.add(getattr(params, "turn_id", None) or params.turn.id)
        return await stream.text(), threads, turns

    async def main() -> None:
        async with server.client() as client:
            steps: list[p.Json] = [{"type": "message", "text": f"part {i}", "chunks": 2} for i in range(20)]
            await client.thread_start(thread_id="x", agent_options=p.AgentOptions(script={"steps": steps}))
            await client.thread_start(thread_id="y", agent_options=script("only y"))
            (x_text, x_threads, x_turns), (y_text, y_threads, y_turns) = await asyncio.gather(
                one(client, "x"), one(client, "y"))
            assert x_text == "\n".join(f"part {i}" for i in range(20)) and x_threads == {"x"} and len(x_turns) == 1
            assert y_text == "only y" and y_threads == {"y"} and len(y_turns) == 1
            assert x_turns != y_turns

    asyncio.run(main())


def test_the_blocking_turn_stream(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        client.thread_start(thread_id="b", agent_options=script("blocking"))
        stream = client.turn("b", "go", timeout=20)
        kinds = [type(n).__name__ for n in stream]
        assert kinds[0] == "TurnStartedNotification" and kinds[-1] == "TurnCompletedNotification"
        assert stream.text() == "blocking"
        assert stream.completion().turn.id == stream.turn.id
        # A refused start raises and leaves no subscription behind.
        with pytest.raises(cc.NotFound):
            client.turn("no-such-thread", "go")
        assert not client._inbox.subs


def test_item_delta_is_lazy_but_the_generated_class(server: cc.AppServer) -> None:
    with server.blocking_client() as client:
        client.thread_start(thread_id="l", agent_options=script("abc"))
        client.turn_start("l", "go")
        deltas: list[p.ItemDeltaNotification] = []
        for note in client.notifications(timeout=20):
            if isinstance(note, p.ItemDeltaNotification):
                deltas.append(note)
            if isinstance(note, p.TurnCompletedNotification):
                break
    first = deltas[0]
    assert isinstance(first, cc.LazyItemDeltaNotification)
    eager = p.decode_ItemDeltaNotification(p.encode_ItemDeltaNotification(first))
    assert type(eager) is p.ItemDeltaNotification and eager == first and first == eager
    assert dataclasses.replace(first, params=eager.params).params == eager.params
    match first:
        case p.ItemDeltaNotification(params=p.ItemDeltaParams(delta=p.TextDelta(text=t))):
            assert t == "a"
        case _:
            raise AssertionError(first)
    # Validated where it is read: a delta that does not decode raises on `params`.
    from cc_app_server._client import _decode_notification
    bad = _decode_notification('{"jsonrpc":"2.0","method":"item/delta","params":{"threadId":"t"}}')
    assert isinstance(bad, p.ItemDeltaNotification)
    with pytest.raises(p.DecodeError):
        bad.params


def _spelled(params: object, **dumps: object) -> str:
    """A delta notification spelled as the engine writes it (members in its order, no spaces)."""
    import json

    return '{"jsonrpc":"2.0","method":"item/delta","params":' + json.dumps(params, separators=(",", ":"), **dumps) + "}"  # type: ignore[arg-type]


def test_the_text_delta_fast_path_agrees_with_the_generated_decoder() -> None:
    """`params` of a text delta in the engine's spelling skip `json.loads` and the generic decoder;
    every other text falls back to them (and to their error). Both give equal objects."""
    import json

    from cc_app_server._client import _decode_notification, _text_delta_params

    def good(text: object = "hé", **over: object) -> dict[str, object]:
        return {"threadId": "t", "eventSeq": 7, "delta": {"text": text, "type": "text"}, "itemId": "i", "turnId": "u", **over}

    fast_expected = [
        _spelled(good()),
        _spelled(good(), ensure_ascii=False),
        _spelled(good('a"b\\c\n\t\u0001/\ud83d\ude00\ud800 é😀')),
        _spelled(good('a"b\\c\n\t\u0001/\ud83d\ude00 é😀'), ensure_ascii=False),
        _spelled(good("")),
        _spelled(good(eventSeq=0)),
        '{"jsonrpc":"2.0","method":"item/delta","params":{"threadId":"t","eventSeq":1,"delta":{"text":"\\/ \\u00E9","type":"text"},"itemId":"i","turnId":"u"}}',
    ]
    slow_expected = [
        json.dumps({"jsonrpc": "2.0", "method": "item/delta", "params": good()}),  # spaces
        _spelled({"eventSeq": 7, "threadId": "t", "delta": {"text": "x", "type": "text"}, "itemId": "i", "turnId": "u"}),
        _spelled(good(eventSeq=-1)),
        _spelled(good(eventSeq=3.0)),
        _spelled(good(eventSeq=True)),
        _spelled(good(eventSeq="7")),
        '{"jsonrpc":"2.0","method":"item/delta","params":{"threadId":"t","eventSeq":07,"delta":{"text":"x","type":"text"},"itemId":"i","turnId":"u"}}',
        _spelled(good(threadId=1)),
        _spelled(good(turnId=None)),
        _spelled(good(extra=1)),
        _spelled({k: v for k, v in good().items() if k != "itemId"}),
        _spelled(good(5)),
        _spelled(good(delta={"text": "x", "type": "text", "more": 1})),
        _spelled(good(delta={"stream": "stdout", "text": "x", "type": "output"})),
        _spelled(good(delta={"text": "x", "type": "texts"})),
        _spelled(good(delta="text")),
        '{"jsonrpc":"2.0","method":"item/delta","params":{"threadId":"t","eventSeq":1,"delta":{"text":"a\x01b","type":"text"},"itemId":"i","turnId":"u"}}',  # a raw control character
        '{"jsonrpc":"2.0","method":"item/delta","params":{"threadId":"t","eventSeq":1,"delta":{"text":"\\q","type":"text"},"itemId":"i","turnId":"u"}}',
        _spelled(good()) + " ",
        _spelled(good())[:-1] + ',"method":"item/started"}',
    ]
    for text, fast_path in [(t, True) for t in fast_expected] + [(t, False) for t in slow_expected]:
        fast = _text_delta_params(text)
        assert (fast is not None) == fast_path, text
        try:
            want: p.ItemDeltaParams | None = p.decode_ItemDeltaNotification(json.loads(text)).params
        except ValueError:  # DecodeError, or text json.loads refuses
            want = None
        if fast is not None:
            assert want is not None and fast == want, text
            assert fast.__dict__.keys() == want.__dict__.keys() and fast.delta.__dict__ == want.delta.__dict__
        lazy = _decode_notification(text)
        if want is not None:
            assert isinstance(lazy, p.ItemDeltaNotification) and lazy.params == want, text
        elif isinstance(lazy, p.ItemDeltaNotification):  # lazy: refused where it is read
            with pytest.raises(ValueError):
                lazy.params  # noqa: B018
        else:  # not in the server's head spelling: decoded eagerly, kept as unknown
            assert isinstance(lazy, p.UnknownCase), text


def test_the_real_servers_text_deltas_take_the_fast_path(server: cc.AppServer) -> None:
    from cc_app_server._client import _text_delta_params

    with server.blocking_client() as client:
        client.thread_start(thread_id="fp", agent_options=script('plain, "quoted"\n\tand é😀', chunks=4))
        client.turn_start("fp", "go")
        deltas = []
        for text in client.raw_notifications(timeout=20):
            if '"method":"item/delta"' in text:
                deltas.append(text)
            if '"method":"turn/completed"' in text:
                break
    assert len(deltas) == 4
    for text in deltas:
        assert _text_delta_params(text) is not None, text


def test_unknown_notifications_have_a_method_and_absent_members_are_none(tmp_path: pathlib.Path) -> None:
    from cc_app_server._client import _decode_notification
    unknown = _decode_notification('{"jsonrpc":"2.0","method":"future/thing","params":{}}')
    assert isinstance(unknown, p.UnknownCase) and unknown.method == "future/thing"
    # `state_dir` takes a path object.
    with cc.AppServer.open(tmp_path / "state") as server, server.blocking_client() as client:
        started = client.thread_start(thread_id="n")
        # Optional members the server left out read as None, not as a marker.
        assert started.thread.title is None
        page = client.thread_list()
        assert page.unreadable is None


def test_a_traceparent_reaches_every_event_of_the_turn(server: cc.AppServer) -> None:
    # docs/rollout-format.md, "Trace and parent ids".
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with server.blocking_client() as client:
        client.thread_start(thread_id="traced", agent_options=script("traced"),
                            traceparent=f"00-0af7651916cd43dd8448eb211c80319c-{span}-01")
        stream = client.turn("traced", "hello", traceparent=f"00-{trace}-{span}-01", timeout=20)
        assert stream.text() == "traced"
        events = client.thread_read("traced").events
        assert events[0].trace_id == "0af7651916cd43dd8448eb211c80319c"
        turn = [e for e in events if e.trace_id == trace]
        assert isinstance(turn[0].payload, p.TurnStartedEvent) and turn[0].parent_id == f"span:{span}"
        assert isinstance(turn[-1].payload, p.TurnCompletedEvent) and len(turn) >= 6
        assert all(e.parent_id is not None and int(e.parent_id) < e.seq for e in turn[1:])
        with pytest.raises(cc.InvalidParams):
            client.turn_start("traced", "again", traceparent=f"00-{'0' * 32}-{span}-01")
