"""rescore: model log-probabilities appended to a real Moses n-best list.

The list is the first three sentences (221 lines) of the tuned Multi30k system's 100-best list of
val, with word alignments; the sources are the first three lines of val.tok.en.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DATA, rescore_stopped_after
from phrase_scorer.cli import cli
from phrase_scorer.config import RescoreOptions, RunOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.nbest import read_nbest
from phrase_scorer.io.phrase_table import split_words
from phrase_scorer.rescoring.rescore import FeatureModel, rescore

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"


def raw_lines(path: Path) -> list:
    with gzip.open(path, "rb") if gzip_file(path) else open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


def gzip_file(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def model_scores(model_dir, sources, targets, tmp_path) -> np.ndarray:
    """What `phrase-scorer score` prints for these (source, target) pairs."""
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("".join(f"{' '.join(s)} ||| {' '.join(t)}\n" for s, t in zip(sources, targets)), encoding="utf-8")
    scores = tmp_path / "scores.txt"
    result = run("score", "-m", model_dir, pairs, "-o", scores, "--overwrite")
    assert result.exit_code == 0, result.stderr
    return np.array([float(v) for v in scores.read_text().split()])


def as_printed(values: np.ndarray) -> np.ndarray:
    return np.array([float(f"{v:g}") for v in values])


# `score` and `rescore` batch the pairs differently, so their fp32 matrix products and softmax sums
# add in another order and a pair's log p can differ in its last bits: by up to 4e-8 of the value
# between the batchings of these tests (docs/precision.md measures it on a phrase table). The
# tolerance is ten times that and at most half a unit of the 6th significant digit.
FP32_RELATIVE_NOISE = 5e-7


def assert_printed_from(written: np.ndarray, computed: np.ndarray) -> None:
    """Each written value (6 significant digits) is ``computed`` rounded to 6 digits, or, where
    ``computed`` lies within fp32 noise of a rounding boundary, the 6-digit value on the other side:
    one unit in the last digit, and only there."""
    noise = FP32_RELATIVE_NOISE * np.abs(computed)
    low, high = as_printed(computed - noise), as_printed(computed + noise)
    wrong = np.flatnonzero((written < low) | (written > high))
    assert not len(wrong), [(i, written[i], computed[i]) for i in wrong[:5]]


@pytest.fixture(scope="module")
def rescored(tmp_path_factory, tiny_model, tiny_reverse_model):
    out = tmp_path_factory.mktemp("rescore") / "val.rescored.gz"
    result = run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-r", tiny_reverse_model, "-o", out,
                 "--window-lines", "50")
    assert result.exit_code == 0, result.stderr
    return out


def test_every_line_and_field_is_kept(rescored):
    before, after = raw_lines(NBEST), raw_lines(rescored)
    assert len(before) == len(after) == 221
    for old, new in zip(before, after):
        old_fields, new_fields = old.split(b"|||"), new.split(b"|||")
        assert len(old_fields) == len(new_fields) == 5
        # id, hypothesis (with Moses' two spaces), total, alignment and newline: byte for byte
        assert new_fields[:2] == old_fields[:2] and new_fields[3:] == old_fields[3:]
        # the features field: as it was, then the two new features
        assert new_fields[2].startswith(old_fields[2])
        added = new_fields[2][len(old_fields[2]):].decode().split()
        assert added[0::2] == ["RNN0=", "RNNReverse0="] and new_fields[2].endswith(b" ")
    entries = list(read_nbest(rescored))
    assert [e.features[:-2] for e in entries] == [e.features for e in read_nbest(NBEST)]


def test_features_equal_what_score_gives(rescored, tiny_model, tiny_reverse_model, tmp_path):
    entries = list(read_nbest(rescored))
    sentences = [split_words(line) for line in SOURCE.read_text(encoding="utf-8").splitlines()]
    sources = [sentences[e.sentence_id] for e in entries]
    hypotheses = [split_words(e.hypothesis) for e in entries]
    forward = model_scores(tiny_model, sources, hypotheses, tmp_path)
    reverse = model_scores(tiny_reverse_model, hypotheses, sources, tmp_path)
    written_forward = np.array([e.feature("RNN0")[0] for e in entries])
    written_reverse = np.array([e.feature("RNNReverse0")[0] for e in entries])
    # the scores differ from hypothesis to hypothesis, and are log-probabilities, not probabilities
    assert len(set(written_forward)) > 100 and (written_forward < 0).all()
    # `score` prints 9 significant digits, rescore 6 as Moses does: equal once rounded alike, up to
    # the last bits two fp32 computations batched differently may differ by
    assert_printed_from(written_forward, forward)
    assert_printed_from(written_reverse, reverse)


def test_normalized_feature_is_per_predicted_token(tmp_path, loaded_tiny, tiny_model):
    out = tmp_path / "norm.txt"
    rescore(NBEST, SOURCE, out, [FeatureModel("Norm", loaded_tiny)], RescoreOptions(normalize=True))
    entries = list(read_nbest(out))
    sentences = [split_words(line) for line in SOURCE.read_text(encoding="utf-8").splitlines()]
    hypotheses = [split_words(e.hypothesis) for e in entries]
    log_p = model_scores(tiny_model, [sentences[e.sentence_id] for e in entries], hypotheses, tmp_path)
    per_token = log_p / np.array([len(h) + 1 for h in hypotheses])
    assert_printed_from(np.array([e.feature("Norm")[0] for e in entries]), per_token)


def test_each_source_is_encoded_once_and_shared_prefixes_decoded_once(tmp_path, loaded_tiny, loaded_tiny_reverse):
    result = rescore(NBEST, SOURCE, tmp_path / "o.txt",
                     [FeatureModel("F", loaded_tiny), FeatureModel("R", loaded_tiny_reverse, reverse=True)])
    forward, reverse = result.stats
    assert forward.pairs == reverse.pairs == 221
    assert forward.distinct_sources == 3  # three sentences, 100 + 33 + 88 hypotheses
    assert forward.decoder_steps < 0.7 * forward.target_steps  # hypotheses share their beginnings
    # the reverse model reads the hypotheses: each distinct one (as word ids) is encoded once
    encode = loaded_tiny_reverse.source_vocab.encode
    assert reverse.distinct_sources == len({tuple(encode(split_words(e.hypothesis))) for e in read_nbest(NBEST)})


def test_resume_after_an_interruption_gives_the_same_bytes(tmp_path, loaded_tiny, monkeypatch):
    models = [FeatureModel("RNN0", loaded_tiny)]
    options = RescoreOptions(window_lines=30)
    reference = tmp_path / "ref.gz"
    rescore(NBEST, SOURCE, reference, models, options)

    out = tmp_path / "cut.gz"
    with rescore_stopped_after(monkeypatch, 2) as calls, pytest.raises(KeyboardInterrupt):
        rescore(NBEST, SOURCE, out, models, options)
    assert not out.exists()
    record = json.loads(Path(str(out) + ".part.json").read_text())
    # windows end at sentence boundaries: sentence 0 has 100 lines, sentence 1 has 33
    assert calls == [1, 101] and record["lines_done"] == 133

    with pytest.raises(PhraseScorerError, match="options changed since the interrupted run"):
        rescore(NBEST, SOURCE, out, models, RescoreOptions(window_lines=30, normalize=True),
                run=RunOptions(resume=True))
    rescore(NBEST, SOURCE, out, models, options, run=RunOptions(resume=True))
    assert out.read_bytes() == reference.read_bytes()
    assert json.loads(Path(str(out) + ".json").read_text())["lines"] == 221


def test_stdin_and_stdout(tmp_path, tiny_model, tiny_reverse_model, rescored):
    """The same bytes as the file written with the same settings (other windows batch the pairs
    differently, which can move a value's last digit: the windows are part of the signature)."""
    plain = tmp_path / "list.txt"
    plain.write_bytes(b"".join(raw_lines(NBEST)))
    result = CliRunner().invoke(
        cli, ["rescore", "-", "--source", str(SOURCE), "-m", str(tiny_model), "-r", str(tiny_reverse_model), "-o", "-",
              "--window-lines", "50"],
        input=plain.read_bytes(), catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert result.stdout_bytes == b"".join(raw_lines(rescored))


def write_lines(path: Path, lines) -> Path:
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize("case, message", [
    ("short source", r"list.txt line 134: sentence id 2 needs source line 3, but .*src.txt has only 2 lines"),
    ("long source", r"src.txt line 4: .*src.txt has more lines than the n-best list has sentences "
                    r"\(its last sentence id is 2\)"),
    ("ungrouped", r"list.txt line 34: sentence id 0 comes after 1"),
    ("feature exists", r"list.txt line 1: the line already has a feature LM0="),
    ("bad line", r"list.txt line 5: expected at least 4 fields"),
    ("empty source", r"src.txt line 2: the source sentence is empty"),
])
def test_bad_input_gets_a_clear_error_and_no_output(tmp_path, loaded_tiny, case, message):
    lines = raw_lines(NBEST)
    source = SOURCE.read_bytes().splitlines(keepends=True)
    name = "RNN0"
    if case == "short source":
        source = source[:2]
    elif case == "long source":
        source = source + [b"one more sentence\n"]
    elif case == "ungrouped":
        lines = lines[100:133] + lines[:100] + lines[133:]
    elif case == "feature exists":
        name = "LM0"
    elif case == "bad line":
        lines[4] = b"0 ||| a line cut short\n"
    elif case == "empty source":
        source[1] = b"\n"
    nbest = write_lines(tmp_path / "list.txt", lines)
    out = tmp_path / "out.gz"
    with pytest.raises(PhraseScorerError, match=message):
        rescore(nbest, write_lines(tmp_path / "src.txt", source), out, [FeatureModel(name, loaded_tiny)],
                RescoreOptions(window_lines=40))
    assert not out.exists() and not Path(str(out) + ".json").exists()


@pytest.mark.parametrize("args, message", [
    (["--name", "RNN_0"], "feature name 'RNN_0' is not letters and digits"),
    (["--name", "A", "--name", "B"], "2 --name for 1 models"),
    (["-r", "MODEL", "--reverse-name", "A", "--name", "A"], "feature name A is given twice"),
])
def test_feature_names_are_checked(tmp_path, tiny_model, args, message):
    args = [str(tiny_model) if a == "MODEL" else a for a in args]
    result = run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", tmp_path / "o.gz", *args)
    assert result.exit_code == 1 and message in result.stderr


def feature_values(path, name) -> np.ndarray:
    return np.array([dict(e.features)[name][0] for e in read_nbest(path)])


def test_an_ensemble_is_one_feature_the_mean_of_its_models(tmp_path, tiny_model, tiny_reverse_model, sentence_models):
    """`--ensemble NAME`: the models' log p averaged into one feature; the models alone, with the
    same windows, give the values it averages."""
    other = sentence_models("encdec")
    alone = tmp_path / "alone.gz"
    assert run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-m", other, "-o", alone).exit_code == 0
    together = tmp_path / "ensemble.gz"
    result = run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-m", other, "--ensemble", "Ens",
                 "-r", tiny_reverse_model, "-o", together)
    assert result.exit_code == 0, result.stderr
    entries = list(read_nbest(together))
    assert [name for name, _ in entries[0].features][-2:] == ["Ens", "RNNReverse0"]
    first, second = feature_values(alone, "RNN0"), feature_values(alone, "RNN1")
    assert not np.allclose(first, second)  # two different models
    # the values alone were rounded to 6 digits before the mean, the ensemble's after it: they may
    # differ by half a unit of the 6th digit of each, plus fp32 noise
    def unit(v):
        return 10.0 ** (np.floor(np.log10(np.abs(v))) - 5)

    ensemble, mean = feature_values(together, "Ens"), (first + second) / 2
    bound = (unit(first) + unit(second)) / 4 + unit(ensemble) / 2 + FP32_RELATIVE_NOISE * np.abs(mean)
    assert np.all(np.abs(ensemble - mean) <= bound), np.max(np.abs(ensemble - mean) / bound)
    signature = json.loads(Path(f"{together}.json").read_text())
    assert signature["features"] == ["Ens", "RNNReverse0"]
    assert [(m["name"], m["ensemble"]) for m in signature["models"]] == [("Ens", True), ("Ens", True),
                                                                          ("RNNReverse0", False)]
    from phrase_scorer.rescoring.reranker import rescored_models

    behind = rescored_models(together)
    assert len(behind["Ens"]["weights_sha256"]) == 2 and isinstance(behind["RNNReverse0"]["weights_sha256"], str)


def test_a_name_given_twice_in_the_experiment_is_an_ensemble(tmp_path, loaded_tiny):
    from phrase_scorer.rescoring.rescore import ensembles_by_name

    models = ensembles_by_name([FeatureModel("Ens", loaded_tiny), FeatureModel("Ens", loaded_tiny),
                           FeatureModel("RNN2", loaded_tiny)])
    assert [m.ensemble for m in models] == [True, True, False]
    out = tmp_path / "o.gz"
    rescore(NBEST, SOURCE, out, models)
    assert [name for name, _ in next(iter(read_nbest(out))).features][-2:] == ["Ens", "RNN2"]
    with pytest.raises(PhraseScorerError, match="feature name Ens is given twice"):
        rescore(NBEST, SOURCE, tmp_path / "p.gz", [FeatureModel("Ens", loaded_tiny), FeatureModel("Ens", loaded_tiny)])


@pytest.mark.parametrize("args, message", [
    (["--ensemble", "Ens"], "--ensemble Ens needs two models or more, got 1"),
    (["-m", "MODEL", "--ensemble", "Ens", "--name", "A", "--name", "B"], "--name and --ensemble both name"),
    (["-m", "MODEL", "--ensemble", "RNN_0"], "feature name 'RNN_0' is not letters and digits"),
])
def test_ensembles_are_checked(tmp_path, tiny_model, args, message):
    args = [str(tiny_model) if a == "MODEL" else a for a in args]
    result = run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", tmp_path / "o.gz", *args)
    assert result.exit_code == 1 and message in result.stderr, result.stderr


def test_the_reverse_model_needs_a_hypothesis(tmp_path, loaded_tiny, loaded_tiny_reverse):
    lines = raw_lines(NBEST)
    lines[2] = b"0 |||  ||| LM0= -1 ||| -1\n"
    with pytest.raises(PhraseScorerError, match="list.txt line 3: the hypothesis is empty"):
        rescore(write_lines(tmp_path / "list.txt", lines), SOURCE, tmp_path / "o.txt",
                [FeatureModel("R", loaded_tiny_reverse, reverse=True)])
    # a forward model scores an empty hypothesis: log p(</s> | source)
    result = rescore(tmp_path / "list.txt", SOURCE, tmp_path / "o.txt", [FeatureModel("F", loaded_tiny)])
    assert result.lines == 221


def test_worker_processes_give_the_bytes_of_one_process(tmp_path, loaded_tiny, loaded_tiny_reverse):
    """The workers parse, look up, plan and format the windows; the main process only scores:
    the same bytes as a run without workers, for forward and reverse models and an ensemble."""
    models = [FeatureModel("F", loaded_tiny), FeatureModel("R", loaded_tiny_reverse, reverse=True),
              FeatureModel("E", loaded_tiny, ensemble=True), FeatureModel("E", loaded_tiny, ensemble=True)]
    for workers in (0, 2):
        rescore(NBEST, SOURCE, tmp_path / f"o{workers}.gz", models, RescoreOptions(window_lines=40, normalize=True),
                run=RunOptions(workers=workers))
    assert gzip.decompress((tmp_path / "o0.gz").read_bytes()) == gzip.decompress((tmp_path / "o2.gz").read_bytes())


def test_the_command_line_takes_the_workers(tmp_path, tiny_model):
    """``rescore --workers N``: the same bytes with none and with two."""
    for workers in (0, 2):
        result = run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", tmp_path / f"o{workers}.txt",
                     "--workers", workers)
        assert result.exit_code == 0, result.output
    assert (tmp_path / "o0.txt").read_bytes() == (tmp_path / "o2.txt").read_bytes()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("first", ["bad line", "ungrouped"])
