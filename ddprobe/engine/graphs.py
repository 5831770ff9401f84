"""Static decode steps: fixed buffers and device plans, captured as CUDA graphs and replayed.

One ``StaticStep`` per (step plan, capacity) holds everything a decode step touches: the KV cache
and the drafter context it is given (sized for ``capacity`` tokens), the verify plan built ONCE as a
device plan (kernels read the prefix length from ``prefix_t``), and the step functions over them.
It is built from what it computes with, passed explicitly: the models, the model config and the
frozen ``spec.StepSpec`` (a ``runner.StepRunner`` makes and keeps it). The main three:

- ``draft``:  drafter forward over [bonus, L masks] at context length n, then the top-k of its
  log-probs (what the tree build needs): inputs ``commit_in``; outputs vals, idx [L, k].
- ``verify``: the verify inputs (``unpack`` or ``tree`` wrote them) into the plan's buffers, refresh
  the plan, the target forward over R = budget + 1 rows (trees with fewer nodes are padded with
  rows that only see themselves), logits and greedy picks.
- ``commit``: permute the R new rows so the accepted ones come first (contiguous: KV rows;
  paged: the slot table), append every row's drafter K/V at its permuted place (rows past the
  accepted ones are overwritten later), NaN-poison the rejected rows when asked.

Two ways to run a step over them (the strategies ``steps.DeviceTreeStep`` and ``steps.HostTreeStep``):

- device tree (``spec.device_tree``, greedy): ``draft -> tree -> verify -> walk -> commit`` with no
  host round trip in between. ``tree`` builds the DDTree on the device from the draft's top-k
  (``tree_device.build_tree_device``: the same tree as ``tree.build_tree``; on CUDA its one-program
  Triton twin ``build_tree_fused``) and fills the verify inputs; ``walk`` (``tree_device.walk_device``) writes ``commit_in`` (permutation, prefix,
  accepted count, next bonus) and ``out_buf`` (the committed tokens, their count, the tree size,
  a finite-logits flag): the one device-to-host copy of the step. The write slots need no host
  either: paged, the slot table's tail past the prefix is filled with every free slot when decoding
  starts, so a step writes at ``tab[prefix:prefix + R]`` and the commit's permutation leaves the
  rejected slots right after the new prefix for the next step.
- host tree (sampling, ``device_tree=False``): the host reads the top-k, builds the tree
  (tree.build_tree), writes ``step_in`` (tokens, depths, parents, write slots, prefix) which
  ``unpack`` turns into the verify inputs (the mask: ``tree_device.ancestor_mask_device``), reads the
  picks (or samples the logits), walks (tree.walk) and writes ``commit_in``.

On CUDA each function is captured once (``capture``) and replayed; on CPU the same functions run
eagerly, which is what the CPU tests compare with the eager step (``steps.py``).

``DecodeStep`` is plain greedy decoding as a static step: one row (R = 1) through the same verify
path's plan and run, one captured graph (``decode``) that chains replay after replay, one copy back
per token. ``fill_synthetic`` / ``synthetic(ctx)``: a cache of ``ctx`` random rows, for timing a step
at a context without a prefill (``probes.bench.step_times``, ``benchmarks/bench_engine.py``).
"""
from __future__ import annotations

import time

import torch

from ..physics.presets import ModelConfig
from .drafter import DrafterContext
from .fuse import Fused, verify_head
from .kv_cache import KVCache
from .spec import Models, StepSpec
from .tree import DraftTree
from .tree_device import (DeviceTree, ancestor_mask_device, build_tree_device, build_tree_fused,
                          fused_tree_fallback, walk_device)

NAMES = ("draft", "tree", "unpack", "verify", "walk", "commit")  # run order within a step
HOST_NAMES = ("draft", "unpack", "verify", "commit")  # the host tree's step


