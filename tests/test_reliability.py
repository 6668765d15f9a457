"""Hostile input, interruptions, untrusted model files and concurrent runs.

The fuzz properties run here with a bounded number of examples; `make test-fuzz` (marker `fuzz`)
runs the same properties much longer. With PHRASE_SCORER_RELIABILITY_LOG set, every test
records what it tried in that file (tools/reliability_report.py turns it into
docs/reliability.md).
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLE_TABLE, default_sigint, kill, start_halted
from phrase_scorer.cli import cli
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.moses_ini import MosesIni
from phrase_scorer.io.nbest import read_nbest
from phrase_scorer.io.phrase_table import read_phrase_table

LOG = os.environ.get("PHRASE_SCORER_RELIABILITY_LOG")
QUICK = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
LONG = settings(max_examples=5000, deadline=5000, suppress_health_check=[HealthCheck.too_slow])


def record(kind: str, **fields) -> None:
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")


# --- generated input -------------------------------------------------------------------------------

PIECES = [b"a", b"le chat", b"", b" ", b"  ", b"\t", b"|||", b"||", b"x|||y", b"\xff\xfe", b"\xc3\xa9", b"\xc3",
          b"\xef\xbb\xbf", b"nan", b"inf", b"-inf", b"-1", b"1e-400", b"1e400", b"0.5", b"1 2 3", b"0.1 0.2 0.3 0.4",
          b"1_0", b"0x10", b"\r", b"\x00", b"{{k v}}", b"0-0 1-1", b"&apos;", b"[X]"]
field = st.one_of(st.sampled_from(PIECES), st.binary(max_size=12))
line = st.lists(field, min_size=0, max_size=8).flatmap(
    lambda fields: st.sampled_from([b" ||| ", b"|||", b" |||", b"||| "]).map(lambda sep: sep.join(fields)))
table_bytes = st.one_of(
    st.lists(line, max_size=12).flatmap(
        lambda lines: st.tuples(st.sampled_from([b"\n", b"\r\n"]), st.booleans()).map(
            lambda end: end[0].join(lines) + (end[0] if end[1] and lines else b""))),
    st.binary(max_size=600),
)


def check_phrase_table(tmp_path, data: bytes, compress: bool) -> str:
    path = tmp_path / ("t.gz" if compress else "t.txt")
    path.write_bytes(gzip.compress(data) if compress else data)
    try:
        lines = list(read_phrase_table(path, allow_empty=True))
    except PhraseScorerError as exc:
        text = str(exc)
        assert text.startswith(str(path)) and "\n" not in text
        return "error"
    # what parses is exactly the input, line for line, and valid by Moses' rules
    assert b"".join(l.raw + l.eol for l in lines) == data
    counts = set()
    for l in lines:
        assert len(l.fields) >= 3 and l.source_words and l.target_words
        scores = l.scores
        assert all(0 <= s < float("inf") for s in scores)
        counts.add(len(scores))
    assert len(counts) <= 1
    return "parsed"


def fuzz_phrase_table(tmp_path, data, compress):
    outcome = check_phrase_table(tmp_path, data, compress)
    record("fuzz", reader="phrase-table", outcome=outcome)


def fuzz_moses_ini(tmp_path, data):
    path = tmp_path / "moses.ini"
    path.write_bytes(data)
    try:
        ini = MosesIni.read(path)
    except PhraseScorerError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        record("fuzz", reader="moses.ini", outcome="error")
        return
    assert ini.text().encode("utf-8") == data  # unchanged, it writes back byte for byte
    try:  # looking for the phrase table either works or names the problem in one line
        ini.find_phrase_table()
    except PhraseScorerError as exc:
        assert "\n" not in str(exc)
    record("fuzz", reader="moses.ini", outcome="parsed")


def fuzz_nbest(tmp_path, data):
    path = tmp_path / "nbest.txt"
    path.write_bytes(data)
    try:
        entries = list(read_nbest(path))
    except PhraseScorerError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        record("fuzz", reader="n-best", outcome="error")
        return
    assert "".join(e.to_line() for e in entries).encode("utf-8") == data
    record("fuzz", reader="n-best", outcome="parsed")


ini_bytes = st.one_of(
    st.lists(st.sampled_from([b"[feature]", b"[weight]", b"[mapping]", b"0 T 0", b"# comment", b"",
                              b"PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=pt.gz",
                              b"TranslationModel0= 0.2 0.2 0.2 0.2", b"TranslationModel0=0.2",
                              b"KENLM name=LM0 path=lm", b"LM0= 0.5", b"x=", b"=y", b"\xff", b"[weight",
                              b"\t[feature] # x"]) | st.binary(max_size=30),
             max_size=15).map(lambda ls: b"\n".join(ls)),
    st.binary(max_size=400),
)
nbest_bytes = st.one_of(
    st.lists(st.sampled_from([
        b"0 ||| le chat  ||| LM0= -3.5 TranslationModel0= -1 -2 -3 -4 ||| -1.25",
        b"0 ||| a  ||| LM0= -3.5 ||| -1 ||| 0-0", b"x ||| a ||| LM0= 1 ||| 2", b"1 ||| a ||| 1 2 ||| 3",
        b"1 ||| a ||| LM0= nan ||| 3", b"2 ||| a", b"", b"\xff ||| a ||| b= 1 ||| 1", b"3 ||| a ||| sp_x= 1 ||| 0.5",
    ]) | st.binary(max_size=40), max_size=10).map(lambda ls: b"\n".join(ls)),
    st.binary(max_size=300),
)


@QUICK
@given(data=table_bytes, compress=st.booleans())
def test_fuzz_phrase_table(tmp_path_factory, data, compress):
    fuzz_phrase_table(tmp_path_factory.mktemp("f"), data, compress)


@QUICK
@given(data=ini_bytes)
def test_fuzz_moses_ini(tmp_path_factory, data):
    fuzz_moses_ini(tmp_path_factory.mktemp("f"), data)


@QUICK
@given(data=nbest_bytes)
def test_fuzz_nbest(tmp_path_factory, data):
    fuzz_nbest(tmp_path_factory.mktemp("f"), data)


@pytest.mark.fuzz
@LONG
@given(data=table_bytes, compress=st.booleans())
def test_fuzz_phrase_table_long(tmp_path_factory, data, compress):
    fuzz_phrase_table(tmp_path_factory.mktemp("f"), data, compress)


@pytest.mark.fuzz
@LONG
@given(data=ini_bytes)
def test_fuzz_moses_ini_long(tmp_path_factory, data):
    fuzz_moses_ini(tmp_path_factory.mktemp("f"), data)


@pytest.mark.fuzz
@LONG
@given(data=nbest_bytes)
def test_fuzz_nbest_long(tmp_path_factory, data):
    fuzz_nbest(tmp_path_factory.mktemp("f"), data)


# --- reranker files ----------------------------------------------------------------------------------

RERANKER_NBEST = Path(__file__).parent / "data" / "val.nbest.head.gz"  # 3 sentences
RERANKER_LAYOUT = [["LexicalReordering0", 6], ["Distortion0", 1], ["LM0", 1], ["WordPenalty0", 1],
                   ["PhrasePenalty0", 1], ["TranslationModel0", 4]]  # the dense features of RERANKER_NBEST
# written as bare numbers too large for a float: 1e400 (which a JSON reader takes for infinity), 10 ** 400
OVERFLOW, HUGE = "@1e400@", "@10**400@"
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2, 2 ** 70), st.floats(), st.text(max_size=5),
                        st.sampled_from([OVERFLOW, HUGE]))
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
feature_label = st.sampled_from([name for name, _ in RERANKER_LAYOUT] + ["RNN0", "", "a_b", "LM0 ", "x="])
good_weight = st.one_of(st.floats(-2, 2), st.floats(-1e308, 1e308))  # the second can overflow the sums
weight_value = st.one_of(good_weight, json_scalar)
model_record = st.fixed_dictionaries({
    "directory": st.one_of(st.just("/m"), st.lists(st.just("/m"), max_size=3), json_scalar),
    "weights_sha256": st.one_of(st.just("0" * 64), st.lists(st.just("0" * 64), max_size=3), json_scalar),
    "reverse": st.one_of(st.booleans(), json_scalar), "normalize": st.one_of(st.booleans(), json_scalar)})
maybe = object()  # a key left out


@st.composite
def reranker_text(draw) -> bytes:
    """A reranker file: mostly the real layout with good or bad weights, counts and keys; or damage."""
    layout = draw(st.one_of(st.just(RERANKER_LAYOUT), st.just(RERANKER_LAYOUT), json_value,
                            st.lists(st.tuples(feature_label, st.one_of(st.integers(-1, 7), json_scalar)).map(list),
                                     max_size=4)))

    def some_weights(count: int) -> list:
        count = min(max(count, 0), 8)
        return draw(st.one_of(st.lists(weight_value, min_size=count, max_size=count),
                              st.lists(weight_value, max_size=count + 2), json_value))

    weights = {}
    for pair in layout if isinstance(layout, list) else []:
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], int):
            weights[pair[0]] = some_weights(pair[1])
    record = {"format": draw(st.sampled_from(["phrase-scorer-reranker"] * 6 + ["x", None])),
              "version": draw(st.sampled_from([1] * 6 + [2, "1", True, 1.0, None])),
              "layout": layout, "weights": draw(st.one_of(st.just(weights), st.just(weights), json_value)),
              "ignore_features": draw(st.one_of(st.just(maybe), st.lists(feature_label, max_size=2), json_value)),
              "models": draw(st.one_of(st.just(maybe), st.dictionaries(feature_label, model_record | json_value,
                                                                       max_size=2), json_value)),
              "decoder": draw(st.one_of(st.just(maybe), json_value, st.fixed_dictionaries(
                  {"nbest_size": st.one_of(st.none(), st.integers(-1, 200), json_scalar),
                   "decoder_flags": st.one_of(st.none(), st.text(max_size=8), json_scalar,
                                              st.sampled_from(["-v 0 -n-best-list x 10", "-osg g", "-s 4 > x"]))}))),
              "system": draw(st.one_of(st.just(maybe), json_value, st.fixed_dictionaries(
                  {"moses.ini": st.one_of(st.text(max_size=8), json_scalar),
                   "weights": st.one_of(json_value, st.dictionaries(feature_label, st.lists(weight_value, max_size=3),
                                                                    max_size=2))}))),
              "runs": draw(json_value)}
    if draw(st.booleans()):  # a file as rerank writes it, but for the weights of at most one feature
        weights = {name: draw(st.lists(good_weight, min_size=count, max_size=count))
                   for name, count in RERANKER_LAYOUT}
        if draw(st.booleans()):
            name, count = draw(st.sampled_from(RERANKER_LAYOUT))
            weights[name] = some_weights(count)
        record.update(format="phrase-scorer-reranker", version=1, layout=RERANKER_LAYOUT, weights=weights,
                      ignore_features=[], models={}, decoder=maybe)
    for key in draw(st.sets(st.sampled_from(sorted(record)), max_size=2)):
        if draw(st.integers(0, 3)) == 0:
            del record[key]
    text = json.dumps({k: v for k, v in record.items() if v is not maybe})
    text = text.replace(f'"{OVERFLOW}"', "1e400").replace(f'"{HUGE}"', "1" + "0" * 400)
    return text.encode("utf-8")[:draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, 400)))]


reranker_bytes = st.one_of(reranker_text(), reranker_text(), reranker_text(), st.binary(max_size=200))


def fuzz_reranker(tmp_path, data: bytes) -> None:
    """A reranker file either loads to a valid reranker, which gives every sentence of a list its
    line (or refuses the list in one line naming it), or is refused in one line naming the file."""
    import math

    from phrase_scorer.rescoring.reranker import apply_reranker, Reranker

    path = tmp_path / "reranker.json"
    path.write_bytes(data)
    try:
        loaded = Reranker.read(path)
    except PhraseScorerError as exc:
        assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
        record("fuzz", reader="reranker", outcome="error")
        return
    layout = loaded.weights.layout
    assert layout and all(count >= 1 for _, count in layout) and len({name for name, _ in layout}) == len(layout)
    assert all(math.isfinite(v) for v in loaded.weights.values)
    assert loaded.system is None or all(math.isfinite(v) for values in loaded.system["weights"].values()
                                        for v in values)
    given = json.loads(data)["weights"]
    assert loaded.weights.by_name() == {name: [float(v) for v in given[name]] for name, _ in layout}
    out = tmp_path / "out.txt"
    try:
        written = apply_reranker(path, RERANKER_NBEST, out)
    except PhraseScorerError as exc:
        assert str(exc).startswith(f"{RERANKER_NBEST} line 1: ") and "\n" not in str(exc) and not out.exists()
        record("fuzz", reader="reranker", outcome="parsed")
        return
    lines = out.read_text(encoding="utf-8").split("\n")
    assert written == 3 and len(lines) == 4 and all(lines[:3]) and lines[3] == ""
    record("fuzz", reader="reranker", outcome="parsed")


@QUICK
@given(data=reranker_bytes)
def test_fuzz_reranker(tmp_path_factory, data):
    fuzz_reranker(tmp_path_factory.mktemp("f"), data)


@pytest.mark.fuzz
@LONG
@given(data=reranker_bytes)
def test_fuzz_reranker_long(tmp_path_factory, data):
    fuzz_reranker(tmp_path_factory.mktemp("f"), data)


@pytest.mark.parametrize("case, data", [
    ("1 MB line", b"a ||| " + b"b " * 500_000 + b"||| 0.5\n"),
    ("1 MB field without spaces", b"a ||| b ||| 0.5 ||| " + b"x" * 1_000_000 + b"\n"),
    ("BOM", b"\xef\xbb\xbfa ||| b ||| 1\n"),
    ("CRLF", b"a ||| b ||| 1\r\nc ||| d ||| 1\r\n"),
    ("empty", b""),
    ("only newlines", b"\n\n\n"),
    ("||| inside a phrase", b"a|||b ||| c ||| 1\n"),
])
def test_edge_cases(tmp_path, case, data):
    outcome = check_phrase_table(tmp_path, data, compress=False)
    record("edge", reader="phrase-table", case=case, outcome=outcome)


def test_truncated_gzip_at_every_cut(tmp_path):
    data = gzip.compress(b"".join(b"a%d ||| b ||| 0.5\n" % i for i in range(3000)))
    cuts = sorted(random.Random(0).sample(range(1, len(data) - 1), 40))
    path = tmp_path / "cut.gz"
    for cut in cuts:
        path.write_bytes(data[:cut])
        with pytest.raises(PhraseScorerError) as info:
            list(read_phrase_table(path))
        assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)
    record("edge", reader="phrase-table", case=f"gzip cut at {len(cuts)} random offsets", outcome="error",
           count=len(cuts))


WORDS = ["a", "man", "in", "the", "un", "homme", "dans", "le", "chien", "&apos;", "zzqqx", "é", "[X]"]
word_list = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
score = st.floats(min_value=1e-30, max_value=1.0, allow_nan=False).map(lambda v: "%.6g" % v)
valid_line = st.tuples(word_list, word_list, st.lists(score, min_size=4, max_size=4),
                       st.sampled_from(["", " ||| 0-0 ||| 1 1 1"])).map(
    lambda t: f"{t[0]} ||| {t[1]} ||| {' '.join(t[2])}{t[3]}")
valid_table = st.lists(valid_line, min_size=1, max_size=30).map(
    lambda ls: ("\n".join(sorted(ls)) + "\n").encode("utf-8"))


def count_lines(data: bytes) -> int:
    """Lines as a phrase table has them: ended by \\n (a \\r is part of a line), the last maybe unended."""
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.one_of(table_bytes, valid_table))
def test_cli_never_shows_a_traceback(tmp_path_factory, tiny_model, data):
    """Every input either succeeds with one output line per input line, or fails through the
    CLI's handled path: exit status 1 and one ``phrase-scorer: error:`` line. An exception the CLI
    did not handle reaches CliRunner as that exception, not as SystemExit, and fails here."""
    path = tmp_path_factory.mktemp("c") / "t.txt"
    path.write_bytes(data)
    out = Path(str(path) + ".out")
    for args in (["score", "-m", str(tiny_model), str(path)],
                 ["annotate", str(path), "-m", str(tiny_model), "-o", str(out)]):
        result = CliRunner().invoke(cli, args)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        if result.exit_code == 0:
            produced = result.stdout_bytes if args[0] == "score" else out.read_bytes()
            assert count_lines(produced) == count_lines(data)
        else:
            assert result.exit_code == 1
            lines = result.stderr.strip().splitlines()  # log lines (a busy-machine warning) may come first
            assert lines[-1].startswith("phrase-scorer: error: "), result.stderr
            assert not any("Traceback" in l for l in lines)
            assert not out.exists() or args[0] == "score"
        record("fuzz", reader=f"cli {args[0]}", outcome="error" if result.exit_code else "ok")


def test_the_cli_fuzz_reaches_the_success_path(tmp_path, tiny_model):
    """The generated valid tables are valid: a sample of them annotates without error."""
    from hypothesis import find

    example = find(valid_table, lambda d: len(d.splitlines()) >= 5)
    path = tmp_path / "t.txt"
    path.write_bytes(example)
    result = CliRunner().invoke(cli, ["annotate", str(path), "-m", str(tiny_model), "-o", str(tmp_path / "o.txt")])
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "o.txt").read_bytes().splitlines()) == len(example.splitlines())


# --- option values -------------------------------------------------------------------------------------

def numeric_options():
    """(the words naming a verb, its flag, whether it takes whole numbers) for every number option
    of every verb, found by walking the command line's tree, so an option added later is fuzzed
    too."""
    import click

    from phrase_scorer.cli.group import Duration

    def walk(group, path):
        for name, command in sorted(group.commands.items()):
            if isinstance(command, click.Group):
                yield from walk(command, path + (name,))
                continue
            for param in command.params:
                if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType, Duration)):
                    yield path + (name,), max(param.opts, key=len), isinstance(param.type, click.types.IntParamType)

    return list(walk(cli, ()))


NUMERIC_OPTIONS = numeric_options()
HOSTILE_NUMBERS = ["nan", "-nan", "NaN", "inf", "-inf", "+inf", "Infinity", "1e400", "-1e400", "9" * 400,
                   "-" + "9" * 400, str(2 ** 31), str(2 ** 63), str(2 ** 64), str(-2 ** 31 - 1), "-1", "0", "-0",
                   "1e-400", "-1e-400", "1_000", "0x10", " 3 ", "", "1.5", "2h"]
number_text = st.one_of(
    st.sampled_from(HOSTILE_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-2 ** 70, max_value=2 ** 70).map(str),
)


def must_be_refused(value: str, whole: bool) -> bool:
    """What no number option takes, whatever its range: NaN, an infinity; and for a whole-number
    option, a number beyond what a C int holds."""
    import math

    try:
        number = float(value)
    except ValueError:
        return False
    if not math.isfinite(number):
        return True
    if not whole:
        return False
    try:
        return not -2 ** 31 <= int(value) <= 2 ** 31 - 1
    except ValueError:
        return False


def fuzz_option_value(tmp_path, monkeypatch, words: tuple, flag: str, whole: bool, value: str) -> None:
    """A number option given any text: a value no option takes (NaN, an infinity, a number
    beyond a C int) is refused at the parser naming the flag; any other ends with one line (the
    verb's own inputs are not given, so it fails right after parsing) and never a traceback; and
    nothing is left in the working folder."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, [*words, flag, value])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    if must_be_refused(value, whole):
        assert result.exit_code == 2, result.output
        assert lines[-1].startswith("Error: Invalid value for") and f"'{flag}'" in lines[-1], result.output
    elif result.exit_code:
        assert result.exit_code in (1, 2), result.output
        assert lines[-1].startswith("phrase-scorer: error: " if result.exit_code == 1 else "Error: "), result.output
    assert list(tmp_path.iterdir()) == []
    record("fuzz", reader="option values", outcome="error" if result.exit_code else "ok")


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(NUMERIC_OPTIONS), value=number_text)
def test_fuzz_option_values(tmp_path_factory, monkeypatch, option, value):
    fuzz_option_value(tmp_path_factory.mktemp("v"), monkeypatch, *option, value)


