"""`ddprobe advise`: tokens/s with and without speculation, the crossover and the best budget, worked by hand."""
import json
import math
import subprocess
import sys

import pytest

from ddprobe.probes.advise import Point, advise, crossover_below, deployable, points_typed, rfc_table
from ddprobe.probes.floor import Sharding, served_model
from ddprobe.physics.models import get_model
from ddprobe.units import DDProbeError


def _advise(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "ddprobe", "advise", *args], capture_output=True, text=True,
                       timeout=120)
    assert (p.returncode == 0) == ok, p.stdout + p.stderr
    return p


def test_a_crossover_between_contexts_by_hand():
    # tokens/s with speculation: 7 / 50 ms = 140, 7 / 100 ms = 70, 7 / 200 ms = 35; without: 1 / 10 ms = 100
    pts = points_typed([32768, 65536, 131072], [50, 100, 200], [7.0], [10.0], 8, "paged", "novel", "typed")
    assert [round(p.spec_tok_s) for p in pts] == [140, 70, 35] and all(p.plain_tok_s == 100 for p in pts)
    (v,) = advise(pts)
    # speedup 1.4 at 32k, 0.7 at 64k; the verify step linear between them (50 -> 100 ms), the decode step 10 ms:
    # 7 tokens per step equal 1 per 10 ms where the step takes 70 ms, 32k + (20 / 50) x 32k = 45,875 tokens
    assert v.crossover_ctx == pytest.approx(32768 + 20 / 50 * 32768)
    assert [b["budget"] for b in v.best] == [8, 0, 0]  # on where it pays, off where it loses
    assert "with paged, speculation loses beyond 44.8k on novel text" in v.sentence
    assert rfc_table(v) == {"0": 8, str(round(v.crossover_ctx)): 0}  # off from the crossover
    assert deployable([v]) == {"paged": {"novel": {"num_speculative_tokens_per_seq_len": rfc_table(v)}}}


def test_the_best_budget_per_context():
    # budget 4: commit 4 in 40 ms (100 tok/s); budget 16: commit 9 in 60 ms (150 tok/s) at 8k; at 64k the big tree
    # costs more (9 in 180 ms, 50 tok/s) than the small one (4 in 60 ms, 66.7 tok/s); plain: 1 / 20 ms = 50 tok/s
    pts = [Point("split", "predictable", 8192, 4, 4.0, 40.0, 20.0), Point("split", "predictable", 8192, 16, 9.0, 60.0, 20.0),
           Point("split", "predictable", 65536, 4, 4.0, 60.0, 20.0),
           Point("split", "predictable", 65536, 16, 9.0, 180.0, 20.0)]
    (v,) = advise(pts)
    assert [(b["ctx"], b["budget"]) for b in v.best] == [(8192, 16), (65536, 4)]
    assert v.pays_everywhere and v.best[1]["spec_tok_s"] == pytest.approx(4 / 60 * 1e3)
    assert "still pays at 64k on predictable text: 66.7 tok/s against 50 (budget 4)" in v.sentence
    assert rfc_table(v) == {"0": 16, str(round(math.sqrt(8192 * 65536))): 4}


def test_a_crossover_below_the_smallest_context_is_extrapolated_by_hand():
    """The investigation's verify steps (159 ms at 32k, 714 at 128k) against a 20 ms plain decode: speculation
    committing 7 per step loses at 32k already. Extending the verify step linearly, (714 - 159) / 96k ms per
    token, it pays until 7 / verify = 1 / 20 ms, i.e. verify = 140 ms: 32768 - 19 / (555 / 98304) = 29,402.6."""
    pts = points_typed([32768, 131072], [159, 714], [7.0], [20.0], 8, "sglang", "predictable", "typed")
    (v,) = advise(pts)
    assert v.crossover_extrapolated and v.crossover_ctx == pytest.approx(32768 - 19 / (555 / 98304), rel=1e-6)
    assert rfc_table(v) == {"0": 8, str(round(v.crossover_ctx)): 0}
    assert "loses beyond about 28.7k" in v.sentence and "extrapolated" in v.sentence
    # losing even at 1k: no crossover, said so
    slow = points_typed([32768, 131072], [500, 714], [2.0], [20.0], 8, "sglang", "novel", "typed")
    (v2,) = advise(slow)
    assert crossover_below(v2.best[0], v2.best[1]) is None and v2.loses_everywhere
    assert "loses at every context measured on novel text, from 32k" in v2.sentence


