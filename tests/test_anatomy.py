"""The step anatomy against hand arithmetic: the investigation's three step times (159 ms at 32k,
714 ms at 128k, 1430 ms at 185k on 8x RTX PRO 6000, Kimi K2.6, tp 8) decomposed."""
import pytest

from ddprobe.probes.bench.anatomy import fit_anatomy, fit_line, steps_from_result
from ddprobe.units import DDProbeError

K, KV_TOK = 1024, 61 * 576 * 2  # 70,272 bytes per token per GPU (MLA: the whole latent on every GPU)
CTX, STEP = [32 * K, 128 * K, 185 * K], [159.0, 714.0, 1430.0]


def test_investigation_numbers_by_hand():
    an = fit_anatomy(CTX, STEP, kv_B_per_token=KV_TOK, bw_Bps=1.792e12, weight_floor_ms=8.0)
    first, second = an.intervals
    # 32k -> 128k: 555 ms over 96k tokens = 5.78 ms per 1k; 128k -> 185k: 716 ms over 57k = 12.6 ms per 1k
    assert first.ms_per_1k == pytest.approx(555 / 96) and round(first.ms_per_1k, 1) == 5.8
    assert second.ms_per_1k == pytest.approx(716 / 57) and round(second.ms_per_1k, 1) == 12.6
    # marginal KV bandwidth: 1024 tokens x 70,272 B read per 5.78 ms = 12.4 GB/s; per 12.6 ms = 5.7 GB/s.
    # So the pairing "5.8 ms <-> about 12 GB/s, 12.6 ms <-> about 6 GB/s" holds: the slower interval reads slower.
    assert first.kv_GBps == pytest.approx(K * KV_TOK / (555 / 96 / 1e3) / 1e9) and round(first.kv_GBps) == 12
    assert second.kv_GBps == pytest.approx(K * KV_TOK / (716 / 57 / 1e3) / 1e9) and round(second.kv_GBps) == 6
    assert not an.linear and "not linear" in an.notes[0]  # the slope doubles: per interval
    # least squares on all three: the unconstrained intercept is negative (-157 ms), so the non-negative fit
    # puts the fixed part at 0 and the slope at sum(xy) / sum(xx)
    sxy = sum(x * y for x, y in zip(CTX, STEP))
    sxx = sum(x * x for x in CTX)
    assert an.fixed_ms == 0 and an.ms_per_1k == pytest.approx(sxy / sxx * K)
    assert an.dominant == "context" and "185k" in an.verdict and "100%" in an.verdict
    assert "weight floor 8 ms" in an.verdict


def test_linear_steps_recover_fixed_and_marginal():
    ctx = [8 * K, 32 * K, 128 * K]
    step = [20.0 + 0.5 * c / K for c in ctx]  # 20 ms fixed, 0.5 ms per 1k
    an = fit_anatomy(ctx, step, kv_B_per_token=1000.0, bw_Bps=4.8e12)
    assert an.linear and an.fixed_ms == pytest.approx(20.0) and an.ms_per_1k == pytest.approx(0.5)
    assert an.kv_GBps == pytest.approx(1000 * K / 0.5e-3 / 1e9)  # 2.05 GB/s
    assert an.dominant == "context" and an.context_ms == pytest.approx(64.0)
    fixed = fit_anatomy(ctx, [100.0 + 0.01 * c / K for c in ctx])
    assert fixed.dominant == "fixed" and "fixed part" in fixed.verdict and fixed.kv_GBps is None


def test_fit_line_is_least_squares():
    a, b = fit_line([(1, 3.0), (2, 5.1), (3, 6.9)])
    assert b == pytest.approx(1.95) and a == pytest.approx(5.0 - 1.95 * 2)


@pytest.mark.parametrize("ctx,step,msg", [
    ([32 * K], [159.0], "two or more contexts, got 1"),
    ([32 * K, 32 * K], [159.0, 160.0], "32k given more than once"),
    ([32 * K, 128 * K], [714.0, 159.0], "step times decrease with context (714 ms at 32k, 159 ms at 128k)"),
    ([32 * K, 128 * K], [159.0], "one step time per context"),
])
def test_bad_input(ctx, step, msg):
    with pytest.raises(DDProbeError) as e:
        fit_anatomy(ctx, step)
    assert msg in str(e.value)


def test_differences_within_the_noise_are_flat():
    """14.20 then 14.18 ms: flat, noisy step times as a GPU gives them, not 'a measurement went wrong'."""
    an = fit_anatomy([8 * K, 32 * K, 128 * K], [14.20, 14.18, 14.25])
    assert an.linear and not an.notes and all(iv.ms_per_1k >= 0 for iv in an.intervals)
    assert an.dominant == "fixed" and an.fixed_ms == pytest.approx(14.2, abs=0.05)
    with pytest.raises(DDProbeError, match="more than the 2% a step time moves between runs"):
        fit_anatomy([8 * K, 32 * K], [14.20, 13.0])  # 8% faster at 4x the context: not noise


def test_steps_from_results():
    rows = [{"text": "novel", "ctx": 2048, "commit_len": 1.1, "decode_ms_per_step": 12.0},
            {"text": "novel", "ctx": 1024, "commit_len": 1.2, "decode_ms_per_step": 10.0},
            {"text": "predictable", "ctx": 1024, "commit_len": 7.5, "decode_ms_per_step": 9.0}]
    assert steps_from_result("commit", rows, {}, {}) == [(1024, 10.0), (2048, 12.0)]
    assert steps_from_result("gpu-util", [], {"decode_step_ms": 8.1}, {"prompt_len": 32768}) == [(32768, 8.1)]
    assert steps_from_result("bench-verify", [], {}, {}) == []


def test_duplicate_contexts_are_refused():
    with pytest.raises(DDProbeError, match="1k given more than once"):
        fit_anatomy([1024, 1024, 2048], [5.0, 9.0, 10.0])


def test_an_intercept_below_the_weight_floor_is_not_the_fixed_cost():
    an = fit_anatomy([1024, 4096], [20.0, 50.0], weight_floor_ms=30.0)  # intercept 10 ms < 30 ms
    assert an.fixed_below_floor and "is below the weight floor (30 ms): it is not the fixed cost" in an.verdict
    above = fit_anatomy([1024, 4096], [40.0, 50.0], weight_floor_ms=30.0)  # intercept 36.7 ms
    assert not above.fixed_below_floor and "not the fixed cost" not in above.verdict


def test_the_fixed_part_is_set_against_the_weights_and_the_launches():
    """The engine's k2 step (docs/perf.md): 14.16 / 15.22 / 20.11 ms at 8k / 32k / 128k is fixed-dominated; its fixed
    part is named beside the weight floor (6.38 ms) and the launches (1,424 kernels x 1 us = 1.42 ms)."""
    an = fit_anatomy([8 * K, 32 * K, 128 * K], [14.16, 15.22, 20.11], weight_floor_ms=6.38, latency_floor_ms=1.424)
    assert an.dominant == "fixed" and an.latency_floor_ms == 1.424
    assert "the fixed part (13.7 ms (weight floor 6.38 ms, launches at least 1.42 ms): weights" in an.verdict
