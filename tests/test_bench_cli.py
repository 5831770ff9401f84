"""`ddprobe bench verify` through Typer's CliRunner: without CUDA one line and exit 1, bad input one line and exit 1
(before any GPU work); the comparison's host-side pieces: tuning overrides, labels, the cost of a call."""
import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.engine.kernels import get_path
from ddprobe.probes.bench import verify as verify_bench
from ddprobe.physics.shapes import KIMI_K2
from ddprobe.units import DDProbeError

runner = CliRunner()


def _error_line(res) -> str:
    lines = [ln for ln in (res.stderr or res.output).splitlines() if ln.strip()]
    assert res.exit_code == 1, res.output
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "Traceback" not in res.output
    return lines[0]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="this machine has CUDA: the command would run")
def test_without_cuda_it_says_so_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "bench.json"
    res = runner.invoke(app, ["bench", "verify", "--ctx", "1k", "--quick", "--eager", "--out", str(out)])
    assert "needs a CUDA GPU" in _error_line(res)
    assert not out.exists()


@pytest.mark.parametrize("args, says", [
    (["--paths", "split,flashmla3"], "unknown path 'flashmla3'"),
    (["--variant", "split"], "PATH:field=value"),
    (["--variant", "nope:tail=1"], "unknown path 'nope'"),
    (["--tune", "split:tail"], "field=value pairs"),
    (["--step-skip", "pagd"], "unknown path 'pagd'"),
    (["--ctx", "12q"], "12q"),
    (["--budget", "0"], "--budget"),
    (["--variant", "split:tail=1"], "SplitTuning has no field 'tail'"),  # a knob moved to the lab branch
    (["--step-variant", "split:tail_ratio=2"], "SplitTuning has no field 'tail_ratio'"),
    (["--tune", "split_ws:balance=1"], "WsTuning has no field 'balance'"),
    (["--variant", "split:block_n=x"], "bad split tuning"),
    (["--variant", "split_ws:tail=2"], "WsTuning.tail must be one of"),
    (["--variant", "paged:plan=graph"], "plan=graph is not a plan kind it takes"),
    (["--variant", "split:build=sm_75"], "unknown portable build 'sm_75'; known: sm_120, sm_80"),
    (["--variant", "split_ws:build=sm_120"], "build= names a portable build of split"),
    (["--step-variant", "split:build=sm_120"], "build= shapes one layer's plan; give it in a --variant"),
])
def test_bad_input_is_one_line_before_any_gpu_work(args, says):
    assert says in _error_line(runner.invoke(app, ["bench", "verify", *args]))


def test_every_default_path_is_a_verify_path_or_a_peer():
    from ddprobe.cli.bench import DEFAULT_PATHS, _names

    assert _names(DEFAULT_PATHS, "--paths") == DEFAULT_PATHS.split(",")


def test_tuning_overrides_apply_over_the_run_wide_base_and_bad_fields_are_one_line():
    split = get_path("split")
    t = verify_bench.tuned(split, "split", {"tma": "0"}, {"block_n": str(split.DEFAULT_TUNING.block_n * 2)})
    assert t.tma == 0 and t.block_n == split.DEFAULT_TUNING.block_n * 2
    assert verify_bench.tuned(split, "split", {}, {}) == split.DEFAULT_TUNING
    with pytest.raises(DDProbeError, match="bad split tuning"):
        verify_bench.tuned(split, "split", {}, {"no_such_field": "1"})
    for removed in ("tail", "tail_ratio", "ctas_per_sm", "warps_128"):  # knobs moved to the lab branch
        with pytest.raises(DDProbeError, match=f"SplitTuning has no field '{removed}' \\(its fields: block_n,") as e:
            verify_bench.tuned(split, "split", {"block_n": "32"}, {removed: "1"})
        assert "\n" not in str(e.value)
    with pytest.raises(DDProbeError, match="bad split tuning"):
        verify_bench.tuned(split, "split", {}, {"tma": "x"})


def test_sglang_is_a_baseline_beside_paged_and_takes_no_knobs():
    from ddprobe import verify_paths

    assert set(verify_bench.BASELINES) == {"paged", "sglang"}
    assert "sglang" not in verify_paths.fast_names() and "paged" not in verify_paths.fast_names()
    assert verify_bench.SLOT_LAYOUTS == ("shuffled", "contiguous")
    sg = get_path("sglang") if _sglang_loads() else None
    if sg is not None:
        assert verify_bench.tuned(sg, "sglang", {}, {}) == sg.DEFAULT_TUNING
        with pytest.raises(DDProbeError, match="bad sglang tuning"):
            verify_bench.tuned(sg, "sglang", {}, {"block_m": "64"})


