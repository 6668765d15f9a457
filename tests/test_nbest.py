"""Moses n-best lists: byte-exact round trips, feature parsing, and every bad line named."""

from __future__ import annotations

import gzip
import io

import pytest

from conftest import DATA, SHARED_SYSTEM, require_shared
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.nbest import (
    NBestEntry,
    dense_feature_vector,
    group_by_sentence,
    parse_nbest_line,
    read_nbest,
    write_nbest,
)

NBEST = DATA / "val.nbest.head.gz"
LABELS = ["LexicalReordering0", "Distortion0", "LM0", "WordPenalty0", "PhrasePenalty0", "TranslationModel0"]


def raw_bytes(path) -> bytes:
    with gzip.open(path, "rb") as f:
        return f.read()


def write(tmp_path, content: bytes, name: str = "nbest.txt") -> str:
    path = tmp_path / name
    path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    return str(path)


def test_the_real_list_round_trips_byte_for_byte(tmp_path):
    entries = list(read_nbest(NBEST))
    assert len(entries) == 221
    buffer = io.BytesIO()
    assert write_nbest(entries, buffer) == 221
    assert buffer.getvalue() == raw_bytes(NBEST)
    write_nbest(entries, tmp_path / "copy.gz")
    assert raw_bytes(tmp_path / "copy.gz") == raw_bytes(NBEST)
    write_nbest(entries, tmp_path / "copy.txt")
    assert (tmp_path / "copy.txt").read_bytes() == raw_bytes(NBEST)
    text = io.StringIO()
    write_nbest(entries, text)
    assert text.getvalue() == raw_bytes(NBEST).decode("utf-8")


def test_the_first_entry_is_parsed(tmp_path):
    first = next(iter(read_nbest(NBEST)))
    assert first.sentence_id == 0
    assert first.hypothesis == " un groupe d&apos; hommes chargeant coton dans un camion  "
    assert first.text == "un groupe d&apos; hommes chargeant coton dans un camion"
    assert [name for name, _ in first.features] == LABELS
    assert first.feature("TranslationModel0") == [-5.35358, -12.1966, -5.93104, -8.39824]
    assert first.feature("LM0") == [-40.8162]
    assert first.feature("LexicalReordering0") == [-3.00519, 0, 0, -1.03754, 0, 0]
    assert first.total == -3.10178
    assert first.extra == [" 0-0 1-1 2-2 3-3 5-4 6-5 7-6 8-7 9-8 "]  # the word alignment
    assert (first.line_number, first.eol) == (1, "\n")


def test_every_entry_has_the_same_dense_features():
    entries = list(read_nbest(NBEST))
    for entry in entries:
        assert [name for name, _ in entry.features] == LABELS
        vector = dense_feature_vector(entry)
        assert len(vector) == 6 + 1 + 1 + 1 + 1 + 4
        assert vector[-4:] == entry.feature("TranslationModel0")
        assert len(entry.extra) == 1
    assert dense_feature_vector(entries[0])[7] == -40.8162  # LM0 after the 6 reordering and 1 distortion values


def test_entries_are_grouped_by_consecutive_sentence_ids():
    groups = [(sentence, len(entries)) for sentence, entries in group_by_sentence(read_nbest(NBEST))]
    assert groups == [(0, 100), (1, 33), (2, 88)]
    lines = [NBestEntry(i, " x ", [], 0.0) for i in (0, 0, 3, 0)]
    assert [(s, len(e)) for s, e in group_by_sentence(lines)] == [(0, 2), (3, 1), (0, 1)]


@pytest.mark.parametrize(
    "line",
    [
        # Moses2: four fields, nothing after the total
        "7 ||| le chat  ||| LM0= -12.5 WordPenalty0= -2 TranslationModel0= -1 -2 -3 -4 ||| -4.25\n",
        # Moses 1 with segmentation and alignment
        "0 ||| a b  ||| LM0= -3 ||| -1.5 ||| 0-0=0-0 1-1=1-1 ||| 0-0 1-1 \n",
        # a sparse feature, inf, and a last line without newline
        "12 ||| x  ||| TranslationModel0= -1 TranslationModel0_unk= 1 LM0= -inf ||| -inf",
        # no features at all (everything untuneable) and odd spacing
        "3|||y|||   |||0",
    ],
)
def test_other_layouts_round_trip(tmp_path, line):
    path = write(tmp_path, line.encode("utf-8"))
    entries = list(read_nbest(path))
    assert len(entries) == 1
    buffer = io.BytesIO()
    write_nbest(entries, buffer)
    assert buffer.getvalue() == line.encode("utf-8")


@pytest.mark.parametrize(
    "field",
    [
        " LM0= -3 WordPenalty0= -2 TranslationModel0= -1 -2.5 .5 5. 1e5 -1.5E-07 1.e5 ",
        " A= 1 2B= 3 ",  # a label that starts with digits
        " a=b= 1 ",  # a label with '=' inside
        " L= inf -INFINITY nan +Inf ",
        " L=\u00a01 M= 2\r\v",  # spaces of other kinds
        " TranslationModel0_unk= 1 LM0= -7 ",  # a sparse feature
        "L= 1   M= 2",  # no outer spaces, several between
        "",
        "   ",
    ],
)
def test_features_read_at_once_are_those_read_token_by_token(field):
    from phrase_scorer.io.nbest import _checked_features

    entry = parse_nbest_line(f"0 ||| x  |||{field}||| -1")
    assert repr(entry.features) == repr(_checked_features(field.split(), PhraseScorerError))  # nan == nan here
    assert entry.to_line() == f"0 ||| x  |||{field}||| -1\n"