def test_of_two_bad_lines_the_earlier_is_named_with_workers_or_without(tmp_path, loaded_tiny, workers, first):
    """A line the workers refuse (cut short) and a sentence the reader refuses (out of order):
    whichever comes first in the list is the error, whatever process finds it."""
    lines = raw_lines(NBEST)
    if first == "bad line":  # line 5 cut short, then sentence 0 again after sentence 1 from line 134
        lines = lines[:133] + lines[:20] + lines[133:]
        lines[4] = b"0 ||| a line cut short\n"
        message = r"list.txt line 5: expected at least 4 fields"
    else:  # sentence 0 after sentence 1 from line 34, a line cut short at line 200
        lines = lines[100:133] + lines[:100] + lines[133:]
        lines[199] = b"2 ||| a line cut short\n"
        message = r"list.txt line 34: sentence id 0 comes after 1"
    nbest = write_lines(tmp_path / "list.txt", lines)
    out = tmp_path / "out.gz"
    with pytest.raises(PhraseScorerError, match=message):
        rescore(nbest, SOURCE, out, [FeatureModel("RNN0", loaded_tiny)], RescoreOptions(window_lines=40),
                run=RunOptions(workers=workers))
    assert not out.exists()


def test_the_summary_quotes_the_signature_line_of_what_made_the_list(tmp_path, tiny_model):
    from phrase_scorer.records import Signature

    out = tmp_path / "out.txt"
    result = run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", out)
    assert result.exit_code == 0, result.stderr
    line = Signature.read(out).line()
    assert line.startswith("tool:rescore|models:RNN0=") and line.endswith("|version:0.1.0")
    assert f"signature: {line}" in result.stderr.splitlines()


@pytest.mark.parametrize("option, which, said", [
    ("-r", "forward", "given as the reverse model of feature RNNReverse0, but it translates the other way"),
    ("-m", "reverse", "given as the model of feature RNN0, but it translates the other way"),
])
def test_a_model_of_the_other_direction_is_refused_before_the_output_is_made(tmp_path, tiny_model, tiny_reverse_model,
                                                                              option, which, said):
    """A forward model given as a reverse one, or the other way round: one line naming the model's
    folder and the texts its vocabularies read, and no output."""
    model = tiny_model if which == "forward" else tiny_reverse_model
    out = tmp_path / "out.gz"
    result = run("rescore", NBEST, "--source", SOURCE, option, model, "-o", out)
    assert result.exit_code == 1
    line = result.stderr.strip().splitlines()[-1]
    assert said in line and model.name in line and "val.tok.en.head" in line and "val.nbest.head.gz" in line
    assert not out.exists() and not list(tmp_path.iterdir())
