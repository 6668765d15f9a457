"""moses.ini patching: exactly the intended lines change, for every phrase-table type."""

from __future__ import annotations

import errno
import gzip
import os
import stat
from pathlib import Path
from typing import Tuple

import pytest
from click.testing import CliRunner

from conftest import A_MAN_TABLE, DATA, ROOT, SHARED_SYSTEM, require_shared
from phrase_scorer.cli import cli
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.moses_ini import KENLM_BINARY_MAGIC, MosesIni, format_weight, text_loaded_features
from phrase_scorer.moses.ini_patch import patch_moses_ini
from phrase_scorer.config import MosesIniOptions
from phrase_scorer.moses.binarise import binarize_command
from phrase_scorer.io.phrase_table import read_phrase_table

INI = DATA / "moses.ini"
TUNED = DATA / "moses.tuned.ini"
MEMORY_LINE = ("PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=phrase-table.gz "
               "input-factor=0 output-factor=0")
MOSES2_KEYS = {"name", "num-features", "tuneable", "path", "input-factor", "output-factor", "table-limit", "cache-size"}


def lines_of(path) -> list:
    return Path(path).read_text(encoding="utf-8").split("\n")


def line_number(path, startswith: str) -> int:
    for number, text in enumerate(lines_of(path), 1):
        if text.startswith(startswith):
            return number
    raise AssertionError(f"no line starting with {startswith!r} in {path}")


def changed(before, after) -> dict:
    """{line number: new text} for the lines that differ; both files must have the same lines."""
    old, new = lines_of(before), lines_of(after)
    assert len(old) == len(new)
    return {n: b for n, (a, b) in enumerate(zip(old, new), 1) if a != b}


def variant(tmp_path, source: Path, *replacements, name: str = "moses.ini") -> Path:
    """A copy of a real ini with some text replaced (each replacement must apply)."""
    text = source.read_text(encoding="utf-8")
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def six_score_table(tmp_path_factory) -> Path:
    """The real 4-score slice with two columns appended, as annotate would write them."""
    path = tmp_path_factory.mktemp("tables") / "phrase-table.6.gz"
    with gzip.open(path, "wb") as out:
        for line in read_phrase_table(A_MAN_TABLE):
            out.write(line.with_scores_appended(b"0.0407 2.718281828"))
    return path


# --- the line-preserving model -------------------------------------------------------------------


@pytest.mark.parametrize("path", [INI, TUNED])
def test_unchanged_round_trip_is_byte_identical(tmp_path, path):
    ini = MosesIni.read(path)
    assert ini.text().encode("utf-8") == path.read_bytes()
    ini.write(tmp_path / "copy.ini")
    assert (tmp_path / "copy.ini").read_bytes() == path.read_bytes()


@pytest.mark.parametrize(
    "text",
    [
        "[feature]\r\nKENLM name=LM0 path=lm.gz\r\n",  # CRLF
        "[weight]\nLM0= 0.5",  # no newline at the end
        "\n\n# only comments\n   \n[x]\n\t1 # trailing comment \n",
        "",
    ],
)
def test_round_trip_keeps_odd_layouts(text):
    assert MosesIni.parse(text).text() == text


def test_sections_features_and_weights_of_the_real_ini():
    ini = MosesIni.read(INI)
    features = ini.features()
    assert [f.name for f in features] == ["UnknownWordPenalty0", "WordPenalty0", "PhrasePenalty0", "TranslationModel0",
                                          "LexicalReordering0", "Distortion0", "LM0"]
    table = ini.find_phrase_table()
    assert (table.type, table.line.number, table.get("num-features")) == ("PhraseDictionaryMemory", 21, "4")
    weights = ini.weight_line("TranslationModel0")
    assert (weights.line.number, weights.weights) == (33, [0.2] * 4)
    # the header comment's trailing space and the comment lines are not weights
    assert [l.number for l in ini.section_lines("weight")] == list(range(30, 37))


def test_weight_line_of_the_tuned_ini():
    weights = MosesIni.read(TUNED).weight_line("TranslationModel0")
    assert weights.weights == [0.0731793, 0.00306417, 0.0673578, 0.0464722]


