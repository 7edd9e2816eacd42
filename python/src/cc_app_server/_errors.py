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
    reason): `code`, `message` and `data` as on the wire."""

    def __init__(self, code: int, message: str, data: Json = None) -> None:
        super().__init__(f"server error {code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class Overloaded(Error):
    """Too many requests in flight, or the server's queue is full: wait `retry_after_ms`, retry."""

    code = OVERLOADED

    def __init__(self, retry_after_ms: int, message: str | None = None) -> None:
        super().__init__(message or f"overloaded; retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class Timeout(Error, TimeoutError):
    """No answer (or no notification) within the timeout. Never read this as success: the request
    may still have taken effect."""

    code = INTERRUPTED


class Closed(Error):
    """The client or the server is closed: nothing more will arrive. Distinct from `Timeout`."""

    code = INTERNAL_ERROR


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
        return ProtocolError(int(e.code), e.reason, data)
    if isinstance(e, E.LineTooLarge):
        return ProtocolError(INVALID_REQUEST, f"request of {e.size} bytes exceeds the {e.max}-byte limit",
                             {"size": int(e.size), "max": int(e.max)})
    if isinstance(e, E.InvalidJson):
        return ProtocolError(PARSE_ERROR, e.reason)
    if isinstance(e, E.InvalidArgument):
        return ProtocolError(INVALID_PARAMS, e.reason)
    return Error(str(e))
