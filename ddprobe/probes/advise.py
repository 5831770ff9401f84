"""Should speculation stay on at this context? `ddprobe advise` (no torch here).

Per verify path, text kind, context and budget: tokens/s with speculation = commit length / verify step, against
plain decoding's 1 / decode step. From them, per path and text:
- the best budget at each context (the most tokens/s), or off (0) where plain decoding is faster;
- the crossover: the context beyond which speculation loses, interpolated linearly in context between the last
  context measured where it pays and the first where it loses;
- one sentence ("with paged, speculation loses beyond 23k on novel text; with split_ws it still pays at 128k:
  412 tok/s against 280");
- a table in the form of vLLM RFC #48627 (a context-length axis for the number of speculative tokens: context
  bucket lower bound in tokens -> budget, 0 for off) that a deployment can paste.

The points come from the engine measured on this GPU (``measure_here``, ``measure``), typed numbers
(``points_typed``), or a commit results file (``points_from_file``, ``points_from_commit``), each point saying where
its numbers came from; ``advise_result`` (the pipeline of `advise` and `diagnose`) turns them into verdicts and a
results file.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..schema import one_step_tokens, parse_rows, too_short
from ..units import DDProbeError, fmt_tokens
from .backends.engine import MAX_BUDGET
from .bench.step_times import StepTimeOptions, check as check_cells, measure_step_times


@dataclass
class Point:
    path: str  # the verify path (or what the typed numbers describe)
    text: str  # predictable, novel, recall or a label
    ctx: int
    budget: int
    commit_len: float  # tokens committed per verify step, bonus included
    verify_ms: float
    decode_ms: float  # the plain one-row decode step at this context
    source: str = ""  # where the step times come from
    spec_tok_s: float = 0.0
    plain_tok_s: float = 0.0
    speedup: float = 0.0  # spec / plain
    note: str = ""
    same_model: bool = True  # the steps are the step model's model (False: a file of another; no physics check)
    tree: str = "ddtree"  # the draft's shape: ddtree (budget = nodes) or chain (budget = its depth)
    kernel: str = ""  # what the verify step ran on, where it is not ``path`` alone
    decode_kernel: str = ""  # what the plain decode step ran on, where it is not ``path`` alone

    def __post_init__(self):
        check_budget(self.budget)
        where = f"at {fmt_tokens(self.ctx)}"
        if not (isinstance(self.commit_len, (int, float)) and math.isfinite(self.commit_len) and self.commit_len >= 1):
            raise DDProbeError(f"commit length {where} must be a finite number >= 1 (the bonus token), got "
                               f"{self.commit_len!r}")
        for what, v in (("verify step", self.verify_ms), ("decode step", self.decode_ms)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise DDProbeError(f"{what} {where} must be a finite time > 0 ms, got {v!r}")
        if self.commit_len > self.budget + 1 + 1e-9:
            raise DDProbeError(f"commit length {self.commit_len:g} at {fmt_tokens(self.ctx)} exceeds budget + 1 "
                               f"({self.budget + 1}): a step commits at most its accepted nodes and the bonus token")
        self.spec_tok_s = self.commit_len / self.verify_ms * 1e3
        self.plain_tok_s = 1e3 / self.decode_ms
        self.speedup = self.spec_tok_s / self.plain_tok_s
        if self.decode_ms > self.verify_ms:
            self.note = (f"the plain decode step ({self.decode_ms:.4g} ms) is longer than the {self.budget + 1}-row "
                         f"verify step ({self.verify_ms:.4g} ms) at {fmt_tokens(self.ctx)}: check the two numbers")

    def to_dict(self) -> dict:
        return asdict(self)


def check_budget(b: int) -> int:
    if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= MAX_BUDGET:
        raise DDProbeError(f"budget must be an integer in 1..{MAX_BUDGET}, got {b!r}")
    return b


@dataclass
class Verdict:
    """One path and text: the best budget per context and the crossover."""

    path: str
    text: str
    best: list[dict] = field(default_factory=list)  # per ctx: budget (0: off), spec/plain tok/s, speedup
    crossover_ctx: float | None = None  # beyond it speculation loses; None: it never does (or always does)
    crossover_extrapolated: bool = False  # below the smallest context measured: the verify step extended linearly
    loses_everywhere: bool = False
    pays_everywhere: bool = False
    sentence: str = ""
    shapes: int = 1  # draft shapes among the points (2: the RFC table names the shape per bucket)
    # plain decoding measured (the engine here, typed --decode-ms): a loss decides. False: plain decoding is the step
    # model's floor, the fastest it can be, so a loss against it is unproven and the RFC table keeps speculation on
    plain_measured: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def _best(points: list[Point]) -> dict:
    """The point of most tokens/s at one context; ``budget`` 0 where it loses to plain decoding. ``break_even_ms``:
    the plain decode step below which it loses (verify step / commit length)."""
    p = max(points, key=lambda p: p.spec_tok_s)
    return {"ctx": p.ctx, "budget": p.budget if p.speedup >= 1 else 0, "best_budget_if_on": p.budget,
            "commit_len": p.commit_len, "verify_ms": p.verify_ms, "decode_ms": p.decode_ms,
            "spec_tok_s": p.spec_tok_s, "plain_tok_s": p.plain_tok_s, "speedup": p.speedup,
            "break_even_ms": p.verify_ms / p.commit_len, "tree": p.tree}


def break_even_line(v: "Verdict") -> str:
    """The break-even plain step per context of a verdict: '22.7 ms at 32k, 90.6 ms at 128k'."""
    return ", ".join(f"{b['break_even_ms']:.4g} ms at {fmt_tokens(b['ctx'])}" for b in v.best)


MIN_CTX = 1024  # extrapolation stops here


def fmt_ctx(c: float) -> str:
    """A crossover context: whole k where it is one, else k to one decimal (12366 -> '12.1k')."""
    return fmt_tokens(int(c)) if int(c) == c and int(c) % 1024 == 0 else f"{c / 1024:.1f}k"


def _line(a: dict, b: dict, decode_at=None):
    """speedup(ctx) with the verify step, the decode step (or ``decode_at(ctx)``) and the commit length each linear
    in context through measured points ``a`` and ``b`` (one budget): the step model's fixed part + marginal cost."""
    span = b["ctx"] - a["ctx"]

    def at(key: str, c: float) -> float:
        return a[key] + (b[key] - a[key]) * (c - a["ctx"]) / span

    def speedup(c: float) -> float:
        d = decode_at(int(c)) if decode_at else max(at("decode_ms", c), 1e-9)
        return max(at("commit_len", c), 1.0) * d / max(at("verify_ms", c), 1e-9)

    return speedup