def test_text_loaded_features_names_what_moses_parses_at_each_start(tmp_path):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "compact.minlexr").write_bytes(b"x")
    (tmp_path / "tables" / "binary.binlexr.idx").write_bytes(b"x")
    (tmp_path / "lm.arpa.gz").write_bytes(gzip.compress(b"\\data\\\n"))
    (tmp_path / "lm.bin").write_bytes(KENLM_BINARY_MAGIC + b"http://kheafield.com/code format version 5\n")
    ini = tmp_path / "moses.ini"
    ini.write_text("[feature]\n"
                   "UnknownWordPenalty\n"
                   "PhraseDictionaryMemory name=TextTable num-features=4 path=phrase-table.gz\n"
                   "PhraseDictionaryCompact name=CompactTable num-features=4 path=tables/phrase-table\n"
                   "LexicalReordering name=TextReordering num-features=6 path=tables/text\n"
                   "LexicalReordering name=CompactReordering num-features=6 path=tables/compact\n"
                   "LexicalReordering name=BinaryReordering num-features=6 path=tables/binary\n"
                   "KENLM name=ArpaLM factor=0 path=lm.arpa.gz order=5\n"
                   f"KENLM name=BinaryLM factor=0 path={tmp_path / 'lm.bin'} order=5\n"
                   "KENLM name=MissingLM factor=0 path=absent.bin order=5\n", encoding="utf-8")
    assert text_loaded_features(MosesIni.read(ini)) == ["TextTable", "TextReordering", "ArpaLM"]
    # the bundled tuned ini's tables are text; its LM is not bundled (a file it cannot read is Moses' to report)
    assert text_loaded_features(MosesIni.read(TUNED)) == ["TranslationModel0", "LexicalReordering0"]


@pytest.mark.parametrize("weight, text", [(0.2, "0.2"), (1.0, "1"), (0, "0"), (-0.05, "-0.05"), (1e-7, "1e-07"),
                                          (0.123456789, "0.123456789")])
def test_weights_are_formatted_like_moses(weight, text):
    assert format_weight(weight) == text
    assert float(text) == weight


# --- patching ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, old_weights",
    [(INI, "0.2 0.2 0.2 0.2"), (TUNED, "0.0731793 0.00306417 0.0673578 0.0464722")],
)
def test_patch_changes_exactly_the_feature_and_weight_lines(tmp_path, six_score_table, source, old_weights):
    out = tmp_path / "patched.ini"
    result = patch_moses_ini(source, out, phrase_table=six_score_table)
    feature_no = line_number(source, "PhraseDictionaryMemory")
    weight_no = line_number(source, "TranslationModel0=")
    assert changed(source, out) == {
        feature_no: MEMORY_LINE.replace("num-features=4", "num-features=6")
                               .replace("path=phrase-table.gz", f"path={six_score_table}"),
        weight_no: f"TranslationModel0= {old_weights} 0.2 -0.2",  # the unknown-word count starts as a penalty
    }
    assert result.changed_lines == sorted([feature_no, weight_no])
    assert (result.old_num_features, result.new_num_features) == (4, 6)
    assert (result.feature_name, result.feature_type) == ("TranslationModel0", "PhraseDictionaryMemory")
    assert result.output_path == str(out)
    patched = MosesIni.read(out)
    assert patched.find_phrase_table().get("num-features") == "6"
    assert len(patched.weight_line("TranslationModel0").weights) == 6


def test_patch_with_no_added_columns_changes_only_the_path(tmp_path):
    out = tmp_path / "patched.ini"
    result = patch_moses_ini(INI, out, phrase_table=A_MAN_TABLE, options=MosesIniOptions(add_features=0))
    assert changed(INI, out) == {21: MEMORY_LINE.replace("path=phrase-table.gz", f"path={A_MAN_TABLE}")}
    assert result.changed_lines == [21]


def test_initial_weight_and_count_are_honoured(tmp_path):
    table = tmp_path / "t.gz"
    with gzip.open(table, "wb") as out:
        for line in read_phrase_table(A_MAN_TABLE):
            out.write(line.with_scores_appended(b"0.5 1 1"))
    out = tmp_path / "patched.ini"
    patch_moses_ini(INI, out, phrase_table=table, options=MosesIniOptions(add_features=3, initial_weights=0.05))
    assert lines_of(out)[32] == "TranslationModel0= 0.2 0.2 0.2 0.2 0.05 0.05 0.05"
    assert "num-features=7" in lines_of(out)[20]
    patch_moses_ini(INI, out, phrase_table=table, options=MosesIniOptions(add_features=3, initial_weights=(0.1, 0, -1)),
                    overwrite=True)
    assert lines_of(out)[32] == "TranslationModel0= 0.2 0.2 0.2 0.2 0.1 0 -1"
    with pytest.raises(PhraseScorerError, match="2 start weights given for 3 new columns"):
        patch_moses_ini(INI, out, phrase_table=table,
                        options=MosesIniOptions(add_features=3, initial_weights=(0.1, 0.1)), overwrite=True)
    with pytest.raises(PhraseScorerError, match="no default start weights for 3 new columns"):
        patch_moses_ini(INI, out, phrase_table=table, options=MosesIniOptions(add_features=3), overwrite=True)


