"""Many GPUs on many nodes: whether the GPUs agree per phase, and one line per node.

Reads ``gpu_verdict.analyze``'s per-phase records (gpu, name, node, phase, verdict, signals). Plain Python.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from .signals import LABELS

NODE_SIGNALS = ["tensor_active_pct", "dram_active_pct", "sm_active_pct", "power_pct"]
SHOW_NAMES = 4  # GPUs named per verdict in a disagreement line


def _names(ds: list[dict[str, Any]]) -> str:
    names = [str(d.get("name", d.get("gpu"))) for d in ds]
    return ", ".join(names[:SHOW_NAMES]) + (f" and {len(names) - SHOW_NAMES} more" if len(names) > SHOW_NAMES
                                            else "")


def agreement(per_phase: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase with more than one GPU: {"phase", "gpus", "agree", "verdict" (when they agree), "majority"
    (the commonest verdict), "line"},
    e.g. "all 8 GPUs agree: latency-bound" or "GPUs disagree: 6 latency-bound, 2 idle (node-1/3, node-1/4)"."""
    phases: dict[str, list[dict]] = defaultdict(list)
    for d in per_phase:
        phases[str(d.get("phase"))].append(d)
    out = []
    for phase, ds in phases.items():
        if len(ds) < 2:
            continue
        counts = Counter(str(d.get("verdict")) for d in ds)
        nodes = {d.get("node") for d in ds if d.get("node")}
        where = f" on {len(nodes)} nodes" if len(nodes) > 1 else ""
        if len(counts) == 1:
            v = next(iter(counts))
            out.append({"phase": phase, "gpus": len(ds), "agree": True, "verdict": v, "majority": v,
                        "line": f"all {len(ds)} GPUs agree: {v}" + (f" ({len(nodes)} nodes)" if where else "")})
            continue
        (top, n_top), *rest = counts.most_common()
        odd = [d for d in ds if str(d.get("verdict")) != top]
        parts = ", ".join(f"{n} {v}" for v, n in rest)
        out.append({"phase": phase, "gpus": len(ds), "agree": False, "verdict": None, "majority": top,
                    "counts": dict(counts),
                    "line": f"GPUs{where} disagree: {n_top} {top}, {parts} ({_names(odd)})"})
    return out


def per_node(per_phase: list[dict[str, Any]], phase: str = "decode") -> list[dict[str, Any]]:
    """One record per node for ``phase`` (else the request phase): node, GPU count, verdict counts and the
    median over its GPUs of each GPU's median tensor, DRAM, SM and power share."""
    ds = [d for d in per_phase if d.get("phase") == phase] or [d for d in per_phase if d.get("phase") == "request"]
    nodes: dict[str, list[dict]] = defaultdict(list)
    for d in ds:
        nodes[str(d.get("node") or "this node")].append(d)
    out = []
    for node, group in nodes.items():
        rec: dict[str, Any] = {"node": node, "phase": group[0].get("phase"), "gpus": len(group),
                               "verdicts": dict(Counter(str(d.get("verdict")) for d in group))}
        for key in NODE_SIGNALS:
            xs = sorted(v for v in ((d.get("signals") or {}).get(key, {}).get("median") for d in group)
                        if isinstance(v, (int, float)))
            rec[key] = xs[len(xs) // 2] if xs else None
        out.append(rec)
    return out


def node_line(rec: dict[str, Any]) -> str:
    """"node-0: 8 GPUs, 8 latency-bound; tensor 3.0%, DRAM 1.0%, SM n/a, power / limit 20%"."""
    verdicts = ", ".join(f"{n} {v}" for v, n in sorted(rec["verdicts"].items(), key=lambda kv: -kv[1]))
    vals = ", ".join(f"{LABELS[k]} " + ("n/a" if rec.get(k) is None else f"{rec[k]:.1f}%") for k in NODE_SIGNALS)
    return f"{rec['node']}: {rec['gpus']} GPU{'s' if rec['gpus'] != 1 else ''}, {verdicts}; {vals}"
