#!/usr/bin/env python3
"""Independent verifier of CC App Server rollouts (docs/rollout-format.md), standard library only.

  verify_rollout.py THREAD.jsonl [ANCHOR.head] [--key-file KEY] [--accept-unanchored]
  verify_rollout.py --state-dir DIR [--key-file KEY] [--accept-unanchored]

Checks every line's seq, prevHash and hash = sha256(JCS(event without "hash")), that the header
names the thread the file is named after, the head anchor's two slots (check field, thread,
generation; with a key its MAC), that the log still holds the anchored event, and `sealed`
events (with a key, their MACs). --state-dir checks every log, anchor and SQLite row there,
and names entries no thread can own. Exit 0 if everything verifies (warnings are printed),
1 naming the first problem otherwise, 2 on bad usage. Damaged input is reported, never a crash.
"""
import hashlib, hmac, json, os, sqlite3, sys

ZERO, SLOT = "0" * 64, 512
ANCHOR_DOMAIN, SEAL_DOMAIN, KID_DOMAIN = b"cc-rollout-v1 anchor\n", b"cc-rollout-v1 seal\n", b"cc-rollout-v1 key-id"
HEX = set("0123456789abcdef")
FIELDS = ["seq", "prevHash", "hash", "time", "traceId", "parentId", "idempotencyKey", "payload"]


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


def mac(key, domain, *parts):
    return hmac.new(key, domain + b"\n".join(p.encode() for p in parts), hashlib.sha256).hexdigest()


def key_id(key):
    return mac(key, KID_DOMAIN)[:16]


def valid_id(s):
    return isinstance(s, str) and 0 < len(s) <= 128 and s.isascii() and (s[0].isalnum()) and all(c.isalnum() or c in "_-" for c in s)


class Report:
    def __init__(self, name):
        self.name, self.problem, self.warnings, self.events, self.head, self.keyed = name, None, [], 0, ZERO, False

    def fail(self, why):
        self.problem = self.problem or why

    def warn(self, why):
        self.warnings.append(why)


def check_event(ev, seq, prev, thread, key):
    """The reason `ev` is not event `seq` of `thread` after `prev`, or None."""
    if not isinstance(ev, dict) or list(ev) != FIELDS:
        return "not an event object with exactly the members %s" % ",".join(FIELDS)
    if ev["seq"] != seq:
        return "seq is %s" % ev["seq"]
    if ev["prevHash"] != prev:
        return "prevHash does not link"
    body = {k: v for k, v in ev.items() if k != "hash"}
    if hashlib.sha256(jcs(body).encode()).hexdigest() != ev["hash"]:
        return "hash mismatch"
    p = ev["payload"]
    kind = p.get("type") if isinstance(p, dict) else None
    if not isinstance(kind, str) or not kind:
        return "payload has no string type"
    if seq == 1 and (kind != "threadStarted" or p.get("threadId") != thread):
        return "the header names thread %r, not %r (another thread's log)" % (p.get("threadId"), thread) if kind == "threadStarted" else "seq 1 is not a threadStarted header"
    if seq > 1 and kind == "threadStarted":
        return "a threadStarted header in the middle of the log"
    if kind == "sealed":
        if p.get("sealedSeq") != seq - 1 or p.get("sealedHash") != prev:
            return "the seal does not name the event before it"
        if key is not None:
            if p.get("keyId") != key_id(key):
                return "the seal was made with another key (keyId %s)" % p.get("keyId")
            if not hmac.compare_digest(str(p.get("mac")), mac(key, SEAL_DOMAIN, thread, str(seq - 1), prev)):
                return "the seal's MAC does not verify under the key"
    return None


def decode_slot(raw):
    """("empty"|"damaged"|"valid", fields, text before " mac=")."""
    if not raw.strip(b"\0"):
        return "empty", {}, None
    text = raw.decode("utf-8", "replace")
    lenient = dict(p.split("=", 1) for p in text.split(" ") if "=" in p)
    if len(raw) != SLOT or not raw.endswith(b"\n"):  # exactly: text, space padding, "\n"
        return "damaged", lenient, None
    text = text[:-1].rstrip(" ")
    body, _, check = text.rpartition(" check=")
    if not body or hashlib.sha256(body.encode()).hexdigest()[:16] != check or not body.startswith("ccanchor1 "):
        return "damaged", lenient, None
    kv = dict(p.split("=", 1) for p in body.split(" ")[1:] if "=" in p)
    try:
        for k in ("seq", "offset", "gen"):
            kv[k] = int(kv[k])
        if len(kv["hash"]) != 64:
            raise ValueError
    except (KeyError, ValueError):
        return "damaged", lenient, None
    return "valid", kv, body.split(" mac=")[0] if " mac=" in body else None