def test_start_weights_make_the_unknown_word_count_a_penalty():
    """Moses sees log(column): log p(y|x) <= 0 and n_unk >= 0. A positive weight on n_unk would make
    every unknown word raise a hypothesis' score; the start weights must lower it instead."""
    from phrase_scorer.config import COLUMNS, START_WEIGHTS, start_weights

    assert set(START_WEIGHTS) == set(COLUMNS)
    assert START_WEIGHTS["unk"] < 0 < START_WEIGHTS["prob"]
    assert start_weights(("unk", "prob")) == (START_WEIGHTS["unk"], START_WEIGHTS["prob"])
    # with these weights a hypothesis with one more unknown word and the same log p scores lower
    weights = dict(zip(COLUMNS, start_weights()))
    assert weights["prob"] * -2.0 + weights["unk"] * 1 < weights["prob"] * -2.0 + weights["unk"] * 0


TABLE_TYPES = [
    ("PhraseDictionaryCompact", "phrase-table.minphr"),
    ("ProbingPT", "phrase-table.probing"),
    ("PhraseDictionaryOnDisk", "phrase-table.bin"),
]


@pytest.mark.parametrize("kind, table", TABLE_TYPES)
@pytest.mark.parametrize("source", [INI, TUNED])
def test_every_binary_table_type_is_patched(tmp_path, source, kind, table):
    ini = variant(tmp_path, source, ("PhraseDictionaryMemory", kind), ("path=phrase-table.gz", f"path={table}"))
    out = tmp_path / "patched.ini"
    new_table = tmp_path / ("new-" + table)
    result = patch_moses_ini(ini, out, phrase_table=new_table)  # no text table: nothing to count
    number = line_number(ini, kind)
    assert changed(ini, out) == {
        number: f"{kind} name=TranslationModel0 num-features=6 path={new_table} input-factor=0 output-factor=0",
        line_number(ini, "TranslationModel0="): lines_of(ini)[line_number(ini, "TranslationModel0=") - 1] + " 0.2 -0.2",
    }
    assert result.feature_type == kind


def test_moses2_ini_gets_no_keys_moses2_would_refuse(tmp_path, six_score_table):
    ini = variant(tmp_path, INI,
                  ("output-factor=0\nLexicalReordering", "output-factor=0 table-limit=20\nLexicalReordering"))
    out = tmp_path / "patched.ini"
    patch_moses_ini(ini, out, phrase_table=six_score_table)
    assert set(changed(ini, out)) == {21, 33}
    feature = MosesIni.read(out).find_phrase_table()
    assert {key for key, _ in feature.args} <= MOSES2_KEYS
    assert (feature.get("num-features"), feature.get("table-limit")) == ("6", "20")


def test_moses2_probing_ini(tmp_path):
    ini = variant(tmp_path, INI, ("PhraseDictionaryMemory", "ProbingPT"),
                  ("path=phrase-table.gz", "path=pt.probing"))
    out = tmp_path / "patched.ini"
    result = patch_moses_ini(ini, out, phrase_table="pt.rnn.probing", options=MosesIniOptions(add_features=2))
    assert changed(ini, out)[21] == ("ProbingPT name=TranslationModel0 num-features=6 path=pt.rnn.probing "
                                     "input-factor=0 output-factor=0")
    assert result.table_path == "pt.rnn.probing"


def test_tuneable_components_are_extended(tmp_path, six_score_table):
    ini = variant(tmp_path, INI, ("num-features=4 path", "num-features=4 tuneable-components=1,1,0,1 path"))
    out = tmp_path / "patched.ini"
    patch_moses_ini(ini, out, phrase_table=six_score_table)
    assert MosesIni.read(out).find_phrase_table().get("tuneable-components") == "1,1,0,1,1,1"
    assert set(changed(ini, out)) == {21, 33}


def test_missing_num_features_means_one_and_is_written(tmp_path):
    ini = variant(tmp_path, INI, (" num-features=4", ""),
                  ("TranslationModel0= 0.2 0.2 0.2 0.2", "TranslationModel0= 0.5"))
    table = tmp_path / "t.gz"
    table.write_bytes(gzip.compress(b"a ||| b ||| 0.5 0.25 1\n"))
    out = tmp_path / "patched.ini"
    result = patch_moses_ini(ini, out, phrase_table=table)
    assert (result.old_num_features, result.new_num_features) == (1, 3)
    assert lines_of(out)[20] == (f"PhraseDictionaryMemory name=TranslationModel0 num-features=3 path={table} "
                                 "input-factor=0 output-factor=0")
    assert lines_of(out)[32] == "TranslationModel0= 0.5 0.2 -0.2"


