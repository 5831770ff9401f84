"""The CI regression gate: compare two benchmark results entry by entry.

Entries match on (kind, path, context, heads, GPU). An entry regresses when its effective
bandwidth (its speed, from time where no bandwidth is recorded) drops by more than
``max_drop``, when it failed in the current run, or when it falls under an absolute floor
(``min_bw_Bps``, ``min_fraction_of_floor``). A baseline entry absent from the current run
fails the gate too. Entries only in the current run are shown as new and pass. The peers' entries (FlashMLA,
FlashInfer, Flex, SDPA: any path that is none of ddprobe's verify paths, ``verify_paths.PATHS``) are recorded
beside the paths for reference: shown with their change (status "ref"), never gated, missing or failed alike.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .. import verify_paths
from ..results import Result
from ..units import RANGES, DDProbeError, fmt_bandwidth, fmt_time, fmt_tokens
from . import bench
from .load import from_data, load_one, looks_like_results

COLUMNS = ["status", "path", "heads", "ctx", "GPU", "baseline", "current", "time", "baseline bw", "current bw",
           "bw", "of floor", "why"]


@dataclass
class GateRow:
    key: tuple
    base: bench.Entry | None
    cur: bench.Entry | None
    drop: float | None = None  # fraction of speed lost vs the baseline (negative: faster)
    status: str = "ok"  # ok, new, ref (a peer's entry: not gated), REGRESSED, MISSING, FAILED, BELOW, REFUSED
    why: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return _label(self.key)

    def fail(self, status: str, why: str) -> None:
        self.status = status if self.status in ("ok", "new") else self.status
        self.why.append(why)


def is_peer(path: str) -> bool:
    """A peer's entry: no verify path of ddprobe's table, or one that runs another project's kernels (``theirs``:
    SGLang's own); a variant ``split_ws[tail=0]`` counts as its path."""
    p = verify_paths.BY_NAME.get(path.split("[", 1)[0])
    return p is None or p.theirs


@dataclass
class GateOutcome:
    rows: list[GateRow]
    max_drop: float
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateRow]:
        return [r for r in self.rows if r.status not in ("ok", "new", "ref")]

    @property
    def gated(self) -> list[GateRow]:
        return [r for r in self.rows if r.status != "ref"]

    @property
    def passed(self) -> bool:
        return not self.failures


def _label(key: tuple) -> str:
    kind, path, ctx, heads, gpu = key
    return f"{'step ' if kind == 'step' else ''}{path} heads={heads} ctx={fmt_tokens(ctx)} on {gpu}"


def _by_key(entries: list[bench.Entry], name: str) -> dict[tuple, bench.Entry]:
    """Entries by key; two rows with one key in one file is an error (one would hide the other)."""
    out: dict[tuple, bench.Entry] = {}
    for e in entries:
        if e.key in out:
            raise DDProbeError(f"{name} results have two rows for {_label(e.key)}; the gate needs one per entry")
        out[e.key] = e
    return out


def _believable(entries: list[bench.Entry], name: str) -> None:
    """Every number of a benchmark file checked as a typed one: a time (a layer's ``us``, a step's ``step_ms``) from
    1 us to 1 h, a kernel floor above 0 and at most 1 h, a bandwidth from 1 MB/s to 1 PB/s, a head count of at least
    1; a DDProbeError naming the entry, the field and the range otherwise (a 1e-9 us baseline would pass any current
    run, a 1e9 us floor any --min-fraction-of-floor)."""
    lo_s, hi_s, said = RANGES["step time"]
    lo_b, hi_b, said_b = RANGES["bandwidth"]
    for e in entries:
        field_ = "step_ms" if e.kind == "step" else "us"
        if e.time_us is not None and not lo_s * 1e6 <= e.time_us <= hi_s * 1e6:
            shown = f"{e.time_us / 1e3:g} ms" if e.kind == "step" else f"{e.time_us:g} us"
            raise DDProbeError(f"{name} results: {_label(e.key)}: {field_!r} is {shown}, not a measured time "
                               f"(must be between {said})")
        if e.GBps is not None and not lo_b <= e.GBps * 1e9 <= hi_b:
            raise DDProbeError(f"{name} results: {_label(e.key)}: 'GBps' is {e.GBps:g} GB/s (must be between "
                               f"{said_b})")
        if e.floor_us is not None and not 0 < e.floor_us <= hi_s * 1e6:  # a bound, may be under 1 us, never 0
            raise DDProbeError(f"{name} results: {_label(e.key)}: 'floor_us' is {e.floor_us:g} us (a kernel floor is "
                               "above 0 and at most 1 h)")
        if e.heads is not None and e.heads < 1:
            raise DDProbeError(f"{name} results: {_label(e.key)}: 'heads' is {e.heads} (must be a whole number >= 1)")


