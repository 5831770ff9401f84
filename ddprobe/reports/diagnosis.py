"""The diagnosis in plain words: the first screen of ``ddprobe diagnose``'s report.

Four claims, each with its number or marked skipped with the reason: the drafter, the GPU during
decode, the floor, and what would help. Built from the results files of one diagnose run (commit,
gpu-util, floor, bench-verify) and its ``diagnose`` record of which steps ran.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import verify_paths
from ..results import Result
from ..schema import CommitRow, FloorRow, one_step_tokens, too_short
from ..physics.step_model import parts_bound
from ..units import fmt_bandwidth, fmt_bytes, fmt_ratio, fmt_time, fmt_tokens
from . import bench

FINE = 0.8  # commit length at a context at least this share of the shortest context's: still accepting
NOVEL_MAX = 2.5  # novel text above this commit length is not novel any more (the continuation loops)
TOPICS = ("drafter", "gpu", "floor", "help")


@dataclass
class Claim:
    topic: str
    title: str
    text: str
    status: str  # "ok", "skipped" or "failed"


def _by_kind(results: list[Result]) -> dict[str, Result]:
    return {r.kind: r for r in results}


def _step_reason(record: Result | None, step: str) -> tuple[str, str]:
    for row in (record.records if record else []):
        if row.step == step:
            return row.status, row.reason or ""
    return "skipped", "this step did not run"


def _series(rows: list[CommitRow], text: str) -> list[CommitRow]:
    """The tree's cells of one text, by context (a shape sweep's chain cells are the decision's, not the drafter
    claim's)."""
    return sorted((r for r in rows if r.text == text and r.commit_len is not None and r.tree in (None, "ddtree")),
                  key=lambda r: r.ctx)


def _list(rs: list[CommitRow]) -> str:
    return " / ".join(f"{r.commit_len:.2f}" for r in rs) + " at " + " / ".join(fmt_tokens(r.ctx) for r in rs)


def too_short_cells(rows: list[CommitRow], config_budget) -> str:
    """Why these cells cannot say how the drafter accepts ("" where they can): each decoded too few tokens for one
    whole verify step (``schema.too_short``)."""
    found = too_short(rows, config_budget)
    if not found:
        return ""
    r, b = found
    n = r.max_new_tokens
    return (f"Not measured: the commit cells decoded {n} tokens each, too few for a commit length (the first token is "
            f"the prefill's and a step commits up to {b + 1}, so at most {max(n - 1, 1)} here): give --max-new-tokens "
            f"{one_step_tokens(b)} or more.")


def drafter(commit: Result | None, record: Result | None) -> Claim:
    title = "Is the drafter broken at long context?"
    if commit is None:
        status, why = _step_reason(record, "commit")
        return Claim("drafter", title, f"Commit probe: {why}", status)
    block = commit.config.get("block_size")
    pred, novel = _series(commit.records, "predictable"), _series(commit.records, "novel")
    short = too_short_cells(pred + novel, commit.config.get("budget"))
    if short:
        return Claim("drafter", title, short, "skipped")
    parts = []
    if pred:
        first = pred[0].commit_len
        low = [r for r in pred if r.commit_len < FINE * first]
        of = f" of {block}" if block else ""
        if first < 1.5:
            parts.append(f"The drafter does not accept even at short context: commit length {_list(pred)} on "
                         f"predictable text (untrained drafter, or not matched to the target).")
        elif not low:
            parts.append(f"No: on predictable text the drafter accepts well at every context, commit length "
                         f"{_list(pred)}{of}.")
        else:
            parts.append(f"Yes, from {fmt_tokens(low[0].ctx)}: on predictable text commit length falls to "
                         f"{low[0].commit_len:.2f} (from {first:.2f} at {fmt_tokens(pred[0].ctx)}; "
                         f"all: {_list(pred)}).")
    if novel and max(r.commit_len for r in novel) <= NOVEL_MAX:
        parts.append(f"Novel text is simply unpredictable: commit length {_list(novel)}.")
    elif novel:
        parts.append(f"Novel text commits {_list(novel)}: the model's continuation repeats itself, so the drafter "
                     f"predicts it; this text does not measure unpredictable prose.")
    return Claim("drafter", title, " ".join(parts) or "No commit-length cells were measured.",
                 "ok" if parts else "failed")


def gpu(util: Result | None, record: Result | None) -> Claim:
    title = "Is the GPU busy during decode?"
    if util is None:
        status, why = _step_reason(record, "gpu-util")
        return Claim("gpu", title, f"Telemetry: {why}", status)
    per_phase = [p for p in (util.summary.get("per_phase") or []) if isinstance(p, dict)]
    decode = _decode_phases(util) or per_phase
    if not decode:
        return Claim("gpu", title, "No telemetry was recorded during decode.", "failed")
    lines = [f"GPU {p.get('name', p.get('gpu', '?'))}: {p.get('verdict', '?')}: {p.get('evidence', '')}".rstrip(": ")
             for p in decode]
    agree = util.summary.get("agree")
    if agree and len(lines) > 1:  # many GPUs: whether they agree, then the first GPU's evidence
        lines = [f"{agree[0].upper()}{agree[1:]}", lines[0]]
    return Claim("gpu", title, " ".join(s if s.endswith(".") else s + "." for s in lines), "ok")


