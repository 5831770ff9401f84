"""Floor arithmetic against hand-computed values and the investigation's published numbers.

Every expected number is written out from the inputs (layers x row x bytes, bytes / bandwidth),
never copied from a run of the code."""
import json
import math
import re
from pathlib import Path

import pytest

from ddprobe.probes.floor import FloorInput, Sharding, floor_row, floor_table, served_model
from ddprobe.physics.step_model import StepModel
from ddprobe.physics.models import get_model, model_from_config
from ddprobe.physics.shapes import KIMI_K2, AttnShape, dtype_bytes, floor_s
from ddprobe.physics.gpus import get_gpu
from ddprobe.units import DDProbeError

K26 = get_model("kimi-k2.6")
A26 = K26.attn


def k26(bw_Bps, flops_per_s=None, queries=9, tp=1, ep=1, expert_dtype="bf16", **kw):
    """FloorInput of Kimi K2.6 under tp/ep with no communication counted (the step model's own tests count it)."""
    return FloorInput(StepModel(attn=A26, weights=lambda r: K26.step_weights(rows=r, tp=tp, ep=ep,
                                                                             expert_dtype=expert_dtype),
                                bw_Bps=bw_Bps, flops_per_s=flops_per_s, tp=tp, **kw), queries)


def test_kimi_kv_bytes_per_token():
    # 61 layers x (512 latent + 64 rope) x 2 bytes
    assert A26 == KIMI_K2
    assert A26.kv_row == 576
    assert A26.kv_bytes_per_token() == 61 * 576 * 2 == 70_272
    # MLA keeps the whole latent cache on every tensor-parallel GPU
    assert A26.kv_bytes_per_token(tp=8) == 70_272
    # the dtype decides the bytes: fp32 doubles them, fp8 halves them
    assert A26.kv_bytes_per_token("fp32") == 61 * 576 * 4 and A26.kv_bytes_per_token("fp8") == 61 * 576 * 1
    assert A26.kv_bytes_per_token("torch.bfloat16", layers=1) == 1152


def test_dtype_names():
    assert dtype_bytes("bf16") == dtype_bytes("bfloat16") == dtype_bytes("torch.bfloat16") == 2
    assert dtype_bytes("torch.float32") == 4 and dtype_bytes("int4") == 0.5
    with pytest.raises(DDProbeError, match="unknown dtype"):
        dtype_bytes("int2")


def test_floor_s_picks_the_larger_term():
    assert floor_s(4.8e9, 1e12, bw_Bps=4.8e12, flops_per_s=1e15) == (1e-3, "memory")  # 1 ms vs 1 ms: memory
    assert floor_s(4.8e9, 2e12, bw_Bps=4.8e12, flops_per_s=1e15) == (2e-3, "compute")
    assert floor_s(4.8e9, 2e12, bw_Bps=4.8e12) == (1e-3, "memory")  # no tensor rate: memory term only


def test_published_investigation_numbers():
    """Kimi K2.6 at 128k: ~9.2 GB of bf16 latent KV; at 1.8 TB/s ~5 ms; a 714 ms step is ~140x off the floor
    and still ~16x off if all 9 rows re-read the cache."""
    row = floor_row(k26(1.8e12, tp=8), ctx=128 * 1024, step_ms=714)
    assert row.kv_GB == pytest.approx(131072 * 70272 / 1e9)  # 9.2107 GB
    assert round(row.kv_GB, 1) == 9.2
    assert row.attn_floor_ms == pytest.approx(9.2107e9 / 1.8e12 * 1e3, rel=1e-4)  # 5.117 ms: the attention alone
    assert 5.0 < row.attn_floor_ms < 5.2 and row.kv_floor_ms == pytest.approx(row.attn_floor_ms)
    assert row.attn_gap == pytest.approx(714 / 5.117, rel=1e-3)
    assert round(row.attn_gap) == 140
    assert row.attn_gap_if_rows_reread == pytest.approx(714 / (9 * 5.117), rel=1e-3)
    assert round(row.attn_gap_if_rows_reread) == 16
    assert row.eff_bw_GBps == pytest.approx(9.2107 / 0.714, rel=1e-3)  # ~12.9 GB/s
    assert row.attn_bound == "memory"
    # the floor is the whole step: the attention plus this GPU's weights (bf16 here), so the gap is smaller
    assert row.floor_ms == pytest.approx((131072 * 70272 + K26.step_weights(rows=9, tp=8).total_B) / 1.8e12 * 1e3)
    assert row.gap == pytest.approx(714 / row.floor_ms) and row.gap < row.attn_gap