def test_default_feature_names_and_picking_by_name(tmp_path, six_score_table):
    ini = variant(
        tmp_path, INI,
        ("PhraseDictionaryMemory name=TranslationModel0", "PhraseDictionaryMemory"),
        ("TranslationModel0= 0.2 0.2 0.2 0.2", "PhraseDictionaryMemory0= 0.2 0.2 0.2 0.2\nTranslationModel1= 1 1 1 1"),
        ("LexicalReordering name",
         "PhraseDictionaryMemory name=TranslationModel1 num-features=4 path=b.gz\nLexicalReordering name"),
    )
    assert MosesIni.read(ini).find_phrase_table().name == "PhraseDictionaryMemory0"
    out = tmp_path / "patched.ini"
    result = patch_moses_ini(ini, out, phrase_table=six_score_table,
                             options=MosesIniOptions(feature_name="TranslationModel1"))
    assert result.feature_name == "TranslationModel1"
    assert changed(ini, out) == {
        22: f"PhraseDictionaryMemory name=TranslationModel1 num-features=6 path={six_score_table}",
        35: "TranslationModel1= 1 1 1 1 0.2 -0.2",
    }


def test_absolute_paths_change_only_relative_paths(tmp_path, six_score_table):
    ini = variant(tmp_path, INI, ("path=lm.arpa.gz", "path=/already/absolute/lm.arpa.gz"))
    out = tmp_path / "patched.ini"
    result = patch_moses_ini(ini, out, phrase_table=six_score_table, options=MosesIniOptions(absolute_paths=True))
    diff = changed(ini, out)
    assert set(diff) == {21, 22, 33}  # the absolute LM path (line 24) stays
    assert diff[22] == lines_of(ini)[21].replace("path=reordering-table", f"path={tmp_path}/reordering-table")
    assert result.changed_lines == [21, 22, 33]


