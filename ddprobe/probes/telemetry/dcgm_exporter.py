"""dcgm-exporter endpoints read directly (``--source dcgm-exporter``): one scrape of every URL per tick.

Each exposition text is parsed by ``prometheus_client``'s parser with every label kept, so each GPU (node
from ``Hostname``/``hostname``, index from ``gpu``, a MIG slice from ``GPU_I_ID``) is its own row; values
become the signal keys of ``signals`` (ratios to percent, mJ to J, MiB to GB). ``ExporterSource`` is a
``sources.TelemetrySource`` for ``sampler.Sampler``. An endpoint that stops answering is noted once and
its GPUs read None for that tick; the other endpoints' samples are kept.
"""
from __future__ import annotations

from typing import Any

from ... import signals
from .sources import KEEP_LABELS, SourceUnavailable, gpu_of, http_get, natural, power_limit, row_value

SM_ACTIVE_HINT = ("dcgm-exporter's default-counters.csv leaves DCGM_FI_PROF_SM_ACTIVE and "
                  "DCGM_FI_PROF_SM_OCCUPANCY commented out; uncomment them (-f your.csv) to read them")


def parse(text: str, fallback_node: str, nan_seen: list[str] | None = None) -> dict[tuple, dict[str, Any]]:
    """Exposition text -> {(node, gpu, mig): {"labels": {...}, "values": {signal key: value}, "missing": [...]}}
    for the DCGM metrics ``signals`` knows; other metrics are ignored. Raises ``SourceUnavailable`` when the
    text cannot be parsed."""
    from prometheus_client.parser import text_string_to_metric_families

    nan_seen = [] if nan_seen is None else nan_seen
    out: dict[tuple, dict[str, Any]] = {}
    try:
        samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except (ValueError, TypeError, IndexError) as e:
        raise SourceUnavailable(f"{fallback_node}: not Prometheus exposition text ({e})") from None
    for s in samples:
        sig = signals.BY_DCGM.get(s.name)
        if sig is None:
            continue
        key, missing = gpu_of(s.labels, fallback_node)
        g = out.setdefault(key, {"labels": {}, "values": {}, "missing": missing})
        g["labels"].update({k: v for k, v in s.labels.items() if k in KEEP_LABELS and v})
        g["values"][sig.key] = row_value(sig, float(s.value), nan_seen, f"{sig.dcgm} of {key[0]}/{key[1]}")
    return out


def gpu_entry(index: int, key: tuple, g: dict[str, Any]) -> dict[str, Any]:
    node, idx, mig = key
    return {"index": index, "name": g["labels"].get("modelName"), "node": node,
            "node_gpu": f"{idx}.{mig}" if mig else idx, "uuid": g["labels"].get("UUID"),
            **{k: g["labels"][k] for k in ("pod", "namespace") if g["labels"].get(k)}}


class ExporterSource:
    """Every GPU behind ``urls`` (dcgm-exporter ``/metrics`` endpoints), one scrape of each per ``sample()``."""

    kind = "dcgm-exporter"

    def __init__(self, urls: list[str], timeout_s: float = 5.0):
        self.urls = [u if u.rstrip("/").endswith("/metrics") else u.rstrip("/") + "/metrics" for u in urls]
        self.timeout_s = timeout_s
        self.sources: dict[str, str] = {}
        self.notes: list[str] = []
        self.keys: list[tuple] = []
        self._down: set[str] = set()
        self._nan: list[str] = []

    def _scrape(self, url: str) -> dict[tuple, dict[str, Any]]:
        return parse(http_get(url, self.timeout_s, "dcgm-exporter"), url.split("//", 1)[-1].split("/", 1)[0],
                     self._nan)

    def open(self) -> list[dict[str, Any]]:
        found: dict[tuple, dict[str, Any]] = {}
        for url in self.urls:
            got = self._scrape(url)  # unreachable or not exposition text: one line, nothing sampled yet
            if not got:
                raise SourceUnavailable(f"dcgm-exporter {url}: no DCGM_FI_* series of any GPU in its answer")
            found.update(got)
        self.keys = sorted(found, key=lambda k: [natural(x) for x in k])
        for g in found.values():
            if g["missing"]:
                self.notes.append(f"labels {', '.join(g['missing'])} missing on some series: GPUs named by the "
                                  "exporter's address and UUID instead")
                break
        seen = {k for g in found.values() for k, v in g["values"].items()}
        for sig in signals.TABLE:
            if sig.dcgm:
                self.sources[sig.key] = f"ok ({sig.dcgm})" if sig.key in seen else \
                    f"missing: no {sig.dcgm} series" + (f" ({SM_ACTIVE_HINT})" if sig.key.startswith("sm_") else "")
        if "power_limit_W" not in seen:
            self.sources["power_limit_W"] = "datasheet (no DCGM_FI_DEV_POWER_MGMT_LIMIT series)"
        return [gpu_entry(i, k, found[k]) for i, k in enumerate(self.keys)]

    def sample(self) -> list[dict[str, Any]]:
        merged: dict[tuple, dict[str, Any]] = {}
        for url in self.urls:
            try:
                merged.update(self._scrape(url))
                self._down.discard(url)
            except SourceUnavailable as e:
                if url not in self._down:
                    self.notes.append(f"{e}: its GPUs read nothing until it answers again")
                self._down.add(url)
        rows = []
        for key in self.keys:
            g = merged.get(key, {"values": {}, "labels": {}})
            row: dict[str, Any] = {k: None for k in signals.NUMERIC_KEYS}
            row.update(g["values"])
            if row["power_limit_W"] is None and g["values"]:
                row["power_limit_W"] = power_limit(g["labels"].get("modelName"))
            rows.append(row)
        return rows

    def close(self) -> None:
        if self._nan:
            self.notes.append(f"{len(self._nan)} NaN or out-of-range sample(s) read as missing, e.g. {self._nan[0]}")
