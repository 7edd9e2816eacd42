#!/usr/bin/env python3
"""Extracts every fenced code block of the host docs so the test command can run them.

    python3 scripts/doctest.py OUT [DOC ...]      (default: the documents in DOCS below)

Each block of README.md and docs/{python,kotlin,swift,ffi}.md lands in OUT/<doc stem>/<fence line,
4 digits>.<ext>, and OUT/manifest.json lists every block with what became of it. A directive in
an HTML comment on the line right before the fence changes that:

    <!-- doctest: file NAME -->       extract to OUT/<stem>/NAME (e.g. Main.java)
    <!-- doctest: append -->          append to the previous block of the same language in the doc
    <!-- doctest: skip: REASON -->    not run; the reason is printed
    <!-- doctest: run -->             (sh only) run the block as it is, from the checkout, instead
                                      of only checking its commands: OUT/<stem>/<line>.run.sh

Blocks in a data language (text, console, xml, toml, kts, groovy) are listed, not run. A block
in any other language, an unknown directive, an unclosed fence or a skip without a reason fails
the extraction: a doc can't gain a block that no runner looks at. The runners are
scripts/doctest-<lang>.sh DIR; scripts/test-docs.sh drives them all.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DOCS = ["README.md", "docs/python.md", "docs/kotlin.md", "docs/swift.md", "docs/ffi.md"]
EXT = {"python": "py", "kotlin": "kt", "java": "java", "c": "c", "swift": "swift", "rust": "rs",
       "sh": "sh", "bash": "sh", "json": "json"}
DATA = {"text", "console", "xml", "toml", "kts", "groovy"}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*doctest:\s*(.*?)\s*-->\s*$")


class DocError(Exception):
    pass


def parse_directive(line: str, doc: str, lineno: int) -> tuple[str, str] | None:
    m = DIRECTIVE.match(line)
    if not m:
        if "doctest" in line and "<!--" in line:
            raise DocError(f"{doc}:{lineno}: malformed doctest directive: {line.strip()}")
        return None
    body = m.group(1)
    if body == "append":
        return ("append", "")
    if body == "run":
        return ("run", "")
    if body.startswith("file "):
        name = body[5:].strip()
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name.startswith("."):
            raise DocError(f"{doc}:{lineno}: bad file name {name!r} in doctest directive")
        return ("file", name)
    if body.startswith("skip:"):
        reason = body[5:].strip()
        if not reason:
            raise DocError(f"{doc}:{lineno}: `doctest: skip:` needs a reason")
        return ("skip", reason)
    raise DocError(f"{doc}:{lineno}: unknown doctest directive {body!r}")


def blocks(doc: str, text: str) -> list[dict[str, object]]:
    lines = text.split("\n")
    out: list[dict[str, object]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).lower()
        start = i + 1  # 1-based line of the fence
        directive = parse_directive(lines[i - 1], doc, i) if i > 0 else None
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        if i == len(lines):
            raise DocError(f"{doc}:{start}: unclosed code fence")
        i += 1
        if not lang:
            raise DocError(f"{doc}:{start}: a code block needs a language (use `text` for output)")
        out.append({"doc": doc, "line": start, "lang": lang, "body": "\n".join(body) + "\n",
                    "directive": directive})
    return out


def extract(root: Path, out: Path, docs: list[str]) -> list[dict[str, object]]:
    manifest: list[dict[str, object]] = []
    for doc in docs:
        path = root / doc
        stem = Path(doc).stem.lower()
        target = out / stem
        target.mkdir(parents=True, exist_ok=True)
        last: dict[str, Path] = {}
        for b in blocks(doc, path.read_text(encoding="utf-8")):
            lang = str(b["lang"])
            directive = b["directive"]
            entry: dict[str, object] = {"doc": doc, "line": b["line"], "lang": lang}
            if lang in DATA:
                entry["status"] = "data"
            elif lang not in EXT:
                raise DocError(f"{doc}:{b['line']}: no runner for ```{lang} blocks "
                               f"(runnable: {', '.join(sorted(EXT))}; data: {', '.join(sorted(DATA))})")
            elif directive and directive[0] == "skip":
                entry["status"] = "skip"
                entry["reason"] = directive[1]
            elif directive and directive[0] == "append":
                prev = last.get(lang)
                if prev is None:
                    raise DocError(f"{doc}:{b['line']}: `doctest: append` with no earlier ```{lang} block")
                with prev.open("a", encoding="utf-8") as f:
                    f.write("\n" + str(b["body"]))
                entry["status"] = "appended"
                entry["file"] = str(prev.relative_to(out))
            else:
                if directive and directive[0] == "run" and EXT[lang] != "sh":
                    raise DocError(f"{doc}:{b['line']}: `doctest: run` is for sh blocks")
                ext = "run.sh" if directive and directive[0] == "run" else EXT[lang]
                name = directive[1] if directive and directive[0] == "file" else f"{int(str(b['line'])):04d}.{ext}"
                file = target / name
                if file.exists():
                    raise DocError(f"{doc}:{b['line']}: two blocks extract to {file.name}")
                file.write_text(str(b["body"]), encoding="utf-8")
                last[lang] = file
                entry["status"] = "extracted"
                entry["file"] = str(file.relative_to(out))
            manifest.append(entry)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent.parent
    out = Path(argv[1])
    if out.exists() and any(out.iterdir()):
        print(f"doctest: {out} is not empty; give a new directory", file=sys.stderr)
        return 2
    try:
        manifest = extract(root, out, argv[2:] or DOCS)
    except (DocError, OSError) as e:
        print(f"doctest: {e}", file=sys.stderr)
        return 1
    for e in manifest:
        if e["status"] == "skip":
            print(f"doctest: skipped {e['doc']}:{e['line']} ({e['lang']}): {e['reason']}")
    counts: dict[str, int] = {}
    for e in manifest:
        counts[str(e["status"])] = counts.get(str(e["status"]), 0) + 1
    print("doctest: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f" -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