def test_absolute_paths_on_the_real_ini(tmp_path, six_score_table, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "patched.ini"
    patch_moses_ini(INI, out, phrase_table="new.gz", options=MosesIniOptions(absolute_paths=True, check_table=False))
    diff = changed(INI, out)
    assert set(diff) == {21, 22, 24, 33}
    assert diff[22].endswith(f"path={DATA}/reordering-table.wbe-msd-bidirectional-fe.gz")
    assert diff[24] == f"KENLM name=LM0 factor=0 path={DATA}/lm.arpa.gz order=5"
    assert f"path={tmp_path}/new.gz " in diff[21]  # the new table, against the current folder


def test_absolute_paths_point_at_the_real_system_files(tmp_path, six_score_table):
    require_shared()
    out = tmp_path / "patched.ini"
    patch_moses_ini(SHARED_SYSTEM / "moses.tuned.ini", out, phrase_table=six_score_table,
                    options=MosesIniOptions(absolute_paths=True))
    paths = [f.get("path") for f in MosesIni.read(out).features() if f.get("path")]
    assert len(paths) == 3
    assert all(os.path.isabs(p) and os.path.exists(p) for p in paths)


def test_output_may_not_replace_the_input(tmp_path, six_score_table):
    """Patching in place would lose the original ini (and a second patch would add columns twice)."""
    ini = variant(tmp_path, INI)
    before = ini.read_bytes()
    with pytest.raises(PhraseScorerError, match="is the same file as the moses.ini"):
        patch_moses_ini(ini, ini, phrase_table=six_score_table, overwrite=True)
    assert ini.read_bytes() == before
    assert not (tmp_path / "moses.ini.part").exists()
    out = tmp_path / "patched.ini"
    patch_moses_ini(ini, out, phrase_table=six_score_table)
    assert MosesIni.read(out).find_phrase_table().get("num-features") == "6"
    with pytest.raises(PhraseScorerError, match="already exists.*overwrite=True"):
        patch_moses_ini(ini, out, phrase_table=six_score_table)
    patch_moses_ini(ini, out, phrase_table=six_score_table, overwrite=True)


# --- refusals ------------------------------------------------------------------------------------


def test_refuses_a_table_with_too_few_scores_and_names_it(tmp_path):
    out = tmp_path / "patched.ini"
    with pytest.raises(PhraseScorerError) as caught:
        patch_moses_ini(INI, out, phrase_table=A_MAN_TABLE, options=MosesIniOptions(add_features=2))
    error = caught.value
    assert error.path == str(A_MAN_TABLE)
    assert "has 4 scores per line" in error.message and "would be 6" in error.message
    assert "add_features=0" in error.hint
    assert str(A_MAN_TABLE) in str(error)
    assert not out.exists() and not (tmp_path / "patched.ini.part").exists()


def test_refuses_a_table_with_more_scores_and_says_how_many(tmp_path, six_score_table):
    with pytest.raises(PhraseScorerError) as caught:
        patch_moses_ini(INI, tmp_path / "o.ini", phrase_table=six_score_table, options=MosesIniOptions(add_features=1))
    assert "has 6 scores per line" in caught.value.message and "would be 5" in caught.value.message
    assert "add_features=2" in caught.value.hint


def test_accepts_matching_tables(tmp_path, six_score_table):
    assert patch_moses_ini(INI, tmp_path / "a.ini", phrase_table=A_MAN_TABLE,
                           options=MosesIniOptions(add_features=0)).new_num_features == 4
    assert patch_moses_ini(INI, tmp_path / "b.ini", phrase_table=six_score_table,
                           options=MosesIniOptions(add_features=2)).new_num_features == 6


def test_no_check_table_skips_the_count(tmp_path):
    result = patch_moses_ini(INI, tmp_path / "o.ini", phrase_table=tmp_path / "not-yet.gz",
                             options=MosesIniOptions(check_table=False))
    assert result.new_num_features == 6


def test_a_missing_text_table_is_named(tmp_path):
    with pytest.raises(PhraseScorerError, match="no such file") as caught:
        patch_moses_ini(INI, tmp_path / "o.ini", phrase_table=tmp_path / "missing.gz")
    assert caught.value.path == str(tmp_path / "missing.gz")


@pytest.mark.parametrize(
    "replacements, options, line, message",
    [
        ([(MEMORY_LINE + "\n", "")], {}, 17, "no phrase-table feature"),
        ([], {"feature_name": "TranslationModel7"}, 17, "no feature named TranslationModel7"),
        ([], {"feature_name": "LM0"}, 24, "feature LM0 is a KENLM, not a phrase table"),
        ([("PhraseDictionaryMemory name=TranslationModel0", "PhraseDictionaryMultiModel name=TranslationModel0")],
         {}, 21, "TranslationModel0 is a PhraseDictionaryMultiModel, a phrase-table type this command does not patch"),
        ([("PhraseDictionaryMemory name=TranslationModel0", "PhraseDictionaryBitextSampling name=TranslationModel0")],
         {"feature_name": "TranslationModel0"}, 21, "is a PhraseDictionaryBitextSampling, a phrase-table type"),
        ([("TranslationModel0= 0.2 0.2 0.2 0.2\n", "")], {}, 27, "no weight line for TranslationModel0"),
        ([("TranslationModel0= 0.2 0.2 0.2 0.2", "TranslationModel0= 0.2 0.2 0.2")], {}, 33,
         "has 3 weights but num-features=4"),
        ([("TranslationModel0= 0.2", "TranslationModel0=0.2")], {}, 33, "is not read as weights"),
        ([("TranslationModel0= 0.2 0.2 0.2 0.2", "TranslationModel0= 0.2 0.2 x 0.2")], {}, 33,
         "'x' of TranslationModel0 is not"),
        ([("num-features=4 path", "num-features=four path")], {}, 21, "num-features=four is not a whole number"),
        ([("num-features=4 path", "num-features=4 tuneable-components=1,1 path")], {}, 21,
         "tuneable-components has 2 values"),
        ([("input-factor=0 output-factor=0\nLex", "input-factor=0 input-factor=0\nLex")], {}, 21,
         "input-factor= appears twice"),
        ([("LM0= 0.5", "LM0= 0.5\nTranslationModel0= 1 1 1 1")], {}, 37, "weight lines on lines 33, 37"),
    ],
)
def test_refusals_name_the_file_and_line(tmp_path, six_score_table, replacements, options, line, message):
    ini = variant(tmp_path, INI, *replacements)
    out = tmp_path / "patched.ini"
    with pytest.raises(PhraseScorerError) as caught:
        patch_moses_ini(ini, out, phrase_table=six_score_table, options=MosesIniOptions(**options))
    error = caught.value
    assert message in error.message
    assert (error.path, error.line) == (str(ini), line)
    assert error.hint
    assert not out.exists()


def test_old_style_ini_gets_a_hint(tmp_path):
    ini = tmp_path / "old.ini"
    ini.write_text("[ttable-file]\n0 0 0 5 phrase-table.gz\n[weight-t]\n0.2\n")
    with pytest.raises(PhraseScorerError, match="no phrase-table feature") as caught:
        patch_moses_ini(ini, tmp_path / "o.ini", phrase_table="x.gz")
    assert "old-style" in caught.value.hint


# --- binary tables -------------------------------------------------------------------------------


def test_binarize_commands(tmp_path):
    home = tmp_path / "moses"
    assert binarize_command("PhraseDictionaryCompact", "pt.gz", "pt", 6, home) == [
        f"{home}/bin/processPhraseTableMin", "-in", "pt.gz", "-out", "pt", "-nscores", "6"]
    assert binarize_command("ProbingPT", "pt.gz", "pt.probing", 6, home) == [
        f"{home}/bin/CreateProbingPT", "--input-pt", "pt.gz", "--output-dir", "pt.probing", "--num-scores", "6"]
    assert binarize_command("PhraseDictionaryOnDisk", "pt.gz", "pt.bin", 6, home) == [
        f"{home}/bin/CreateOnDiskPt", "1", "1", "6", "100", "2", "pt.gz", "pt.bin"]
    with pytest.raises(PhraseScorerError, match="not binarised"):
        binarize_command("PhraseDictionaryMemory", "pt.gz", "pt", 6, home)


@pytest.mark.parametrize("kind, table", TABLE_TYPES)
def test_the_text_table_to_binarise_is_checked_first(tmp_path, kind, table):
    ini = variant(tmp_path, INI, ("PhraseDictionaryMemory", kind), ("path=phrase-table.gz", f"path={table}"))
    out = tmp_path / "patched.ini"
    with pytest.raises(PhraseScorerError, match="has 4 scores per line") as caught:
        patch_moses_ini(ini, out, phrase_table=tmp_path / table, binarize_from=A_MAN_TABLE,
                        moses_home=tmp_path / "no-moses")
    assert caught.value.path == str(A_MAN_TABLE)
    assert not out.exists()


def test_binarising_needs_moses(tmp_path, six_score_table, monkeypatch):
    monkeypatch.delenv("MOSES_HOME", raising=False)
    ini = variant(tmp_path, INI, ("PhraseDictionaryMemory", "ProbingPT"))
    with pytest.raises(PhraseScorerError, match="needs the Moses programs") as caught:
        patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=tmp_path / "pt.probing", binarize_from=six_score_table)
    assert "MOSES_HOME" in caught.value.hint
    with pytest.raises(PhraseScorerError, match="no such program") as caught:
        patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=tmp_path / "pt.probing", binarize_from=six_score_table,
                        moses_home=tmp_path)
    assert caught.value.path == str(tmp_path / "bin" / "CreateProbingPT")
    assert not (tmp_path / "o.ini").exists()