def verify_jsonl(log, anchor, thread, key, accept):
    r = Report(thread)
    try:
        data = open(log, "rb").read()
    except OSError as e:
        r.fail("cannot read the log (%s)" % e.strerror)
        data = None
    events, prev, end, bad = [], ZERO, 0, None  # events: (seq, hash, end offset, kind)
    if data is not None:
        for n, line in enumerate(data.split(b"\n")[:-1] + ([data.rsplit(b"\n", 1)[-1]] if not data.endswith(b"\n") else []), 1):
            complete = end + len(line) < len(data)
            try:
                ev = json.loads(line) if complete else None
                why = "partial last line (no newline)" if ev is None else check_event(ev, n, prev, thread, key)
            except Exception as e:  # noqa: BLE001 - any parse failure is a bad line
                why = "unparsable line (%s)" % e.__class__.__name__
            if why:
                bad = (n, why, end + len(line) + 1 >= len(data))
                break
            prev, end = ev["hash"], end + len(line) + 1
            events.append((n, prev, end, ev["payload"]["type"]))
    r.events, r.head = len(events), prev
    last = len(events)
    sealed = max([s for s, _, _, k in events if k == "sealed"], default=0)
    # The anchor: which slot is relied on, whether it is this thread's and (keyed) authentic.
    slots, absent = None, False
    if anchor:
        try:
            raw = open(anchor, "rb").read()
            slots = [decode_slot(raw[i * SLOT:(i + 1) * SLOT]) for i in range(2)]
        except FileNotFoundError:
            absent = True
        except OSError:
            slots = None
    valid = [(i, s[1], s[2]) for i, s in enumerate(slots or []) if s[0] == "valid"]
    a = None
    if anchor and absent and key is None and last == 1 and bad is None and data is not None and end == len(data):
        pass  # its header alone: a thread created with its anchor deferred (docs/rollout-format.md)
    elif anchor and not valid:
        why = "the head anchor file is missing" if slots is None else "neither head anchor slot is valid"
        (r.warn if accept else r.fail)("%s: nothing vouches that the log ends at seq %d where it should%s" % (why, last, " (accepted)" if accept else "; pass --accept-unanchored to accept it as it is"))
    elif valid:
        i, a, mac_body = max(valid, key=lambda v: v[1]["gen"])
        other = slots[1 - i]
        if a.get("thread", thread) != thread:
            r.fail("the head anchor belongs to thread %r (copied or swapped)" % a.get("thread"))
        if key is not None:
            if "mac" not in a:
                (r.warn if accept else r.fail)("the head anchor carries no MAC (written without the key, or stripped)")
            elif a.get("kid") != key_id(key):
                r.fail("the head anchor was written with another key (key id %s)" % a.get("kid"))
            elif not hmac.compare_digest(a["mac"], mac(key, ANCHOR_DOMAIN, thread, mac_body or "")):
                r.fail("the head anchor's MAC does not verify under the key: forged or rewritten")
            else:
                r.keyed = True
        elif "mac" in a:
            r.warn("unkeyed: the thread is keyed but no key was given; only the plain chain was checked")
        if other[0] == "damaged" or other[0] == "empty" and a["gen"] >= 2:
            claimed = other[1].get("seq", "")
            claimed = int(claimed) if claimed.isdigit() else None
            text = "the other head anchor slot is %s; relying on generation %d (seq %d)" % (other[0] if other[0] == "damaged" else "erased", a["gen"], a["seq"])
            if claimed is not None and claimed > last:
                (r.warn if accept else r.fail)("%s, but it appears to record seq %d and the log ends at seq %d: acknowledged events %d..=%d are gone" % (text, claimed, last, last + 1, claimed))
            else:
                r.warn("%s: nothing vouches for acknowledged events after seq %d" % (text, a["seq"]))
        if a["seq"] > 0:
            ends = {s: (h, e) for s, h, e, _ in events}
            if ends.get(a["seq"]) != (a["hash"], a["offset"]):
                r.fail("anchor seq %d hash %s is not in the log (truncated or replaced)" % (a["seq"], a["hash"]))
    anchored = a["seq"] if a else 0
    if bad:
        n, why, at_end = bad
        if at_end and n > anchored:
            r.warn("torn tail at seq %d (%s): the store cuts it when it opens the thread" % (n, why))
        else:
            r.fail("first bad seq %d: %s" % (n, why))
    if key is not None and anchor and r.problem is None:
        vouched = max(anchored, sealed)
        if last > vouched:
            r.warn("events %d..=%d are not authenticated by the key: never acknowledged, or appended without it; the store moves them aside when it opens the thread" % (vouched + 1, last))
    elif anchor and last > anchored and r.problem is None:
        r.warn("events %d..=%d follow the anchor (legitimate after a crash)" % (anchored + 1, last))
    return r


