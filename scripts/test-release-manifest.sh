#!/usr/bin/env bash
# Checks scripts/release-manifest.sh after the builds of scripts/test.sh: every field present and
# typed; the schema digest equal to `cc-agent-protocol digest` and to an independent digest of the
# schema (sorted keys, no whitespace: RFC 8785 for this all-ASCII-key, float-free file) made here;
# the commit equal to HEAD; every artifact's size and SHA-256 equal to what `stat` and `sha256sum`
# say of the file; nothing missing but the npm tarball (not built yet). Prints
# `release manifest: N passed, N failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
manifest=$(mktemp)
trap 'rm -f "$manifest"' EXIT
bash scripts/release-manifest.sh >"$manifest"
MANIFEST=$manifest DIGEST=$(cargo run -q -p cc-agent-protocol -- digest) HEAD_COMMIT=$(git rev-parse HEAD) python3 - <<'PY'
import hashlib, json, os, subprocess, sys

m = json.load(open(os.environ["MANIFEST"], encoding="utf-8"))
passed = failed = 0

def check(name, ok):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("release manifest: FAILED: " + name, file=sys.stderr)

def get(*path):
    v = m
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v

for path, kind in [
    (("version",), str), (("protocolPackage", "name"), str), (("protocolPackage", "version"), str),
    (("wireVersion",), int), (("schemaDigest",), str), (("release", "commit"), str),
    (("release", "dirty"), bool), (("generator", "name"), str), (("generator", "version"), str),
    (("generator", "source"), str), (("generator", "lastChangedIn"), str),
    (("minimumCompatibleConsumer", "wireVersion"), int),
    (("minimumCompatibleConsumer", "chainlesschain-agent-sdk"), str),
    (("minimumCompatibleConsumer", "baselineSha256"), str), (("artifacts",), list), (("missing",), list),
]:
    check("field %s is a %s" % (".".join(path), kind.__name__), isinstance(get(*path), kind))
for key in ("tag", "commit", "dirty"):
    check("release.%s present" % key, key in (m.get("release") or {}))
check("ci present (null off CI)", "ci" in m)

schema = json.load(open("schema/cc-agent-protocol.schema.json", encoding="utf-8"))
canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
independent = "sha256:" + hashlib.sha256(canonical).hexdigest()
check("schemaDigest == cc-agent-protocol digest", m.get("schemaDigest") == os.environ["DIGEST"])
check("schemaDigest == independent JCS digest", m.get("schemaDigest") == independent)
check("wireVersion == schema x-wire-version", m.get("wireVersion") == schema["x-wire-version"])
check("release.commit == HEAD", get("release", "commit") == os.environ["HEAD_COMMIT"])
check("generator commit is in history",
      subprocess.run(["git", "cat-file", "-e", (get("generator", "lastChangedIn") or "x") + "^{commit}"],
                     capture_output=True).returncode == 0)

kinds = set()
for a in m.get("artifacts") or []:
    path = a.get("path", "")
    kinds.add(a.get("kind"))
    if not os.path.isfile(path):
        check("artifact %s exists" % path, False)
        continue
    out = subprocess.run(["sha256sum", path], capture_output=True, text=True, check=True).stdout
    check("sha256 of %s" % path, a.get("sha256") == out.split()[0])
    check("bytes of %s" % path, a.get("bytes") == os.stat(path).st_size)
for kind in ("python wheel", "jvm jar", "jvm sources jar", "jvm kdoc jar", "c shared library",
             "c static library", "c header"):
    check("artifact %s listed" % kind, kind in kinds)
check("nothing missing but the npm tarball", set(m.get("missing") or []) <= {"npm tarball"})

print("release manifest: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
PY