def _bisect(speedup, lo: float, hi: float) -> float:
    """The context in [lo, hi] where speedup crosses 1, given speedup(lo) >= 1 > speedup(hi)."""
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid) >= 1 else (lo, mid)
    return (lo + hi) / 2


def crossover(best: list[dict]) -> float | None:
    """The context where speculation turns from paying to losing going up in context, between the two measured
    contexts around it (``_line``), or None where it never does."""
    for a, b in zip(best, best[1:]):
        if a["speedup"] >= 1 > b["speedup"]:
            return _bisect(_line(a, b), float(a["ctx"]), float(b["ctx"]))
    return None


def crossover_below(a: dict, b: dict | None, decode_at=None) -> float | None:
    """Where speculation that loses at the smallest context measured (``a``) started to lose: the steps extended
    linearly below it through ``a`` and ``b``, the next context's point at ``a``'s budget (``_line``; the commit
    length held at ``a``'s below it), the decode step from ``decode_at(ctx)`` (the step model) where given. None
    when it loses down to ``MIN_CTX`` or there is no second point."""
    if b is None or a["speedup"] >= 1:
        return None
    line = _line({**a, "commit_len": a["commit_len"]}, {**b, "commit_len": a["commit_len"]}, decode_at)
    lo, hi = float(MIN_CTX), float(a["ctx"])
    if lo >= hi or line(lo) < 1:
        return None
    return _bisect(line, lo, hi)


def verdict(path: str, text: str, points: list[Point], decode_at=None, plain_measured: bool = True) -> Verdict:
    """One path and text over its points. ``plain_measured`` False: the plain step is the step model's floor, so a
    loss is a bound (the sentence says it is unproven and gives the break-even plain step); a win stands."""
    by_ctx: dict[int, list[Point]] = {}
    for p in points:
        by_ctx.setdefault(p.ctx, []).append(p)
    best = [_best(by_ctx[c]) for c in sorted(by_ctx)]
    v = Verdict(path, text, best, crossover(best), shapes=len({p.tree for p in points}))
    if v.crossover_ctx is None and len(best) > 1 and all(b["speedup"] < 1 for b in best):
        # the next context's point at the first context's best budget: the extension keeps one tree size
        same = [p for p in by_ctx[best[1]["ctx"]] if p.budget == best[0]["best_budget_if_on"] and
                p.tree == best[0].get("tree", "ddtree")]  # the same draft: one size and one shape
        v.crossover_ctx = crossover_below(best[0], _best(same) if same else None, decode_at)
        v.crossover_extrapolated = v.crossover_ctx is not None
    v.loses_everywhere = all(b["speedup"] < 1 for b in best)
    v.pays_everywhere = all(b["speedup"] >= 1 for b in best)
    last, first = best[-1], best[0]
    tok = lambda b: f"{b['spec_tok_s']:.3g} tok/s against {b['plain_tok_s']:.3g}"  # noqa: E731
    on = f" on {text} text" if text not in ("typed", "") else ""
    if v.pays_everywhere:
        size = f"chain depth {last['budget']}" if last["tree"] == "chain" else (
            f"ddtree budget {last['budget']}" if v.shapes > 1 else f"budget {last['budget']}")
        v.sentence = f"with {path}, speculation still pays at {fmt_tokens(last['ctx'])}{on}: {tok(last)} ({size})"
    elif v.crossover_extrapolated:
        v.sentence = (f"with {path}, speculation loses beyond about {fmt_ctx(v.crossover_ctx)}{on} "
                      f"(extrapolated below the smallest context measured; at {fmt_tokens(first['ctx'])}: "
                      f"{tok(first)})")
    elif v.loses_everywhere:
        v.sentence = (f"with {path}, speculation loses at every context measured{on}, from "
                      f"{fmt_tokens(first['ctx'])} ({tok(first)})")
    elif v.crossover_ctx is not None:
        v.sentence = (f"with {path}, speculation loses beyond {fmt_ctx(v.crossover_ctx)}{on} "
                      f"(at {fmt_tokens(last['ctx'])}: {tok(last)})")
    else:  # loses at short context, pays at long: said as measured
        pays = [fmt_tokens(b["ctx"]) for b in best if b["speedup"] >= 1]
        v.sentence = f"with {path}, speculation pays{on} at {', '.join(pays)} only"
    if not plain_measured and not v.pays_everywhere:
        v.plain_measured = False
        said = v.sentence.replace("speculation loses", "speculation would lose to plain decoding at its floor", 1)
        v.sentence = (f"{said}: unproven, plain decoding is modelled (its floor, the fastest it can be), not measured; "
                      f"speculation loses only where your plain decode step is below the break-even plain step: "
                      f"{break_even_line(v)}")
    v.plain_measured = plain_measured
    v.sentence = " ".join(v.sentence.split())
    return v


