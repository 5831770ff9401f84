#!/usr/bin/env bash
# One device session: build, check, time. On the GPU machine, from the repository root:
#   OUT=<folder> bash benchmarks/device_run.sh            # everything (about 8 minutes on an H200)
#   OUT=<folder> QUICK=1 bash benchmarks/device_run.sh    # the gate's grid (examples/ci-gpu.yml's BENCH_ARGS)
#   OUT=<folder> ONLY=smoke bash benchmarks/device_run.sh # only the named steps (comma-separated)
# Steps (each one's log in $OUT/<step>.log, a failed step does not stop the next):
#   wheels  carried wheels from .whl/ (sglang 0.5.14 for SGLang's own kernels, the server's packages) into /tmp/site
#   peers   FlashMLA and FlashInfer from .peers/ (benchmarks/peers_bundle.sh build, made where there is network)
#   build   the split_ws CUDA cubin rebuilt with the device's nvcc when BUILD=1 (python -m ddprobe.engine.kernels._cu
#           --build); otherwise the shipped one is checked against its source by tests/test_cu.py
#   check   the GPU tests: tests/test_kernels_gpu.py, tests/test_cu.py, tests/test_engine_graphs.py,
#           tests/test_moe_fused.py, tests/test_tree_build.py
#   smoke   benchmarks/smoke.py: every user command with its defaults, each in a fresh process (commit as in the
#           README, gpu-util, diagnose, floor, advise, report, gate, bench verify --quick, serve + an openai request);
#           exit code, wall time and warm-up per command -> $OUT/smoke.md; fails on any non-zero exit
#   verify  ddprobe bench verify (every path and peer, 8 and 64 heads, the 61-layer step) -> $OUT/bench-verify.json;
#           $VERIFY_EXTRA is added to its arguments (e.g. VERIFY_EXTRA="--variant split_ws:part_bits=16")
#   engine  benchmarks/bench_engine.py (k2 and tiny decode steps, graphs vs eager, split_ws run() host time and
#           eager vs graph) -> $OUT/bench-engine.json
#   moe     benchmarks/bench_moe.py (one MoE layer per expert path) -> $OUT/bench-moe.json
#   anatomy benchmarks/bench_engine.py --anatomy (k2 with its MoE at 8k/32k/128k: the step's non-attention part
#           against its weight floor, the fitted marginal cost against the attention growth) -> $OUT/anatomy.json
#   commit  ddprobe commit on the shipped tiny pair -> $OUT/commit-tiny.json
#   advise  ddprobe advise with its defaults (k2 steps through sglang or paged and auto's path, the tiny pair's
#           commit lengths, plain decode measured) -> $OUT/advise.json
#   fixed   (only when ONLY names it) where split_ws's fixed part goes at 8 heads (issue 64): the tail kernel in a plan
#           sized for 128k at 8k to 128k (the same 128 programs with 1 to 16 tiles each) beside FlashMLA, and its tile
#           queue (tail_queue=1) where that knob's GPU tests pass first (fixed-tests), the step traced and read by
#           ddprobe trace -> $OUT/fixed.json, $OUT/fixed-trace/, $OUT/fixed-trace.log
# Last: a short table (each step's status and seconds, then the verify results at 128k).
set -u
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# the lent machine's image sets PYTHONDONTWRITEBYTECODE=1 and ships torch without __pycache__: every process would
# compile torch's Python sources again (about 10 s, 4.5 s of it in `import torch`), which a pip-installed torch
# never does. Bytecode goes to a folder of its own instead (the first process writes it).
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/ddprobe-pycache}
declare -a STATUS=()

step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log, record status and seconds, return the
          # command's status (skipped, status 0, unless NAME is in $ONLY, when set)
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]] && return 0
    echo "== $name: $*" | tee "$OUT/$name.log"
    timeout "$limit" "$@" >> "$OUT/$name.log" 2>&1
    rc=$?
    STATUS+=("$(printf '%-8s %-6s %5ss  %s' "$name" "$([ $rc = 0 ] && echo ok || echo rc=$rc)" $((SECONDS - t0)) "$OUT/$name.log")")
    tail -3 "$OUT/$name.log"
    return $rc
}

