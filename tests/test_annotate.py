"""annotate: every line kept, in order, with exp-encoded columns that equal what score prints."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import A_MAN_TABLE, EXAMPLE_TABLE, SHARED_TABLE, kill, require_shared, start_halted
from phrase_scorer.cli import cli
from phrase_scorer.config import AnnotateOptions, RunOptions, ScoringOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.scoring.annotate import annotate, finished_annotation
from phrase_scorer.scoring.batch_scorer import BatchScorer, default_chunk_rows


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def read_bytes_lines(path: Path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read().splitlines(keepends=True)


def vocab_words(model_dir: Path, side: str) -> set:
    return set(json.loads((model_dir / f"vocab.{side}.json").read_text())["tokens"])


def expected_line(original: bytes, values: str) -> bytes:
    """The original line with ``values`` inserted after its last score, computed independently."""
    fields = original.split(b"|||")
    score = fields[2]
    stripped = score.rstrip()
    fields[2] = stripped + b" " + values.encode() + score[len(stripped):]
    return b"|||".join(fields)


def scores_by_cli(model_dir, table) -> list:
    result = run("score", "-m", model_dir, table)
    assert result.exit_code == 0, result.output
    return [float(v) for v in result.stdout.split()]


def check_annotation(original_path, annotated_path, model_dir, scores):
    original = read_bytes_lines(original_path)
    annotated = read_bytes_lines(annotated_path)
    assert len(annotated) == len(original) == len(scores)
    targets = vocab_words(model_dir, "target")
    for orig, new, log_p in zip(original, annotated, scores):
        fields = new.split(b"|||")
        values = fields[2].split()
        prob, unk = float(values[-2]), float(values[-1])
        assert prob > 0 and unk >= 1
        assert math.isclose(prob, math.exp(max(log_p, -100)), rel_tol=1e-4)
        n_unknown = sum(1 for w in orig.split(b"|||")[1].decode().split() if w not in targets)
        assert unk == float("%.9g" % math.exp(n_unknown))
        assert new == expected_line(orig, " ".join(v.decode() for v in values[-2:]))


def test_columns_equal_exp_of_score_on_a_real_table(tmp_path, tiny_model):
    out = tmp_path / "pt.rnn.gz"
    result = run("annotate", A_MAN_TABLE, "-m", tiny_model, "-o", out, "--window-lines", 333)
    assert result.exit_code == 0, result.output
    check_annotation(A_MAN_TABLE, out, tiny_model, scores_by_cli(tiny_model, A_MAN_TABLE))
    # the tiny model's 500-word shortlists leave words out, so the unk column is exercised
    assert any(float(l.split(b"|||")[2].split()[-1]) > 1 for l in read_bytes_lines(out))
    # how to use it in Moses is printed
    assert "num-features=6" in result.stderr and "TranslationModel0=" in result.stderr
    # with the start weights of its columns: the unknown-word count starts as a penalty
    assert "<the 4 current weights> 0.2 -0.2\n" in result.stderr


def test_sparse_and_property_fields_survive(tmp_path, tiny_model):
    lines = read_bytes_lines(A_MAN_TABLE)[:500]
    table = tmp_path / "pt.txt"
    with open(table, "wb") as f:
        for i, line in enumerate(lines):
            body = line.rstrip(b"\n")
            # replace the empty sparse/property fields by real ones on some lines
            if i % 3 == 0:
                body = body[: -len(b" ||| |||")] + b" ||| sp%d 0.5 ||| {{key %d}}" % (i, i)
            f.write(body + (b"\n" if i < len(lines) - 1 else b""))  # last line without newline
    out = tmp_path / "out.txt"
    assert run("annotate", table, "-m", tiny_model, "-o", out).exit_code == 0
    check_annotation(table, out, tiny_model, scores_by_cli(tiny_model, table))
    assert not out.read_bytes().endswith(b"\n")


def test_column_choices(tmp_path, loaded_tiny, tiny_model):
    table = tmp_path / "t.txt"
    table.write_text("a man ||| un homme inconnuxyz ||| 0.5\nzzqq man ||| homme ||| 0.25\n")
    scores = scores_by_cli(tiny_model, table)

    def columns(**options):
        out = tmp_path / "o.txt"
        annotate(table, out, loaded_tiny, AnnotateOptions(**options), run=RunOptions(overwrite=True))
        return [[float(v) for v in l.split("|||")[2].split()] for l in out.read_text().splitlines()]

    assert [len(c) for c in columns(columns=("prob",))] == [2, 2]
    unk_only = columns(columns=("unk",))
    assert [c[1] for c in unk_only] == [pytest.approx(math.e), 1.0]
    assert [c[1] for c in columns(columns=("unk",), unk_side="source")] == [1.0, pytest.approx(math.e)]
    assert [c[1] for c in columns(columns=("unk",), unk_side="both")] == [pytest.approx(math.e), pytest.approx(math.e)]
    normalized = columns(length_normalize=True)
    assert normalized[0][1] == pytest.approx(math.exp(scores[0] / 4), rel=1e-4)  # 3 words + </s>
    assert normalized[1][1] == pytest.approx(math.exp(scores[1] / 2), rel=1e-4)
    with pytest.raises(PhraseScorerError, match="columns takes"):
        AnnotateOptions(columns=("prob", "lm"))


def test_very_unlikely_pairs_are_floored_not_zero(tmp_path, loaded_tiny):
    table = tmp_path / "t.txt"
    table.write_text("a ||| " + " ".join(["homme"] * 80) + " ||| 1\n")
    out = tmp_path / "o.txt"
    annotate(table, out, loaded_tiny)
    prob = out.read_text().split("|||")[2].split()[1]
    assert prob == "%.9g" % math.exp(-100)


def test_gzip_follows_the_output_name_and_stdout_works(tmp_path, tiny_model):
    gz_out, txt_out = tmp_path / "o.gz", tmp_path / "o.txt"
    assert run("annotate", A_MAN_TABLE, "-m", tiny_model, "-o", gz_out, "--window-lines", 700).exit_code == 0
    # the same windows: outputs made with identical windows are byte-identical, while a different
    # window batches the sources differently and fp32 sums can move a score in its 9th digit
    assert run("annotate", A_MAN_TABLE, "-m", tiny_model, "-o", txt_out, "--window-lines", 700).exit_code == 0
    assert gz_out.read_bytes()[:2] == b"\x1f\x8b" and txt_out.read_bytes()[:2] != b"\x1f\x8b"
    assert gzip.decompress(gz_out.read_bytes()) == txt_out.read_bytes()  # several members, one stream
    piped = run("annotate", "-", "-m", tiny_model, "-o", "-")
    assert piped.exit_code == 1  # CliRunner's stdin is empty
    result = CliRunner().invoke(cli, ["annotate", "-", "-m", str(tiny_model), "-o", "-", "--window-lines", "700"],
                                input=gzip.decompress(A_MAN_TABLE.read_bytes()))
    assert result.exit_code == 0 and result.stdout_bytes == txt_out.read_bytes()


def test_signature_records_what_made_the_table(tmp_path, tiny_model):
    out = tmp_path / "o.gz"
    assert run("annotate", A_MAN_TABLE, "-m", tiny_model, "-o", out).exit_code == 0
    signature = json.loads((tmp_path / "o.gz.json").read_text())
    assert signature["model"]["weights_sha256"] == hashlib.sha256((tiny_model / "model.pt").read_bytes()).hexdigest()
    assert signature["lines"] == 2020
    assert signature["num_scores_before"] == 4 and signature["num_scores_after"] == 6
    assert signature["columns"] == ["prob", "unk"]
    assert signature["package_version"]
    assert not (tmp_path / "o.gz.part").exists() and not (tmp_path / "o.gz.part.json").exists()


def test_a_failure_leaves_nothing_under_the_final_name(tmp_path, loaded_tiny):
    lines = read_bytes_lines(EXAMPLE_TABLE)[:5000]
    lines[4000] = b"broken line without fields\n"
    table = tmp_path / "bad.txt"
    table.write_bytes(b"".join(lines))
    out = tmp_path / "o.gz"
    with pytest.raises(PhraseScorerError, match="line 4001"):
        annotate(table, out, loaded_tiny, AnnotateOptions(window_lines=500))
    assert not out.exists()
    # an earlier output stays as it was
    out.write_bytes(b"previous")
    with pytest.raises(PhraseScorerError):
        annotate(table, out, loaded_tiny, AnnotateOptions(window_lines=500))
    assert out.read_bytes() == b"previous"


def test_refuses_to_overwrite_its_input(tmp_path, loaded_tiny):
    table = tmp_path / "t.txt"
    table.write_text("a ||| b ||| 1\n")
    with pytest.raises(PhraseScorerError, match="overwrite the input"):
        annotate(table, table, loaded_tiny)


def annotate_args(table, model, out, *extra):
    return ["annotate", str(table), "-m", str(model), "-o", str(out), "--window-lines", "300", "--threads", "1", *extra]


def annotate_command(table, model, out, *extra):
    return [sys.executable, "-m", "phrase_scorer", *annotate_args(table, model, out, *extra)]


EXAMPLE_LINES = len(read_bytes_lines(EXAMPLE_TABLE))


def test_kill_and_resume_gives_the_same_bytes(tmp_path, tiny_model):
    reference = tmp_path / "ref.gz"
    subprocess.run(annotate_command(EXAMPLE_TABLE, tiny_model, reference), check=True, capture_output=True)

    out = tmp_path / "cut.gz"
    record = Path(str(out) + ".part.json")
    # halted half-way through writing its 11th chunk: 10 chunks of 300 lines are complete
    proc = start_halted(f"write:{out}:11:0.5", annotate_args(EXAMPLE_TABLE, tiny_model, out), tmp_path / "ready")
    # a second run aimed at the same output is refused while the first holds it
    second = run("annotate", EXAMPLE_TABLE, "-m", tiny_model, "-o", out)
    assert second.exit_code == 1 and "another phrase-scorer run is writing this output" in second.stderr
    assert kill(proc) == -signal.SIGKILL
    assert not out.exists()
    assert json.loads(record.read_text())["lines_done"] == 3000
    assert Path(str(out) + ".part").stat().st_size > json.loads(record.read_text())["bytes_done"]  # a torn chunk
    resumed = subprocess.run(annotate_command(EXAMPLE_TABLE, tiny_model, out, "--resume"),
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming after 3000 lines" in resumed.stderr
    assert len(read_bytes_lines(out)) == EXAMPLE_LINES
    assert out.read_bytes() == reference.read_bytes()
    assert not record.exists()


def test_resume_refuses_changed_settings(tmp_path, loaded_tiny, tiny_model):
    out = tmp_path / "o.gz"
    proc = start_halted(f"write:{out}:2:0", annotate_args(EXAMPLE_TABLE, tiny_model, out), tmp_path / "ready")
    kill(proc)
    assert json.loads(Path(str(out) + ".part.json").read_text())["lines_done"] == 300
    with pytest.raises(PhraseScorerError,
                       match=r"cannot resume: options(, scoring)? changed since the interrupted run"):
        annotate(EXAMPLE_TABLE, out, loaded_tiny, AnnotateOptions(window_lines=300, unk_side="both"),
                 run=RunOptions(resume=True))


def test_resume_refuses_other_batches(tmp_path, loaded_tiny, tiny_model):
    """Batching moves an fp32 score's last digits, so a resumed run must batch as the first did."""
    out = tmp_path / "o.gz"
    proc = start_halted(f"write:{out}:2:0", annotate_args(EXAMPLE_TABLE, tiny_model, out), tmp_path / "ready")
    kill(proc)
    with pytest.raises(PhraseScorerError, match=r"cannot resume: scoring changed .*scoring.batch_tokens: 8192 -> 64"):
        annotate(EXAMPLE_TABLE, out, loaded_tiny, AnnotateOptions(window_lines=300), ScoringOptions(batch_tokens=64),
                 run=RunOptions(resume=True))


