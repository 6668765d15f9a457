"""The benchmark scripts in tools/ run end to end (on a small table, nothing written to the docs)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_bench_precision_keeps_the_batching_block_and_the_sections_after_it():
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_precision

    text = "# generated\n\n<!-- batching:start -->\nB\n<!-- batching:end -->\n\n## By hand\n\nH\n"
    assert bench_precision.kept_sections(text) == "\n" + text[text.index("<!-- batching:start"):]
    assert bench_precision.kept_sections("# generated only\n") == ""
    kept = bench_precision.kept_sections()  # the file as it stands: its hand-written sections survive a rewrite
    assert "## RNNsearch's inference method" in kept and kept.count("<!-- batching:end -->") == 1


def test_bench_learning_converts_a_loaded_run_to_idle_time(tmp_path):
    """Validation k of a run that shared the machine is placed at k idle intervals, measured on
    a run of the same command alone; the BLEU at a time is the best reached by then."""
    import json

    sys.path.insert(0, str(ROOT / "tools"))
    import bench_learning

    def write_log(folder, records):
        folder.mkdir(parents=True)
        (folder / "train.log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    write_log(tmp_path / "idle", [{"step": 500 * k, "train_seconds": 40.0 + 60.0 * k, "valid_nll_token": 1.0}
                                  for k in (1, 2, 3)])
    assert bench_learning.idle_interval_seconds(tmp_path / "idle") == 60.0
    loaded = [{"step": 500 * k, "train_seconds": 500.0 * k, "valid_nll_token": 3.0 - k, "valid_bleu": b}
              for k, b in ((1, 10.0), (2, 30.0), (3, 25.0))]
    write_log(tmp_path / "modern", loaded)
    points = bench_learning.curve(tmp_path / "modern", 60.0)
    assert [p["minutes"] for p in points] == [1.0, 2.0, 3.0]
    assert bench_learning.bleu_at(points, 2.5) == 30.0 and bench_learning.bleu_at(points, 3.0) == 30.0
    assert bench_learning.bleu_at(points, 3.5) is None  # the run never got that far
    assert [p["minutes"] for p in bench_learning.curve(tmp_path / "modern", None)] == [500 / 60, 1000 / 60, 1500 / 60]
    assert bench_learning.bleu_cell(points, 2.5) == "30.0"
    assert bench_learning.bleu_cell(points, 3.5) == "≥ 30.0"  # stopped earlier: the best it kept

    # an ablation: a run whose command changed one setting, compared with modern at a common step
    standard = ["python", "-m", "phrase_scorer", "train", "--corpus", "a", "b", "--dev", "c", "d",
                "--arch", "rnnsearch", "--recipe", "modern", "--threads", "2", "--max-steps", "1000", "-o", "x",
                "--resume"]
    (tmp_path / "modern.command.json").write_text(json.dumps(standard))
    (tmp_path / "no-dropout.command.json").write_text(json.dumps(standard[:-1] + ["--dropout", "0", "--resume"]))
    write_log(tmp_path / "no-dropout", [{"step": 500 * k, "train_seconds": 1.0, "valid_nll_token": 3.5 - k,
                                         "valid_bleu": 5.0 * k, "valid_margin_pair": 1.0} for k in (1, 2)])
    for record in loaded:
        record["valid_margin_pair"] = 2.0
    write_log(tmp_path / "modern2", loaded)
    (tmp_path / "modern").rename(tmp_path / "modern-old")
    (tmp_path / "modern2").rename(tmp_path / "modern")
    runs = [tmp_path / "modern", tmp_path / "no-dropout"]
    assert bench_learning.changed_settings(tmp_path, runs[0]) == []
    assert bench_learning.changed_settings(tmp_path, runs[1]) == ["--dropout 0"]
    step, rows = bench_learning.ablation_rows(tmp_path, runs)
    assert step == 1000 and [r[:3] for r in rows] == [["modern", "the `modern` recipe", "30.00"],
                                                      ["no-dropout", "--dropout 0", "10.00"]]


def test_bench_rescore_counts_hypotheses_per_second_for_each_model_and_all(tmp_path, tiny_model,
                                                                          tiny_reverse_model):
    from conftest import SHARED_SYSTEM

    nbest = SHARED_SYSTEM / "val.nbest.gz"
    if not nbest.exists():
        pytest.skip(f"needs the shared Moses system's n-best list ({nbest})")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_rescore.py"), "--model", f"A={tiny_model}",
         "--reverse-model", f"B={tiny_reverse_model}", "--sentences", "3", "--threads", "1", "--repeats", "1",
         "--before", str(ROOT), "--work-dir", str(tmp_path)],  # this checkout as the earlier version too
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| ([\w +]+) \| 1 \| (before|after) \| ([\d,]+) \| ([\d.]+) \| ([\d,]+) \| [\d,]+ \| "
                      r"([\d.]+) \| ([\d.]+) \|$", result.stdout, re.M)
    assert [r[:2] for r in rows] == [("A", "before"), ("A", "after"), ("B", "before"), ("B", "after"),
                                     ("A + B", "before"), ("A + B", "after")]
    hypotheses = {int(r[2].replace(",", "")) for r in rows}
    assert len(hypotheses) == 1 and 3 <= hypotheses.pop() <= 300  # the first 3 sentences of a 100-best list
    assert all(int(r[4].replace(",", "")) > 0 for r in rows)
    rate = float(re.search(r"([\d.]+) GFLOP/s on 1 thread", result.stdout).group(1))
    for row in rows:  # the share divides the rate of forward FLOPs by the matmul rate
        assert float(row[5]) > 0 and float(row[6]) == pytest.approx(float(row[5]) / rate, abs=0.011)


def test_bench_rescore_compares_int8_with_fp32_for_each_model(tmp_path, tiny_model, tiny_reverse_model):
    from conftest import DATA

    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_rescore.py"), "--parts", "int8", "--model", f"A={tiny_model}",
         "--reverse-model", f"B={tiny_reverse_model}", "--nbest", str(DATA / "val.nbest.head.gz"), "--source",
         str(DATA / "val.tok.en.head"), "--sentences", "2", "--threads", "1", "--repeats", "1",
         "--work-dir", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    scores = re.findall(r"^\| (A|B) \| (forward|reverse) \| ([\d,]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
                        r"([\d.]+) \| ([\d.]+)% \|$", result.stdout, re.M)
    assert [r[:3] for r in scores] == [("A", "forward", "133"), ("B", "reverse", "133")]  # 2 sentences: 100 + 33
    for row in scores:
        mean, p99, largest, per_token = (float(v) for v in row[3:7])
        assert 0 < mean <= p99 <= largest < 2 and per_token < mean  # int8 moves every list a little
    speeds = re.findall(r"^\| (A|B) \| 1 \| ([\d,]+) \| ([\d,]+) \| ([\d.]+) \|$", result.stdout, re.M)
    assert [r[0] for r in speeds] == ["A", "B"] and all(float(r[3]) > 0 for r in speeds)


def test_shortlist_coverage_counts_the_tokens_outside_each_shortlist(tmp_path):
    train, held_out = tmp_path / "train.txt", tmp_path / "held.txt"
    train.write_text("a a a b b c\na b d\n", encoding="utf-8")  # a:4 b:3 c:1 d:1 (9 tokens)
    held_out.write_text("a e e\nc\n", encoding="utf-8")  # 4 tokens
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "shortlist_coverage.py"), str(train), str(held_out),
                             "--sizes", "1,2,3"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^\| (\d) \| ([\d.]+)% \| ([\d.]+)% \|$", result.stdout, re.M)
    # shortlist 1 keeps a (4/9), 2 adds b (7/9), 3 adds c (8/9: c before d alphabetically, as train ranks ties)
    assert rows == [("1", "44.4", "75.0"), ("2", "77.8", "75.0"), ("3", "88.9", "50.0")]


def test_bench_subwords_reports_every_candidate(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_subwords", ROOT / "tools" / "bench_subwords.py")
    bench = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(ROOT / "tools"))
    train = [line.split() for line in ["un homme en bleu", "une femme en rouge", "des hommes et des femmes"] * 30]
    row = bench.measure("sentencepiece bpe", train, [["un", "homme", "rouge"], ["femmes"]], 40, 1)
    assert row[0] == "sentencepiece bpe" and row[-1] == "yes"  # every word back byte for byte
    assert float(row[3]) >= 1.0  # pieces per word


def test_bench_gpu_rescores_and_trains_on_the_device_it_is_given(tmp_path, tiny_model, tiny_reverse_model):
    """The GPU benchmark's rescore and sentences parts, run on the CPU: a row per model set and
    batch size over the whole list, the device's scores compared with the CPU's."""
    data = ROOT / "tests" / "data"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_gpu.py"), "--device", "cpu", "--parts", "rescore,sentences",
         "--nbest", str(data / "val.nbest.head.gz"), "--source", str(data / "val.tok.en.head"),
         "--forward", str(tiny_model), "--reverse", str(tiny_reverse_model), "--ensemble", f"{tiny_model},{tiny_model}",
         "--rescore-batch-tokens", "8192,64", "--cpu-sentences", "2", "--threads", "1",
         "--corpus", str(data / "multi30k.train500.en.gz"), str(data / "multi30k.train500.fr.gz"),
         "--preset", "tiny", "--steps", "20", "--work-dir", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| (forward|reverse|ensemble of 2) \| ([\d,]+) \| ([\d,]+) \| [\d.]+ \| \*\*([\d,]+)\*\* \| "
                      r"n/a \|", result.stdout, re.M)
    assert [(r[0], r[1]) for r in rows] == [(m, t) for m in ("forward", "reverse", "ensemble of 2")
                                            for t in ("8,192", "64")]
    lines = sum(1 for _ in gzip.open(data / "val.nbest.head.gz"))
    assert all(int(r[2].replace(",", "")) == lines and int(r[3].replace(",", "")) > 0 for r in rows)
    between = [float(x) for x in re.findall(r"the batch sizes' scores differ by at most ([\d.e+-]+) nats",
                                            result.stdout)]
    versus_cpu = [float(x) for x in re.findall(r"differs from the CPU's by at most ([\d.e+-]+) nats", result.stdout)]
    assert len(between) == len(versus_cpu) == 3
    assert all(0 <= d < 1e-3 for d in between + versus_cpu)  # one model, batched differently: fp32 sums only
    assert re.search(r"\*\*\d+ s per 500 updates\*\* with a validation", result.stdout)


def test_bench_stages_reports_start_up_and_a_stage_table_per_command(tmp_path):
    """The batch scorer's stage benchmark on a tiny model: a start-up row and a stage row for
    annotate and for rescore, with the stage table's columns, and operators counted."""
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_stages

    data = ROOT / "tests" / "data"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_stages.py"), "--device", "cpu", "--presets", "tiny",
         "--lines", "2000", "--hypotheses", "2000", "--batch-tokens", "1024", "--table", str(EXAMPLE_TABLE),
         "--nbest", str(data / "val.nbest.head.gz"), "--source", str(data / "val.tok.en.head"),
         "--work-dir", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    tables = [block for block in result.stdout.split("\n\n") if block.startswith("| command | preset |")]
    stage = next(t for t in tables if "| host µs/pair |" in t).splitlines()
    assert stage[0] == "| " + " | ".join(bench_stages.STAGE_COLUMNS) + " |"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in stage[2:]]
    assert [r[:2] for r in rows] == [["annotate", "tiny"], ["rescore", "tiny"]]
    for row in rows:
        assert len(row) == len(bench_stages.STAGE_COLUMNS)
        values = dict(zip(bench_stages.STAGE_COLUMNS, row))
        assert float(values["batch ms"]) > 0 and float(values["host µs/pair"].strip("*")) >= 0
        # the workers of both commands plan the batches (tries included): the main thread builds no trie
        assert float(values["host: tries"]) == 0
        assert int(values["ops/1k pairs"].strip("*").replace(",", "")) > 0
        assert values["device share"].endswith("%")
    start = next(t for t in tables if "| steady pairs/s |" in t).splitlines()
    assert start[0] == "| " + " | ".join(bench_stages.START_COLUMNS) + " |"
    pairs = [int(line.split("|")[3].strip().replace(",", "")) for line in start[2:]]
    assert pairs[0] == 2000 and 2000 <= pairs[1] < 2300  # the list repeated up to a whole sentence past 2,000
    # bench_versions on the inputs bench_stages left: two versions (here both this checkout) command by command
    rows = tmp_path / "versions.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_versions.py"), "--before", str(ROOT), "--work-dir",
         str(tmp_path), "--device", "cpu", "--presets", "tiny", "--batch-tokens", "1024", "--json", str(rows)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(rows.read_text())
    assert [(r["command"], r["version"], r["rc"]) for r in measured] == [
        ("annotate", "before", 0), ("annotate", "now", 0), ("rescore", "before", 0), ("rescore", "now", 0)]
    assert [r["pairs"] for r in measured] == [2000, 2000, pairs[1], pairs[1]]
    assert '"differing_lines": 0' in result.stdout


