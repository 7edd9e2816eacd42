"""Logging: the SDK's own diagnostics go to logger `cc_app_server`; the engine's `tracing` records
are bridged into logger `cc_app_server.engine` (children by Rust target, e.g.
`cc_app_server.engine.approval`).

The bridge is the native log listener: the engine hands records to a bounded queue and never waits;
a delivery thread calls into Python, so a slow `logging` handler only makes records drop (counted in
`AppServer.stats().dropped_log_records`), it never blocks a turn.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ._native import ffi

log = logging.getLogger("cc_app_server")
engine_log = logging.getLogger("cc_app_server.engine")

TRACE = 5
_TO_PY = {"ERROR": logging.ERROR, "WARN": logging.WARNING, "INFO": logging.INFO, "DEBUG": logging.DEBUG,
          "TRACE": TRACE}
_lock = threading.Lock()
_installed_level: int | None = None


def _native_level(level: int) -> Any:
    L = ffi.LogLevel
    if level <= TRACE:
        return L.TRACE
    if level <= logging.DEBUG:
        return L.DEBUG
    if level <= logging.INFO:
        return L.INFO
    if level <= logging.WARNING:
        return L.WARN
    return L.ERROR


def _logger_for(target: str) -> logging.Logger:
    rest = target.removeprefix("cc_app_server").lstrip(":")
    if not rest:
        return engine_log
    return logging.getLogger("cc_app_server.engine." + rest.replace("::", "."))


class _Bridge(ffi.LogListener):  # type: ignore[misc]
    def on_log(self, record: Any) -> None:
        level = _TO_PY.get(getattr(record.level, "name", str(record.level)), logging.WARNING)
        logger = _logger_for(record.target)
        if not logger.isEnabledFor(level):
            return
        py = logger.makeRecord(logger.name, level, record.target, 0, record.message, (), None)
        py.created = record.unix_ms / 1000.0
        py.msecs = float(record.unix_ms % 1000)
        logger.handle(py)


def install_engine_logging(level: int | None = None) -> None:
    """Routes the engine's logs into `logging` at `level` (default: the effective level of logger
    `cc_app_server.engine` now). Called by `AppServer.open`; call it again after changing the level.
    The bridge is process-wide."""
    global _installed_level
    if level is None:
        level = engine_log.getEffectiveLevel()
    with _lock:
        if _installed_level == level:
            return
        if not ffi.set_log_listener(_Bridge(), _native_level(level)):
            log.warning("another tracing subscriber owns this process; engine logs go there, not to logging")
        _installed_level = level