@pytest.mark.fuzz
@settings(max_examples=5000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(NUMERIC_OPTIONS), value=number_text)
def test_fuzz_option_values_long(tmp_path_factory, monkeypatch, option, value):
    fuzz_option_value(tmp_path_factory.mktemp("v"), monkeypatch, *option, value)


# --- outputs that are inputs ---------------------------------------------------------------------------

ALIASES = ["same path", "./ in the path", "dir/../ in the path", "symbolic link", "hard link", "input is OUT.part"]


def fuzz_aliased_output(tmp_path, model, data: bytes, verb: str, alias: str) -> None:
    """Whatever the input holds and however the output names it, an output that is the input (or
    whose .part is) is refused with one line naming both, and the input keeps every byte, even
    with --overwrite."""
    folder = tmp_path / "in"
    folder.mkdir()
    source = folder / ("o.txt.part" if alias == "input is OUT.part" else "t.txt")
    source.write_bytes(data)
    output = {
        "same path": str(source),
        "./ in the path": f"{folder}/./{source.name}",
        "dir/../ in the path": f"{folder}/../in/{source.name}",
        "symbolic link": str(tmp_path / "link.txt"),
        "hard link": str(tmp_path / "hard.txt"),
        "input is OUT.part": str(folder / "o.txt"),
    }[alias]
    if alias == "symbolic link":
        os.symlink(source, output)
    elif alias == "hard link":
        os.link(source, output)
    args = {"score": ["score", "-m", str(model), str(source)],
            "annotate": ["annotate", str(source), "-m", str(model)],
            "translate": ["translate", "-m", str(model), str(source)]}[verb]
    result = CliRunner().invoke(cli, [*args, "-o", output, "--overwrite"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("phrase-scorer: error: ") and "is the same file as" in last, last
    assert str(source) in last and output.split("/")[-1] in last
    assert source.read_bytes() == data
    assert sorted(p.name for p in folder.iterdir()) == [source.name]
    record("fuzz", reader=f"aliased output ({verb})", outcome="error")


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.one_of(table_bytes, valid_table), verb=st.sampled_from(["score", "annotate", "translate"]),
       alias=st.sampled_from(ALIASES))
def test_fuzz_aliased_output(tmp_path_factory, tiny_model, data, verb, alias):
    fuzz_aliased_output(tmp_path_factory.mktemp("a"), tiny_model, data, verb, alias)


@pytest.mark.fuzz
@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.one_of(table_bytes, valid_table), verb=st.sampled_from(["score", "annotate", "translate"]),
       alias=st.sampled_from(ALIASES))
