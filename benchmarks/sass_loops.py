"""Barriers, mbarrier operations and MMAs in the main loops of a kernel's SASS, read offline (no GPU needed).

    # split_ws's prefix kernel, compiled for sm_90a here (benchmarks/compile_ws_sm90.py writes ws.cubin)
    TRITON36=/tmp/t36 python benchmarks/compile_ws_sm90.py --pipe 0 --fold 1 --out /tmp/ws
    python benchmarks/sass_loops.py /tmp/ws/ws.cubin --func ws_prefix
    # FlashMLA's dense sm90 decode kernel, from the sgl-flash-mla wheel that benchmarks/peers_bundle.sh fetches
    unzip -o -q .peers/whl/sgl_flash_mla-*.whl -d /tmp/fm && (cd /tmp/fm && cuobjdump -xelf all flash_mla/_C_legacy.abi3.so)
    python benchmarks/sass_loops.py /tmp/fm/_C_legacy.abi3.165.sm_90.cubin --func 'dense.*bfloat16_tELi576'
    python benchmarks/sass_loops.py CUBIN --func REGEX --range 0x5200 0x8280     # one loop, in order

For each matching function: its instruction counts by class, then every innermost loop that issues wgmma (a
conditional backward branch whose body holds HGMMA and no other such loop), with the same counts; with --range, the
synchronization, memory and MMA instructions of that address range in program order. cuobjdump is taken from
$TRITON36's Triton (triton/backends/nvidia/bin) when set, else from PATH. A missing file or tool is one line and
exit 1.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

CLASSES = ("BAR.SYNC", "BAR.ARV", "SYNCS.ARRIVE", "SYNCS.PHASECHK", "HGMMA", "WARPGROUP.ARRIVE",
           "WARPGROUP.DEPBAR", "UTMALDG", "STS", "STSM", "LDS", "SHFL", "MUFU.EX2")
SHOWN = ("BAR", "SYNCS", "STS", "STSM", "LDS", "HGMMA", "WARPGROUP", "UTMALDG", "BRA")


def cuobjdump() -> str | None:
    root = os.environ.get("TRITON36")
    if root:
        p = os.path.join(root, "triton", "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(p):
            return p
    return shutil.which("cuobjdump")


def functions(tool: str, cubin: str) -> dict[str, list[tuple[int, str]]]:
    out = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    funcs: dict[str, list[tuple[int, str]]] = {}
    cur = None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur:
            funcs[cur].append((int(m.group(1), 16), m.group(2).strip()))
    return funcs


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def count(body) -> dict[str, int]:
    c = collections.Counter()
    for _, ins in body:
        op = opcode(ins)
        for k in CLASSES:
            if op == k or op.startswith(k + "."):
                c[k] += 1
                break
    return {k: c[k] for k in CLASSES if c[k]}


def mma_loops(ins):
    """(start, end, body) of each conditional backward branch whose body issues HGMMA and holds no smaller such
    loop (the unconditional ones jump back from the out-of-line retry stubs of mbarrier waits)."""
    loops = []
    for addr, i in ins:
        m = re.search(r"^@!?U?P\w+\s+BRA\b.*?0x([0-9a-f]+)", i)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            body = [(a, x) for a, x in ins if lo <= a <= addr]
            if any(opcode(x).startswith("HGMMA") for _, x in body):
                loops.append((lo, addr, body))
    return [lp for lp in loops if not any(o is not lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cubin")
    ap.add_argument("--func", required=True, help="regular expression on the (mangled) function name")
    ap.add_argument("--range", nargs=2, metavar=("LO", "HI"), help="print this address range in program order")
    a = ap.parse_args()
    tool = cuobjdump()
    if tool is None:
        print("sass_loops: no cuobjdump (set TRITON36 to a Triton 3.6 install, or put CUDA's on PATH)")
        return 1
    if not os.path.isfile(a.cubin):
        print(f"sass_loops: no such file {a.cubin}")
        return 1
    found = 0
    for name, ins in functions(tool, a.cubin).items():
        if not re.search(a.func, name):
            continue
        found += 1
        print(f"{name[:100]}: {len(ins)} instructions {count(ins)}")
        if a.range:
            lo, hi = (int(x, 16) for x in a.range)
            last = None
            for addr, i in ins:
                op = opcode(i)
                if lo <= addr <= hi and op.split(".")[0] in SHOWN and not (op.startswith("HGMMA") and last == "HGMMA"):
                    print(f"  {addr:#07x} {i[:110]}")
                    last = op.split(".")[0]
            continue
        for lo, hi, body in mma_loops(ins):
            print(f"  loop {lo:#x}-{hi:#x}: {len(body)} instructions {count(body)}")
    if not found:
        print(f"sass_loops: no function matching {a.func!r} in {a.cubin}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
