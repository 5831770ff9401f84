"""The prefill path (PyTorch fused attention, no score buffer) against the fp32 reference, the engine's
prefix reuse against fresh runs, KVCache.truncate, and the long-context position pieces (partial rope,
NoPE layers, the attention-temperature scale)."""
import math

import pytest
import torch

from ddprobe.engine import kernels
from ddprobe.physics.presets import ModelConfig, YarnConfig
from ddprobe.engine.generate import Engine
from ddprobe.engine.kernels import prefill as prefill_path
from ddprobe.engine.kv_cache import KVCache
from ddprobe.engine.rope import Rope, attn_scale, inv_freq

REF = kernels.get_path("reference")


@pytest.mark.parametrize("pre,rows,paged", [(0, 64, False), (0, 7, True), (37, 64, True), (1000, 300, False),
                                            (5, 1, True)])
def test_prefill_path_matches_reference(pre, rows, paged):
    """fp32, fresh random rows and queries, both layouts; tolerance 1e-5 relative (same math, other order)."""
    gen = torch.Generator().manual_seed(pre * 131 + rows)
    n = pre + rows
    kv = torch.randn(n + 16, 96, generator=gen)
    slots = torch.randperm(n + 16, generator=gen)[:n] if paged else None
    q = torch.randn(rows, 4, 96, generator=gen)
    mask = torch.ones(rows, rows, dtype=torch.bool).tril_()
    want = REF.run(q, kv, REF.plan(pre, mask, slots, 64), 0.125)
    got = prefill_path.run(q, kv, prefill_path.plan(pre, mask, slots, 64), 0.125)
    assert got.shape == (rows, 4, 64)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_prefill_path_without_the_lse_operator(monkeypatch):
    """The fallback (one call with the lower-right mask written out) computes the same."""
    monkeypatch.setattr(prefill_path, "_lse_cpu", lambda: None)
    gen = torch.Generator().manual_seed(3)
    kv, q = torch.randn(200, 96, generator=gen), torch.randn(50, 2, 96, generator=gen)
    mask = torch.ones(50, 50, dtype=torch.bool).tril_()
    want = REF.run(q, kv, REF.plan(150, mask, None, 64), 0.2)
    got = prefill_path.run(q, kv, prefill_path.plan(150, mask, None, 64), 0.2)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_prefill_path_refuses_what_it_cannot_do():
    tree = torch.eye(3, dtype=torch.bool)
    tree[2, 0] = True  # a tree, not a causal mask
    with pytest.raises(ValueError, match="causal mask only"):
        prefill_path.plan(4, tree)
    with pytest.raises(ValueError, match="host plans only"):
        prefill_path.plan(torch.zeros(1, dtype=torch.int32), torch.ones(1, 1, dtype=torch.bool), max_prefix=8)


def test_truncate_frees_exactly_the_dropped_slots():
    kv = KVCache(2, 64, 8, "paged", shuffle=True, seed=1, poison=True)
    _, _ = kv.reserve(40)
    kv.commit(list(range(40)))
    kept = kv.committed_slots()[:25].clone()
    kv.truncate(25)
    assert kv.committed == 25 and torch.equal(kv.committed_slots(), kept)
    assert kv.free_slots == 64 - 25
    assert sorted(kv._free + kept.tolist()) == list(range(64))  # every slot once: kept or free
    assert torch.isnan(kv.buffer[:, kv._free]).all()  # poison: nothing freed is readable
    with pytest.raises(ValueError, match="cannot truncate"):
        kv.truncate(30)
    c = KVCache(1, 16, 4, "contiguous")
    c.reserve(10)
    c.commit(list(range(10)))
    c.truncate(3)
    assert c.committed == 3 and c.free_slots == 13