def test_gqa_kv_split_across_tp():
    q = get_model("qwen3-8b").attn  # 36 layers, 8 KV heads of 128
    assert q.kv_bytes_per_token() == 36 * 2 * 8 * 128 * 2 == 147_456
    assert q.kv_bytes_per_token(tp=4) == 147_456 / 4
    assert q.kv_bytes_per_token(tp=16) == 147_456 / 8  # replicated once tp exceeds the KV heads


def test_compute_term_makes_64_heads_compute_bound():
    h200 = get_gpu("h200")
    row = floor_row(k26(h200.bw_Bps, h200.bf16_flops), 131072)
    flops = 2 * (576 + 512) * 64 * 9 * 61 * 131072  # QK 576-wide + PV 512-wide, every head and row
    assert row.attn_GFLOP == pytest.approx(flops / 1e9)
    assert row.attn_bound == "compute" and row.attn_floor_ms == pytest.approx(flops / 989e12 * 1e3)
    # one tensor-parallel shard (8 heads) is memory-bound
    assert floor_row(k26(h200.bw_Bps, h200.bf16_flops, tp=8), 131072).attn_bound == "memory"


def test_whole_step_weights_by_hand():
    """Kimi K2.6, tp 8, ep 8, 9 rows, bf16 dense weights, int4 experts: every term from the config fields."""
    h, ql, n, v, E, k, I, Id = 7168, 1536, 64, 163840, 384, 8, 2048, 18432
    w = K26.step_weights(rows=9, tp=8, ep=8, dense_dtype="bf16", expert_dtype="int4")
    rep = h * ql + ql + h * 576 + 512  # q_a (+ norm), kv_a (+ norm): replicated
    split = (ql * n * 192 + 512 * n * 256 + n * 128 * h) / 8  # q_b, kv_b, o over tp
    attn = 61 * (rep + split + 2 * h)
    dense_mlp = 1 * 3 * h * Id / 8
    shared = 60 * 3 * h * I / 8
    router = 60 * h * E
    head = h * v / 8 + h
    embed_rows = 9 * h
    assert w.dense_B == pytest.approx(2 * (attn + dense_mlp + shared + router + head + embed_rows))
    local = E // 8  # 48 whole experts per GPU under ep 8
    distinct = local * (1 - (1 - k / E) ** 9)  # 8.29 expected
    assert w.experts_per_layer == pytest.approx(distinct) and 8.2 < distinct < 8.4
    assert w.experts_worst == 48  # min(48, 9 x 8)
    assert w.routed_B == pytest.approx(60 * distinct * 3 * h * I * 0.5)
    assert w.routed_worst_B == pytest.approx(60 * 48 * 3 * h * I * 0.5)
    # without ep every GPU holds 1/8 of each of the 384 experts: the same expected bytes, a smaller worst case
    w1 = K26.step_weights(rows=9, tp=8, ep=1, expert_dtype="int4")
    assert w1.routed_B == pytest.approx(w.routed_B) and w1.experts_worst == 72
    assert w1.routed_worst_B == pytest.approx(60 * 72 * 3 * h * I / 8 * 0.5)


def test_whole_step_floor_row():
    w = K26.step_weights(rows=9, tp=8, ep=8, expert_dtype="int4")
    inp = k26(4.8e12, 989e12, tp=8, ep=8, expert_dtype="int4")
    row = floor_row(inp, 131072, step_ms=100.0)
    kv = 131072 * 70272
    assert row.kv_floor_ms == pytest.approx(kv / 4.8e12 * 1e3)
    assert row.weight_floor_ms == pytest.approx(w.total_B / 4.8e12 * 1e3)
    assert row.floor_ms == pytest.approx((kv + w.total_B) / 4.8e12 * 1e3)  # memory-bound, no communication
    assert row.binds == "bandwidth"  # 9.2 GB of KV + 15.5 GB of weights at 4.8 TB/s: 5.1 ms; launches 0.23 ms
    assert row.gap == pytest.approx(100.0 / row.floor_ms)
    assert row.attn_floor_ms == pytest.approx(kv / 4.8e12 * 1e3)  # the attention alone
    # the plain one-row decode step reads fewer experts: its floor is lower
    w_1 = K26.step_weights(rows=1, tp=8, ep=8, expert_dtype="int4")
    assert row.decode_floor_ms == pytest.approx((kv + w_1.total_B) / 4.8e12 * 1e3) and row.decode_floor_ms < row.floor_ms
    short = floor_row(inp, 1024)
    assert short.binds == "bandwidth" and short.weight_floor_ms > short.kv_floor_ms
    # the whole model on one GPU reads its experts' weights: weights bind; a slow tensor rate makes it compute
    w1 = K26.step_weights(rows=9, tp=1)
    assert floor_row(k26(4.8e12, 989e12), 131072).binds == "bandwidth"
    slow = floor_row(k26(4.8e12, 1e12), 131072)
    assert slow.binds == "compute" and slow.GFLOP == pytest.approx(slow.attn_GFLOP + w1.flops / 1e9)


