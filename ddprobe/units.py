"""All unit parsing and formatting in one place.

Conventions: 1k tokens = 1024 tokens, 1m = 1024k; GB = 1e9 bytes,
TB/s = 1e12 bytes/s (decimal, as GPU datasheets quote them); GiB and TiB/s are binary.
Parsers return plain numbers in base units: tokens, bytes, bytes/s, seconds.
Every parse error is a ``UnitError`` with a one-line message naming the bad part.
"""
from __future__ import annotations

import math
import re


class DDProbeError(ValueError):
    """A user-facing error: the CLI prints its message on one line and exits 1."""


class UnitError(DDProbeError):
    pass


_NUM = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"

_TOKEN_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
_BYTE_UNITS = {
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}


def _split(text: str, what: str) -> tuple[float, str]:
    """'1.8 TB/s' -> (1.8, 'tb/s'); raise UnitError naming ``text`` if there is no number."""
    s = str(text).strip()
    m = re.fullmatch(_NUM + r"\s*([a-zA-Zµ/]*)", s)
    if not m:
        raise UnitError(f"bad {what} {text!r}: expected a number with an optional unit")
    value = float(m.group(1))
    if not math.isfinite(value):  # 1e400 reads as inf
        raise UnitError(f"bad {what} {text!r}: too large")
    return value, m.group(2).lower()


def _positive(value: float, text: str, what: str) -> None:
    if not math.isfinite(value) or value <= 0:
        raise UnitError(f"bad {what} {text!r}: must be greater than zero")


# Physical inputs, base units: (lowest, highest) accepted, wide enough for any real machine and narrow enough
# that a typo (1e-300, 1e9 rows) is refused rather than printed as a 0 ms floor or an "inf TB/s".
RANGES = {  # what: (lowest, highest, how the range is said)
    "bandwidth": (1e6, 1e15, "1 MB/s and 1 PB/s (1000 TB/s)"),
    "FLOP rate": (1e9, 1e17, "0.001 and 100000 TFLOP/s"),
    "step time": (1e-6, 3600.0, "1 us and 1 h"),
    "query rows": (1, 65536, "1 and 65536"),  # verify rows per step (budget + 1)
}


def in_range(value: float, what: str, text) -> float:
    """``value`` when it lies in ``RANGES[what]``, else UnitError naming the range."""
    lo, hi, said = RANGES[what]
    if not (math.isfinite(value) and lo <= value <= hi):
        raise UnitError(f"bad {what} {text!r}: must be between {said}")
    return value


# Times a benchmark measured, each in its key's unit: the range a typed step time has (``units.RANGES``, 1 us to
# 1 h). A kernel floor is a bound, not a measurement (a 1k layer's can be under 1 us): not held to it.
_MEASURED = {"bench-verify": {"us": 1e-6, "time_us": 1e-6, "step_ms": 1e-3, "eager_us": 1e-6},
             "allreduce": {"us": 1e-6, "p10_us": 1e-6, "p90_us": 1e-6},
             "commit": {"decode_ms_per_step": 1e-3, "verify_ms_mean": 1e-3, "draft_ms_mean": 1e-3},
             "floor": {"step_ms": 1e-3}}


def check_measured(kind: str, rows: list, source: str) -> None:
    """Nothing when every time the benchmark ``rows`` (dicts, typed by the schema) of a ``kind`` file record is a
    measured time (1 us to 1 h; in a bench-verify row a zero, or null, is "no time": the path failed), an all-reduce's
    p10 <= median <= p90 and its size at least 1 B; one DDProbeError naming the file, the row and the field
    otherwise; a commit row's step times and a floor row's measured step likewise. Every results file loaded asks
    it (``results.Result.from_dict``)."""
    lo, hi, said = RANGES["step time"]
    for i, row in enumerate(rows if kind in _MEASURED else [], 1):
        where = f"{source}: row {i}" + (f" ({row.get('path')} ctx={row.get('ctx')})" if kind == "bench-verify"
                                        else f" ({row.get('bytes')} B)" if kind == "allreduce"
                                        else f" ({row.get('text', '')} ctx={row.get('ctx')})".replace("( ", "("))
        for key, scale in _MEASURED[kind].items():
            v = row.get(key)
            if v is None or (v == 0 and kind == "bench-verify" and not isinstance(v, bool)):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):  # a key the schema leaves to the writer
                raise DDProbeError(f"{where}: {key!r} is {type(v).__name__} {str(v)[:40]!r} (must be a number)")
            if not lo <= v * scale <= hi:
                unit = "us" if scale == 1e-6 else "ms"
                raise DDProbeError(f"{where}: {key!r} is {v:g} {unit}, not a measured time (must be "
                                   f"between {said})")
        if kind == "allreduce":
            if row["bytes"] < 1:
                raise DDProbeError(f"{where}: 'bytes' is {row['bytes']} (an all-reduce message is at least 1 B)")
            p10, med, p90 = row.get("p10_us"), row.get("us"), row.get("p90_us")
            if None not in (p10, med, p90) and not p10 <= med <= p90:
                raise DDProbeError(f"{where}: p10_us {p10:g} <= us {med:g} <= p90_us {p90:g} does not hold")


