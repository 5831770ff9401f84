"""Persistent compile caches (engine/compile_cache.py): the user's cache folder, the user's own variables kept,
and an Inductor FX-graph compiled in one process found in the cache by the next (real processes, real
torch.compile on the CPU)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddprobe.engine import compile_cache

ROOT = Path(__file__).resolve().parent.parent


def test_cache_folders_under_xdg_and_user_variables_win(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TRITON_CACHE_DIR": str(tmp_path / "mine")}
    set_ = compile_cache.enable(env)
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "mine") and "TRITON_CACHE_DIR" not in set_  # the user's
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "xdg" / "ddprobe" / "inductor")
    assert (tmp_path / "xdg" / "ddprobe" / "inductor").is_dir()
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    off = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}
    compile_cache.enable(off)
    assert off["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0"  # a user who turned it off keeps it off


def test_unwritable_cache_folder_keeps_the_defaults(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = {"XDG_CACHE_HOME": str(blocker)}
    set_ = compile_cache.enable(env)
    assert "TRITON_CACHE_DIR" not in env and "TORCHINDUCTOR_CACHE_DIR" not in env and set(set_) == set(
        compile_cache.SWITCHES)


CHILD = """
import sys
from ddprobe.engine import compile_cache
compile_cache.enable()
import torch
from torch._dynamo.utils import counters
f = torch.compile(lambda x: torch.sin(x) * 2 + 1, dynamic=False, fullgraph=True)
x = torch.arange(8.0)
assert torch.allclose(f(x), torch.sin(x) * 2 + 1)
print("hit", counters["inductor"]["fxgraph_cache_hit"], "miss", counters["inductor"]["fxgraph_cache_miss"])
"""


def test_a_second_process_reuses_the_compiled_graph(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_CACHE"))}
    env.update(XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    runs = [subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    for r in runs:
        if r.returncode != 0 and "C++ compile error" in r.stderr:
            pytest.skip("no working C++ compiler for Inductor's CPU backend here")
        assert r.returncode == 0, r.stderr[-2000:]
    assert runs[0].stdout.split() == ["hit", "0", "miss", "1"]
    assert runs[1].stdout.split() == ["hit", "1", "miss", "0"]  # compiled by the first process, found by the second
    assert any((tmp_path / "ddprobe" / "inductor").rglob("*"))


def test_a_refused_cuda_run_makes_no_cache_folder(tmp_path):
    """`--device cuda` where torch sees no GPU is refused before anything is written: the cache folders too."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the run would not be refused")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    for var in compile_cache.DIRS:
        env.pop(var, None)
    for cmd in (["commit", "--device", "cuda", "--ctx", "1k"], ["serve", "--device", "cuda", "--port", "39219"]):
        r = subprocess.run([sys.executable, "-m", "ddprobe", *cmd], env=env, capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
        assert r.returncode == 1 and "no CUDA GPU is visible to torch" in r.stderr, r.stderr
        assert not (tmp_path / "cache").exists()