def paths_option(text: str | None) -> list[str] | None:
    """``--paths`` as names: None (all) when not given; an empty or blank value is refused (it would gate
    everything, unlike what it says)."""
    if text is None:
        return None
    names = [p.strip() for p in text.split(",")]
    if not any(names):
        raise DDProbeError(f"--paths {text!r}: no path names; give some, e.g. split,paged (or leave --paths out to "
                           "gate every path)")
    if not all(names):  # as --ctx refuses 1k,,2k: a typo, not a choice
        raise DDProbeError(f"--paths {text!r}: an empty name between commas; give names like split,paged")
    return names


def _drop(base: bench.Entry, cur: bench.Entry) -> float:
    if base.GBps and cur.GBps:
        return 1.0 - cur.GBps / base.GBps
    return 1.0 - base.time_us / cur.time_us


def compare(current: Result, baseline: Result, max_drop: float = 0.10, min_bw_Bps: float | None = None,
            min_fraction_of_floor: float | None = None, paths: list[str] | None = None,
            ctxs: list[int] | None = None, heads: list[int] | None = None) -> GateOutcome:
    for r, name in ((current, "current"), (baseline, "baseline")):
        if r.kind not in bench.BENCH_KINDS:
            raise DDProbeError(f"{name} results are of kind {r.kind!r}; the gate compares benchmark results "
                               f"({', '.join(bench.BENCH_KINDS)})")

    def keep(e: bench.Entry) -> bool:
        return (not paths or e.path in paths) and (not ctxs or e.ctx in ctxs) and (not heads or e.heads in heads)

    base = _by_key([e for e in bench.entries(baseline) if keep(e)], "baseline")
    cur = _by_key([e for e in bench.entries(current) if keep(e)], "current")
    _believable(list(base.values()), "baseline")
    _believable(list(cur.values()), "current")
    if not base:
        raise DDProbeError("the baseline has no benchmark entries" + (" matching --paths/--ctx/--heads"
                                                                        if paths or ctxs or heads else ""))
    if all(is_peer(k[1]) for k in base):  # nothing of ddprobe's to guard: passing would say nothing
        raise DDProbeError("the baseline has only peers' entries" + (" matching --paths/--ctx/--heads" if paths or ctxs
                           or heads else "") + " (recorded for reference, never gated): nothing to gate")
    rows = []
    for key in sorted(set(base) | set(cur), key=lambda k: (k[0], k[1], k[3] or 0, k[2], k[4])):
        b, c = base.get(key), cur.get(key)
        row = GateRow(key, b, c, status="ok" if b else "new")
        if b is not None and not b.time_us:  # nothing to compare with: never "within 10%"
            row.fail("REFUSED", f"the baseline entry has no time ({b.error or 'none recorded'}): nothing to compare "
                                "with; refresh the baseline, or leave the entry out with --paths/--ctx/--heads")
        elif b is not None and b.ok is False:  # a wrong kernel's time is no standard to hold a run to
            row.fail("REFUSED", "the baseline entry failed its output check against the reference: not a baseline; "
                                "refresh it, or leave the entry out with --paths/--ctx/--heads")
        if c is None:
            row.fail("MISSING", "baseline entry missing in the current run")
        elif not c.time_us:
            row.fail("FAILED", f"failed in the current run: {c.error}")
        elif c.ok is False:
            rel = f" (rel_err {c.rel_err:.1e})" if c.rel_err is not None else ""
            row.fail("FAILED", f"output check against the reference failed in the current run{rel}")
        elif b is not None and b.time_us:
            row.drop = _drop(b, c)
            if row.drop > max_drop:
                row.fail("REGRESSED", f"{row.drop:.1%} less throughput than the baseline (time "
                                      f"{c.time_us / b.time_us - 1:+.1%}; limit {max_drop:.0%})")
        if c is not None and c.time_us:
            if min_bw_Bps and c.GBps is not None and c.GBps * 1e9 < min_bw_Bps:
                row.fail("BELOW", f"{fmt_bandwidth(c.GBps * 1e9)} under --min-bw {fmt_bandwidth(min_bw_Bps)}")
            f = c.fraction_of_floor
            if min_fraction_of_floor and f is not None and f < min_fraction_of_floor:
                row.fail("BELOW", f"{f:.2f} of the floor under --min-fraction-of-floor {min_fraction_of_floor:g}")
        if is_peer(key[1]):  # recorded for reference: its change and what went wrong shown, never a failure
            row.status = "ref"
        rows.append(row)
    out = GateOutcome(rows, max_drop)
    gb, gc = bench.gpu_name(baseline), bench.gpu_name(current)
    if gb != gc and all(r.status == "MISSING" or r.status == "new" for r in out.gated):
        out.notes.append(f"no entries match: the baseline ran on {gb or 'no GPU'}, the current run on "
                         f"{gc or 'no GPU'}")
    return out