def parse_tokens(text: str | int) -> int:
    """'512' -> 512, '16k' -> 16384, '1m' -> 1048576, '1.5k' -> 1536 (k = 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise UnitError(f"bad token count {text!r}: must be greater than zero")
        return text
    value, unit = _split(str(text), "token count")
    if unit not in _TOKEN_SUFFIX:
        raise UnitError(f"bad token count {text!r}: unknown suffix {unit!r} (use k = 1024 or m = 1024k)")
    tokens = value * _TOKEN_SUFFIX[unit]
    if tokens != int(tokens):
        raise UnitError(f"bad token count {text!r}: not a whole number of tokens")
    _positive(tokens, str(text), "token count")
    return int(tokens)


def _parse_list(text: str, parse, what: str) -> list:
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise UnitError(f"empty {what} list {text!r}")
    out = []
    for p in parts:
        if not p:
            raise UnitError(f"empty item in {what} list {text!r}")
        try:
            out.append(parse(p))
        except UnitError as e:
            raise UnitError(f"{e} (in {text!r})") from None
    return out


def parse_fraction(text: str | float, what: str = "fraction") -> float:
    """'10%' -> 0.1, '0.1' -> 0.1; a bare number must lie in [0, 1)."""
    t = str(text).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(%?)", t)
    if not m:
        raise UnitError(f"bad {what} {text!r}: expected a percentage (10%) or a fraction (0.1)")
    v = float(m.group(1)) / (100 if m.group(2) else 1)
    if not 0 <= v < 1:
        raise UnitError(f"bad {what} {text!r}: must be at least 0 and below 100%")
    return v


def parse_token_list(text: str) -> list[int]:
    """'1k,16k,64k,128k' -> [1024, 16384, 65536, 131072]."""
    return _parse_list(text, parse_tokens, "token count")


def parse_context_list(text: str, option: str = "--ctx") -> list[int]:
    """A list of contexts to run or read ('1k,16k'): parse_token_list, each context once (a context given twice,
    as '32k,32k' or '1k,1024', is refused, never run twice or silently dropped); ``option`` names it in the error."""
    ctxs = parse_token_list(text)
    dup = next((c for i, c in enumerate(ctxs) if c in ctxs[:i]), None)
    if dup is not None:
        raise UnitError(f"{option}: a context is given twice ({fmt_tokens(dup)}): give each context once")
    return ctxs


def parse_count_list(text: str, what: str) -> list[int]:
    """'8,64' -> [8, 64]: whole numbers >= 1 (head counts, ranks), no unit."""
    def one(p: str) -> int:
        if not p.isdigit() or int(p) < 1:
            raise UnitError(f"bad {what} {p!r}: expected a whole number >= 1")
        return int(p)
    return _parse_list(text, one, what)


def parse_bytes(text: str | float, what: str = "size") -> float:
    """'9.2GB' -> 9.2e9, '1GiB' -> 1073741824, '1152' -> 1152 (bytes): a whole number of bytes ('1.5B', '1.0001KB'
    are refused, never rounded to another size); ``what`` names the option in the error."""
    value, unit = _split(str(text), what)
    unit = unit or "b"
    if unit not in _BYTE_UNITS:
        raise UnitError(f"bad {what} {text!r}: unknown unit {unit!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    _positive(value, str(text), what)
    n = value * _BYTE_UNITS[unit]
    if abs(n - round(n)) > 1e-9 * max(1.0, n):  # 1.1KB = 1100.0000000000002 in floats: whole
        raise UnitError(f"bad {what} {text!r}: {n:g} B is not a whole number of bytes")
    return float(round(n))


def parse_bytes_list(text: str, what: str = "size") -> list[float]:
    """'4KB,1MiB' -> [4000.0, 1048576.0]: whole numbers of bytes (``parse_bytes``)."""
    return _parse_list(text, lambda p: parse_bytes(p, what), what)


def parse_bandwidth(text: str | float) -> float:
    """'1.8TB/s' -> 1.8e12, '1792GB/s' -> 1.792e12 (bytes per second)."""
    value, unit = _split(str(text), "bandwidth")
    if not unit.endswith("/s") or unit[:-2] not in _BYTE_UNITS:
        raise UnitError(f"bad bandwidth {text!r}: unit must be one of TB/s, GB/s, MB/s, TiB/s, GiB/s")
    _positive(value, str(text), "bandwidth")
    return in_range(value * _BYTE_UNITS[unit[:-2]], "bandwidth", text)


def parse_time(text: str | float, default_unit: str = "s") -> float:
    """'714ms' -> 0.714, '1.43s' -> 1.43, '250us' -> 0.00025 (seconds); a bare number is in ``default_unit``."""
    value, unit = _split(str(text), "time")
    unit = unit or default_unit
    if unit not in _TIME_UNITS:
        raise UnitError(f"bad time {text!r}: unknown unit {unit!r} (use ns, us, ms, s, min)")
    _positive(value, str(text), "time")
    return value * _TIME_UNITS[unit]


def parse_time_list(text: str, default_unit: str = "s") -> list[float]:
    """'159ms,714ms,1.43s' -> [0.159, 0.714, 1.43] (seconds)."""
    return _parse_list(text, lambda p: parse_time(p, default_unit), "time")


def parse_step_times(text: str) -> list[float]:
    """Measured step times, bare numbers in ms ('714,1.43s' -> [0.714, 1.43] s), each in ``RANGES``."""
    return _parse_list(text, lambda p: in_range(parse_time(p, "ms"), "step time", p), "time")


def parse_tflops(value: str | float) -> float:
    """A dense tensor rate in TFLOP/s (a number) -> FLOP/s, in ``RANGES``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UnitError(f"bad FLOP rate {value!r}: expected a number of TFLOP/s") from None
    return in_range(v * 1e12, "FLOP rate", value)


