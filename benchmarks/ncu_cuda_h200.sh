#!/usr/bin/env bash
# One device call (issue 15): split_ws's default at 64 heads (the CUDA seesaw prefix kernel and the merge) beside
# FlashMLA under Nsight Compute, one launch of each at CTX (default 65536, the context where the two tie).
# Carry .peers.   OUT=... bash benchmarks/ncu_cuda_h200.sh [CTX]
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
O=${OUT:-.}; C=${1:-65536}
ncu --query-metrics > /tmp/q.txt 2>/dev/null; M=$(python3 benchmarks/ncu_64h_peers.py --pick-metrics /tmp/q.txt 2>/dev/null)
timeout 400 ncu --clock-control none --profile-from-start off --nvtx --import-source no \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --metrics "$M" -f -o /tmp/ncu python3 benchmarks/ncu_64h_peers.py --ncu --ctx "$C" \
    > "$O/ncu_log.txt" 2>&1; echo "ncu rc=$?"
ncu -i /tmp/ncu.ncu-rep --page raw --csv --print-units base > "$O/ncu_raw.csv" 2>&1
ncu -i /tmp/ncu.ncu-rep --page details --print-units base > "$O/ncu_details.txt" 2>&1
python3 - "$O/ncu_raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]
want = ["Kernel Name", "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second", "launch__grid_size",
        "launch__registers_per_thread", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "lts__t_sector_hit_rate.pct",
        "dram__bytes_read.sum", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio"]
idx = [hdr.index(w) if w in hdr else None for w in want]
for r in rows[2:]:
    print(" | ".join((r[i][:40] if i is not None else "-") for i in idx))
PY