def test_the_signature_records_the_batches_and_a_finished_output_is_kept_only_for_the_same(tmp_path, loaded_tiny):
    out = tmp_path / "o.gz"
    annotate(A_MAN_TABLE, out, loaded_tiny, run=RunOptions(workers=0))
    scoring = json.loads(Path(str(out) + ".json").read_text())["scoring"]
    chunk_rows = default_chunk_rows(torch.device("cpu"), loaded_tiny.model.output_layer.out_features)
    assert chunk_rows > 128  # a small vocabulary: more rows at once
    assert scoring == {"device": "cpu", "precision": "fp32", "batch_tokens": 8192, "chunk_rows": chunk_rows,
                       "softmax": "base 2", "threads": torch.get_num_threads()}
    options = AnnotateOptions()
    assert finished_annotation(A_MAN_TABLE, out, loaded_tiny, options, BatchScorer(loaded_tiny.model).describe())
    other = BatchScorer(loaded_tiny.model, ScoringOptions(batch_tokens=64)).describe()
    assert finished_annotation(A_MAN_TABLE, out, loaded_tiny, options, other) is None


def test_an_output_in_a_missing_folder_names_the_folder(tmp_path, tiny_model):
    out = tmp_path / "no" / "such" / "o.gz"
    result = run("annotate", A_MAN_TABLE, "-m", tiny_model, "-o", out)
    assert result.exit_code == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"phrase-scorer: error: {out.parent}: the output folder does not exist")
    assert ".lock" not in message
    assert not (tmp_path / "no").exists()


