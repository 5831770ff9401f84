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


def test_the_chain_is_priced_on_flashmla_where_it_runs_and_says_so_where_it_does_not():
    """advise prices a chain on FlashMLA (the causal kernel production servers verify a chain with) where it runs;
    here (no GPU) it says why not, and the chain's rows name the tree kernel's causal mask instead. FlashMLA is a
    verify path for causal masks only: never auto's choice, never one of ddprobe's own fixes, and an engine step
    of a DDTree on it is refused before anything is built (the chain and a one-node tree are causal)."""
    import torch

    from ddprobe import verify_paths
    from ddprobe.engine.kernels import reference
    from ddprobe.engine.spec import StepSpec
    from ddprobe.probes.advise import CHAIN_PATH, MeasureOptions, chain_kernel, chain_path_here

    o = MeasureOptions(paths=("reference",), ctxs=(1024,), budgets=(4,), preset="tiny", device="cpu", dtype="fp32",
                       heads=None, trees=("ddtree", "chain"))
    assert chain_path_here(o) == (None, "flashmla runs on a GPU")
    assert chain_kernel("sglang", "sglang") == ("sglang: SGLang's extend kernel with the chain's causal mask "
                                                "(FlashMLA does not run here)")
    assert chain_kernel(CHAIN_PATH, "split_ws").startswith("flashmla: FlashMLA's dense decode kernel, causal")
    row = verify_paths.get(CHAIN_PATH)
    assert row.masks == "causal" and row.theirs and CHAIN_PATH not in verify_paths.fast_names()
    assert verify_paths.auto_path((9, 0), "bf16", (512, 64)) == "split_ws"
    assert "flashmla runs on sm_90 only, not sm_120" == verify_paths.why_not(row, (12, 0), "bf16", (512, 64))

    class Flash:  # the spec reads only the path's name (its row in verify_paths)
        name = CHAIN_PATH
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="the flashmla path verifies causal masks only .* a ddtree tree of 8 nodes"):
        StepSpec(Flash, reference, "contiguous", 8, "ddtree", cpu, torch.float32)
    for shape, budget in (("chain", 7), ("ddtree", 1)):
        assert StepSpec(Flash, reference, "contiguous", budget, shape, cpu, torch.float32).rows == budget + 1
    assert StepSpec(reference, reference, "contiguous", 8, "ddtree", cpu, torch.float32).rows == 9


def test_off_is_plain_decoding_on_the_fastest_decode_kernel_measured():
    """Turning speculation off means decoding on the best kernel there is: per context the faster of the path's own
    one-row step and FlashMLA's (where it was measured), with the kernel it came from."""
    from ddprobe.probes.advise import strongest_plain

    got = strongest_plain("sglang", {8192: 8.46, 32768: 10.68}, {"flashmla": {8192: 6.0, 32768: 11.0}})
    assert got == {8192: (6.0, "flashmla"), 32768: (10.68, "sglang")}
    assert strongest_plain("split_ws", {8192: 6.88}, {}) == {8192: (6.88, "split_ws")}


@pytest.mark.parametrize("attn", ["flashmla", "split_ws"])
def test_a_gpu_only_path_on_the_cpu_is_one_line_naming_its_gpus(attn):
    """The command refuses it before building anything; the engine backend itself (training scripts build one) too."""
    from ddprobe.probes.backends.base import BackendError
    from ddprobe.probes.backends.engine import EngineBackend

    r = CliRunner().invoke(app, ["commit", "--ctx", "1k", "--preset", "k2", "--dtype", "bf16", "--attn", attn,
                                 "--tree", "chain"])
    assert r.exit_code == 1 and f"{attn} runs on sm_90 only, not the CPU" in r.output, r.output
    with pytest.raises(BackendError, match=f"--attn {attn} runs on sm_90 GPUs only: use --device cuda"):
        EngineBackend("k2", attn, budget=7, dtype="bf16", tree="chain")