def test_fuzz_aliased_output_long(tmp_path_factory, tiny_model, data, verb, alias):
    fuzz_aliased_output(tmp_path_factory.mktemp("a"), tiny_model, data, verb, alias)


# --- the files beside an output, and resume state ----------------------------------------------------

COMPANIONS = ["", ".lock", ".part", ".part.json", ".json"]
STATES = ["absent", "user file", "link to a user file", "dangling link", "directory", "stale lock of this tool",
          "garbled record", "link to a descriptor", "link to a character device"]
# Where the output itself may stand: a link to an open descriptor (as /dev/stdout is, here to a file
# opened for appending) or to a character device: written through, the link kept, nothing beside it.
THROUGH = ("link to a descriptor", "link to a character device")
KEPT_BYTES = b"bytes that belong to the user\n"


def fuzz_companions(tmp_path, model, data: bytes, verb: str, states: dict, overwrite: bool, resume: bool) -> None:
    """Whatever stands where a command writes its output and the files beside it (a user's file,
    a link to one, a dangling link, a folder, a stale lock, a garbled resume record), with or
    without --overwrite and --resume: the command succeeds or fails with one line, every file it
    did not create keeps its bytes (only OUT and OUT.json may be replaced, and only with
    --overwrite, a link among them replaced as a link), and it leaves nothing of its own behind
    but a finished output."""
    from phrase_scorer.io.output_lock import LOCK_MAGIC

    folder, outside = tmp_path / "run", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    source = folder / "t.txt"
    source.write_bytes(data)
    out = folder / "o.txt"
    kept = {}  # path -> bytes it must keep
    descriptor = None  # the descriptor a link at OUT names
    for suffix, state in states.items():
        path = Path(f"{out}{suffix}")
        target = outside / f"target{suffix or '.out'}"
        if state == "user file":
            path.write_bytes(KEPT_BYTES)
        elif state == "link to a user file":
            target.write_bytes(KEPT_BYTES)
            path.symlink_to(target)
            kept[target] = KEPT_BYTES
        elif state == "dangling link":
            path.symlink_to(outside / f"nothing{suffix}")
        elif state == "directory":
            path.mkdir()
        elif state == "stale lock of this tool":
            path.write_bytes(LOCK_MAGIC + b"pid 999999\n")
        elif state == "garbled record":
            path.write_bytes(b"{\"lines_done\": 3, \"bytes")
        elif state == "link to a descriptor":
            target.write_bytes(KEPT_BYTES)
            descriptor = os.open(target, os.O_WRONLY | os.O_APPEND)
            path.symlink_to(f"/proc/self/fd/{descriptor}")
        elif state == "link to a character device":
            path.symlink_to("/dev/null")
        if state in ("user file", "garbled record") and suffix not in ("", ".json"):
            kept[path] = path.read_bytes()
        if suffix in ("", ".json") and state == "user file" and not overwrite:
            kept[path] = KEPT_BYTES
    before = {p.name for p in folder.iterdir()}
    args = {"score": ["score", "-m", str(model), str(source)],
            "annotate": ["annotate", str(source), "-m", str(model)],
            "translate": ["translate", "-m", str(model), str(source)]}[verb]
    flags = [*(["--overwrite"] if overwrite else []), *(["--resume"] if resume and verb == "annotate" else [])]
    try:
        result = CliRunner().invoke(cli, [*args, "-o", str(out), *flags])
    finally:
        if descriptor is not None:
            os.close(descriptor)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2), result.stderr  # 2: the option parser's usage error (OUT is a folder)
    assert "Traceback" not in result.stderr
    if result.exit_code:
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("phrase-scorer: error: " if result.exit_code == 1 else "Error: "), result.stderr
    for path, saved in kept.items():
        assert path.read_bytes() == saved, (path, states, result.stderr)
    for path in outside.iterdir():  # the file behind a descriptor keeps its bytes and gets the output after them
        written = path.read_bytes()
        assert written == KEPT_BYTES or (states[""] == "link to a descriptor" and written.startswith(KEPT_BYTES)), \
            (path, states)
    left = {p.name for p in folder.iterdir()} - before
    assert left <= {"o.txt", "o.txt.json"} and not (states[""] in THROUGH and left), (left, states, result.stderr)
    if states[""] in THROUGH:
        assert out.is_symlink(), (states, result.stderr)  # written through, never replaced
    elif result.exit_code == 0:
        assert out.is_file() and not out.is_symlink()
    record("fuzz", reader=f"companion files ({verb})", outcome="error" if result.exit_code else "ok")


