#!/usr/bin/env bash
# Prints the release record of the current checkout as one JSON object (docs/compat.md, "Release
# manifest"): the protocol package and its version, the wire version, the schema digest, the
# release tag and commit, where the generator came from, the CI run, the minimum compatible
# consumers, and the SHA-256 and size of every artifact the builds left (wheel, jar, sources and
# KDoc jars, C library and header, npm tarball when one exists). An artifact not built is listed
# under "missing", never invented. Run it after the builds (scripts/test.sh does, then checks it
# with scripts/test-release-manifest.sh).
# Env: CARGO_TARGET_DIR (cargo's artifacts, default target); GITHUB_RUN_ID / GITHUB_SERVER_URL /
# GITHUB_REPOSITORY or CC_CI_RUN (the CI run, else null).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo_out=${CARGO_TARGET_DIR:-target}
digest=$(cargo run -q -p cc-agent-protocol -- digest)
commit=$(git rev-parse HEAD)
tag=$(git describe --tags --exact-match HEAD 2>/dev/null || true)
dirty=false
[ -n "$(git status --porcelain --untracked-files=no)" ] && dirty=true
generator_commit=$(git log -1 --format=%H -- schema/src/codegen schema/src/bin)

DIGEST=$digest COMMIT=$commit TAG=$tag DIRTY=$dirty GENERATOR_COMMIT=$generator_commit \
CARGO_OUT=$cargo_out python3 - <<'PY'
import glob, hashlib, json, os, re

def workspace_version() -> str:
    text = open("Cargo.toml", encoding="utf-8").read()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)

def package_version(manifest: str) -> str:
    text = open(manifest, encoding="utf-8").read()
    m = re.search(r'^version = "([^"]+)"', text, re.M)
    return m.group(1) if m else workspace_version()  # `version.workspace = true`

def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

version = workspace_version()
schema = json.load(open("schema/cc-agent-protocol.schema.json", encoding="utf-8"))
out = os.environ["CARGO_OUT"]
wanted = [
    ("python wheel", sorted(glob.glob("target/wheels/cc_app_server-%s-*.whl" % version))),
    ("jvm jar", ["target/jvm/maven/cc-app-server-%s.jar" % version]),
    ("jvm sources jar", ["target/jvm/maven/cc-app-server-%s-sources.jar" % version]),
    ("jvm kdoc jar", ["target/jvm/maven/cc-app-server-%s-javadoc.jar" % version]),
    ("c shared library", [out + "/release/libcc_app_server_ffi.so"]),
    ("c static library", [out + "/release/libcc_app_server_ffi.a"]),
    ("c header", ["ffi/include/cc_app_server.h"]),
    ("npm tarball", sorted(glob.glob("target/npm/cc-app-server-%s.tgz" % version))),
]
artifacts, missing = [], []
for kind, paths in wanted:
    present = [p for p in paths if os.path.isfile(p)]
    if not present:
        missing.append(kind)
    for p in present:
        artifacts.append({"kind": kind, "path": p, "bytes": os.path.getsize(p), "sha256": sha256(p)})

run_id = os.environ.get("GITHUB_RUN_ID")
if run_id:
    ci = {"provider": "github", "run": run_id,
          "url": "%s/%s/actions/runs/%s" % (os.environ.get("GITHUB_SERVER_URL", "https://github.com"),
                                            os.environ.get("GITHUB_REPOSITORY", ""), run_id)}
elif os.environ.get("CC_CI_RUN"):
    ci = {"provider": "ci", "run": os.environ["CC_CI_RUN"], "url": None}
else:
    ci = None

record = {
    "product": "cc-app-server",
    "version": version,
    "protocolPackage": {"name": "cc-agent-protocol", "version": package_version("schema/Cargo.toml")},
    "wireVersion": schema["x-wire-version"],
    "schemaDigest": os.environ["DIGEST"],
    "release": {"tag": os.environ["TAG"] or None, "commit": os.environ["COMMIT"],
                "dirty": os.environ["DIRTY"] == "true"},
    "generator": {
        "name": "cc-agent-protocol generate",
        "version": package_version("schema/Cargo.toml"),
        "source": "schema/src/codegen of this repository, built from source by cargo (Cargo.lock)",
        "lastChangedIn": os.environ["GENERATOR_COMMIT"],
    },
    "ci": ci,
    "minimumCompatibleConsumer": {
        "wireVersion": schema["x-wire-version"],
        "baseline": "schema/baselines/v1.json",
        "baselineSha256": sha256("schema/baselines/v1.json"),
        "chainlesschain-agent-sdk": "0.2.4",
        "sdks": {"python cc-app-server": version, "jvm com.chainlesschain:cc-app-server": version,
                 "swift CCAppServer": version},
    },
    "artifacts": artifacts,
    "missing": missing,
}
print(json.dumps(record, indent=2))
PY