def baseline_for(current: Result, folder: Path) -> Path:
    """The baseline in ``folder`` (its ``*.json`` benchmark results, one per card and kind) of the current run's kind
    whose GPU is the current run's (the GPU name in each file's meta); a one-line DDProbeError naming the GPUs the
    folder has for that kind when none is, and naming the files when two are (which one gates is not guessed). A file
    there that is not JSON, or a results file that breaks its schema, is refused naming it, never passed over."""
    from ..jsonfile import read_json

    cards: dict[str, list[Path]] = {}
    for f in sorted(folder.glob("*.json")):
        try:
            data = read_json(f, "baseline file")
        except DDProbeError as e:  # damaged (truncated, not JSON): it may be the baseline this run needs
            raise DDProbeError(f"{folder} holds a file that cannot be read: {e}") from None
        if not looks_like_results(data):
            continue  # JSON that is no ddprobe results file (notes, say): not a baseline
        r = from_data(data, str(f))  # a results file that breaks its schema is refused, naming the field
        if r.kind in bench.BENCH_KINDS and r.kind == current.kind and bench.gpu_name(r):
            cards.setdefault(bench.gpu_name(r), []).append(f)
    gpu = bench.gpu_name(current)
    if gpu not in cards:
        have = ", ".join(f"{g} ({', '.join(p.name for p in ps)})" for g, ps in cards.items()) or "none"
        raise DDProbeError(f"no {current.kind} baseline in {folder} ran on {gpu or 'no GPU'} (the current run's GPU); "
                          f"it has: {have}")
    if len(cards[gpu]) > 1:
        raise DDProbeError(f"{folder} holds {len(cards[gpu])} {current.kind} baselines for {gpu}: "
                           f"{', '.join(p.name for p in cards[gpu])}; keep one per card there, or give the file "
                           "with --baseline")
    return cards[gpu][0]


def compare_files(current: str | Path, baseline: str | Path, **kw) -> GateOutcome:
    """Compare two files; ``baseline`` may be a folder of baselines, one per card: the one of the current run's
    GPU is used (``baseline_for``)."""
    cur = load_one(current)
    base = Path(baseline)
    return compare(cur, load_one(baseline_for(cur, base) if base.is_dir() else base), **kw)


def table_rows(outcome: GateOutcome) -> list[list[str]]:
    """Formatted cells per entry, in COLUMNS order, for the CLI's table."""
    def t(e):
        return fmt_time(e.time_us * 1e-6) if e and e.time_us else "-"

    def bw(e):
        return fmt_bandwidth(e.GBps * 1e9) if e and e.GBps else "-"

    def pct(a, b):
        return f"{b / a - 1:+.1%}" if a and b else "-"

    out = []
    for r in outcome.rows:
        kind, path, ctx, heads, gpu = r.key
        frac = r.cur.fraction_of_floor if r.cur else None
        out.append([r.status, ("step " if kind == "step" else "") + path, str(heads), fmt_tokens(ctx), str(gpu),
                    t(r.base), t(r.cur), pct(r.base and r.base.time_us, r.cur and r.cur.time_us),
                    bw(r.base), bw(r.cur), pct(r.base and r.base.GBps, r.cur and r.cur.GBps),
                    f"{frac:.2f}" if frac else "-", "; ".join(r.why)])
    return out


def _counts(rows: list[GateRow]) -> str:
    """"4 REGRESSED, 5 MISSING": the failures by status, in the order first seen."""
    return ", ".join(f"{v} {k}" for k, v in Counter(r.status for r in rows).items())


def summary_lines(outcome: GateOutcome) -> list[str]:
    """One line per failing entry, naming it, then the verdict."""
    lines = [f"{r.status}: {r.label}: {'; '.join(r.why)}" for r in outcome.failures] + outcome.notes
    n, bad, peers = len(outcome.gated), len(outcome.failures), len(outcome.rows) - len(outcome.gated)
    within = sum(1 for r in outcome.gated if r.status == "ok")  # compared with the baseline and within the limit
    fresh = sum(1 for r in outcome.gated if r.status == "new")  # not in the baseline: never compared
    new = f", {fresh} new (not compared)" if fresh else ""
    ref = f" ({peers} peer entr{'y' if peers == 1 else 'ies'} for reference, not gated)" if peers else ""
    lines.append(f"gate passed: {within} entr{'y' if within == 1 else 'ies'} within {outcome.max_drop:.0%}{new}{ref}"
                 if not bad else
                 f"gate FAILED: {bad} of {n} entr{'y' if n == 1 else 'ies'} ({_counts(outcome.failures)}){new}{ref}")
    return lines
