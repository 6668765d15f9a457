"""The scaled-out annotate: bulk window parsing, worker processes, shards under torchrun, and
resuming whatever an earlier attempt left behind."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import A_MAN_TABLE, EXAMPLE_TABLE, head_lines
from phrase_scorer.scoring.annotate import annotate
from phrase_scorer.scoring.annotate_work import ByteIds, WindowWork, WorkerScoring
from phrase_scorer.config import AnnotateOptions, RunOptions, ScoringOptions
from phrase_scorer.runtime.distributed import shard_lines
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.runtime.workers import WorkerPool
from phrase_scorer.io.phrase_table import PhraseTableReader
from phrase_scorer.io.table_windows import RawWindow, RawWindows, count_lines, parse_window
from phrase_scorer.vocab import UNK_ID

TORCHRUN = Path(sys.executable).with_name("torchrun")


# --- windows and bulk parsing ---------------------------------------------------------------------


def test_windows_are_cut_at_fixed_lines_of_the_file(tmp_path):
    table = tmp_path / "t.gz"
    lines = [f"w{i} ||| x{i} ||| 1\n".encode() for i in range(23)]
    table.write_bytes(gzip.compress(b"".join(lines)[:-1]))  # the last line has no newline
    assert count_lines(table) == 23
    whole = list(RawWindows(table, 5))
    assert [(w.index, w.first_line, w.lines) for w in whole] == [(0, 1, 5), (1, 6, 5), (2, 11, 5), (3, 16, 5),
                                                                 (4, 21, 3)]
    assert b"".join(w.data for w in whole) == b"".join(lines)[:-1]
    # a run starting or stopping inside a window keeps the same boundaries after it
    part = list(RawWindows(table, 5, start=7, stop=18))
    assert [(w.index, w.first_line, w.lines) for w in part] == [(1, 8, 3), (2, 11, 5), (3, 16, 3)]
    assert b"".join(w.data for w in part) == b"".join(lines[7:18])
    with pytest.raises(PhraseScorerError, match="has only 23 lines, fewer than the 30 already done"):
        list(RawWindows(table, 5, start=30))


def window_of(data: bytes, first_line: int = 1) -> RawWindow:
    return RawWindow(0, first_line, data.count(b"\n") + (not data.endswith(b"\n")), data)


def reader_outcome(path: Path, data: bytes):
    """What the line-by-line reader makes of ``data``: its lines, or its error."""
    path.write_bytes(data)
    try:
        return [(l.raw, l.eol, [w.encode() for w in l.source_words], [w.encode() for w in l.target_words])
                for l in PhraseTableReader(path)]
    except PhraseScorerError as exc:
        return str(exc)


def window_outcome(path: Path, data: bytes):
    try:
        p = parse_window(window_of(data), path, None)
    except PhraseScorerError as exc:
        return str(exc)
    return list(zip(p.lines, p.eols, p.source_words, p.target_words))


GOOD = b"a man ||| un homme ||| 0.5 1 0.25 1e-5 ||| 0-0 1-1 ||| 2 3 1\n"
CASES = {
    "clean": GOOD * 3,
    "no final newline": GOOD * 2 + GOOD[:-1],
    "tabs and odd spacing": b"a\tman  |||  un  homme |||0.5 1 0.25 1 \n" + GOOD,
    "carriage return": GOOD + b"a ||| b ||| 1 2 3 4\r\n",
    "vertical tab in a word": GOOD + b"a\x0bb ||| c ||| 1 2 3 4\n",
    "bad utf-8": GOOD + b"a \xff ||| b ||| 1 2 3 4\n",
    "byte-order mark": b"\xef\xbb\xbf" + GOOD,
    "missing field": GOOD + b"a ||| b\n",
    "empty source": GOOD + b"  ||| b ||| 1 2 3 4\n",
    "empty target": GOOD + b"a |||   ||| 1 2 3 4\n",
    "negative score": GOOD + b"a ||| b ||| 1 -2 3 4\n",
    "negative zero": GOOD + b"a ||| b ||| 1 -0 3 4\n",
    "nan": GOOD + b"a ||| b ||| 1 nan 3 4\n",
    "inf": GOOD + b"a ||| b ||| 1 inf 3 4\n",
    "overflow": GOOD + b"a ||| b ||| 1 1e999 3 4\n",
    "underscore": GOOD + b"a ||| b ||| 1 1_0 3 4\n",
    "malformed number": GOOD + b"a ||| b ||| 1 1e 3 4\n",
    "no-break space in scores": GOOD + "a ||| b ||| 1\u00a02 3 4 5\n".encode(),
    "score count changes": GOOD + b"a ||| b ||| 1 2 3\n",
    "empty line": GOOD + b"\n" + GOOD,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bulk_parsing_agrees_with_the_line_reader(tmp_path, case):
    data = CASES[case]
    path = tmp_path / "t.txt"
    assert window_outcome(path, data) == reader_outcome(path, data)


PIECES = [b"a", b"b", b" ", b"\t", b"|||", b"\n", b"0.5", b"2", b"-1", b"1e5", b"1e", b"nan", b"inf", b"\r", b"\x0b",
          b"\xff", b"\xc3\xa9", b"\xc2\xa0", b"<unk>", b"1_0", b".", b"-0"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=40))
def test_bulk_parsing_agrees_with_the_line_reader_on_random_input(tmp_path, pieces):
    data = GOOD + b"".join(pieces)
    path = tmp_path / "t.txt"
    assert window_outcome(path, data) == reader_outcome(path, data)


def test_bulk_parsing_agrees_on_a_real_table(tmp_path):
    data = b"".join(head_lines(EXAMPLE_TABLE, 5000))
    path = tmp_path / "t.txt"
    assert window_outcome(path, data) == reader_outcome(path, data)


def test_score_count_is_checked_against_the_tables_first_line(tmp_path):
    window = window_of(b"a ||| b ||| 1 2 3\n", first_line=41)
    with pytest.raises(PhraseScorerError, match="line 41: found 3 scores where the first line has 4"):
        parse_window(window, tmp_path / "t.txt", 4)


def test_special_symbol_spellings_are_unknown_words():
    ids = ByteIds(["<pad>", "</s>", "<unk>", "homme", "un"])
    assert [ids[w] for w in (b"un", b"homme", b"<pad>", b"</s>", b"<unk>", b"chien")] == [4, 3] + [UNK_ID] * 4


def test_unknown_column_counts_special_spellings(tmp_path, loaded_tiny):
    table = tmp_path / "t.txt"
    table.write_text("a ||| <unk> </s> <pad> ||| 1\n")
    out = tmp_path / "o.txt"
    annotate(table, out, loaded_tiny, AnnotateOptions(columns=("unk",)))
    assert out.read_text() == "a ||| <unk> </s> <pad> ||| 1 %.9g\n" % np.exp(3)


# --- worker processes -------------------------------------------------------------------------------


def test_worker_pool_keeps_the_input_order_and_reports_errors_with_their_line(tmp_path, tiny_model):
    from phrase_scorer.vocab import Vocabulary

    vocab = Vocabulary.load(tiny_model / "vocab.target.json")
    options = AnnotateOptions(window_lines=100)
    table = tmp_path / "t.txt"
    lines = head_lines(EXAMPLE_TABLE, 1000)
    lines[650] = b"no fields here\n"
    table.write_bytes(b"".join(lines))
    windows = list(RawWindows(table, 100))
    with WorkerPool(WindowWork, (str(table), vocab, vocab, options, False), ["prepare", "finish"], 2) as pool:
        for w in windows:
            pool.submit("prepare", w.index, w, 4)
        for w in windows[:6]:
            prepared = pool.result("prepare", w.index)
            assert (prepared.index, prepared.first_line, len(prepared.target_ids)) == (w.index, w.first_line, 100)
            pool.submit("finish", w.index, np.full(100, -1.0))
        assert b"".join(pool.result("finish", w.index) for w in windows[:6]).count(b"\n") == 600
        with pytest.raises(PhraseScorerError, match="line 651: expected at least 3 fields") as caught:
            pool.result("prepare", 6)
        assert caught.value.line == 651 and caught.value.path == str(table)


def test_workers_do_not_change_the_output(tmp_path, loaded_tiny):
    options = AnnotateOptions(window_lines=2000)
    outputs = []
    for workers in (0, 1, 2):
        out = tmp_path / f"o{workers}.gz"
        annotate(EXAMPLE_TABLE, out, loaded_tiny, options, run=RunOptions(workers=workers))
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(gzip.decompress(outputs[0]).splitlines()) == 30460


def test_a_one_thread_scorer_runs_in_the_workers_with_the_same_scores(tmp_path, loaded_tiny):
    import torch

    from phrase_scorer.scoring.annotate import scoring_in_workers
    from phrase_scorer.scoring.batch_scorer import BatchScorer, scorer_for_worker

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        scorer = BatchScorer(loaded_tiny.model)
        assert scoring_in_workers(loaded_tiny, scorer, 2) is not None
        assert scoring_in_workers(loaded_tiny, scorer, 0) is None
        outputs = []
        for workers in (0, 2):
            out = tmp_path / f"o{workers}.gz"
            annotate(EXAMPLE_TABLE, out, loaded_tiny, AnnotateOptions(window_lines=2000),
                     run=RunOptions(workers=workers))
            outputs.append(out.read_bytes())
            assert json.loads(Path(str(out) + ".json").read_text())["scoring"]["threads"] == 1
        assert outputs[0] == outputs[1]
        torch.set_num_threads(2)  # several threads: the main process scores, as before
        assert scoring_in_workers(loaded_tiny, BatchScorer(loaded_tiny.model), 2) is None
        # a worker refuses weights other than the ones the run's signature records
        with pytest.raises(PhraseScorerError, match="weights changed"):
            scorer_for_worker(WorkerScoring(str(loaded_tiny.directory), "0" * 64, ScoringOptions()))
    finally:
        torch.set_num_threads(threads)


# --- resuming whatever was left -------------------------------------------------------------------


def test_resume_with_nothing_to_resume_starts_afresh_and_says_so(tmp_path, loaded_tiny, caplog):
    reference = tmp_path / "ref.gz"
    annotate(A_MAN_TABLE, reference, loaded_tiny, run=RunOptions(workers=0))
    out = tmp_path / "o.gz"
    caplog.set_level("INFO")
    annotate(A_MAN_TABLE, out, loaded_tiny, run=RunOptions(resume=True, workers=0))  # no earlier run at all
    assert "nothing to resume" in caplog.text and "starting afresh" in caplog.text
    assert out.read_bytes() == reference.read_bytes()
    # a run killed before its first chunk leaves its part file and a record of no lines done (no signature)
    from phrase_scorer.runtime.job import OutputJob, Resumable

    out.unlink()
    Path(str(out) + ".json").unlink()
    killed = OutputJob(out, resumable=Resumable({"another": "run"}))
    killed.__enter__()  # and killed there: nothing of it is cleaned up but its lock
    killed.claim.release()
    assert Path(str(out) + ".part").exists() and Path(str(out) + ".part.json").exists()
    caplog.clear()
    annotate(A_MAN_TABLE, out, loaded_tiny, run=RunOptions(resume=True, workers=0))
    assert "starting afresh" in caplog.text and out.read_bytes() == reference.read_bytes()
    # a job re-run after it had finished has nothing to do, and leaves the output as it was
    before = out.stat().st_mtime_ns
    caplog.clear()
    annotate(A_MAN_TABLE, out, loaded_tiny, run=RunOptions(resume=True, workers=0))
    assert "already finished" in caplog.text and out.stat().st_mtime_ns == before


# --- shards under torchrun ------------------------------------------------------------------------


def test_shards_are_contiguous_whole_windows_covering_every_line():
    for total in (0, 1, 999, 1000, 1001, 30460):
        for size in (1, 2, 3, 8):
            ranges = [shard_lines(total, 300, r, size) for r in range(size)]
            assert ranges[0][0] == 0 and ranges[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert all(start % 300 == 0 or start == total for start, _ in ranges)


def torchrun_annotate(model, out, *extra, ranks: int = 2):
    return [str(TORCHRUN), "--nproc-per-node", str(ranks), "--master-port", str(29500 + os.getpid() % 1000),
            "-m", "phrase_scorer", "annotate", str(EXAMPLE_TABLE), "-m", str(model), "-o", str(out),
            "--window-lines", "1000", "--threads", "1", "--workers", "1", *extra]


def descendants(pid: int) -> list:
    """The processes below ``pid`` (children, their children, ...), from /proc."""
    children: dict = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has let go of its files: not alive)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside this Python")
def test_torchrun_shards_join_to_the_one_process_bytes_and_resume(tmp_path, tiny_model):
    reference = tmp_path / "ref.gz"
    one = [sys.executable, "-m", "phrase_scorer", "annotate", str(EXAMPLE_TABLE), "-m", str(tiny_model),
           "-o", str(reference), "--window-lines", "1000", "--threads", "1", "--workers", "0"]
    subprocess.run(one, check=True, capture_output=True)

    out = tmp_path / "sharded.gz"
    done = subprocess.run(torchrun_annotate(tiny_model, out), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_bytes() == reference.read_bytes()
    signature = json.loads(Path(str(out) + ".json").read_text())
    assert signature["lines"] == 30460 and signature["ranks"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.gz", "ref.gz.json", "sharded.gz", "sharded.gz.json"]

    # killed once a shard has written a chunk, then run again blindly with --resume
    out.unlink()
    Path(str(out) + ".json").unlink()  # a signature without its output is replaced only with --overwrite
    proc = subprocess.Popen(torchrun_annotate(tiny_model, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    records = [Path(f"{out}.shard-0000{r}-of-00002.part.json") for r in (1, 2)]
    deadline = time.monotonic() + 300
    while proc.poll() is None and not any(r.exists() for r in records) and time.monotonic() < deadline:
        time.sleep(0.05)
    family = descendants(proc.pid)  # torchrun starts each rank in a session of its own: kill them all by pid
    for pid in [proc.pid, *family]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    gone_by = time.monotonic() + 120  # every rank and worker of the killed job has exited (and let go of the lock)
    while any(alive(pid) for pid in family) and time.monotonic() < gone_by:
        time.sleep(0.05)
    resumed = subprocess.run(torchrun_annotate(tiny_model, out, "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert out.read_bytes() == reference.read_bytes()
    assert not list(tmp_path.glob("*.shard-*"))
    # and once more, after it has finished: nothing to do
    again = subprocess.run(torchrun_annotate(tiny_model, out, "--resume"), capture_output=True, text=True)
    assert again.returncode == 0 and "already finished" in again.stderr
    assert out.read_bytes() == reference.read_bytes()
