"""The telemetry source protocol and what every source shares.

A live source (NVML: ``telemetry.NvmlReader``; dcgm-exporter endpoints: ``dcgm_exporter.ExporterSource``)
is sampled by ``sampler.Sampler`` each period: ``open()`` lists the GPUs, ``sample()`` returns one row
per GPU in that order (keys from ``signals``), ``close()`` ends it; ``sources`` says per signal where it
came from or why it is missing. A window source (Prometheus: ``prometheus.PromWindow``) is asked once,
after the request, for the rows of its window. Both name each GPU by its node and its index there
(``gpu_of``), and both undo counter resets (``undo_resets``) so a restarted exporter or driver does not
read as negative energy. Nothing here imports torch or pynvml.
"""
from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from typing import Any, Protocol

from ... import signals
from ...units import DDProbeError

SOURCES = ("nvml", "prometheus", "dcgm-exporter")
NODE_LABELS = ("Hostname", "hostname", "instance")  # dcgm-exporter writes Hostname (older) or hostname (newer)
KEEP_LABELS = ("UUID", "modelName", "pod", "namespace", "container", "GPU_I_ID", "instance")


class SourceUnavailable(DDProbeError):
    """The telemetry source cannot be read at all (no NVML, Prometheus or exporter unreachable)."""


class TelemetrySource(Protocol):
    kind: str
    sources: dict[str, str]

    def open(self) -> list[dict[str, Any]]: ...  # one dict per GPU: index, name (and node, node_gpu, uuid)

    def sample(self) -> list[dict[str, Any]]: ...  # one row per GPU, in open()'s order

    def close(self) -> None: ...


def gpu_of(labels: dict[str, str], fallback_node: str) -> tuple[tuple[str, str, str], list[str]]:
    """(node, gpu index on the node, MIG instance) of a DCGM series, and which labels were missing.
    Node: Hostname, else hostname, else Prometheus's instance, else ``fallback_node`` (the exporter's URL);
    index: ``gpu``, else the UUID; a MIG slice (``GPU_I_ID``) is its own row."""
    missing = []
    node = next((labels[k] for k in NODE_LABELS if labels.get(k)), None)
    if node is None:
        missing.append("Hostname")
        node = fallback_node
    idx = labels.get("gpu") or labels.get("UUID")
    if not labels.get("gpu"):
        missing.append("gpu")
    if idx is None:
        idx = "?"
    return (node, idx, labels.get("GPU_I_ID", "")), missing


def natural(s: Any) -> list:
    """Sort key that puts node-2 before node-10 and GPU 2 before GPU 10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(s))]


def row_value(sig: signals.Signal, raw: float, nan_seen: list[str], where: str) -> float | None:
    """A DCGM sample in the row's unit; NaN / inf, a negative value or a percentage over 100 -> None (no GPU
    reads that), and ``where`` noted once in ``nan_seen``."""
    v = raw * sig.dcgm_scale if math.isfinite(raw) else raw
    if not math.isfinite(v) or v < 0 or (sig.key.endswith("_pct") and v > 100.5):
        if where not in nan_seen:
            nan_seen.append(where)
        return None
    return v


def undo_resets(rows: list[dict[str, Any]], notes: list[str]) -> None:
    """Counter signals (energy) per GPU made monotone in place: a drop (exporter or driver restart) is
    continued from the last value, as Prometheus's increase() does; one note per GPU and signal."""
    for sig in (s for s in signals.TABLE if s.counter):
        last: dict[Any, float] = {}
        offset: dict[Any, float] = {}
        for r in sorted(rows, key=lambda r: r["t_s"]):
            v, g = r.get(sig.key), r.get("gpu")
            if not isinstance(v, (int, float)):
                continue
            if g in last and v + offset.get(g, 0.0) < last[g]:
                offset[g] = last[g]  # the counter restarted from (about) zero
                notes.append(f"{sig.key} counter reset on GPU {signals.gpu_name(r)} at {r['t_s']:.1f} s: "
                             f"continued from {last[g]:.4g} (energy kept, not read as negative)")
            r[sig.key] = v + offset.get(g, 0.0)
            last[g] = r[sig.key]


def check_url(url: str, what: str) -> str:
    """``url`` itself when it is http(s)://...; else one line naming it as given."""
    if not url.startswith(("http://", "https://")):
        raise SourceUnavailable(f"bad {what} URL {url!r}: expected http://host:port")
    return url


def http_get(url: str, timeout_s: float, what: str) -> str:
    """GET ``url`` as text; any failure one line naming ``what`` and the URL (SourceUnavailable)."""
    import http.client

    from ...deadline import Late, within

    check_url(url, what)

    progress: dict = {"stage": "connecting"}  # the deadline's and the socket's: either names the stage

    def fetch(progress: dict) -> str:
        progress["stage"] = "waiting for the answer's headers"
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            progress["stage"] = "headers came, the body was still arriving"
            return r.read().decode("utf-8", "replace")

    try:
        return within(fetch, timeout_s, progress)  # the whole answer, not each read
    except (Late, TimeoutError):  # the deadline's clock or the socket's, whichever ran out first: the same words
        raise SourceUnavailable(f"{what} {url}: no complete answer within {timeout_s:g} s ({progress['stage']})") \
            from None
    except http.client.HTTPException as e:  # cut mid-answer (IncompleteRead), a malformed status line
        raise SourceUnavailable(f"{what} {url}: broken answer ({type(e).__name__})") from None
    except urllib.error.HTTPError as e:
        body = e.read().decode("utf-8", "replace").strip().replace("\n", " ")[:160]
        raise SourceUnavailable(f"{what} {url}: HTTP {e.code} {body}") from None
    except urllib.error.URLError as e:
        reason = str(getattr(e, "reason", e))
        why = "connection refused" if "refused" in reason.lower() else reason
        raise SourceUnavailable(f"{what} {url}: cannot connect ({why}); is it running?") from None
    except OSError as e:  # reset or closed mid-answer
        raise SourceUnavailable(f"{what} {url}: cannot connect ({type(e).__name__}: {e}); is it running?") from None


def power_limit(model: str | None) -> float | None:
    """The datasheet board power of a GPU model name ("NVIDIA H200" -> 700), else None."""
    from ...physics.gpus import gpu_spec_for

    spec = gpu_spec_for(model)
    return signals.DATASHEET_POWER_W.get(spec.name) if spec else None