def test_reranker_curve_prints_a_kept_budget_row_again_instead_of_building_it(tmp_path):
    """A budget whose test set was scored keeps its row: the models have trained on past it since,
    so building it again would measure a larger budget under its name. Nothing is built here (no
    Moses system exists: a build would fail)."""
    work = tmp_path / "work"
    (work / "curve").mkdir(parents=True)
    references = tmp_path / "test.fr"
    references.write_text("un chat noir\nune maison\n", encoding="utf-8")
    (work / "curve" / "test.moses").write_text("un chat noir\nune maison bleue\n", encoding="utf-8")
    row = "| 1 h | forward 10 | 0.01 | Forward | 99.00 (+1.00) | 99.00 | 0.001 |"
    (work / "curve" / "row.budget1.json").write_text(json.dumps({"row": row}), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "reranker_curve.py"), "--system", str(tmp_path / "absent.ini"),
         "--corpus", "a", "b", "--tuning-set", "c", "d", "--test", str(tmp_path / "test.en"), str(references),
         "--lang", "fr", "--work", str(work), "--budgets", "1"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (work / "curve.md").read_text(encoding="utf-8")
    assert row in table and "| Moses 1-best |" in table


def test_bench_stages_counts_a_paused_process_as_no_load():
    """A run of this package stopped with SIGSTOP (paused while a benchmark runs) does not mark the
    benchmark's machine as shared; the same process running does."""
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_stages

    marker = "phrase_scorer-paused-marker"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    try:
        assert marker in bench_stages.machine_load()[1]
        proc.send_signal(signal.SIGSTOP)
        while Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "T":
            time.sleep(0.01)  # the signal is delivered asynchronously: wait for the state to say so
        assert marker not in bench_stages.machine_load()[1]
    finally:
        proc.kill()
        proc.wait()