def test_memory_tables_are_not_binarised(tmp_path, six_score_table):
    with pytest.raises(PhraseScorerError, match="nothing to binarise") as caught:
        patch_moses_ini(INI, tmp_path / "o.ini", phrase_table=six_score_table, binarize_from=six_score_table)
    assert caught.value.line == 21


def fake_program(home: Path, name: str, script: str) -> None:
    """An executable standing in for a Moses binariser (the real ones are tested under -m moses)."""
    (home / "bin").mkdir(parents=True, exist_ok=True)
    path = home / "bin" / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_failing_binariser_reports_its_last_words_and_leaves_nothing(tmp_path, six_score_table):
    home = tmp_path / "moses"
    fake_program(home, "CreateProbingPT",
                 'mkdir -p "$6"; echo "reading $2" >&2; echo "Bad score on line 3" >&2; exit 3\n')
    ini = variant(tmp_path, INI, ("PhraseDictionaryMemory", "ProbingPT"))
    with pytest.raises(PhraseScorerError) as caught:
        patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=tmp_path / "pt.probing", binarize_from=six_score_table,
                        moses_home=home)
    assert "CreateProbingPT failed with exit status 3" in caught.value.message
    assert caught.value.message.endswith("Bad score on line 3")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "pt.probing.part").exists() and not (tmp_path / "pt.probing").exists()
    assert not (tmp_path / "o.ini").exists()


def a_probing_table_to_replace(tmp_path: Path) -> Tuple[Path, Path, Path]:
    """A stand-in CreateProbingPT (its tables record 6 scores), a moses.ini reading a ProbingPT
    table, and that table, of 4 scores, already there: (Moses folder, moses.ini, table)."""
    home = tmp_path / "moses"
    fake_program(home, "CreateProbingPT", 'mkdir -p "$4"; printf "num_scores\\t$6\\n" > "$4/config"\n')
    ini = variant(tmp_path, INI, ("PhraseDictionaryMemory", "ProbingPT"))
    old = tmp_path / "pt.probing"
    old.mkdir()
    (old / "config").write_text("num_scores\t4\n")
    return home, ini, old


def test_a_binariser_output_is_moved_into_place(tmp_path, six_score_table):
    home, ini, old = a_probing_table_to_replace(tmp_path)
    result = patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=old, binarize_from=six_score_table, moses_home=home)
    assert result.binarize_command[1:] == ["--input-pt", str(six_score_table), "--output-dir",
                                           f"{old}.part", "--num-scores", "6"]
    assert (old / "config").read_text() == "num_scores\t6\n"
    assert sorted(p.name for p in tmp_path.glob("pt.probing*")) == ["pt.probing", "pt.probing.log"]


def test_the_previous_table_steps_aside_under_a_name_no_file_holds(tmp_path, six_score_table):
    """A folder table steps aside while its successor moves in, into a folder made for it: a
    user's file or folder named like it (NAME.previous, empty or not) is never touched, and
    nothing of the step is left."""
    home, ini, old = a_probing_table_to_replace(tmp_path)
    (tmp_path / "pt.probing.previous").write_text("keep me")
    (tmp_path / "pt.probing.previous.x").mkdir()
    patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=old, binarize_from=six_score_table, moses_home=home)
    assert (old / "config").read_text() == "num_scores\t6\n"
    assert (tmp_path / "pt.probing.previous").read_text() == "keep me"
    assert (tmp_path / "pt.probing.previous.x").is_dir()
    assert sorted(p.name for p in tmp_path.glob("pt.probing*")) == ["pt.probing", "pt.probing.log",
                                                                     "pt.probing.previous", "pt.probing.previous.x"]


