"""The report puts tree and chain side by side (issue 61): `ddprobe report` of a real commit shape sweep and of the
advise decision made from it, both written by the commands in fresh processes on the CPU (the shipped tiny pair),
rendered as markdown and as HTML through the command itself."""
import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), COLUMNS="200")


def ddprobe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "ddprobe", *args], env=ENV, cwd=cwd, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A commit sweep (ddtree and chain at budgets 2 and 4, 1k) and advise --from it against a typed plain step."""
    d = tmp_path_factory.mktemp("shapes")
    ddprobe("commit", "--tree", "ddtree,chain", "--ctx", "1k", "--budgets", "2,4", "--json", str(d / "commit.json"),
            cwd=d)
    ddprobe("advise", "--from", str(d / "commit.json"), "--decode-ms", "30", "-o", str(d / "advise.json"), cwd=d)
    return {"dir": d, "commit": d / "commit.json", "advise": d / "advise.json"}


def md_table(text: str, title: str) -> list[list[str]]:
    """The rows (header first) of the markdown table under the heading that holds ``title``."""
    after = text[text.index(title):]
    lines = [x for x in after.splitlines()[1:] if x.startswith("|") or not x.strip()]
    rows, started = [], False
    for x in lines:
        if not x.strip():
            if started:
                break
            continue
        started = True
        if not re.fullmatch(r"\|[\s|:-]+\|", x):
            rows.append([c.strip() for c in x.strip("|").split("|")])
    return rows


def test_markdown_report_shows_both_shapes_in_one_table(files):
    out = files["dir"] / "r.md"
    ddprobe("report", str(files["commit"]), str(files["advise"]), "-o", str(out), cwd=files["dir"])
    text = out.read_text()
    header, *rows = md_table(text, "Tree and chain side by side (batch 1)")
    assert header[:6] == ["text", "ctx", "budget", "ddtree commit", "chain commit", "chain depth"]
    # both texts, the tree at budgets 2 and 4 each beside the chain those budgets buy (min(budget, L), L = 7)
    assert sorted((r[0], r[2], r[5]) for r in rows) == [(t, b, b) for t in ("novel", "predictable") for b in "24"]
    assert all(float(r[3]) >= 1 and float(r[4]) >= 1 for r in rows) and all(r[-1] == "0" for r in rows)
    # the commit table says each row's shape and budget: four cells per text, none alike
    header, *rows = md_table(text, "Commit length per text kind and context")
    i, j = header.index("tree"), header.index("budget")
    assert sorted((r[0], r[i], r[j]) for r in rows) == sorted(
        (t, s, b) for t in ("novel", "predictable") for s in ("chain", "ddtree") for b in "24")
    header, *rows = md_table(text, "Conditional acceptance per draft position")  # so does the per-position one
    assert len({(r[0], r[header.index("tree")], r[header.index("budget")]) for r in rows}) == len(rows) == 8
    header, *rows = md_table(text, "Tree, chain or off (batch 1)")
    assert rows and {r[header.index("choice")].split("@")[0] for r in rows} <= {"ddtree", "chain", "off"}
    assert "tree" in md_table(text, "Tokens/s with and without speculation")[0]


def test_html_report_shows_both_shapes_in_one_table(files):
    out = files["dir"] / "r.html"
    ddprobe("report", str(files["commit"]), str(files["advise"]), "-o", str(out), cwd=files["dir"])
    html = out.read_text()
    i = html.index("Tree and chain side by side (batch 1)")
    table = unescape(html[html.index("<table", i):html.index("</table>", i)])
    for col in ("ddtree commit", "chain commit", "chain depth", "tree's spine", "spine bugs"):
        assert f"<th>{col}</th>" in table, col
    assert table.count("<tr") == 1 + 4  # the header and 2 texts x 2 budgets
    assert "Tree, chain or off (batch 1)" in html


def test_a_file_without_shapes_keeps_its_tables():
    from ddprobe.reports import render

    (s,) = render.build([ROOT / "examples/commit-tiny-cpu-long-2026-12-02.json"]).sections
    assert [t.title for t in s.tables][0] == "Commit length per text kind and context"
    assert "tree" not in s.tables[0].columns and not any("chain" in t.title for t in s.tables)


def test_the_drafter_summary_reads_the_tree_once_per_context(files):
    """A shape sweep's summary judges the drafter on the tree's cells, one per text and context (the largest budget):
    never tree and chain cells of one context listed as if they were two contexts."""
    import json

    from ddprobe.reports import findings
    from ddprobe.reports.load import load_one

    lines = findings.commit(load_one(files["commit"]))
    rows = json.loads(files["commit"].read_text())["rows"]
    for text in ("predictable", "novel"):
        (line,) = [x for x in lines if text in x.lower()]
        assert line.count(" at 1k") == 1, line
        tree4 = next(r for r in rows if r["text"] == text and r["tree"] == "ddtree" and r["budget"] == 4)
        assert f"{tree4['commit_len']:.2f} at 1k" in line, line
