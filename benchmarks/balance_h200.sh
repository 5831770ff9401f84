#!/usr/bin/env bash
# One device call for WsTuning.balance (issue 15): GPU tests of the balanced grid, then the bench of the default
# (balanced where it applies) beside balance=0 (row blocks x splits) and the peers. Carry .peers.
#   OUT=... bash benchmarks/balance_h200.sh [PEERS]      # PEERS default: flashmla,flashinfer-fa3
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 240 python -m pytest tests/test_kernels_gpu.py -q -x -k "balanced or poisoned_partials or handoff" \
    -p no:cacheprovider 2>&1 | tail -4
timeout 330 python benchmarks/bench_verify.py --quick --no-step --paths "split_ws,${1:-flashmla,flashinfer-fa3}" \
    --ws-variants ";balance=0" --ctx 1k,8k,32k,64k,128k --heads 64,8 \
    --out "${OUT:-.}/bench_verify_balance.json" 2>&1 | grep -E "^ +ctx=|ceiling" | cut -c1-150
