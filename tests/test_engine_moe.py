"""The engine's mixture of experts: the grouped-GEMM and batched paths and the fp32 reference all equal
a per-token loop over each row's top-k experts; the k2 preset carries Kimi's MoE at one GPU's share; a
small k2 with MoE decodes speculatively exactly as plain greedy; tiny stays dense."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddprobe.engine import Engine, ModelConfig
from ddprobe.engine import weights as shipped
from ddprobe.engine.layers import init_random
from ddprobe.engine.moe import MoE, Experts, experts_batched, experts_grouped, grouped_mm_works, route
from ddprobe.physics.step_shape import KIMI_K2_MOE


def make_moe(n=5, dim=32, inter=48, k=3, shared=16, seed=0, dtype=torch.float64) -> MoE:
    m = MoE(dim, Experts(n, dim, inter), k, shared, routed_scaling=2.5)
    init_random(m, seed)
    return m.to(dtype)


def per_token_loop(m: MoE, x: torch.Tensor) -> torch.Tensor:
    """Row by row, expert by expert, in float64: shared(x) + sum_k w_k SwiGLU_k(x)."""
    ids, w = route(m.gate, x, m.top_k, m.routed_scaling)
    e, out = m.experts, []
    for r in range(x.shape[0]):
        xr = x[r].double()
        acc = torch.zeros(x.shape[1], dtype=torch.float64)
        for j in range(m.top_k):
            w13, w2 = e.w13[ids[r, j]].double(), e.w2[ids[r, j]].double()
            gu = w13 @ xr
            acc += w[r, j].double() * (w2 @ (F.silu(gu[:e.inter]) * gu[e.inter:]))
        if m.shared is not None:
            s = m.shared
            acc += s.down_proj.weight.double() @ (F.silu(s.gate_proj.weight.double() @ xr)
                                                  * (s.up_proj.weight.double() @ xr))
        out.append(acc)
    return torch.stack(out)


@pytest.mark.parametrize("n,k,rows,shared", [(5, 3, 9, 16), (8, 8, 9, 0), (6, 1, 1, 16), (48, 8, 9, 16)])
def test_paths_equal_a_per_token_loop(n, k, rows, shared):
    m = make_moe(n=n, k=k, shared=shared, seed=n + k, dtype=torch.float32)
    x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows + n))
    want = per_token_loop(m, x)
    ids, w = route(m.gate, x, m.top_k, m.routed_scaling)
    assert ids.shape == (rows, k) and torch.allclose(w.sum(-1), torch.full((rows,), 2.5))
    tol = 1e-5 * want.abs().max()
    assert (m.reference(x).double() - want).abs().max() < tol  # the fp32 reference
    base = m.shared(x) if m.shared is not None else 0
    assert (experts_batched(m.experts, x, ids, w) + base - want).abs().max() < tol
    assert grouped_mm_works(x.device, torch.float32)  # torch._grouped_mm runs on the CPU in torch >= 2.8
    assert (experts_grouped(m.experts, x, ids, w) + base - want).abs().max() < tol
    for kernel in ("grouped", "batched"):  # "fused" (Triton) against the reference: test_moe_fused.py
        m.experts.kernel = kernel
        assert (m(x).double() - want).abs().max() < tol

    m.requires_grad_(False)
    m.join_projections()  # the router and the shared expert's gate and up: one GEMM, the same function
    assert (m.joined is not None) == bool(shared)
    for kernel in ("grouped", "batched"):
        m.experts.kernel = kernel
        assert (m(x).double() - want).abs().max() < tol


def test_joined_projections_are_the_linears_weights():
    """After join_projections the Linears' weights are views of the joined tensor: a state_dict load (in place)
    reaches it, the state_dict keeps its keys (no extra entry), and a layer's input projections through project()
    equal the separate Linears. A no-op move keeps everything; a real move, a load with assign=True and a deepcopy
    give the weights their own tensors, and joining again (the move itself; Engine.load_state_dict; the copy's
    join_projections) points the same Parameter objects at a new joined tensor. With a gradient on any joined
    weight the separate Linears run (the joined tensor carries none)."""
    import copy

    from ddprobe.engine.target import layer_pre

    # k2's layer shapes (MLA without q_lora, a dense first layer, then routed experts in one shared bank and a
    # shared expert) at widths no larger than the property needs: 6 experts of 32, a 512-token vocabulary (the full
    # preset's 48 experts x 2048 in fp32 peaked at 17.7 GB)
    cfg = ModelConfig.from_name("k2", heads=2, num_layers=2, feature_layers=(0, 1), max_ctx=256, vocab_size=512,
                                n_experts=6, experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64,
                                shared_intermediate_size=16)
    eng = Engine(cfg, device="cpu", dtype=torch.float32, seed=0)
    layer = eng.target.layers[1]
    attn, moe = layer.self_attn, layer.mlp
    first, kv_w = attn._inputs()[0], attn.kv_a_proj_with_mqa.weight
    n = first.out_features

    def joined_ok() -> bool:
        return (kv_w.data_ptr() == attn.joined[n:].data_ptr() and first.weight.data_ptr() == attn.joined.data_ptr()
                and moe.gate.weight.data_ptr() == moe.joined.data_ptr()
                and moe.shared.up_proj.weight.data_ptr() == moe.joined[moe.experts.n + moe.shared.gate_proj.out_features:].data_ptr())

    assert attn.joined is not None and moe.joined is not None and joined_ok()
    assert not any(k.endswith("joined") for k in eng.state_dict())
    sd = {k: v + 1 if k.endswith("kv_a_proj_with_mqa.weight") or k.endswith("mlp.gate.weight") else v
          for k, v in eng.state_dict().items()}
    joined = attn.joined
    eng.load_state_dict(sd)
    assert attn.joined is joined and torch.equal(attn.joined[n:], kv_w) and torch.equal(moe.joined[:moe.experts.n],
                                                                                       moe.gate.weight)
    x = torch.randn(9, eng.config.target.hidden_size)
    a, kv_a = attn.project(x)
    assert torch.allclose(a, first(x), atol=1e-5) and torch.allclose(kv_a, attn.kv_a_proj_with_mqa(x), atol=1e-5)
    cos, sin = eng.target.rope.cos_sin(torch.arange(9), x.dtype)
    rows, q = layer_pre(layer, x, cos, sin)
    assert torch.allclose(rows, attn.latent_rows(layer.input_layernorm(x), cos, sin), atol=1e-5)
    assert torch.allclose(q, attn.absorbed_q(layer.input_layernorm(x), cos, sin), atol=1e-5)

    eng.model.to("cpu")  # a no-op move: the same tensors
    assert attn.joined is joined and joined_ok()
    eng.model.to(torch.float64)  # a real move: joined again, the same Parameter objects
    assert attn.kv_a_proj_with_mqa.weight is kv_w and attn.joined.dtype == torch.float64 and joined_ok()
    eng.load_state_dict({k: v.double() * 2 for k, v in sd.items()}, strict=True)
    assert joined_ok() and torch.equal(attn.joined[n:], kv_w)
    eng.model.load_state_dict({k: v.double() for k, v in sd.items()}, assign=True)  # replaces the tensors
    first, kv_w = attn._inputs()[0], attn.kv_a_proj_with_mqa.weight
    assert not joined_ok()
    eng.target.join_projections()
    assert joined_ok() and torch.equal(attn.joined[n:], kv_w)
    twin = copy.deepcopy(eng.target.layers[1].self_attn)
    assert twin.kv_a_proj_with_mqa.weight.data_ptr() != twin.joined[n:].data_ptr()  # a copy holds its own tensors
    twin.join_projections()
    assert twin.kv_a_proj_with_mqa.weight.data_ptr() == twin.joined[n:].data_ptr()

    xd = x[None].double()
    assert not moe(xd).requires_grad and not attn.project(xd)[1].requires_grad  # frozen: the joined GEMMs
    moe.shared.up_proj.weight.requires_grad_(True)  # one trainable weight among the joined ones
    attn.kv_a_proj_with_mqa.weight.requires_grad_(True)
    assert moe(xd).requires_grad and attn.project(xd)[1].requires_grad  # the separate Linears ran


def test_bf16_grouped_path_near_the_fp32_reference():
    m = make_moe(n=12, k=4, dim=64, inter=64, seed=3, dtype=torch.bfloat16)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    assert m.experts.grouped_ok == grouped_mm_works(x.device, torch.bfloat16)  # chosen when the weights moved
    assert m.experts.kernel == ("grouped" if m.experts.grouped_ok else "batched")  # fused: CUDA only
    ref = m.reference(x)
    err = (m(x).float() - ref).abs().max() / ref.abs().max()
    assert err < 3e-2, err  # bf16 activations and weights against fp32 arithmetic on the same bf16 weights


def test_leading_dims_and_determinism():
    m = make_moe(dtype=torch.float32)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(2))
    y = m(x)
    assert y.shape == x.shape and torch.equal(y, m(x))
    assert torch.allclose(y.reshape(14, 32), m(x.reshape(14, 32)))


def test_top_k_above_the_experts_is_refused():
    with pytest.raises(ValueError, match="top-k 9 is not within the 8 local experts"):
        MoE(32, Experts(8, 32, 16), 9)


def test_k2_preset_has_kimis_moe_at_one_gpus_share():
    t = ModelConfig.from_name("k2").target
    assert (t.n_experts, t.experts_per_tok, t.moe_intermediate_size) == (384 // 8, 8, 2048)
    assert (t.shared_intermediate_size, t.first_dense_layers, t.intermediate_size) == (256, 1, 18432 // 8)
    assert KIMI_K2_MOE.n_routed_experts == 384 and t.moe_shared_bank


def test_small_k2_with_moe_decodes_like_greedy():
    cfg = ModelConfig.from_name("k2", heads=8, num_layers=3, vocab_size=512, feature_layers=(0, 2), max_ctx=128,
                                n_experts=6, experts_per_tok=2, moe_intermediate_size=32, intermediate_size=64,
                                shared_intermediate_size=16, moe_shared_bank=False)
    eng = Engine(cfg, budget=8, dtype=torch.float64, poison=True)
    layers = eng.target.layers
    assert not isinstance(layers[0].mlp, MoE) and isinstance(layers[1].mlp, MoE) and isinstance(layers[2].mlp, MoE)
    assert layers[1].mlp.experts is not layers[2].mlp.experts  # a bank per layer unless moe_shared_bank
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert eng.generate(prompt, 12).tokens == eng.greedy_reference(prompt, 12)


def test_tiny_stays_dense_and_its_weights_still_load():
    cfg = ModelConfig.from_name("tiny")
    assert cfg.target.n_experts == 0
    assert shipped.config_mismatch("tiny", cfg) is None
    assert "n_experts" in shipped.config_mismatch("tiny", cfg.with_overrides(n_experts=4, experts_per_tok=2,
                                                                             moe_intermediate_size=16))
