#!/usr/bin/env bash
# One device call (issue 15): WsTuning.seesaw=5 beside balance=0 (the same grid) at 64 heads, timed (bench_verify,
# with FlashMLA) and under ncu (warp stall reasons, tensor pipe, L2; benchmarks/ncu_variants.py).
#   Carry .peers.   OUT=... bash benchmarks/seesaw5_ncu_h200.sh
source benchmarks/peers_bundle.sh install > /tmp/peers_install.log 2>&1 || { echo "peers: $(tail -1 /tmp/peers_install.log)"; }
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 150 python benchmarks/bench_verify.py --quick --no-step --paths split_ws,flashmla \
    --ws-variants "${VARIANTS:-;seesaw=5;balance=0}" --ctx "${CTX:-32k,128k}" --heads 64 \
    --out "${OUT:-.}/bench_verify_seesaw5.json" 2>&1 | grep -E "^ +ctx=|ceiling" | cut -c1-150
M=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,smsp__average_warp_latency_per_inst_issued.ratio
timeout 300 ncu --clock-control none --profile-from-start off -k regex:ws_ --csv --section WarpStateStats --metrics $M \
  python benchmarks/ncu_variants.py --ctx 131072 --variants "${NCU_VARIANTS:-balance=0;seesaw=5}" \
  > $OUT/ncu_seesaw5.csv 2> $OUT/ncu_seesaw5.err
echo rc=$?; tail -2 $OUT/ncu_seesaw5.err
python3 - <<'PY'
import csv, os
rows = [r for r in csv.reader(open(os.environ["OUT"] + "/ncu_seesaw5.csv")) if len(r) > 10]
hdr = rows[0]; iid = hdr.index("ID"); im = hdr.index("Metric Name"); iv = hdr.index("Metric Value")
by = {}
for r in rows[1:]:
    by.setdefault(r[iid], {})[r[im]] = r[iv]
for k, d in by.items():
    print("launch", k)
    for m_, v in d.items():
        try:
            if float(v.replace(",", "")) == 0:
                continue
        except ValueError:
            pass
        print(f"  {m_} = {v}")
PY