companion_states = st.fixed_dictionaries({suffix: st.sampled_from(
    [s for s in STATES if (s != "stale lock of this tool" or suffix == ".lock")
     and (s != "garbled record" or suffix == ".part.json") and (s not in THROUGH or suffix == "")])
    for suffix in COMPANIONS})


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=valid_table, verb=st.sampled_from(["score", "annotate", "translate"]), states=companion_states,
       overwrite=st.booleans(), resume=st.booleans())
def test_fuzz_companion_files_and_resume_state(tmp_path_factory, tiny_model, data, verb, states, overwrite, resume):
    fuzz_companions(tmp_path_factory.mktemp("c"), tiny_model, data, verb, states, overwrite, resume)


@pytest.mark.fuzz
@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=valid_table, verb=st.sampled_from(["score", "annotate", "translate"]), states=companion_states,
       overwrite=st.booleans(), resume=st.booleans())
def test_fuzz_companion_files_and_resume_state_long(tmp_path_factory, tiny_model, data, verb, states, overwrite,
                                                     resume):
    fuzz_companions(tmp_path_factory.mktemp("c"), tiny_model, data, verb, states, overwrite, resume)


# --- interruptions -----------------------------------------------------------------------------------


def phrase_scorer(*args) -> list:
    return [sys.executable, "-m", "phrase_scorer", *map(str, args)]


