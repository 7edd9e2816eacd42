"""The engine's OpenAI-compatible kernel and workspace tools, chosen from Python: a real HTTP
server on loopback streams Chat Completions in OpenAI's SSE wire format (a tool call, then an
answer); the approved `write_file` runs in the workspace; the key goes out as a bearer token."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import cc_app_server as cc
from cc_app_server import protocol as p


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


REPLIES = [
    sse(delta({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "write_file", "arguments": ""}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"path":"note.txt",'}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": '"content":"from python"}'}}]}),
        delta({}, "tool_calls")),
    sse(delta({"role": "assistant", "content": "Saved "}), delta({"content": "it."}), delta({}, "stop")),
]


class Model(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Model.seen.append((self.headers.get("Authorization", ""), body))
        reply = REPLIES[min(len(Model.seen), len(REPLIES)) - 1]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


def test_openai_kernel_with_workspace_tools(state_dir: str, tmp_path: Path) -> None:
    Model.seen = []
    http = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    model = cc.OpenAI(base_url=f"http://127.0.0.1:{http.server_address[1]}/v1", model="tiny",
                      api_key="sk-python", max_steps=4)

    async def run() -> list[str]:
        with cc.AppServer.open(state_dir, openai=model, workspace_tools=workspace) as server:
            async with server.client(approvals=lambda request: "acceptOnce") as client:
                thread = (await client.thread_start(title="ai")).thread
                await client.turn_start(thread.id, "write a note")
                texts: list[str] = []
                async for note in client.notifications():
                    if isinstance(note, p.ItemDeltaNotification) and isinstance(note.params.delta, p.TextDelta):
                        texts.append(note.params.delta.text)
                    if isinstance(note, p.TurnCompletedNotification):
                        assert note.params.turn.status == "completed", note
                        return texts
        raise AssertionError("no turn/completed")

    try:
        texts = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        http.shutdown()
    assert "".join(texts) == "Saved it."
    assert (workspace / "note.txt").read_text() == "from python"
    assert [auth for auth, _ in Model.seen] == ["Bearer sk-python", "Bearer sk-python"]
    assert Model.seen[0][1]["model"] == "tiny"
    assert "call_1" in json.dumps(Model.seen[1][1]["messages"]), "the tool result went back"


def test_bad_model_settings_are_value_errors(state_dir: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="base URL"):
        cc.AppServer.open(state_dir, openai=cc.OpenAI(base_url="ftp://nowhere", model="m"))
    with pytest.raises(ValueError, match="workspace_tools_dir"):
        cc.AppServer.open(state_dir, workspace_tools=tmp_path / "missing")


def test_a_key_over_plain_http_off_loopback_needs_an_explicit_opt_in(state_dir: str) -> None:
    lan = cc.OpenAI(base_url="http://10.9.8.7/v1", model="m", api_key="sk-secret")
    with pytest.raises(ValueError, match="plain http to 10.9.8.7") as refused:
        cc.AppServer.open(state_dir, openai=lan)
    assert "sk-secret" not in str(refused.value)
    with pytest.raises(ValueError, match="idle_timeout"):
        cc.AppServer.open(state_dir, openai=cc.OpenAI(base_url="http://127.0.0.1:1/v1",
                                                      model="m", idle_timeout=0))
    opted_in = cc.OpenAI(base_url="http://10.9.8.7/v1", model="m", api_key="sk-secret",
                         allow_insecure_http=True, idle_timeout=5, call_deadline=60)
    with cc.AppServer.open(state_dir, openai=opted_in) as server:
        assert server is not None
