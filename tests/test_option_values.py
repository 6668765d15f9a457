"""Option values are checked where they are parsed: every number finite and in range, refused
with the flag's own name before any file or folder is made; and an error stays one line whatever
the file names it holds."""

from __future__ import annotations

import click
import pytest

from conftest import DATA, TRAIN_EN, TRAIN_FR, VAL_EN, VAL_FR, run_cli
from phrase_scorer.cli import cli
from phrase_scorer.cli.group import Duration
from phrase_scorer.cli.options import Count, FiniteFloat

#: Values that float() reads as NaN or an infinity ('1e400' and 400 nines overflow to inf).
NOT_FINITE = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "9" * 400]


def verbs(group: click.Group = cli, path: tuple = ()):
    """(the words that name it, the command) for every verb of the command line."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from verbs(command, path + (name,))
        else:
            yield path + (name,), command


def is_numeric(param: click.Parameter) -> bool:
    kind = param.type
    return isinstance(kind, (click.types.IntParamType, click.types.FloatParamType, Duration))


NUMERIC = [(words, param) for words, command in verbs() for param in command.params if is_numeric(param)]
NUMERIC_IDS = [f"{' '.join(words)} {max(param.opts, key=len)}" for words, param in NUMERIC]


def flag_of(param: click.Parameter) -> str:
    return max(param.opts, key=len)


def refused_at_the_parser(result, flag: str) -> str:
    """The usage error naming ``flag`` (exit status 2), one line, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: Invalid value for") and flag in last, result.output
    return last


def test_the_walk_finds_the_numeric_options():
    """The walk over the click tree reaches every verb's numbers (so the tests below see them all)."""
    found = {name for name in NUMERIC_IDS}
    for expected in ("train --lr", "train --max-epochs", "train --clip-norm", "train --max-time", "train --seed",
                     "build-reranker --budget", "build-reranker --tie-margin", "rerank --min-feature-gain",
                     "rerank --seed", "translate --max-length-ratio", "sample --temperature", "score --threads",
                     "plot scores --seed", "rescore --workers"):
        assert expected in found, expected


def test_every_numeric_option_has_a_checked_type():
    """Every number option is a finite float (FiniteFloat), a bounded whole number (Count) or a
    Duration: a plain ``type=float``, ``type=int``, click.FloatRange or click.IntRange lets NaN,
    infinities or numbers no program takes through."""
    unchecked = [name for name, (words, param) in zip(NUMERIC_IDS, NUMERIC)
                 if not isinstance(param.type, (FiniteFloat, Count, Duration))]
    assert unchecked == []


@pytest.mark.parametrize(("words", "param"), NUMERIC, ids=NUMERIC_IDS)
def test_every_numeric_option_refuses_nan_infinities_and_huge_numbers(tmp_path, monkeypatch, words, param):
    """NaN, the infinities and a number too large for any program are refused at the parser,
    naming the option's own flag, with nothing made in the working folder."""
    monkeypatch.chdir(tmp_path)
    flag = flag_of(param)
    for value in NOT_FINITE:
        refused_at_the_parser(run_cli(*words, flag, value), flag)
    assert list(tmp_path.iterdir()) == []


def test_budget_nan_is_refused_before_the_work_folder_exists(tmp_path):
    work = tmp_path / "work"
    for value in ("nan", "inf"):
        result = run_cli("build-reranker", DATA / "moses.ini", "--corpus", TRAIN_EN, TRAIN_FR,
                         "--tuning-set", VAL_EN, VAL_FR, "-o", work, "--budget", value)
        refused_at_the_parser(result, "--budget")
        assert not work.exists()


def test_tie_margin_nan_is_refused_before_the_build(tmp_path):
    work = tmp_path / "work"
    result = run_cli("build-reranker", DATA / "moses.ini", "--corpus", TRAIN_EN, TRAIN_FR,
                     "--tuning-set", VAL_EN, VAL_FR, "-o", work, "--tie-margin", "nan")
    refused_at_the_parser(result, "--tie-margin")
    assert not work.exists()


@pytest.mark.parametrize("flag", ["--max-epochs", "--lr", "--clip-norm", "--lr-decay", "--dropout",
                                  "--label-smoothing"])
def test_training_numbers_nan_are_refused_before_the_model_folder_exists(tmp_path, flag):
    output = tmp_path / "model"
    result = run_cli("train", "--corpus", TRAIN_EN, TRAIN_FR, "-o", output, "--preset", "tiny", flag, "nan")
    refused_at_the_parser(result, flag)
    assert not output.exists()


def test_max_time_of_400_nines_is_refused_as_no_duration(tmp_path):
    """400 nines are a float's infinity: no duration."""
    output = tmp_path / "model"
    result = run_cli("train", "--corpus", TRAIN_EN, TRAIN_FR, "-o", output, "--max-time", "9" * 400 + "h")
    refused_at_the_parser(result, "--max-time")
    assert not output.exists()


