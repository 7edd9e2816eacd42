#!/usr/bin/env bash
# The `cc-app-server` source distribution, end to end: `bash scripts/test-sdist.sh`.
#
# 1. `maturin sdist` (the pinned maturin, python/requirements-build.txt, in the tools venv that
#    scripts/build-wheel.sh uses) into ${CARGO_TARGET_DIR:-target}/sdist/, after the same protocol
#    copy the wheel build makes (bindings/python -> python/src/cc_app_server/protocol/);
# 2. checks the tarball: every workspace crate the ffi crate builds from (manifest, library
#    source, build script), Cargo.lock, uniffi.toml, every file of the Python package including
#    `cc_app_server/protocol/`, and no target/, .git, venv or bytecode;
# 3. `pip install`s the tarball into a fresh venv in a temporary directory: pip's isolated build
#    (maturin from PyPI) compiles the whole Rust engine in release from the unpacked sdist, in
#    that temporary directory (CARGO_TARGET_DIR is unset for it, so nothing of the workspace's
#    target dir is reused or overwritten);
# 4. smoke-tests the installed module from the temporary directory: import, open a server, one
#    scripted turn, its text, `server.store().verify(...)`.
#
# uniffi-bindgen: maturin runs a `uniffi-bindgen` bin of the crate or its workspace, else the one
# on PATH. The workspace has none (ffi/bindgen is outside it, see ffi/bindgen/Cargo.toml), PyPI's
# `uniffi-bindgen` is not the pinned uniffi version, so the isolated build takes the pinned one
# from PATH, built by scripts/bindgen.sh as scripts/build-wheel.sh does (docs/python.md, "Source
# distribution (sdist)").
#
# Slow (the pip step is a full release build of the engine, ~7 min on 2 shared cores; measured in
# docs/python.md): not part of scripts/test.sh. Needs PyPI and crates.io. Prints one line per
# check, the wall time of the sdist and pip steps, and `sdist: N passed, N failed` last; exits
# non-zero on any failure.
# CC_SDIST_KEEP=1 keeps the temporary directory (venv, pip's build tree) for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
root=$PWD
target=${CARGO_TARGET_DIR:-target}
mkdir -p "$target"
target=$(cd "$target" && pwd)
tools=${CC_WHEEL_TOOLS:-$target/wheel-tools}
out=$target/sdist