def kill_and_resume(args, points, ready: Path):
    """Run ``phrase-scorer ARGS``, halted at each of ``points`` in turn (see tests/pause_at.py) and
    SIGKILLed there, adding ``--resume`` from the second run on; then run it to the end.
    Returns the stderr of each resumed run."""
    messages = []
    for i, point in enumerate(points):
        proc = start_halted(point, [*args, *(["--resume"] if i else [])], ready)
        assert kill(proc) == -signal.SIGKILL
        if i:
            messages.append(proc.stderr.read())
    last = subprocess.run(phrase_scorer(*args, "--resume"), capture_output=True, text=True)
    assert last.returncode == 0, last.stderr
    return messages + [last.stderr]


def test_annotate_killed_at_random_points_resumes_to_the_same_bytes(tmp_path, tiny_model):
    """SIGKILL in the middle of writing a random chunk (a random fraction of its bytes written),
    four times, each run resuming the last; the result equals an uninterrupted run."""
    args = ["annotate", EXAMPLE_TABLE, "-m", tiny_model, "--window-lines", 250, "--threads", 1]
    reference = tmp_path / "ref.gz"
    subprocess.run(phrase_scorer(*args, "-o", reference), check=True, capture_output=True)
    rng = random.Random(7)
    out = tmp_path / "out.gz"
    chunks = [rng.randint(1, 30) for _ in range(4)]  # the halted chunk, counted from each run's start
    points = [f"write:{out}:{n}:{rng.random():.3f}" for n in chunks]
    messages = kill_and_resume([*args, "-o", out], points, tmp_path / "ready")
    # each resumed run starts after exactly the chunks its predecessors completed
    resumed_after = [int(m.split("resuming after ")[1].split()[0]) for m in messages]
    assert resumed_after == [sum((n - 1) * 250 for n in chunks[: i + 1]) for i in range(len(chunks))]
    assert out.read_bytes() == reference.read_bytes()
    assert (len(gzip.decompress(out.read_bytes()).splitlines())
            == len(gzip.decompress(EXAMPLE_TABLE.read_bytes()).splitlines()))
    record("kill", command="annotate", kills=len(points), lost="nothing")


