#!/usr/bin/env bash
# One device call (issue 15): the CUDA C++ seesaw prefix kernel (WsTuning.cuda=1): its GPU tests, then split_ws
# (default and cuda=1) beside FlashMLA and FlashInfer fa3 at 64 and 8 heads. Carry .peers.
#   OUT=... bash benchmarks/cuda_seesaw_h200.sh [CTX] [PEERS]
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 240 python -m pytest tests/test_kernels_gpu.py -q -x -k "cuda" -p no:cacheprovider 2>&1 | tail -4
timeout 300 python benchmarks/bench_verify.py --quick --no-step --paths "split_ws,${2:-flashmla,flashinfer-fa3}" \
    --ws-variants ";cuda=1" --ctx "${1:-1k,8k,32k,64k,128k}" --heads 64,8 --out "${OUT:-.}/bench_verify_cuda.json" 2>&1 \
    | grep -E "^ +ctx=|ceiling|rror" | cut -c1-160
