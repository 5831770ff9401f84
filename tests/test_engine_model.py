"""Model pieces: absorbed MLA equals naive MLA, RoPE/YaRN, presets (k2 keeps K2.6's attention
shapes), drafter windows, weights round trip, and the Triton paths plugged into the engine."""
from __future__ import annotations

import math
import textwrap

import torch

from ddprobe.engine import Engine, KVCache, ModelConfig
from ddprobe.engine.kernels import get_path
from ddprobe.physics.presets import YarnConfig
from ddprobe.engine.layers import init_random
from ddprobe.engine.mla import MLAttention, make_rope
from ddprobe.engine.rope import Rope, apply_rope, inv_freq


def test_absorbed_mla_equals_naive_mla():
    cfg = ModelConfig.from_name("tiny").target
    attn = MLAttention(cfg)
    init_random(attn, 0)
    attn.double()
    t, h, nope, c = 10, cfg.num_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank
    x = torch.randn(t, cfg.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cos, sin = make_rope(cfg).cos_sin(torch.arange(t) + 5, torch.float64)
    cache = KVCache(1, 32, cfg.kv_dim, "contiguous", dtype=torch.float64, poison=True)
    w, _ = cache.reserve(t)
    ref = get_path("reference")
    out = attn(x, cos, sin, cache.layer(0), w, ref.plan(0, torch.ones(t, t, dtype=torch.bool).tril(), None, c), ref)
    # naive: per-head K = [W_UK c_kv, k_pe], V = W_UV c_kv
    q = attn._q(x)
    q = torch.cat([q[..., :nope], apply_rope(q[..., nope:], cos, sin)], -1)
    kv_a = attn.kv_a_proj_with_mqa(x)
    c_kv = attn.kv_a_layernorm(kv_a[:, :c])
    k_pe = apply_rope(kv_a[:, c:], cos, sin)
    kvb = attn.kv_b_proj(c_kv).view(t, h, nope + cfg.v_head_dim)
    k = torch.cat([kvb[..., :nope], k_pe[:, None, :].expand(t, h, -1)], -1)
    s = torch.einsum("qhd,khd->hqk", q, k) * cfg.sm_scale
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("hqk,khv->qhv", torch.softmax(s, -1), kvb[..., nope:])
    naive = attn.o_proj(o.reshape(t, -1))
    assert (out - naive).abs().max() < 1e-5 * naive.abs().max()  # reference attention runs in fp32
    assert torch.equal(cache.buffer[0, :t], torch.cat([c_kv, k_pe], -1))  # the 96-wide latent rows


def test_rope_is_relative_and_yarn_blends_frequencies():
    r = Rope(32, 10000.0)
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)

    def dot(pq, pk):
        cq, sq = r.cos_sin(torch.tensor([pq]), torch.float64)
        ck, sk = r.cos_sin(torch.tensor([pk]), torch.float64)
        return float((apply_rope(q[None], cq, sq) * apply_rope(k[None], ck, sk)).sum())

    assert math.isclose(dot(7, 3), dot(1007, 1003), rel_tol=1e-9)
    yarn = YarnConfig(factor=4.0, original_max_position=1024)  # dims 0-1 kept, 10+ divided by the factor
    plain, scaled = inv_freq(32, 10000.0), inv_freq(32, 10000.0, yarn)
    assert torch.allclose(scaled[:2], plain[:2]) and torch.allclose(scaled[10:], plain[10:] / 4)


def test_k2_preset_keeps_kimi_attention_shapes():
    for heads in (8, 64):
        cfg = ModelConfig.from_name("k2", heads=heads)
        t = cfg.target
        assert (t.num_layers, t.num_heads, t.kv_lora_rank, t.qk_rope_head_dim, t.kv_dim) == (61, heads, 512, 64, 576)
        assert (t.qk_nope_head_dim, t.v_head_dim, t.vocab_size) == (128, 128, 163840)
        mscale = 0.1 * math.log(64) + 1
        assert math.isclose(t.sm_scale, mscale ** 2 / math.sqrt(192))
    tiny = ModelConfig.from_name("tiny").target
    assert (tiny.kv_lora_rank, tiny.qk_rope_head_dim) == (64, 32)  # powers of two >= 16 for Triton


