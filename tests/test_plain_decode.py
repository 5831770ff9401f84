"""Plain greedy decode as a static one-row step (graphs.DecodeStep) against the eager one-row loop, on CPU.

graphs=True on CPU runs the same fixed-shape function a GPU captures: one row through the verify path's device
plan, the row's token and position read from device buffers and advanced in place. Greedy tokens must equal the
eager loop's (host plans) and DDTree speculative decoding's, token for token, on both KV layouts with shuffled
slots and NaN-poisoned unused rows.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from ddprobe.engine import Engine

PROMPT = [int(t) for t in torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(7))]
N_NEW = 48


def engine(layout: str, graphs: bool, **kw) -> Engine:
    return Engine("tiny", kv_layout=layout, budget=4, dtype=torch.float64, seed=0, max_ctx=256, poison=True,
                  shuffle_slots=layout == "paged", graphs=graphs, **kw)


@pytest.fixture(scope="module")
def eager() -> dict:
    return {layout: engine(layout, False).greedy_reference(PROMPT, N_NEW) for layout in ("paged", "contiguous")}


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_static_decode_equals_eager_and_speculative(eager, layout):
    eng = engine(layout, True)
    seen = []
    toks = eng.greedy_reference(PROMPT, N_NEW, on_token=seen.append)
    assert toks == eager[layout] == eager["paged"]
    assert seen == toks and len(toks) == N_NEW
    assert eng.runner.decode is not None and eng.runner.decode.kv.committed == len(PROMPT) + N_NEW - 1
    assert eng.generate(PROMPT, N_NEW).tokens == toks  # greedy speculative == plain greedy


def test_decode_step_shares_the_static_cache_and_alternates(eager):
    eng = engine("paged", True)
    short = PROMPT[:9]
    ref_short = engine("paged", False).greedy_reference(short, 20)
    assert eng.generate(PROMPT, N_NEW).tokens == eager["paged"]
    r = eng.runner
    assert eng.greedy_reference(short, 20) == ref_short
    assert r.decode.kv is r.static.kv  # a request runs one or the other: one cache
    assert eng.generate(PROMPT, N_NEW).tokens == eager["paged"]
    assert eng.greedy_reference(PROMPT, N_NEW) == eager["paged"]
    kept = r.decode
    assert eng.greedy_reference(short, 5) == ref_short[:5] and r.decode is kept  # reused while it fits
    eng.release()
    assert r.decode is None and r.static is None


def test_decode_reads_of_poisoned_rows_raise():
    """A committed row turned to NaN after the first token: the next step's logits are not finite, and the
    step's finite flag (its one copy back) makes the decode raise."""
    eng = engine("contiguous", True)

    def spoil(tok):
        eng.runner.decode.kv.buffer[:, 3] = float("nan")

    with pytest.raises(RuntimeError, match="NaN in target logits"):
        eng.greedy_reference(PROMPT, 6, on_token=spoil)


def test_streaming_stop_propagates():
    eng = engine("paged", True)
    got = []

    def stop(tok):
        got.append(tok)
        if len(got) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        eng.greedy_reference(PROMPT, N_NEW, on_token=stop)
    assert len(got) == 3


def test_decode_step_past_its_capacity_raises():
    eng = engine("paged", True)
    eng.greedy_reference(PROMPT, 4)
    st = eng.runner.decode
    st.synthetic(st.capacity - 1)
    st.step()
    with pytest.raises(ValueError, match="beyond the cache"):
        st.step()


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_decode_function_never_touches_the_host(layout):
    """What the CUDA graph records: no tensor from Python data, no item() / nonzero()."""
    from test_engine_graphs import HOST_OPS, Seen

    eng = engine(layout, True)
    eng.greedy_reference(PROMPT, 4)
    st = eng.runner.decode
    st.synthetic(st.capacity // 2)
    with torch.no_grad(), Seen() as seen:
        st.run("decode")
    assert len(seen.ops) > 3
    assert not seen.ops & set(HOST_OPS), seen.ops & set(HOST_OPS)


SCRIPT = textwrap.dedent("""
    import torch
    from ddprobe.engine import Engine
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: the interpreter (run_triton_script sets it)
    prompt = [5, 17, 42, 9, 77, 3]
    ref = Engine("tiny", dtype=torch.float32, device=dev, max_ctx=128).greedy_reference(prompt, 10)
    for attn in ("paged", "split"):  # split_ws takes MLA rows of 512 + 64 only, not the tiny model's 64 + 32
        eng = Engine("tiny", attn=attn, budget=4, dtype=torch.float32, device=dev, poison=True, shuffle_slots=True,
                     max_ctx=128, graphs=True)
        assert eng.greedy_reference(prompt, 10) == ref, attn
        assert dev == "cpu" or eng.runner.decode.graphs, attn  # captured on CUDA
    print("ok")
""")


def test_triton_paths_through_the_decode_step(run_triton_script):
    """paged and split with a one-row device plan inside the decode step, tokens equal to the
    eager reference's (CPU: the interpreter, in a child process; CUDA: the kernels, graph-captured)."""
    run_triton_script(SCRIPT)


def test_plain_warmup_builds_the_decode_step_only(eager):
    eng = engine("paged", True)
    info = eng.warmup(plain=True)
    r = eng.runner
    assert info["what"] == "first step" and info["capacity"] == 256
    assert r.decode is not None and r.decode.capacity == 256 and r.static is None
    kept = r.decode
    assert eng.greedy_reference(PROMPT, N_NEW) == eager["paged"] and r.decode is kept  # no new step


def test_serve_no_spec_warms_the_plain_step_and_serves_plain_greedy():
    """`ddprobe serve --no-spec` in its own process: its warm-up is the plain decode step's, and /generate gives the
    engine's plain greedy tokens."""
    import os
    import subprocess
    import sys

    import requests

    from ddprobe.probes.backends.engine import EngineBackend
    from test_commit_probe import free_port, wait_up

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ddprobe.cli", "serve", "--no-spec", "--port", str(port), "--seed",
                             "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, proc)
        got = requests.post(url + "/generate", json={"input_ids": PROMPT, "sampling_params": {
            "max_new_tokens": 12, "temperature": 0}}, timeout=60).json()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert "warm-up" in out and "greedy" in out, out
    assert got["output_ids"] == EngineBackend(preset="tiny", seed=0).engine.greedy_reference(PROMPT, 12)