def _sglang_loads() -> bool:
    from ddprobe.engine.kernels import PathUnavailable

    try:
        get_path("sglang")
        return True
    except PathUnavailable:
        return False


def test_labels_name_the_overrides_as_the_gate_keys_them():
    assert verify_bench.label("split", {}) == "split"
    assert verify_bench.label("split_ws", {"fold_tree": "0", "pipe": "1"}) == "split_ws[fold_tree=0,pipe=1]"


def test_the_cost_of_a_call_is_the_latent_cache_once_plus_q_and_out():
    ctx, heads, rows = 131072, 8, 9
    nbytes, flops = verify_bench.call_cost(KIMI_K2, ctx, heads, rows)
    n = ctx + rows
    assert nbytes == n * 576 * 2 + rows * heads * (576 + 512) * 2  # bf16 rows of 512 latent + 64 rope
    assert flops == n * rows * heads * (2 * 576 + 2 * 512)  # QK over 576, PV over the 512 latent, per head
    step_bytes, step_flops = verify_bench.call_cost(KIMI_K2, ctx, heads, rows, layers=61)
    assert step_bytes == pytest.approx(61 * nbytes) and step_flops == pytest.approx(61 * flops)


@pytest.mark.parametrize("args, says", [
    (["--tree", "nope"], "--tree: unknown tree shape 'nope'"),
    (["--heads", "0"], "--heads takes head counts"),
    (["--heads", "8,65"], "--heads takes head counts"),
    (["--heads", "x"], "--heads takes head counts"),
    (["--paged-heads", "-1"], "--paged-heads takes head counts"),
    (["--flex-budget-s", "-1"], "--flex-budget-s"),
    (["--flex-budget-s", "nan"], "--flex-budget-s"),
    (["--slots", "sorted"], "--slots takes shuffled or contiguous"),
])
def test_every_option_is_checked_before_the_cuda_check(args, says):
    line = _error_line(runner.invoke(app, ["bench", "verify", *args]))
    assert says in line and "CUDA" not in line


def test_out_is_checked_before_the_cuda_check(tmp_path):
    line = _error_line(runner.invoke(app, ["bench", "verify", "-o", str(tmp_path)]))
    assert "is a directory" in line and "CUDA" not in line


@pytest.mark.skipif(_cuda(), reason="this machine has CUDA: the command would run")
def test_a_run_that_stops_before_its_first_result_leaves_no_file(tmp_path):
    out = tmp_path / "sub" / "bench.json"
    res = runner.invoke(app, ["bench", "verify", "--heads", "3", "--tree", "chain", "-o", str(out)])
    assert "needs a CUDA GPU" in _error_line(res)
    assert not out.exists() and not out.parent.exists()


def test_results_file_is_written_whole_and_only_with_results(tmp_path):
    from ddprobe.jsonfile import read_json, write_json_atomic

    p = write_json_atomic(tmp_path / "a" / "b.json", {"results": [{"x": 1}]})
    assert read_json(p) == {"results": [{"x": 1}]} and [f.name for f in p.parent.iterdir()] == ["b.json"]


def test_entries_are_planned_as_the_engine_plans_them():
    """Every verify path takes device plans (the engine's CUDA-graph step, its default on CUDA), so bench verify
    plans each one that way: prefix_len a [1] int32 device tensor holding the context, max_prefix = the context;
    a variant's plan=host times a host plan instead (split_ws's Gluon tunings need one); plan= is no tuning field,
    and a plan kind a path does not take is one line. Planned here on the CPU (split, paged) as the run plans them
    on the GPU; the kernel recorded is the path's own name where the plan does not choose among kernels."""
    import torch

    from ddprobe import verify_paths
    from ddprobe.engine.kernels.trees import shape_mask

    for p in verify_paths.PATHS:
        if p.verify:
            assert verify_bench.plan_kind(p, p.name, {}) == ("device" if p.device_plans else "host")
    split, paged = get_path("split"), get_path("paged")
    assert verify_bench.plan_kind(split, "split", {"plan": "host"}) == "host"
    assert verify_bench.tuned(split, "split", {}, {"plan": "host", "tma": "0"}) == \
        verify_bench.tuned(split, "split", {}, {"tma": "0"})
    with pytest.raises(DDProbeError, match="plan=eager is not a plan kind it takes"):
        verify_bench.plan_kind(split, "split", {"plan": "eager"})
    mask = shape_mask("lopsided", 8)
    ctx = 300
    for path, slots in ((split, None), (paged, torch.randperm(ctx + 9))):
        dev = verify_bench.engine_plan(torch, path, "device", ctx, mask, slots, 64, path.DEFAULT_TUNING, 8)
        host = verify_bench.engine_plan(torch, path, "host", ctx, mask, slots, 64, path.DEFAULT_TUNING, 8)
        assert dev.dynamic and dev.prefix_len == ctx and dev.prefix_t.dtype == torch.int32
        assert int(dev.prefix_t.item()) == ctx and dev.prefix_t.shape == (1,)
        assert not host.dynamic and host.prefix_len == ctx
        assert verify_bench.kernel_of(path.name, dev) == path.name


