"""Inputs read the way they are meant: an input a verb reads twice is a regular file, standard
input is named as such, and an n-best list is not scored as a table of pairs."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from conftest import DATA, EXAMPLE_TABLE, VAL_EN, VAL_FR, error_line, run_cli

NBEST = DATA / "val.nbest.head.gz"


def table_text(lines: int) -> bytes:
    with gzip.open(EXAMPLE_TABLE, "rb") as f:
        return b"".join(next(f) for _ in range(lines))


def pipe_holding(data: bytes) -> str:
    """A pipe holding ``data`` with its writing end closed, named as a shell's process
    substitution names it (``<(cat file)`` is ``/dev/fd/N``)."""
    assert len(data) < 60_000  # within the pipe's buffer: written at once
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    return f"/dev/fd/{read_end}"


@pytest.fixture
def pipes():
    made = []

    def make(data: bytes) -> str:
        made.append(pipe_holding(data))
        return made[-1]

    yield make
    for name in made:
        os.close(int(name.rsplit("/", 1)[1]))


TRAIN = ("--preset", "tiny", "--max-steps", "2", "--valid-every", "2", "--valid-pairs", "10")


def test_train_from_standard_input_is_refused_naming_standard_input(tmp_path):
    """`zcat pt.gz | train - -o m`: the table is read twice, which standard input cannot be; the
    error names standard input (it once named <stdout>) and nothing is made."""
    result = run_cli("train", "-", "-o", tmp_path / "m", *TRAIN, input=table_text(400))
    line = error_line(result)
    assert "standard input" in line and "<stdout>" not in line, line
    assert "regular file" in line
    assert not (tmp_path / "m").exists()


def test_train_on_a_pipe_table_is_refused_before_any_work(tmp_path, pipes):
    """`train <(zcat pt.gz)`: a pipe gives its bytes to the first reading only."""
    table = pipes(table_text(400))
    line = error_line(run_cli("train", table, "-o", tmp_path / "m", *TRAIN))
    assert f"{table}: " in line and "pipe" in line and "regular file" in line, line
    assert not (tmp_path / "m").exists()


def test_train_on_a_pipe_corpus_is_refused_naming_the_option(tmp_path, pipes):
    """`train --corpus <(cat a.en) <(cat a.fr)`: once refused only after counting words, as "no
    pairs left"; now before any work, naming --corpus."""
    source = pipes(b"".join(VAL_EN.read_bytes().splitlines(keepends=True)[:50]))
    target = pipes(b"".join(VAL_FR.read_bytes().splitlines(keepends=True)[:50]))
    line = error_line(run_cli("train", "--corpus", source, target, "-o", tmp_path / "m", *TRAIN))
    assert "--corpus" in line and "pipe" in line and "regular file" in line, line
    assert "no sentence pairs left" not in line
    assert not (tmp_path / "m").exists()


def test_train_on_a_pipe_dev_set_is_refused_naming_the_option(tmp_path, pipes):
    source = pipes(b"".join(VAL_EN.read_bytes().splitlines(keepends=True)[:20]))
    target = pipes(b"".join(VAL_FR.read_bytes().splitlines(keepends=True)[:20]))
    line = error_line(run_cli("train", "--corpus", VAL_EN, VAL_FR, "--dev", source, target, "-o", tmp_path / "m",
                              *TRAIN))
    assert "--dev" in line and "pipe" in line, line
    assert not (tmp_path / "m").exists()


def reranker_for(tmp_path, nbest) -> Path:
    """A reranker file weighting every dense feature of ``nbest`` (as rerank writes one)."""
    import json

    from phrase_scorer.io.nbest import dense_layout, read_nbest
    from phrase_scorer.rescoring.reranker import Reranker
    from phrase_scorer.rescoring.weights import Weights

    layout = dense_layout(next(iter(read_nbest(nbest))))
    path = tmp_path / "reranker.json"
    path.write_text(json.dumps(Reranker(Weights(layout, [0.1] * sum(n for _, n in layout)), (), {},
                                        nbest_size=10).to_json()))
    return path


def one_sentence_list(tmp_path, sentence_id: int):
    """The first sentence of the Multi30k list (100 hypotheses), numbered ``sentence_id``."""
    with gzip.open(NBEST, "rb") as f:
        lines = [line for line in f if line.startswith(b"0 |||")]
    path = tmp_path / "one.nbest"
    path.write_bytes(b"".join(str(sentence_id).encode() + line[1:] for line in lines))
    return path