def advise(points: list[Point], decode_at=None, plain_measured: bool = True) -> list[Verdict]:
    """One verdict per (path, text), in the order the points first name them; ``decode_at(ctx)``: the plain decode
    step at any context (ms), for a crossover below the smallest context measured. ``plain_measured`` False: the
    plain steps are modelled (the floor rows, floor against floor, are like with like and decide)."""
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        groups.setdefault((p.path, p.text), []).append(p)
    return [verdict(path, text, ps, decode_at, plain_measured or path == FLOOR_PATH)
            for (path, text), ps in groups.items()]


def rfc_table(v: Verdict) -> dict[str, int]:
    """vLLM RFC #48627's form: context bucket (lower bound, tokens) -> number of speculative tokens (0: off). The
    buckets start at 0 and change where the best budget changes; the first measured context's budget holds below
    it, and each bucket starts halfway (geometric mean) between the two contexts measured around the change, or at
    the crossover where speculation switches off. Plain decoding modelled (``plain_measured`` False): no loss is
    proven, so speculation stays on at every context, at its best budget there."""
    table: dict[str, int] = {}
    if not v.plain_measured:
        v = Verdict(v.path, v.text, [{**b, "budget": b["best_budget_if_on"]} for b in v.best])
    elif v.crossover_extrapolated:  # on below the crossover (at the first context's best budget), off beyond
        return {"0": v.best[0]["best_budget_if_on"], str(int(round(v.crossover_ctx))): 0}
    for i, b in enumerate(v.best):
        last = v.best[i - 1] if i else None  # the context measured just before this one
        if last is not None and b["budget"] == last["budget"] and (b["budget"] == 0 or
                                                                  b.get("tree") == last.get("tree")):
            continue  # a new bucket where the budget or the shape (tree or chain of the same size) changes
        if last is None:
            start = 0
        elif b["budget"] == 0 and v.crossover_ctx is not None and last["ctx"] <= v.crossover_ctx <= b["ctx"]:
            start = int(round(v.crossover_ctx))
        else:
            start = int(round(math.sqrt(last["ctx"] * b["ctx"])))
        table[str(start)] = b["budget"]
    return table


def method_table(v: Verdict) -> dict[str, str]:
    """The RFC table's buckets (``rfc_table``) with the draft shape each runs: ddtree, chain or off."""
    out = {}
    for start, n in rfc_table(v).items():  # a bucket begins at or below the first context measured in it
        out[start] = "off" if n == 0 else next((b for b in v.best if b["ctx"] >= int(start)), v.best[-1])["tree"]
    return out


def deployable(verdicts: list[Verdict], text: str | None = None) -> dict:
    """The paste-able JSON per path and text (only ``text``'s when given): ``num_speculative_tokens_per_seq_len``,
    and where a chain was among the choices, ``method_per_seq_len`` (ddtree, chain or off per bucket). A deployment
    serving unpredictable text should paste the novel-text table."""
    out = {}
    for v in verdicts:
        if text is None or v.text == text:
            cell = {"num_speculative_tokens_per_seq_len": rfc_table(v)}
            if any(b["tree"] == "chain" for b in v.best) or v.shapes > 1:
                cell["method_per_seq_len"] = method_table(v)
            out.setdefault(v.path, {})[v.text] = cell
    return out


def decisions(points: list[Point], verdicts: list[Verdict]) -> list[dict]:
    """Tree, chain or off per path, text and context: the best tree (its budget, tokens/s), the best chain (its
    depth, tokens/s), plain decoding's tokens/s, the choice and its margin (its tokens/s over the next best). Off
    is chosen only against a measured plain step; against a modelled one the best speculation is kept, marked."""
    measured = {(v.path, v.text): v.plain_measured for v in verdicts}
    cells: dict[tuple[str, str, int], list[Point]] = {}
    for p in points:
        if p.path != FLOOR_PATH:
            cells.setdefault((p.path, p.text, p.ctx), []).append(p)
    out = []
    for (path, text, ctx), ps in cells.items():
        best = {t: max((p for p in ps if p.tree == t), key=lambda p: p.spec_tok_s, default=None)
                for t in ("ddtree", "chain")}
        opts = {f"{t}@{p.budget}": p.spec_tok_s for t, p in best.items() if p is not None}
        opts["off"] = ps[0].plain_tok_s
        ranked = sorted(opts.items(), key=lambda kv: -kv[1])
        choice = ranked[0][0]
        if choice == "off" and not measured.get((path, text), True):
            # off against a modelled plain step proves nothing: the best speculation is kept, and its margin is
            # over the next speculative option (its ratio to plain-at-its-floor is below 1 and said by "unproven")
            ranked = ranked[1:]
            choice = f"{ranked[0][0]} (off unproven)"
        out.append({"path": path, "text": text, "ctx": ctx, "batch": BATCH, "choice": choice,
                    "margin": ranked[0][1] / ranked[1][1] if len(ranked) > 1 and ranked[1][1] else None,
                    **{f"{t}_{'budget' if t == 'ddtree' else 'depth'}": p.budget if p else None
                       for t, p in best.items()},
                    **{f"{t}_tok_s": p.spec_tok_s if p else None for t, p in best.items()},
                    "plain_tok_s": ps[0].plain_tok_s, "plain_kernel": ps[0].decode_kernel or None,
                    "chain_kernel": best["chain"].kernel if best["chain"] is not None else None})
    return out