def test_engine_k2_weights_by_hand():
    """The k2 engine is one GPU's share of K2 (tp 8 / ep 8) at hidden 1024: its 48 local experts routed top-8
    among themselves, a 256-wide shared expert, the first layer dense at 2304, the whole 163840-row lm_head."""
    from ddprobe.physics.presets import ModelConfig
    from ddprobe.probes.backends.engine import target_step_weights

    w = target_step_weights(ModelConfig.from_name("k2").target, 9, "bf16")
    h, n, v, E, k, I = 1024, 8, 163840, 48, 8, 2048
    attn = 61 * (h * 576 + 512 + h * n * 192 + 512 * n * 256 + n * 128 * h + 2 * h)  # q has no lora: h x n x 192
    dense_mlp, shared, router = 3 * h * 2304, 60 * 3 * h * 256, 60 * h * E
    assert w.dense_B == pytest.approx(2 * (attn + dense_mlp + shared + router + h * v + h + 9 * h))
    distinct = E * (1 - (1 - k / E) ** 9)  # 38.7 of the 48 local experts
    assert w.experts_per_layer == pytest.approx(distinct) and w.experts_worst == 48 and w.moe_layers == 60
    assert w.routed_B == pytest.approx(2 * 60 * distinct * 3 * h * I)  # 29.2 GB: the shared bank read per layer
    assert w.routed_worst_B == pytest.approx(2 * 60 * 48 * 3 * h * I)
    # the tiny engine is dense, fp32: 4 x (attention 78,144 + MLP 98,304) + lm_head 65,536 + final norm 128
    tiny = target_step_weights(ModelConfig.from_name("tiny").target, 9, "fp32")
    assert tiny.total_B == 4 * (4 * (78144 + 3 * 128 * 256) + 128 * 512 + 128 + 9 * 128) == 3090432
    assert tiny.routed_B == 0 and tiny.moe_layers == 0


def test_dense_model_has_no_expert_terms():
    w = get_model("llama-3.1-8b").step_weights(rows=9, tp=1)
    assert w.routed_B == 0 and w.moe_layers == 0 and w.experts_per_layer == 0
    params = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 128256 * 4096 + 4096
    assert w.dense_B == pytest.approx(2 * (params + 9 * 4096))


@pytest.mark.parametrize("kw,msg", [
    ({"ep": 5}, "--ep 5 does not divide the model's 384 routed experts"),
    ({"ep": 16, "tp": 8}, "--ep 16 must divide --tp 8"),
    ({"ep": 0}, "--ep must be at least 1"),
])
def test_expert_parallel_checks(kw, msg):
    with pytest.raises(DDProbeError, match=msg):
        K26.step_weights(**({"tp": 8} | kw))


def test_top_k_above_experts():
    from dataclasses import replace
    with pytest.raises(DDProbeError, match="top-k 400 experts per token is not within the model's 384 experts"):
        replace(K26, num_experts_per_tok=400).step_weights()


def test_parameter_counts_match_published_sizes():
    ds = get_model("deepseek-v3")
    assert ds.params() / 1e9 == pytest.approx(671, rel=0.01)  # 671B total
    assert ds.params(active=True) / 1e9 == pytest.approx(37, rel=0.03)  # 37B active
    assert get_model("kimi-k2.6").params(active=True) / 1e9 == pytest.approx(32, rel=0.03)
    assert get_model("llama-3.1-8b").params() / 1e9 == pytest.approx(8.03, rel=0.01)


def test_table_step_times():
    inp = k26(1.792e12, tp=8, expert_dtype="int4")
    rows = floor_table(inp, [32768, 131072, 189440], [159, 714, 1430])
    assert [r.step_ms for r in rows] == [159, 714, 1430]
    assert all(r.attn_gap > 100 for r in rows) and all(r.gap > 10 for r in rows)
    assert len(floor_table(inp, [1024, 2048], [5.0])) == 2
    with pytest.raises(DDProbeError, match="one per context"):
        floor_table(inp, [1024, 2048, 4096], [1.0, 2.0])


