"""annotate: every line kept, in order, with exp-encoded columns that equal what score prints."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import A_MAN_TABLE, EXAMPLE_TABLE, SHARED_TABLE, require_shared
from phrase_scorer.cli import cli
from phrase_scorer.config import AnnotateOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.annotate import annotate


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
        annotate(table, out, loaded_tiny, AnnotateOptions(**options))
        return [[float(v) for v in l.split("|||")[2].split()] for l in out.read_text().splitlines()]

    assert [len(c) for c in columns(columns=("prob",))] == [2, 2]
    unk_only = columns(columns=("unk",))
    assert [c[1] for c in unk_only] == [pytest.approx(math.e), 1.0]
    assert [c[1] for c in columns(columns=("unk",), unk_side="source")] == [1.0, pytest.approx(math.e)]
    assert [c[1] for c in columns(columns=("unk",), unk_side="both")] == [pytest.approx(math.e), pytest.approx(math.e)]
    normalized = columns(length_normalize=True)
    assert normalized[0][1] == pytest.approx(math.exp(scores[0] / 4), rel=1e-4)  # 3 words + </s>
    assert normalized[1][1] == pytest.approx(math.exp(scores[1] / 2), rel=1e-4)
    with pytest.raises(PhraseScorerError, match="--columns"):
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
    assert run("annotate", A_MAN_TABLE, "-m", tiny_model, "-o", txt_out).exit_code == 0
    assert gz_out.read_bytes()[:2] == b"\x1f\x8b" and txt_out.read_bytes()[:2] != b"\x1f\x8b"
    assert gzip.decompress(gz_out.read_bytes()) == txt_out.read_bytes()  # several members, one stream
    piped = run("annotate", "-", "-m", tiny_model, "-o", "-")
    assert piped.exit_code == 1  # CliRunner's stdin is empty
    result = CliRunner().invoke(cli, ["annotate", "-", "-m", str(tiny_model), "-o", "-"],
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


def annotate_command(table, model, out, *extra):
    return [sys.executable, "-m", "phrase_scorer", "annotate", str(table), "-m", str(model), "-o", str(out),
            "--window-lines", "300", "--threads", "1", *extra]


def test_kill_and_resume_gives_the_same_bytes(tmp_path, tiny_model):
    reference = tmp_path / "ref.gz"
    subprocess.run(annotate_command(EXAMPLE_TABLE, tiny_model, reference), check=True, capture_output=True)

    out = tmp_path / "cut.gz"
    record = Path(str(out) + ".part.json")
    proc = subprocess.Popen(annotate_command(EXAMPLE_TABLE, tiny_model, out), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if record.exists() and json.loads(record.read_text() or "{}").get("lines_done", 0) >= 3000:
            break
        time.sleep(0.05)
    # a second run aimed at the same output is refused while the first holds it
    second = run("annotate", EXAMPLE_TABLE, "-m", tiny_model, "-o", out)
    assert second.exit_code == 1 and "another phrase-scorer run is writing this output" in second.stderr
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    done = json.loads(record.read_text())["lines_done"]
    assert 3000 <= done < 30460
    resumed = subprocess.run(annotate_command(EXAMPLE_TABLE, tiny_model, out, "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming after {done} lines" in resumed.stderr or "resuming after" in resumed.stderr
    assert out.read_bytes() == reference.read_bytes()


def test_resume_refuses_changed_settings(tmp_path, loaded_tiny, tiny_model):
    out = tmp_path / "o.gz"
    proc = subprocess.Popen(annotate_command(EXAMPLE_TABLE, tiny_model, out), stderr=subprocess.PIPE)
    record = Path(str(out) + ".part.json")
    while not record.exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with pytest.raises(PhraseScorerError, match="options changed since the interrupted run"):
        annotate(EXAMPLE_TABLE, out, loaded_tiny, AnnotateOptions(window_lines=300, unk_side="both"), resume=True)


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
    assert len(patched.weight_line("TranslationModel0").weights) == 6
    assert f"path={system}/lm.arpa.gz" in patched.text()  # other paths made absolute
