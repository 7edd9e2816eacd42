"""The Python leg of the FFI round-trip benchmark (ffi/bench/run.sh): thread/list through the
uniffi `Client`, blocking and async. Prints one JSON line per path."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import tempfile
import time
from typing import Any


def report(path: str, samples: list[int]) -> None:
    samples.sort()
    n = len(samples)
    print(json.dumps({"path": path, "n": n, "p50_ns": samples[n // 2], "p90_ns": samples[n * 9 // 10],
                      "mean_ns": sum(samples) // n}))


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    ffi: Any = importlib.import_module("cc_app_server")
    with tempfile.TemporaryDirectory() as d:
        server = ffi.AppServer.open(ffi.ServerOptions(state_dir=d + "/s", durability=ffi.Durability.BUFFERED))
        client = ffi.Client.connect(server)
        client.request_blocking("thread/start", json.dumps({"threadId": "bench"}))
        samples = []
        for i in range(n + n // 10):
            t = time.perf_counter_ns()
            client.request_blocking("thread/list", '{"limit":1}')
            if i >= n // 10:
                samples.append(time.perf_counter_ns() - t)
        report("python uniffi Client.request_blocking", samples)

        async def run_async() -> list[int]:
            out = []
            m = n // 4
            for i in range(m + m // 10):
                t = time.perf_counter_ns()
                await client.request("thread/list", '{"limit":1}')
                if i >= m // 10:
                    out.append(time.perf_counter_ns() - t)
            return out

        report("python uniffi await Client.request", asyncio.run(run_async()))
        client.close()
        server.shutdown()


if __name__ == "__main__":
    main()