FLOOR_PATH = "floor"  # the path label of a verify step at its floor (left out of the deployable table)
MODEL_DECODE = "the step model's floor of the one-row step (plain decoding at its best)"


RFC_KEPT_ON = ("speculation kept on at every context in the table: plain decoding was modelled at its floor, not "
               "measured, so no loss is proven; give --decode-ms (your server's plain decode step) to decide, or "
               "compare it with the break-even plain step")
BATCH = 1  # every figure: one request (the steps are single-request steps)


def summary(verdicts: list[Verdict], decode_source: str, points: list[Point] | None = None) -> dict:
    """An advise results file's summary: the verdicts, the paste-able RFC #48627 table (and ``rfc_note``: why it
    keeps speculation on where a loss is only a bound), where plain decode's time came from, the batch size."""
    deploy = [v for v in verdicts if v.path != FLOOR_PATH]
    kept_on = [v for v in deploy if not v.plain_measured and any(b["budget"] == 0 for b in v.best)]
    return {"verdicts": [v.to_dict() for v in verdicts], "vllm_rfc_48627": deployable(deploy),
            "decisions": decisions(points, verdicts) if points else [],
            "decode_source": decode_source, "batch": BATCH,
            **({"rfc_note": RFC_KEPT_ON} if kept_on else {})}


def points_typed(ctxs: list[int], verify_ms: list[float], commit_len: list[float], decode_ms: list[float],
                 budget: int, path: str, text: str, source: str) -> list[Point]:
    """Typed numbers: one per context each (commit length and decode step may be one for all)."""
    check_budget(budget)
    n = len(ctxs)

    def per_ctx(vals: list[float], what: str) -> list[float]:
        if len(vals) == 1:
            return vals * n
        if len(vals) != n:
            raise DDProbeError(f"give one {what} or one per context: {n} contexts, {len(vals)} values")
        return vals

    if len(verify_ms) != n:
        raise DDProbeError(f"give one verify step time per context: {n} contexts, {len(verify_ms)} times")
    if len(set(ctxs)) != n:
        raise DDProbeError("a context is given twice: give each context once, with its own step time")
    return [Point(path, text, c, budget, cl, v, d, source) for c, v, cl, d in
            zip(ctxs, verify_ms, per_ctx(commit_len, "commit length"), per_ctx(decode_ms, "decode step time"))]


def points_from_commit(rows: list[dict], config: dict, decode_ms: dict[int, float], path: str,
                       source: str) -> list[Point]:
    """A commit results file's cells (any backend): commit length and ms per verify step per (text, ctx), the
    file's budget; ``decode_ms`` per context from elsewhere. Cells without a step time or a commit length are left
    out (the caller says how many); none left is one line."""
    budget = config.get("budget")
    if not isinstance(budget, int):
        raise DDProbeError("the commit file does not say its budget (config.budget): give --budget")
    usable = [(i, r) for i, r in enumerate(parse_rows("commit", rows, source, config), 1)
              if r.commit_len and r.decode_ms_per_step]
    if not usable:
        raise DDProbeError("no cell of the commit file has both a commit length and a step time (a server that "
                           "reports no step time): type them instead with --ctx, --step-ms and --commit-len")
    for i, r in usable:
        lo, hi = STEP_MS_RANGE
        if not lo <= r.decode_ms_per_step <= hi:
            raise DDProbeError(f"{source}: row {i}: 'decode_ms_per_step' is {r.decode_ms_per_step:.4g} ms: not a "
                               f"decode step's time (a step takes {lo:g} ms to {hi:g} ms): not believed")
    return [Point(path, r.text, r.ctx, r.budget or budget, r.commit_len, r.decode_ms_per_step, decode_ms[r.ctx],
                  source, tree=r.tree or "ddtree") for _, r in usable]


STEP_MS_RANGE = (1e-3, 1e7)  # a step time read from a file outside it (1 us to about 3 hours) is not believed


