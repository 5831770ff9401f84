"""SGLang's own Triton kernels (the `sglang` path, from the installed wheel), ddprobe's `paged` rendering of them
and the fp32 reference, under Triton's CPU interpreter in fp16; the loader's refusals.

Tiny shapes (rows 256 latent + 32 rope, the width SGLang's kernels take as MLA besides 576 = 512 + 64; up to 300
columns) keep the interpreter quick. Slot layouts: shuffled (a random pool, slot 0 left as SGLang's padding slot,
rows the plan does not name poisoned with NaN) and contiguous. Tolerance: relative Frobenius error 3e-3 (fp16
outputs). Without an installed sglang the `sglang` cases skip with the install line (CI installs the pinned wheel).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from ddprobe.engine.kernels import PathUnavailable, get_path, reference  # noqa: E402
from ddprobe.engine.kernels import _sglang_import  # noqa: E402
from ddprobe.engine.kernels.trees import shape_mask  # noqa: E402

CHILD = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
V, PE, TOL = 256, 32, 3e-3
INTERPRETER_TIMEOUT = 900  # s, the child


def needs_kernels(test):
    """A kernel test under the interpreter (marker ``interpreter``: without a GPU it runs in the file's interpreter
    child, tests/conftest.py, and is reported by its id); not run on a GPU (fp16 shapes sized for the interpreter)."""
    on_gpu = pytest.mark.skipif(torch.cuda.is_available() and not CHILD, reason="interpreter-only (not run on a GPU)")
    return pytest.mark.interpreter(on_gpu(test))


def _path(name):
    try:
        return get_path(name)
    except PathUnavailable as e:
        pytest.skip(str(e))


def make(ctx, budget, heads, layout, shape="lopsided", seed=0, poison=5):
    g = torch.Generator().manual_seed(seed + ctx * 7 + budget * 3 + heads)
    r = budget + 1
    n, pool = ctx + r, ctx + r + poison
    slots = 1 + torch.randperm(pool - 1, generator=g)[:n] if layout == "shuffled" else torch.arange(n)
    kv = torch.full((pool, V + PE), float("nan"))
    kv[0] = 0.0  # SGLang's padding slot: masked lanes of its kernels read it
    kv[slots] = torch.randn(n, V + PE, generator=g)
    q = torch.randn(r, heads, V + PE, generator=g)
    mask = shape_mask(shape, budget) if budget else torch.ones(1, 1, dtype=torch.bool)
    return q.half(), kv.half(), slots, mask


def err_vs_reference(out, q, kv, ctx, mask, slots, scale=0.125):
    ref = reference.run(q, kv, reference.plan(ctx, mask, slots, V), scale)
    assert torch.isfinite(out).all(), "a poisoned row was read"
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@needs_kernels
@pytest.mark.parametrize("layout", ["shuffled", "contiguous"])
@pytest.mark.parametrize("ctx,budget,heads,shape", [(0, 8, 2, "lopsided"), (45, 8, 2, "fork"), (70, 4, 3, "star"),
                                                    (100, 0, 3, None), (300, 0, 20, None)])
def test_sglang_paged_and_reference_agree(layout, ctx, budget, heads, shape):
    """Tree verify (R > 1: SGLang's extend kernel) and plain decode (R = 1: its split-K MLA decode)."""
    q, kv, slots, mask = make(ctx, budget, heads, layout, shape or "chain")
    outs = {}
    for name in ("sglang", "paged"):
        m = _path(name)
        outs[name] = m.run(q, kv, m.plan(ctx, mask, slots, V, heads=heads), 0.125)
        err = err_vs_reference(outs[name], q, kv, ctx, mask, slots)
        assert err < TOL, f"{name} {layout} ctx={ctx} R={budget + 1} H={heads}: rel err {err:.2e}"
    gap = float((outs["sglang"].float() - outs["paged"].float()).norm() / outs["sglang"].float().norm())
    assert gap < TOL, f"sglang vs paged: rel diff {gap:.2e}"


@needs_kernels
@pytest.mark.parametrize("name", ["sglang", "paged"])
@pytest.mark.parametrize("budget", [6, 0])
def test_device_plan_refreshed_in_place(name, budget):
    """One device plan (bound 150) over growing contexts: prefix_t, slots and mask rewritten, then refresh()."""
    m, r, heads, bound = _path(name), budget + 1, 4, 150
    prefix_t = torch.zeros(1, dtype=torch.int32)
    mask_buf = torch.eye(r, dtype=torch.bool)
    slot_buf = torch.zeros(bound + r, dtype=torch.int64)
    plan = m.plan(prefix_t, mask_buf, slot_buf, V, heads=heads, max_prefix=bound)
    for ctx, shape in ((0, "star"), (37, "fork"), (150, "lopsided")):
        q, kv, slots, mask = make(ctx, budget, heads, "shuffled", shape, poison=bound - ctx + 5)
        prefix_t.fill_(ctx)
        slot_buf[: ctx + r] = slots
        mask_buf.copy_(mask)
        m.refresh(plan)
        err = err_vs_reference(m.run(q, kv, plan, 0.125), q, kv, ctx, mask, slots)
        assert err < TOL, f"{name} device plan ctx={ctx}: rel err {err:.2e}"


@needs_kernels
@pytest.mark.parametrize("heads", [1, 8, 16, 64])
def test_paged_decode_splits_are_sglangs(heads):
    """paged's split count (ddprobe's rendering) equals SGLang's get_num_kv_splits_triton, launched as SGLang's
    get_num_kv_splits launches it, for one request at lengths from 1 token to 1M."""
    from ddprobe.engine.kernels import paged

    k = _path("sglang").kernels()
    for sm in (4, 132):
        cap = paged.max_kv_splits(sm)
        for length in (1, 31, 64, 65, 1000, 8192, 32769, 131072, 1 << 20):
            seq = torch.tensor([length], dtype=torch.int32)
            got = torch.empty(1, dtype=torch.int32)
            k.get_num_kv_splits_triton[(1,)](got, seq, 1, 1, heads, 1, cap, sm, MAX_NUM_SEQ=256)
            assert int(paged.decode_splits(seq, heads, sm, cap)) == int(got), f"len {length} H={heads} sm={sm}"


def test_paged_launch_follows_sglangs_arch_table():
    from ddprobe.engine.kernels import paged

    assert paged.extend_blocks((9, 0)) == (32, 64, 8)  # H100/H200
    assert paged.extend_blocks((12, 0)) == (32, 32, 8)  # sm_120: small shared memory
    assert paged.extend_blocks((10, 0)) == (16, 64, 8)
    assert paged.extend_blocks((8, 0)) == (32, 64, 8) and paged.extend_blocks((8, 6)) == (32, 32, 8)
    assert paged.extend_blocks(None) == (32, 32, 8)
    assert paged.max_kv_splits(132) == 256 and paged.max_kv_splits(4) == 8 and paged.max_kv_splits(0) == 8
    assert paged.DEFAULT_TUNING.num_stages == 1


def _fake_sglang(tmp_path: Path, version: str, kdir: str, files: dict[str, str]) -> Path:
    """A package tree shaped like an installed sglang (its real layout, other code): for the loader's refusals."""
    root = tmp_path / "site" / "sglang"
    (root / kdir).mkdir(parents=True)
    (root / "__init__.py").write_text("raise ImportError('the server package must not be imported')\n")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    dist = tmp_path / "site" / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return root


def test_wrong_signature_is_refused_naming_the_version(tmp_path):
    k = "srt/layers/attention/triton_ops"
    root = _fake_sglang(tmp_path, "9.9.9", k, {
        f"{k}/extend_attention.py": "from sglang.srt.utils import is_cuda\ndef extend_attention_fwd(q, k, v):\n"
                                    "    pass\n",
        f"{k}/decode_attention.py": "def decode_attention_fwd(q):\n    pass\n",
        f"{k}/metadata.py": "get_num_kv_splits_triton = None\n"})
    with pytest.raises(_sglang_import.SGLangUnavailable) as e:
        _sglang_import.load_from(root)
    msg = str(e.value)
    assert "sglang 9.9.9" in msg and "extend_attention_fwd" in msg and "0.5.14" in msg and "\n" not in msg
    assert not [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]  # nothing left behind


def test_newer_layout_loads_with_its_sibling_imports_and_no_server(tmp_path):
    """0.5.23's layout: kernels/ops/attention/ files that import each other, sglang.srt.environ and
    sglang.srt.utils; the package __init__ (the server) never runs, and only these modules are served."""
    k = "kernels/ops/attention"
    ext = ("from sglang.kernels.ops.attention.decode_attention import helper\nfrom sglang.srt.environ import envs\n"
           "from sglang.srt.utils import is_cuda, is_hip, is_gfx95_supported\n"
           "def extend_attention_fwd(" + ", ".join(_sglang_import.EXTEND_ARGS) + ", **kw):\n    return envs\n")
    dec = ("def helper():\n    pass\ndef decode_attention_fwd(" + ", ".join(_sglang_import.DECODE_ARGS)
           + ", logit_cap=0.0, has_mla=False, use_pdl=False):\n    pass\n")
    meta = ("import triton\n@triton.jit\ndef get_num_kv_splits_triton(" + ", ".join(_sglang_import.SPLITS_ARGS)
            + "):\n    pass\n")
    root = _fake_sglang(tmp_path, "0.5.99", k, {f"{k}/extend_attention.py": ext, f"{k}/decode_attention.py": dec,
                                                f"{k}/metadata.py": meta, "srt/environ.py": "envs = 'real file'\n"})
    got = _sglang_import.load_from(root)
    assert got.version == "0.5.99" and got.folder.endswith(k)
    assert got.extend_attention_fwd(*range(len(_sglang_import.EXTEND_ARGS))) == "real file"
    assert not [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]
    (root / k / "extend_attention.py").write_text("import sglang.srt.server_args\n" + ext)
    with pytest.raises(_sglang_import.SGLangUnavailable, match="sglang.srt.server_args"):
        _sglang_import.load_from(root)


def test_not_installed_says_how_to_install():
    """With sglang unimportable (sys.modules['sglang'] = None, Python's own way to block a package), the engine
    and get_path refuse --attn sglang with one line naming the install command."""
    code = ("import sys; sys.modules['sglang'] = None\n"
            "from ddprobe.engine.kernels import get_path\n"
            "try:\n    get_path('sglang')\nexcept ValueError as e:\n    print('REFUSED', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])
    line = done.stdout.strip()
    assert line.startswith("REFUSED") and "pip install --no-deps sglang==0.5.14" in line and "\n" not in line, \
        done.stdout + done.stderr


@needs_kernels
def test_decode_shape_sglang_does_not_take_is_one_line():
    """SGLang's MLA decode takes V as wide as its K tile (576 / 512 or 288 / 256): other widths are refused."""
    m = _path("sglang")
    kv = torch.randn(20, 96).half()
    p = m.plan(10, torch.ones(1, 1, dtype=torch.bool), torch.arange(11), 64, heads=2)
    with pytest.raises(ValueError, match="576 with 512 values") as e:
        m.run(torch.randn(1, 2, 96).half(), kv, p, 0.1)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(CHILD, reason="compiles in the parent (no GPU needed)")
@pytest.mark.parametrize("cap", [(9, 0), (12, 0), (8, 0), (8, 9)])
def test_paged_compiles_to_sglangs_kernel(cap):
    """paged's tree-verify launch and SGLang's, compiled here for sm_90a (H100/H200), sm_120a, sm_80 and sm_89 with
    Triton's own compiler and ptxas from the arguments each launcher passes (k2 shapes: 8 heads, 9 rows, bf16,
    576-wide rows): the same launch configuration, the same global loads (PTX ld.global and SASS LDG, within 10%), the
    same registers, shared memory and spills; in fact the same PTX. Built for that GPU: shared memory within what it
    gives a block (split.arch_for), and no sm_90-only instruction off sm_90. No GPU: a fact of the code, not a timing."""
    pytest.importorskip("triton.backends.nvidia")
    from ddprobe.engine.kernels import _target_compile, paged, split

    _path("sglang")
    g = torch.Generator().manual_seed(1)
    ctx, budget, heads = 1000, 8, 8
    q = torch.randn(budget + 1, heads, 576, generator=g).bfloat16()
    kv = torch.randn(ctx + budget + 2, 576, generator=g).bfloat16()
    slots = 1 + torch.randperm(ctx + budget + 1, generator=g)
    launches = _target_compile.extend_launches(cap, q, kv, ctx, shape_mask("fork", budget), slots, 512, 0.1)
    rep, body = {}, {}
    for name, (fn, args, kw) in launches.items():
        k = _target_compile.compile_launch(fn, cap, args, kw)
        rep[name], body[name] = _target_compile.code_report(k), _target_compile.ptx_body(k)
        assert rep[name]["shared"] <= split.arch_for(cap).smem, (name, cap, rep[name])
        assert cap[0] == 9 or _target_compile.hopper_only(k) == [], (name, cap, _target_compile.hopper_only(k))
    s, p = rep["sglang"], rep["paged"]
    bm, bn, nw = paged.extend_blocks(cap)
    assert {k: launches["sglang"][2][k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")} == \
        {k: launches["paged"][2][k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")} == \
        {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": 1}
    assert s["ld_global"] > 50 and s["ldg"] > 50, s  # the kernel was really compiled and read
    for key in ("ld_global", "ldg", "stl", "ldl"):
        assert abs(p[key] - s[key]) <= 0.1 * s[key], f"sm_{cap[0]}{cap[1]} {key}: paged {p} vs sglang {s}"
    for key in ("regs", "shared", "num_warps", "num_stages"):
        assert p[key] == s[key], f"sm_{cap[0]}{cap[1]} {key}: paged {p} vs sglang {s}"
    assert body["paged"] == body["sglang"], "paged's PTX is no longer SGLang's instruction for instruction"


@pytest.mark.parametrize("name", ["paged", "sglang"])
def test_a_row_seeing_a_later_row_is_refused_in_one_line(name):
    """SGLang's extend kernel is causal over the new rows (a row block reads them up to its end): a host plan whose
    mask lets row 0 see row 40 (possible for no tree in parent-before-child order) is refused, not run wrong."""
    m = _path(name)
    mask = shape_mask("chain", 40)
    mask[0, 40] = True
    with pytest.raises(ValueError, match="earlier rows") as e:
        m.plan(10, mask, torch.arange(60))
    assert "\n" not in str(e.value)
    assert m.plan(10, shape_mask("chain", 40), torch.arange(60)).num_rows == 41  # the tree itself is taken
