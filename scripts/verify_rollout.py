#!/usr/bin/env python3
"""Verify a CC App Server JSONL rollout (docs/rollout-format.md): every line's seq, prevHash and
hash = sha256(JCS(event without "hash")). Standard library only. Exit 0 if intact, 1 naming the
first bad seq. Usage: verify_rollout.py THREAD.jsonl [ANCHOR.head]"""
import hashlib, json, sys

def num(x):
    if isinstance(x, int) or x.is_integer() and abs(x) < 1e21:
        return str(int(x))
    r = repr(x)  # ECMAScript prints plain decimals down to 1e-6 and exponents without padding
    if "e" in r:
        m, e = r.split("e")
        if -7 < int(e) < 0:
            return "0." + "0" * (-int(e) - 1) + m.replace(".", "").lstrip("-") if x > 0 else "-" + num(-x)
        return m + "e" + ("+" if int(e) > 0 else "-") + str(abs(int(e)))
    return r

def jcs(v):  # RFC 8785 for JSON values (sorted keys by UTF-16, minimal escapes, ES numbers)
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, (int, float)):
        return num(v)
    if isinstance(v, str):
        return '"' + "".join({'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (c if c >= " " else "\\u%04x" % ord(c)) for c in v) + '"'
    if isinstance(v, list):
        return "[" + ",".join(jcs(x) for x in v) + "]"
    return "{" + ",".join(jcs(k) + ":" + jcs(v[k]) for k in sorted(v, key=lambda k: k.encode("utf-16-be"))) + "}"

def main(path, anchor=None):
    prev, seq, ends = "0" * 64, 0, {}
    with open(path, "rb") as f:
        data = f.read()
    for line in data.split(b"\n")[:-1] + ([data.rsplit(b"\n", 1)[-1]] if not data.endswith(b"\n") else []):
        seq += 1
        try:
            ev = json.loads(line) if line.endswith(b"}") else None
            body = {k: v for k, v in ev.items() if k != "hash"}
            bad = ("seq is %s" % ev["seq"] if ev["seq"] != seq else "prevHash does not link" if ev["prevHash"] != prev
                   else "hash mismatch" if hashlib.sha256(jcs(body).encode()).hexdigest() != ev["hash"] else None)
        except Exception as e:  # noqa: BLE001 - any parse failure is a bad line
            bad = "unparsable line (%s)" % (e.__class__.__name__)
        if bad:
            sys.exit("%s: first bad seq %d: %s" % (path, seq, bad))
        prev, ends[seq] = ev["hash"], ev["hash"]
    if anchor:  # newest valid slot of the head anchor must name an event we have
        slots = [dict(p.split("=", 1) for p in s.split()[1:]) for s in open(anchor, "rb").read().decode("ascii", "replace").split("\n") if s.startswith("ccanchor1")]
        best = max(slots, key=lambda s: int(s["gen"]))
        if ends.get(int(best["seq"])) != best["hash"]:
            sys.exit("%s: anchor seq %s hash %s is not in the log (truncated or replaced)" % (path, best["seq"], best["hash"]))
    print("ok: %d events, head %s" % (seq, prev))

if __name__ == "__main__":
    main(*sys.argv[1:3])
