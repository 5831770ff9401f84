"""advise's tree-or-chain decision on commit files that hold both shapes (a review's cases, issue 61): the floor rows
keep a tree and a chain of one size apart, the RFC table starts a bucket where the shape changes, an unproven "off"
keeps the best speculation with its margin over the next speculative option, a shapeless server file is still held
to physics, and typed numbers refuse the options of a measurement. Files are the shipped CPU commit file's first row
with the cells' numbers changed (a server's rows: backend sglang)."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def commit_file(tmp_path: Path, cells: list[dict], name: str = "c.json") -> Path:
    base = json.loads((DATA / "commit-tiny-cpu.json").read_text())
    row = {**base["rows"][0], "backend": "sglang"}
    base["rows"] = [{**row, **c} for c in cells]
    base["config"] = {"ctx": sorted({c["ctx"] for c in cells}), "text": ["predictable", "novel"], "max_new_tokens": 16,
                      "seed": 0, "budget": 8, "backend": "sglang"}  # a server's: no engine preset, no device
    path = tmp_path / name
    path.write_text(json.dumps(base))
    return path


def advise(*args):
    r = runner.invoke(app, ["advise", *args])
    return r


def cell(ctx, tree, budget, commit, step_ms, text="predictable"):
    return {"text": text, "ctx": ctx, "tree": tree, "budget": budget, "commit_len": commit,
            "decode_ms_per_step": step_ms}


def test_floor_rows_keep_a_tree_and_a_chain_of_one_size_apart_and_the_rfc_table_follows_the_shape(tmp_path):
    f = commit_file(tmp_path, [cell(32768, "ddtree", 4, 3.0, 50.0), cell(32768, "chain", 4, 2.0, 50.0),
                               cell(65536, "ddtree", 4, 2.0, 60.0), cell(65536, "chain", 4, 3.0, 60.0)])
    out = tmp_path / "a.json"
    r = advise("--from", str(f), "--gpu", "h100", "--decode-ms", "100", "-o", str(out))
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    floor = [(p["ctx"], p["tree"], p["commit_len"]) for p in res["rows"] if p["path"] == "floor"]
    assert sorted(floor) == [(32768, "chain", 2.0), (32768, "ddtree", 3.0), (65536, "chain", 3.0),
                             (65536, "ddtree", 2.0)]
    # the tree wins at 32k (3 tokens per 50 ms), the chain at 64k (3 per 60 ms): same size, two buckets
    cellj = res["summary"]["vllm_rfc_48627"]["sglang"]["predictable"]
    assert list(cellj["num_speculative_tokens_per_seq_len"].values()) == [4, 4]
    assert list(cellj["method_per_seq_len"].values()) == ["ddtree", "chain"]


def test_an_unproven_off_keeps_the_best_speculation_with_its_margin_over_the_next(tmp_path):
    # ddtree@8: 3 tokens / 100 ms = 30 tok/s; chain@7: 2.5 / 90 ms = 27.8; plain at its floor on an H100 is faster
    f = commit_file(tmp_path, [cell(32768, "ddtree", 8, 3.0, 100.0), cell(32768, "chain", 7, 2.5, 90.0)])
    out = tmp_path / "a.json"
    r = advise("--from", str(f), "--gpu", "h100", "-o", str(out))
    assert r.exit_code == 0, r.output
    (d,) = [d for d in json.loads(out.read_text())["summary"]["decisions"] if d["path"] == "sglang"]
    assert d["choice"] == "ddtree@8 (off unproven)"
    assert d["margin"] == pytest.approx(30.0 / (2.5 / 0.090), rel=1e-6)


def test_a_shapeless_server_file_is_still_held_to_physics(tmp_path):
    f = commit_file(tmp_path, [{**cell(32768, None, None, 3.0, 0.01), "text": t} for t in ("predictable", "novel")])
    r = advise("--from", str(f), "--gpu", "h100")
    assert r.exit_code == 1 and "a bug, not printed" in r.output, r.output


@pytest.mark.parametrize("extra", [["--tree", "chain"], ["--chain-depths", "7"], ["--budgets", "4,8"],
                                   ["--paths", "split"]])
def test_typed_numbers_refuse_the_options_of_a_measurement(extra):
    r = advise("--ctx", "32k", "--step-ms", "159", "--commit-len", "7", *extra)
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    assert extra[0] in r.output and "only for a measurement here" in r.output
