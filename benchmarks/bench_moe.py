"""One MoE layer of the k2 engine per expert path (fused / grouped / batched) on CUDA, bf16.

Shapes: the k2 preset's MoE at one GPU's share (48 local experts of width 2048, hidden 1024, top-8, shared
expert 256 wide), R verify rows, ``--layers`` layers sharing one bank of experts (each its own router and
shared expert), so the bank (0.6 GB) never sits in L2. Prints, per path: the error against the fp32
reference (eager and replayed from a CUDA graph), kernels per layer (profiled eagerly), and ms per layer
from CUDA-graph replays of all layers (median of triton.testing.do_bench), for the whole MoE layer and for
the routed experts alone (given the routing), with the bandwidth of the touched experts' bytes. --sweep
times the fused GEMMs' tile shapes alone. --flips (CPU or GPU, fp32): how often bf16-sized noise on the input
(relative 4e-3) changes a row's set of experts, layer by layer through a residual stack of these MoE layers, and
how far the outputs drift: why two numerically valid bf16 runs of the k2 engine (compiled and plain) give
different logits. Usage: python benchmarks/bench_moe.py [--sweep | --flips] [--out f.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddprobe.engine import ModelConfig  # noqa: E402
from ddprobe.engine.moe import MoE, Experts, experts_batched, experts_fused, experts_grouped, route  # noqa: E402

EXPERTS = {"fused": experts_fused, "grouped": experts_grouped, "batched": experts_batched}
CFGS = [(64, 128, 4, 4), (64, 128, 4, 3), (32, 128, 4, 4), (128, 64, 4, 4), (128, 128, 8, 3), (64, 256, 4, 3),
        (64, 64, 4, 6), (32, 256, 4, 3), (128, 64, 8, 5), (16, 256, 4, 4)]


def graph_ms(fn, n_layers: int) -> float:
    """ms per layer: fn() runs every layer once; captured in a CUDA graph, replays timed (median)."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=50, rep=300, return_mode="median") / n_layers


def kernels_per_call(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for ev in prof.events() if ev.device_type.name == "CUDA")


