#!/usr/bin/env bash
# One device call (issue 15): split_ws's balanced grid and its row-block grid under ncu at 64 heads, 32k-128k
# (benchmarks/ncu_variants.py), the prefix kernel alone; prints one line of metrics per launch (0-1: 32k balanced,
# rows; 2-3: 64k; 4-5: 128k) and leaves the CSV in $OUT/ncu_balance.csv.
#   OUT=... bash benchmarks/ncu_balance_h200.sh
set +e
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_active.min,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,launch__grid_size
timeout 400 ncu --clock-control none --profile-from-start off -k regex:ws_prefix --csv --metrics $M \
  python benchmarks/ncu_variants.py --ctx 32768,65536,131072 --variants "balance=1;balance=0" > $OUT/ncu_balance.csv 2> $OUT/ncu_balance.err
echo rc=$?; grep -v '^"ID"' $OUT/ncu_balance.csv | grep -v '^==' | head -5; tail -3 $OUT/ncu_balance.err
python3 - <<'PY'
import csv, os
rows = [r for r in csv.reader(open(os.environ["OUT"] + "/ncu_balance.csv")) if len(r) > 10]
hdr = rows[0]; iid = hdr.index("ID"); im = hdr.index("Metric Name"); iv = hdr.index("Metric Value")
by = {}
for r in rows[1:]:
    by.setdefault(r[iid], {})[r[im]] = r[iv]
for k, d in by.items():
    print(k, " ".join(f"{m.split('.')[0].split('__')[-1]}{'.'+m.split('.')[1] if m.count('.') else ''}={v}" for m, v in d.items()))
PY
