#!/usr/bin/env python3
"""Seeds the store_open fuzz corpus with real state dirs: the demo's JSONL thread (an approval,
a tool, a streamed answer), a served JSONL state with a fork and an archive, and a SQLite
database, each packed as store_open expects (flags byte, 2-byte anchor length, anchor, log or
database bytes), plus a torn tail and a flipped byte of each.

usage: fuzz/seed_store.py CORPUS_DIR   (uses target/debug/cc-app-server, building it if needed)
"""
import json, os, struct, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
binary = os.path.join(root, "target", "debug", "cc-app-server")
if not os.path.exists(binary):
    subprocess.run(["cargo", "build", "-q", "-p", "cc-app-server-cli"], cwd=root, check=True)


def serve(state, store, lines):
    text = "".join(json.dumps(l) + "\n" for l in lines)
    subprocess.run([binary, "serve", "--state-dir", state, "--store", store, "--approval-policy", "auto"],
                   input=text.encode(), stdout=subprocess.DEVNULL, check=True, timeout=60)


def req(i, method, params):
    return {"jsonrpc": "2.0", "id": i, "method": method, "params": params}


script = {"steps": [{"type": "reasoning", "text": "r"}, {"type": "tool", "tool": "fs.write", "arguments": {"p": 1}},
                    {"type": "message", "text": "done", "chunks": 3}]}
session = [
    req(1, "initialize", {"protocolVersion": 1, "minimumProtocolVersion": 1, "client": {"name": "seed", "version": "1"},
                          "features": ["thread_turn_item", "structured_approval"]}),
    req(2, "thread/start", {"threadId": "fz", "title": "seed", "metadata": {"k": [1, {"x": None}]},
                            "agentOptions": {"script": script}}),
    req(3, "turn/start", {"threadId": "fz", "input": [{"type": "text", "text": "go"}]}),
]

seeds = {}
with tempfile.TemporaryDirectory() as tmp:
    demo = os.path.join(tmp, "demo")
    subprocess.run([binary, "demo", "--state-dir", demo], stdout=subprocess.DEVNULL, check=True, timeout=60)
    log = open(os.path.join(demo, "threads", "demo.jsonl"), "rb").read()
    anchor = open(os.path.join(demo, "anchors", "demo.head"), "rb").read()
    seeds["demo-anchored"] = (2, anchor, log)
    seeds["demo-no-anchor"] = (0, b"", log)
    seeds["demo-buffered"] = (6, anchor, log)

    js = os.path.join(tmp, "jsonl")
    serve(js, "jsonl", session)
    serve(js, "jsonl", [session[0], req(4, "thread/fork", {"threadId": "fz", "newThreadId": "fz2"}),
                        req(5, "thread/archive", {"threadId": "fz2"})])
    log = open(os.path.join(js, "threads", "fz.jsonl"), "rb").read()
    anchor = open(os.path.join(js, "anchors", "fz.head"), "rb").read()
    seeds["served-anchored"] = (2, anchor, log)
    fork_log = open(os.path.join(js, "threads", "fz2.jsonl"), "rb").read()
    seeds["fork-archived"] = (0, b"", fork_log)

    sq = os.path.join(tmp, "sqlite")
    serve(sq, "sqlite", session)
    db = [f for f in os.listdir(sq) if f.endswith((".sqlite3", ".sqlite", ".db"))]
    if db:
        seeds["sqlite"] = (1, b"", open(os.path.join(sq, db[0]), "rb").read())

for name, (flags, anchor, body) in list(seeds.items()):
    seeds[name + "-torn"] = (flags, anchor, body[: len(body) * 2 // 3])
    flipped = bytearray(body)
    flipped[len(flipped) // 2] ^= 0x01
    seeds[name + "-flipped"] = (flags, anchor, bytes(flipped))

for name, (flags, anchor, body) in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([flags]) + struct.pack(">H", len(anchor)) + anchor + body)
print(f"seeded {len(seeds)} store_open inputs into {out}")