def test_annotate_ctrl_c_keeps_the_part_and_says_how_to_resume(tmp_path, tiny_model):
    """The table comes through a pipe the test holds open, so the run cannot finish before Ctrl-C."""
    lines = gzip.decompress(EXAMPLE_TABLE.read_bytes()).splitlines(keepends=True)
    fifo = tmp_path / "table.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out.gz"
    proc = subprocess.Popen(phrase_scorer("annotate", fifo, "-m", tiny_model, "-o", out, "--window-lines", 200,
                                          "--threads", 1), stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    record_path = Path(str(out) + ".part.json")
    with open(fifo, "wb") as feed:
        feed.write(b"".join(lines[:1000]))  # five whole windows, and the pipe stays open
        feed.flush()
        deadline = time.monotonic() + 600
        while lines_done(record_path) < 1000:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the first 1000 lines were not written"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)  # the run ends while the pipe is still open
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("phrase-scorer: error: interrupted") and "--resume" in last
    assert not out.exists() and Path(str(out) + ".part").exists()
    assert lines_done(record_path) == 1000
    assert len(gzip.decompress(Path(str(out) + ".part").read_bytes()).splitlines()) == 1000
    record("kill", command="annotate", kills=1, signal="SIGINT", lost="nothing")


def lines_done(record: Path) -> int:
    try:
        return json.loads(record.read_text()).get("lines_done", 0)
    except (OSError, ValueError):
        return 0


def checkpoint(directory: Path) -> dict:
    return torch.load(directory / "checkpoint.pt", weights_only=True)


def test_train_killed_at_random_points_resumes_to_the_same_state(tmp_path):
    """SIGKILL in the middle of training at three random steps, each run resuming from the last
    checkpoint: the result equals an uninterrupted run."""
    args = ["train", EXAMPLE_TABLE, "--preset", "tiny", "--valid-pairs", 200, "--valid-every", 15, "--batch-size", 16,
            "--max-steps", 240, "--seed", 4, "--threads", 1]
    subprocess.run(phrase_scorer(*args, "-o", tmp_path / "whole"), check=True, capture_output=True)
    rng = random.Random(3)
    out = tmp_path / "cut"
    steps = sorted(rng.sample(range(16, 239), 3))  # after the first checkpoint (step 15)
    messages = kill_and_resume([*args, "-o", out], [f"step:{s}" for s in steps], tmp_path / "ready")
    a, b = checkpoint(tmp_path / "whole"), checkpoint(out)
    assert a["state"]["step"] == b["state"]["step"] == 240
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    steps_logged = [json.loads(l)["step"] for l in (out / "train.log.jsonl").read_text().splitlines()]
    assert steps_logged == list(range(15, 241, 15))  # no repeated or lost validations
    assert len(messages) == len(steps)
    record("kill", command="train", kills=len(steps), lost="nothing")


# --- disk full -----------------------------------------------------------------------------------------


def small_tmpfs(path: Path, size: str = "600k"):
    """A tiny tmpfs at ``path`` if this process may mount one (root on Linux), else None."""
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return None
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return path if done.returncode == 0 else None


def test_disk_full_while_annotating(tmp_path, tiny_model, monkeypatch):
    disk = small_tmpfs(tmp_path / "disk")
    out = tmp_path / "disk" / "out.gz"
    try:
        if disk is None:  # simulate: the file's writes fail with ENOSPC after some output
            from phrase_scorer.io import atomic

            class FullDisk:
                def __init__(self, file):
                    self.file, self.written = file, 0

                def write(self, data):
                    self.written += len(data)
                    if self.written > 300_000:
                        raise OSError(errno.ENOSPC, "No space left on device")
                    return self.file.write(data)

                def __getattr__(self, name):
                    return getattr(self.file, name)

            original_init = atomic.AtomicOutput.__init__

            def init(self, *args, **kwargs):
                original_init(self, *args, **kwargs)
                self.file = FullDisk(self.file)

            monkeypatch.setattr(atomic.AtomicOutput, "__init__", init)
        out.write_bytes(b"the previous table")
        result = CliRunner().invoke(cli, ["annotate", str(EXAMPLE_TABLE), "-m", str(tiny_model), "-o", str(out),
                                          "--overwrite"])
        assert result.exit_code == 1
        assert "no space left on the device" in result.stderr.strip().splitlines()[-1]
        assert out.read_bytes() == b"the previous table"
        record("fault", fault="disk full while annotating", how="tmpfs" if disk else "simulated ENOSPC", lost="nothing")
    finally:
        if disk is not None:
            subprocess.run(["umount", str(disk)])


def test_disk_full_while_saving_a_checkpoint(tmp_path, monkeypatch):
    import phrase_scorer.model_dir as model_dir

    calls = {"n": 0}
    real_save = torch.save

    def failing_save(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(model_dir.torch, "save", failing_save)
    out = tmp_path / "m"
    result = CliRunner().invoke(cli, ["train", str(EXAMPLE_TABLE), "-o", str(out), "--preset", "tiny",
                                      "--valid-pairs", "100", "--valid-every", "5", "--max-steps", "30",
                                      "--batch-size", "8"])
    assert result.exit_code == 1
    assert "no space left on the device" in result.stderr.strip().splitlines()[-1]
    # the last good checkpoint is intact and resumable
    assert checkpoint(out)["state"]["step"] == 5
    assert not list(out.glob("*.part"))
    record("fault", fault="disk full while saving a checkpoint", how="simulated ENOSPC", lost="nothing")


# --- untrusted model files -----------------------------------------------------------------------------


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("container", ["torch-zip", "raw-pickle"])
def test_a_model_file_carrying_code_is_refused(tmp_path, tiny_model, container):
    model = tmp_path / "m"
    shutil.copytree(tiny_model, model, ignore=shutil.ignore_patterns("cache"))
    marker = tmp_path / "pwned"
    state = torch.load(model / "model.pt", weights_only=True)
    state["readout.output.bias"] = Payload(marker)
    if container == "torch-zip":
        torch.save(state, model / "model.pt")
    else:
        with open(model / "model.pt", "wb") as f:
            pickle.dump(state, f, protocol=2)  # the protocol torch.load expects, so the payload is reached
    result = CliRunner().invoke(cli, ["score", "-m", str(model), str(EXAMPLE_TABLE)])
    assert result.exit_code == 1
    assert "refused to load" in result.stderr.strip().splitlines()[-1]
    assert not marker.exists()
    record("untrusted", container=container, outcome="refused, payload not run")


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "vocab.target.json").write_text('{"format": "phrase-scorer-vocabulary", '
                                                    '"tokens": ["<pad>", "</s>", "<unk>", "a"]}'),
     "is not the vocabulary these weights were trained with"),
    (lambda d: (d / "config.json").write_text("{not json"), "config is not valid JSON"),
    (lambda d: (d / "model.pt").write_bytes(b"garbage"), "not a readable PyTorch weights file"),
    (lambda d: (d / "vocab.source.json").unlink(), "vocabulary file is missing"),
])
def test_damaged_model_directories_give_clear_errors(tmp_path, tiny_model, damage, message):
    model = tmp_path / "m"
    shutil.copytree(tiny_model, model, ignore=shutil.ignore_patterns("cache"))
    damage(model)
    result = CliRunner().invoke(cli, ["score", "-m", str(model), str(EXAMPLE_TABLE)])
    assert result.exit_code == 1 and message in result.stderr.strip().splitlines()[-1], result.stderr
    record("untrusted", container="damaged directory", outcome="clear error")


