#!/usr/bin/env bash
# The CLI on an H200 with the defaults: the engine at GPU speed (issue 13) seen through the user's commands.
# gpu-util on split and paged at 32k (k2, 8 heads, bf16, graphs on by default on cuda), then the commit probe
# on the tiny preset (device auto) twice: the first run's first cell must be within 10% of the same cell of the
# second run (warm-up stays outside the measured cells).
# Usage on the device: OUT=<folder> bash benchmarks/cli_h200_check.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
run() { echo "+ $*"; "$@" 2>&1; echo "exit $?"; }
run python -m ddprobe gpu-util --attn split --prompt-len 32k --decode-tokens 100 --json "$OUT/gpu-util-split-32k.json"
run python -m ddprobe gpu-util --attn paged --prompt-len 32k --decode-tokens 32 --json "$OUT/gpu-util-paged-32k.json"
run python -m ddprobe commit --ctx 1k,4k,16k --json "$OUT/commit-tiny-h200.json"
run python -m ddprobe commit --ctx 1k,4k,16k --json "$OUT/commit-tiny-h200-again.json"
