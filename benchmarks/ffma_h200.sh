#!/usr/bin/env bash
# One device call for WsTuning.ffma (issue 15): GPU tests, then the bench beside the default and FlashMLA.
# Carry .peers.   OUT=... bash benchmarks/ffma_h200.sh
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 240 python -m pytest tests/test_kernels_gpu.py -q -x -k "ffma" -p no:cacheprovider 2>&1 | tail -3
timeout 330 python benchmarks/bench_verify.py --quick --no-step --paths split_ws,flashmla \
    --ws-variants ";ffma=0" --ctx 1k,8k,32k,64k,128k --heads 64,8 \
    --out "${OUT:-.}/bench_verify_ffma.json" 2>&1 | grep -E "^ +ctx=|ceiling" | cut -c1-150