def routing_flips(n_layers: int, rows: int, noise: float = 4e-3) -> dict:
    """A residual stack of n_layers k2 MoE layers (fp32, one shared bank, RMS-normed inputs) run on x and on
    x (1 + noise N(0, 1)): rows whose top-k expert set differs, per layer, and ||out - out'|| / ||out||."""
    t = ModelConfig.from_name("k2").target
    n, dim, inter, k = t.n_experts, t.hidden_size, t.moe_intermediate_size, t.experts_per_tok
    torch.manual_seed(0)
    bank = Experts(n, dim, inter)
    layers = [MoE(dim, bank, k, t.shared_intermediate_size, routed_scaling=2.827) for _ in range(n_layers)]
    with torch.no_grad():
        bank.w13.normal_(std=dim ** -0.5)
        bank.w2.normal_(std=inter ** -0.5)
        for m in layers:
            for name, p in m.named_parameters():
                if not name.startswith("experts."):
                    p.normal_(std=p.shape[-1] ** -0.5)

    def run(h):
        sets = []
        for m in layers:
            x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            sets.append(route(m.gate, x, k, m.routed_scaling)[0].sort(-1).values)
            h = h + m(x)
        return h, sets

    x = torch.randn(rows, dim)
    with torch.no_grad():
        a, sa = run(x)
        b, sb = run(x * (1 + noise * torch.randn_like(x)))
    flips = [int((u != v).any(-1).sum()) for u, v in zip(sa, sb)]
    return {"layers": n_layers, "rows": rows, "noise": noise, "rows_with_other_experts": flips,
            "rel_diff": float((a - b).norm() / a.norm())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=9)
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--flips", action="store_true", help="routing flips under bf16-sized noise (CPU or GPU)")
    ap.add_argument("--out", default="bench_moe.json")
    a = ap.parse_args()
    if a.flips:
        r = routing_flips(a.layers, a.rows)
        print(f"rows (of {r['rows']}) whose experts change, per layer: {r['rows_with_other_experts']}; outputs "
              f"differ by {r['rel_diff']:.3f} (relative) after {r['layers']} layers")
        Path(a.out).write_text(json.dumps(r, indent=1))
        return 0
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 2
    t = ModelConfig.from_name("k2").target
    n, dim, inter, k = t.n_experts, t.hidden_size, t.moe_intermediate_size, t.experts_per_tok
    torch.manual_seed(0)
    bank = Experts(n, dim, inter)
    with torch.no_grad():
        bank.w13.normal_(std=dim ** -0.5)
        bank.w2.normal_(std=inter ** -0.5)
    bank = bank.to("cuda", torch.bfloat16).requires_grad_(False)
    layers = []
    for _ in range(a.layers):
        m = MoE(dim, bank, k, t.shared_intermediate_size, routed_scaling=2.827)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if not name.startswith("experts."):
                    p.normal_(std=p.shape[-1] ** -0.5)
        layers.append(m.to("cuda", torch.bfloat16).requires_grad_(False))
    xs = [torch.randn(a.rows, dim, device="cuda", dtype=torch.bfloat16) for _ in layers]
    routes = [route(m.gate, x, k, m.routed_scaling) for m, x in zip(layers, xs)]
    distinct = sum(int(ids.unique().numel()) for ids, _ in routes) / len(routes)
    expert_B = 3 * dim * inter * 2
    copy_src = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    import triton.testing
    copy_ms = triton.testing.do_bench(lambda: copy_dst.copy_(copy_src), return_mode="median")
    out = {"gpu": torch.cuda.get_device_name(), "rows": a.rows, "layers": a.layers, "experts": n, "top_k": k,
           "distinct_per_layer": distinct, "routed_MB_per_layer": distinct * expert_B / 1e6,
           "copy_TBps": 2 * 2 ** 30 / copy_ms / 1e9, "chosen": bank.kernel, "paths": {}}
    print(f"{out['gpu']}: {distinct:.1f} distinct experts per layer ({out['routed_MB_per_layer']:.0f} MB), "
          f"copy ceiling {out['copy_TBps']:.2f} TB/s, Experts chose {bank.kernel}", flush=True)
    with torch.inference_mode():
        for name, run in EXPERTS.items():
            bank.kernel = name
            m, x = layers[0], xs[0]
            err = float((m(x).float() - m.reference(x)).norm() / m.reference(x).norm())
            g = torch.cuda.CUDAGraph()
            sx = x.clone()
            m(sx)
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                so = m(sx)
            fresh = torch.randn_like(x)
            sx.copy_(fresh)
            g.replay()
            gerr = float((so.float() - m.reference(fresh)).norm() / m.reference(fresh).norm())
            layer_ms = graph_ms(lambda: [m(x) for m, x in zip(layers, xs)], a.layers)
            exp_ms = graph_ms(lambda: [run(bank, x, ids, w) for x, (ids, w) in zip(xs, routes)], a.layers)
            rec = {"rel_err": err, "graph_rel_err": gerr, "kernels_per_layer": kernels_per_call(lambda: m(x)),
                   "layer_ms": layer_ms, "experts_ms": exp_ms,
                   "experts_TBps": (n if name == "batched" else distinct) * expert_B / exp_ms / 1e9}
            out["paths"][name] = rec
            print(f"{name:8s} err {err:.2e} graph {gerr:.2e} kernels/layer {rec['kernels_per_layer']:3d} "
                  f"layer {layer_ms * 1e3:6.1f} us experts {exp_ms * 1e3:6.1f} us ({rec['experts_TBps']:.2f} TB/s)",
                  flush=True)
        if a.sweep:
            from ddprobe.engine.kernels import moe_fused as mf

            xs_c = [x.contiguous() for x in xs]
            hs = [mf.gate_up(x, ids, bank.w13) for x, (ids, _) in zip(xs_c, routes)]
            out["sweep"] = []
            for cfg in CFGS:
                row = {"cfg": cfg}
                for part, fn, B in (
                        ("gate_up", lambda: [mf.gate_up(x, ids, bank.w13, cfg) for x, (ids, _) in zip(xs_c, routes)],
                         2 * dim * inter * 2),
                        ("down", lambda: [mf.down(h, ids, w, bank.w2, cfg) for h, (ids, w) in zip(hs, routes)],
                         dim * inter * 2)):
                    try:
                        ms = graph_ms(fn, a.layers)
                        row[part] = {"us": ms * 1e3, "TBps": distinct * B / ms / 1e9}
                    except Exception as e:  # noqa: BLE001  a tile shape that does not fit (shared memory)
                        row[part] = {"error": str(e)[:120]}
                out["sweep"].append(row)
                print("sweep", cfg, {p: (f"{v['us']:.1f} us {v['TBps']:.2f} TB/s" if "us" in v else v["error"][:60])
                                     for p, v in row.items() if p != "cfg"}, flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
