"""The phrase-table reader: fields kept byte for byte, and every bad line named."""

from __future__ import annotations

import gzip

import pytest

from conftest import A_MAN_TABLE, head_lines
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.phrase_table import read_phrase_table, split_words


def write(tmp_path, content: bytes, name: str = "pt") -> str:
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(content))
    else:
        path.write_bytes(content)
    return str(path)


def test_reads_the_real_slice_with_all_fields(tmp_path):
    lines = list(read_phrase_table(A_MAN_TABLE))
    raw = head_lines(A_MAN_TABLE, 10**6)
    assert len(lines) == len(raw) == 2020
    for line, data in zip(lines, raw):
        assert line.raw + line.eol == data
        assert len(line.fields) == 7  # src tgt scores align counts sparse properties
        assert line.source_words and line.target_words
        assert len(line.scores) == 4


@pytest.mark.parametrize(
    "line, values, expected",
    [
        # the Moses layout with empty trailing fields
        (b"a ||| b ||| 0.5 0.25 ||| 0-0 ||| 1 1 1 ||| |||\n", b"0.1 1",
         b"a ||| b ||| 0.5 0.25 0.1 1 ||| 0-0 ||| 1 1 1 ||| |||\n"),
        # three fields, no newline at the end of the file
        (b"a b ||| c ||| 1", b"0.1 1", b"a b ||| c ||| 1 0.1 1"),
        # odd spacing and a tab are kept
        (b"a  b|||c\t|||  0.5\t 1  |||x\n", b"2", b"a  b|||c\t|||  0.5\t 1 2  |||x\n"),
        # CRLF: the carriage return stays where it was, after the scores
        (b"a ||| b ||| 0.5\r\n", b"7", b"a ||| b ||| 0.5 7\r\n"),
        # sparse and property fields
        (b"a ||| b ||| 1 ||| 0-0 ||| 1 1 1 ||| sp 3 ||| {{k v}}\n", b"9",
         b"a ||| b ||| 1 9 ||| 0-0 ||| 1 1 1 ||| sp 3 ||| {{k v}}\n"),
    ],
)
def test_appending_scores_changes_nothing_else(tmp_path, line, values, expected):
    (parsed,) = list(read_phrase_table(write(tmp_path, line)))
    assert parsed.with_scores_appended(values) == expected


def test_words_split_on_spaces_and_tabs_only():
    assert split_words(" a\tb  c ") == ["a", "b", "c"]
    assert split_words("a\u00a0b") == ["a\u00a0b"]  # a no-break space is part of a word in Moses


def test_plain_and_gzip_give_the_same_lines(tmp_path):
    content = b"x ||| y ||| 0.5\nx ||| z ||| 0.25\n"
    plain = [l.raw for l in read_phrase_table(write(tmp_path, content, "t.txt"))]
    packed = [l.raw for l in read_phrase_table(write(tmp_path, content, "t.gz"))]
    assert plain == packed == [b"x ||| y ||| 0.5", b"x ||| z ||| 0.25"]


@pytest.mark.parametrize(
    "content, line, message",
    [
        (b"a ||| b ||| 1\na ||| b\n", 2, "expected at least 3 fields"),
        (b"a ||| b ||| 1\n ||| b ||| 1\n", 2, "empty source phrase"),
        (b"a |||   ||| 1\n", 1, "empty target phrase"),
        (b"a ||| b ||| 1 x\n", 1, "score 'x' is not a number"),
        (b"a ||| b ||| nan\n", 1, "score 'nan' is not a number"),
        (b"a ||| b ||| 1_0\n", 1, "score '1_0' is not a number"),
        (b"a ||| b ||| -0.5\n", 1, "not a finite non-negative number"),
        (b"a ||| b ||| inf\n", 1, "not a finite non-negative number"),
        (b"a ||| b ||| 1 1\na ||| c ||| 1 1\na ||| d ||| 1\n", 3, "found 1 scores where the first line has 2"),
        (b"a ||| b ||| 1\nd\xe9j\xe0 ||| b ||| 1\n", 2, "invalid UTF-8 at byte 2"),
        (b"\xef\xbb\xbfa ||| b ||| 1\n", 1, "byte-order mark"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, content, line, message):
    path = write(tmp_path, content, "bad.gz")
    with pytest.raises(PhraseScorerError) as info:
        list(read_phrase_table(path))
    text = str(info.value)
    assert text.startswith(f"{path} line {line}: ")
    assert message in text
    assert "\n" not in text


def test_tiny_scores_are_accepted_as_zero(tmp_path):
    (line,) = list(read_phrase_table(write(tmp_path, b"a ||| b ||| 1e-400 0\n")))
    assert line.scores == [0.0, 0.0]


def test_empty_file(tmp_path):
    path = write(tmp_path, b"", "empty.gz")
    with pytest.raises(PhraseScorerError, match="the file is empty"):
        list(read_phrase_table(path))


def test_truncated_gzip_names_the_last_good_line(tmp_path):
    data = gzip.compress(b"".join(b"a ||| b%d ||| 0.5\n" % i for i in range(20000)))
    path = tmp_path / "cut.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(PhraseScorerError) as info:
        list(read_phrase_table(path))
    assert "truncated" in str(info.value)
    assert f"{path} line " not in str(info.value)  # the problem is after a line, not in one
    assert "cannot read after line" in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(PhraseScorerError, match="no such file"):
        list(read_phrase_table(tmp_path / "nope.gz"))


def test_two_fields_allowed_for_scoring(tmp_path):
    (line,) = list(read_phrase_table(write(tmp_path, b"le chat ||| the cat\n"), min_fields=2, check_scores=False))
    assert line.source_words == ["le", "chat"] and line.target_words == ["the", "cat"]
