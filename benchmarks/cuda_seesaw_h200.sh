#!/usr/bin/env bash
# One device call (issue 15): the CUDA C++ seesaw prefix kernel (WsTuning.cuda): its GPU tests and the default
# kernel's, then split_ws (the default: CUDA at 64 heads, Gluon at 8; and VARIANTS, by default the Gluon kernel at
# 64 heads too) beside FlashMLA and FlashInfer fa3 at 64 and 8 heads, and the 61-layer step. Carry .peers.
#   OUT=... bash benchmarks/cuda_seesaw_h200.sh [CTX] [PEERS] [VARIANTS]
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 300 python -m pytest tests/test_kernels_gpu.py -x -k "cuda or (matches_reference and split_ws) or plan_reused or balanced" \
    -p no:cacheprovider 2>&1 | grep -E "passed|failed|Error|error" | tail -3
timeout 330 python benchmarks/bench_verify.py --quick --paths "split_ws,${2:-flashmla,flashinfer-fa3}" \
    --ws-variants "${3:-;cuda=0}" --ctx "${1:-1k,8k,32k,64k,128k}" \
    --heads 64,8 --out "${OUT:-.}/bench_verify_cuda.json" 2>&1 | grep -E "^ +ctx=|ceiling|step61|rror" | cut -c1-160
