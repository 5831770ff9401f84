"""`ddprobe serve`'s profiler driven in the orders that crashed it (issue 65: a stop while a profile runs was a
segfault, exit 139): a real server on 127.0.0.1 (tiny engine, CPU), real requests, and after every test the server
still answers. Also SGLang's options honoured or refused by name, the prefix held inside output_dir, and a trace
that cannot be written failing its own stop, never a user's request."""
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

requests = pytest.importorskip("requests")
ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ddprobe", "serve", "--preset", "tiny", "--port", str(port)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while True:
        assert proc.poll() is None and time.time() - t0 < 120, "serve did not start"
        try:
            requests.get(base + "/health", timeout=1)
            break
        except requests.RequestException:
            time.sleep(0.3)
    yield base, proc
    proc.terminate()
    proc.wait(30)


def post(base, path, body=None, timeout=120):
    return requests.post(base + path, json=body if body is not None else {}, timeout=timeout)


def gen(base, n=24, text="the cat sat on the mat. the cat sat on the mat. the cat"):
    return post(base, "/generate", {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0}})


def alive(url):
    base, proc = url
    assert proc.poll() is None, f"serve died with exit {proc.returncode}"
    assert requests.get(base + "/health", timeout=10).status_code == 200


def traces(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.trace.json.gz"))


def test_stop_while_running_after_a_generate(url, tmp_path):
    base, _ = url
    assert post(base, "/start_profile", {"output_dir": str(tmp_path)}).status_code == 200  # no num_steps
    assert gen(base).status_code == 200
    r = post(base, "/stop_profile")
    assert r.status_code == 200, r.text
    assert len(traces(tmp_path)) == 1
    alive(url)


def test_stop_twice_and_concurrent_stops(url, tmp_path):
    base, _ = url
    assert post(base, "/start_profile", {"output_dir": str(tmp_path), "num_steps": 50}).status_code == 200
    assert gen(base, 8).status_code == 200  # fewer steps than asked: still running
    with ThreadPoolExecutor(6) as ex:
        codes = sorted(r.status_code for r in ex.map(lambda _: post(base, "/stop_profile"), range(6)))
    assert codes == [200, 400, 400, 400, 400, 400]
    again = post(base, "/stop_profile")
    assert again.status_code == 400 and "not in progress" in again.text
    assert len(traces(tmp_path)) == 1
    alive(url)


def test_stop_during_a_generate(url, tmp_path):
    base, _ = url
    assert post(base, "/start_profile", {"output_dir": str(tmp_path), "with_stack": False}).status_code == 200
    out = {}
    th = threading.Thread(target=lambda: out.update(r=gen(base, 160)))
    th.start()
    time.sleep(0.5)
    stop = post(base, "/stop_profile")
    th.join(120)
    assert stop.status_code == 200, stop.text
    assert out["r"].status_code == 200 and out["r"].json()["meta_info"]["completion_tokens"] == 160
    assert len(traces(tmp_path)) == 1
    alive(url)


def test_a_storm_of_starts_stops_and_generates(url, tmp_path):
    base, _ = url

    def one(i):
        if i % 3 == 0:
            return gen(base, 16).status_code
        if i % 3 == 1:
            return post(base, "/start_profile", {"output_dir": str(tmp_path), "num_steps": 2 + i % 4,
                                                 "with_stack": False}).status_code
        return post(base, "/stop_profile").status_code

    with ThreadPoolExecutor(8) as ex:
        codes = list(ex.map(one, range(36)))
    assert set(codes) <= {200, 400}, codes
    post(base, "/stop_profile")
    alive(url)
    for f in traces(tmp_path):  # every file written is a whole trace
        assert "traceEvents" in json.loads(gzip.open(f, "rt").read())


def test_steps_counted_as_sglang_counts_them_prefill_included(url, tmp_path):
    """profile_by_stage false: the profile starts at the next forward pass, the prefill; its steps carry
    SGLang's span names with the context; profile_by_stage true writes the decode stage apart."""
    base, _ = url
    ids = list(range(20, 120))
    assert post(base, "/start_profile", {"output_dir": str(tmp_path / "a"), "num_steps": 3, "with_stack": False,
                                         "detailed_annotations": True}).status_code == 200
    assert post(base, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 64}}).status_code == 200
    (f,) = traces(tmp_path / "a")
    names = [e["name"] for e in json.loads(gzip.open(f, "rt").read())["traceEvents"]
             if str(e.get("name", "")).startswith("step[")]
    assert names[0].startswith("step[EXTEND bs=1 toks=100") and names[0].endswith("c_sk=100]")
    assert len(names) == 3 and all(n.startswith("step[TARGET_VERIFY bs=1 g_sq=9") for n in names[1:])
    assert post(base, "/start_profile", {"output_dir": str(tmp_path / "b"), "num_steps": 3, "with_stack": False,
                                         "profile_by_stage": True, "profile_stages": ["decode"],
                                         "detailed_annotations": True}).status_code == 200
    assert post(base, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 64}}).status_code == 200
    (f,) = traces(tmp_path / "b")
    assert f.name.endswith("-TP-0-DECODE.trace.json.gz")
    names = [e["name"] for e in json.loads(gzip.open(f, "rt").read())["traceEvents"]
             if str(e.get("name", "")).startswith("step[")]
    assert len(names) == 3 and all("TARGET_VERIFY" in n for n in names)
    alive(url)