def test_a_new_table_that_cannot_move_in_leaves_the_old_one_in_place(tmp_path, six_score_table, monkeypatch):
    """The new table's move fails (a full directory, a permission): the old table steps back, the
    new one stays in NAME.part, and nothing else of the step is left."""
    home, ini, old = a_probing_table_to_replace(tmp_path)
    real_rename = os.rename

    def rename(source, destination):
        if os.fspath(source).endswith(".part"):
            raise OSError(errno.EACCES, "Permission denied")
        real_rename(source, destination)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(PhraseScorerError, match="cannot move the new table into place"):
        patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=old, binarize_from=six_score_table, moses_home=home)
    assert (old / "config").read_text() == "num_scores\t4\n"
    assert sorted(p.name for p in tmp_path.glob("pt.probing*")) == ["pt.probing", "pt.probing.log", "pt.probing.part"]


def test_refuses_to_replace_a_folder_that_is_not_a_table(tmp_path, six_score_table):
    home = tmp_path / "moses"
    fake_program(home, "CreateOnDiskPt", "exit 0\n")
    ini = variant(tmp_path, INI, ("PhraseDictionaryMemory", "PhraseDictionaryOnDisk"))
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(PhraseScorerError, match="not a PhraseDictionaryOnDisk table"):
        patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=precious, binarize_from=six_score_table, moses_home=home)
    assert (precious / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("kind, marker, text", [("ProbingPT", "config", "num_scores\t{}\n"),
                                                ("PhraseDictionaryOnDisk", "Misc.dat", "NumScores {}\n")])
def test_binary_tables_recorded_score_count_is_checked(tmp_path, kind, marker, text):
    ini = variant(tmp_path, INI, ("PhraseDictionaryMemory", kind))
    table = tmp_path / "table"
    table.mkdir()
    (table / marker).write_text("API_VERSION\t3\n" + text.format(4))
    with pytest.raises(PhraseScorerError, match="has 4 scores per line"):
        patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=table)
    (table / marker).write_text(text.format(6))
    assert patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=table).new_num_features == 6


@pytest.mark.moses
@pytest.mark.parametrize("kind, program, output", [
    ("PhraseDictionaryCompact", "processPhraseTableMin", "pt.minphr"),
    ("ProbingPT", "CreateProbingPT", "pt.probing"),
    ("PhraseDictionaryOnDisk", "CreateOnDiskPt", "pt.bin"),
])
def test_real_binarisation(tmp_path, six_score_table, kind, program, output):
    home = os.environ.get("MOSES_HOME")
    if not home:
        pytest.skip("set MOSES_HOME to a Moses build (its bin/ holds the binarisers) to run this test")
    if not os.access(os.path.join(home, "bin", program), os.X_OK):
        pytest.skip(f"{program} is not built in {home}/bin")
    ini = variant(tmp_path, INI, ("PhraseDictionaryMemory", kind))
    sorted_table = tmp_path / "sorted.gz"
    with gzip.open(six_score_table, "rb") as f:
        lines = sorted(f.readlines())  # byte order, as LC_ALL=C sort
    sorted_table.write_bytes(gzip.compress(b"".join(lines)))
    result = patch_moses_ini(ini, tmp_path / "o.ini", phrase_table=tmp_path / output, binarize_from=sorted_table,
                             moses_home=home)
    assert result.binarize_command[0] == os.path.join(home, "bin", program)
    assert (tmp_path / output).exists()
    assert MosesIni.read(tmp_path / "o.ini").find_phrase_table().get("path") == str(tmp_path / output)


# --- the shipped snippets ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["PhraseDictionaryMemory", "PhraseDictionaryCompact", "ProbingPT",
                                  "PhraseDictionaryOnDisk", "Moses2"])
def test_config_snippets_declare_six_columns_and_six_weights(name):
    snippet = MosesIni.read(ROOT / "moses_configs" / f"{name}.ini")
    feature = snippet.find_phrase_table()
    assert feature.get("num-features") == "6"
    from phrase_scorer.config import start_weights

    # the shipped configs show the start weights patch_moses_ini writes, from the one table of them
    assert snippet.weight_line(feature.name).weights == [0.2] * 4 + list(start_weights())
    if name == "Moses2":
        assert {key for key, _ in feature.args} <= MOSES2_KEYS
    else:
        assert feature.type == name


# --- the command line ----------------------------------------------------------------------------


