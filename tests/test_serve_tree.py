"""`ddprobe serve --tree`: a real server on 127.0.0.1 serving one draft shape (tiny engine, CPU). A chain's greedy
output is plain greedy decoding's, token for token, with min(budget, L) drafts per step, and the server says chain
where it says its budget (/get_model_info); two shapes, an unknown one, or a shape without speculation are one
line and exit 1 before any engine is built."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

requests = pytest.importorskip("requests")
pytest.importorskip("uvicorn")

from test_commit_probe import free_port, wait_up  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
PROMPT = [(7 * i + 3) % 200 for i in range(24)]
N_NEW = 20


def serve(*args: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ddprobe", "serve", "--preset", "tiny", "--seed", "0", "--port",
                             str(port), *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return f"http://127.0.0.1:{port}", proc


@pytest.mark.parametrize("budget, nodes", [("8", 7), ("3", 3)])  # a chain's nodes: min(budget, L), L = 7 (tiny)
def test_serve_chain_is_plain_greedy_and_says_chain(budget, nodes):
    from ddprobe.probes.backends.engine import EngineBackend

    url, proc = serve("--tree", "chain", "--budget", budget)
    try:
        wait_up(url, proc)
        got = requests.post(url + "/generate", json={"input_ids": PROMPT, "sampling_params": {
            "max_new_tokens": N_NEW, "temperature": 0}}, timeout=120).json()
        info = requests.get(url + "/get_model_info", timeout=30).json()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert f"chain of {nodes} nodes" in out, out
    assert got["output_ids"] == EngineBackend(preset="tiny", seed=0).engine.greedy_reference(PROMPT, N_NEW)
    meta = got["meta_info"]
    assert meta["spec_num_proposed_drafts"] == nodes * meta["spec_verify_ct"]  # one node per depth, every step
    assert (info["speculative_tree"], info["speculative_budget"]) == ("chain", nodes)
    assert (info["engine"]["tree"], info["engine"]["budget"]) == ("chain", nodes)


@pytest.mark.parametrize("args, words", [
    (["--tree", "ddtree,chain"], "decodes with one draft shape, not ddtree, chain"),
    (["--tree", "bush"], "unknown tree shape 'bush'"),
    (["--tree", "chain", "--no-spec"], "--no-spec drafts nothing"),
])
def test_serve_refuses_a_shape_it_cannot_serve_in_one_line(args, words):
    r = subprocess.run([sys.executable, "-m", "ddprobe", "serve", "--port", str(free_port()), *args], env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and words in lines[0], r.stderr
