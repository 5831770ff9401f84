"""probes.bench.step_times: the DDTree step per (context, budget) and the plain decode step per context, measured on a
real engine over synthetic caches (the tiny preset on CPU, tiny contexts), and its one-line refusals."""
from __future__ import annotations

import textwrap

import pytest

from ddprobe.probes.bench.step_times import StepTime, StepTimeOptions, capacity, check, measure_step_times
from ddprobe.units import DDProbeError

CTXS, BUDGETS, STEPS = [24, 80], [2, 5], 3


@pytest.mark.parametrize("graphs", [True, False])
def test_rows_per_context_and_budget(graphs):
    seen = []
    opts = StepTimeOptions(preset="tiny", attn="reference", device="cpu", dtype="fp32", graphs=graphs, steps=STEPS)
    rows = measure_step_times(opts, CTXS, BUDGETS, on_row=seen.append)
    assert rows == seen
    assert [(r.ctx, r.budget, r.rows) for r in rows] == [(24, 0, 1), (80, 0, 1), (24, 2, 3), (80, 2, 3), (24, 5, 6),
                                                         (80, 5, 6)]
    for r in rows:
        assert isinstance(r, StepTime) and r.path == "reference" and r.graphs is graphs and r.steps == STEPS
        assert r.step_ms > 0 and 0 < r.verify_ms <= r.step_ms
        assert r.plain == (r.budget == 0) and (not r.plain or r.verify_ms == r.step_ms)
        assert set(r.to_dict()) >= {"path", "ctx", "budget", "rows", "step_ms", "verify_ms"}
    # a DDTree step drafts, builds, verifies and commits: more than its verify phase
    assert all(r.step_ms > r.verify_ms for r in rows if not r.plain)


def test_capacity_counts_the_steps_rows():
    assert capacity([100, 4000], [4, 8], 10) == 4000 + 12 * 9 + 1
    assert capacity([100], [], 10) == 100 + 12 + 1


@pytest.mark.parametrize("ctxs, budgets, steps, msg", [
    ([4096 * 80], [8], 10, "the tiny preset holds"),  # past the tiny preset's positions
    ([64], [0], 10, "budgets must be in 1..1024"),
    ([64], [2000], 10, "budgets must be in 1..1024"),
    ([0], [4], 10, "at least 1 token"),
    ([], [4], 10, "at least one context"),
    ([64], [4], 0, "steps must be at least 1"),
])
def test_what_does_not_fit_is_refused_in_one_line(ctxs, budgets, steps, msg):
    with pytest.raises(DDProbeError, match=msg) as e:
        check(StepTimeOptions(preset="tiny", steps=steps), ctxs, budgets)
    assert "\n" not in str(e.value)


def test_unknown_preset_and_path_are_refused():
    with pytest.raises(DDProbeError, match="unknown preset"):
        check(StepTimeOptions(preset="nope"), [64], [4])
    with pytest.raises(DDProbeError, match="unknown attention path"):
        measure_step_times(StepTimeOptions(preset="tiny", attn="nope", device="cpu", dtype="fp32"), [16], [2])


SCRIPT = textwrap.dedent("""
    import torch
    from ddprobe.probes.bench.step_times import StepTimeOptions, measure_step_times
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: the interpreter (run_triton_script sets it)
    for attn in ("paged", "split"):
        opts = StepTimeOptions(preset="tiny", attn=attn, device=dev, dtype="fp32", graphs=True, steps=2)
        rows = measure_step_times(opts, [40], [3])
        assert [(r.path, r.budget, r.rows, r.graphs) for r in rows] == [(attn, 0, 1, True), (attn, 3, 4, True)], rows
        assert all(r.step_ms > 0 for r in rows)
    print("ok")
""")


def test_triton_paths(run_triton_script):
    """paged and split through both static steps (CPU: the interpreter; CUDA: captured graphs replayed)."""
    run_triton_script(SCRIPT)


def test_plain_decode_on_a_built_engine_and_the_engines_launches_off_cuda():
    """diagnose's plain side: the one-row step of the engine it already has, per context that fits its capacity;
    off CUDA no kernels are counted, so the launches are the structural lower bound, said as such."""
    from ddprobe.probes.backends.engine import EngineBackend
    from ddprobe.probes.bench.step_times import engine_kernels, engine_step_model, plain_decode_ms
    from ddprobe.physics.step_model import structural_kernels

    be = EngineBackend("tiny", "reference", budget=4, device="cpu", dtype="fp32", max_ctx=256)
    ms = plain_decode_ms(be.engine, [24, 80, 252], steps=STEPS)
    assert sorted(ms) == [24, 80] and all(v > 0 for v in ms.values())  # 252 + 5 rows + 1 exceed 256
    assert engine_kernels(be.engine) is None
    m = engine_step_model(be, "h100", 3.35e12, 989e12)
    c = m.cost(80, 5)
    assert c.kernels == structural_kernels(be.engine.config.target.num_layers) and "structural" in m.kernel_source
    assert be.kernel_counts is None  # asked once per backend