# --- damaged model directories -------------------------------------------------------------------------

MODEL_PAIRS = [("a man", "un homme"), ("the dog", "le chien"), ("a man in a red shirt", "un homme en chemise rouge")]
MODEL_KEYS = ["arch", "embedding_dim", "hidden_dim", "maxout_units", "maxout_pieces", "output_rank",
              "source_shortlist", "target_shortlist", "init_std", "recurrent_init_scale", "alignment_dim"]
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
size_value = st.one_of(st.integers(-2**40, 2**40),
                       st.sampled_from([0, 1, -1, 2, 16, 32, 500, 503, 2**16, 2**31, 10**12]),
                       st.sampled_from([16.0, 2.5, "16", True, False, None, float("nan"), float("inf")]), json_value)
model_damage = st.one_of(
    st.tuples(st.just("config.json: model setting"), st.sampled_from(MODEL_KEYS), size_value),
    st.tuples(st.just("config.json: model setting removed"), st.sampled_from(MODEL_KEYS), st.none()),
    st.tuples(st.just("config.json: top-level key"),
              st.sampled_from(["source_vocab_size", "target_vocab_size", "vocab_sha256", "model", "format", "preset",
                               "training"]), size_value),
    st.tuples(st.just("vocabulary truncated"), st.sampled_from(["source", "target"]), st.floats(0, 1)),
    st.tuples(st.just("vocabularies swapped"), st.none(), st.none()),
    st.tuples(st.just("vocabulary garbled"), st.sampled_from(["source", "target"]),
              st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=8))),
    st.tuples(st.just("weights truncated"), st.none(), st.floats(0, 1)),
    st.tuples(st.just("weights garbled"), st.none(), st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=8))),
    st.tuples(st.just("weights bit flipped"), st.none(), st.tuples(st.floats(0, 1), st.integers(0, 7))),
)


