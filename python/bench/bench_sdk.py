"""The Python SDK benchmark (python/bench/run.sh): request round trips and notifications per second
delivered to Python, through the installed wheel, next to the Rust client (printed by the Rust leg
of run.sh). One JSON line per measurement.

Notifications are measured two ways:
- drain: the engine first streams N deltas into the client's buffer (the turn completes), then the
  reader is timed alone, up to turn/completed: what the FFI and the Python layer cost per
  notification (median of REPEAT runs);
- live: the reader runs while the engine produces: end to end, bounded by the engine itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import cc_app_server as cc
from cc_app_server import protocol as p


def report(path: str, samples: list[int]) -> None:
    samples.sort()
    n = len(samples)
    print(json.dumps({"path": path, "n": n, "p50_ns": samples[n // 2], "p90_ns": samples[n * 9 // 10],
                      "mean_ns": sum(samples) // n}), flush=True)


def timed(n: int, f: Callable[[], object]) -> list[int]:
    out = []
    for i in range(n + n // 10):
        t = time.perf_counter_ns()
        f()
        if i >= n // 10:
            out.append(time.perf_counter_ns() - t)
    return out


def round_trips(server: cc.AppServer, n: int) -> None:
    with server.blocking_client() as client:
        client.thread_start(thread_id="rt")
        native = client._native
        report("python raw Client.request_blocking", timed(n, lambda: native.request_blocking("thread/list", '{"limit":1}')))
        report("python sdk BlockingClient.thread_list (main thread, Ctrl-C-safe)", timed(n, lambda: client.thread_list(limit=1)))
        out: list[int] = []
        worker = threading.Thread(target=lambda: out.extend(timed(n, lambda: client.thread_list(limit=1))))
        worker.start()
        worker.join()
        report("python sdk BlockingClient.thread_list (worker thread)", out)

    async def run_async(old: bool) -> list[int]:
        async with server.client() as client:
            native = client._native
            samples = []
            m = n // 4
            for i in range(m + m // 10):
                t = time.perf_counter_ns()
                if old:
                    # What the SDK awaited before issue 25: uniffi's async `request`, which starts
                    # a native thread per call.
                    json.loads(await native.request("thread/list", '{"limit":1}'))
                else:
                    await client.thread_list(limit=1)
                if i >= m // 10:
                    samples.append(time.perf_counter_ns() - t)
            return samples

    # Side by side, interleaved in blocks, so both see the same machine load.
    old: list[int] = []
    new: list[int] = []
    for _ in range(4):
        old.extend(asyncio.run(run_async(True)))
        new.extend(asyncio.run(run_async(False)))
    report("python old: await raw uniffi Client.request (a native thread per call)", old)
    report("python sdk await AsyncClient.thread_list (reused threads)", new)


def stream_script(n: int) -> p.AgentOptions:
    return p.AgentOptions(script={"steps": [{"type": "message", "text": "x" * n, "chunks": n}]})


def fill(client: cc.BlockingClient, thread_id: str, n: int) -> None:
    """Runs a turn of n deltas to completion without reading: everything waits in the buffer."""
    client.thread_start(thread_id=thread_id, agent_options=stream_script(n))
    client.turn_start(thread_id, "go")
    while client.thread_resume(thread_id, limit=1).active_turn is not None:
        time.sleep(0.01)


DONE = '"method":"turn/completed"'


def is_done(text: str) -> bool:
    return DONE in text[:64]


def drain_blocking(client: cc.BlockingClient, decode: bool | str) -> int:
    count = 0
    if decode == "read":
        # Typed, and every delta's text read (decodes and validates each lazily decoded delta).
        for note in client.notifications(timeout=10):
            count += 1
            if isinstance(note, p.ItemDeltaNotification):
                delta = note.params.delta
                assert isinstance(delta, p.TextDelta) and delta.text
            elif isinstance(note, p.TurnCompletedNotification):
                break
    elif decode == "eager":
        # The SDK's decoding before issue 25: json.loads + the generated decoder for every message.
        for text in client.raw_notifications(timeout=10):
            count += 1
            if isinstance(p.decode_ServerNotification(json.loads(text)), p.TurnCompletedNotification):
                break
    elif decode == "loads":
        # The floor of any eager decoding: json.loads of each message alone.
        for text in client.raw_notifications(timeout=10):
            count += 1
            if json.loads(text)["method"] == "turn/completed":
                break
    elif decode:
        for note in client.notifications(timeout=10):
            count += 1
            if isinstance(note, p.TurnCompletedNotification):
                break
    else:
        for text in client.raw_notifications(timeout=10):
            count += 1
            if is_done(text):
                break
    return count


async def drain_async(client: cc.AsyncClient, decode: bool) -> int:
    count = 0
    if decode:
        async for note in client.notifications(timeout=10):
            count += 1
            if isinstance(note, p.TurnCompletedNotification):
                break
    else:
        async for text in client.raw_notifications(timeout=10):
            count += 1
            if is_done(text):
                break
    return count


def median_rate(path: str, runs: list[tuple[int, float]]) -> None:
    """Reports the median of the repeated runs (the machine is shared and noisy)."""
    runs.sort(key=lambda r: r[0] / r[1])
    n, seconds = runs[len(runs) // 2]
    print(json.dumps({"path": path, "n": n, "seconds": round(seconds, 4), "per_s": round(n / seconds),
                      "runs_per_s": [round(c / t) for c, t in runs]}), flush=True)


def notifications(server: cc.AppServer, n: int, repeat: int) -> None:
    capacity = n + 1000
    serial = iter(range(1_000_000))
    runs: list[tuple[int, float]] = []
    for _ in range(repeat):
        # Raw native batches: what reaches Python per FFI call, before any SDK work.
        with server.blocking_client(notification_capacity=capacity) as client:
            fill(client, f"raw{next(serial)}", n)
            native: Any = client._native
            count, t, done = 0, time.perf_counter(), False
            while not done:
                batch = native.next_notifications(256, 1000)
                count += len(batch)
                done = not batch or is_done(batch[-1])
            runs.append((count, time.perf_counter() - t))
    median_rate("drain: raw Client.next_notifications(256) -> list[str]", runs)
    runs = []
    for _ in range(repeat):
        with server.blocking_client(notification_capacity=capacity) as client:
            fill(client, f"text{next(serial)}", n)
            native = client._native
            count, t, done = 0, time.perf_counter(), False
            while not done:
                text = native.next_notifications_text(1024, 1000)
                lines = text.split("\n") if text else []
                count += len(lines)
                done = not lines or is_done(lines[-1])
            runs.append((count, time.perf_counter() - t))
    median_rate("drain: raw Client.next_notifications_text(1024) split", runs)

    def blocking_runs(tag: str, decode: bool | str) -> list[tuple[int, float]]:
        runs = []
        for _ in range(repeat):
            with server.blocking_client(notification_capacity=capacity) as client:
                fill(client, f"{tag}{next(serial)}", n)
                t = time.perf_counter()
                count = drain_blocking(client, decode)
                runs.append((count, time.perf_counter() - t))
        return runs

    for decode in (False, True):
        kind = "typed" if decode else "raw str"
        median_rate(f"drain: sdk blocking notifications() {kind}", blocking_runs("b", decode))

        async def run(thread_id: str, decode: bool = decode) -> tuple[int, float]:
            async with server.client(notification_capacity=capacity) as client:
                await client.thread_start(thread_id=thread_id, agent_options=stream_script(n))
                await client.turn_start(thread_id, "go")
                while (await client.thread_resume(thread_id, limit=1)).active_turn is not None:
                    await asyncio.sleep(0.01)
                t = time.perf_counter()
                count = await drain_async(client, decode)
                return count, time.perf_counter() - t

        runs = [asyncio.run(run(f"a{next(serial)}")) for _ in range(repeat)]
        median_rate(f"drain: sdk async notifications() {kind}", runs)
    for mode, label in (("eager", "old: raw_notifications() + json.loads + decode_ServerNotification (eager)"),
                        ("loads", "floor: raw_notifications() + json.loads alone"),
                        ("read", "sdk blocking notifications() typed, every delta's params.delta.text read")):
        median_rate(f"drain: {label}", blocking_runs(mode, mode))
    # Live: reading while the engine produces.
    runs = []
    for _ in range(repeat):
        with server.blocking_client(notification_capacity=capacity) as client:
            thread_id = f"live{next(serial)}"
            client.thread_start(thread_id=thread_id, agent_options=stream_script(n))
            t = time.perf_counter()
            client.turn_start(thread_id, "go")
            runs.append((drain_blocking(client, True), time.perf_counter() - t))
    median_rate("live: sdk blocking notifications() typed, engine producing", runs)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    notes = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    with tempfile.TemporaryDirectory() as d:
        with cc.AppServer.open(d + "/rt", durability="buffered") as server:
            round_trips(server, n)
        with cc.AppServer.open(d + "/notes", durability="ephemeral", outbound_messages=notes + 1000) as server:
            notifications(server, notes, repeat)


if __name__ == "__main__":
    main()
