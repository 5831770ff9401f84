"""The engine options, defined once: every engine command has all of them with its own defaults, `auto` picks
the device here (no GPU: cpu and fp32), and the options a child process gets rebuild the same engine."""
import dataclasses
import inspect

import pytest
import typer
from typer.testing import CliRunner

from ddprobe import verify_paths
from ddprobe.cli import app
from ddprobe.cli.options import EngineOptions, engine_options, kv_capacity
from ddprobe.probes.commit import CONTEXT_SLACK

ENGINE_FLAGS = ["--preset", "--attn", "--budget", "--device", "--dtype", "--heads", "--weights", "--seed", "--graphs",
                "--compile", "--threads"]


@pytest.mark.parametrize("command", ["commit", "serve", "gpu-util", "diagnose"])
def test_every_engine_command_has_the_engine_options(command):
    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for flag in ENGINE_FLAGS:
        assert flag in r.output, (command, flag)


def test_defaults_per_command_and_round_trip():
    seen = {}
    probe = typer.Typer()

    @probe.command()
    @engine_options(preset="k2", heads=8)
    def cmd(n: int = 1, *, eng: EngineOptions):
        seen["eng"], seen["n"] = eng, n

    r = CliRunner().invoke(probe, [])
    assert r.exit_code == 0, r.output
    assert seen["eng"] == EngineOptions(preset="k2", heads=8)
    want = EngineOptions(preset="tiny", attn="split", budget=4, device="cpu", dtype="fp16", heads=2,
                         weights="random", seed=3, graphs=False, compile=False, threads=1)
    r = CliRunner().invoke(probe, ["--n", "5", *want.args()])  # what a child process is handed
    assert r.exit_code == 0, r.output
    assert seen["eng"] == want and seen["n"] == 5
    r = CliRunner().invoke(probe, ["--graphs"])
    assert r.exit_code == 0 and seen["eng"].graphs is True


def test_commit_alone_compiles_nothing_by_default():
    """commit's answer is the commit length: no torch.compile warm-up unless asked; the commands that time
    steps keep the fused step (None: on with CUDA graphs)."""
    from ddprobe.cli import commit, diagnose, gpu, serve

    def default(fn):
        return inspect.signature(fn).parameters["compile"].default

    assert default(commit.commit) is False
    assert [default(f) for f in (gpu.gpu_util, diagnose.diagnose, serve.serve)] == [None, None, None]


def test_compile_without_cuda_is_refused_in_one_line(tmp_path):
    r = CliRunner().invoke(app, ["commit", "--ctx", "1k", "--compile", "--device", "cpu",
                                 "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 1, r.output
    assert "--compile fuses the CUDA-graph step: it needs --device cuda" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "c.json").exists()


def test_auto_resolves_to_cpu_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto picks cuda")
    r = EngineOptions().resolved()
    assert (r.device, r.dtype, r.attn) == ("cpu", "fp32", "reference")  # no GPU: the CPU runs the reference path
    assert EngineOptions().chosen() == "device cpu (auto), dtype fp32 (auto), attn reference (auto)"
    assert EngineOptions(device="cpu", dtype="fp32").chosen() == "device cpu, dtype fp32, attn reference (auto)"
    assert EngineOptions().attn_reason() == "attn reference: the fastest path that runs this model on the CPU in " \
                                            "fp32 (the Triton paths run on the CPU only under TRITON_INTERPRET, slowly)"
    assert EngineOptions(attn="split").attn_reason() is None
    assert EngineOptions(dtype="fp16", attn="paged").chosen() == "device cpu (auto), dtype fp16"  # typed: no "(auto)"
    assert EngineOptions(device="cpu", dtype="bf16", attn="split").chosen() is None


ARCHS = [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0), None]


