"""`--source`: the telemetry options of `gpu-util` and `diagnose`, defined once; open the source before
anything else starts, and print what it found.

NVML (the default) needs a GPU on this machine; ``prometheus`` and ``dcgm-exporter`` need none here: they
are checked by asking them (one line and exit 1 when they do not answer), so a run never builds a model
only to find its telemetry unreachable.
"""
from __future__ import annotations

import functools
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from ..units import DDProbeError
from .options import err, out


SourceOpt = Annotated[str, typer.Option("--source", help="Telemetry: nvml (this machine's GPUs), prometheus "
                                                       "(every GPU's DCGM series over the request's window, "
                                                       "--prom-url) or dcgm-exporter (scrape --exporter-url "
                                                       "each period).")]
PromUrlOpt = Annotated[Optional[str], typer.Option("--prom-url", help="Prometheus base URL, e.g. "
                                                                      "http://prometheus:9090.")]
MatchOpt = Annotated[Optional[str], typer.Option("--match", help="Label matchers for the DCGM series, e.g. "
                                                                 "'Hostname=~\"node-[0-3]\"'.")]
ExporterUrlOpt = Annotated[Optional[str], typer.Option("--exporter-url", help="dcgm-exporter URL(s), comma-"
                                                                              "separated (port 9400).")]
SOURCE_PARAMS = ("source", "prom_url", "match", "exporter_url")  # the parameter names of the four options


def check_source(source: str, prom_url: str | None, match: str | None, exporter_url: str | None) -> None:
    """One line when --source is unknown or a URL option goes with another source."""
    from ..probes.telemetry.sources import SOURCES

    if source not in SOURCES:
        raise DDProbeError(f"--source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source != "prometheus" and (prom_url or match):
        raise DDProbeError("--prom-url and --match go with --source prometheus")
    if source != "dcgm-exporter" and exporter_url:
        raise DDProbeError("--exporter-url goes with --source dcgm-exporter")
    from ..probes.telemetry.sources import check_url

    if prom_url:
        check_url(prom_url, "Prometheus")
    for u in (exporter_url or "").split(","):
        if u.strip():
            check_url(u.strip(), "dcgm-exporter")


def open_source(source: str, prom_url: str | None, match: str | None, exporter_url: str | None,
                period_s: float) -> dict[str, Any]:
    """{"reader_factory": ..., "window": ...} for ``run_gpu_util``, after one check of the source."""
    check_source(source, prom_url, match, exporter_url)
    if source == "nvml":
        from ..probes.telemetry.nvml import NvmlReader, NvmlUnavailable, require_nvml

        try:
            names = require_nvml()  # before any model is built: one line and exit 1 without a GPU
        except NvmlUnavailable as e:  # and what works without one
            raise DDProbeError(f"{e}; without a GPU here: --replay FILE re-analyses a saved run, --source "
                               "prometheus|dcgm-exporter reads a fleet's GPUs") from None
        err.print(f"sampling {len(names)} GPU(s) every {period_s * 1e3:.0f} ms: {', '.join(sorted(set(names)))}")
        return {"reader_factory": NvmlReader, "window": None}
    if source == "prometheus":
        from ..probes.telemetry.prometheus import PromWindow

        if not prom_url:
            raise DDProbeError("--source prometheus needs --prom-url http://host:9090")
        window = PromWindow(prom_url, match)
        version = window.check()
        err.print(f"Prometheus {version} at {prom_url}: the GPUs' DCGM series are read over the request's "
                  f"window after it ends" + (f" (matching {match})" if match else ""), highlight=False)
        return {"reader_factory": None, "window": window}
    from ..probes.telemetry.dcgm_exporter import ExporterSource

    urls = [u.strip() for u in (exporter_url or "").split(",") if u.strip()]
    if not urls:
        raise DDProbeError("--source dcgm-exporter needs --exporter-url http://node:9400[,http://node2:9400...]")
    probe = ExporterSource(urls)
    try:
        gpus = probe.open()
    finally:
        probe.close()
    nodes = sorted({g["node"] for g in gpus})
    err.print(f"sampling {len(gpus)} GPU(s) on {len(nodes)} node(s) every {period_s * 1e3:.0f} ms through "
              f"dcgm-exporter: {', '.join(nodes)}", highlight=False)
    factory = functools.partial(ExporterSource, urls)
    factory.kind = ExporterSource.kind  # type: ignore[attr-defined]
    return {"reader_factory": factory, "window": None}


def evidence_lines(s: dict[str, Any]) -> list[str]:
    """The evidence per phase (idle left out). One GPU: its sentence. Many GPUs that agree: one line, the
    agreement and the sentence at the medians over them. Many that disagree: the disagreement, the
    majority's sentence at their medians, then one line per GPU that is not of the majority."""
    per_phase = [d for d in s.get("per_phase") or [] if isinstance(d, dict) and d.get("phase") != "idle"]
    agreement = {a.get("phase"): a for a in s.get("agreement") or [] if isinstance(a, dict)}
    lines = []
    for phase in dict.fromkeys(d["phase"] for d in per_phase):
        ds, a = [d for d in per_phase if d["phase"] == phase], agreement.get(phase)
        ev = f": {a['evidence']}" if a and a.get("evidence") else ""
        if a is not None and a.get("agree"):
            lines.append(f"{phase}: {a['line']}; at the GPUs' medians{ev}")
            continue
        if a is not None:
            top = a.get("majority")
            n_top = sum(d.get("verdict") == top for d in ds)
            lines.append(f"{phase}: {a['line']}")
            if ev:
                lines.append(f"{phase}, the {n_top} {top} GPUs at their medians{ev}")
            ds = [d for d in ds if d.get("verdict") != top]
        lines += [f"GPU {d.get('name', d['gpu'])} {phase}: {d['evidence']}" for d in ds]
    return lines


def print_fleet(s: dict[str, Any]) -> None:
    """One line per node, the engine's counters, the notes and a telemetry error."""
    if len(s.get("nodes") or []) > 1 or any(r.get("gpus", 0) > 1 for r in s.get("nodes") or []):
        from ..gpu_fleet import node_line

        for rec in s["nodes"]:
            out.print(node_line(rec), highlight=False, soft_wrap=True)
    eng = s.get("engine")
    if isinstance(eng, dict) and eng:
        if "error" in eng:
            out.print(f"engine counters: {eng['error']}", highlight=False, soft_wrap=True)
        else:
            vals = ", ".join(f"{k} {v:,.4g}" for k, v in eng.items() if isinstance(v, (int, float)))
            out.print(f"engine over the window: {vals}", highlight=False, soft_wrap=True)
    for note in s.get("notes") or []:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True, markup=True)
