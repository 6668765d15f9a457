"""phrase_scorer.records: the one comparison of an output's record with the settings of now."""

from __future__ import annotations

import json

import pytest

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.records import changed, describe_difference, differences, finished, refuse_changed

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
    signature = {**SAVED, "output": str(out), "lines": 3}
    assert finished(out, SAVED) is None  # no output
    out.write_bytes(b"x")
    assert finished(out, SAVED) is None  # no signature
    (tmp_path / "o.gz.json").write_text(json.dumps(signature))
    assert finished(out, SAVED) == signature
    assert finished(out, NOW) is None
    (tmp_path / "o.gz.json").write_text(json.dumps({**signature, "output": str(tmp_path / "other.gz")}))
    assert finished(out, SAVED) is None
    (tmp_path / "o.gz.json").write_text("{ damaged")
    assert finished(out, SAVED) is None
