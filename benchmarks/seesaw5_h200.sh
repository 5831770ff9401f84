#!/usr/bin/env bash
# One device call for WsTuning.seesaw=5 (issue 15: the seesaw with no loader warp, _ws_seesaw): GPU tests, the
# in-kernel timeline (seesaw_trace.py), the TMA delivery ceiling (tma_stream.py), then the bench beside the
# default (balanced and not) and FlashMLA.   Carry .peers.   OUT=... bash benchmarks/seesaw5_h200.sh
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 200 python -m pytest tests/test_kernels_gpu.py -q -x -k "${TESTS:-seesaw5}" -p no:cacheprovider 2>&1 | tail -2
timeout 100 python benchmarks/seesaw_trace.py --ctx 131072 --heads 64 2>&1 | tail -19
timeout 100 python benchmarks/tma_stream.py --ctx 131072 2>&1 | tail -11
timeout 200 python benchmarks/bench_verify.py --quick --no-step --paths split_ws,flashmla \
    --ws-variants "${VARIANTS:-;seesaw=5;balance=0}" --ctx "${CTX:-8k,32k,128k}" --heads "${HEADS:-64,8}" \
    --out "${OUT:-.}/bench_verify_seesaw5.json" 2>&1 | grep -E "^ +ctx=|ceiling" | cut -c1-150
