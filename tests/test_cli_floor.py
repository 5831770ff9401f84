"""`ddprobe floor` through Typer's CliRunner: output, JSON, results file, configs and error paths."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.results import Result
from ddprobe.physics.gpus import KERNEL_CLASS_BOUND

runner = CliRunner()

KIMI_CONFIG = {  # shaped like Kimi K2.x's multimodal config: the language model under text_config
    "architectures": ["KimiK25ForConditionalGeneration"],
    "text_config": {
        "model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 64,
        "vocab_size": 163840, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "q_lora_rank": 1536, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
    },
}
LLAMA_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336}


def run(*args):
    return runner.invoke(app, list(args))


def test_help_lists_floor():
    r = run("--help")
    assert r.exit_code == 0 and "floor" in r.output


def test_floor_table_reproduces_investigation():
    r = run("floor", "--model", "kimi-k2.6", "--ctx", "128k", "--bw", "1.8TB/s", "--step-ms", "714")
    assert r.exit_code == 0, r.output
    assert "9.21 GB" in r.output and "5.12 ms" in r.output and "140x" in r.output and "15.5x" in r.output


def test_investigation_anatomy_in_one_command():
    r = run("floor", "--ctx", "32k,128k,185k", "--step-ms", "159,714,1430", "--tp", "8", "--gpu", "rtx-pro-6000")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "32k -> 128k 5.78 12.4 GB/s" in text and "128k -> 185k 12.6 5.73 GB/s" in text
    assert "not linear" in text and "At 185k the context-dependent part" in text
    assert "routed experts (bf16): 9 rows x top-8 of 384" in text


def test_anatomy_json_and_failed_anatomy_keeps_the_floor(tmp_path):
    r = run("floor", "--ctx", "32k,128k,185k", "--step-ms", "159,714,1430", "--tp", "8", "--json")
    an = json.loads(r.stdout)["summary"]["anatomy"]
    assert [round(i["ms_per_1k"], 2) for i in an["intervals"]] == [5.78, 12.56]
    path = tmp_path / "f.json"
    r = run("floor", "--ctx", "32k,128k", "--step-ms", "714,159", "--out", str(path))
    assert r.exit_code == 1 and "step times decrease" in r.output and str(path) in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert [row["step_ms"] for row in Result.load(path).rows] == [714, 159]  # nothing measured lost


def test_whole_step_columns_and_dense_note(tmp_path):
    r = run("floor", "--ctx", "128k", "--tp", "8", "--ep", "8", "--expert-dtype", "int4", "--json")
    row = json.loads(r.stdout)["rows"][0]
    assert row["experts_worst"] == 48 and 8.2 < row["experts_per_layer"] < 8.4 and row["binds"] == "bandwidth"
    assert row["floor_ms"] > max(row["kv_floor_ms"], row["weight_floor_ms"])
    r = run("floor", "--model", "llama-3.1-8b", "--ctx", "1k")
    assert r.output.count("dense model (no MoE fields): the routed-expert terms are zero") == 1


def test_real_configs_match_presets():
    for cfg, preset in (("tests/data/configs/kimi-k2.6-config.json", "kimi-k2.6"),
                        ("tests/data/configs/deepseek-v3-config.json", "deepseek-v3")):
        a = json.loads(run("floor", "--config", cfg, "--ctx", "64k", "--tp", "8", "--ep", "8", "--json").stdout)
        b = json.loads(run("floor", "--model", preset, "--ctx", "64k", "--tp", "8", "--ep", "8", "--json").stdout)
        assert a["rows"] == b["rows"] and a["config"]["moe_layers"] == b["config"]["moe_layers"]
    ds = json.loads(run("floor", "--config", "tests/data/configs/deepseek-v3-config.json", "--ctx", "1k",
                        "--json").stdout)
    assert ds["config"]["moe_layers"] == 61 - 3 and ds["config"]["n_routed_experts"] == 256


def test_steps_from_a_commit_file():
    r = run("floor", "--model", "kimi-k2.6", "--steps-from", "tests/data/commit-tiny-cpu.json", "--json")
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)
    assert all(row["step_ms"] for row in printed["rows"])


def test_floor_json_and_results_file(tmp_path):
    path = tmp_path / "floor.json"
    r = run("floor", "--ctx", "1k,128k", "--gpu", "rtx-pro-6000", "--tp", "8", "--step-ms", "10,714ms",
            "--json", "--out", str(path))
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)
    assert printed["kind"] == "floor" and [row["ctx"] for row in printed["rows"]] == [1024, 131072]
    assert printed["rows"][1]["step_ms"] == pytest.approx(714)
    assert printed["config"]["gpu"] == "rtx-pro-6000" and printed["config"]["bw_Bps"] == 1.792e12
    saved = Result.load(path)
    assert saved.rows == printed["rows"] and saved.meta.command


def test_config_files_match_presets(tmp_path):
    kimi = tmp_path / "kimi.json"
    kimi.write_text(json.dumps(KIMI_CONFIG))
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps(LLAMA_CONFIG))
    for cfg, preset in ((kimi, "kimi-k2.6"), (llama, "llama-3.1-8b")):
        a = json.loads(run("floor", "--config", str(cfg), "--ctx", "64k", "--json").stdout)["rows"][0]
        b = json.loads(run("floor", "--model", preset, "--ctx", "64k", "--json").stdout)["rows"][0]
        assert a == b


@pytest.mark.parametrize("args,fragment", [
    (["--model", "gpt-5"], "unknown model 'gpt-5'; served models: kimi-k2.6"),
    (["--gpu", "tpu-v9"], "unknown GPU 'tpu-v9'; known: rtx-pro-6000"),
    (["--ctx", "12x"], "bad token count '12x'"),
    (["--ctx", "0"], "greater than zero"),
    (["--budget", "0"], "--budget: must be in 1..4096, got 0"),
    (["--tp", "-2"], "--tp must be at least 1"),
    (["--bw", "fast"], "bad bandwidth 'fast'"),
    (["--bw", "0TB/s"], "greater than zero"),
    (["--step-ms", "-5"], "bad time"),
    (["--step-ms", "1,2", "--ctx", "1k,2k,4k"], "one per context"),
    (["--tflops", "0"], "--tflops: bad FLOP rate 0.0: must be between"),
    (["--weight-dtype", "fp7"], "unknown dtype 'fp7'"),
    (["--tp", "8", "--ep", "5"], "--ep 5 does not divide the model's 384 routed experts"),
    (["--model", "deepseek-v3", "--tp", "8", "--ep", "3"], "--ep 3 does not divide the model's 256 routed experts"),
    (["--ctx", "32k", "--step-ms", "159", "--anatomy"], "two or more contexts, got 1"),
    (["--ctx", "32k,128k", "--step-ms", "714,159"], "step times decrease with context"),
    (["--config", "/nonexistent/config.json"], "cannot read config"),
    (["--ctx", "1e300"], "beyond any model"),
    (["--tp", "3"], "tp 3 does not divide the model's 64 attention heads"),
    (["--model", "qwen3-8b", "--tp", "3"], "tp 3 does not divide the model's 32 attention heads"),
])
def test_bad_input_is_one_line_and_exit_1(args, fragment):
    r = run("floor", *args)
    assert r.exit_code == 1, r.output
    assert fragment in r.output
    assert "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_malformed_configs(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = run("floor", "--config", str(bad))
    assert r.exit_code == 1 and "not valid JSON" in r.output
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"hidden_size": 4096}))
    r = run("floor", "--config", str(partial))
    assert r.exit_code == 1 and "no 'num_hidden_layers'" in r.output


@pytest.mark.parametrize("change,fragment", [
    ({"head_dim": -128}, "'head_dim' must be a positive integer up to 16,777,216, got -128"),
    ({"num_key_value_heads": -8}, "'num_key_value_heads' must be a positive integer up to 16,777,216, got -8"),
    ({"num_hidden_layers": 10 ** 12}, "'num_hidden_layers' must be a positive integer up to 16,777,216, got "
                                      "1000000000000"),  # was a floor of 3e10 s, printed without a word
    ({"vocab_size": 2 ** 30}, "'vocab_size' must be a positive integer up to 16,777,216"),
    ({"num_key_value_heads": 5}, "num_heads 32 is not a multiple of num_key_value_heads 5".replace(
        "num_key_value_heads 5", "num_kv_heads 5")),
    ({"intermediate_size": "big"}, "'intermediate_size' must be a positive integer"),
])
def test_config_values_validated(tmp_path, change, fragment):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(LLAMA_CONFIG | change))
    r = run("floor", "--config", str(cfg))
    assert r.exit_code == 1, r.output
    assert fragment in r.output and str(cfg) in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_non_utf8_and_nan_configs_are_one_line(tmp_path):
    binary = tmp_path / "bad.json"
    binary.write_bytes(b"\xff\xfe\x00garbage\x80")
    r = run("floor", "--config", str(binary))
    assert r.exit_code == 1 and "not UTF-8 text" in r.output and "Traceback" not in r.output
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(LLAMA_CONFIG).replace("14336", "NaN"))
    r = run("floor", "--config", str(nan))
    assert r.exit_code == 1 and "NaN is not valid JSON" in r.output


def test_help_and_floor_never_import_torch():
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from ddprobe.cli import app; r = CliRunner(); "
            "assert r.invoke(app, ['--help']).exit_code == 0; "
            "assert r.invoke(app, ['floor', '--ctx', '1k', '--json']).exit_code == 0; "
            "assert r.invoke(app, ['report', 'tests/data/floor-rtx-pro-6000-tp8.json', '-o', sys.argv[1]]).exit_code == 0; "
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'GPU library imported'")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-c", code, f"{d}/r.html"], check=True, timeout=120)


def test_serve_port_in_use_is_one_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = runner.invoke(app, ["serve", "--port", str(s.getsockname()[1])])
    assert r.exit_code == 1 and "cannot listen on 127.0.0.1" in r.output and "Traceback" not in r.output


def test_python_dash_m_ddprobe():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ddprobe", "floor", "--ctx", "1k", "--json"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["rows"][0]["kv_B_per_token"] == 61 * 576 * 2


def test_steps_from_refuses_ctx_and_warns_on_another_model():
    r = run("floor", "--steps-from", "tests/data/commit-tiny-cpu.json", "--ctx", "1k")
    assert r.exit_code == 1 and "give --ctx or --steps-from, not both" in r.output and "Traceback" not in r.output
    r = run("floor", "--model", "kimi-k2.6", "--steps-from", "tests/data/commit-tiny-cpu.json", "--json")
    assert r.exit_code == 0 and "cannot be kimi-k2.6's steps (the tiny engine preset; measured on the CPU" in r.stderr
    # the k2 engine preset on an H200: K2.6's layers, latent row and vocabulary, heads a tp-8 share of 64, but
    # 48 experts and hidden 1024: not kimi-k2.6's steps, said
    r = run("floor", "--model", "kimi-k2.6", "--tp", "8", "--steps-from", "tests/data/gpu-util-h200-paged.json")
    assert r.exit_code == 0 and "cannot be kimi-k2.6's steps (the k2 engine preset; experts 48, not 384)" in r.output
    r = run("floor", "--model", "k2", "--steps-from", "tests/data/gpu-util-h200-paged.json")
    assert r.exit_code == 0 and "cannot be" not in r.output, r.output


def test_steps_from_an_engine_file_takes_its_preset_and_says_its_gpu():
    """A k2 engine file without --model is k2's floor (said), not kimi-k2.6's 371 GB of weights; with --gpu h100 on
    this H200 file the warning names the file's GPU. In a fresh process, as typed."""
    f = "tests/data/gpu-util-h200-deep-paged.json"
    p = subprocess.run([sys.executable, "-m", "ddprobe", "floor", "--steps-from", f, "--json"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["config"]["model"] == "k2" and res["config"]["n_routed_experts"] == 48
    assert res["rows"][0]["weights_GB"] < 40 and not res["rows"][0]["below_floor"]
    assert "ran ddprobe's k2 engine preset (one GPU's share of Kimi K2 at tp 8 / ep 8, 48 experts" in p.stderr
    assert "cannot be" not in p.stderr
    r = run("floor", "--steps-from", f, "--gpu", "h100")
    assert r.exit_code == 0 and "measured on NVIDIA H200, not the h100 the floor is of" in " ".join(r.output.split())
    r = run("floor", "--steps-from", f, "--gpu", "h200", "--model", "k2")
    assert r.exit_code == 0 and "cannot be" not in r.output and "ran ddprobe's" not in r.output


def test_a_step_below_the_floor_is_flagged_and_said_once():
    r = run("floor", "--model", "kimi-k2.6", "--ctx", "1k,4k", "--step-ms", "30,40", "--json")  # tp 1 floor 77 ms
    rows = json.loads(r.stdout)["rows"]
    assert [row["below_floor"] for row in rows] == [True, True]
    assert r.stderr.count("step below the floor: check --tp/--ep/--weight-dtype/--expert-dtype") == 1
    r = run("floor", "--model", "kimi-k2.6", "--ctx", "1k,4k", "--step-ms", "30,40")
    assert "30 ms!" in r.stdout and r.stdout.count("step below the floor: check --tp/--ep") == 1
    assert "it is not the fixed cost" in r.stdout  # the fitted 26.7 ms intercept is under the 77 ms weight floor
    r = run("floor", "--model", "kimi-k2.6", "--tp", "8", "--ctx", "1k,4k", "--step-ms", "30,40", "--json")
    assert not any(row["below_floor"] for row in json.loads(r.stdout)["rows"]) and "below" not in r.stderr


def test_dtype_help_lists_what_is_accepted_and_ep_on_dense():
    from ddprobe.physics.shapes import DTYPE_BYTES

    help_text = " ".join(run("floor", "--help").stdout.replace("│", " ").split())  # the panel's borders out
    assert f"KV cache dtype: {', '.join(DTYPE_BYTES)}." in help_text
    assert "int4 counts 0.5 B per weight, without its scales (K2's group-32 bf16 scales add 1/16): a lower bound" \
        in help_text
    for d in DTYPE_BYTES:
        assert run("floor", "--kv-dtype", d, "--ctx", "1k", "--json").exit_code == 0, d
    r = run("floor", "--kv-dtype", "int9", "--ctx", "1k")
    assert r.exit_code == 1 and "--kv-dtype: unknown dtype 'int9'" in r.output
    r = run("floor", "--model", "qwen3-8b", "--tp", "2", "--ep", "2", "--ctx", "1k", "--json")
    assert r.exit_code == 0 and r.stderr.count("qwen3-8b is dense (no routed experts): --ep 2 has no effect") == 1


def test_launches_are_a_named_part_and_a_step_below_them_is_refused():
    """kimi-k2.6 (61 layers) on an L40S (no measured kernel time: the class bound, said): at least 5 x 61 + 2 = 307
    kernels x 0.75 us = 230 us of launches; a 0.2 ms step is refused naming both numbers; --kernels 100 lets it be."""
    r = run("floor", "--ctx", "1k", "--gpu", "l40s", "--step-ms", "0.2")
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1
    assert "--step-ms 200 us at 1k is below the latency floor 230 us (307 kernels x 0.75 us)" in r.output
    r = run("floor", "--ctx", "1k", "--gpu", "l40s")
    assert r.exit_code == 0 and "launches: 307 kernels x 0.75 us = 230 us" in r.output
    said = " ".join(r.output.split())
    assert "(graph-replayed; l40s not measured by ddprobe: a class bound of 0.75 us per graph-replayed kernel" in said
    assert "no measurement" not in said and "not measured here" not in said and "data-center" not in said
    r = run("floor", "--ctx", "1k", "--gpu", "l40s", "--json", "--kernels", "100", "--step-ms", "1000")
    row = json.loads(r.output)["rows"][0]
    bound_ms = KERNEL_CLASS_BOUND.graph_us / 1e3  # one kernel at the class bound
    assert (row["kernels"], row["latency_floor_ms"]) == (100, pytest.approx(100 * bound_ms))
    assert row["step_bound"] == "bandwidth-bound" and row["launch_share"] == pytest.approx(100 * bound_ms / 1000)


def test_steps_from_a_gpu_util_file_takes_the_engines_counted_kernels(tmp_path):
    """A gpu-util file whose engine counted its kernels on the GPU: `floor --steps-from` uses that count (the
    structural bound otherwise) and splits the step into its launch and bytes parts."""
    src = json.loads(Path("tests/data/gpu-util-h200-split.json").read_text())
    plain = run("floor", "--steps-from", "tests/data/gpu-util-h200-split.json", "--json")
    assert plain.exit_code == 0 and json.loads(plain.stdout[plain.stdout.index("{"):])["rows"][0]["kernels"] == 307
    src["summary"]["request"].update(kernels=1424, launches_source="kernels: counted on the GPU: 1424 per DDTree step")
    f = tmp_path / "util.json"
    f.write_text(json.dumps(src))
    r = run("floor", "--steps-from", str(f), "--json")
    row = json.loads(r.stdout[r.stdout.index("{"):])["rows"][0]
    launches_ms = 1424 * KERNEL_CLASS_BOUND.graph_us / 1e3  # an H200: no measurement, the class bound
    assert row["kernels"] == 1424 and row["latency_floor_ms"] == pytest.approx(launches_ms)
    assert row["launch_share"] == pytest.approx(launches_ms / row["step_ms"]) and row["step_bound"] == "bandwidth-bound"


H100_LAUNCH = Path("tests/data/launch/bench-launch-h100.json")  # `bench launch` on the lent H100, 2026-12-06


def _launch_file(tmp_path, **us) -> Path:
    """The H100's launch file with some rows' times replaced (kind -> us)."""
    d = json.loads(H100_LAUNCH.read_text())
    for r in d["rows"]:
        k = r["kind"].replace("-", "_")
        if k in us:
            r["us"] = r["p10_us"] = r["p90_us"] = us[k]
    f = tmp_path / "launch.json"
    f.write_text(json.dumps(d))
    return f


def test_a_bench_launch_file_changes_the_launches_column(tmp_path):
    """The shipped H100 figure is the file's least graph time: graph-empty 0.779 us (smaller than graph-small 0.982):
    307 kernels (5 x 61 + 2) x 0.779 us = 239 us. A file whose graph kernels take 2.0 / 2.5 us gives 307 x 2.0 = 614
    us in the same column, said as measured from that file."""
    empty = next(r["us"] for r in json.loads(H100_LAUNCH.read_text())["rows"] if r["kind"] == "graph-empty")
    assert empty == pytest.approx(0.779, abs=5e-4)
    base = run("floor", "--gpu", "h100", "--ctx", "1k")
    assert base.exit_code == 0, base.output
    assert "launches: 307 kernels x 0.779 us = 239 us" in base.output
    f = _launch_file(tmp_path, graph_empty=2.0, graph_small=2.5)
    r = run("floor", "--gpu", "h100", "--ctx", "1k", "--launch-from", str(f))
    assert r.exit_code == 0, r.output
    assert "launches: 307 kernels x 2 us = 614 us" in r.output and str(f) in " ".join(r.output.split())
    cells = {o: [line.split() for line in o.splitlines() if line.split()[:1] == ["1k"]][0] for o in (base.output,
                                                                                                      r.output)}
    assert "239" in cells[base.output] and "614" in cells[r.output]  # the table's launches column
    row = json.loads(run("floor", "--gpu", "h100", "--ctx", "1k", "--launch-from", str(f), "--json").output)["rows"][0]
    assert row["kernel_us"] == 2.0 and row["latency_floor_ms"] == pytest.approx(307 * 2.0 / 1e3)


def test_launch_file_of_another_gpu_is_said_and_used_only_if_asked(tmp_path):
    r = run("floor", "--gpu", "h200", "--ctx", "1k", "--launch-from", str(H100_LAUNCH))
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1
    assert "was measured on NVIDIA H100 80GB HBM3, not on the h200" in r.output and "--launch-any-gpu" in r.output
    r = run("floor", "--gpu", "h200", "--ctx", "1k", "--launch-from", str(H100_LAUNCH), "--launch-any-gpu")
    assert r.exit_code == 0 and "used for the h200 as asked" in " ".join(r.output.split())
    assert "307 kernels x 0.779 us" in r.output
    r = run("floor", "--gpu", "h200", "--ctx", "1k", "--launch-any-gpu")
    assert r.exit_code == 1 and "--launch-any-gpu needs --launch-from" in r.output


@pytest.mark.parametrize("us, says", [(dict(graph_empty=0.05), "graph-empty takes 0.05 us per kernel, below 0.1 us"),
                                      (dict(sync=-1.0), "sync takes -1.0 us per kernel, below 0.1 us")])
def test_an_impossible_launch_time_is_one_line(tmp_path, us, says):
    r = run("floor", "--gpu", "h100", "--ctx", "1k", "--launch-from", str(_launch_file(tmp_path, **us)))
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1 and says in r.output


def _broken(d: dict, how: str) -> None:
    """Break a launch file's JSON object ``d`` in place the way ``how`` names."""
    rows = {r["kind"]: r for r in d["rows"]}
    if how.startswith("meta="):
        d["meta"] = json.loads(how[5:])
    elif how.startswith("gpus="):
        d["meta"]["gpus"] = json.loads(how[5:])
    elif how == "date":
        d["meta"]["date_utc"] = 20261206
    elif how == "two gpus":
        d["meta"]["gpus"].append({"index": 1, "name": "NVIDIA H200"})
    elif how == "twice":
        d["rows"].append(dict(rows["sync"]))
    elif how == "p90":
        rows["sync"]["p90_us"] = rows["sync"]["us"] / 2
    elif how == "row x":  # a row that is not one: refused, never skipped (graph-small would stand in for graph-empty)
        d["rows"][0] = "x"
    elif how == "row kind null":
        d["rows"][0]["kind"] = None
    else:  # graph-small's us: a literal JSON value (3e9, "fast", NaN)
        rows["graph-small"]["us"] = rows["graph-small"]["p90_us"] = json.loads(how)


@pytest.mark.parametrize("how, says", [
    ('meta=[1]', "'meta' is list, not an object"), ('meta="x"', "'meta' is str, not an object"),
    ('gpus="NVIDIA H100"', "'meta.gpus' is 'NVIDIA H100', not a list of GPUs"), ("gpus=3", "'meta.gpus' is '3'"),
    ("gpus=[[1]]", "'meta.gpus' is '[[1]]', not a list of GPUs"), ('gpus=[{"name": 7}]', "names a GPU by '[7]'"),
    ("date", "'meta.date_utc' is int 20261206, not a date"),
    ("two gpus", "'meta.gpus' names 2 different GPUs (NVIDIA H100 80GB HBM3, NVIDIA H200)"),
    ("twice", "two sync rows"), ("p90", "sync: p10_us"),
    ("4e9", "graph-small takes 4e+09 us per kernel, over 1 h"),
    ('"fast"', "graph-small takes 'fast' us per kernel: not a number"),
    ("NaN", "NaN is not valid JSON"), ("Infinity", "Infinity is not valid JSON"),
    ("row x", "row 1 is str, not an object"), ("row kind null", "row 1 has no text 'kind'")])
def test_a_malformed_launch_file_is_one_line_naming_the_field(tmp_path, how, says):
    """``bench launch`` files broken in their meta (``meta``/``gpus``/``date_utc`` of the wrong type, two GPUs) or
    their rows (a row twice, p10 <= us <= p90 not holding, 4e9 us (over 1 h), a string, NaN, inf, a row that is not an
    object or has no kind): one line, exit 1, no
    traceback, in a fresh process."""
    d = json.loads(H100_LAUNCH.read_text())
    _broken(d, how)
    f = tmp_path / "launch.json"
    f.write_text(json.dumps(d))
    p = subprocess.run([sys.executable, "-m", "ddprobe", "floor", "--gpu", "h100", "--ctx", "1k", "--launch-from",
                        str(f)], capture_output=True, text=True, timeout=120)
    said = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1 and "Traceback" not in said and len((p.stdout + p.stderr).strip().splitlines()) == 1
    assert says in said, said


def test_kernels_against_a_counted_file_and_budget_against_queries(tmp_path):
    src = json.loads(Path("tests/data/gpu-util-h200-split.json").read_text())
    src["summary"]["request"].update(kernels=1424, launches_source="kernels: counted on the GPU: 1424 per DDTree step")
    f = tmp_path / "util.json"
    f.write_text(json.dumps(src))
    r = run("floor", "--steps-from", str(f), "--kernels", "300")
    assert r.exit_code == 1 and "--kernels 300 contradicts" in r.output and "counted 1424" in r.output
    assert run("floor", "--steps-from", str(f), "--kernels", "1424").exit_code == 0
    assert run("floor", "--queries", "9").exit_code == 2  # one name for the tree: --budget
    rows = [json.loads(run("floor", "--ctx", "1k", "--json", *a).output)["rows"][0]["rows"]
            for a in ((), ("--budget", "3"))]
    assert rows == [9, 4]


FLOOR_FLAGS = ["--gpu", "--bw", "--tflops", "--tp", "--ep", "--dcp", "--weight-dtype", "--expert-dtype", "--kv-dtype",
               "--allreduce-us", "--allreduce-from", "--kernels", "--launch-from", "--launch-any-gpu", "--budget"]


@pytest.mark.parametrize("command", [
    "floor",
    "diagnose",
    "advise",
    "trace",
])
def test_floor_commands_take_the_same_floor_options(command):
    """`floor`, `diagnose`, `advise` and `trace` accept the same floor options (cli/floor_options.py's bundle)."""
    import click
    import typer

    from ddprobe.cli.floor_options import FLOOR_OPTION_NAMES

    cmd = typer.main.get_command(app).get_command(click.Context(typer.main.get_command(app)), command)
    flags = {o for p in cmd.params for o in p.opts}
    assert len(FLOOR_FLAGS) == len(FLOOR_OPTION_NAMES)
    missing = [f for f in FLOOR_FLAGS if f not in flags]
    assert not missing, f"`ddprobe {command}` lacks the floor options {missing}"


def test_the_floor_options_bundle_on_another_command():
    """How the lead applies it: a command with its own --budget (the engine's) excludes the bundle's; the rest arrive
    as one FloorOptions; a command that declares a floor option itself is refused when decorated."""
    import typer

    from ddprobe.cli.floor_options import FloorOptions, floor_options
    from ddprobe.physics.models import get_model

    demo = typer.Typer()
    seen = {}

    @demo.command()
    @floor_options(exclude=("budget",))
    def cmd(budget: int = 8, fo: FloorOptions = FloorOptions()):
        seen.update(budget=budget, fo=fo, rows=fo.rows(budget))

    r = runner.invoke(demo, ["--tp", "8", "--budget", "3", "--gpu", "h100", "--launch-from", str(H100_LAUNCH)])
    assert r.exit_code == 0, r.output
    assert (seen["budget"], seen["rows"], seen["fo"].tp, seen["fo"].gpu) == (3, 4, 8, "h100")
    assert seen["fo"].launch().graph_us == pytest.approx(0.779, abs=5e-4)
    model, config = seen["fo"].floor_model(get_model("kimi-k2.6"))
    assert model.tp == 8 and "bench launch on NVIDIA H100 80GB HBM3" in config["launches"]
    with pytest.raises(TypeError, match="declares floor options itself"):
        floor_options()(lambda tp=1, fo=None: None)


@pytest.mark.parametrize("args, says", [
    (("--model", "k2", "--ctx", "32k", "--allreduce-from", "/nonexist"),
     "--allreduce-from times tensor-parallel all-reduces, and at tp 1 there are none"),
    (("--ctx", "1k", "--allreduce-us", "5"), "--allreduce-us times tensor-parallel all-reduces, and at tp 1"),
    (("--ctx", "1k", "--allreduce-us", "5", "--allreduce-from", "/nonexist"),
     "give --allreduce-us or --allreduce-from, not both"),
    (("--ctx", "1k", "--tp", "8", "--allreduce-us", "5", "--allreduce-from", "/nonexist"),
     "give --allreduce-us or --allreduce-from, not both"),
    (("--ctx", "1k", "--tp", "8", "--allreduce-us", "0"), "--allreduce-us must be a finite number above 0 and at most 1 h"),
    (("--ctx", "1k", "--tp", "8", "--allreduce-us", "4e9"), "at most 1 h (3.6e9 us), got 4e+09"),
    (("--ctx", "1k", "--tp", "8", "--allreduce-us", "-3"), "--allreduce-us must be a finite number above 0"),
])
def test_allreduce_options_are_refused_where_they_would_be_ignored_or_impossible(args, says):
    """At tp 1 there is no all-reduce to time: --allreduce-us/--allreduce-from are refused, not silently dropped (the
    "not both" check first, at any tp); --allreduce-us is held to 0 < us <= 1 h. In a fresh process."""
    p = subprocess.run([sys.executable, "-m", "ddprobe", "floor", *args], capture_output=True, text=True, timeout=120)
    said = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1 and len((p.stdout + p.stderr).strip().splitlines()) == 1 and "Traceback" not in said
    assert says in said, said


def test_an_engine_preset_is_headed_as_one_never_as_the_served_model():
    """`floor --model k2` is ddprobe's engine preset (one GPU's share of Kimi K2 at tp 8 / ep 8), not kimi-k2: its
    table's header says so; a served model's header is its name alone. In a fresh process."""
    p = subprocess.run([sys.executable, "-m", "ddprobe", "floor", "--model", "k2", "--ctx", "32k"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})
    assert p.returncode == 0, p.stderr
    head = " ".join(p.stdout.split())  # the title wraps at the table's width
    assert head.startswith("ddprobe's k2 engine preset (one GPU's share of Kimi K2 at tp 8 / ep 8, 48 experts, hidden "
                           "1024, 8 heads): verify step floor per GPU (9 rows"), head
    served = " ".join(run("floor", "--model", "kimi-k2", "--ctx", "32k").output.split())
    assert served.startswith("kimi-k2: verify step floor per GPU") and "engine preset" not in served