def test_the_investigation_typed_in_gives_a_crossover():
    """`advise --ctx 32k,128k,185k --step-ms 159,714,1430` with the investigation's commit lengths and the plain
    decode step from the step model at tp 8 on RTX PRO 6000 (its one-row floor): SGLang's speculation loses from
    about 12k (SGLang #35784 saw it lose at 16k on sm_120); the same commits at the verify step's floor still pay."""
    p = _advise("--ctx", "32k,128k,185k", "--step-ms", "159,714,1430", "--commit-len", "7.0,7.88,7.88",
                "--gpu", "rtx-pro-6000", "--tp", "8", "--expert-dtype", "int4", "--path", "sglang", "--json")
    d = json.loads(p.stdout)
    v = {x["path"]: x for x in d["summary"]["verdicts"]}
    model, _ = served_model(get_model("kimi-k2.6"), Sharding(tp=8, expert_dtype="int4"), "rtx-pro-6000")
    rows = {r["ctx"]: r for r in d["rows"] if r["path"] == "sglang"}
    assert rows[32768]["decode_ms"] == pytest.approx(model.cost(32768, 1).floor_ms)
    c = v["sglang"]["crossover_ctx"]
    # at the crossover, 7 tokens per extended verify step equal one token per plain decode step
    verify = 159 + (714 - 159) / (131072 - 32768) * (c - 32768)
    assert 7.0 / verify == pytest.approx(1 / model.cost(int(c), 1).floor_ms, rel=1e-3)
    assert 8 * 1024 < c < 16 * 1024 and v["sglang"]["crossover_extrapolated"]
    assert v["floor"]["pays_everywhere"]
    # but plain decoding is modelled (its floor, the fastest it can be): the loss is a bound, not a verdict. The
    # table keeps speculation on and says why; the sentence gives the break-even plain step, verify / commit length
    assert not v["sglang"]["plain_measured"] and "unproven" in v["sglang"]["sentence"]
    assert "break-even plain step: 22.71 ms at 32k, 90.61 ms at 128k, 181.5 ms at 185k" in v["sglang"]["sentence"]
    assert [b["break_even_ms"] for b in v["sglang"]["best"]] == pytest.approx([159 / 7, 714 / 7.88, 1430 / 7.88])
    assert d["summary"]["vllm_rfc_48627"]["sglang"]["typed"]["num_speculative_tokens_per_seq_len"] == {"0": 8}
    assert "no loss is proven" in d["summary"]["rfc_note"] and d["summary"]["batch"] == 1


def test_measured_plain_decides_the_table():
    """The same verify steps against a typed plain step (measured against measured): off beyond the crossover, as
    before; no note, no 'unproven'."""
    p = _advise("--ctx", "32k,128k", "--step-ms", "159,714", "--commit-len", "7", "--decode-ms", "20", "--path",
                "sglang", "--json")
    d = json.loads(p.stdout)
    v = next(x for x in d["summary"]["verdicts"] if x["path"] == "sglang")
    assert v["plain_measured"] and "unproven" not in v["sentence"] and "rfc_note" not in d["summary"]
    assert d["summary"]["vllm_rfc_48627"]["sglang"]["typed"]["num_speculative_tokens_per_seq_len"] == \
        {"0": 8, str(round(v["crossover_ctx"])): 0}


def test_the_readme_example_keeps_speculation_on_and_prints_the_break_even():
    p = _advise("--ctx", "32k,128k,185k", "--step-ms", "159,714,1430", "--commit-len", "7.0,7.88,7.88", "--gpu",
                "rtx-pro-6000", "--tp", "8", "--expert-dtype", "int4", "--path", "sglang", "--text", "predictable")
    assert '{"sglang": {"predictable": {"num_speculative_tokens_per_seq_len": {"0": 8}}}}' in p.stdout
    assert "break-even" in p.stdout and "22.71 ms" in p.stdout and "batch 1" in p.stdout
    rows = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("sglang")]
    assert "no loss is proven" in p.stdout and len(rows) == 3
    assert all(ln.rstrip().endswith("bound") for ln in rows)  # a loss against a bound is marked so, not "off"