def test_min_feature_gain_nan_is_refused(tmp_path):
    nbest = DATA / "val.nbest.head.gz"
    result = run_cli("rerank", "--dev", nbest, DATA / "val.tok.fr.head", "--test", nbest,
                     "-o", tmp_path / "best.txt", "--min-feature-gain", "nan")
    refused_at_the_parser(result, "--min-feature-gain")
    assert list(tmp_path.iterdir()) == []


def test_translate_max_length_ratio_nan_is_refused(tmp_path, tiny_model):
    source = tmp_path / "src.en"
    source.write_text("a man\n")
    result = run_cli("translate", "-m", tiny_model, source, "-o", tmp_path / "out.fr", "--max-length-ratio", "nan")
    refused_at_the_parser(result, "--max-length-ratio")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.en"]


@pytest.mark.parametrize("value", [str(2 ** 31), str(2 ** 64), "-1"])
def test_a_seed_no_random_generator_takes_is_refused(tmp_path, tiny_model, value):
    """torch, numpy and Moses' optimisers take seeds of 0 to 2^31 - 1; a larger or negative one
    ended in a ValueError deep inside a verb."""
    result = run_cli("sample", "-m", tiny_model, "a man", "--seed", value)
    refused_at_the_parser(result, "--seed")


def test_threads_no_machine_runs_are_refused(tiny_model):
    """torch.set_num_threads(2^31) raised an overflow ValueError; a million threads is a typo."""
    for value in (str(2 ** 31), "1000000"):
        result = run_cli("sample", "-m", tiny_model, "a man", "--threads", value)
        refused_at_the_parser(result, "--threads")


def test_initial_weights_nan_are_refused(tmp_path):
    result = run_cli("moses-ini", DATA / "moses.ini", "--phrase-table", tmp_path / "pt.gz", "-o",
                     tmp_path / "moses.ini", "--initial-weights", "0.2,nan")
    refused_at_the_parser(result, "--initial-weights")
    assert list(tmp_path.iterdir()) == []


def test_a_seed_given_twice_is_refused_at_the_parser(tmp_path):
    """``rerank --seed 1 --seed 1`` failed on the optimiser's folder 'seed1: File exists'."""
    nbest = DATA / "val.nbest.head.gz"
    result = run_cli("rerank", "--dev", nbest, DATA / "val.tok.fr.head", "--test", nbest,
                     "-o", tmp_path / "best.txt", "--seed", "1", "--seed", "2", "--seed", "1")
    last = refused_at_the_parser(result, "--seed")
    assert "1" in last and "twice" in last
    assert list(tmp_path.iterdir()) == []


# --- messages that stay one line ------------------------------------------------------------------

def test_a_file_name_with_a_newline_keeps_the_error_on_one_line(tmp_path, tiny_model):
    """The library's error names the file; a newline in its name is shown escaped, as Python's
    repr writes it, so the message is still the one last line."""
    table = tmp_path / "bad\nname.txt"
    table.write_text("no separators here\n")
    result = run_cli("score", "-m", tiny_model, table)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("phrase-scorer: error: "), result.stderr
    assert "bad\\nname.txt" in lines[-1] and "line 1" in lines[-1], result.stderr
    assert not any(line.startswith("name.txt") for line in lines), result.stderr


def test_a_usage_error_naming_an_argument_with_a_newline_stays_one_line(tmp_path):
    """The parser's own errors quote what was given as it was given: escaped too."""
    result = run_cli("moses-ini", DATA / "moses.ini", "--phrase-table", tmp_path / "pt.gz", "-o", tmp_path / "m.ini",
                     "extra\nargument")
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "extra\\nargument" in last, result.output


def test_control_characters_in_a_message_are_escaped_and_printable_names_kept():
    from phrase_scorer.errors import PhraseScorerError, shown_name

    assert shown_name("model/é ü.txt") == "model/é ü.txt"
    assert shown_name("a\nb") == "'a\\nb'"
    assert shown_name("a\x1b[31mb") == "'a\\x1b[31mb'"
    assert shown_name("a\rb\tc") == "'a\\rb\\tc'"
    assert "\n" not in str(PhraseScorerError("cannot read", path="x\ny", line=3))


def test_a_training_batch_larger_than_any_shortlist_is_refused_with_its_flag(tmp_path):
    """The training settings' own check (config.py) named it ``training.batch_size``; the flag
    takes what the settings take."""
    output = tmp_path / "model"
    for flag in ("--batch-size", "--valid-beam"):
        result = run_cli("train", "--corpus", TRAIN_EN, TRAIN_FR, "-o", output, flag, str(2 ** 30))
        refused_at_the_parser(result, flag)
        assert not output.exists()


@pytest.mark.parametrize("words", [("annotate",), ("rescore",), ("train",)])
def test_more_worker_processes_than_any_machine_runs_are_refused(words):
    """``annotate --workers 1024`` started a thousand processes that each load torch (the run
    hung, the killed children printed tracebacks); ``train --processes 1024`` a thousand ranks."""
    flag = "--processes" if words == ("train",) else "--workers"
    result = run_cli(*words, flag, "1024")
    refused_at_the_parser(result, flag)


