#!/usr/bin/env bash
# One device call (issue 15): schedule variants of the CUDA seesaw (cubins built with the source's DDP_* macros into
# .cuvar/, carried): for each, the seesaw GPU tests, then 64 heads at CTX beside FlashMLA (first variant only).
#   OUT=... bash benchmarks/cuda_variants_h200.sh "base spread base:0 base:3" 32k,128k
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
peers=",flashmla"
for spec in ${1:-base}; do
  v=${spec%%:*}; promo=${spec#*:}; [ "$promo" = "$spec" ] && promo=""
  export DDPROBE_CU_CUBIN=$PWD/.cuvar/$v.cubin DDPROBE_CU_L2PROMO=$promo
  v=$v${promo:+_l2promo$promo}
  [ -n "$promo" ] && echo "== $v (same cubin: tests not repeated)" || echo "== $v: $(timeout 120 python -m pytest tests/test_kernels_gpu.py -q -x -k "cuda_seesaw_matches or cuda_seesaw_tree" -p no:cacheprovider 2>&1 | tail -1)"
  timeout 150 python benchmarks/bench_verify.py --quick --no-step --paths "split_ws$peers" --ws-variants "cuda=1" \
      --ctx "${2:-32k,128k}" --heads "${3:-64}" --out "${OUT:-.}/bench_cuda_$v.json" 2>&1 | grep -E "^ +ctx=|rror" | cut -c1-130
  peers=""
done
