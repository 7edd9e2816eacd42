#!/usr/bin/env bash
# Checks the shell blocks of the docs, as extracted by scripts/doctest.py: scripts/doctest-sh.sh DIR.
# The blocks are build and run commands that scripts/test.sh runs itself (building the wheel, the
# jar, the Swift package, every test), so running them again here would build everything twice.
# Instead each block must be valid bash (`bash -n`), and every command in it must resolve:
#   bash scripts/X.sh / python X.py / a repo path     the file exists in the checkout
#   cargo run|build -p PKG [--features F] [--bin B]   PKG is a workspace package (with F and B)
#   cargo run -p PKG -- SUB …                         the built binary answers `SUB --help` (exit 0)
#   pip install target/wheels/…                       names the wheel scripts/build-wheel.sh writes
# A command this checker does not know fails the block, so a new kind of command needs a rule here.
# A block marked `<!-- doctest: run -->` (extracted as NNNN.run.sh) is self-contained: it is run
# as written with `bash -euo pipefail` from the checkout, and must exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/doctest-sh.sh DIR}
target=${CARGO_TARGET_DIR:-target}
cargo build -q -p cc-app-server-cli -p cc-agent-protocol
export CC_DOCTEST_BIN_DIR=$target/debug
python3 - "$dir" <<'EOF'
import json, os, re, shlex, subprocess, sys
from pathlib import Path

root = Path.cwd()
meta = json.loads(subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"],
                                 capture_output=True, text=True, check=True).stdout)
packages = {p["name"]: p for p in meta["packages"]}
bins = Path(os.environ["CC_DOCTEST_BIN_DIR"])
# Placeholders the docs use for a value the reader picks.
PLACEHOLDERS = {"DIR", "URL", "NAME", "PKG"}


def check_cargo(words: list[str]) -> str | None:
    sub = words[1]
    if sub not in ("run", "build", "test"):
        return f"unknown cargo subcommand {sub!r}"
    args, rest = (words[2:words.index("--")], words[words.index("--") + 1:]) if "--" in words else (words[2:], [])
    pkgs, features, binname = [], [], None
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-p", "--package"):
            pkgs.append(args[i + 1]); i += 2; continue
        if a == "--features":
            features += args[i + 1].split(","); i += 2; continue
        if a == "--bin":
            binname = args[i + 1]; i += 2; continue
        if a in ("--bins", "--lib", "--release", "-q", "--workspace"):
            i += 1; continue
        return f"unknown cargo argument {a!r}"
    for p in pkgs:
        if p not in packages:
            return f"no workspace package {p!r}"
        for f in features:
            if f not in packages[p]["features"]:
                return f"package {p} has no feature {f!r}"
    if sub == "run":
        if len(pkgs) != 1:
            return "cargo run needs exactly one -p"
        targets = [t["name"] for t in packages[pkgs[0]]["targets"] if "bin" in t["kind"]]
        exe = binname or (targets[0] if len(targets) == 1 else None)
        if exe is None or exe not in targets:
            return f"cannot tell which binary of {pkgs[0]} runs ({targets})"
        # The subcommand is the leading plain words (`graph run graph.json` -> `graph run`); every
        # `--flag` of the line must be one that subcommand's help lists.
        path = []
        for w in rest:
            if w.startswith("-") or re.search(r"[./=]", w) or w in PLACEHOLDERS:
                break
            path.append(w)
        cmd = [str(bins / exe)] + path + ["--help"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return f"`{' '.join(cmd[1:])}` of {exe} exited {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}"
        for w in rest:
            flag = w.split("=")[0]
            if flag.startswith("--") and not re.search(re.escape(flag) + r"\b", r.stdout):
                return f"`{exe} {' '.join(path)}` has no option {flag}"
    return None


def check_words(words: list[str]) -> str | None:
    if not words:
        return None
    head = words[0]
    if "=" in head and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", head):
        return check_words(words[1:])  # VAR=value command …
    if head == "cargo":
        return check_cargo(words)
    if head in ("bash", "sh", "python", "python3"):
        script = words[1] if len(words) > 1 else ""
        return None if (root / script).is_file() else f"{script} does not exist"
    if head == "pip" and words[1:2] == ["install"]:
        want = "target/wheels/cc_app_server-*.whl"
        return None if words[2:] == [want] else f"pip install of {words[2:]} (expected {want})"
    if head.startswith(("target/", "./target/")):
        return None  # a built artifact, checked by the command that builds it in the same block
    if head in ("awk", "swift"):
        return None  # awk: a one-liner over checked-in files; swift: run by scripts/test-swift.sh
    return f"no rule for the command {head!r} (add one to scripts/doctest-sh.sh)"


passed = failed = 0
for f in sorted(Path(sys.argv[1]).glob("*.run.sh")):
    r = subprocess.run(["bash", "-euo", "pipefail", str(f)], capture_output=True, text=True, timeout=1800)
    if r.returncode == 0:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {f} (ran it, exit {r.returncode}):")
        print("    " + (r.stdout + r.stderr).strip()[-2000:].replace("\n", "\n    "))
for f in sorted(Path(sys.argv[1]).glob("*.sh")):
    if f.name.endswith(".run.sh"):
        continue
    src = f.read_text()
    problems = []
    r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append(r.stderr.strip())
    logical = re.sub(r"\\\n", " ", src)
    for line in logical.split("\n"):
        try:
            lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lex.whitespace_split = True
            lex.commenters = "#"
            tokens = list(lex)
        except ValueError as e:
            problems.append(f"{line.strip()}: {e}")
            continue
        words: list[str] = []
        for t in tokens + [";"]:
            if t and set(t) <= set(";&|"):
                why = check_words(words)
                if why:
                    problems.append(f"{' '.join(words)}: {why}")
                words = []
            else:
                words.append(t)
    if problems:
        failed += 1
        print(f"FAIL {f}:")
        for p in problems:
            print(f"    {p}")
    else:
        passed += 1
print(f"doctest sh: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
