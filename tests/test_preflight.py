"""The long commands check everything before their first step.

``build-reranker`` (and ``ems-decoder``, which builds through it) checks its options, every
model it is given (it loads, reads the direction and the language pair the build needs, by the
corpus its config.json records or else by its vocabularies), the inputs, Moses and what the
machine can hold before it trains, decodes or claims its folder; a run given again checks it all
again. None of these tests runs Moses: each fails in the checks, before any Moses call (a folder
with programs that fail stands for an installation where one is needed).
"""

from __future__ import annotations

from pathlib import Path

from conftest import TRAIN_EN, TRAIN_FR, VAL_EN, VAL_FR, run_cli


def test_the_training_summary_names_bleu_when_bleu_chose_the_best_step(tmp_path):
    """A sentence model validated by BLEU (the default with --corpus): the summary says the best
    step was chosen by BLEU, not 'best validation NLL'."""
    result = run_cli("train", "--corpus", TRAIN_EN, TRAIN_FR, "--dev", VAL_EN, VAL_FR, "--preset", "tiny",
                     "--max-steps", 4, "--valid-every", 2, "--batch-size", 8, "--device", "cpu",
                     "-o", tmp_path / "model")
    assert result.exit_code == 0, result.output
    summary = next(line for line in result.stderr.splitlines() if line.startswith("model in"))
    assert "best validation BLEU" in summary and "best validation NLL" not in summary


def test_the_training_summary_names_the_nll_that_chose_the_best_step(tmp_path):
    result = run_cli("train", "--corpus", TRAIN_EN, TRAIN_FR, "--dev", VAL_EN, VAL_FR, "--preset", "tiny",
                     "--max-steps", 4, "--valid-every", 2, "--batch-size", 8, "--device", "cpu",
                     "--valid-metric", "nll", "-o", tmp_path / "model")
    assert result.exit_code == 0, result.output
    summary = next(line for line in result.stderr.splitlines() if line.startswith("model in"))
    assert "best validation NLL" in summary and "BLEU" not in summary


def build_args(work: Path, *more) -> list:
    ini = work.parent / "moses.ini"
    if not ini.exists():
        ini.write_text("[weight]\n", encoding="utf-8")
    return ["build-reranker", ini, "--corpus", TRAIN_EN, TRAIN_FR, "--tuning-set", VAL_EN, VAL_FR, "-o", work,
            *more]


def test_an_empty_models_list_names_the_models_option(tmp_path):
    result = run_cli(*build_args(tmp_path / "work", "--models", ""))
    assert result.exit_code == 1
    line = result.stderr.strip().splitlines()[-1]
    assert "--models" in line and "--model " not in line
    assert not (tmp_path / "work").exists()