if [ -d .whl ]; then
    step wheels 180 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
if [ -d .peers ]; then
    step peers 120 bash -c 'source benchmarks/peers_bundle.sh install && python -c "import flash_mla" &&
        { [ ! -f .peers/flashinfer_slim.tgz ] || python -c "import flashinfer"; }'
    export PYTHONPATH=/tmp/peers:$PYTHONPATH
fi
[ "${BUILD:-0}" = 1 ] && step build 300 python -m ddprobe.engine.kernels._cu --build
step check 600 python -m pytest -q -x -p no:cacheprovider tests/test_kernels_gpu.py tests/test_cu.py \
    tests/test_engine_graphs.py tests/test_moe_fused.py tests/test_tree_build.py
step smoke 1500 python benchmarks/smoke.py --out "$OUT"
if [ "${QUICK:-0}" = 1 ]; then
    # the gate's own benchmark (examples/ci-gpu.yml's BENCH_ARGS): its output is a baseline candidate
    args=$(sed -n 's/^ *BENCH_ARGS: *//p' examples/ci-gpu.yml)
    [ -n "$args" ] || { echo "examples/ci-gpu.yml has no BENCH_ARGS line" >&2; exit 2; }
    step verify 500 python -m ddprobe bench verify $args ${VERIFY_EXTRA:-} --out "$OUT/bench-verify.json"
else
    step verify 900 python -m ddprobe bench verify ${VERIFY_EXTRA:-} --out "$OUT/bench-verify.json"
fi
step engine 600 python benchmarks/bench_engine.py --out "$OUT/bench-engine.json" $([ "${QUICK:-0}" = 1 ] && echo "--skip tiny")
step moe 300 python benchmarks/bench_moe.py --out "$OUT/bench-moe.json"
step anatomy 600 python benchmarks/bench_engine.py --anatomy --ctxs 8k,32k,128k --steps 12 --heads 8 \
    --out "$OUT/anatomy.json"
step commit 300 python -m ddprobe commit --ctx 1k,16k --json "$OUT/commit-tiny.json"
step advise 600 python -m ddprobe advise -o "$OUT/advise.json"
if [[ ",${ONLY:-}," == *",fixed,"* ]]; then
    queue=()
    ONLY=$ONLY,fixed-tests step fixed-tests 240 python -m pytest -q -x -p no:cacheprovider tests/test_kernels_gpu.py \
        -k "tail_queue or device_plan_replays or poisoned" \
        && queue=(--variant split_ws:bound=128k,tail=1,tail_queue=1 --step-variant split_ws:tail_queue=1)
    step fixed 480 python -m ddprobe bench verify --ctx 8k,16k,32k,64k,128k --heads 8 --paths split_ws,flashmla \
        --variant split_ws:bound=128k,tail=1 "${queue[@]}" --step-ctx 128k --step-trace "$OUT/fixed-trace" \
        --out "$OUT/fixed.json"
    ONLY=$ONLY,fixed-trace step fixed-trace 120 python -m ddprobe trace "$OUT/fixed-trace/step61-split_ws-131072-8h.json"
fi

echo
echo "step     status  time   log"
printf '%s\n' "${STATUS[@]}"
[ -f "$OUT/bench-verify.json" ] && python - "$OUT/bench-verify.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"\nverify at 128k (copy {d['ceilings']['copy_GBps']:.0f} GB/s)    us/layer or ms/step   x kernel floor")
for r in d["results"]:
    if r.get("ctx") != 131072:
        continue
    t = f"{r['us']:9.1f} us" if "us" in r else (f"{r['step_ms']:9.2f} ms" if "step_ms" in r else "        -   ")
    what = "step61" if r.get("kind") == "step61" else f"H={r['heads']:<3}"
    print(f"  {what} {r['path']:<24} {t}  {r.get('gap', float('nan')):5.2f}  {r.get('skipped', r.get('error', ''))[:60]}")
PY