@dataclass(frozen=True)
class MeasureOptions:
    """What `advise` measures on this device when no numbers are given: step times of ``preset`` (random weights)
    through each of ``paths`` (``probes.bench.step_times``), and commit lengths of the shipped trained tiny pair per text,
    context and budget (``probes.commit``: a target's commit length needs trained weights)."""

    paths: tuple[str, ...]
    ctxs: tuple[int, ...]
    budgets: tuple[int, ...]
    texts: tuple[str, ...] = ("predictable", "novel")
    preset: str = "k2"
    device: str = "cuda"
    dtype: str = "bf16"
    heads: int | None = 8
    steps: int = 10
    max_new_tokens: int = 64
    threads: int | None = None
    trees: tuple[str, ...] = ("ddtree",)  # draft shapes to compare (ddtree at ``budgets``, chain at ``depths``)
    chain_depths: tuple[int, ...] | None = None  # None: min(budget, L) per budget

    def configs(self, depth_max: int) -> list[tuple[str, int]]:
        """(shape, budget) pairs measured: ``probes.commit.tree_configs``."""
        from .commit import tree_configs

        return tree_configs(list(self.trees), list(self.budgets),
                            list(self.chain_depths) if self.chain_depths else None, depth_max)


TINY_DEPTH = 7  # the shipped tiny pair's drafter depth L (block size 8): the chain's deepest


def _step_options(o: MeasureOptions, path: str) -> StepTimeOptions:
    return StepTimeOptions(preset=o.preset, attn=path, device=o.device, dtype=o.dtype, heads=o.heads, steps=o.steps,
                           threads=o.threads)


def measure(o: MeasureOptions, say=lambda _m: None, progress=None) -> list[Point]:
    """Commit lengths (tiny pair) and step times (``o.preset``) measured here; one Point per path, shape, text,
    context and budget (a chain's: its depth). ``say`` hears of each stage and of each step-time cell (with the time
    left at the pace so far); ``progress(n_cells)``: a context manager giving the commit cells' ``CellProgress``."""
    from contextlib import nullcontext

    for b in o.budgets:
        check_budget(b)
    configs = o.configs(TINY_DEPTH)
    # steps, preset, heads and the cache rows (the same for every path) checked before any cell is measured
    check_cells(_step_options(o, o.paths[0]), list(o.ctxs), [b for _, b in configs])
    with (progress(len(configs) * len(o.texts) * len(o.ctxs)) if progress is not None else nullcontext()) as display:
        commit = _commit_lengths(o, configs, say, display)
    chain_on, chain_why = chain_path_here(o) if any(s == "chain" for s, _ in configs) else (None, "")
    n_chain = sum(s == "chain" for s, _ in configs)
    points, t0, done = [], time.perf_counter(), [0]
    cells = len(o.ctxs) * (len(o.paths) * (len(configs) - n_chain + 1) + (n_chain + 1 if chain_on else
                                                                         n_chain * len(o.paths)))

    def on_row(r) -> None:
        done[0] += 1
        spent = time.perf_counter() - t0
        say(f"  {r.path} {fmt_tokens(r.ctx)} {'plain decode' if r.plain else f'budget {r.budget}'}: {r.step_ms:.4g} "
            f"ms ({done[0]}/{cells} cells, {spent:.0f} s, about {spent / done[0] * (cells - done[0]):.0f} s left)")
    chains: dict[str, list] = {}  # the path a chain ran on -> its rows
    plain: dict[str, dict[int, float]] = {}  # FlashMLA's plain decode step per context, measured once
    for path in o.paths:
        where = f"measured: {o.preset} on {o.device}, {o.dtype}" + (f", {o.heads} heads" if o.heads else "")
        tree = [b for s, b in configs if s == "ddtree"]
        say(f"step times through {path}: {o.preset} at {', '.join(fmt_tokens(c) for c in o.ctxs)}, tree budgets "
            f"{', '.join(map(str, tree)) or 'none'} and plain decode")
        rows = measure_step_times(_step_options(o, path), list(o.ctxs), tree or [1], on_row=on_row)
        if chain_on and chain_on not in plain:  # FlashMLA's one-row step: plain decoding at its strongest here
            say(f"plain decode step times through {chain_on} (FlashMLA's decode kernel, page 64)")
            plain[chain_on] = {r.ctx: r.step_ms for r in
                               measure_step_times(_step_options(o, chain_on), list(o.ctxs), [], on_row=on_row)}
        decode = strongest_plain(path, {r.ctx: r.step_ms for r in rows if r.plain}, plain)
        points += [Point(path, text, r.ctx, r.budget, commit[("ddtree", text, r.ctx, r.budget)], r.step_ms,
                         decode[r.ctx][0], where, tree="ddtree", kernel=path, decode_kernel=decode[r.ctx][1])
                   for text in o.texts for r in rows if not r.plain and r.budget in tree]
        depths = [b for s, b in configs if s == "chain"]
        if depths:
            chain_path = chain_on or path
            if chain_path not in chains:  # FlashMLA's chain: measured once, every tree path compared with it
                say(f"chain step times through {chain_path}: depths {', '.join(map(str, depths))} ("
                    + ("FlashMLA's causal kernel, as production servers verify a chain" if chain_on else
                       f"a chain's causal mask on the tree's kernel: {chain_why}") + ")")
                chains[chain_path] = chain_step_times(_step_options(o, chain_path), list(o.ctxs), depths, on_row)
            chain = chains[chain_path]
            points += [Point(path, text, r.ctx, r.budget, commit[("chain", text, r.ctx, r.budget)], r.step_ms,
                             decode[r.ctx][0], where, tree="chain", kernel=chain_kernel(chain_path, path),
                             decode_kernel=decode[r.ctx][1])
                       for text in o.texts for r in chain]
    return points


CHAIN_PATH = "flashmla"  # the production causal kernel a chain is priced on where it runs (SGLang's and vLLM's)