passed=0 failed=0
check() { # check NAME COMMAND...: runs COMMAND, prints a line, counts it
  local name=$1
  shift
  if "$@"; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    failed=$((failed + 1))
  fi
}
finish() {
  echo "sdist: $passed passed, $failed failed"
  [ "$failed" = 0 ]
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

tmp=$(mktemp -d)
if [ "${CC_SDIST_KEEP:-}" = 1 ]; then
  trap 'echo "kept $tmp" >&2' EXIT
else
  trap 'rm -rf "$tmp"' EXIT
fi

# --- 1. the tools venv (as scripts/build-wheel.sh makes it), the protocol copy, `maturin sdist`
bash scripts/wheel-prep.sh "$tools"
tools=$(cd "$tools" && pwd)

rm -rf "$out"
mkdir -p "$out"
t0=$(now)
(cd python && "$tools/bin/maturin" sdist --out "$out" >"$out/sdist.log" 2>&1) || {
  cat "$out/sdist.log" >&2
  echo "FAIL maturin sdist"
  failed=$((failed + 1))
  finish || exit 1
}
sdist_time=$(since "$t0")
sdist=$(ls "$out"/cc_app_server-*.tar.gz)
echo "sdist: $sdist ($(du -k "$sdist" | cut -f1) KiB) in ${sdist_time}s"

# --- 2. what the tarball holds
tar -tzf "$sdist" >"$tmp/list"
top=$(head -n1 "$tmp/list" | cut -d/ -f1)
sed "s|^$top/||" "$tmp/list" | grep -v '/$' | sort -u >"$tmp/files"
echo "sdist: $(wc -l <"$tmp/files") files under $top/"
has() { grep -qxF "$1" "$tmp/files"; }
has_all() { # has_all FILE_OF_PATHS: every path listed is in the tarball (names the missing ones)
  local missing
  missing=$(grep -vxF -f "$tmp/files" "$1" || true)
  [ -z "$missing" ] || { echo "  missing: $(echo "$missing" | tr '\n' ' ')" >&2; return 1; }
}
has_none() { # has_none REGEX: no path of the tarball matches (names the ones that do)
  local found
  found=$(grep -E "$1" "$tmp/files" | head -n5 || true)
  [ -z "$found" ] || { echo "  found: $(echo "$found" | tr '\n' ' ')" >&2; return 1; }
}

# The workspace crates the ffi crate builds from (normal and build dependencies, transitively):
# each one's Cargo.toml, library root and build script, as paths relative to the workspace root.
cargo metadata --format-version 1 --locked --manifest-path ffi/Cargo.toml >"$tmp/metadata.json"
python3 - "$tmp/metadata.json" "$root" >"$tmp/crates" <<'EOF'
import json, os, sys
meta = json.load(open(sys.argv[1]))
root = os.path.realpath(sys.argv[2])
members = set(meta["workspace_members"])
pkgs = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
start = next(i for i in members if pkgs[i]["name"] == "cc-app-server-ffi")
seen, todo = set(), [start]
while todo:
    i = todo.pop()
    if i in seen:
        continue
    seen.add(i)
    for dep in nodes[i]["deps"]:
        kinds = {k["kind"] for k in dep["dep_kinds"]}
        if dep["pkg"] in members and kinds & {None, "build"}:
            todo.append(dep["pkg"])
for i in sorted(seen, key=lambda i: pkgs[i]["manifest_path"]):
    p = pkgs[i]
    paths = [p["manifest_path"]] + [t["src_path"] for t in p["targets"]
                                    if set(t["kind"]) & {"lib", "cdylib", "staticlib", "rlib", "custom-build"}]
    print(p["name"], *sorted({os.path.relpath(os.path.realpath(x), root) for x in paths}))
EOF
while read -r name paths; do
  echo "$paths" | tr ' ' '\n' >"$tmp/need"
  check "Rust crate $name: $paths" has_all "$tmp/need"
done <"$tmp/crates"
check "the workspace Cargo.toml and Cargo.lock" has_all <(printf '%s\n' Cargo.toml Cargo.lock)
check "ffi/uniffi.toml (the bindings config maturin and uniffi-bindgen read)" has ffi/uniffi.toml
check "schema/cc-agent-protocol.schema.json (the contract the schema crate embeds)" \
  has schema/cc-agent-protocol.schema.json
check "pyproject.toml and PKG-INFO" has_all <(printf '%s\n' pyproject.toml PKG-INFO)
# Every file of the Python package as the wheel build would see it, protocol copy included.
(cd python && find src/cc_app_server -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | sort) >"$tmp/py"
check "the Python package: $(wc -l <"$tmp/py") files of python/src/cc_app_server" has_all "$tmp/py"
check "cc_app_server/protocol/__init__.py (the generated protocol types)" \
  has src/cc_app_server/protocol/__init__.py
check "no target/ directory" has_none '(^|/)target/'
check "no .git" has_none '(^|/)\.git(/|$)'
check "no venv" has_none '(^|/)(\.?venv|[^/]*-venv|wheel-tools|site-packages)/|(^|/)pyvenv\.cfg$'
check "no bytecode" has_none '(^|/)__pycache__/|\.pyc$'

# --- 3. a fresh venv, `pip install` of the tarball (the Rust build happens here)
t0=$(now)
bindgen=$(bash scripts/bindgen.sh --release)
echo "uniffi-bindgen: $bindgen (built or up to date in $(since "$t0")s)"
mkdir -p "$tools/bindgen"
ln -sfn "$(cd "$(dirname "$bindgen")" && pwd -P)/uniffi-bindgen" "$tools/bindgen/uniffi-bindgen"
python3 -m venv "$tmp/venv"
mkdir -p "$tmp/build"
log=$out/pip-install.log
echo "pip install: building the sdist in $tmp (log: $log)..."
t0=$(now)
if (cd "$tmp" && env -u CARGO_TARGET_DIR TMPDIR="$tmp/build" PATH="$tools/bindgen:$PATH" \
  "$tmp/venv/bin/python" -m pip install -v --no-cache-dir --disable-pip-version-check "$sdist" >"$log" 2>&1); then
  pip_ok=1
else
  pip_ok=0
  tail -n 40 "$log" >&2
fi
pip_time=$(since "$t0")
echo "pip install: ${pip_time}s"
check "pip install of the sdist into a fresh venv (isolated build, Rust compiled from source)" [ "$pip_ok" = 1 ]
[ "$pip_ok" = 1 ] || { finish || exit 1; }

# --- 4. the installed module, from outside the source tree
cd "$tmp"
"$tmp/venv/bin/python" - "$(basename "$sdist")" >"$tmp/smoke" 2>"$tmp/smoke.err" <<'EOF' || true
import importlib.metadata, os, pathlib, sys, tempfile

def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f" ({detail})" if detail else ""), flush=True)

try:
    import cc_app_server as cc
    from cc_app_server import protocol as p
except Exception as e:
    check("import cc_app_server", False, repr(e))
    sys.exit(0)
where = pathlib.Path(cc.__file__).resolve()
check("import cc_app_server, from the venv", where.is_relative_to(pathlib.Path(sys.prefix).resolve()), str(where))
version = importlib.metadata.version("cc-app-server")
check("installed version is the sdist's", sys.argv[1] == f"cc_app_server-{version}.tar.gz", version)
check("cc_app_server.protocol is there", hasattr(p, "AgentOptions") and hasattr(p, "decode_ThreadStartResult"))
native = sorted((where.parent / "_ffi").glob("*cc_app_server_ffi*"))
print("info the native library: " + ", ".join(f"{n.name} {n.stat().st_size / 2**20:.1f} MiB" for n in native))
try:
    state = os.path.join(tempfile.mkdtemp(dir="."), "state")
    with cc.AppServer.open(state) as server:
        with server.blocking_client() as client:
            client.thread_start(thread_id="smoke", agent_options=p.AgentOptions(
                script={"steps": [{"type": "message", "text": "hi from the sdist", "chunks": 2}]}))
            text = client.turn("smoke", "go", timeout=20).text()
        check("a turn with the scripted kernel returns its text", text == "hi from the sdist", repr(text))
        report = server.store().verify("smoke")
        check("the thread's rollout verifies", report.ok and report.events > 0,
              f"{report.events} events, head seq {report.head_seq}, reason {report.reason}")
except Exception as e:
    check("open a server and run a turn", False, repr(e))
EOF
cat "$tmp/smoke.err" >&2
grep -q . "$tmp/smoke" || echo "FAIL the smoke test printed nothing" >>"$tmp/smoke"
while IFS= read -r line; do
  echo "$line"
  case $line in
    "ok   "*) passed=$((passed + 1)) ;;
    "info "*) ;;
    *) failed=$((failed + 1)) ;;
  esac
done <"$tmp/smoke"
cd "$root"
echo "times: maturin sdist ${sdist_time}s, pip install (release build of the engine) ${pip_time}s"
finish
