#!/usr/bin/env bash
# One device call (issue 15): the split_ws default (balanced grid, ffma) beside FlashMLA and FlashInfer fa3 at 64
# and 8 heads, 1k-128k, with the 61-layer step; then the GPU tests of the default kernel. Carry .peers.
#   OUT=... bash benchmarks/final_h200.sh
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 360 python benchmarks/bench_verify.py --quick --paths split_ws,flashmla,flashinfer-fa3 \
    --ctx 1k,8k,32k,64k,128k --heads 64,8 --out "${OUT:-.}/bench_verify_final.json" 2>&1 \
    | grep -E "^ +ctx=|ceiling|step61" | cut -c1-150
timeout 200 python -m pytest tests/test_kernels_gpu.py -q -x -k "matches_reference and split_ws or ffma" \
    -p no:cacheprovider 2>&1 | tail -2