def test_partial_rope_and_attention_scale():
    full = inv_freq(32, 10000.0)
    part = inv_freq(32, 10000.0, max_wavelength=2048.0)
    long = 2 * math.pi / full > 2048.0
    assert long.any() and (~long).any()
    assert torch.equal(part[~long], full[~long]) and (part[long] == 0).all()
    cos, sin = Rope(32, 10000.0, max_wavelength=2048.0).cos_sin(torch.tensor([0, 123456]), torch.float64)
    assert torch.equal(cos[1, 16:][long.repeat(2)[16:]], torch.ones(int(long.sum())))  # the slow pairs never turn
    with pytest.raises(ValueError, match="do not combine"):
        inv_freq(32, 10000.0, YarnConfig(4.0, 512), max_wavelength=2048.0)
    s = attn_scale(torch.tensor([0, 4094, 4095, 8191, 262143]), 4096, torch.float64).flatten()
    assert s[0] == 1 and s[1] == 1 and s[2] == pytest.approx(1 + 0.1 * math.log(2))
    assert s[4] == pytest.approx(1 + 0.1 * math.log(65))


def test_nope_layer_ignores_position():
    """A target whose every layer is NoPE (no query scale) gives the same logits at shifted positions."""
    cfg = ModelConfig.from_name("tiny", nope_layers=(0, 1, 2, 3), nope_attn_floor=0)
    eng = Engine(cfg, seed=3)
    ids = torch.tensor([5, 9, 17, 3, 3, 40])
    logits = []
    for base in (0, 100000):
        kv = eng.new_cache(16)
        w, slots = kv.reserve(6)
        plan = REF.plan(0, torch.ones(6, 6, dtype=torch.bool).tril_(), slots, cfg.target.kv_lora_rank)
        h, _ = eng.target(ids, torch.arange(base, base + 6), kv.buffer, w, plan, REF)
        logits.append(eng.target.logits(h))
    assert torch.allclose(logits[0], logits[1], atol=1e-5)


@pytest.mark.parametrize("graphs", [False, True])
def test_prefix_reuse_equals_fresh(graphs):
    """Random tiny weights, prompts sharing prefixes (longer, the same, shorter, diverging): every reused cell
    gives the tokens of the same cell run fresh, and says how much it reused: the common prefix (the last
    token always prefilled) down to the 1024-row chunk grid."""
    eng = Engine("tiny", seed=5, graphs=graphs, max_ctx=4096)
    base = [(7 * i) % 200 for i in range(3000)]
    prompts = [base[:1100], base[:2100], base[:2100], base[:1500], base[:1030] + [1, 2, 3], base[:1000]]
    want_reused = [0, 1024, 2048, 1024, 1024, 0]
    for p, reused in zip(prompts, want_reused):
        got = eng.generate(p, 24, reuse_prefix=True)
        assert got.reused_tokens == reused
        fresh = Engine("tiny", seed=5, graphs=graphs, max_ctx=4096).generate(p, 24)
        assert got.tokens == fresh.tokens
        assert [s.commit_len for s in got.steps] == [s.commit_len for s in fresh.steps]
    eng.forget_prefix()
    assert eng.generate(base[:1100], 4, reuse_prefix=True).reused_tokens == 0


def test_prefill_in_two_calls_gives_the_rows_of_one_to_the_bit():
    """On the chunk grid, a prompt prefilled after its kept first 1024 tokens gets bit-identical cache rows and
    last logits (the fp32 LSE merge splits a row's keys where its chunk starts: the same chunks, the same bits)."""
    eng = Engine("tiny", seed=2, kv_layout="contiguous", max_ctx=4096)
    ids = [(11 * i + 3) % 250 for i in range(2600)]
    kv = eng.new_cache(2600)
    eng.prefill(kv, ids[:1024])
    two = eng.prefill(kv, ids)
    fresh = eng.new_cache(2600)
    one = eng.prefill(fresh, ids)
    assert torch.equal(two, one)
    assert torch.equal(kv.buffer[:, :2600], fresh.buffer[:, :2600])


def test_prefill_progress_reports_every_chunk():
    eng = Engine("tiny", seed=1, max_ctx=4096)
    seen = []
    eng.generate([i % 256 for i in range(2500)], 2, on_prefill=lambda d, t: seen.append((d, t)))
    assert seen == [(0, 2500), (1024, 2500), (2048, 2500), (2500, 2500)]  # the 1024-row grid on CPU
