"""Model directories made by an earlier version still load and score as they did.

tests/data/frozen/ holds a tiny model of each architecture, trained by the commands in its
README.md (tools/make_frozen_models.py) and kept as they were written then, with the scores
``phrase-scorer score`` gave for ``pairs.txt`` at the time. Today's code must read them and give
the same scores (up to float rounding across CPUs: the tolerance is far below any real change).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from phrase_scorer.cli import cli

FROZEN = Path(__file__).resolve().parent / "data" / "frozen"


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch", "transformer"])
def test_a_frozen_model_of_an_earlier_version_scores_as_it_did(arch, tmp_path):
    model = FROZEN / arch
    assert json.loads((model / "config.json").read_text())["model"]["arch"] == arch
    out = tmp_path / "scores.txt"
    result = CliRunner().invoke(cli, ["score", str(FROZEN / "pairs.txt"), "-m", str(model), "--threads", "1",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    expected = [float(v) for v in (model / "scores.txt").read_text().split()]
    scores = [float(v) for v in out.read_text().split()]
    assert len(scores) == len(expected) == len((FROZEN / "pairs.txt").read_text().splitlines())
    assert scores == pytest.approx(expected, abs=1e-4)
    assert scores[0] > scores[4]  # "a man" is "un homme" rather than "une femme"