@pytest.mark.parametrize("args, msg", [
    (["--ctx", "32k,128k", "--step-ms", "159"], "--commit-len"),
    (["--ctx", "32k,128k", "--step-ms", "159", "--commit-len", "7"], "one verify step time per context"),
    (["--ctx", "32k", "--step-ms", "159", "--commit-len", "7,8"], "one commit length or one per context"),
    (["--ctx", "32k", "--step-ms", "159", "--commit-len", "0.5"], "commit length at 32k must be a finite number >= 1"),
    (["--ctx", "32k", "--step-ms", "159", "--commit-len", "12"], "exceeds budget + 1 (9)"),
    (["--ctx", "32k", "--step-ms", "159", "--commit-len", "7", "--budget", "0"], "budget must be an integer in 1..1024"),
    (["--ctx", "32k", "--step-ms", "159", "--commit-len", "7", "--budget", "2000"], "1..1024"),
    (["--ctx", "32k", "--step-ms", "159", "--commit-len", "x"], "bad commit length 'x'"),
    (["--ctx", "32k", "--step-ms", "159", "--commit-len", "7", "--tp", "8", "--dcp", "3"], "--dcp 3 does not divide"),
])
def test_bad_input_is_one_line(args, msg):
    p = _advise(*args, ok=False)
    assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1


def test_a_decode_step_longer_than_the_verify_step_is_said():
    p = _advise("--ctx", "32k", "--step-ms", "15", "--commit-len", "3", "--decode-ms", "20")
    assert "the plain decode step (20 ms) is longer than the 9-row verify step (15 ms) at 32k" in p.stderr


def test_a_step_faster_than_physics_is_refused_as_a_bug():
    """kimi-k2.6 on an H200 at 32k: the one-row step reads 57.9 GB of weights and KV at least (13.68 ms); a 10 ms
    verify step (or plain step) would be 100 tok/s above the 73 the bytes permit: refused, not printed."""
    p = _advise("--ctx", "32k", "--step-ms", "10", "--commit-len", "3", "--decode-ms", "20", ok=False)
    assert p.stdout == "" and "a bug, not printed: the 9-row verify step at 32k" in p.stderr
    assert "below the one-row step's floor 13.68 ms" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = _advise("--ctx", "32k", "--step-ms", "20", "--commit-len", "3", "--decode-ms", "5", ok=False)
    assert "the plain decode step at 32k" in p.stderr


def test_floor_rows_are_floor_against_floor():
    """advise's floor rows: the verify step and the plain decode step both at their floors; measured beside."""
    from ddprobe.probes.advise import FLOOR_PATH, floor_points

    model, _ = served_model(get_model("kimi-k2.6"), Sharding(), "h200")
    pts = points_typed([8192, 32768], [30.0, 40.0], [7.0], [20.0], 8, "split_ws", "novel", "typed")
    fl = floor_points(pts, model)
    assert [p.path for p in fl] == [FLOOR_PATH, FLOOR_PATH]
    for p in fl:
        assert p.decode_ms == pytest.approx(model.cost(p.ctx, 1).floor_ms) and p.decode_ms < 20.0
        assert p.verify_ms == pytest.approx(model.cost(p.ctx, 9).floor_ms)


def test_from_a_commit_file(tmp_path):
    p = _advise("--from", "examples/commit-tiny-cpu-long-2026-12-02.json", "--decode-ms", "30", "--json")
    d = json.loads(p.stdout)
    src = json.loads(open("examples/commit-tiny-cpu-long-2026-12-02.json").read())
    cell = next(r for r in src["rows"] if r["text"] == "novel" and r["ctx"] == 131072)
    row = next(r for r in d["rows"] if r["text"] == "novel" and r["ctx"] == 131072 and r["path"] != "floor")
    assert row["spec_tok_s"] == pytest.approx(cell["commit_len"] / cell["decode_ms_per_step"] * 1e3)
    assert {v["text"] for v in d["summary"]["verdicts"]} == {"predictable", "novel"}
    # the tiny CPU engine's steps against K2's plain decoding: said, as floor --steps-from says it
    assert ("commit-tiny-cpu-long-2026-12-02.json's steps cannot be kimi-k2.6's (the tiny engine preset; measured on "
            "the CPU;") in p.stderr
    p = _advise("--from", "tests/data/floor-rtx-pro-6000-tp8.json", ok=False)
    assert "takes a commit file" in p.stderr


