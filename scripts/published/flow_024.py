"""The flow through a minimal stdio JSON-RPC client of ours, validated by chainlesschain-agent-sdk
0.2.4 (which has no App Server client of its own).

    python flow_024.py BIN

It launches `BIN serve --app-server --app-server-state-dir DIR`, writes one JSON object per line,
reads one per line, and reports every line in both directions to the session, which checks it with
0.2.4's `validate_protocol_message` and the published objects with `validate_protocol_definition`.
Unlike 0.2.9's client it keeps reading after an invalid message (the problem is recorded), so one
bad message does not hide the next. Request ids are integers (0.2.9's client covers string ids).
Without a request handler it answers approval/decide the way 0.2.9's client does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, Mapping, Optional

from chainlesschain_agent_sdk.generated_app_protocol import (
    CC_AGENT_PROTOCOL_FEATURES,
    CC_AGENT_PROTOCOL_MIN_VERSION,
    CC_AGENT_PROTOCOL_VERSION,
)

import common
from common import Adapter, ClientBroken, Hooks, RpcError

MAX_LINE = 8 * 1024 * 1024


class OwnClient(Adapter):
    raw = True
    id_example = 1

    def __init__(self, bin_path: str, state_dir: str, hooks: Hooks) -> None:
        self.argv = [bin_path, "serve", "--app-server", "--app-server-state-dir", state_dir]
        self.hooks = hooks
        self.process: Optional[asyncio.subprocess.Process] = None
        self.pending: Dict[int, "asyncio.Future[Any]"] = {}
        self.next_id = 0
        self.reader: Optional["asyncio.Task[None]"] = None
        self.stderr_reader: Optional["asyncio.Task[None]"] = None
        self.stopped: Optional[str] = None
        self._stderr = ""
        self._write_lock = asyncio.Lock()

    async def start(self) -> Any:
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=MAX_LINE,
            )
        except OSError as error:
            raise ClientBroken(f"could not launch {self.argv[0]}: {error}") from None
        self.reader = asyncio.create_task(self._read())
        self.stderr_reader = asyncio.create_task(self._read_stderr())
        return await self.request(
            "initialize",
            {
                "protocolVersion": CC_AGENT_PROTOCOL_VERSION,
                "minimumProtocolVersion": CC_AGENT_PROTOCOL_MIN_VERSION,
                "client": {"name": "cc-app-server published-0.2.4 conformance", "version": "1"},
                "features": list(CC_AGENT_PROTOCOL_FEATURES),
            },
        )

    async def _write(self, message: Mapping[str, Any], expect_valid: bool = True) -> None:
        process = self.process
        if process is None or process.stdin is None or process.stdin.is_closing():
            raise ClientBroken("the server's stdin is closed")
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        self.hooks.sent(json.loads(line), expect_valid)
        async with self._write_lock:
            try:
                process.stdin.write(line.encode("utf-8") + b"\n")
                await process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as error:
                raise ClientBroken(f"writing to the server: {error}") from None

    async def request(self, method: str, params: Mapping[str, Any], expect_valid: bool = True) -> Any:
        if self.stopped:
            raise ClientBroken(self.stopped)
        self.next_id += 1
        request_id = self.next_id
        future: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        try:
            await self._write(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}, expect_valid
            )
            return await asyncio.wait_for(asyncio.shield(future), common.REQUEST_TIMEOUT)
        except asyncio.TimeoutError:
            raise ClientBroken(f"no answer to {method} within {common.REQUEST_TIMEOUT:.0f} s") from None
        finally:
            self.pending.pop(request_id, None)

    async def _read(self) -> None:
        process = self.process
        assert process is not None and process.stdout is not None
        reason = "the server closed stdout"
        try:
            while True:
                try:
                    line = await process.stdout.readline()
                except ValueError:
                    reason = f"a line longer than {MAX_LINE} bytes"
                    break
                if not line:
                    break
                if not line.endswith(b"\n"):
                    self.hooks.problem(f"a final line without a newline: {common.short(line.decode(errors='replace'))}")
                    break
                try:
                    message = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as error:
                    self.hooks.problem(f"received a line that is not JSON ({error}): {common.short(line.decode(errors='replace'))}")
                    continue
                if not isinstance(message, dict):
                    self.hooks.problem(f"received a line that is not an object: {common.short(message)}")
                    continue
                self.hooks.received(message)
                await self._dispatch(message)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug in a hook must not hang the flow
            reason = f"reader failed: {type(error).__name__}: {error}"
        self.stopped = reason
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ClientBroken(reason))

    async def _dispatch(self, message: Dict[str, Any]) -> None:
        if "method" in message and "id" in message:
            handler = self.hooks.on_server_request
            if handler is None:
                result: Any = {"kind": "decline", "reason": common.NO_HANDLER_REASON}
                await self._write({"jsonrpc": "2.0", "id": message["id"], "result": result})
                return
            try:
                result = handler(message)
            except Exception as error:
                await self._write(
                    {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32603, "message": str(error)}}
                )
                return
            await self._write({"jsonrpc": "2.0", "id": message["id"], "result": result})
            return
        if "method" in message:
            self.hooks.on_notification(message)
            return
        future = self.pending.get(message.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            self.hooks.problem(f"a response to no pending request: {common.short(message)}")
            return
        if "error" in message:
            body = message.get("error") or {}
            future.set_exception(RpcError(body.get("code"), str(body.get("message")), body.get("data")))
        else:
            future.set_result(message.get("result"))

    async def _read_stderr(self) -> None:
        process = self.process
        assert process is not None and process.stderr is not None
        while True:
            chunk = await process.stderr.read(4096)
            if not chunk:
                return
            self._stderr = (self._stderr + chunk.decode("utf-8", errors="replace"))[-8192:]

    def broken(self) -> Optional[str]:
        if self.stopped:
            return self.stopped
        if self.process is not None and self.process.returncode is not None:
            return f"the server exited with code {self.process.returncode}"
        return None

    def stderr_tail(self) -> str:
        return self._stderr

    async def close(self) -> None:
        process = self.process
        if process is None:
            return
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), common.CLOSE_TIMEOUT)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
        for task in (self.reader, self.stderr_reader):
            if task is not None:
                try:
                    await asyncio.wait_for(task, 2)
                except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                    task.cancel()
        self.process = None


if __name__ == "__main__":
    common.main(OwnClient, "0.2.4")
