"""`AppServer`: one in-process engine over one state directory, and the clients connected to it."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from types import TracebackType
from collections.abc import Mapping
from typing import Any, Literal

from ._approvals import ApprovalHandler
from ._client import AsyncClient, BlockingClient, _Options
from ._errors import Closed, from_server_error
from ._kernel import KernelLike, NativeKernel, NativeTools, ToolsLike
from ._logging import install_engine_logging
from ._native import ffi
from ._store import RolloutStore

Store = Literal["jsonl", "sqlite"]
Durability = Literal["sync", "buffered", "ephemeral"]
Policy = Literal["ask_every_time", "auto_approve", "deny_all"]
Profile = Literal["standard", "compact"]


@dataclass(frozen=True)
class OpenAI:
    """Run turns on an OpenAI-compatible model (OpenAI, Ollama, vLLM, llama.cpp, LM Studio…) with
    the engine's streaming kernel (docs/kernels.md). `api_key` absent: `CC_APP_SERVER_API_KEY`,
    else `OPENAI_API_KEY`, else none (what local servers want); it is never recorded or logged.
    A thread's `agent_options` `model` / `instructions` override these for that thread.
    `idle_timeout` (seconds, default 60) ends a turn whose model sends nothing but keep-alives
    (`modelStalled`); `call_deadline` (default 600) bounds one model call (`modelDeadlineExceeded`).
    A key goes over plain `http://` only to a loopback host unless `allow_insecure_http`."""

    base_url: str
    model: str
    api_key: str | None = None
    instructions: str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None
    max_steps: int | None = None
    request_timeout: float | None = None
    idle_timeout: float | None = None
    call_deadline: float | None = None
    allow_insecure_http: bool = False

    def _native(self) -> Any:
        return ffi.OpenAiOptions(
            base_url=self.base_url, model=self.model, api_key=self.api_key,
            instructions=self.instructions, temperature=self.temperature,
            max_output_tokens=self.max_output_tokens, max_steps=self.max_steps,
            request_timeout_ms=_ms("request_timeout", self.request_timeout),
            idle_timeout_ms=_ms("idle_timeout", self.idle_timeout),
            call_deadline_ms=_ms("call_deadline", self.call_deadline),
            allow_insecure_http=self.allow_insecure_http)


@dataclass(frozen=True)
class ServerStats:
    """The engine's counters (they never go down) and its memory gauges (bounded caches; the
    index holds one summary per thread on disk)."""

    tools_executed: int
    ignored_responses: int
    closed_slow_consumers: int
    listener_errors: int
    dropped_log_records: int
    indexed_threads: int = 0
    loaded_threads: int = 0
    tail_cache_bytes: int = 0


def _choice(name: str, value: str, table: dict[str, Any]) -> Any:
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{name} must be one of {sorted(table)}, got {value!r}") from None


def _policy(value: Policy) -> Any:
    P = ffi.ApprovalPolicy
    return _choice("policy", value, {"ask_every_time": P.ASK_EVERY_TIME, "auto_approve": P.AUTO_APPROVE,
                                     "deny_all": P.DENY_ALL})


def _ms(name: str, seconds: float | None) -> int | None:
    if seconds is None:
        return None
    if seconds < 0:
        raise ValueError(f"{name} must not be negative (got {seconds})")
    return int(seconds * 1000)


class AppServer:
    """An in-process app server. `AppServer.open(...)`, use it as a (async) context manager or call
    `close()`; connect with `server.client(...)` (asyncio) or `server.blocking_client(...)`."""

    def __init__(self, native: Any) -> None:
        self._native: Any = native

    @classmethod
    def open(cls, state_dir: str | os.PathLike[str], *, store: Store = "jsonl", durability: Durability = "sync",
             policy: Policy = "ask_every_time", workspace: str | None = None,
             script: Mapping[str, Any] | None = None,
             kernel: KernelLike | None = None, tools: ToolsLike | None = None,
             approval_timeout: float | None = None, settle_deadline: float | None = None,
             max_line_bytes: int | None = None, inbound_messages: int | None = None,
             outbound_messages: int | None = None, outbound_stall: float | None = None,
             rollout_key: bytes | None = None, openai: OpenAI | None = None,
             workspace_tools: str | os.PathLike[str] | None = None,
             profile: Profile = "standard") -> AppServer:
        """Opens the engine on `state_dir` (created 0700; torn tails repaired, turns a previous
        process left running closed). `script` (a JSON object) drives the built-in scripted kernel;
        `openai` runs turns on an OpenAI-compatible model instead; `workspace_tools` (an existing
        directory) runs approved tools with the workspace tool set confined to it (`read_file`,
        `write_file`, `list_directory`, `run_command`). `kernel` and `tools` replace the kernel
        and tool executor with Python ones (they win over the above). `outbound_stall`: how long a
        client that reads nothing while its queue is full keeps its connection (default 30 s).
        `rollout_key` (32 bytes, from your key store) turns on keyed tamper evidence
        (docs/rollout-format.md); it is never written anywhere. `profile="compact"` starts from
        the small-device bounds (8 connections, 16 loaded threads, a 512 KiB tail cache; the
        options above still win; docs/engine.md, "Small devices"). Timeouts are in seconds.
        Raises `ValueError` for a bad option (`InvalidParams` when the engine refuses it), and
        `StoreLocked`, `StoreUnsafe`, `StoreDamaged` or `StoreError` when the store cannot be
        opened."""
        install_engine_logging()
        S, D = ffi.StoreKind, ffi.Durability
        options = ffi.ServerOptions(
            state_dir=os.fspath(state_dir),
            store=_choice("store", store, {"jsonl": S.JSONL, "sqlite": S.SQLITE}),
            durability=_choice("durability", durability,
                               {"sync": D.SYNC, "buffered": D.BUFFERED, "ephemeral": D.EPHEMERAL}),
            policy=_policy(policy), workspace=workspace,
            script_json=None if script is None else json.dumps(script),
            approval_timeout_ms=_ms("approval_timeout", approval_timeout),
            settle_deadline_ms=_ms("settle_deadline", settle_deadline), max_line_bytes=max_line_bytes,
            inbound_messages=inbound_messages, outbound_messages=outbound_messages,
            outbound_stall_ms=_ms("outbound_stall", outbound_stall), rollout_key=rollout_key,
            openai=None if openai is None else openai._native(),
            workspace_tools_dir=None if workspace_tools is None else os.fspath(workspace_tools),
            profile=_choice("profile", profile, {"standard": ffi.ServerProfile.STANDARD,
                                                 "compact": ffi.ServerProfile.COMPACT}))
        native_kernel = None if kernel is None else NativeKernel(kernel)
        native_tools = None if tools is None else NativeTools(tools)
        try:
            return cls(ffi.AppServer.open(options, native_kernel, native_tools))
        except ffi.ServerError as e:
            raise from_server_error(e, ffi, os.fspath(state_dir)) from None

    def _require(self) -> Any:
        if self._native is None:
            raise Closed("the server is closed; open a new one")
        return self._native

    def client(self, approvals: ApprovalHandler | None = None, *, request_timeout: float | None = None,
               max_pending: int | None = None, approval_timeout: float | None = None,
               notification_capacity: int | None = None) -> AsyncClient:
        """An asyncio client: `async with server.client(approvals=decide) as client:` connects and
        performs the handshake. `approvals` (plain or `async def`) decides tool approvals; without
        one, or when it fails, every approval is declined (and logged on `cc_app_server`)."""
        self._require()
        return AsyncClient(self, approvals,
                           _Options(request_timeout, max_pending, approval_timeout, notification_capacity))

    def blocking_client(self, approvals: ApprovalHandler | None = None, *, request_timeout: float | None = None,
                        max_pending: int | None = None, approval_timeout: float | None = None,
                        notification_capacity: int | None = None) -> BlockingClient:
        """A connected blocking client (same methods as `client`, without `await`)."""
        return BlockingClient(self, approvals,
                              _Options(request_timeout, max_pending, approval_timeout, notification_capacity))

    def stats(self) -> ServerStats:
        s = self._require().stats()
        return ServerStats(tools_executed=int(s.tools_executed), ignored_responses=int(s.ignored_responses),
                           closed_slow_consumers=int(s.closed_slow_consumers),
                           listener_errors=int(s.listener_errors), dropped_log_records=int(s.dropped_log_records),
                           indexed_threads=int(s.store_indexed_threads), loaded_threads=int(s.store_loaded_threads),
                           tail_cache_bytes=int(s.tail_cache_bytes))

    def store(self) -> RolloutStore:
        """The server's rollout store, to read and verify logs while it runs."""
        return RolloutStore(self._require().store())

    def set_policy(self, policy: Policy) -> None:
        """Changes the approval policy; grants made under the old one lapse."""
        self._require().set_policy(_policy(policy))

    def set_workspace(self, workspace: str) -> None:
        """Changes the workspace approvals are bound to; grants for the old one lapse."""
        self._require().set_workspace(workspace)

    @property
    def closed(self) -> bool:
        return self._native is None

    def close(self) -> None:
        """Interrupts live turns (waiting for each to settle), closes every client (their iterators
        end with `Closed`) and flushes the store. Idempotent."""
        native, self._native = self._native, None
        if native is not None:
            native.shutdown()

    async def aclose(self) -> None:
        """`close` without blocking the event loop while turns settle."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __enter__(self) -> AppServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> AppServer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