@pytest.mark.parametrize("preset", ["tiny", "k2"])
@pytest.mark.parametrize("sm", ARCHS, ids=lambda sm: verify_paths.sm_name(sm))
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp64"])
def test_auto_for_every_preset_architecture_and_dtype(preset, sm, dtype):
    """auto from the path table's capabilities, without a GPU: split_ws only for K2's 512 + 64 rows in bf16/fp16
    on sm_90; split on every other GPU, shape and Triton dtype; the fp32 reference on the CPU and for fp64."""
    row = EngineOptions(preset=preset).model_row()
    assert row == {"tiny": (64, 32), "k2": (512, 64)}[preset]
    name, why = verify_paths.auto_choice(sm, dtype, row)
    if sm is None or dtype == "fp64":
        want = "reference"
    elif sm == (9, 0) and preset == "k2" and dtype in ("bf16", "fp16"):
        want = "split_ws"
    else:
        want = "split"
    assert name == want, (preset, sm, dtype, why)
    assert verify_paths.why_not(verify_paths.get(name), sm, dtype, row) is None  # the choice runs the model here
    assert "\n" not in why and verify_paths.sm_name(sm) in why and dtype in why
    if name != "split_ws" and sm == (9, 0):  # the reason names why the faster path was passed over
        assert "split_ws takes" in why
        if preset == "tiny" and dtype in ("bf16", "fp16"):
            assert "this model's are 64 + 32" in why  # the tiny model's real rope width (32)


def test_the_table_alone_decides():
    """A new row only declares its capabilities: a faster row that runs everywhere wins, one that does not
    run this shape is passed over with its reason."""
    fast = dataclasses.replace(verify_paths.BY_NAME["split"], name="newpath", speed=9, rows=("256+32",))
    saved = verify_paths.PATHS
    try:
        verify_paths.PATHS = saved + (fast,)
        assert verify_paths.auto_choice((9, 0), "bf16", (256, 32))[0] == "newpath"
        name, why = verify_paths.auto_choice((9, 0), "bf16", (512, 64))
        assert name == "split_ws" and "newpath takes MLA rows of 256 + 32; this model's are 512 + 64" in why
        verify_paths.PATHS = saved + (dataclasses.replace(fast, rows=("any",), baseline=True),)
        assert verify_paths.auto_choice((9, 0), "bf16", (512, 64))[0] == "split_ws"  # a baseline is never auto's
    finally:
        verify_paths.PATHS = saved


def test_attn_help_names_every_path():
    assert "auto" in verify_paths.attn_help() and all(n in verify_paths.attn_help() for n in verify_paths.verify_names())
    assert EngineOptions(device="cuda").resolved().dtype == "bf16"


def test_capacity_slack_written_out():
    # 16k prompt + 128 new + 9 verify rows (budget 8 + 1) + the slack
    assert kv_capacity(16384, 128, 8) == 16384 + 128 + 9 + CONTEXT_SLACK


def test_commit_table_fits_80_columns(tmp_path):
    r = CliRunner().invoke(app, ["commit", "--ctx", "256", "--text", "predictable", "--max-new-tokens", "16",
                                 "--json", str(tmp_path / "c.json")], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stdout.splitlines() if "written to" not in line]  # (a long path wraps anyway)
    assert max(len(line.rstrip()) for line in lines) <= 80, "\n".join(lines)
    assert any(line.lstrip().startswith("predictable") for line in lines)
    assert "warm-up" in r.stderr and "first step" in r.stderr  # its own line, before the measured cells
    assert "commit" in r.stdout and "p10-90" in r.stdout


def test_a_text_typed_twice_runs_once_and_a_context_typed_twice_is_refused(tmp_path):
    from ddprobe.results import Result

    r = CliRunner().invoke(app, ["commit", "--ctx", "256", "--text", "predictable,predictable",
                                 "--max-new-tokens", "8", "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    assert [(row["text"], row["ctx"]) for row in Result.load(tmp_path / "c.json").rows] == [("predictable", 256)]
    # 256 and 0.25k are one context: refused in one line before anything runs, as floor, bench and advise refuse it
    r = CliRunner().invoke(app, ["commit", "--ctx", "256,0.25k", "--max-new-tokens", "8",
                                 "--json", str(tmp_path / "d.json")])
    assert r.exit_code == 1 and "Traceback" not in r.output and not (tmp_path / "d.json").exists()
    assert "--ctx: a context is given twice (256): give each context once" in r.output


def test_context_beyond_the_weights_names_the_value_typed(tmp_path):
    # a context beyond the tiny preset's reach is refused naming the value typed, not an internal total with the
    # verify rows and slack added
    from ddprobe.physics.presets import ModelConfig

    limit = ModelConfig.from_name("tiny").position_limit
    assert limit < 512 * 1024
    r = CliRunner().invoke(app, ["commit", "--ctx", "1k,512k", "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"context 512k (524,288 tokens) + 128 new tokens is beyond the {limit:,} tokens" in r.output
    assert str(512 * 1024 + 128 + 9 + CONTEXT_SLACK) not in r.output and not (tmp_path / "c.json").exists()