def test_small_k2_runs_with_576_wide_rows():
    cfg = ModelConfig.from_name("k2", heads=8, num_layers=2, vocab_size=512, feature_layers=(0, 1), max_ctx=128,
                                n_experts=4, experts_per_tok=2, moe_intermediate_size=32)  # the MoE at CPU size
    eng = Engine(cfg, budget=8, dtype=torch.float64, poison=True)
    assert eng.new_cache().buffer.shape == (2, 128, 576)
    assert eng.generate([3, 1, 4, 1, 5], 10).tokens == eng.greedy_reference([3, 1, 4, 1, 5], 10)


def test_drafter_windows_and_long_positions():
    cfg = ModelConfig.from_name("tiny", sliding_window=4)
    eng = Engine(cfg, dtype=torch.float64)
    d, t = eng.drafter, eng.target
    ctx = d.new_context(4096)
    d.append_context(ctx, torch.randn(3000, t.feature_dim, dtype=torch.float64), torch.arange(3000))
    logp = d(ctx, torch.tensor(5), t.embed_tokens, t.lm_head)  # far beyond the 512 trained length
    assert logp.shape == (7, cfg.target.vocab_size) and torch.isfinite(logp).all()
    assert torch.allclose(logp.exp().sum(-1), torch.ones(7, dtype=torch.float64))
    ctx.k[0, 100] = float("nan")  # windowed layer 0 sees only the last 4 context tokens
    assert torch.isfinite(d(ctx, torch.tensor(5), t.embed_tokens, t.lm_head)).all()
    ctx.k[d.full_layer, 100] = float("nan")  # the full-attention layer sees all of them
    assert torch.isnan(d(ctx, torch.tensor(5), t.embed_tokens, t.lm_head)).all()


def test_weights_round_trip_and_features():
    a, b = Engine("tiny", seed=0, max_ctx=128), Engine("tiny", seed=1, max_ctx=128)
    assert a.greedy_reference([1, 2, 3], 12) != b.greedy_reference([1, 2, 3], 12)
    b.load_state_dict(a.state_dict())
    assert a.greedy_reference([1, 2, 3], 12) == b.greedy_reference([1, 2, 3], 12)
    assert all(k.startswith(("target.", "drafter.")) for k in a.state_dict())
    assert a.target.feature_dim == len(a.config.target.feature_layers) * a.config.target.hidden_size


SCRIPT = textwrap.dedent("""
    import torch
    from ddprobe.engine import Engine
    prompt = [5, 17, 42, 9, 77, 3]
    ref = Engine("tiny", dtype=torch.float32, max_ctx=128).greedy_reference(prompt, 5)
    for attn in ("paged", "split"):
        eng = Engine("tiny", attn=attn, budget=4, dtype=torch.float32, poison=True, shuffle_slots=True, max_ctx=128)
        assert eng.generate(prompt, 5).tokens == ref, attn
    eng = Engine("tiny", attn="split", prefill_attn="split", dtype=torch.float32, poison=True, max_ctx=128)
    assert eng.greedy_reference(prompt, 3) == ref[:3]
    print("ok")
""")


def test_triton_paths_plug_into_the_engine(run_triton_script):
    """The fast paths through the same seam (CPU: Triton's interpreter, in a subprocess so the
    TRITON_INTERPRET switch cannot leak into other tests)."""
    run_triton_script(SCRIPT)


def test_drafter_logprobs_are_the_references_logits_minus_logsumexp():
    """The DDTree reference's log-probs: fp32 ``logits - logsumexp(logits)``, bit for bit (torch.log_softmax can be
    one ulp away, which decides ties between equal-score paths); fp64 models keep fp64."""
    from ddprobe.engine.drafter import Drafter

    cfg = ModelConfig.from_name("tiny")
    d = Drafter(cfg.drafter, cfg.target)
    d.init_weights(3)
    dim = cfg.target.hidden_size
    head = torch.nn.Linear(dim, 512, bias=False)
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        d.to(dtype), head.to(dtype)
        x = (4 * torch.randn(9, dim, generator=g)).to(dtype)
        got = d.logprobs(x, head)
        logits = head(d.norm(x[1:]))
        logits = logits if dtype == torch.float64 else logits.float()
        assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert torch.equal(got, logits - torch.logsumexp(logits, dim=-1, keepdim=True))
