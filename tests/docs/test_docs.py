"""The docs describe the tree as it is.

- docs/architecture.md's component map names every source file outside tests/, and
  every file it names exists.
- docs/protocol.md lists every op of the schema's Op union, with who may send it as
  protocol/op_table.h says, and names every op whose reply may come later as the
  dispatcher's handlers answer.
- docs/benchmarks.md opens with its current-results table, each row dated and with a
  commit of this repository.
"""
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = re.compile(r"^(protocol|kernels|storage|daemon|engine|python)/.*\.(h|cc|cu|fbs|in)$")


def expand(name):
    m = re.search(r"\{([^}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in expand(name[: m.start()] + alt + name[m.end():])]


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {f for f in out.split() if SOURCES.match(f)}


def test_the_component_map_names_every_source_file_and_only_them():
    text = (ROOT / "docs/architecture.md").read_text()
    section = text.split("## Component map", 1)[1].split("\n## ", 1)[0]
    named = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        for token in re.findall(r"`([^`]+)`", first):
            named.update(expand(token))
    files = tracked()
    assert not sorted(files - named), f"source files missing from the component map: {sorted(files - named)}"
    assert not sorted(named - files), f"the component map names files that do not exist: {sorted(named - files)}"


def test_protocol_md_lists_every_op_of_the_schema_with_its_access_from_the_op_table():
    schema = (ROOT / "protocol/kvtier.fbs").read_text()
    union = re.search(r"union\s+Op\s*\{([^}]*)\}", schema)
    assert union, "no Op union in protocol/kvtier.fbs"
    ops = [o.strip() for o in union.group(1).split(",") if o.strip()]
    doc = (ROOT / "docs/protocol.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (\w+) \|", doc, re.M))
    missing = [op for op in ops if op not in rows]
    assert not missing, f"ops of the schema not in docs/protocol.md's table: {missing}"
    table = (ROOT / "protocol/op_table.h").read_text()
    access = dict(re.findall(r"OpSpec\{fb::Op::(\w+), \"\w+\", OpAccess::k(\w+),", table))
    assert sorted(access) == sorted(ops), f"op_table.h rows {sorted(access)} != schema ops {sorted(ops)}"
    words = {"Open": "anyone", "Session": "session", "Engine": "engine", "Control": "control", "Admin": "admin"}
    wrong = {op: (rows[op], words[a]) for op, a in access.items() if rows[op] != words[a]}
    assert not wrong, f"docs/protocol.md's 'who' differs from op_table.h (doc, table): {wrong}"


def test_protocol_md_names_the_ops_whose_reply_may_come_later_as_the_dispatcher_answers():
    src = "".join((ROOT / f).read_text() for f in ("daemon/dispatcher.cc", "daemon/dispatcher_control.cc"))
    handler_of = dict(re.findall(r"\{fb::Op::(\w+), &Dispatcher::(On\w+)\}", src))
    assert handler_of, "no op -> handler table in daemon/dispatcher.cc"
    bodies = {m.group(1): m.group(0)
              for m in re.finditer(r"^Dispatcher::Reply Dispatcher::(On\w+)\(.*?^\}$", src, re.M | re.S)}
    later = sorted(op for op, h in handler_of.items() if "Reply::Later()" in bodies.get(h, ""))
    doc = (ROOT / "docs/protocol.md").read_text()
    para = re.search(r"Responses may arrive in another order than their requests\..*?\n\n", doc, re.S)
    assert para, "docs/protocol.md has no paragraph on replies that come later"
    named = sorted(set(re.findall(r"`(\w+)`", para.group(0))) & set(handler_of))
    assert named == later, f"docs/protocol.md names {named} as answered later; the dispatcher defers {later}"


def test_benchmarks_md_opens_with_dated_results_at_commits_of_this_repository():
    lines = (ROOT / "docs/benchmarks.md").read_text().splitlines()
    header = next(i for i, l in enumerate(lines[:40]) if l.startswith("| benchmark"))
    cols = [c.strip() for c in lines[header].strip("|").split("|")]
    assert {"figure", "ratio", "goal", "date", "commit"} <= set(cols), cols
    rows = []
    for l in lines[header + 2:]:
        if not l.startswith("|"):
            break
        rows.append(dict(zip(cols, [c.strip() for c in l.strip("|").split("|")])))
    assert len(rows) >= 10, "fewer than ten benchmarks in the current-results table"
    for r in rows:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]), r
        commit = r["commit"].strip("`")
        ok = subprocess.run(["git", "cat-file", "-e", commit + "^{commit}"], cwd=ROOT, capture_output=True)
        assert ok.returncode == 0, f"{r['benchmark']}: {commit} is not a commit of this repository"