def test_apply_reranker_refuses_a_sentence_id_far_beyond_the_list(tmp_path):
    """One sentence numbered 99999999 once wrote 99,999,999 empty lines (100 MB) before its best
    hypothesis, with exit 0: the gap is refused, naming the line, the id and the limit, and
    nothing is written."""
    from phrase_scorer.io.nbest import MAX_SKIPPED_SENTENCES

    nbest = one_sentence_list(tmp_path, 99_999_999)
    out = tmp_path / "best.txt"
    line = error_line(run_cli("apply-reranker", reranker_for(tmp_path, NBEST), "--test", nbest, "-o", out))
    assert f"{nbest} line 1: " in line and "99,999,999" in line and f"{MAX_SKIPPED_SENTENCES:,}" in line, line
    assert not out.exists()


def test_apply_reranker_still_fills_a_small_gap_with_empty_lines(tmp_path):
    """A list whose only sentence is number 3 (sentences 0-2 had no hypotheses) gives three empty
    lines and the best hypothesis: a gap within the limit keeps line k for sentence k."""
    nbest = one_sentence_list(tmp_path, 3)
    out = tmp_path / "best.txt"
    result = run_cli("apply-reranker", reranker_for(tmp_path, NBEST), "--test", nbest, "-o", out)
    assert result.exit_code == 0, result.stderr
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[:3] == ["", "", ""] and lines[3] and lines[4:] == [""]



def test_score_refuses_an_nbest_list_pointing_to_rescore(tmp_path, tiny_model):
    """`score -m M list.nbest.gz` once scored each sentence id as a source phrase ("0 ||| un homme
    ..."), exit 0: an n-best list is refused at its first line, naming rescore."""
    out = tmp_path / "scores.txt"
    line = error_line(run_cli("score", "-m", tiny_model, NBEST, "-o", out))
    assert f"{NBEST} line 1: " in line and "n-best list" in line and "rescore" in line, line
    assert not out.exists()


def test_score_still_scores_pairs_whose_source_is_a_number(tmp_path, tiny_model):
    """A pair file whose sources are numbers and whose third field holds scores is not an n-best
    list: it is scored."""
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("0 ||| un ||| 0.5 0.5 ||| 0-0\n12 ||| douze\n", encoding="utf-8")
    out = tmp_path / "scores.txt"
    result = run_cli("score", "-m", tiny_model, pairs, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert len(out.read_text().split()) == 2


def test_reranked_translation_refuses_a_pipe_source_before_moses_starts(tmp_path, pipes):
    """translate --moses --reranker reads its source twice (the lines Moses decodes, and the
    chunks the models rerank): a process substitution would give each reader part of the lines.
    Refused before anything runs (no Moses is needed to see it)."""
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.rescoring.translation import TunedSystem, translate_reranked

    source = pipes(VAL_EN.read_bytes()[:2000])
    out = tmp_path / "out.txt"
    with pytest.raises(PhraseScorerError, match="pipe") as raised:
        translate_reranked(source, out, TunedSystem(None, DATA / "moses.tuned.ini", tmp_path / "none.json"))
    assert raised.value.path == source
    assert not out.exists() and not (tmp_path / "out.txt.work").exists()


@pytest.mark.parametrize("which", ["dev", "test"])
def test_rerank_refuses_a_pipe_list_before_anything_is_made(tmp_path, pipes, which):
    """rerank reads each n-best list twice (the extractor's files, then the rows it chooses
    from): a process substitution is refused as '-' is, naming the list, before Moses is looked for."""
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.rescoring.rerank import rerank

    with gzip.open(NBEST, "rb") as f:
        piped = pipes(b"".join(next(f) for _ in range(50)))
    lists = {"dev": NBEST, "test": NBEST, which: piped}
    out = tmp_path / "out.txt"
    with pytest.raises(PhraseScorerError, match="pipe") as raised:
        rerank((lists["dev"], DATA / "val.tok.fr.head"), lists["test"], out, moses=tmp_path / "no-moses")
    assert raised.value.path == piped and which in raised.value.message
    assert not out.exists()


@pytest.mark.parametrize("verb", ["train", "annotate"])
def test_an_nbest_list_given_as_a_phrase_table_is_named_as_one(tmp_path, tiny_model, verb):
    """train and annotate read a phrase table: an n-best list given instead was refused as a
    table whose score 'LexicalReordering0=' is not a number; it is named for what it is."""
    args = ([NBEST, "-o", tmp_path / "m", *TRAIN] if verb == "train"
            else [NBEST, "-m", tiny_model, "-o", tmp_path / "out.gz", "--workers", "0"])
    line = error_line(run_cli(verb, *args))
    assert f"{NBEST} line 1: " in line and "is a Moses n-best list" in line and "rescore" in line, line
    assert not (tmp_path / "out.gz").exists()
