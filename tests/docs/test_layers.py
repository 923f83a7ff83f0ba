"""Dependencies point one way: every `#include "dir/..."` of every source file outside
tests/ names a folder its own folder may include, as docs/architecture.md's dependency
table says. The table is the one place the arrows are written; this test holds the tree
to it."""
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = re.compile(r"^(protocol|kernels|storage|engine|daemon|python)/.*\.(h|cc|cu|cuh|in)$")
NESTED = ("protocol", "storage", "daemon", "engine")  # their subfolders are folders of their own


def folder(path):
    parts = path.split("/")
    if parts[0] in NESTED and len(parts) > 2:
        return parts[0] + "/" + parts[1]
    return parts[0]


def allowed():
    text = (ROOT / "docs/architecture.md").read_text()
    table = text.split("| folder | may include |", 1)[1].split("\n\n", 1)[0]
    rules = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        deps = set() if cells[1] == "—" else {d.strip() for d in cells[1].split(",")}
        for f in cells[0].split(","):
            rules[f.strip()] = deps
    return rules


def test_every_include_follows_the_dependency_table():
    rules = allowed()
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    unruled, wrong = set(), []
    for f in files:
        if not SOURCES.match(f):
            continue
        mine = folder(f)
        if mine not in rules:
            unruled.add(mine)
            continue
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', (ROOT / f).read_text(errors="replace"), re.M):
            if "/" not in inc or not SOURCES.match(inc) and not (ROOT / inc).exists():
                continue  # generated headers, system headers spelled with quotes
            theirs = folder(inc)
            if theirs != mine and theirs not in rules[mine]:
                wrong.append(f"{f} includes {inc} ({mine} -> {theirs})")
    assert not unruled, f"folders with no row in docs/architecture.md's dependency table: {sorted(unruled)}"
    assert not wrong, "includes against the dependency table:\n" + "\n".join(wrong)


def test_the_table_is_not_wider_than_the_tree_needs():
    # A rule nothing uses is a stale claim: every allowed edge is used by some include.
    rules = allowed()
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    used = {k: set() for k in rules}
    for f in files:
        if SOURCES.match(f) and folder(f) in rules:
            for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', (ROOT / f).read_text(errors="replace"), re.M):
                if "/" in inc and (ROOT / inc).exists() and folder(inc) != folder(f):
                    used[folder(f)].add(folder(inc))
    unused = {k: sorted(rules[k] - used[k]) for k in rules if rules[k] - used[k]}
    assert not unused, f"dependency table rows allow what nothing includes: {unused}"
