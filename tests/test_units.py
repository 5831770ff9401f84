import math
import re

import pytest

from ddprobe.units import (DDProbeError, UnitError, check_measured, fmt_bandwidth, fmt_bytes, fmt_ratio, fmt_time,
                           fmt_tokens, parse_bandwidth, parse_bytes, parse_bytes_list, parse_time, parse_time_list,
                           parse_token_list, parse_tokens)


@pytest.mark.parametrize("text,want", [
    ("512", 512), ("1k", 1024), ("16k", 16384), ("128k", 131072), ("1m", 1048576), ("1M", 1048576),
    ("1.5k", 1536), (" 64k ", 65536), (4096, 4096), ("185k", 189440),
])
def test_parse_tokens_good(text, want):
    assert parse_tokens(text) == want


@pytest.mark.parametrize("text,fragment", [
    ("12x", "unknown suffix 'x'"), ("k", "expected a number"), ("", "expected a number"), ("0", "greater than zero"),
    ("-1k", "expected a number"), ("1.0001k", "whole number"), ("1kb", "unknown suffix 'kb'"), (0, "greater than zero"),
])
def test_parse_tokens_bad(text, fragment):
    with pytest.raises(UnitError) as e:
        parse_tokens(text)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_parse_token_list():
    assert parse_token_list("1k,16k,64k,128k") == [1024, 16384, 65536, 131072]
    assert parse_token_list("512") == [512]
    with pytest.raises(UnitError, match=r"bad token count '12q'.*in '1k,12q'"):
        parse_token_list("1k,12q")
    with pytest.raises(UnitError, match="empty item"):
        parse_token_list("1k,,2k")


@pytest.mark.parametrize("text,want", [
    ("1.8TB/s", 1.8e12), ("1792GB/s", 1.792e12), ("1.8 TB/s", 1.8e12), ("14GB/s", 14e9), ("1TiB/s", 2**40),
    ("900 MB/s", 9e8),
])
def test_parse_bandwidth_good(text, want):
    assert math.isclose(parse_bandwidth(text), want)


@pytest.mark.parametrize("text", ["1.8TB", "fast", "1.8 TB/min", "0GB/s", "1.8PB/s"])
def test_parse_bandwidth_bad(text):
    with pytest.raises(UnitError, match="bad bandwidth"):
        parse_bandwidth(text)


@pytest.mark.parametrize("text,want", [
    ("714ms", 0.714), ("1.43s", 1.43), ("250us", 250e-6), ("5 ms", 5e-3), ("2min", 120.0), ("1e3ns", 1e-6),
])
def test_parse_time_good(text, want):
    assert math.isclose(parse_time(text), want)


def test_parse_time_default_unit_and_list():
    assert math.isclose(parse_time("714", default_unit="ms"), 0.714)
    assert [round(t, 6) for t in parse_time_list("159,714ms,1.43s", default_unit="ms")] == [0.159, 0.714, 1.43]
    with pytest.raises(UnitError, match="unknown unit 'h'"):
        parse_time("3h")
    with pytest.raises(UnitError, match="greater than zero"):
        parse_time("0ms")


def test_parse_bytes():
    assert parse_bytes("9.2GB") == 9.2e9
    assert parse_bytes("1GiB") == 2**30
    assert parse_bytes("1152") == 1152
    with pytest.raises(UnitError, match="unknown unit"):
        parse_bytes("3 bananas")


@pytest.mark.parametrize("text, says", [
    ("1.5B", "1.5 B is not a whole number of bytes"), ("0.5", "0.5 B is not a whole number of bytes"),
    ("1.0001KB", "1000.1 B is not a whole number of bytes"), ("0", "must be greater than zero"),
    ("-4", "expected a number"), ("1e400", "too large"),
])
def test_sizes_are_whole_bytes_never_rounded_to_another(text, says):
    """Issue 65: `bench allreduce --bytes 1.5B` measured 4 bytes. A size is a whole number of bytes; the option's
    name is in the line."""
    with pytest.raises(UnitError, match=r"bad --bytes .*" + re.escape(says)):
        parse_bytes(text, "--bytes")
    assert parse_bytes("1.1KB") == 1100 and parse_bytes("1.5KiB") == 1536 and parse_bytes("4KB") == 4000
    assert parse_bytes_list("4KB,1MiB", "--bytes") == [4000, 2**20]


@pytest.mark.parametrize("kind, row, says", [
    ("bench-verify", {"path": "split", "ctx": 1024, "us": 1e-3}, "row 1 (split ctx=1024): 'us' is 0.001 us"),
    ("bench-verify", {"path": "split", "ctx": 1024, "step_ms": 4e6}, "'step_ms' is 4e+06 ms, not a measured time"),
    ("allreduce", {"bytes": 8, "us": 5.0, "p90_us": 4.0, "p10_us": 1.0}, "p10_us 1 <= us 5 <= p90_us 4"),
    ("bench-verify", {"path": "split", "ctx": 1024, "us": 20.0, "eager_us": "fast"}, "'eager_us' is str 'fast'"),
    ("bench-verify", {"path": "split", "ctx": 1024, "us": 20.0, "eager_us": float("nan")}, "'eager_us' is nan us"),
])
def test_measured_times_read_from_files_are_held_to_the_typed_range(kind, row, says):
    with pytest.raises(DDProbeError, match=re.escape(says)):
        check_measured(kind, [row], "f.json")
    check_measured("bench-verify", [{"path": "split", "ctx": 1024, "us": 0}], "f.json")  # zero: no time, the path failed


def test_formatting():
    assert fmt_tokens(131072) == "128k"
    assert fmt_tokens(1048576) == "1m"
    assert fmt_tokens(1536) == "1.5k"
    assert fmt_tokens(1000) == "1000"
    assert fmt_bytes(9.21e9) == "9.21 GB"
    assert fmt_bytes(70272) == "70.3 KB"
    assert fmt_bandwidth(1.8e12) == "1.8 TB/s"
    assert fmt_bandwidth(14.5e9) == "14.5 GB/s"
    assert fmt_time(0.714) == "714 ms"
    assert fmt_time(2e-5) == "20 us"
    assert fmt_ratio(139.6) == "140x"
    assert fmt_ratio(15.46) == "15.5x"


def test_values_that_round_up_take_the_next_unit():
    from ddprobe.units import fmt_bandwidth, fmt_bytes, fmt_time

    # 999.7 GB/s to three digits is 1000 GB/s: written as 1 TB/s, never as '1e+03 GB/s'
    assert fmt_bandwidth(999.7e9) == "1 TB/s" and fmt_bandwidth(999.4e9) == "999 GB/s"
    assert fmt_time(0.99996) == "1 s" and fmt_bytes(999_999) == "1 MB"
    assert "e+" not in fmt_bandwidth(999.95e6)
