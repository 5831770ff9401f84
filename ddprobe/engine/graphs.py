"""Static decode steps: fixed buffers and device plans, captured as CUDA graphs and replayed.

One ``StaticStep`` per (engine, capacity) holds everything a decode step touches: the KV cache
and the drafter context (sized for ``capacity`` tokens), the verify plan built ONCE as a device
plan (kernels read the prefix length from ``prefix_t``), and three step functions:

- ``draft``:  drafter forward over [bonus, L masks] at context length n, then the top-k of its
  log-probs (what the tree build needs): inputs ``commit_in``; outputs vals, idx [L, k].
- ``verify``: unpack ``step_in`` (tokens, depths, ancestor bits, write slots, prefix) into the
  plan's buffers, refresh the plan, the target forward over R = budget + 1 rows (trees with fewer
  nodes are padded with rows that only see themselves), logits and greedy picks.
- ``commit``: permute the R new rows so the accepted ones come first (contiguous: KV rows;
  paged: the slot table), append every row's drafter K/V at its permuted place (rows past the
  accepted ones are overwritten later), NaN-poison the rejected rows when asked.

On CUDA each is captured once (``capture``) and replayed; on CPU the same functions run eagerly,
which is what the CPU tests compare with the eager engine. Per step the host writes two small
int64 buffers (one copy each) and reads two (the top-k for the tree build, the picks for the
walk): the tree build and the walk stay on the host (tree.build_tree, tree.walk).
"""
from __future__ import annotations

import time

import torch

from .fuse import Fused, verify_head
from .tree import DraftTree, build_tree

NAMES = ("verify", "commit", "draft")


def tree_from_topk(vals: torch.Tensor, idx: torch.Tensor, budget: int, bonus: int, shape: str) -> DraftTree:
    """tree.build_tree over the top-k values [L, k] (host), tokens mapped back through idx [L, k]:
    the same tree build_tree makes from the full log-probs (it only ever reads their top-k)."""
    t = build_tree(vals, budget, bonus, shape)
    idx = idx.tolist()
    tokens = (bonus,) + tuple(idx[d - 1][c] for c, d in zip(t.tokens[1:], t.depths[1:]))
    return DraftTree(tokens, t.parents, t.depths, t.scores)


def ancestor_bits(parents) -> list[int]:
    """Row i: bit j set when row i sees row j (itself and its ancestors), as int64 values."""
    bits: list[int] = []
    for i, p in enumerate(parents):
        b = (bits[p] if p >= 0 else 0) | (1 << i)
        bits.append(b)
    return [b - (1 << 64) if b >= 1 << 63 else b for b in bits]


