"""The benchmark scripts in tools/ run end to end (on a small table, nothing written to the docs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import EXAMPLE_TABLE, ROOT


def test_bench_annotate_measures_every_strategy_and_the_floor(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_annotate.py"), "--table", str(EXAMPLE_TABLE), "--lines", "300",
         "--presets", "tiny", "--threads", "1", "--work-dir", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| tiny \| initial \| ([\w-]+) \| ([\d,]+) \|.*\| ([\d,]*) \| [\d,]+ \|$", result.stdout, re.M)
    assert [r[0] for r in rows] == ["scorer", "no-sharing", "naive", "annotate"]
    floors = {strategy: floor for strategy, _, floor in rows}
    assert floors["scorer"] and floors["no-sharing"] and not floors["naive"]  # the floor is the scorers'
    scorer, floor = (float(x.replace(",", "")) for x in re.search(
        r"the scorer runs at ([\d,]+) pairs/s, [\d.]+ of its floor \(([\d,]+) pairs/s\)", result.stdout).groups())
    assert scorer > 0 and floor > 0  # (how they compare is a measurement on a possibly busy machine, not checked)


def test_bench_precision_batching_compares_each_batching_with_its_reference(tiny_model):
    import json

    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_precision.py"), "--batching", "--model", str(tiny_model),
         "--table", str(EXAMPLE_TABLE), "--lines", "300", "--repeats", "1"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["dtype"] for r in rows] == ["fp32"] * 6 + ["fp64"] * 6 + ["fp32 vs fp64"]
    assert all(r["lines"] == 300 for r in rows)
    for reference in (rows[0], rows[6]):  # the same batching twice gives the same bits
        assert reference["batching"].startswith("reference") and reference["differ"] == reference["max_abs"] == 0
    assert rows[-1]["differ"] > 0 and 0 < rows[-1]["max_abs"] < 1e-3  # fp32 is not fp64, but close
    assert "## Batching: how much a pair's fp32 score depends on its neighbours" in result.stdout