def truncated_copy(path: Path, out: Path, keep: float) -> Path:
    data = path.read_bytes()
    out.write_bytes(data[: int(len(data) * keep)])
    return out


def test_a_truncated_input_removes_the_partial_output_it_cannot_resume(tmp_path, loaded_tiny, tiny_model):
    cut = truncated_copy(EXAMPLE_TABLE, tmp_path / "cut.gz", 0.5)
    out = tmp_path / "o.gz"
    result = run("annotate", cut, "-m", tiny_model, "-o", out, "--window-lines", 300)
    assert result.exit_code == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"phrase-scorer: error: {cut}") and "the file is truncated" in message
    assert f"{out}.part is removed: nothing can be resumed from it (the input must change first)" in message
    assert not out.exists() and not Path(f"{out}.part").exists() and not Path(f"{out}.part.json").exists()


def test_a_failure_that_can_be_resumed_keeps_the_part_and_says_so(tmp_path, loaded_tiny, tiny_model, monkeypatch):
    """A full disk after some chunks: the finished chunks stay for --resume, and the message says so."""
    import errno

    from phrase_scorer.io import atomic
    from phrase_scorer.io.os_errors import describe_os_error

    out = tmp_path / "o.gz"
    original = atomic.AtomicOutput.write
    writes = {"n": 0}

    def write(self, data):
        if self.path == str(out):
            writes["n"] += 1
            if writes["n"] == 4:
                raise describe_os_error(OSError(errno.ENOSPC, "No space left on device"), self.tmp_path)
        original(self, data)

    monkeypatch.setattr(atomic.AtomicOutput, "write", write)
    with pytest.raises(PhraseScorerError) as caught:
        annotate(EXAMPLE_TABLE, out, loaded_tiny, AnnotateOptions(window_lines=300))
    kept = f"{out}.part is kept with the first 900 lines done: run the same command with resume=True"
    assert kept in str(caught.value)
    assert Path(f"{out}.part").exists() and json.loads(Path(f"{out}.part.json").read_text())["lines_done"] == 900
    monkeypatch.setattr(atomic.AtomicOutput, "write", original)
    annotate(EXAMPLE_TABLE, out, loaded_tiny, AnnotateOptions(window_lines=300), run=RunOptions(resume=True))
    reference = tmp_path / "ref.gz"
    annotate(EXAMPLE_TABLE, reference, loaded_tiny, AnnotateOptions(window_lines=300))
    assert out.read_bytes() == reference.read_bytes()


