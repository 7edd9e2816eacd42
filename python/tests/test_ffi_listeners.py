"""Listeners over the raw uniffi surface: a notification listener and a connection listener
delivered on background threads, each owned by a TaskHandle that stops the deliveries when it is
cancelled or dropped — including dropped mid-stream. See test_ffi_surface.py for how the
generated module is found.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_DIR = Path(os.environ.get("CC_FFI_PYTHON_DIR", ROOT / "target" / "ffi-python"))
if not (_DIR / "cc_app_server.py").exists():
    pytest.skip(f"no generated uniffi module in {_DIR}; run scripts/test-ffi.sh", allow_module_level=True)
sys.path.insert(0, str(_DIR))
ffi: Any = importlib.import_module("cc_app_server")



@pytest.fixture
def server() -> Iterator[Any]:
    with tempfile.TemporaryDirectory() as d:
        s = ffi.AppServer.open(ffi.ServerOptions(state_dir=os.path.join(d, "s"), durability=ffi.Durability.BUFFERED))
        yield s
        s.shutdown()


class Collect(ffi.NotificationListener):  # type: ignore[misc]
    def __init__(self, stop_after: int | None = None) -> None:
        self.methods: list[str] = []
        self.lock = threading.Lock()
        self.reached = threading.Event()
        self.completed = threading.Event()
        self.closed = threading.Event()
        self.stop_after = stop_after

    def on_notifications(self, messages: list[str]) -> None:
        for text in messages:
            self.on_one(json.loads(text))

    def on_one(self, message: dict[str, Any]) -> None:
        method = message["method"]
        assert message["jsonrpc"] == "2.0" and "id" not in message and isinstance(message["params"], dict)
        with self.lock:
            self.methods.append(method)
            if self.stop_after is not None and len(self.methods) >= self.stop_after:
                self.reached.set()
        if method == "turn/completed":
            self.completed.set()

    def on_closed(self) -> None:
        self.closed.set()

    def count(self) -> int:
        with self.lock:
            return len(self.methods)


def slow_script(deltas: int, sleep_ms: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for i in range(deltas):
        steps.append({"type": "message", "text": f"part {i}", "chunks": 1})
        steps.append({"type": "sleep", "ms": sleep_ms})
    return {"steps": steps}


def start(client: Any, thread_id: str, script: dict[str, Any]) -> None:
    client.request_blocking("thread/start", json.dumps({"threadId": thread_id, "agentOptions": {"script": script}}))
    client.request_blocking("turn/start", json.dumps({"threadId": thread_id, "input": [{"type": "text", "text": "go"}]}))


def test_listener_sees_a_whole_turn(server: Any) -> None:
    client = ffi.Client.connect(server)
    listener = Collect()
    handle = client.listen(listener)
    start(client, "whole", {"steps": [{"type": "message", "text": "hello there", "chunks": 3}]})
    assert listener.completed.wait(20)
    assert listener.methods[0] == "thread/updated" or "turn/started" in listener.methods
    assert listener.methods.count("item/delta") == 3 and listener.methods[-1] == "turn/completed"
    assert not handle.is_finished()
    handle.cancel()
    assert handle.is_finished()
    client.close()


def test_listener_dropped_mid_stream_stops_deliveries(server: Any) -> None:
    client = ffi.Client.connect(server)
    listener = Collect(stop_after=5)
    handle = client.listen(listener)
    start(client, "drop", slow_script(deltas=30, sleep_ms=20))
    assert listener.reached.wait(20)
    del handle  # the last reference: dropping it cancels the task and joins its thread
    gc.collect()
    frozen = listener.count()
    assert frozen < 60, "dropped before the stream ended"
    time.sleep(0.5)  # the turn is still streaming meanwhile
    assert listener.count() == frozen
    assert not listener.completed.is_set()
    # Nothing was lost: the rest is still there for whoever reads next.
    rest = []
    while True:
        text = client.next_notification(2000)
        if text is None:
            break
        rest.append(json.loads(text)["method"])
        if rest[-1] == "turn/completed":
            break
    assert rest and rest[-1] == "turn/completed"
    client.close()


def test_cancel_from_inside_the_callback(server: Any) -> None:
    client = ffi.Client.connect(server)
    holder: dict[str, Any] = {}

    class CancelSelf(Collect):
        def on_one(self, message: dict[str, Any]) -> None:
            if self.count() >= 2:
                return  # the rest of a batch that arrived with the cancelling one
            super().on_one(message)
            if self.count() == 2:
                holder["handle"].cancel()  # from the delivery thread itself: must not deadlock

    listener = CancelSelf()
    holder["handle"] = client.listen(listener)
    start(client, "self", slow_script(deltas=10, sleep_ms=10))
    deadline = time.monotonic() + 10
    while not holder["handle"].is_finished() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert holder["handle"].is_finished()
    assert listener.count() == 2
    client.close()


class Lines(ffi.MessageListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.closed = threading.Event()
        self.got = threading.Event()

    def on_messages(self, messages: list[str]) -> None:
        self.messages.extend(json.loads(m) for m in messages)
        self.got.set()

    def on_closed(self) -> None:
        self.closed.set()


def test_connection_listener_reports_close(server: Any) -> None:
    conn = server.connect()
    lines = Lines()
    handle = conn.listen(lines)
    conn.send(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
        "protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "py", "version": "1"}, "features": []}}))
    assert lines.got.wait(20)
    assert lines.messages[0]["id"] == 7 and "result" in lines.messages[0]
    conn.close()
    assert lines.closed.wait(20)
    deadline = time.monotonic() + 5
    while not handle.is_finished() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.is_finished()


def test_a_raising_listener_is_counted_and_delivery_goes_on(server: Any) -> None:
    client = ffi.Client.connect(server)

    class Flaky(Collect):
        def __init__(self) -> None:
            super().__init__()
            self.batches = 0

        def on_notifications(self, messages: list[str]) -> None:
            self.batches += 1
            super().on_notifications(messages)
            if self.batches % 2 == 1:
                raise RuntimeError("listener bug")

    before = server.stats().listener_errors
    listener = Flaky()
    handle = client.listen(listener)
    start(client, "flaky", slow_script(deltas=6, sleep_ms=20))
    assert listener.completed.wait(20), "a raising listener does not stop the stream"
    assert listener.methods.count("item/delta") == 6
    assert server.stats().listener_errors >= before + 1
    handle.cancel()
    client.close()


def test_listener_hears_close_and_batches_a_fast_stream(server: Any) -> None:
    client = ffi.Client.connect(server)
    sizes: list[int] = []

    class Sizes(Collect):
        def on_notifications(self, messages: list[str]) -> None:
            sizes.append(len(messages))
            super().on_notifications(messages)

    listener = Sizes()
    handle = client.listen(listener)
    start(client, "fast", {"steps": [{"type": "message", "text": "x" * 2000, "chunks": 2000}]})
    assert listener.completed.wait(60)
    assert listener.methods.count("item/delta") == 2000
    assert max(sizes) > 1, "a fast stream arrives in batches"
    assert max(sizes) <= 256, "at most MAX_BATCH (256) per call"
    server.shutdown()
    assert listener.closed.wait(20), "on_closed after the server shut down"
    deadline = time.monotonic() + 5
    while not handle.is_finished() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.is_finished()


class Records(ffi.LogListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.records: list[Any] = []
        self.lock = threading.Lock()

    def on_log(self, record: Any) -> None:
        with self.lock:
            self.records.append(record)

    def find(self, needle: str) -> list[Any]:
        with self.lock:
            return [r for r in self.records if needle in r.message]


def test_diagnostics_reach_a_python_log_listener(server: Any) -> None:
    class Explode(ffi.ApprovalHandler):  # type: ignore[misc]
        def decide(self, request: Any) -> Any:
            raise ValueError("handler bug")

    records = Records()
    ffi.set_log_listener(records, ffi.LogLevel.WARN)
    try:
        client = ffi.Client.connect(server, Explode())
        client.request_blocking("thread/start", json.dumps({"threadId": "logged", "agentOptions": {"script": {"steps": [
            {"type": "tool", "tool": "fs.write", "arguments": {"path": "a"}}]}}}))
        client.request_blocking("turn/start", json.dumps({"threadId": "logged", "input": [{"type": "text", "text": "go"}]}))
        deadline = time.monotonic() + 20
        while not records.find("approval handler failed") and time.monotonic() < deadline:
            time.sleep(0.02)
        [record, *_] = records.find("approval handler failed")
        assert record.level == ffi.LogLevel.WARN and record.target.startswith("cc_app_server")
        assert "handler bug" in record.message and record.unix_ms > 0
        client.close()
    finally:
        ffi.set_log_listener(None, ffi.LogLevel.ERROR)


def test_a_record_logged_inside_a_turn_carries_its_trace_id(server: Any) -> None:
    # docs/rollout-format.md, "Trace and parent ids": host logs and rollouts join on the id.
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    records = Records()
    ffi.set_log_listener(records, ffi.LogLevel.WARN)
    try:
        client = ffi.Client.connect(server)
        client.request_blocking("thread/start", json.dumps({"threadId": "traced", "agentOptions": {"script": {"steps": [
            {"type": "fail", "message": "scripted failure"}]}}}))
        client.request_blocking("turn/start", json.dumps({"threadId": "traced", "input": [{"type": "text", "text": "go"}],
                                                          "traceparent": f"00-{trace}-00f067aa0ba902b7-01"}))
        deadline = time.monotonic() + 20
        while not records.find("scripted failure") and time.monotonic() < deadline:
            time.sleep(0.02)
        [record, *_] = records.find("scripted failure")
        assert record.level == ffi.LogLevel.WARN
        assert f"trace_id={trace}" in record.message and "thread_id=traced" in record.message, record.message
        page = json.loads(client.request_blocking("thread/read", json.dumps({"threadId": "traced"})))
        traced = [e for e in page["events"] if e["traceId"] == trace]
        assert [e["payload"]["type"] for e in traced][0] == "turnStarted"
        assert traced[-1]["payload"]["type"] == "turnCompleted"
        client.close()
    finally:
        ffi.set_log_listener(None, ffi.LogLevel.ERROR)