def strongest_plain(path: str, own: dict[int, float], others: dict[str, dict[int, float]]
                    ) -> dict[int, tuple[float, str]]:
    """Per context, plain decoding's step: the fastest of ``path``'s own one-row step and the other decode kernels
    measured here (FlashMLA's), with the one it came from; turning speculation off means decoding on the best."""
    out = {}
    for ctx, ms in own.items():
        best = min([(ms, path)] + [(d[ctx], k) for k, d in others.items() if ctx in d])
        out[ctx] = best
    return out


def chain_path_here(o: MeasureOptions) -> tuple[str | None, str]:
    """(``CHAIN_PATH`` where it runs the measured model here, else None; why not, one line)."""
    from .. import verify_paths

    if not o.device.startswith("cuda"):
        return None, f"{CHAIN_PATH} runs on a GPU"
    import torch

    from ..engine import kernels
    from ..physics.presets import ModelConfig

    t = ModelConfig.from_name(o.preset, heads=o.heads).target
    why = verify_paths.why_not(verify_paths.get(CHAIN_PATH), torch.cuda.get_device_capability(), o.dtype,
                               (t.kv_lora_rank, t.qk_rope_head_dim))
    if why is None:
        try:
            kernels.get_path(CHAIN_PATH)
        except kernels.PathUnavailable as e:
            why = str(e)
    return (None, why) if why else (CHAIN_PATH, "")


def chain_kernel(chain_path: str, path: str) -> str:
    """What a chain's verify step ran on: FlashMLA (``chain_path`` is it), or ``path``'s kernel under the chain's
    causal mask (SGLang's: its extend kernel) where FlashMLA does not run."""
    if chain_path == CHAIN_PATH:
        return f"{CHAIN_PATH}: FlashMLA's dense decode kernel, causal over the chain's rows (production's)"
    what = "SGLang's extend kernel" if path == "sglang" else f"the {path} kernel"
    return f"{path}: {what} with the chain's causal mask (FlashMLA does not run here)"


def chain_step_times(opts: StepTimeOptions, ctxs: list[int], depths: list[int], on_row=None) -> list:
    """The engine's whole chain step (draft, chain build, verify of depth + 1 rows under the chain's causal mask,
    walk) per (depth, ctx) through ``opts.attn``: ``step_times``' DDTree cell with the engine's shape set to chain."""
    from .backends.engine import EngineBackend
    from .bench import step_times as st

    cap = st.check(opts, list(ctxs), list(depths))
    be = EngineBackend(opts.preset, opts.attn, budget=max(depths), device=opts.device, dtype=opts.dtype,
                       seed=opts.seed, heads=opts.heads, max_ctx=cap, weights="random",
                       graphs=opts.graphs if opts.device.startswith("cuda") else None, threads=opts.threads,
                       tree="chain")
    rows = []
    for d in depths:
        be.set_tree("chain", d)  # a new runner (with graphs, a new captured step) for this depth
        for ctx in ctxs:
            rows.append(st._ddtree_cell(be.engine, ctx, opts.steps, cap))
            if on_row is not None:
                on_row(rows[-1])
        be.engine.release()
    return rows


def _commit_lengths(o: MeasureOptions, configs: list[tuple[str, int]], say,
                    display) -> dict[tuple[str, str, int, int], float]:
    """The shipped tiny pair's commit length per (shape, text, ctx, budget), each cell heard by ``display``."""
    from ..results import Result, ResultWriter, RunMeta
    from .commit import run_commit_probe
    from .backends.engine import EngineBackend

    commit: dict[tuple[str, str, int, int], float] = {}
    top = max(b for _, b in configs)
    be = EngineBackend("tiny", "reference" if o.device == "cpu" else "split", budget=top, device=o.device,
                       dtype="fp32" if o.device == "cpu" else "bf16", weights="trained", threads=o.threads,
                       max_ctx=max(o.ctxs) + o.max_new_tokens + 4 * (top + 1) + 64)
    for shape, b in configs:
        say(f"commit length, {shape} at {'budget' if shape == 'ddtree' else 'depth'} {b}: the shipped tiny pair, "
            f"{', '.join(o.texts)} at {', '.join(fmt_tokens(c) for c in o.ctxs)}")
        be.set_tree(shape, b)
        writer = ResultWriter(Result(kind="commit", meta=RunMeta.collect(probe_gpu=False)), None)
        for r in run_commit_probe(be, list(o.ctxs), list(o.texts), o.max_new_tokens, writer, progress=display):
            commit[(shape, r["text"], int(r["ctx"]), b)] = float(r["commit_len"])
    be.engine.release()
    return commit


def floats(text: str, what: str) -> list[float]:
    """Comma-separated numbers (``--commit-len``, ``--budgets``); one line naming ``what`` for one that is not."""
    vals = []
    for part in text.split(","):
        try:
            vals.append(float(part))
        except ValueError:
            raise DDProbeError(f"bad {what} {part.strip()!r}: expected a number") from None
    return vals


