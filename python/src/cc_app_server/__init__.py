"""CC App Server for Python: the Rust agent engine in-process, an asyncio-first SDK, typed wire-v1
events.

    import cc_app_server as cc
    from cc_app_server.protocol import TurnCompletedNotification

    with cc.AppServer.open("state") as server:
        async with server.client(approvals=lambda request: "acceptOnce") as client:
            ...

The generated protocol types (one class per wire shape, `decode_*`/`encode_*`) are
`cc_app_server.protocol`. Diagnostics go to logger `cc_app_server`, the engine's own logs to
`cc_app_server.engine`.
"""

from __future__ import annotations

from . import protocol
from ._approvals import ApprovalHandler, Decision, DecisionName
from ._client import AsyncClient, BlockingClient, BlockingTurnStream, LazyItemDeltaNotification, TurnStream
from ._errors import (Closed, Conflict, Error, InvalidParams, KernelFailed, NotFound, Overloaded, ProtocolError,
                      StoreDamaged, StoreError, StoreLocked, StoreUnsafe, Timeout, TurnCancelled, TurnInterrupted)
from ._kernel import Kernel, KernelLike, ToolExecutor, ToolsLike, TurnContext, TurnInput
from ._logging import install_engine_logging
from ._native import ffi as _ffi
from ._server import AppServer, Durability, OpenAI, Policy, ServerStats, Store
from ._store import EventPage, RolloutEvent, RolloutStore, ThreadPage, ThreadSummary, VerifyReport

__version__: str = _ffi.library_version()
PROTOCOL_VERSION: int = _ffi.protocol_version()
SCHEMA_DIGEST: str = _ffi.schema_digest()

__all__ = [
    "ApprovalHandler",
    "AppServer",
    "AsyncClient",
    "BlockingClient",
    "BlockingTurnStream",
    "Closed",
    "Conflict",
    "Decision",
    "DecisionName",
    "Durability",
    "Error",
    "install_engine_logging",
    "InvalidParams",
    "Kernel",
    "KernelFailed",
    "KernelLike",
    "LazyItemDeltaNotification",
    "NotFound",
    "OpenAI",
    "Overloaded",
    "Policy",
    "protocol",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "RolloutEvent",
    "RolloutStore",
    "SCHEMA_DIGEST",
    "ServerStats",
    "EventPage",
    "ThreadPage",
    "ThreadSummary",
    "VerifyReport",
    "Store",
    "StoreDamaged",
    "StoreError",
    "StoreLocked",
    "StoreUnsafe",
    "Timeout",
    "ToolExecutor",
    "ToolsLike",
    "TurnCancelled",
    "TurnContext",
    "TurnInput",
    "TurnInterrupted",
    "TurnStream",
]
