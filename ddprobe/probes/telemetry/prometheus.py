"""Telemetry from Prometheus (``--source prometheus``): the DCGM fields of every GPU over the request's window.

After the request, ``PromWindow.fetch`` asks ``/api/v1/query_range`` for every DCGM metric ``signals`` knows
(optionally narrowed by ``--match``, e.g. ``Hostname=~"node-[0-3]"``) from the window's start to its end,
at a step equal to the scrape interval (from ``/api/v1/targets`` for the targets serving those series, else
the spacing of the series' own samples). Each GPU (node, index, MIG slice) is one row per step. ``engine``
reads the serving engine's spec-decode counters (vLLM, SGLang) over the same window. Every failure is one
line (``SourceUnavailable``), a malformed answer (a value that is no number, a series without its labels)
included; notes (coarse scrape interval, NaN or out-of-range samples, missing labels) are kept.
"""
from __future__ import annotations

import json
import math
import statistics
import urllib.parse
from typing import Any

from ... import signals
from .sources import KEEP_LABELS, SourceUnavailable, check_url, gpu_of, http_get, natural, power_limit, row_value
from .dcgm_exporter import gpu_entry

DCGM_DEFAULT_S = 30.0  # dcgm-exporter's default collection interval (-c 30000 ms)
MIN_SAMPLES = 10  # fewer samples per GPU over the request than this: warn
ENGINE_COUNTERS = ["vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total",
                   "vllm:spec_decode_num_draft_tokens_total", "vllm:generation_tokens_total"]
ENGINE_GAUGES = ["sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:gen_throughput",
                 "sglang:num_running_reqs", "vllm:num_requests_running"]


def selector(names: list[str], match: str | None) -> str:
    """``{__name__=~"A|B",<match>}``."""
    alt = "|".join(n.replace(".", "\\\\.") for n in names)
    return "{" + f'__name__=~"{alt}"' + (f",{match.strip().strip('{}')}" if match and match.strip() else "") + "}"