def verify_sqlite(db, key, accept):
    c = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    cols = [row[1] for row in c.execute("PRAGMA table_info(threads)")]
    ids = [row[0] for row in c.execute("SELECT thread_id FROM threads UNION SELECT thread_id FROM events ORDER BY 1")]
    out = []
    for t in ids:
        r = Report(t)
        out.append(r)
        if not valid_id(t):
            r.fail("rows under a key that is not a thread id")
            continue
        prev, n = ZERO, 0
        for row in c.execute("SELECT seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload FROM events WHERE thread_id = ? ORDER BY seq", (t,)):
            try:
                ev = dict(zip(FIELDS, row[:7] + (json.loads(row[7]),)))
                why = check_event(ev, n + 1, prev, t, key)
            except Exception as e:  # noqa: BLE001
                why = "unparsable row (%s)" % e.__class__.__name__
            if why:
                r.fail("first bad seq %d: %s" % (n + 1, why))
                break
            prev, n = ev["hash"], n + 1
        r.events, r.head = n, prev
        row = c.execute("SELECT head_seq, head_hash, archived, format_version, compacted_through, last_compaction_seq%s FROM threads WHERE thread_id = ?" % (", mac, key_id" if "mac" in cols else ""), (t,)).fetchone()
        if row is None:
            (r.warn if accept else r.fail)("the thread row (head anchor) is missing: nothing vouches that seq %d is the last event" % n)
        elif r.problem is None and (row[0], row[1]) != (n, prev):
            r.fail("the thread row records seq %d hash %s, the events end at seq %d" % (row[0], row[1], n))
        elif key is not None:
            m, kid = (row[6], row[7]) if len(row) > 6 else (None, None)
            body = "ccrow1 seq=%d hash=%s archived=%d format=%d compactedThrough=%d lastCompaction=%s kid=%s" % (row[0], row[1], row[2], row[3], row[4], "-" if row[5] is None else row[5], kid)
            if m is None:
                (r.warn if accept else r.fail)("the thread row carries no MAC")
            elif kid != key_id(key) or not hmac.compare_digest(m, mac(key, ANCHOR_DOMAIN, t, body)):
                r.fail("the thread row's MAC does not verify under the key")
            else:
                r.keyed = True
    return out


def verify_dir(d, key, accept):
    out, strays = [], []
    threads, anchors = os.path.join(d, "threads"), os.path.join(d, "anchors")
    if os.path.isdir(threads) or os.path.isdir(anchors):
        names = sorted(os.listdir(threads)) if os.path.isdir(threads) else []
        heads = sorted(os.listdir(anchors)) if os.path.isdir(anchors) else []
        ids = set()
        for n in names:
            stem = n[:-6] if n.endswith(".jsonl") else n.split(".jsonl.broken")[0] if ".jsonl.broken" in n else None
            if stem is None or not valid_id(stem):
                strays.append("threads/" + n)
            elif n.endswith(".jsonl"):
                ids.add(stem)
        for n in heads:
            if n.endswith(".head") and valid_id(n[:-5]):
                ids.add(n[:-5])
            else:
                strays.append("anchors/" + n)
        for t in sorted(ids):
            out.append(verify_jsonl(os.path.join(threads, t + ".jsonl"), os.path.join(anchors, t + ".head"), t, key, accept))
    if os.path.exists(os.path.join(d, "rollout.sqlite3")):
        out += verify_sqlite(os.path.join(d, "rollout.sqlite3"), key, accept)
    for s in strays:
        r = Report(s)
        r.fail("not a thread's log or anchor: no thread can own it")
        out.append(r)
    return out


def read_key(path):
    raw = open(path, "rb").read()
    if len(raw) == 32:
        return raw
    text = raw.strip()
    if len(text) == 64 and set(text.decode("ascii", "replace")) <= HEX | set("ABCDEF"):
        return bytes.fromhex(text.decode())
    raise ValueError("the key file must hold 32 raw bytes or 64 hex digits, it holds %d bytes" % len(raw))


def usage():
    print(__doc__.strip(), file=sys.stderr)
    return 2


def main(argv):
    args, key, accept, state = [], None, False, None
    it = iter(argv)
    for a in it:
        if a == "--key-file":
            key = read_key(next(it, ""))
        elif a == "--accept-unanchored":
            accept = True
        elif a == "--state-dir":
            state = next(it, "")
        elif a.startswith("-"):
            return usage()
        else:
            args.append(a)
    if state:
        reports = verify_dir(state, key, accept)
    elif 1 <= len(args) <= 2:
        name = os.path.basename(args[0])
        reports = [verify_jsonl(args[0], args[1] if len(args) > 1 else None, name[:-6] if name.endswith(".jsonl") else name, key, accept)]
    else:
        return usage()
    ok = True
    for r in reports:
        if r.problem:
            ok = False
            print("%s: %s" % (r.name, r.problem), file=sys.stderr)
        else:
            print("%s ok: %d events, head %s (%s)" % (r.name, r.events, r.head, "keyed" if r.keyed else "unkeyed"))
        for w in r.warnings:
            print("%s: warning: %s" % (r.name, w))
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - damaged input is reported, never a traceback
        print("cannot verify: %s: %s" % (e.__class__.__name__, e))
        sys.exit(1)