class StaticStep:
    def __init__(self, eng, capacity: int, fused: Fused | None = None):
        self.eng, self.capacity, self.fused = eng, capacity, fused
        dev, t = eng.device, eng.config.target
        self.rows = r = eng.budget + 1
        self.paged = eng.kv_layout == "paged"
        self.kv = eng.new_cache(capacity)
        self.dctx = eng.drafter.new_context(capacity)
        self.max_prefix = capacity - r
        if self.max_prefix < 0:
            raise ValueError(f"capacity {capacity} below the {r} verify rows")
        i64 = dict(dtype=torch.int64, device=dev)
        self.ar = torch.arange(r, **i64)
        self.step_in = torch.zeros(4 * r + 1, **i64)  # tokens, depths, bits, write slots, prefix
        self.commit_in = torch.zeros(r + 3, **i64)  # perm, prefix before, accepted, bonus
        self.prefix_t = torch.zeros(1, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(r, **i64)
        self.tree_mask = torch.eye(r, dtype=torch.bool, device=dev)
        slots = self.kv.req_to_token[0] if self.paged else None
        self.plan = eng.path.plan(self.prefix_t, self.tree_mask, slots, t.kv_lora_rank, heads=t.num_heads,
                                  max_prefix=self.max_prefix)
        self.topk = 1 if eng.tree_shape == "chain" else min(eng.budget, t.vocab_size)
        self.cuda = self.eng.device.type == "cuda"
        pin = dict(pin_memory=True) if self.cuda else {}
        self.step_host = torch.zeros(4 * r + 1, dtype=torch.int64, **pin)
        self.commit_host = torch.zeros(r + 3, dtype=torch.int64, **pin)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.out: dict[str, tuple] = {}
        self.feats = None

    # ---- the three step functions (fixed shapes; what a graph records) ----------------------
    def _verify(self):
        eng, r, si = self.eng, self.rows, self.step_in
        tokens, depths, bits, widx, prefix = si[:r], si[r:2 * r], si[2 * r:3 * r], si[3 * r:4 * r], si[4 * r:]
        self.prefix_t.copy_(prefix)
        self.positions.copy_(depths + prefix)
        self.tree_mask.copy_(((bits[:, None] >> self.ar[None, :]) & 1) != 0)
        if self.paged:
            self.kv.req_to_token[0].index_copy_(0, prefix + self.ar, widx)
        eng.path.refresh(self.plan)
        f = self.fused
        hidden, feats = eng.target(tokens, self.positions, self.kv.buffer, widx, self.plan, eng.path,
                                   f.layer if f is not None else None)
        logits, picks = (f.verify_head if f is not None else verify_head)(eng.target, hidden)
        return logits, feats, picks

    def _commit(self):
        r, ci, buf = self.rows, self.commit_in, self.kv.buffer
        perm, c, k = ci[:r], ci[r], ci[r + 1]
        src, dest = self.ar + c, perm + c
        keep = perm < k
        if self.paged:
            tab = self.kv.req_to_token[0]
            if self.eng.poison:
                old = tab[src]
                buf[:, old] = torch.where(keep[None, :, None], buf[:, old], float("nan"))
            tab[dest] = tab[src]
        else:
            rows = buf[:, src]
            if self.eng.poison:
                rows = torch.where(keep[None, :, None], rows, float("nan"))
            buf[:, dest] = rows
        self.eng.drafter.append_static(self.dctx, self.feats, self.positions, dest)
        return ()

    def _draft(self):
        eng, r, ci = self.eng, self.rows, self.commit_in
        n = ci[r:r + 1] + ci[r + 1:r + 2]
        return eng.drafter.forward_static(self.dctx, n, ci[r + 2:r + 3], eng.target.embed_tokens, eng.target.lm_head,
                                          self.topk, self.fused)

    def run(self, name: str):
        if name in self.graphs:
            self.graphs[name].replay()
            return self.out[name]
        out = getattr(self, "_" + name)()
        if name == "verify":
            self.feats = out[1]
        return out

    # ---- capture ------------------------------------------------------------------------------
    def capture(self) -> float:
        """Record the three functions as CUDA graphs (two eager runs first on a side stream: Triton
        compiles, cuBLAS picks its kernels). Runs on an empty state and leaves it empty. Seconds."""
        t0 = time.perf_counter()
        self._benign_inputs()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                for name in NAMES:
                    self.run(name)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        for name in NAMES:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = getattr(self, "_" + name)()
            self.graphs[name], self.out[name] = g, out
            if name == "verify":
                self.feats = out[1]  # the commit graph reads the verify graph's static output
        torch.cuda.synchronize()
        self.reset()
        return time.perf_counter() - t0

    def _benign_inputs(self) -> None:
        r = self.rows
        self.kv.reset(refill=False)
        slots = self.kv.take_slots(r) if self.paged else list(range(r))
        if self.paged:
            self.kv.give_back(slots)
        self.step_host.zero_()
        self.step_host[2 * r:3 * r] = torch.tensor(ancestor_bits([-1] * r))  # every row sees itself
        self.step_host[3 * r:4 * r] = torch.tensor(slots)
        self.step_in.copy_(self.step_host)
        self.commit_host.zero_()
        self.commit_host[:r] = torch.arange(r)
        self.commit_in.copy_(self.commit_host)

    def reset(self) -> None:
        self.kv.reset()
        self.dctx.n = 0

    # ---- host side of one step ------------------------------------------------------------------
    def write_commit(self, perm: list[int], c: int, k: int, bonus: int) -> None:
        h = self.commit_host
        h[: self.rows] = torch.tensor(perm)
        h[self.rows], h[self.rows + 1], h[self.rows + 2] = c, k, bonus
        self.commit_in.copy_(h, non_blocking=self.cuda)

    def write_step(self, tree: DraftTree, prefix: int) -> list[int]:
        """Pad the tree to R rows, take write slots, fill step_in; returns the write slots."""
        r, n = self.rows, tree.num_rows
        pad = r - n
        tokens = list(tree.tokens) + [0] * pad
        depths = list(tree.depths) + [0] * pad
        bits = ancestor_bits(list(tree.parents) + [-1] * pad)
        widx = self.kv.take_slots(r) if self.paged else list(range(prefix, prefix + r))
        self.step_host.copy_(torch.tensor(tokens + depths + bits + widx + [prefix]))
        self.step_in.copy_(self.step_host, non_blocking=self.cuda)
        return widx

    def after_walk(self, path: list[int], widx: list[int], bonus: int) -> None:
        """Commit: rows of the path first (in path order), then the others; bookkeeping on the host."""
        r, c, k = self.rows, self.kv.committed, len(path)
        perm, rest = [0] * r, k
        on_path = {row: t for t, row in enumerate(path)}
        for j in range(r):
            if j in on_path:
                perm[j] = on_path[j]
            else:
                perm[j], rest = rest, rest + 1
        self.write_commit(perm, c, k, bonus)
        self.run("commit")
        if self.paged:
            self.kv.give_back([widx[j] for j in range(r) if j not in on_path])
        self.kv.committed += k
        self.dctx.n += k
