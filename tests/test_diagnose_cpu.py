"""`ddprobe diagnose` with its defaults on a CPU answers all it can (issue 61): the floor from this machine's
measured copy bandwidth (said so), and tree, chain or off from the engine's measured plain and verify steps."""
import subprocess
import sys

from ddprobe.results import Result


def test_defaults_on_the_cpu_answer_the_floor_and_the_decision(tmp_path):
    out = tmp_path / "d"
    p = subprocess.run([sys.executable, "-m", "ddprobe", "diagnose", "--ctx", "1k,2k", "--max-new-tokens", "16",
                        "--out-dir", str(out)], capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    steps = {r["step"]: r["status"] for r in Result.load(out / "diagnose.json").rows}
    assert steps["floor"] == "ok" and steps["advise"] == "ok"
    fl = Result.load(out / "floor.json")
    assert fl.config["bw_source"].startswith("measured: this machine's copy bandwidth")
    assert fl.config["bw_Bps"] > 1e8  # any machine copies faster than 100 MB/s
    commit = Result.load(out / "commit.json")
    assert {(r["tree"], r["budget"]) for r in commit.rows} == {("ddtree", 8), ("chain", 7)}
    assert all(r["spine_violations"] == 0 for r in commit.rows)
    adv = Result.load(out / "advise.json")
    assert adv.summary["decode_source"].startswith("measured")
    assert {d["ctx"] for d in adv.summary["decisions"]} == {1024, 2048}
    for d in adv.summary["decisions"]:
        assert d["choice"].split("@")[0] in ("ddtree", "chain", "off") and d["chain_tok_s"] and d["batch"] == 1
    text = " ".join(p.stdout.split())
    assert "this machine's memory bandwidth, measured by a copy" in text and "Tree, chain or off (batch 1)" in text
    # the drafter claim reads the tree's cells only
    assert "commit length 7.50 / 7.50 at 1k / 2k" in text


def test_a_server_asked_for_a_shape_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ddprobe", "diagnose", "--backend", "sglang", "--url",
                        "http://127.0.0.1:9", "--tree", "chain", "--out-dir", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "--tree: the sglang server decides its own draft shape; ddprobe cannot change it" in p.stderr
