"""The SDK suite runs against the installed wheel (scripts/test-python-sdk.sh installs it into a fresh
venv and runs pytest from outside the source tree). Shared fixtures and the plain summary line."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

import cc_app_server as cc

# Scripts for the built-in scripted kernel (core/kernel/src/scripted.rs).
TOOL_SCRIPT: dict[str, Any] = {"steps": [
    {"type": "tool", "tool": "fs.write", "arguments": {"path": "a.txt", "text": "x"}},
    {"type": "message", "text": "done", "chunks": 2},
]}


def deaf_script(ms: int) -> dict[str, Any]:
    """A kernel stuck in a blocking call for `ms`: interrupts wait for it."""
    return {"steps": [{"type": "message", "text": "in"}, {"type": "ignoreCancel", "ms": ms}]}


def streaming_script(deltas: int, sleep_ms: int = 0) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for i in range(deltas):
        steps.append({"type": "message", "text": f"part {i}", "chunks": 1})
        if sleep_ms:
            steps.append({"type": "sleep", "ms": sleep_ms})
    return {"steps": steps}


@pytest.fixture
def state_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as d:
        yield os.path.join(d, "state")


@pytest.fixture
def server(state_dir: str) -> Iterator[cc.AppServer]:
    with cc.AppServer.open(state_dir, durability="buffered") as s:
        yield s


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    terminalreporter.write_line(f"sdk-pytest: {passed} passed, {failed} failed")