@pytest.mark.parametrize("body,field", [
    ({"profile_prefix": "../x"}, "profile_prefix"),
    ({"profile_prefix": "/tmp/abs"}, "profile_prefix"),
    ({"profile_prefix": "a/b"}, "profile_prefix"),
    ({"merge_profiles": True}, "merge_profiles"),
    ({"profile_stages": ["verify"], "profile_by_stage": True}, "profile_stages"),
    ({"profile_stages": ["decode"]}, "profile_stages"),
    ({"start_step": -1}, "start_step"),
    ({"start_step": 10 ** 30}, "start_step"),  # an impossible count: a profile that would never start
    ({"num_steps": 10 ** 12}, "num_steps"),
    ({"output_dir": "/proc/x"}, "output_dir"),
])
def test_options_refused_by_name(url, body, field):
    base, _ = url
    r = post(base, "/start_profile", body)
    assert r.status_code == 400 and field in r.text, r.text
    assert post(base, "/stop_profile").status_code == 400  # nothing was started
    alive(url)


def test_a_trace_that_cannot_be_written_fails_its_stop_not_a_request(url, tmp_path):
    base, _ = url
    d = tmp_path / "gone"
    assert post(base, "/start_profile", {"output_dir": str(d), "with_stack": False}).status_code == 200
    assert gen(base, 8).status_code == 200
    shutil.rmtree(d)
    r = post(base, "/stop_profile")
    assert r.status_code == 500 and "could not be written" in r.text, r.text
    # one that finishes by itself during a request: the request is whole, the next stop says it
    assert post(base, "/start_profile", {"output_dir": str(d), "num_steps": 2, "with_stack": False}).status_code == 200
    shutil.rmtree(d)
    g = gen(base, 40)
    assert g.status_code == 200 and g.json()["meta_info"]["completion_tokens"] == 40
    r = post(base, "/stop_profile")
    assert r.status_code == 500 and "could not be written" in r.text, r.text
    assert post(base, "/stop_profile").status_code == 400
    alive(url)


def test_start_step_is_the_servers_forward_count(url, tmp_path):
    """start_step far ahead: nothing starts within one request; a stop then ends the armed profile, no file."""
    base, _ = url
    assert post(base, "/start_profile", {"output_dir": str(tmp_path), "start_step": 10 ** 9}).status_code == 200
    assert gen(base, 16).status_code == 200
    assert post(base, "/stop_profile").status_code == 200
    assert traces(tmp_path) == []
    alive(url)


def test_by_stage_without_num_steps_writes_each_stage_once(url, tmp_path):
    """profile_by_stage with no num_steps over three requests: the prefill is recorded until decoding starts, the
    decode until the stop; no file is written twice (the second request's prefill replaced the first's file)."""
    base, _ = url
    assert post(base, "/start_profile", {"output_dir": str(tmp_path), "profile_by_stage": True,
                                         "with_stack": False}).status_code == 200
    digests = {}
    for _ in range(3):
        assert gen(base, 8).status_code == 200
        for f in traces(tmp_path):
            d = f.read_bytes()
            assert digests.setdefault(f.name, d) == d, f"{f.name} was written again"
    assert post(base, "/stop_profile").status_code == 200
    files = traces(tmp_path)
    assert [f.name.rsplit("-", 1)[1] for f in files] == ["DECODE.trace.json.gz", "EXTEND.trace.json.gz"]
    ext = next(f for f in files if "EXTEND" in f.name)
    assert ext.read_bytes() == digests[ext.name]  # the first request's prefill, untouched since
    assert "traceEvents" in json.loads(gzip.open(files[0], "rt").read())
    alive(url)


def test_a_bodiless_stop_as_curl_sends_it(url, tmp_path):
    """``curl -X POST .../stop_profile`` sends no body and no Content-Type: nothing to type, so it is taken (a body
    without a JSON type is still a 415)."""
    base, _ = url
    assert post(base, "/start_profile", {"output_dir": str(tmp_path), "with_stack": False}).status_code == 200
    assert gen(base, 4).status_code == 200
    r = requests.post(base + "/stop_profile", timeout=120)  # no data, no headers
    assert r.status_code == 200, r.text
    assert len(traces(tmp_path)) == 1
    r = requests.post(base + "/stop_profile", data=b"{}", timeout=30)  # a body, untyped
    assert r.status_code == 415, r.text
    alive(url)


def test_an_output_dir_that_is_a_file_or_a_link_loop_is_named_so(url, tmp_path):
    """output_dir naming a file or a symbolic link loop: a 400 saying which (it said only 'File exists')."""
    base, _ = url
    (tmp_path / "f").write_text("mine")
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    for name, says in (("f", "not a folder"), ("l1", "a symbolic link to no folder")):
        r = post(base, "/start_profile", {"output_dir": str(tmp_path / name)})
        assert r.status_code == 400 and says in r.text and "output_dir" in r.text, r.text
    assert (tmp_path / "f").read_text() == "mine" and post(base, "/stop_profile").status_code == 400
    alive(url)