def _step_row(floor: Result) -> FloorRow | None:
    meas = [r for r in floor.records if r.step_ms]
    return max(meas, key=lambda r: r.ctx) if meas else None


def floor_claim(floor: Result | None, record: Result | None) -> Claim:
    title = "How far from physics?"
    r = _step_row(floor) if floor else None
    if r is None:
        status, why = _step_reason(record, "floor")
        return Claim("floor", title, f"Floor: {why}", status)
    bw = floor.config.get("bw_Bps")
    if not r.floor_ms:  # a file of an older ddprobe: the attention's floor only
        return Claim("floor", title, f"At {fmt_tokens(r.ctx)} the measured step {fmt_time(r.step_ms / 1e3)} "
                     f"is {fmt_ratio(r.attn_gap)} the attention's floor {fmt_time(r.attn_floor_ms / 1e3)} "
                     "(attention gap; this older floor file has no whole-step floor).", "ok")
    comm = (f", {fmt_time(r.comm_ms / 1e3)} of {r.allreduces} all-reduces" if r.comm_ms else "")
    text = (f"At {fmt_tokens(r.ctx)} each verify step must read {fmt_bytes(r.kv_GB * 1e9)} of KV "
            f"({r.kv_B_per_token:,.0f} B per token) and {fmt_bytes(r.weights_GB * 1e9)} of weights; at "
            f"{fmt_bandwidth(bw)}{_bw_source(floor)} the floor of the whole step is {fmt_time(r.floor_ms / 1e3)} "
            f"({r.binds}-bound{comm}). The measured step takes {fmt_time(r.step_ms / 1e3)}: "
            f"{fmt_ratio(r.gap)} the floor; the attention alone would take {fmt_time(r.attn_floor_ms / 1e3)} "
            f"(attention gap {fmt_ratio(r.attn_gap)}, an effective KV bandwidth of "
            f"{fmt_bandwidth(r.eff_bw_GBps * 1e9)}")
    if r.attn_gap_if_rows_reread:
        text += f"; still {fmt_ratio(r.attn_gap_if_rows_reread)} if every verify row re-read the cache"
    return Claim("floor", title, text + ")." + _launch_sentence(r, floor.config.get("launches")), "ok")


def _shape_sentence(advise: Result) -> list[str]:
    """Tree, chain or off per text and context (``summary.decisions``, where a chain was measured): each one's best
    tokens/s and the choice, batch 1."""
    ds = [d for d in (advise.summary.get("decisions") or []) if isinstance(d, dict) and d.get("chain_tok_s")]
    if not ds:
        return []
    tok = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    cells = [f"{d['text']} at {fmt_tokens(d['ctx'])}: {d['choice']} (ddtree@{d['ddtree_budget']} "
             f"{tok(d['ddtree_tok_s'])}, chain@{d['chain_depth']} {tok(d['chain_tok_s'])}, off "
             f"{tok(d['plain_tok_s'])} tok/s)" for d in ds]
    return [f"Tree, chain or off (batch 1): {'; '.join(cells)}."]


def _bw_source(floor: Result) -> str:
    """Where the floor's bandwidth came from when it is not a GPU's (the engine on a CPU: a measured copy)."""
    said = floor.config.get("bw_source")
    return " (this machine's memory bandwidth, measured by a copy: no GPU here)" if said else ""


def _launch_sentence(r: FloorRow, source: str | None) -> str:
    """The step's launch part against its bandwidth part (``step_model.gap_split``), or "" for an older file."""
    if r.latency_floor_ms is None or not r.kernels or not r.step_ms:
        return ""
    w = parts_bound(r.latency_floor_ms, r.bytes_floor_ms, r.compute_floor_ms, sync_ms=r.sync_ms or 0.0,
                    comm_ms=r.comm_ms or 0.0)
    syncs = f" + {r.syncs} host syncs" if r.syncs else ""
    return (f" The floor counts the launches: {r.kernels:,} kernels x {r.kernel_us:.3g} us{syncs} = "
            f"{fmt_time(r.latency_floor_ms / 1e3)}, {r.latency_floor_ms / r.step_ms:.0%} of the measured step, "
            f"against {fmt_time(w.ms / 1e3)} of {w.what} at {w.rate} ({w.ms / r.step_ms:.0%}): the step is "
            f"{w.bound}" + (f" ({source})." if source else "."))


def _decode_phases(util: Result | None) -> list[dict]:
    per_phase = [p for p in ((util.summary.get("per_phase") if util else None) or []) if isinstance(p, dict)]
    return [p for p in per_phase if p.get("phase") == "decode"]


