"""`ddprobe commit --tree ddtree,chain` (issue 61): both shapes' commit lengths, where the commits come from and the
spine check, in a fresh process on the real engine (CPU, the shipped tiny pair); bad input in one line."""
import json
import subprocess
import sys

import pytest


def _commit(*args, ok=True, cwd=None):
    p = subprocess.run([sys.executable, "-m", "ddprobe", "commit", *args], capture_output=True, text=True,
                       timeout=600, cwd=cwd, env={**__import__("os").environ, "OMP_NUM_THREADS": "1",
                                                  "COLUMNS": "150"})
    assert (p.returncode == 0) == ok, p.stdout + p.stderr
    return p


def test_both_shapes_side_by_side(tmp_path):
    f = tmp_path / "c.json"
    p = _commit("--tree", "ddtree,chain", "--budgets", "2,8", "--ctx", "1k", "--max-new-tokens", "24", "--json",
                str(f))
    d = json.loads(f.read_text())
    cells = {(r["tree"], r["budget"], r["text"]): r for r in d["rows"]}
    # the chain a budget buys: one node per depth, at most L = 7 for the tiny pair's block of 8
    assert set(cells) == {(s, b, t) for s, b in (("ddtree", 2), ("ddtree", 8), ("chain", 2), ("chain", 7))
                          for t in ("predictable", "novel")}
    assert d["config"]["sweep"] == [["ddtree", 2], ["ddtree", 8], ["chain", 2], ["chain", 7]]
    assert d["config"]["tree"] == ["ddtree", "chain"] and d["config"]["batch"] == 1
    for r in d["rows"]:
        assert r["spine_violations"] == 0 and 1 <= r["commit_len"] <= r["budget"] + 1
        assert len(r["step_depths"]) == len(r["step_ranks"]) and r["cond_accept_per_pos"]
        if r["tree"] == "chain":
            assert r["sibling_share"] == 0 and r["gain_over_spine"] == 1
    assert cells[("ddtree", 8, "novel")]["sibling_share"] > 0  # novel text: the tree's siblings commit
    assert "where the commits come from, batch 1" in p.stdout and "spine bugs" in p.stdout
    assert "commit length, batch 1" in p.stdout


def test_an_old_results_file_without_shapes_still_loads():
    """A commit file from before shapes (no tree, no per-row budget) loads as it did."""
    from ddprobe.results import Result

    r = Result.load("examples/commit-tiny-cpu-long-2026-12-02.json")
    assert all(x.tree is None and x.budget is None for x in r.records)


@pytest.mark.parametrize("args, msg", [
    (["--tree", "star"], "--tree: unknown tree shape 'star'; known: ddtree, chain"),
    (["--tree", "ddtree,chain", "--chain-depths", "9"], "--chain-depths: depth 9 is beyond the drafter's block: it "
                                                         "drafts 7 tokens per step (block size 8)"),
    (["--tree", "ddtree", "--chain-depths", "3"], "give --tree with chain"),
    (["--budgets", "0"], "--budgets: 0 must be at least 1"),
    (["--budgets", "x"], "--budgets: bad value 'x'"),
    (["--backend", "sglang", "--url", "http://127.0.0.1:9", "--tree", "chain"],
     "the sglang server decides its own draft shape and budget; ddprobe cannot change them"),
])
def test_bad_shape_input_is_one_line(args, msg, tmp_path):
    p = _commit("--ctx", "1k", "--json", str(tmp_path / "c.json"), *args, ok=False)
    assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "c.json").exists()
