"""The flow through chainlesschain-agent-sdk 0.2.9's own `AppServerClient`, used unchanged.

    python flow_029.py BIN

The client launches `BIN serve --app-server --app-server-store jsonl --app-server-state-dir DIR`
itself and validates every message it reads with the package's `validate_protocol_message` (an
invalid one stops its reader; the session reports that). Nothing in the package is patched: the
session validates what the client is asked to send (the dicts given to `request()`, the decisions
the handler returns, the initialize it builds from the package's constants) and what it hands back.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Dict, Mapping, Optional

from chainlesschain_agent_sdk import AppServerClient, AppServerClientOptions, AppServerRpcError
from chainlesschain_agent_sdk.generated_app_protocol import (
    CC_AGENT_PROTOCOL_FEATURES,
    CC_AGENT_PROTOCOL_MIN_VERSION,
    CC_AGENT_PROTOCOL_VERSION,
)

import common
from common import Adapter, ClientBroken, Hooks, RpcError

TIMEOUT_PREFIX = "App Server request timed out"


class Client029(Adapter):
    raw = False
    id_example = "1"  # the package numbers its requests "1", "2", ...

    def __init__(self, bin_path: str, state_dir: str, hooks: Hooks) -> None:
        self.options = AppServerClientOptions(
            cli_path=bin_path,
            state_directory=state_dir,
            storage_backend="jsonl",
            request_timeout_seconds=common.REQUEST_TIMEOUT,
        )
        self.client = AppServerClient(
            self.options,
            on_server_request=hooks.on_server_request,
            on_notification=hooks.on_notification,
        )

    def initialize_envelope(self) -> Optional[Dict[str, Any]]:
        # Exactly what AppServerClient.start() writes, from the same public constants.
        return {
            "jsonrpc": "2.0",
            "id": "1",
            "method": "initialize",
            "params": {
                "protocolVersion": CC_AGENT_PROTOCOL_VERSION,
                "minimumProtocolVersion": CC_AGENT_PROTOCOL_MIN_VERSION,
                "client": {"name": self.options.client_name, "version": self.options.client_version},
                "features": list(self.options.features or tuple(CC_AGENT_PROTOCOL_FEATURES)),
            },
        }

    async def _call(self, started: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(started)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.05)
                if not task.done() and self.broken():
                    # Give a rejection already under way a moment to arrive.
                    await asyncio.wait({task}, timeout=0.2)
                    if not task.done():
                        raise ClientBroken(str(self.broken()))
            return task.result()
        except AppServerRpcError as error:
            if error.code == -32010 and str(error).startswith(TIMEOUT_PREFIX):
                raise ClientBroken(str(error)) from None
            raise RpcError(error.code, str(error), error.data) from None
        except (ValueError, RuntimeError) as error:
            # The reader rejects pending requests with the validation error of the bad message.
            raise ClientBroken(f"{type(error).__name__}: {error}") from None
        finally:
            if not task.done():
                task.cancel()

    async def start(self) -> Any:
        try:
            return await self._call(self.client.start())
        except (OSError, FileNotFoundError) as error:
            raise ClientBroken(f"could not launch: {error}") from None

    async def request(self, method: str, params: Mapping[str, Any], expect_valid: bool = True) -> Any:
        return await self._call(self.client.request(method, params))

    def broken(self) -> Optional[str]:
        # Read-only looks at the client's state, to fail fast instead of waiting for a timeout.
        process = getattr(self.client, "_process", None)
        reader = getattr(self.client, "_stdout_task", None)
        if process is not None and process.returncode is not None:
            return f"the server exited with code {process.returncode}"
        if reader is not None and reader.done():
            return ("the published client stopped reading: a message failed its "
                    "validate_protocol_message, or stdout closed")
        return None

    def stderr_tail(self) -> str:
        return str(getattr(self.client, "stderr_tail", ""))

    async def close(self) -> None:
        await self.client.close()


if __name__ == "__main__":
    common.main(Client029, "0.2.9")
