"""The library as a Python caller uses it: docs/python.md's examples run exactly as written, and a
caller that never imports the command line gets the process settings the command line runs with."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LIBRARY_CALLER = ("import os, sys, phrase_scorer.rescoring.rescore; "
                  "assert 'phrase_scorer.cli' not in sys.modules and 'torch' not in sys.modules; "
                  "print(os.environ['OMP_WAIT_POLICY'], os.environ['THP_MEM_ALLOC_ENABLE'])")


def settings_seen(**given: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE")}
    return subprocess.run([sys.executable, "-c", LIBRARY_CALLER], env={**env, **given}, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_a_library_caller_gets_the_command_lines_process_settings_before_torch_loads():
    assert settings_seen() == "PASSIVE 1"


@pytest.mark.parametrize("given, seen", [
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE 1"),
    ({"THP_MEM_ALLOC_ENABLE": "0"}, "PASSIVE 0"),
])
def test_a_library_caller_keeps_the_process_settings_it_chose(given, seen):
    assert settings_seen(**given) == seen


def test_pairs_scored_in_memory_get_the_values_the_score_verb_writes(tmp_path, loaded_tiny):
    from phrase_scorer.scoring.score import score_file, score_pairs

    pairs = [("a man", "un homme"), ("a dog runs", "un chien court"), ("zzz unknown", "inconnu zzz")]
    lines = tmp_path / "pairs.txt"
    lines.write_text("".join(f"{s} ||| {t}\n" for s, t in pairs), encoding="utf-8")
    score_file(lines, tmp_path / "scores.txt", loaded_tiny)
    written = (tmp_path / "scores.txt").read_text().split()
    assert ["%.9g" % v for v in score_pairs(loaded_tiny, pairs)] == written


def test_an_empty_side_of_a_pair_scored_in_memory_is_named_with_its_pair():
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.scoring.score import score_pairs

    with pytest.raises(PhraseScorerError, match="pair 2: the target is empty"):
        score_pairs(None, [("a man", "un homme"), ("a dog", "  ")])


# --- docs/python.md, run as written --------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "python.md"
NEEDS_MOSES = "# needs Moses"
EXAMPLE_FILES = ("phrase-table.sample.gz", "dev.nbest.gz", "dev.en", "dev.fr", "test.nbest.gz", "test.en")


def page_examples() -> list:
    """The page's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.S | re.M)


def run_examples(folder: Path, blocks: list) -> None:
    """Run ``blocks`` one after the other in one namespace, in ``folder`` holding the example data."""
    for name in EXAMPLE_FILES:
        shutil.copy(ROOT / "examples" / name, folder / name)
    before = os.getcwd()
    os.chdir(folder)
    try:
        namespace: dict = {}
        for number, block in enumerate(blocks, 1):
            exec(compile(block, f"{PAGE.name}, example {number}", "exec"), namespace)
    finally:
        os.chdir(before)


def test_the_python_page_shows_training_scoring_rescoring_and_applying_a_reranker():
    text = "\n".join(page_examples())
    for call in ("train(", "score_pairs(", "rescore(", "rerank(", "apply_reranker("):
        assert call in text


def test_the_python_pages_examples_run_as_written(tmp_path):
    """Every example that needs no Moses, in order: train, score, rescore (printing the signature line)."""
    blocks = page_examples()
    without_moses = blocks[:next(i for i, b in enumerate(blocks) if b.startswith(NEEDS_MOSES))]
    assert len(without_moses) >= 3
    run_examples(tmp_path, without_moses)
    assert (tmp_path / "tiny-model").is_dir() and len((tmp_path / "scores.txt").read_text().split()) == 2
    assert (tmp_path / "test.rescored.gz.json").is_file()


@pytest.mark.moses
def test_the_python_pages_examples_run_as_written_with_moses(tmp_path, moses):
    run_examples(tmp_path, page_examples())
    assert (tmp_path / "test.again.1best").read_bytes() == (tmp_path / "test.1best").read_bytes()
