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
