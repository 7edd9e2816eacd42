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
        self.stop_after = stop_after

    def on_notification(self, method: str, params_json: str) -> None:
        json.loads(params_json)
        with self.lock:
            self.methods.append(method)
            if self.stop_after is not None and len(self.methods) >= self.stop_after:
                self.reached.set()
        if method == "turn/completed":
            self.completed.set()

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
        def on_notification(self, method: str, params_json: str) -> None:
            super().on_notification(method, params_json)
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

    def on_message(self, message: str) -> None:
        self.messages.append(json.loads(message))
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