def points_from_file(path, budget: int | None, decode: Callable[[list[int]], list[float]], label: str,
                     say: Callable[[str], None] = lambda _m: None, spec=None) -> list[Point]:
    """The points of a commit results file (``points_from_commit``): its own budget, else ``budget`` (typed; None:
    refused); ``decode(ctxs)``: the plain decode step per context (``spec``'s, the model served: a file whose steps
    cannot be that model's is said, ``floor.not_the_model``); cells without a commit length or a step time left
    out, and ``say`` told how many; ``label``: the path when the file names none."""
    from ..results import Result
    from .floor import not_the_model

    r = Result.load(path)
    if r.kind != "commit":
        raise DDProbeError(f"{path}: a {r.kind!r} results file; --from takes a commit file")
    why = not_the_model(r.config, spec) if spec is not None else ""
    if isinstance(r.config.get("budget"), int):
        if not 1 <= r.config["budget"] <= MAX_BUDGET:
            raise DDProbeError(f"{path}: config.budget is {r.config['budget']}: not a tree budget (1..{MAX_BUDGET})")
        if budget is not None and budget != r.config["budget"]:  # the file's steps ran at its own budget
            raise DDProbeError(f"--budget {budget}: {path} was measured at tree budget {r.config['budget']} "
                               "(config.budget): drop --budget")
        budget = r.config["budget"]
    elif budget is None:
        raise DDProbeError(f"{path} does not say its tree budget (config.budget): give --budget")
    cells = r.records  # typed commit rows, checked on load
    short = too_short(cells, budget)
    if short:  # their commit lengths are capped by their length, not measured: no verdict may rest on them
        x, b = short
        raise DDProbeError(f"{path}: its cells decoded {x.max_new_tokens} tokens, too few for a commit length at budget "
                           f"{b} (one verify step needs {one_step_tokens(b)} with the prefill's token): measure it "
                           "again with more --max-new-tokens")
    if why:  # said once the file is known to be usable
        say(f"warning: {path}'s steps cannot be {spec.name}'s ({why}): they are compared with {spec.name}'s plain "
            "decoding, two different models")
    ctxs = sorted({x.ctx for x in cells if x.commit_len and x.decode_ms_per_step})
    left = sum(1 for x in cells if not (x.commit_len and x.decode_ms_per_step))
    if left:
        say(f"note: {left} of {len(cells)} cells have no commit length or step time: left out")
    if any(x.tree is None for x in cells):
        shape_why = "a file from before shapes" if r.config.get("backend", "engine") == "engine" else \
            f"the {r.config.get('backend')} server decides its own shape"
        say(f"note: {path} says no draft shape ({shape_why}): its cells are treated as ddtree")
    pts = points_from_commit(r.rows, {**r.config, "budget": budget}, dict(zip(ctxs, decode(ctxs))),
                             str(r.config.get("attn") or r.config.get("backend") or label), str(path))
    for p in pts:
        p.same_model = not why
    return pts


# said in every winning sentence whose decode step is the model's floor: beating plain decoding at its best holds
MODELLED = " (against plain decoding at its floor, the fastest it can be: this holds for any real plain step)"


def floor_points(points: list[Point], step_model) -> list[Point]:
    """The same commit lengths with both sides at their floors (path ``FLOOR_PATH``), one per text, context and
    budget: the verify step's floor against the plain one-row step's floor (like with like: physics against physics;
    the measured points stay beside them)."""
    pts = [Point(FLOOR_PATH, p.text, p.ctx, p.budget, p.commit_len, step_model.cost(p.ctx, p.budget + 1).floor_ms,
                 step_model.cost(p.ctx, 1).floor_ms, "step model: verify and plain decode at their floors",
                 tree=p.tree)
           for p in {(q.tree, q.text, q.ctx, q.budget): q for q in points}.values()]  # a tree and a chain apart
    return pts


def check_physics(points: list[Point], step_model) -> None:
    """A measured point faster than physics allows is a bug, refused in one line: a plain decode step below the
    one-row step's floor, or a verify step below it (R rows read at least what one row reads: its weights, its
    KV), i.e. tokens a second above what the weights' bytes permit."""
    for p in points:
        if p.path == FLOOR_PATH or not p.same_model:
            continue
        fl = step_model.cost(p.ctx, 1).floor_ms
        for what, ms in (("plain decode step", p.decode_ms), (f"{p.budget + 1}-row verify step", p.verify_ms)):
            if ms < fl * (1 - 1e-6):
                raise DDProbeError(f"a bug, not printed: the {what} at {fmt_tokens(p.ctx)} through {p.path} measured "
                                   f"{ms:.4g} ms, below the one-row step's floor {fl:.4g} ms ({1e3 / ms:.4g} tok/s "
                                   f"against the {1e3 / fl:.4g} the weights' bytes permit); check the GPU preset "
                                   "and the timer")


def advise_result(points: list[Point], config: dict, meta=None, *, step_model=None, decode_source: str | None = None,
                  at_floor: bool = True, say_modelled: bool = True):
    """The advise pipeline of `advise` and `diagnose`: the verdicts over ``points`` and the advise Result (rows: the
    points, summary: ``summary``). With ``step_model`` and ``at_floor``: the points at the verify floor beside them
    (``floor_points``). ``decode_source`` None: the points' plain decode steps are ``step_model``'s one-row floor
    (``MODEL_DECODE``), which also extends a crossover below the smallest context, and with ``say_modelled`` every
    sentence says so (diagnose's report says it once). ``meta`` None: collected here (the GPU probed when the points
    were measured here). Returns (Result, the points with the floor's, verdicts)."""
    from ..results import Result, RunMeta

    if step_model is not None:
        check_physics(points, step_model)
    pts = points + (floor_points(points, step_model) if step_model is not None and at_floor else [])
    decode_at = (lambda c: step_model.cost(max(1, c), 1).floor_ms) if decode_source is None else None
    verdicts = advise(pts, decode_at, plain_measured=decode_source is not None)
    if decode_source is None and say_modelled:
        for v in verdicts:
            if v.pays_everywhere and v.path != FLOOR_PATH:
                v.sentence += MODELLED
    result = Result(kind="advise", meta=meta or RunMeta.collect(probe_gpu="measured" in config), config=config,
                    rows=[p.to_dict() for p in pts], summary=summary(verdicts, decode_source or MODEL_DECODE, pts))
    return result, pts, verdicts


