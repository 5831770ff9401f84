"""How far bf16 rounding carries a k2 verify step's logits, plain and torch.compile'd (CPU, no GPU needed).

One static verify step (9 rows, a 500-token cache of equal random rows, the reference attention) of the k2
shapes (61 layers, 8 heads, vocabulary cut to 4096) with the same random weights in fp64, in bf16 through the
plain functions, and in bf16 through the torch.compile'd layers (fuse.py): relative Frobenius error of the
logits against fp64 and argmax agreement. Used to read the 5% graph-vs-plain logit difference of
bench_engine.py on the H200 (docs/perf.md).

    PYTHONPATH=$PWD python benchmarks/engine_bf16_drift.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddprobe.engine.config import ModelConfig  # noqa: E402
from ddprobe.engine.fuse import Fused  # noqa: E402
from ddprobe.engine.generate import Engine  # noqa: E402
from ddprobe.engine.graphs import tree_from_topk  # noqa: E402

CTX = 500


def verify_logits(dtype: torch.dtype, compiled: bool = False) -> torch.Tensor:
    cfg = ModelConfig.from_name("k2", heads=8, vocab_size=4096, max_ctx=CTX + 100)
    eng = Engine(cfg, attn="reference", dtype=dtype, graphs=True, seed=0)
    eng.warmup(capacity=CTX + 100)
    st = eng._static
    st.reset()
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(st.kv.buffer.shape[1:], generator=g)
    st.kv.buffer.copy_(rows.to(dtype)[None].expand_as(st.kv.buffer))
    if st.paged:
        st.kv.req_to_token[0, :CTX] = torch.tensor(st.kv.take_slots(CTX))
    st.kv.committed = CTX
    logp = torch.log_softmax(torch.randn(7, 4096, generator=g, dtype=torch.float64), -1)
    vals, idx = torch.topk(logp, 8, dim=-1)
    st.write_step(tree_from_topk(vals, idx, 8, 1, "ddtree"), CTX)
    if compiled:
        st.fused = Fused(compile=True)
    return st._verify()[0].double()


def main() -> int:
    ref = verify_logits(torch.float64)
    for name, out in (("bf16 plain", verify_logits(torch.bfloat16)), ("bf16 compiled", verify_logits(torch.bfloat16, True))):
        err = float((out - ref).norm() / ref.norm())
        agree = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
        print(f"{name:14} rel err vs fp64 {err:.3e}   argmax agreement {agree:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