@pytest.mark.parametrize("kwargs,msg", [
    ({"queries": 0}, "at least 1 row"), ({"tp": 0}, "tp must be a positive integer"), ({"bw_Bps": -1}, "bandwidth"),
    ({"bw_Bps": float("nan")}, "bandwidth"),
    ({"kv_dtype": "int2"}, "unknown dtype"), ({"tp": 128}, "does not divide"), ({"tp": 3}, "does not divide"),
    ({"tp": 8, "dcp": 3}, "--dcp 3 does not divide --tp 8"), ({"dcp": 0}, "--dcp must be a positive integer"),
])
def test_bad_input(kwargs, msg):
    args = {"bw_Bps": 1e12} | kwargs
    with pytest.raises(DDProbeError, match=msg):
        q = args.pop("queries", 9)
        floor_row(FloorInput(StepModel(attn=A26, weights=lambda r: K26.step_weights(rows=r), **args), q), 1024)


def test_unknown_names_list_known_ones():
    with pytest.raises(DDProbeError, match="served models: kimi-k2.6, kimi-k2, deepseek-v3.*engine presets: tiny, k2"):
        get_model("gpt-5")
    with pytest.raises(DDProbeError, match="known: rtx-pro-6000, h100, h200, b200"):
        get_gpu("tpu")
    assert math.isclose(get_gpu("RTX-PRO-6000").bw_Bps, 1.792e12)


@pytest.mark.parametrize("kwargs,msg", [
    ({"head_dim": -128}, "head_dim must be a positive integer"),
    ({"num_kv_heads": -8}, "num_kv_heads must be a positive integer"),
    ({"num_kv_heads": 5}, "not a multiple"),
    ({"num_layers": 0}, "num_layers must be a positive integer"),
])
def test_shape_rejects_nonsense(kwargs, msg):
    args = {"kind": "gqa", "num_layers": 32, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128} | kwargs
    with pytest.raises(DDProbeError, match=msg):
        AttnShape(**args)


def test_tp_over_gqa_kv_heads():
    q = get_model("qwen3-8b").attn  # 32 query heads, 8 KV heads
    q.check_tp(16)  # KV heads replicated: fine
    with pytest.raises(DDProbeError, match="does not divide the model's 32 attention heads"):
        q.check_tp(3)


def test_context_beyond_any_model():
    with pytest.raises(DDProbeError, match="beyond any model"):
        floor_row(k26(1e12), ctx=10**300)


# ---- the whole-step floor's review (issue 33) ----------------------------------------------------------------
CONFIGS = Path(__file__).parent / "data" / "configs"


def test_a_step_below_the_whole_step_floor_is_flagged():
    inp = k26(4.8e12)  # tp 1: 77 ms
    fast, slow = floor_table(inp, [1024, 1024], [10.0, 100.0])
    assert fast.gap < 1 and fast.below_floor is True
    assert slow.gap > 1 and slow.below_floor is False
    assert floor_row(inp, 1024).below_floor is None  # no step time: nothing to judge


def test_mixtral_local_experts_are_routed_experts():
    m = model_from_config(CONFIGS / "mixtral-8x7b-config.json")
    assert (m.n_routed_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (8, 2, 14336)
    assert m.params() == pytest.approx(46.7e9, rel=0.005)  # Mixtral 8x7B: 46.7B parameters
    assert m.params(active=True) == pytest.approx(12.75e9, rel=0.01)  # 2 of 8 experts (12.9B with the embedding)
    assert m.step_weights(rows=9).moe_layers == 32


def _config_with(tmp_path, **change):
    cfg = json.loads((CONFIGS / "deepseek-v3-config.json").read_text())
    cfg.update(change)
    for k in [k for k, v in change.items() if v is ...]:
        del cfg[k]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("change, msg", [
    ({"moe_intermediate_size": ...}, "no positive 'moe_intermediate_size'"),
    ({"moe_intermediate_size": 0}, "'moe_intermediate_size' must be a positive integer"),
    ({"first_k_dense_replace": "x"}, "'first_k_dense_replace' must be an integer in 0..61"),
    ({"first_k_dense_replace": 1.5}, "'first_k_dense_replace' must be an integer in 0..61"),
    ({"first_k_dense_replace": -1}, "'first_k_dense_replace' must be an integer in 0..61"),
    ({"first_k_dense_replace": 62}, "'first_k_dense_replace' must be an integer in 0..61"),
])
def test_bad_moe_fields_are_one_error(tmp_path, change, msg):
    with pytest.raises(DDProbeError, match=re.escape(msg)):
        model_from_config(_config_with(tmp_path, **change))


def test_first_k_dense_replace_in_range_is_read(tmp_path):
    assert model_from_config(_config_with(tmp_path, first_k_dense_replace=61)).step_weights().moe_layers == 0
    assert model_from_config(_config_with(tmp_path, first_k_dense_replace=None)).first_k_dense_replace == 0
