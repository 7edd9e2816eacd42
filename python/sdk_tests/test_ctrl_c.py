"""Ctrl-C interrupts a blocking wait within 100 ms: a real SIGINT sent to a child Python process
blocked in `for note in client.notifications()` or in a blocking request."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

CHILD = textwrap.dedent("""
    import signal, sys, tempfile, time
    import cc_app_server as cc
    from cc_app_server import protocol as p

    # A shell's background job starts with SIGINT ignored, and Python then keeps it ignored: be
    # the interactive program whose Ctrl-C this test is about, whatever launched the test.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    mode = sys.argv[1]
    with tempfile.TemporaryDirectory() as d, cc.AppServer.open(d + "/s", durability="buffered",
                                                               settle_deadline=30) as server:
        client = server.blocking_client(request_timeout=60)
        if mode == "request":
            deaf = {"steps": [{"type": "message", "text": "in"}, {"type": "ignoreCancel", "ms": 3000}]}
            client.thread_start(thread_id="t", agent_options=p.AgentOptions(script=deaf))
            turn = client.turn_start("t", "go").turn
            for note in client.notifications(timeout=20):
                if isinstance(note, p.ItemCompletedNotification):
                    break
        try:
            print("ready", flush=True)
            if mode == "request":
                client.turn_interrupt("t", turn.id)  # waits for a kernel deaf for 3 s
            else:
                for note in client.notifications():  # nothing will ever come
                    pass
        except KeyboardInterrupt:
            print(f"interrupted {time.monotonic():.6f}", flush=True)
        client.close()
""")


@pytest.mark.parametrize("mode", ["notifications", "request"])
def test_ctrl_c_interrupts_a_blocking_wait_within_100_ms(mode: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE, text=True,
                             cwd=tempfile.gettempdir())  # outside the source tree
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # well inside the blocking wait
        sent = time.monotonic()  # CLOCK_MONOTONIC: the same clock in both processes
        child.send_signal(signal.SIGINT)
        # A child that never reacts must fail the test, not hang it.
        watchdog = threading.Timer(30, child.kill)
        watchdog.start()
        try:
            line = child.stdout.readline().split()
        finally:
            watchdog.cancel()
        assert line and line[0] == "interrupted", line
        latency = float(line[1]) - sent
        assert 0 <= latency < 0.1, f"KeyboardInterrupt {latency * 1000:.1f} ms after SIGINT"
        # (Shutdown then interrupts the deaf turn, waiting for it to settle.)
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