def test_sparse_features_are_kept_but_not_dense():
    entry = parse_nbest_line("12 ||| x  ||| TranslationModel0= -1 -2 TranslationModel0_unk= 1 LM0= -7 ||| -3")
    assert entry.features == [("TranslationModel0", [-1, -2]), ("TranslationModel0_unk", [1]), ("LM0", [-7])]
    assert dense_feature_vector(entry) == [-1, -2, -7]
    assert entry.extra == []


def test_changed_fields_are_written_like_moses_and_the_rest_is_kept():
    first = next(iter(read_nbest(NBEST)))
    original = first.to_line()
    first.features.append(("RNN0", [-0.541522, 1.0]))
    first.total = -3.5
    line = first.to_line()
    assert line == original.replace(
        "-8.39824 ||| -3.10178 |||", "-8.39824 RNN0= -0.541522 1 ||| -3.5 |||"
    )
    again = parse_nbest_line(line.rstrip("\n"))
    assert again.feature("RNN0") == [-0.541522, 1.0] and again.total == -3.5
    new = NBestEntry(4, " a b  ", [("LM0", [-1.25])], 0.123456789)
    assert new.to_line() == "4 ||| a b  ||| LM0= -1.25 ||| 0.123456789\n"


@pytest.mark.parametrize(
    "bad, message",
    [
        ("0 ||| a  ||| LM0= -3", "expected at least 4 fields separated by '|||', found 3"),
        ("x ||| a  ||| LM0= -3 ||| -1", "sentence id 'x' is not a whole number"),
        ("-1 ||| a  ||| LM0= -3 ||| -1", "sentence id -1 is negative"),
        ("0 ||| a  ||| -3 LM0= -3 ||| -1", "feature value '-3' comes before any 'Name=' label"),
        ("0 ||| a  ||| LM0= -3x ||| -1", "feature value '-3x' of LM0 is not a number"),
        ("0 ||| a  ||| LM0= 1_0 ||| -1", "feature value '1_0' of LM0 is not a number"),
        ("0 ||| a  ||| X_y= 1 LM0= 2 1_0 ||| -1", "feature value '1_0' of LM0 is not a number"),
        ("0 ||| a  ||| LM0= -3 WordPenalty0= ||| -1", "feature WordPenalty0= has no values"),
        ("0 ||| a  ||| LM0=-3 ||| -1", "'LM0=-3' is not 'Name= value'"),
        ("0 ||| a  ||| LM0= WordPenalty0= -1 ||| -1", "feature LM0= has no values"),
        ("0 ||| a  ||| LM0= -3 = 1 ||| -1", "a feature label '=' without a name"),
        ("0 ||| a  ||| LM0= -3 ||| total", "total score 'total' is not a number"),
    ],
)
def test_malformed_lines_are_named(tmp_path, bad, message):
    good = raw_bytes(NBEST).split(b"\n", 1)[0] + b"\n"
    path = write(tmp_path, good + bad.encode("utf-8") + b"\n", "bad.gz")
    with pytest.raises(PhraseScorerError) as caught:
        list(read_nbest(path))
    assert caught.value.message == message
    assert (caught.value.path, caught.value.line) == (path, 2)
    assert str(caught.value).startswith(f"{path} line 2: ")


def test_invalid_utf8_and_truncated_gzip_are_named(tmp_path):
    path = write(tmp_path, b"0 ||| d\xe9j\xe0  ||| LM0= -3 ||| -1\n")
    with pytest.raises(PhraseScorerError, match="invalid UTF-8") as caught:
        list(read_nbest(path))
    assert caught.value.line == 1
    truncated = tmp_path / "cut.gz"
    truncated.write_bytes(NBEST.read_bytes()[:-200])
    with pytest.raises(PhraseScorerError, match="truncated|gzip") as caught:
        list(read_nbest(truncated))
    assert caught.value.path == str(truncated)


def test_reading_is_lazy(tmp_path):
    content = raw_bytes(NBEST).split(b"\n", 1)[0] + b"\nbroken line\n"
    entries = read_nbest(write(tmp_path, content))
    assert next(entries).sentence_id == 0  # the bad second line is not read yet
    with pytest.raises(PhraseScorerError):
        next(entries)


def test_the_full_real_list_round_trips(tmp_path):
    require_shared()
    path = SHARED_SYSTEM / "val.nbest.gz"
    out = tmp_path / "copy.gz"
    count = write_nbest(read_nbest(path), out)
    assert raw_bytes(out) == raw_bytes(path)
    ids = [sentence for sentence, _ in group_by_sentence(read_nbest(path))]
    assert ids == list(range(100)) and count > 1000