def help_claim(commit: Result | None, floor: Result | None, verify: Result | None, record: Result | None,
               util: Result | None = None, advise: Result | None = None) -> Claim:
    title = "What would help?"
    parts = []
    said = [v["sentence"] for v in ((advise.summary.get("verdicts") or []) if advise else [])
            if isinstance(v, dict) and v.get("sentence")]
    if said:
        src = str(advise.summary.get("decode_source") or "")
        plain = "measured plain decoding" if src.startswith("measured") else "plain decoding at its floor"
        parts.append(f"Speculation on or off (against {plain}): " + "; ".join(said) + ".")
        parts += _shape_sentence(advise)
    novel = _series(commit.records, "novel") if commit else []
    r = _step_row(floor) if floor else None
    if r is not None and r.kernels and r.latency_floor_ms and r.step_ms and \
            parts_bound(r.latency_floor_ms, r.bytes_floor_ms, r.compute_floor_ms, sync_ms=r.sync_ms or 0.0,
                    comm_ms=r.comm_ms or 0.0).bound == "launch-bound":
        parts.append(_launch_help(r, novel[-1].commit_len if novel else None))
    if r is not None and (r.gap or r.attn_gap or 0) > 2:
        tok = f"{novel[-1].commit_len:.2f} tokens" if novel else "few tokens"
        far = (f"{fmt_ratio(r.gap)} above its floor" if r.gap else
               f"{fmt_ratio(r.attn_gap)} above the attention's floor")
        head = f"Throughput: batch more requests. A single request commits {tok} per step while the step runs {far}"
        verdicts = [str(p.get("verdict", "")) for p in _decode_phases(util)]
        if any(v.startswith(("latency", "idle", "host")) for v in verdicts):
            parts.append(f"{head}, and telemetry says the GPU is {verdicts[0]} during decode: it waits rather than "
                         f"moves bytes, so more requests can share each step at little extra time.")
        elif verdicts:
            parts.append(f"{head}; telemetry says the GPU is {verdicts[0]} during decode, so batching pays only "
                         f"until that unit saturates.")
        else:
            parts.append(f"{head}; more requests would share each step's reads and launches (no telemetry here "
                         f"to say what the step waits on).")
    es = [e for e in bench.entries(verify) if e.time_us] if verify else []
    paths = {(e.path, e.ctx): e for e in es}
    fast = verify_paths.fast_names()
    ctxs = sorted({c for p, c in paths if p in fast and ("paged", c) in paths})
    if ctxs:
        c = ctxs[-1]
        name = min((n for n in fast if (n, c) in paths), key=lambda n: paths[(n, c)].time_us)
        p, s = paths[("paged", c)], paths[(name, c)]
        parts.append(f"Latency of one request: a better verify kernel. The {name} path is measured "
                     f"{fmt_ratio(p.time_us / s.time_us)} faster than the page_size=1 (paged) path at {fmt_tokens(c)} "
                     f"({fmt_time(p.time_us * 1e-6)} -> {fmt_time(s.time_us * 1e-6)} per layer, "
                     f"{fmt_bandwidth(s.GBps * 1e9)} against {fmt_bandwidth(p.GBps * 1e9)}).")
    else:
        status, why = _step_reason(record, "verify")
        parts.append(f"Latency of one request: a better verify kernel (split-K over the prefix plus a masked tree "
                     f"pass); its measured gain was {status}: {why}")
    return Claim("help", title, " ".join(parts), "ok" if ctxs or r is not None or said else "skipped")


def _launch_help(r: FloorRow, commit_len: float | None) -> str:
    """What would help a launch-bound step, with its numbers."""
    per = r.kernel_us or 0.0
    tok = f"{commit_len:.2f}" if commit_len else "its"
    w = parts_bound(r.latency_floor_ms, r.bytes_floor_ms, r.compute_floor_ms, sync_ms=r.sync_ms or 0.0,
                    comm_ms=r.comm_ms or 0.0)
    return (f"The step is launch-bound: {r.kernels:,} kernels at least {per:.3g} us each are "
            f"{fmt_time(r.latency_floor_ms / 1e3)} of its {fmt_time(r.step_ms / 1e3)}, while its "
            f"{w.what} need {fmt_time(w.ms / 1e3)}. What helps: fewer kernels "
            f"per step (fusing: every kernel cut saves at least {per:.3g} us a step; half the kernels, "
            f"{fmt_time(r.latency_floor_ms / 2e3)} off the floor); CUDA graphs (the engine replays one already: an "
            f"eager step pays the host's launch rate per kernel instead); batching (B requests share each step's "
            f"launches, so B x {tok} tokens commit per step at nearly the same step time).")


def diagnose(results: list[Result]) -> list[Claim]:
    """The four claims from one diagnose run's results (any of them may be missing)."""
    k = _by_kind(results)
    record = k.get("diagnose")
    return [drafter(k.get("commit"), record), gpu(k.get("gpu-util"), record), floor_claim(k.get("floor"), record),
            help_claim(k.get("commit"), k.get("floor"), k.get("bench-verify"), record, k.get("gpu-util"),
                       k.get("advise"))]