def test_a_temperature_that_overflows_the_logits_is_refused(tiny_model):
    """``sample --temperature 1e-300``: logits / temperature overflowed to infinity and sampling
    raised torch's RuntimeError ('probability tensor contains either inf, nan ...')."""
    result = run_cli("sample", "-m", tiny_model, "a man", "--temperature", "1e-300")
    refused_at_the_parser(result, "--temperature")


def test_a_learning_rate_beyond_a_32_bit_float_is_refused(tmp_path):
    """``train --lr 1e300`` ended in torch's RuntimeError ('value cannot be converted to type
    float without overflow') at the first update: the step multiplies 32-bit weights by it."""
    output = tmp_path / "model"
    result = run_cli("train", "--corpus", TRAIN_EN, TRAIN_FR, "-o", output, "--lr", "1e300")
    refused_at_the_parser(result, "--lr")
    assert not output.exists()


def test_the_training_settings_refuse_a_learning_rate_beyond_a_32_bit_float():
    """A library caller gets the same range as the flag (one home: config.py)."""
    from phrase_scorer.config import TrainConfig
    from phrase_scorer.errors import PhraseScorerError

    with pytest.raises(PhraseScorerError, match="training.lr"):
        TrainConfig(lr=1e300)



@pytest.mark.parametrize(("flag", "value"), [("--budget", "1e300"), ("--tie-margin", "101")])
def test_a_build_number_beyond_what_the_build_takes_is_refused_with_its_flag(tmp_path, flag, value):
    """The build's own check named them by their settings (``training_hours``); a million hours
    of training and a margin of more than 100 BLEU points are refused at the parser."""
    work = tmp_path / "work"
    result = run_cli("build-reranker", DATA / "moses.ini", "--corpus", TRAIN_EN, TRAIN_FR,
                     "--tuning-set", VAL_EN, VAL_FR, "-o", work, flag, value)
    refused_at_the_parser(result, flag)
    assert not work.exists()


def test_a_range_in_the_help_is_written_short():
    """The learning rate's bound shows as 3.40282e+38, not with seventeen digits."""
    result = run_cli("train", "--help")
    assert result.exit_code == 0
    assert "3.4028234663852886e+38" not in result.output and "0<x<=3.40282e+38" in result.output


def test_a_group_without_its_verb_still_shows_its_help_on_many_lines():
    """``phrase-scorer plot`` shows the group's help (the parser raises it as an error): it is
    not an error line, and is not escaped onto one."""
    result = run_cli("plot")
    assert "\\n" not in result.output
    assert len(result.output.splitlines()) > 5 and "alignments" in result.output


def test_more_plotted_points_than_memory_holds_are_refused(tmp_path):
    """``plot scores --max-points 2147483647`` set aside 16 bytes a point before reading a line
    (34 GB); the reservoir holds at most 100 million points."""
    table = tmp_path / "t.txt"
    table.write_text("a ||| b ||| 0.5 0.5 0.5 0.5 0.5 0.5\n")
    result = run_cli("plot", "scores", table, "-o", tmp_path / "s.png", "--max-points", str(2 ** 31 - 1))
    refused_at_the_parser(result, "--max-points")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


@pytest.mark.parametrize("verb", ["annotate", "rescore", "ems-config"])
def test_a_window_larger_than_memory_should_hold_is_refused(verb):
    """A window's lines are held in memory whole: ``--window-lines 2147483647`` read a whole
    table or list into memory."""
    result = run_cli(verb, "--window-lines", str(2 ** 31 - 1))
    refused_at_the_parser(result, "--window-lines")


def test_a_model_name_given_twice_to_build_reranker_is_refused(tmp_path, tiny_model):
    """``-m forward=A -m forward=B`` kept B alone and said nothing of A."""
    work = tmp_path / "work"
    result = run_cli("build-reranker", DATA / "moses.ini", "--corpus", TRAIN_EN, TRAIN_FR,
                     "--tuning-set", VAL_EN, VAL_FR, "-o", work,
                     "-m", f"forward={tiny_model}", "-m", f"forward={tmp_path}")
    last = refused_at_the_parser(result, "--model")
    assert "forward" in last and "twice" in last
    assert not work.exists()


def test_a_logged_line_naming_a_file_with_a_newline_stays_one_line(tmp_path, tiny_model):
    """A warning names the output as given: its newline is escaped as in an error."""
    table = tmp_path / "t.txt"
    table.write_text("a ||| b ||| 0.5 0.5 0.5 0.5\n")
    result = run_cli("annotate", table, "-m", tiny_model, "-o", tmp_path / "out\nnew.txt", "--resume")
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if "nothing to resume" in line]
    assert len(warning) == 1, result.stderr
    assert "out\\nnew.txt (no interrupted run left a record): starting afresh" in warning[0], result.stderr