def test_cli_patches_and_prints_the_changed_lines(tmp_path, six_score_table):
    out = tmp_path / "new.ini"
    result = CliRunner().invoke(cli, ["moses-ini", str(INI), "--phrase-table", str(six_score_table), "-o", str(out),
                                      "--initial-weight", "0.1"])
    assert result.exit_code == 0, result.output
    assert "num-features 4 -> 6" in result.output
    assert "line 21:" in result.output and "line 33:" in result.output
    assert "+ TranslationModel0= 0.2 0.2 0.2 0.2 0.1 0.1" in result.output
    assert set(changed(INI, out)) == {21, 33}


def test_cli_reports_a_refusal_on_one_line(tmp_path):
    out = tmp_path / "new.ini"
    result = CliRunner().invoke(cli, ["moses-ini", str(INI), "--phrase-table", str(A_MAN_TABLE), "-o", str(out)])
    assert result.exit_code == 1
    message = result.output.strip()
    assert message.startswith(f"phrase-scorer: error: {A_MAN_TABLE} line 1: ")
    assert "\n" not in message
    assert not out.exists()
    ok = CliRunner().invoke(cli, ["moses-ini", str(INI), "--phrase-table", str(A_MAN_TABLE), "-o", str(out),
                                  "--add-features", "0", "--absolute-paths"])
    assert ok.exit_code == 0, ok.output
    assert set(changed(INI, out)) == {21, 22, 24}


def test_cli_does_not_import_torch(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from phrase_scorer.cli import cli; "
            f"r = CliRunner().invoke(cli, ['moses-ini', {str(INI)!r}, '--phrase-table', 'x.gz', '-o', "
            f"{str(tmp_path / 'o.ini')!r}, '--no-check-table']); "
            "assert r.exit_code == 0, r.output; print('torch' in sys.modules, 'numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_an_annotated_table_is_explained_for_moses_or_patched_into_its_ini(tmp_path):
    """What annotate says after writing a table: the change to make by hand (with the moses-ini
    command that makes it), or, with --ini, the patched moses.ini itself."""
    from phrase_scorer.cli.group import shown
    from phrase_scorer.moses.ini_patch import moses_for_new_columns

    table = tmp_path / "table.rnn.gz"
    advice = shown(moses_for_new_columns(str(table), 4, 6, ("prob", "unk")), ("annotate",))  # as annotate shows it
    one = shown(moses_for_new_columns(str(table), 4, 5, ("prob",)), ("annotate",))
    assert f"num-features=6 path={table}" in advice and "<the 4 current weights> 0.2 -0.2" in advice
    assert f"moses-ini MOSES_INI --phrase-table {table} -o NEW_INI" in advice  # the default columns need no options
    assert "--add-features 1 --initial-weights 0.2 -o NEW_INI" in one
    assert "add_features=1 initial_weights=0.2 output=NEW_INI" in moses_for_new_columns(str(table), 4, 5, ("prob",))
    assert "path=TABLE" in moses_for_new_columns("-", 4, 6, ("prob", "unk"))  # written to stdout: no path to name
    with gzip.open(table, "wt", encoding="utf-8") as f:  # the annotated table, as annotate leaves it
        f.write("a man ||| un homme ||| 0.5 0.4 0.5 0.4 0.3 1 ||| 0-0 1-1 ||| 2 2 2\n")
    out = tmp_path / "moses.rnn.ini"
    said = moses_for_new_columns(str(table), 4, 6, ("prob", "unk"), moses_ini=INI, ini_output=out)
    assert said.startswith(f"patched moses.ini written to {out}: ") and "num-features=6" in said
    text = out.read_text()
    assert f"path={table}" in text and "num-features=6" in text


def test_the_ini_patched_for_an_annotated_table_replaces_an_existing_one_only_when_the_caller_says_so(tmp_path):
    """moses_for_new_columns takes its caller's overwrite decision: an existing moses.ini at
    ini_output is kept and refused by default, replaced with overwrite=True."""
    from phrase_scorer.moses.ini_patch import moses_for_new_columns

    table = tmp_path / "table.rnn.gz"
    with gzip.open(table, "wt", encoding="utf-8") as f:
        f.write("a man ||| un homme ||| 0.5 0.4 0.5 0.4 0.3 1 ||| 0-0 1-1 ||| 2 2 2\n")
    out = tmp_path / "moses.rnn.ini"
    out.write_text("kept\n", encoding="utf-8")
    with pytest.raises(PhraseScorerError, match="already exists.*overwrite=True"):
        moses_for_new_columns(str(table), 4, 6, ("prob", "unk"), moses_ini=INI, ini_output=out)
    assert out.read_text(encoding="utf-8") == "kept\n"
    said = moses_for_new_columns(str(table), 4, 6, ("prob", "unk"), moses_ini=INI, ini_output=out, overwrite=True)
    assert said.startswith(f"patched moses.ini written to {out}: ") and "num-features=6" in out.read_text()