def test_the_report_shows_the_verdicts_and_the_plot(tmp_path):
    f = tmp_path / "advise.json"
    _advise("--ctx", "32k,128k", "--step-ms", "159,714", "--commit-len", "7", "--decode-ms", "20", "--path", "sglang",
            "-o", str(f))
    p = subprocess.run([sys.executable, "-m", "ddprobe", "report", str(f), "-o", str(tmp_path / "r.html")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    html = (tmp_path / "r.html").read_text()
    assert "With sglang, speculation loses beyond about 28.7k" in html and "num_speculative_tokens_per_seq_len" in html
    assert "Tokens/s with speculation (best budget per context) against plain decoding" in html  # the plot


def test_measured_on_this_machine(tmp_path):
    """No numbers typed: the engine measured here (the CPU: tiny, reference path): commit lengths of the shipped
    trained pair and the DDTree and plain decode steps, each point's tokens/s from them."""
    f = tmp_path / "a.json"
    p = _advise("--ctx", "1k", "--budgets", "2", "--steps", "2", "--max-new-tokens", "8", "--texts", "predictable",
                "--tree", "ddtree", "-o", str(f))
    assert "step times through reference" in p.stderr and "commit length, ddtree at budget 2" in p.stderr
    d = json.loads(f.read_text())
    (row,) = d["rows"]  # no GPU: no bandwidth, no floor row
    assert (row["path"], row["text"], row["ctx"], row["budget"]) == ("reference", "predictable", 1024, 2)
    assert 1 <= row["commit_len"] <= 3 and row["decode_ms"] > 0 and row["verify_ms"] > 0
    assert row["spec_tok_s"] == pytest.approx(row["commit_len"] / row["verify_ms"] * 1e3)
    assert d["config"]["measured"]["preset"] == "tiny" and d["summary"]["decode_source"].startswith("measured")


def test_outputs_never_replace_inputs_or_earlier_results(tmp_path):
    f = tmp_path / "a.json"
    typed = ["--ctx", "32k", "--step-ms", "159", "--commit-len", "7", "--decode-ms", "20"]
    _advise(*typed, "-o", str(f))
    before = f.read_text()
    p = _advise(*typed, "-o", str(f), ok=False)
    assert "already holds results measured earlier" in p.stderr and f.read_text() == before
    _advise(*typed, "-o", str(f), "--force")
    src = tmp_path / "c.json"
    src.write_text(open("examples/commit-tiny-cpu-long-2026-12-02.json").read())
    p = _advise("--from", str(src), "--decode-ms", "30", "-o", str(src), ok=False)
    assert "is also the input --from" in p.stderr


def test_the_rfc_bucket_starts_between_the_two_contexts_around_a_change():
    # off at 8k, 16k, 32k (7 per 100 ms against 1 per 10-13 ms), on at 64k (7 per 100 ms against 1 per 20 ms)
    pts = points_typed([8192, 16384, 32768, 65536], [100, 100, 100, 100], [7.0], [10, 12, 13, 20], 8, "p", "t", "x")
    (v,) = advise(pts)
    assert [b["budget"] for b in v.best] == [0, 0, 0, 8]
    assert rfc_table(v) == {"0": 0, str(round(math.sqrt(32768 * 65536))): 8}


def test_extrapolation_keeps_one_budget():
    """Below the smallest context the verify step is extended through points of one tree size: the first context's
    best budget, at the second context too (not that context's own best)."""
    pts = [Point("p", "t", 32768, 8, 7.0, 159.0, 20.0), Point("p", "t", 131072, 8, 7.0, 714.0, 20.0),
           Point("p", "t", 32768, 2, 2.0, 150.0, 20.0), Point("p", "t", 131072, 2, 3.0, 200.0, 20.0)]
    (v,) = advise(pts)
    assert v.best[1]["best_budget_if_on"] == 2  # at 128k the small tree is faster
    assert v.crossover_ctx == pytest.approx(32768 - 19 / (555 / 98304), rel=1e-6)  # budget 8's line, as before


def test_twice_the_same_context_is_refused():
    with pytest.raises(DDProbeError, match="a context is given twice"):
        points_typed([32768, 32768], [159, 150], [7.0], [20.0], 8, "p", "t", "x")


def test_tree_chain_or_off_measured_here(tmp_path):
    """The default on the engine compares both shapes: the tree at each budget, the chain at min(budget, L) (the
    chain a budget buys), both measured here (commit lengths of the tiny pair, the engine's own steps), and plain
    decoding; per context the best of each, the choice and its margin; the RFC table names the shape per bucket."""
    f = tmp_path / "a.json"
    p = _advise("--ctx", "1k", "--budgets", "2,8", "--steps", "2", "--max-new-tokens", "12", "--texts", "novel",
                "-o", str(f))
    d = json.loads(f.read_text())
    got = {(r["tree"], r["budget"]) for r in d["rows"]}
    assert got == {("ddtree", 2), ("ddtree", 8), ("chain", 2), ("chain", 7)}
    chain = next(r for r in d["rows"] if r["tree"] == "chain")
    assert all(r["kernel"] for r in d["rows"]) and "the reference kernel with the chain's causal mask" in chain["kernel"]
    (dec,) = d["summary"]["decisions"]
    tok = {"ddtree": dec["ddtree_tok_s"], "chain": dec["chain_tok_s"], "off": dec["plain_tok_s"]}
    best = max(tok, key=tok.get)
    assert dec["choice"].split("@")[0] == best and dec["batch"] == 1
    assert dec["margin"] == pytest.approx(sorted(tok.values())[-1] / sorted(tok.values())[-2])
    cell = d["summary"]["vllm_rfc_48627"]["reference"]["novel"]
    assert cell["method_per_seq_len"]["0"] in ("ddtree", "chain", "off")
    assert "tree, chain or off, batch 1" in p.stdout


@pytest.mark.parametrize("args, msg", [
    (["--tree", "star"], "--tree: unknown tree shape 'star'"),
    (["--chain-depths", "9"], "--chain-depths: depth 9 is beyond the drafter's block"),
])
def test_bad_shape_input_is_one_line(args, msg):
    p = _advise("--device", "cpu", "--ctx", "1k", *args, ok=False)
    assert msg in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("ms", [1e300, 1e-300])
def test_impossible_step_times_in_a_from_file_are_refused(tmp_path, ms):
    """issue 65: a step time read from a file is checked like a typed one (it printed 7.94e-297 and 7.94e+303
    tok/s): one line naming the file, the row and the field."""
    d = json.loads(open("examples/commit-tiny-cpu-long-2026-12-02.json").read())
    d["rows"][1]["decode_ms_per_step"] = ms
    f = tmp_path / "c.json"
    f.write_text(json.dumps(d))
    p = _advise("--from", str(f), "--decode-ms", "30", ok=False)
    assert f"c.json: row 2 (predictable ctx=16384): 'decode_ms_per_step' is {ms:.4g} ms, not a measured time (must be " \
           "between 1 us and 1 h)" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_an_old_from_file_is_treated_as_ddtree():
    p = _advise("--from", "examples/commit-tiny-cpu-long-2026-12-02.json", "--decode-ms", "30", "--json")
    assert "says no draft shape (a file from before shapes): its cells are treated as ddtree" in p.stderr
    assert {r["tree"] for r in json.loads(p.stdout)["rows"]} == {"ddtree"}


def test_a_sweep_file_from_commit_keeps_each_cells_shape_and_budget(tmp_path):
    f = tmp_path / "c.json"
    subprocess.run([sys.executable, "-m", "ddprobe", "commit", "--tree", "ddtree,chain", "--budgets", "2", "--ctx",
                    "1k", "--text", "novel", "--max-new-tokens", "8", "--json", str(f)], check=True,
                   capture_output=True, timeout=300)
    p = _advise("--from", str(f), "--decode-ms", "30", "--json")
    rows = json.loads(p.stdout)["rows"]
    assert {(r["tree"], r["budget"]) for r in rows if r["path"] != "floor"} == {("ddtree", 2), ("chain", 2)}
    assert "treated as ddtree" not in p.stderr


def test_device_cuda_without_a_gpu_is_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    p = _advise("--device", "cuda", ok=False)
    assert "--device cuda: no CUDA GPU is visible to torch" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