def measure_here(ctx: str | None, paths: str | None, budgets: str, preset: str | None, device: str,
                 heads: int | None, texts: str, steps: int, gpu_name: str | None, max_new_tokens: int,
                 say: Callable[[str], None] = lambda _m: None, note: Callable[[str], None] = lambda _m: None,
                 progress=None, trees: str = "ddtree,chain", chain_depths: str | None = None,
                 rates: dict | None = None):
    """`advise` with no numbers given: the engine measured on this device (``measure``), with the defaults for it
    (``ctx``, ``paths``, ``preset``, ``heads`` None: this device's); the step model of the timed preset on this GPU
    (None without a GPU preset or a ``bw_Bps`` to take bandwidth from) and the config to record. ``rates``: the floor
    options that shape the engine's own floor (bw_Bps, flops_per_s, launch, launch_any_gpu). Returns (points,
    model, config)."""
    import dataclasses

    import torch

    from .. import verify_paths
    from ..physics.gpus import get_gpu, gpu_spec_for
    from ..units import parse_context_list

    from .commit import int_list, tree_shapes

    if device not in ("auto", "cpu", "cuda"):
        raise DDProbeError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise DDProbeError("--device cuda: no CUDA GPU is visible to torch (a CPU build of torch, or no GPU): use "
                           "--device cpu")
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    gpu = dev.startswith("cuda")
    preset = preset or ("k2" if gpu else "tiny")
    chosen = [p.strip() for p in paths.split(",")] if paths else _default_paths(preset, note) if gpu else ["reference"]
    for p in chosen:
        try:
            verify_paths.get(p)
        except ValueError as e:  # an unknown path: one line
            raise DDProbeError(f"--paths: {e}") from None
    o = MeasureOptions(paths=tuple(dict.fromkeys(chosen)),
                       ctxs=tuple(parse_context_list(ctx or ("8k,32k,128k" if gpu else "1k,4k"))),
                       budgets=tuple(int(b) for b in floats(budgets, "budget")), texts=tuple(texts.split(",")),
                       preset=preset, device=dev, dtype="bf16" if gpu else "fp32",
                       heads=heads if heads is not None else (8 if preset == "k2" else None), steps=steps,
                       max_new_tokens=max_new_tokens, trees=tuple(tree_shapes(trees)),
                       chain_depths=tuple(int_list(chain_depths, "--chain-depths")) if chain_depths else None)
    o.configs(TINY_DEPTH)  # a chain deeper than the drafter's block: one line before anything runs
    points = measure(o, say=say, progress=progress)
    spec = get_gpu(gpu_name) if gpu_name else (gpu_spec_for(torch.cuda.get_device_name()) if gpu else None)
    return points, engine_floor_model(o, spec, rates or {}), {"measured": dataclasses.asdict(o),
                                                             "gpu": spec.name if spec else None}


def engine_floor_model(o, spec, rates: dict):
    """The timed preset's step model on GPU ``spec`` (``rates``: --bw, --tflops, --launch-from in place of its
    datasheet and shipped launch times); None without a bandwidth. Its launches: the structural least count."""
    from ..physics.plan import launch_for
    from ..physics.step_model import with_launches
    from .backends.engine import preset_step_model

    bw = rates.get("bw_Bps") or (spec.bw_Bps if spec else None)
    if not bw:
        return None
    name = spec.name if spec else None
    model = preset_step_model(o.preset, o.heads, o.dtype, bw, rates.get("flops_per_s") or
                              (spec.bf16_flops if spec else None))
    return with_launches(model, name, None, launch=launch_for(rates.get("launch"), name,
                                                                rates.get("launch_any_gpu", False)))


def _default_paths(preset: str, note: Callable[[str], None]) -> list[str]:
    """On a GPU: the baseline (SGLang's own kernels where sglang is installed, else `paged`, ddprobe's faithful
    rendering of them) and auto's path for this preset's MLA rows in bf16 (the tiny model: never split_ws)."""
    import torch

    from .. import verify_paths
    from ..physics.presets import ModelConfig
    from ..engine.kernels.plan import PathUnavailable
    from ..engine.kernels.sglang import check_available

    try:
        t = ModelConfig.from_name(preset).target
    except ValueError as e:  # an unknown preset: one line
        raise DDProbeError(str(e)) from None
    try:
        check_available()
        baseline = "sglang"
    except PathUnavailable as e:
        note(f"note: {e}; the baseline is `paged`, ddprobe's rendering of SGLang's kernels")
        baseline = "paged"
    sm = torch.cuda.get_device_capability()
    return [baseline, verify_paths.auto_path(sm, "bf16", (t.kv_lora_rank, t.qk_rope_head_dim))]