@pytest.mark.slow
def test_whole_multi30k_table(tmp_path, tiny_model):
    """Every line of the real 1.2M-line table: order, fields and values."""
    require_shared()
    out = tmp_path / "pt.rnn.gz"
    assert run("annotate", SHARED_TABLE, "-m", tiny_model, "-o", out).exit_code == 0
    check_annotation(SHARED_TABLE, out, tiny_model, scores_by_cli(tiny_model, SHARED_TABLE))


def test_ini_option_writes_the_patched_config(tmp_path, tiny_model):
    import shutil

    from conftest import DATA
    from phrase_scorer.io.moses_ini import MosesIni

    system = tmp_path / "system"
    system.mkdir()
    shutil.copy(DATA / "moses.ini", system / "moses.ini")
    out = tmp_path / "pt.rnn.gz"
    result = run("annotate", A_MAN_TABLE, "-m", tiny_model, "-o", out, "--ini", system / "moses.ini")
    assert result.exit_code == 0, result.output
    patched = MosesIni.read(str(out) + ".moses.ini")
    feature = patched.find_phrase_table()
    assert feature.get("num-features") == "6" and feature.get("path") == str(out)
    assert patched.weight_line("TranslationModel0").weights[4:] == [0.2, -0.2]
    assert "start weights of the new columns: prob 0.2, unk -0.2" in result.stderr
    # a table with the unknown-word column only gets that column's (negative) start weight
    unk_only = tmp_path / "unk.gz"
    result = run("annotate", A_MAN_TABLE, "-m", tiny_model, "-o", unk_only, "--columns", "unk",
                 "--ini", system / "moses.ini")
    assert result.exit_code == 0, result.output
    assert MosesIni.read(str(unk_only) + ".moses.ini").weight_line("TranslationModel0").weights[4:] == [-0.2]
    assert f"path={system}/lm.arpa.gz" in patched.text()  # other paths made absolute


def test_batches_planned_by_the_workers_give_the_bytes_of_batches_planned_here(tmp_path, loaded_tiny):
    """With the scorer in the main process (two threads here; a GPU alike) the workers plan each
    window's batches: the output is byte for byte the one of a run without workers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        options = ScoringOptions(batch_tokens=128)  # several batches per window
        for workers in (0, 2):
            annotate(A_MAN_TABLE, tmp_path / f"o{workers}.txt", loaded_tiny, AnnotateOptions(window_lines=200), options,
                     run=RunOptions(workers=workers))
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "o0.txt").read_bytes() == (tmp_path / "o2.txt").read_bytes()