class StaticStep:
    def __init__(self, models: Models, config: ModelConfig, spec: StepSpec, kv: KVCache, dctx: DrafterContext,
                 fused: Fused | None = None):
        """kv, dctx: the request's cache and drafter context (capacity: kv.capacity tokens); fused:
        the compiled functions (graph mode on CUDA) or None (the plain ones)."""
        self.models, self.spec, self.fused = models, spec, fused
        self.kv, self.dctx, self.capacity = kv, dctx, kv.capacity
        dev, t, capacity = spec.device, config.target, kv.capacity
        self.rows = r = spec.rows
        self.paged = spec.kv_layout == "paged"
        self.max_prefix = capacity - r
        if self.max_prefix < 0:
            raise ValueError(f"capacity {capacity} below the {r} verify rows")
        i64 = dict(dtype=torch.int64, device=dev)
        self.ar = torch.arange(r, **i64)
        self.step_in = torch.zeros(4 * r + 1, **i64)  # tokens, depths, parents, write slots, prefix
        self.commit_in = torch.zeros(r + 3, **i64)  # perm, prefix before, accepted, bonus
        self.prefix_t = torch.zeros(1, dtype=torch.int32, device=dev)
        # the verify's inputs (written by ``unpack`` from step_in, or by ``tree`` on the device)
        self.tokens = torch.zeros(r, **i64)
        self.widx = torch.zeros(r, **i64)
        self.prefix = torch.zeros(1, **i64)
        self.positions = torch.zeros(r, **i64)
        self.tree_mask = torch.eye(r, dtype=torch.bool, device=dev)
        # the device tree as the walk reads it, and the step's one answer to the host:
        # committed tokens [R], their count, the tree size, logits finite (1/0)
        self.dtree = DeviceTree(torch.zeros(r, **i64), torch.full((r,), -1, **i64), torch.zeros(r, **i64),
                                torch.eye(r, dtype=torch.bool, device=dev), torch.zeros(r, dtype=torch.bool, device=dev),
                                torch.zeros(r, dtype=torch.float64, device=dev), torch.zeros((), **i64))
        self.out_buf = torch.zeros(r + 3, **i64)
        slots = self.kv.req_to_token[0] if self.paged else None
        self.plan = spec.path.plan(self.prefix_t, self.tree_mask, slots, t.kv_lora_rank, heads=t.num_heads,
                                  max_prefix=self.max_prefix)
        self.topk = 1 if spec.tree_shape == "chain" else min(spec.budget, t.vocab_size)
        L = config.drafter.num_draft
        self.dvals = torch.zeros(L, self.topk, dtype=torch.float64, device=dev)  # the draft's top-k
        self.didx = torch.zeros(L, self.topk, **i64)
        self.cuda = spec.cuda
        # the tree in one Triton program where it gives the plain build's tree on this device (checked once per
        # shape); fused_tree_fallback: why not, where it was wanted (said once as a warning)
        self.fused_tree_fallback = fused_tree_fallback(dev, spec.budget, L, self.topk) \
            if self.cuda and spec.device_tree else None
        self.fused_tree = self.cuda and spec.device_tree and self.fused_tree_fallback is None
        pin = dict(pin_memory=True) if self.cuda else {}
        self.step_host = torch.zeros(4 * r + 1, dtype=torch.int64, **pin)
        self.commit_host = torch.zeros(r + 3, dtype=torch.int64, **pin)
        self.out_host = torch.zeros(r + 3, dtype=torch.int64, **pin)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.out: dict[str, tuple] = {}
        self.feats = self.logits = self.picks = None
        self.device_error: str | None = None  # why the device tree's graphs were not captured

    # ---- the three step functions (fixed shapes; what a graph records) ----------------------
    def _unpack(self):
        """Host tree: step_in (tokens, depths, parents, write slots, prefix) -> verify inputs."""
        r, si = self.rows, self.step_in
        depths, parents, prefix = si[r:2 * r], si[2 * r:3 * r], si[4 * r:]
        self.tokens.copy_(si[:r])
        self.widx.copy_(si[3 * r:4 * r])
        self.prefix.copy_(prefix)
        self.positions.copy_(depths + prefix)
        self.tree_mask.copy_(ancestor_mask_device(parents))
        return ()

    def _tree(self):
        """Device tree: the draft's top-k and commit_in (prefix, accepted, bonus of the last step)
        -> the DDTree (tree_device.build_tree_device) and the verify inputs."""
        r, ci, d = self.rows, self.commit_in, self.dtree
        prefix = ci[r:r + 1] + ci[r + 1:r + 2]
        if self.fused_tree:  # one Triton program writing the walk's tree in place (the same tree, bit for bit)
            t = build_tree_fused(self.dvals, self.didx, self.spec.budget, ci[r + 2:r + 3], out=d)
        else:
            t = build_tree_device(self.dvals, self.didx, self.spec.budget, ci[r + 2:r + 3])
            for dst, src in ((d.tokens, t.tokens), (d.parents, t.parents), (d.depths, t.depths), (d.mask, t.mask),
                             (d.valid, t.valid), (d.size, t.size)):
                dst.copy_(src)
        for dst, src in ((self.tokens, t.tokens), (self.tree_mask, t.mask), (self.prefix, prefix),
                         (self.positions, t.depths + prefix)):
            dst.copy_(src)
        slots = prefix + self.ar
        self.widx.copy_(self.kv.req_to_token[0][slots] if self.paged else slots)
        return ()

    def _verify(self):
        path, target, prefix, widx = self.spec.path, self.models.target, self.prefix, self.widx
        self.prefix_t.copy_(prefix)
        if self.paged:
            self.kv.req_to_token[0].index_copy_(0, prefix + self.ar, widx)
        path.refresh(self.plan)
        f = self.fused
        hidden, feats = target(self.tokens, self.positions, self.kv.buffer, widx, self.plan, path,
                               f.layer if f is not None else None)
        logits, picks = (f.verify_head if f is not None else verify_head)(target, hidden)
        return logits, feats, picks

    def _walk(self):
        """Device tree, greedy: tree_device.walk_device over the picks -> commit_in and out_buf."""
        r, d = self.rows, self.dtree
        w = walk_device(d, self.picks)
        self.commit_in[:r].copy_(w.perm)
        self.commit_in[r:r + 1].copy_(self.prefix)
        self.commit_in[r + 1].copy_(w.count)
        self.commit_in[r + 2:r + 3].copy_(w.bonus)
        self.out_buf[:r].copy_(w.out)
        self.out_buf[r].copy_(w.count)
        self.out_buf[r + 1].copy_(d.size)
        if self.spec.poison:  # NaN in a tree row's logits: attention read outside the plan
            self.out_buf[r + 2].copy_(torch.where(d.valid[:, None], self.logits.isfinite(), True).all())
        return ()

    def _commit(self):
        r, ci, buf = self.rows, self.commit_in, self.kv.buffer
        perm, c, k = ci[:r], ci[r], ci[r + 1]
        src, dest = self.ar + c, perm + c
        keep = perm < k
        if self.paged:
            tab = self.kv.req_to_token[0]
            if self.spec.poison:
                old = tab[src]
                buf[:, old] = torch.where(keep[None, :, None], buf[:, old], float("nan"))
            tab[dest] = tab[src]
        else:
            rows = buf[:, src]
            if self.spec.poison:
                rows = torch.where(keep[None, :, None], rows, float("nan"))
            buf[:, dest] = rows
        self.models.drafter.append_static(self.dctx, self.feats, self.positions, dest)
        return ()

    def _draft(self):
        (target, drafter), r, ci = self.models, self.rows, self.commit_in
        n = ci[r:r + 1] + ci[r + 1:r + 2]
        vals, idx = drafter.forward_static(self.dctx, n, ci[r + 2:r + 3], target.embed_tokens, target.lm_head,
                                           self.topk, self.fused)
        self.dvals.copy_(vals)
        self.didx.copy_(idx)
        return self.dvals, self.didx

    def set_draft(self, vals: torch.Tensor, idx: torch.Tensor) -> None:
        """A proposer's top-k [L, k] in place of the draft's (tests)."""
        self.dvals.copy_(vals)
        self.didx.copy_(idx)

    def run(self, name: str, eager: bool = False):
        """Run step function ``name``: replay its graph when captured, else call it. eager: call it
        even when captured, keeping the outputs the later functions read (benchmarks: graph vs plain)."""
        if name in self.graphs and not eager:
            self.graphs[name].replay()
            return self.out[name]
        out = getattr(self, "_" + name)()
        if name == "verify" and not (eager and name in self.graphs):
            self.logits, self.feats, self.picks = out
        return out

    # ---- capture ------------------------------------------------------------------------------
    def capture(self) -> float:
        """Record the step functions as CUDA graphs (two eager runs first on a side stream: Triton
        compiles, cuBLAS picks its kernels). Runs on an empty state and leaves it empty. Seconds.
        The device tree's two (tree, walk) are captured when ``spec.device_tree``; should that fail,
        the step keeps the host tree (``device_error`` says why) rather than failing the request."""
        t0 = time.perf_counter()
        names = NAMES if self.spec.device_tree else HOST_NAMES
        try:
            self._capture(names)
        except Exception as e:  # noqa: BLE001
            if names == HOST_NAMES:
                raise
            self.device_error = f"{type(e).__name__}: {e}"[:300]
            self.graphs, self.out = {}, {}
            torch.cuda.synchronize()
            self._capture(HOST_NAMES)  # a compile error raises here again: runner.py handles it
        self.reset()
        return time.perf_counter() - t0

    @property
    def device_ok(self) -> bool:
        """Can this step run the device tree (on CUDA: were its graphs captured)?"""
        return not self.cuda or "tree" in self.graphs

    def _capture(self, names) -> None:
        record_graphs(self, names)

    def captured_out(self, name: str, out) -> None:
        if name == "verify":  # the walk and commit graphs read the verify graph's static outputs
            self.logits, self.feats, self.picks = out

    def benign_inputs(self) -> None:
        """An empty cache and inputs every step function runs on without reading outside the plan:
        one-row trees (each row sees itself), fresh write slots, no permutation (capture, tests)."""
        r = self.rows
        self.kv.reset(refill=False)
        slots = self.kv.take_slots(r) if self.paged else list(range(r))
        if self.paged:
            self.kv.give_back(slots)
            self.kv.req_to_token[0, :r] = torch.tensor(slots, device=self.kv.device)  # the device tree's slots
        self.step_host.zero_()
        self.step_host[2 * r:3 * r] = -1  # parents: every row sees itself
        self.step_host[3 * r:4 * r] = torch.tensor(slots)
        self.step_in.copy_(self.step_host)
        self.commit_host.zero_()
        self.commit_host[:r] = torch.arange(r)
        self.commit_in.copy_(self.commit_host)

    def reset(self) -> None:
        self.kv.reset()
        self.dctx.n = 0

    def synthetic(self, ctx: int) -> None:
        """A committed context of ``ctx`` random latent rows and drafter K/V (timing only: a step's time
        does not depend on the values, and no prefill runs)."""
        fill_synthetic(self.kv, ctx, self.dctx)

    # ---- host side of one step ------------------------------------------------------------------
    def write_commit(self, perm: list[int], c: int, k: int, bonus: int) -> None:
        h = self.commit_host
        h[: self.rows] = torch.tensor(perm)
        h[self.rows], h[self.rows + 1], h[self.rows + 2] = c, k, bonus
        self.commit_in.copy_(h, non_blocking=self.cuda)

    def write_step(self, tree: DraftTree, prefix: int) -> list[int]:
        """Pad the tree to R rows, take write slots, fill step_in and unpack it into the verify's
        inputs; returns the write slots."""
        r, n = self.rows, tree.num_rows
        pad = r - n
        tokens = list(tree.tokens) + [0] * pad
        depths = list(tree.depths) + [0] * pad
        parents = list(tree.parents) + [-1] * pad  # a padded row sees itself
        widx = self.kv.take_slots(r) if self.paged else list(range(prefix, prefix + r))
        self.step_host.copy_(torch.tensor(tokens + depths + parents + widx + [prefix]))
        self.step_in.copy_(self.step_host, non_blocking=self.cuda)
        self.run("unpack")
        return widx

    def start_device(self, bonus: int) -> None:
        """Device tree: before the first step, commit_in (no permutation, prefix, 0 accepted, the
        bonus) and, paged, every free slot into the slot table after the prefix."""
        self.write_commit(list(range(self.rows)), self.kv.committed, 0, bonus)
        if self.paged:
            c = self.kv.committed
            tail = self.kv.take_slots(self.kv.free_slots)
            self.kv.req_to_token[0, c:c + len(tail)] = torch.tensor(tail, dtype=torch.int64).to(self.kv.device)

    def read_step(self) -> list[int]:
        """Device tree: the step's one device-to-host copy (waits for the step) -> out_buf as a list."""
        self.out_host.copy_(self.out_buf, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        return self.out_host.tolist()

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
        self.advance(k)

    def advance(self, k: int) -> None:
        """The host's counters after a commit of k rows: the cache's and the drafter context's."""
        self.kv.committed += k
        self.dctx.n += k


def fill_synthetic(kv: KVCache, ctx: int, dctx: DrafterContext | None = None) -> None:
    """Empty ``kv``, then ``ctx`` committed rows of random latent values (paged: in the cache's slot order);
    the drafter context ``dctx``, when given, as many rows of random K/V (and history)."""
    if not 0 <= ctx <= kv.capacity:
        raise ValueError(f"context {ctx} beyond the cache's {kv.capacity} rows")
    kv.reset(refill=False)
    kv.buffer.normal_()
    if kv.layout == "paged" and ctx:
        kv.req_to_token[0, :ctx] = torch.tensor(kv.take_slots(ctx), device=kv.device)
    kv.committed = ctx
    if dctx is not None:
        for t in (dctx.k, dctx.v, dctx.h):
            if t is not None:
                t.normal_()
        dctx.n = ctx


def record_graphs(step, names) -> None:
    """Capture ``step``'s functions ``names`` (``step._<name>``) as CUDA graphs into ``step.graphs`` /
    ``step.out``: two eager runs of all of them first on a side stream (Triton compiles, cuBLAS picks
    its kernels), each from ``step.benign_inputs()``; ``step.captured_out(name, out)`` after each capture."""
    step.benign_inputs()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step.benign_inputs()
            for name in names:
                step.run(name)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    step.benign_inputs()
    for name in names:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = getattr(step, "_" + name)()
        step.graphs[name], step.out[name] = g, out
        step.captured_out(name, out)
    torch.cuda.synchronize()


class DecodeStep:
    """Plain greedy decode as a static step: one query row (R = 1) through the verify path's normal
    plan and run, over fixed buffers and a device plan, captured as one CUDA graph (``decode``) on a
    GPU and run eagerly on CPU. The graph reads the row's token and position from ``token`` /
    ``prefix``, writes its latent row at the slot the table holds there (paged: ``start`` fills the
    table's tail with free slots; contiguous: row ``prefix``), and leaves the greedy pick in ``token``
    and ``prefix`` one further, so replays chain with one device-to-host copy each (the pick and a
    finite-logits flag). No drafter, no tree."""

    rows = 1

    def __init__(self, models: Models, config: ModelConfig, spec: StepSpec, kv: KVCache, fused: Fused | None = None):
        self.models, self.spec, self.kv, self.fused = models, spec, kv, fused
        self.capacity, self.cuda, self.paged = kv.capacity, spec.cuda, spec.kv_layout == "paged"
        self.max_prefix = kv.capacity - 1
        if self.max_prefix < 0:
            raise ValueError("a decode step needs a cache of at least one row")
        dev, t = spec.device, config.target
        i64 = dict(dtype=torch.int64, device=dev)
        self.token, self.prefix, self.widx = (torch.zeros(1, **i64) for _ in range(3))  # prefix: the row's position
        self.prefix_t = torch.zeros(1, dtype=torch.int32, device=dev)
        self.mask = torch.ones(1, 1, dtype=torch.bool, device=dev)
        self.plan = spec.path.plan(self.prefix_t, self.mask, kv.req_to_token[0] if self.paged else None,
                                   t.kv_lora_rank, heads=t.num_heads, max_prefix=self.max_prefix)
        self.out_buf = torch.ones(2, **i64)  # the pick, logits finite (1/0; stays 1 without poison)
        self.in_host, self.out_host = (torch.zeros(2, dtype=torch.int64, pin_memory=self.cuda) for _ in range(2))
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.out: dict[str, tuple] = {}

    def _decode(self):
        path, target, f = self.spec.path, self.models.target, self.fused
        self.prefix_t.copy_(self.prefix)
        self.widx.copy_(self.kv.req_to_token[0][self.prefix] if self.paged else self.prefix)
        path.refresh(self.plan)
        hidden, _ = target(self.token, self.prefix, self.kv.buffer, self.widx, self.plan, path,
                           f.layer if f is not None else None)
        logits, picks = (f.verify_head if f is not None else verify_head)(target, hidden)
        self.out_buf[:1].copy_(picks)
        if self.spec.poison:  # NaN in the logits: the attention read a row outside the plan
            self.out_buf[1].copy_(logits.isfinite().all())
        self.token.copy_(picks)
        self.prefix.add_(1)
        return ()

    def run(self, name: str = "decode"):
        if name in self.graphs:
            self.graphs[name].replay()
            return self.out[name]
        return getattr(self, "_" + name)()

    def capture(self) -> float:
        """Record ``decode`` as a CUDA graph (warm-up runs first; leaves the cache empty). Seconds."""
        t0 = time.perf_counter()
        record_graphs(self, ("decode",))
        self.reset()
        return time.perf_counter() - t0

    def captured_out(self, name: str, out) -> None:
        pass

    def benign_inputs(self) -> None:
        """An empty cache, token 0 at position 0 written to a free slot (capture, timing)."""
        self.kv.reset(refill=False)
        if self.paged:
            slot = self.kv.take_slots(1)
            self.kv.give_back(slot)
            self.kv.req_to_token[0, :1] = slot[0]
        self.set_inputs(0, 0)

    def set_inputs(self, token: int, prefix: int) -> None:
        self.in_host[0], self.in_host[1] = token, prefix
        self.token.copy_(self.in_host[:1])  # blocking: the host may rewrite in_host right after
        self.prefix.copy_(self.in_host[1:])

    def reset(self) -> None:
        self.kv.reset()

    def start(self, token: int) -> None:
        """Before the first step: ``token`` at the committed length and, paged, every free slot into the
        slot table after the prefix (the steps write at ``tab[prefix]``)."""
        c = self.kv.committed
        if c > self.max_prefix:
            raise ValueError(f"context beyond the cache: {c} committed + 1 new row > capacity {self.capacity}")
        if self.paged:
            tail = self.kv.take_slots(self.kv.free_slots)
            self.kv.req_to_token[0, c:c + len(tail)] = torch.tensor(tail, dtype=torch.int64).to(self.kv.device)
        self.set_inputs(token, c)

    def step(self) -> tuple[int, bool]:
        """One decode step: (the greedy next token, logits finite). The one device-to-host copy waits for it."""
        if self.kv.committed >= self.capacity:
            raise ValueError(f"context beyond the cache: {self.kv.committed} committed + 1 new row > capacity "
                             f"{self.capacity}")
        self.run("decode")
        self.out_host.copy_(self.out_buf, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        self.kv.committed += 1
        return int(self.out_host[0]), bool(self.out_host[1])

    def synthetic(self, ctx: int) -> None:
        """A committed context of ``ctx`` random latent rows, then ``start`` (timing only)."""
        fill_synthetic(self.kv, ctx)
        self.start(0)
