"""The report's shape tables (``reports.shapes``) from real files: a commit shape sweep and an advise decision,
both written by the commands in fresh processes on the CPU."""
import subprocess
import sys

from ddprobe.reports.shapes import advise_tables, commit_tables
from ddprobe.results import Result


def test_tree_and_chain_side_by_side_and_the_decision(tmp_path):
    c = tmp_path / "c.json"
    subprocess.run([sys.executable, "-m", "ddprobe", "commit", "--tree", "ddtree,chain", "--budgets", "2,8", "--ctx",
                    "1k", "--text", "novel", "--max-new-tokens", "12", "--json", str(c)], check=True,
                   capture_output=True, timeout=300)
    (t,) = commit_tables(Result.load(c))
    assert t.title == "Tree and chain side by side (batch 1)"
    got = {(row[2], row[5]) for row in t.rows}  # tree budget -> the chain it buys (L = 7)
    assert got == {("2", "2"), ("8", "7")} and all(row[-1] == "0" for row in t.rows)
    a = tmp_path / "a.json"
    subprocess.run([sys.executable, "-m", "ddprobe", "advise", "--from", str(c), "--decode-ms", "30", "-o", str(a)],
                   check=True, capture_output=True, timeout=300)
    (d,) = advise_tables(Result.load(a))
    assert d.title == "Tree, chain or off (batch 1)" and d.rows[0][8].split("@")[0] in ("ddtree", "chain", "off")
    assert "ran on" not in d.note  # typed plain step, steps from a file: no kernel is claimed for either
    res = Result.load(a)
    res.summary["decisions"][0].update(chain_kernel="flashmla: FlashMLA's dense decode kernel", plain_kernel="flashmla")
    assert advise_tables(res)[0].note.endswith("The chain ran on: flashmla: FlashMLA's dense decode kernel. Plain "
                                                "decoding ran on: flashmla.")
    assert commit_tables(Result.load("examples/commit-tiny-cpu-long-2026-12-02.json")) == []  # no shapes: none
