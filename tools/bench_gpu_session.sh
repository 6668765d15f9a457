#!/usr/bin/env bash
# Every measurement of the batch scorer on a GPU in one run, for a machine lent for a few minutes:
#
#   tools/bench_gpu_session.sh TABLE NBEST SOURCE OUT [BEFORE_CHECKOUT]
#
# TABLE: a phrase-table.gz; NBEST and SOURCE: a Moses n-best list and the sentences it was
# decoded from (gzip or plain); OUT: a folder for the logs and the updated docs/benchmarks.md;
# BEFORE_CHECKOUT (optional): a folder holding an older phrase_scorer package to compare whole
# commands with (git archive COMMIT phrase_scorer | tar -x -C BEFORE_CHECKOUT).
#
# In order: the GPU tests (tests/test_gpu.py), tools/bench_stages.py --device cuda --write
# (5,000,000 lines, 500,000 hypotheses; set LINES and HYPOTHESES for others), and with
# BEFORE_CHECKOUT tools/bench_versions.py on the first 2,000,000 lines of the same table. DEVICE
# (default cuda) runs the same on another device, to try the script.
set -u
if [ $# -lt 4 ]; then
    sed -n '2,15p' "$0"
    exit 2
fi
table=$1 nbest=$2 source=$3 out=$4 before=${5:-}
device=${DEVICE:-cuda}
here=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$out/work}
mkdir -p "$out" "$work"
cd "$here" || exit 1
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
status=0

if [ "$device" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv 2>&1 | tee "$out/gpu.txt"
fi
"$python" -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15 | tee "$out/test_gpu.txt"

"$python" tools/bench_stages.py --device "$device" --lines "${LINES:-5000000}" --hypotheses "${HYPOTHESES:-500000}" \
    --table "$table" --nbest "$nbest" --source "$source" --work-dir "$work" --write > "$out/stages.txt" 2>&1 \
    || { echo "bench_stages failed: $out/stages.txt"; status=1; }
grep -A8 '^| command | preset | pairs |' "$out/stages.txt"
grep -A6 '^Against the' "$out/stages.txt"
cp docs/benchmarks.md "$out/benchmarks.md"

if [ -n "$before" ]; then
    first=$work/table-2000000.gz
    [ -e "$first" ] || gzip -dc "$table" | head -n 2000000 | gzip -1 > "$first"
    "$python" tools/bench_versions.py --before "$before" --work-dir "$work" --device "$device" --table "$first" \
        --json "$out/versions.json" 2>&1 | tee "$out/versions.txt" || status=1
fi
exit $status
