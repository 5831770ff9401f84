"""The compiled functions keep compiling for every row count one process asks for: dynamo keeps its graphs per code
object, shared by every engine of the process, and past torch's default of 8 shapes it runs the rest eagerly
(`ddprobe advise` on an H100, 2026-12-07: its later cells timed with ~50 unfused kernels a layer more than its
first). `fuse.Fused` raises the limit; this compiles the engine's own ``layer_pre`` for the row counts of advise's
defaults and more (dynamo with its eager backend: the same guards and recompiles as inductor, seconds not minutes)."""
import torch
from torch._dynamo.utils import counters

from ddprobe.engine.fuse import RECOMPILE_LIMIT, Fused
from ddprobe.engine.target import TargetModel, layer_pre
from ddprobe.physics.presets import ModelConfig


def test_layer_pre_compiles_past_torchs_default_of_8_shapes():
    torch._dynamo.reset()
    counters.clear()
    try:
        Fused()  # what the engine builds in graph mode: it raises the limit for the process
        assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT
        cfg = ModelConfig.from_name("tiny").target
        model = TargetModel(cfg).eval()
        pre = torch.compile(layer_pre, dynamic=False, fullgraph=True, backend="eager")
        rows = [1, 5, 9, 8, 3, 2, 4, 6, 7, 10, 11, 17]  # plain decode, budgets 4 and 8, chain depth 7, and more
        with torch.no_grad():
            for t in rows:
                x = torch.randn(t, cfg.hidden_size)
                cos, sin = model.rope.cos_sin(torch.arange(t), x.dtype)
                a, q = pre(model.layers[0], x, cos, sin, None)
                b, r = layer_pre(model.layers[0], x, cos, sin, None)
                torch.testing.assert_close(a, b)
                torch.testing.assert_close(q, r)
        assert counters["stats"]["unique_graphs"] == len(rows), dict(counters["stats"])  # none ran eagerly
    finally:
        torch._dynamo.reset()