def test_bench_side_by_side_times_each_build_configuration_on_one_clock(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name, source in (("train", "multi30k.train2000"), ("val", None)):
        for lang in ("en", "fr"):
            if source:
                lines = gzip.open(ROOT / "examples" / f"{source}.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
            else:
                lines = (ROOT / "examples" / f"dev.{lang}").read_text(encoding="utf-8").splitlines()
            lines = lines[:240] if source else lines[:20]
            with gzip.open(data / f"{name}.tok.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_side_by_side.py"),
         "--builds", "transformer:1,rnnsearch:1+transformer:1", "--steps", "3", "--data", str(data),
         "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    timed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [(r["configuration"], r["trainings"], r["threads"]) for r in timed] == [
        ("transformer:1", 1, os.cpu_count() or 1), ("rnnsearch:1+transformer:1", 2, max(1, (os.cpu_count() or 1) // 2))]
    row = r"^\| ([\w: +]+) \| (\d) \| \d+ \| [\d, /]+ \| \*\*([\d,]+)\*\* \| ([\d.]+) \|$"
    rows = re.findall(row, result.stdout, re.M)
    assert [r[0] for r in rows] == ["transformer:1", "rnnsearch:1 + transformer:1"]
    for (_, trainings, total, hours), r in zip(rows, timed):
        # the build's 8,000 updates of 80 pairs for each training, at the configuration's rate in all
        assert float(hours) == pytest.approx(int(trainings) * 8000 * 80 / r["total"] / 3600, abs=0.006)
        assert int(total.replace(",", "")) == round(r["total"])
    wrong = (("rnnsearch", "is not ARCH:COUNT"), ("transformer:1,transfomer:2", "is not an architecture"))
    for builds, message in wrong:
        # refused before any training starts, a later configuration too
        refused = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_side_by_side.py"), "--builds", builds,
                                  "--data", str(data)], capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
        assert refused.returncode != 0 and message in refused.stderr
        assert not [line for line in refused.stdout.splitlines() if line.startswith("{")]
