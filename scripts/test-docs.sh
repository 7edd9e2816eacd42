#!/usr/bin/env bash
# The docs as tests: every fenced code block of README.md and docs/{python,kotlin,swift,ffi}.md is
# extracted (scripts/doctest.py) and handed to the runner of its language:
#   .py          scripts/doctest-python.sh   mypy --strict, then run against the installed wheel
#   .kt .java    scripts/doctest-jvm.sh      compiled (and run) against the built jar, plain classpath
#   .c .rs       scripts/doctest-c.sh        compiled against the installed C library (pkg-config)
#   .swift       scripts/doctest-swift.sh    compiled (and run) in the Swift toolchain root
#   .sh          scripts/doctest-sh.sh       bash -n, and every command must resolve (see there)
#   .json        parsed here
# A runner reuses what the suites before it built (scripts/test.sh runs this one last) and builds
# what is missing. Fails if any block fails, or if a block has no runner.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${CARGO_TARGET_DIR:-target}/doctest
rm -rf "$out"
python3 scripts/doctest.py "$out"

runner_for() {
    case "$1" in
        py) echo python ;;
        kt|java) echo jvm ;;
        c|rs) echo c ;;
        swift) echo swift ;;
        sh) echo sh ;;
        json) echo json ;;
        *) echo "" ;;
    esac
}

status=0
for dir in "$out"/*/; do
    dir=${dir%/}
    runners=$(for f in "$dir"/*; do [ -f "$f" ] && runner_for "${f##*.}"; done | sort -u)
    for r in $runners; do
        echo "== doctest $r: $dir"
        if [ "$r" = json ]; then
            for f in "$dir"/*.json; do
                python3 -m json.tool "$f" >/dev/null || { echo "FAIL $f: not JSON"; status=1; }
            done
            continue
        fi
        if [ ! -f "scripts/doctest-$r.sh" ]; then
            echo "FAIL $dir: blocks for the '$r' runner but no scripts/doctest-$r.sh" >&2
            status=1
            continue
        fi
        bash "scripts/doctest-$r.sh" "$dir" || status=1
    done
done
[ $status = 0 ] && echo "docs: every code block passed" || echo "docs: some code blocks failed" >&2
exit $status