def model_scores(loaded) -> list:
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    sources = [loaded.source_vocab.encode(s.split()) for s, _ in MODEL_PAIRS]
    targets = [loaded.target_vocab.encode(t.split()) for _, t in MODEL_PAIRS]
    return BatchScorer(loaded.model).score(sources, targets).tolist()


def damage_model(folder: Path, kind: str, where, value) -> None:
    def at(data: bytes, fraction: float) -> int:
        return min(int(len(data) * fraction), max(len(data) - 1, 0))

    if kind.startswith("config.json"):
        config = json.loads((folder / "config.json").read_text())
        if kind == "config.json: model setting":
            config["model"][where] = value
        elif kind == "config.json: model setting removed":
            config["model"].pop(where, None)
        else:
            config[where] = value
        (folder / "config.json").write_text(json.dumps(config))
    elif kind == "vocabularies swapped":
        source, target = folder / "vocab.source.json", folder / "vocab.target.json"
        data = source.read_bytes()
        source.write_bytes(target.read_bytes())
        target.write_bytes(data)
    else:
        path = folder / (f"vocab.{where}.json" if kind.startswith("vocabulary") else "model.pt")
        data = bytearray(path.read_bytes())
        if kind.endswith("truncated"):
            data = data[:at(data, value)]
        elif kind.endswith("garbled"):
            start = at(data, value[0])
            data[start:start + len(value[1])] = value[1]
        else:  # one bit flipped
            data[at(data, value[0])] ^= 1 << value[1]
        path.write_bytes(bytes(data))


def fuzz_model_directory(tmp_path: Path, model: Path, reference: list, damage) -> None:
    """A model directory damaged in one place either loads and scores exactly as before, or is
    refused with one line naming a file of the directory; never another exception."""
    from phrase_scorer.model_dir import ModelDirectory

    folder = tmp_path / "m"
    shutil.copytree(model, folder, ignore=shutil.ignore_patterns("cache", "checkpoint.pt", "recent", "train.log.jsonl"))
    damage_model(folder, *damage)
    try:
        loaded = ModelDirectory(folder).load()
    except PhraseScorerError as exc:
        text = str(exc)
        assert text.startswith(str(folder)) and "\n" not in text, text
        record("fuzz", reader=f"model directory ({damage[0]})", outcome="error")
        return
    assert model_scores(loaded) == reference, damage
    record("fuzz", reader=f"model directory ({damage[0]})", outcome="parsed")


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(damage=model_damage)
def test_fuzz_model_directory(tmp_path_factory, tiny_model, loaded_tiny, damage):
    fuzz_model_directory(tmp_path_factory.mktemp("md"), tiny_model, model_scores(loaded_tiny), damage)


@pytest.mark.fuzz
@settings(max_examples=3000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(damage=model_damage)
def test_fuzz_model_directory_long(tmp_path_factory, tiny_model, loaded_tiny, damage):
    fuzz_model_directory(tmp_path_factory.mktemp("md"), tiny_model, model_scores(loaded_tiny), damage)


# --- concurrent runs -----------------------------------------------------------------------------------


def test_two_trainings_of_one_directory(tmp_path):
    out = tmp_path / "m"
    proc = start_halted("step:5", ["train", EXAMPLE_TABLE, "-o", out, "--preset", "tiny", "--max-steps", 100,
                                   "--threads", 1], tmp_path / "ready")
    try:
        result = CliRunner().invoke(cli, ["train", str(EXAMPLE_TABLE), "-o", str(out), "--preset", "tiny", "--resume"])
        assert result.exit_code == 1
        assert "another phrase-scorer run is writing this output" in result.stderr
    finally:
        kill(proc)
    record("lock", command="train", outcome="second run refused")


def test_two_annotations_of_one_output(tmp_path, tiny_model):
    out = tmp_path / "out.gz"
    proc = start_halted(f"write:{out}:2:0.5", ["annotate", EXAMPLE_TABLE, "-m", tiny_model, "-o", out,
                                              "--window-lines", 100, "--threads", 1], tmp_path / "ready")
    try:
        result = CliRunner().invoke(cli, ["annotate", str(EXAMPLE_TABLE), "-m", str(tiny_model), "-o", str(out)])
        assert result.exit_code == 1
        assert "another phrase-scorer run is writing this output" in result.stderr
    finally:
        kill(proc)
    record("lock", command="annotate", outcome="second run refused")


class StuckInbox:
    """An inbox whose read never ends, as a read of a partial message left by a killed parent."""

    def get(self, timeout=None):
        time.sleep(3600)


def test_a_worker_whose_parent_is_gone_leaves_even_in_the_middle_of_a_read():
    """A worker blocked in a read leaves by itself once its parent is gone (here: a parent id
    that is not its parent's), instead of living on and holding the parent's stderr open."""
    import multiprocessing

    from phrase_scorer.runtime import workers as parallel

    process = multiprocessing.get_context("spawn").Process(target=parallel._serve,
                                                           args=(dict, (), StuckInbox(), {}, -1))
    process.start()
    process.join(timeout=60)
    if process.exitcode is None:  # still reading: end it, so that the failure does not hang the suite
        process.kill()
        process.join()
    assert process.exitcode == 1
