"""The SDK's one small error hierarchy, and the mapping from the native layer's error enums.

Every failure a caller can act on is an `Error`; the subclasses carry what the wire carries
(`code`, `message`, `data`, `retry_after_ms`), so code never has to parse messages.
"""

from __future__ import annotations

import json
from typing import Any

from .protocol import ErrorCode, Json

# Wire v1 error codes, from the generated `ErrorCode` (one per error class of the schema).
PARSE_ERROR = ErrorCode.PARSE
INVALID_REQUEST = ErrorCode.INVALID_REQUEST
METHOD_NOT_FOUND = ErrorCode.METHOD_NOT_FOUND
INVALID_PARAMS = ErrorCode.INVALID_PARAMS
INTERNAL_ERROR = ErrorCode.INTERNAL
OVERLOADED = ErrorCode.OVERLOADED
NOT_INITIALIZED = ErrorCode.NOT_INITIALIZED
NOT_FOUND = ErrorCode.NOT_FOUND
CONFLICT = ErrorCode.CONFLICT
INTERRUPTED = ErrorCode.INTERRUPTED

class Error(Exception):
    """Base of every error the SDK raises. `code` is the JSON-RPC code it stands for."""

    code: int = INTERNAL_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ProtocolError(Error):
    """The server answered with a JSON-RPC error (or the request was refused locally for the same
    reason): `code`, `message` and `data` as on the wire. The classes of the protocol's common
    errors are subclasses (`NotFound`, `Conflict`, `InvalidParams`); any other code is a plain
    `ProtocolError`."""

    def __init__(self, code: int, message: str, data: Json = None) -> None:
        super().__init__(f"server error {code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class NotFound(ProtocolError):
    """No such thread, turn, run or item (-32004)."""

    def __init__(self, message: str, data: Json = None, code: int = NOT_FOUND) -> None:
        super().__init__(code, message, data)


class Conflict(ProtocolError):
    """The request conflicts with the current state (-32009): a turn already running on the
    thread, an idempotency key reused with other params."""

    def __init__(self, message: str, data: Json = None, code: int = CONFLICT) -> None:
        super().__init__(code, message, data)


class InvalidParams(ProtocolError, ValueError):
    """The params were refused (-32602): by the server, or locally before sending (JSON that is
    not an object, an argument out of range)."""

    def __init__(self, message: str, data: Json = None, code: int = INVALID_PARAMS) -> None:
        super().__init__(code, message, data)


class Overloaded(Error):
    """Too many requests in flight, or the server's queue is full (-32001): wait
    `retry_after_ms`, retry."""

    code = OVERLOADED

    def __init__(self, retry_after_ms: int, message: str | None = None) -> None:
        super().__init__(message or f"overloaded; retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class Timeout(Error, TimeoutError):
    """No answer (or no notification) within the timeout (-32010). Never read this as success:
    the request may still have taken effect."""

    code = INTERRUPTED


class Closed(Error):
    """The client, the server or the store is closed or shut down: nothing more will arrive.
    Distinct from `Timeout`."""

    code = INTERNAL_ERROR


class StoreError(Error):
    """The rollout store failed (I/O, SQLite, anything without a class of its own). The classes
    below say which fix applies."""

    code = INTERNAL_ERROR


class StoreLocked(StoreError):
    """Another store holds the state directory: another process, or another `AppServer` /
    store of this process on the same directory. Close that one, or use another directory."""


class StoreUnsafe(StoreError):
    """The state directory is not a private directory (a regular file, a symlink, or group/world
    access): fix the path or its mode."""


class StoreDamaged(StoreError):
    """A log is corrupt or does not match its head anchor: restore it from a backup."""


class KernelFailed(Error):
    """A turn ended `failed`. `reason` is the turn error's code (`kernelFailed`, `kernelPanicked`,
    `recordingFailed`, `outputLimitExceeded`…), `message` its message, `turn_id` the turn."""

    code = INTERNAL_ERROR

    def __init__(self, reason: str, message: str, turn_id: str) -> None:
        super().__init__(f"turn {turn_id} failed ({reason}): {message}")
        self.reason = reason
        self.message = message
        self.turn_id = turn_id


class TurnInterrupted(Error):
    """A turn ended `interrupted` (raised by the per-turn `text()` convenience): interrupted by
    `turn_interrupt`, a shutdown, or cancelled at an approval."""

    code = INTERRUPTED

    def __init__(self, turn_id: str, message: str | None = None) -> None:
        super().__init__(message or f"turn {turn_id} was interrupted")
        self.turn_id = turn_id


class TurnCancelled(Error):
    """Raised inside a Python kernel when its turn was cancelled (interrupt, shutdown, or the user
    cancelled at an approval); let it propagate, or raise it yourself to stop the turn."""

    code = INTERRUPTED


def _data(text: str | None) -> Json:
    if text is None:
        return None
    try:
        value: Json = json.loads(text)
        return value
    except ValueError:
        return text


def from_client_error(e: Any, ffi: Any) -> Error:
    """The SDK error for a native `ClientError` variant."""
    E = ffi.ClientError
    if isinstance(e, E.Overloaded):
        return Overloaded(int(e.retry_after_ms))
    if isinstance(e, E.Timeout):
        return Timeout("no answer within the request timeout")
    if isinstance(e, E.Closed):
        return Closed("the client is closed")
    if isinstance(e, E.Protocol):
        data = _data(e.data)
        if e.code == OVERLOADED:
            retry = data.get("retry_after_ms") if isinstance(data, dict) else None
            return Overloaded(retry if isinstance(retry, int) else 100, f"server overloaded: {e.reason}")
        return protocol_error(int(e.code), e.reason, data)
    if isinstance(e, E.LineTooLarge):
        return ProtocolError(INVALID_REQUEST, f"request of {e.size} bytes exceeds the {e.max}-byte limit",
                             {"size": int(e.size), "max": int(e.max)})
    if isinstance(e, (E.InvalidJson, E.InvalidArgument)):
        return InvalidParams(e.reason)
    return Error(str(e))


def protocol_error(code: int, message: str, data: Json = None) -> ProtocolError:
    """The class of a JSON-RPC error by its code."""
    if code == NOT_FOUND:
        return NotFound(message, data)
    if code == CONFLICT:
        return Conflict(message, data)
    if code == INVALID_PARAMS:
        return InvalidParams(message, data)
    return ProtocolError(code, message, data)


def from_server_error(e: Any, ffi: Any, state_dir: str) -> Error:
    """The SDK error for a native `ServerError` (open or a call on a shut-down server). An invalid
    configuration is `InvalidParams` (a `ValueError`, as before)."""
    S = ffi.ServerError
    if isinstance(e, S.InvalidConfig):
        return InvalidParams(e.reason)
    if isinstance(e, S.Store):
        K = ffi.StoreFailure
        cls: type[StoreError] = {K.LOCKED: StoreLocked, K.UNSAFE: StoreUnsafe,
                                 K.DAMAGED: StoreDamaged}.get(e.kind, StoreError)
        return cls(f"cannot open the rollout store in {state_dir}: {e.reason}")
    if isinstance(e, S.ShutDown):
        return Closed("the server is shut down; open a new one")
    if isinstance(e, S.Overloaded):
        return Overloaded(int(e.retry_after_ms),
                          "the server's connections are all in use (max_connections); close one "
                          f"or retry after {int(e.retry_after_ms)} ms")
    return Error(str(e))


def from_store_error(e: Any, ffi: Any) -> Error:
    """The SDK error for a native `StoreError` (the `RolloutStore` API)."""
    S = ffi.StoreError
    if isinstance(e, S.NotFound):
        return NotFound(e.reason)
    if isinstance(e, S.AlreadyExists):
        return Conflict(e.reason)
    if isinstance(e, S.InvalidArgument):
        return InvalidParams(e.reason)
    if isinstance(e, (S.Corrupt, S.AnchorMismatch)):
        return StoreDamaged(e.reason)
    if isinstance(e, S.UnsafeStateDir):
        return StoreUnsafe(e.reason)
    if isinstance(e, S.Locked):
        return StoreLocked(e.reason)
    if isinstance(e, S.Closed):
        return Closed("the rollout store is closed; open it again")
    return StoreError(getattr(e, "reason", str(e)))