def test_a_variant_bound_sizes_the_device_plan_as_an_engine_of_that_capacity():
    """bound= (tokens, k = 1024) sizes an entry's device plan above its context, as the engine sizes its plan by its
    KV capacity: split's chunk rule then runs at the live length on the grid of the bound. It is no tuning field, it
    is never below the context, and it takes a device plan: with plan=host, or a bad token count, it is one line."""
    import torch

    from ddprobe.engine.kernels.trees import shape_mask

    split = get_path("split")
    assert verify_bench.plan_bound(split, "split", {}) is None
    assert verify_bench.plan_bound(split, "split", {"bound": "2k"}) == 2048
    assert verify_bench.tuned(split, "split", {}, {"bound": "2k", "tma": "0"}) == \
        verify_bench.tuned(split, "split", {}, {"tma": "0"})
    with pytest.raises(DDProbeError, match="bound= sizes a device plan"):
        verify_bench.plan_bound(split, "split", {"bound": "2k", "plan": "host"})
    with pytest.raises(DDProbeError, match="bad split bound"):
        verify_bench.plan_bound(split, "split", {"bound": "2q"})
    with pytest.raises(DDProbeError, match="bad split bound"):
        verify_bench.check_tunings(verify_bench.BenchOptions(ctxs=[1024], variants=[("split", {"bound": "0"})]))
    with pytest.raises(DDProbeError, match="paged reads a page_size=1 pool"):
        verify_bench.plan_bound(get_path("paged"), "paged", {"bound": "2k"})
    for opts in (dict(tune={"split": {"bound": "2k"}}), dict(step_variants=[("split", {"bound": "2k"})])):
        with pytest.raises(DDProbeError, match="give it in a --variant"):
            verify_bench.check_tunings(verify_bench.BenchOptions(ctxs=[1024], **opts))
    with pytest.raises(DDProbeError, match="flashmla is a peer: it takes no tuning overrides"):
        verify_bench.check_tunings(verify_bench.BenchOptions(ctxs=[1024], variants=[("flashmla", {"bound": "2k"})]))
    mask = shape_mask("lopsided", 8)
    sized = verify_bench.engine_plan(torch, split, "device", 300, mask, None, 64, split.DEFAULT_TUNING, 8, 4096)
    own = verify_bench.engine_plan(torch, split, "device", 300, mask, None, 64, split.DEFAULT_TUNING, 8)
    low = verify_bench.engine_plan(torch, split, "device", 300, mask, None, 64, split.DEFAULT_TUNING, 8, 100)
    assert sized.prefix_len == 4096 and int(sized.prefix_t.item()) == 300 and own.prefix_len == low.prefix_len == 300
    assert sized.extra["config"]["chunk"] > own.extra["config"]["chunk"]  # splits sized for the bound

    # the cache sets span the largest bound + R rows among the entries that run (a plan checks it holds them)
    from ddprobe.engine import kernels

    bench = object.__new__(verify_bench.Bench)  # the CUDA check and ceilings of __init__ are not needed here
    bench.kernels = kernels
    bench.opts = verify_bench.BenchOptions(ctxs=[300], paths=["split", "flashmla"], variants=[
        ("split", {"bound": "4k"}), ("split", {"bound": "2k", "tma": "0"}), ("split", {"tma": "0"})])
    assert bench._kv_rows(300, 8, 309) == 4096 + 9
    bench.opts.variants = [("split", {"tma": "0"})]
    assert bench._kv_rows(300, 8, 309) == 309


def test_progress_counts_every_entry_and_weighs_the_eta_by_context():
    """bench verify's progress (Progress): one tick per entry, the total the run's entries (points x entries, then
    the step's), the ETA the weight left at the pace so far, 0 at the end."""
    from ddprobe.probes.bench.verify import Progress

    seen = []
    p = Progress([Progress.weight(1024), Progress.weight(131072), 8.0], lambda *a: seen.append(a))
    p.t0 -= 10.0  # 10 s into the run
    p.tick()
    (done, total, el, eta), = seen
    assert (done, total) == (1, 3) and el >= 10.0
    w_first = 1 + 1024 / 32768
    assert eta == pytest.approx(el * (5.0 + 8.0) / w_first, rel=1e-6)  # 128k weighs 5, the step 8
    p.tick()
    p.tick()
    assert seen[-1][0] == 3 and seen[-1][3] == 0.0
