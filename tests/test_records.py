"""phrase_scorer.records: the one comparison of an output's record with the settings of now."""

from __future__ import annotations

import json
import re

import pytest

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.records import (
    SIGNATURE_VERSION, Signature, SignedModel, changed, describe_difference, differences, finished, refuse_changed,
)

SAVED = {"input": {"path": "t.gz", "size": 10}, "options": {"window_lines": 20000}, "gone": 1}
NOW = {"input": {"path": "t.gz", "size": 11}, "options": {"window_lines": 20000}, "new": 2}


def test_differences_name_nested_settings_with_dots_and_missing_ones_as_none():
    assert list(differences(SAVED, NOW)) == [("input.size", 10, 11), ("gone", 1, "(none)"), ("new", "(none)", 2)]
    assert list(differences(SAVED, SAVED)) == []
    assert describe_difference(SAVED, NOW) == "input.size: 10 -> 11"
    assert describe_difference(NOW, NOW) == "none"


def test_changed_names_the_top_level_settings_and_all_of_them_without_a_record():
    assert changed(SAVED, NOW) == ["input", "new"]
    assert changed(None, NOW) == ["input", "new", "options"]


def test_refuse_changed_names_every_difference_in_one_line():
    refuse_changed(SAVED, SAVED)
    with pytest.raises(PhraseScorerError, match=r"cannot resume: input, gone, new changed since the interrupted run "
                                                r"\(input.size: 10 -> 11, gone: 1 -> \(none\), new: \(none\) -> 2\)"):
        refuse_changed(SAVED, NOW)


def test_finished_needs_the_output_its_signature_naming_it_and_the_same_settings(tmp_path):
    out = tmp_path / "o.gz"
    assert finished(out, SAVED) is None  # no output
    out.write_bytes(b"x")
    assert finished(out, SAVED) is None  # no signature
    Signature.build("phrase-scorer annotate", SAVED, output=str(out), lines=3).write(out)
    found = finished(out, SAVED)
    assert found is not None and found.lines == 3 and found.output == str(out)
    assert finished(out, NOW) is None
    Signature.build("phrase-scorer annotate", SAVED, output=str(tmp_path / "other.gz"), lines=3).write(out)
    assert finished(out, SAVED) is None
    (tmp_path / "o.gz.json").write_text("{ damaged")
    assert finished(out, SAVED) is None


def test_a_signature_reads_back_as_written_and_refuses_damage_naming_the_key(tmp_path):
    out = tmp_path / "list.txt"
    out.write_text("0 ||| a ||| F= 1 ||| -1\n")
    model = SignedModel("/m", "ab" * 32, {"arch": "rnnsearch"}, name="RNN0", reverse=False, ensemble=False)
    written = Signature.build("phrase-scorer rescore", {"models": [model.to_json()], "options": {"normalize": True}},
                              output=str(out), lines=1, content=out, features=["RNN0"])
    written.write(out)
    read = Signature.read(out)
    assert read == written and read.version == SIGNATURE_VERSION
    assert read.models() == [model] and read.get("features") == ["RNN0"]
    assert read.describes(out) is True
    out.write_text("0 ||| b ||| F= 1 ||| -1\n")  # the same size, other bytes
    assert read.describes(out) is False
    data = json.loads((tmp_path / "list.txt.json").read_text())
    for damage, key in [({"lines": "3"}, "lines"), ({"models": [{"directory": 1}]}, "models[0].directory"),
                        ({"signature_version": SIGNATURE_VERSION + 1}, "newer")]:
        (tmp_path / "list.txt.json").write_text(json.dumps({**data, **damage}))
        with pytest.raises(PhraseScorerError, match=re.escape(key)) as caught:
            Signature.read(out).models()
        assert caught.value.path == str(tmp_path / "list.txt.json")
    assert Signature.read(tmp_path / "none.txt") is None


# --- the one-line form of a signature ----------------------------------------------------------------