def parse_rows(value: int | str) -> int:
    """Verify rows per step, in ``RANGES``."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise UnitError(f"bad query rows {value!r}: expected a whole number") from None
    return int(in_range(v, "query rows", value))


# ---- formatting -------------------------------------------------------------

def fmt_tokens(n: int) -> str:
    """131072 -> '128k', 1048576 -> '1m', 1000 -> '1000'."""
    n = int(n)
    for suffix, size in (("m", 1024 * 1024), ("k", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    if n >= 1024 and (n * 10) % 1024 == 0:
        return f"{n / 1024:g}k"
    return str(n)


def _scaled(value: float, steps: list[tuple[float, str]], digits: int = 3) -> str:
    """``value`` in the largest unit it reaches, to ``digits`` significant digits; a value that rounds up to
    1000 of a unit (999.7 GB/s) is written in the next one (1 TB/s), never as '1e+03'."""
    for i, (size, name) in enumerate(steps):
        if abs(value) >= size:
            shown = float(f"{value / size:.{digits}g}")
            if abs(shown) >= 1000 and i > 0:
                size, name = steps[i - 1]
            return f"{value / size:.{digits}g} {name}"
    size, name = steps[-1]
    return f"{value / size:.{digits}g} {name}"


def fmt_bytes(n: float) -> str:
    """9.21e9 -> '9.21 GB' (decimal units)."""
    return _scaled(n, [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1, "B")])


def fmt_bandwidth(bps: float) -> str:
    """1.8e12 -> '1.8 TB/s'."""
    return _scaled(bps, [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s"), (1, "B/s")])


def fmt_time(seconds: float) -> str:
    """0.714 -> '714 ms', 5.1e-3 -> '5.12 ms', 2e-5 -> '20 us'."""
    return _scaled(seconds, [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")])


def fmt_ratio(x: float) -> str:
    """139.6 -> '140x', 15.5 -> '15.5x', 1.23 -> '1.23x'."""
    return f"{x:.3g}x" if x < 1000 else f"{x:,.0f}x"