def _malformed_is_one_line(fn):
    """A method reading Prometheus's answers: what its shape breaks (a string where a number goes, a missing
    key) becomes one ``SourceUnavailable`` naming the URL, not a traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
            raise SourceUnavailable(f"Prometheus {self.url}: malformed answer ({type(e).__name__}: "
                                    f"{str(e)[:80]})") from None

    return wrapper


class PromWindow:
    kind = "prometheus"

    def __init__(self, url: str, match: str | None = None, timeout_s: float = 10.0):
        self.url, self.match, self.timeout_s = check_url(url, "Prometheus").rstrip("/"), match, timeout_s
        self.notes: list[str] = []
        self.sources: dict[str, str] = {}
        self.step_s: float | None = None

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        text = http_get(url, self.timeout_s, "Prometheus")
        try:
            d = json.loads(text)
        except ValueError:
            raise SourceUnavailable(f"Prometheus {url}: answer is not JSON: {text[:80]!r}") from None
        if not isinstance(d, dict) or d.get("status") != "success":
            raise SourceUnavailable(f"Prometheus {url}: {d.get('errorType', '?')}: {d.get('error', d)}"
                                    if isinstance(d, dict) else f"Prometheus {url}: unexpected answer")
        return d.get("data")

    def check(self) -> str:
        """Before the request: Prometheus answers (its version), and the --match selector parses."""
        info = self.api("/api/v1/status/buildinfo")
        self.api("/api/v1/query", query=f"count({selector(['DCGM_FI_DEV_POWER_USAGE'], self.match)})")
        return str((info or {}).get("version", "?"))

    @_malformed_is_one_line
    def interval(self) -> float:
        """The scrape interval of the targets serving DCGM series, else their samples' spacing."""
        dcgm = selector([s.dcgm for s in signals.TABLE if s.dcgm], self.match)
        found = self.api("/api/v1/query", query=f"group by (job, instance) ({dcgm})").get("result", [])
        pairs = {(r["metric"].get("job"), r["metric"].get("instance")) for r in found}
        if not pairs:
            return 0.0
        got = []
        for t in (self.api("/api/v1/targets", state="active") or {}).get("activeTargets", []):
            lab = t.get("labels", {})
            if (lab.get("job"), lab.get("instance")) in pairs and t.get("scrapeInterval"):
                got.append(_duration(t["scrapeInterval"]))
        if got:
            self.sources["step"] = f"scrape interval of {len(got)} target(s) (/api/v1/targets)"
            return max(got)
        m = self.api("/api/v1/query", query=f"{dcgm}[10m]").get("result", [])
        gaps = [float(b[0]) - float(a[0]) for s in m for a, b in zip(s["values"], s["values"][1:])]
        self.sources["step"] = "the series' sample spacing (no target lists its scrape interval)"
        return statistics.median(gaps) if gaps else 0.0

    def warn_coarse(self, step: float, window_s: float) -> None:
        want = max(0.1, round(window_s / MIN_SAMPLES, 1))  # MIN_SAMPLES samples over a window this long
        fix = (f"set scrape_interval: {want:g}s on the dcgm-exporter job and run dcgm-exporter with -c "
               f"{want * 1000:.0f} (DCGM_EXPORTER_INTERVAL; its default is {DCGM_DEFAULT_S:.0f} s), or decode "
               "more tokens")
        if window_s < step:
            self.notes.append(f"the request's window ({window_s:.1f} s) is shorter than one scrape ({step:g} s): "
                              f"at most one sample per GPU; {fix}")
        elif window_s / step < MIN_SAMPLES:
            self.notes.append(f"scrape interval {step:g} s gives {int(window_s / step)} sample(s) per GPU over the "
                              f"{window_s:.1f} s request: too coarse for a verdict per phase; {fix}")

    @_malformed_is_one_line
    def fetch(self, t0_unix: float, t1_unix: float, origin_unix: float) -> tuple[list[dict], list[dict]]:
        """(rows, gpus) of every DCGM GPU from ``t0_unix`` to ``t1_unix``, ``t_s`` counted from ``origin_unix``."""
        step = self.interval()
        if step <= 0:
            raise SourceUnavailable(f"Prometheus {self.url}: no DCGM series" + (f" matching {self.match}"
                                    if self.match else "") + " (is dcgm-exporter scraped by this Prometheus?)")
        self.step_s = step
        self.warn_coarse(step, t1_unix - t0_unix)
        expr = selector([s.dcgm for s in signals.TABLE if s.dcgm], self.match)
        res = self.api("/api/v1/query_range", query=expr, start=f"{t0_unix:.3f}", end=f"{t1_unix:.3f}",
                       step=f"{step:g}s").get("result", [])
        if not res:
            raise SourceUnavailable(f"Prometheus {self.url}: {expr} has no sample between the request's start and "
                                    "end")
        per: dict[tuple, dict[str, Any]] = {}
        nan_seen: list[str] = []
        missing: set[str] = set()
        for series in res:
            lab = series.get("metric", {})
            sig = signals.BY_DCGM.get(lab.get("__name__"))
            if sig is None:
                continue
            key, miss = gpu_of(lab, lab.get("instance", "?"))
            missing.update(miss)
            g = per.setdefault(key, {"labels": {}, "t": {}})
            g["labels"].update({k: v for k, v in lab.items() if k in KEEP_LABELS and v})
            for ts, val in series.get("values", []):
                g["t"].setdefault(float(ts), {})[sig.key] = row_value(sig, float(val), nan_seen,
                                                                      f"{sig.dcgm} of {key[0]}/{key[1]}")
        keys = sorted(per, key=lambda k: [natural(x) for x in k])
        gpus = [gpu_entry(i, k, per[k]) for i, k in enumerate(keys)]
        seen = {s for g in per.values() for vals in g["t"].values() for s in vals}
        for sig in signals.TABLE:
            if sig.dcgm:
                self.sources[sig.key] = f"ok ({sig.dcgm})" if sig.key in seen else f"missing: no {sig.dcgm} series"
        rows = []
        for i, k in enumerate(keys):
            limit = power_limit(per[k]["labels"].get("modelName"))
            for ts in sorted(per[k]["t"]):
                row = {"t_s": round(ts - origin_unix, 4), "gpu": i, "node": gpus[i]["node"],
                       "node_gpu": gpus[i]["node_gpu"], "window_s": step, "phase": None,
                       **{s: None for s in signals.NUMERIC_KEYS}, **per[k]["t"][ts]}
                if row["power_limit_W"] is None:
                    row["power_limit_W"] = limit
                rows.append(row)
        if "power_limit_W" not in seen:
            self.sources["power_limit_W"] = "datasheet (no DCGM_FI_DEV_POWER_MGMT_LIMIT series)"
        if missing:
            self.notes.append(f"labels {', '.join(sorted(missing))} missing on some DCGM series: those GPUs are "
                              "named by Prometheus's instance label and the UUID")
        if nan_seen:
            self.notes.append(f"{len(nan_seen)} series with NaN or out-of-range samples, read as missing (e.g. {nan_seen[0]})")
        return rows, gpus

    @_malformed_is_one_line
    def engine(self, t0_unix: float, t1_unix: float, origin_unix: float) -> dict[str, Any]:
        """The engine's spec-decode metrics over the window: counters' increase (resets undone) and gauges'
        mean, summed over series; the timeline beside the GPU rows; {} when the engine exports none."""
        step = self.step_s or 1.0
        res = self.api("/api/v1/query_range", query=selector(ENGINE_COUNTERS + ENGINE_GAUGES, None),
                       start=f"{t0_unix:.3f}", end=f"{t1_unix:.3f}", step=f"{step:g}s").get("result", [])
        out: dict[str, Any] = {}
        timeline: dict[float, dict[str, float]] = {}
        for s in res:
            name = s["metric"].get("__name__")
            vals = [(float(t), float(v)) for t, v in s.get("values", []) if math.isfinite(float(v))]
            if not vals:
                continue
            if name in ENGINE_COUNTERS:
                inc = sum(b - a if b >= a else b for (_, a), (_, b) in zip(vals, vals[1:]))  # a drop: a reset
                out[name] = out.get(name, 0.0) + inc
            else:
                out.setdefault(name, []).append(statistics.fmean(v for _, v in vals))
            for t, v in vals:
                slot = timeline.setdefault(round(t - origin_unix, 4), {})
                slot[name] = slot.get(name, 0.0) + v
        out = {k: (statistics.fmean(v) if isinstance(v, list) else v) for k, v in out.items()}
        drafts = out.get("vllm:spec_decode_num_drafts_total")
        if drafts:
            out["commit_len"] = 1 + out.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafts
        if out:
            out["timeline"] = [{"t_s": t, **v} for t, v in sorted(timeline.items())]
        return out


def _duration(s: str) -> float:
    """A Prometheus duration ("15s", "1m", "500ms", "1m30s") in seconds."""
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    total, num = 0.0, ""
    i = 0
    while i < len(s):
        if s[i].isdigit() or s[i] == ".":
            num += s[i]
            i += 1
            continue
        u = "ms" if s[i:i + 2] == "ms" else s[i]
        total += float(num) * units.get(u, 1.0)
        num, i = "", i + len(u)
    return total + (float(num) if num else 0.0)