RESCORED = {"signature_version": 1, "tool": "phrase-scorer rescore",
            "models": [{"name": "RNN0", "reverse": False, "ensemble": False, "directory": "/m/a",
                        "weights_sha256": "a" * 64, "config": {}},
                       {"name": "Back", "reverse": True, "ensemble": True, "directory": "/m/b",
                        "weights_sha256": "b" * 64, "config": {}},
                       {"name": "Back", "reverse": True, "ensemble": True, "directory": "/m/c",
                        "weights_sha256": "c" * 64, "config": {}}],
            "options": {"normalize": False, "window_lines": 1000},
            "scoring": [{"device": "cpu", "precision": "fp32"}] * 3,
            "features": ["RNN0", "Back"], "package_version": "0.1.0", "finished": "2026-01-01T00:00:00+00:00"}

TRANSLATED = {"signature_version": 1, "tool": "phrase-scorer translate --moses --reranker",
              "moses.ini sha256": "1" * 64, "reranker sha256": "2" * 64,
              "models": [{"name": "RNN0", "reverse": False, "directory": "/m/a", "weights_sha256": "a" * 64,
                          "config": {}}],
              "scoring": {"batch_tokens": None, "precision": "bf16"}, "bound": True, "package_version": "0.1.0"}

RERANKER = {"signature_version": 1, "tool": "phrase-scorer build-reranker", "format": "phrase-scorer reranker",
            "layout": [["LM0", 1], ["RNN0", 1]], "weights": {"LM0": [0.5], "RNN0": [0.2]},
            "ignore_features": ["RNN1"],
            "models": {"RNN0": {"directory": "/m/a", "weights_sha256": "a" * 64, "reverse": False,
                                "normalize": False},
                       "Ens": {"directory": ["/m/b", "/m/c"], "weights_sha256": ["b" * 64, "c" * 64],
                               "reverse": True, "normalize": True}},
            "decoder": {"nbest_size": 100, "decoder_flags": None}, "row": "RNN0", "seed": 1,
            "package_version": "0.1.0"}


@pytest.mark.parametrize("record, line", [
    (RESCORED, "tool:rescore|models:RNN0=aaaaaaaaaaaa,Back=bbbbbbbbbbbb+cccccccccccc|norm:no|device:cpu"
               "|precision:fp32|version:0.1.0"),
    (TRANSLATED, "tool:translate+moses+reranker|models:RNN0=aaaaaaaaaaaa|reranker:222222222222|ini:111111111111"
                 "|precision:bf16|bound:yes|version:0.1.0"),
    (RERANKER, "tool:build-reranker|models:RNN0=aaaaaaaaaaaa,Ens=bbbbbbbbbbbb+cccccccccccc|ignored:RNN1|nbest:100"
               "|version:0.1.0"),
])
def test_a_signature_reads_as_one_quotable_line_of_what_made_the_output(tmp_path, record, line):
    assert Signature.from_json(record, tmp_path / "out.json").line() == line


def test_a_value_holding_the_lines_separators_stays_one_field():
    """A name with the line's separators or spaces in it (as no Moses feature may be named) is
    percent-escaped, so that the line still splits into its fields."""
    record = {**RESCORED, "models": [{**RESCORED["models"][0], "name": "a|b,c=d+e f%"}]}
    line = Signature.from_json(record, "out.json").line()
    assert line.split("|")[1] == "models:a%7Cb%2Cc%3Dd%2Be%20f%25=aaaaaaaaaaaa"


def test_a_character_escaped_in_the_line_is_escaped_as_its_utf8_bytes():
    """One reading back only: a no-break space is %C2%A0, never %A0 (another character's byte)."""
    record = {**RESCORED, "models": [{**RESCORED["models"][0], "name": "a\u00a0b\u2028c"}]}
    assert Signature.from_json(record, "out.json").line().split("|")[1] == "models:a%C2%A0b%E2%80%A8c=aaaaaaaaaaaa"
