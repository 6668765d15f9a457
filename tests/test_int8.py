"""--precision int8: a CPU's output-layer product in 8-bit integers, recorded where a run records
its precision and refused when a resumed run would mix it with fp32."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import DATA, EXAMPLE_TABLE, head_lines, rescore_stopped_after
from phrase_scorer.cli import cli
from phrase_scorer.config import (
    PRECISIONS, TRAIN_PRECISIONS, AnnotateOptions, RescoreOptions, RunOptions, ScoringOptions,
)
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.nbest import read_nbest
from phrase_scorer.io.phrase_table import split_words
from phrase_scorer.model_dir import load_model
from phrase_scorer.runtime.device import resolve_precision
from phrase_scorer.scoring.annotate import annotate
from phrase_scorer.scoring.batch_scorer import BatchScorer
from phrase_scorer.scoring.int8_output import Int8Product
from phrase_scorer.rescoring.rescore import FeatureModel, rescore

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"


def test_int8_is_a_cpu_scoring_precision_and_refused_on_a_gpu():
    assert "int8" in PRECISIONS and "int8" not in TRAIN_PRECISIONS
    assert resolve_precision(torch.device("cpu"), "int8") == "int8"
    with pytest.raises(PhraseScorerError, match="is for scoring on a CPU"):
        resolve_precision(torch.device("cuda"), "int8")  # refused before anything touches the device
    result = CliRunner().invoke(cli, ["train", str(EXAMPLE_TABLE), "-o", "unused", "--precision", "int8"])
    assert result.exit_code == 2 and "'int8' is not one of" in result.output


def test_a_rows_int8_logits_are_its_own_whatever_shares_its_chunk():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(500, 48, generator=generator) * 0.1  # (V', l)
    bias = torch.randn(500, generator=generator)
    product = Int8Product(weight, bias)
    rows = torch.randn(6, 48, generator=generator) * torch.tensor([[0.01], [0.5], [1.0], [3.0], [10.0], [40.0]])
    alone = torch.cat([product(row.unsqueeze(0)) for row in rows])
    together = product(rows)
    assert torch.equal(alone, together)  # each row quantized over its own range: bit for bit
    assert torch.equal(product(rows[[3]]), product(torch.cat([rows[[3]], rows[[3]] * 1000]))[:1])
    exact = rows @ weight.t() + bias  # (6, V')
    error = (together - exact).abs()
    # 7-bit rows and 8-bit weights: a logit's error is a small part of its row's scale
    scale = rows.abs().amax(1, keepdim=True) * weight.abs().sum(1)  # (6, V') bound on |W_o t|
    assert float((error / scale).max()) < 0.02
    relative = error.mean(1) / (exact - bias).abs().mean(1)  # (6,) each row's mean error, relative
    assert float(relative.max()) < 0.03 and float(relative.min()) > 0  # small, and not the fp32 product


def scores(model, precision: str, sources, targets) -> np.ndarray:
    return BatchScorer(model, ScoringOptions(precision=precision)).score(sources, targets)


def list_pairs(loaded):
    sentences = [line.split() for line in SOURCE.read_text(encoding="utf-8").splitlines()]
    entries = list(read_nbest(NBEST))
    return ([loaded.source_vocab.encode(sentences[e.sentence_id]) for e in entries],
            [loaded.target_vocab.encode(split_words(e.hypothesis)) for e in entries])


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch", "transformer"])
def test_int8_scores_stay_near_fp32_and_say_so(sentence_models, arch):
    loaded = load_model(sentence_models(arch))
    sources, targets = list_pairs(loaded)
    fp32, int8 = scores(loaded.model, "fp32", sources, targets), scores(loaded.model, "int8", sources, targets)
    tokens = np.array([len(t) + 1 for t in targets])
    moved = np.abs(int8 - fp32)
    assert moved.max() > 0  # another product
    assert float((moved / tokens).max()) < 0.02 and float((moved / tokens).mean()) < 0.005
    described = BatchScorer(loaded.model, ScoringOptions(precision="int8")).describe()
    assert described["precision"] == "int8" and described["int8_engine"] == torch.backends.quantized.engine
    assert described["softmax"] == "base 2"
    assert "int8_engine" not in BatchScorer(loaded.model, ScoringOptions()).describe()


def test_rescore_records_int8_and_resumes_only_in_int8(tmp_path, loaded_tiny, monkeypatch):
    models = [FeatureModel("RNN0", loaded_tiny)]
    options = RescoreOptions(window_lines=30)
    int8 = ScoringOptions(precision="int8")
    reference = tmp_path / "int8.gz"
    rescore(NBEST, SOURCE, reference, models, options, int8)
    signature = json.loads(Path(str(reference) + ".json").read_text())
    assert signature["scoring"][0]["precision"] == "int8" and signature["scoring"][0]["int8_engine"]
    fp32 = tmp_path / "fp32.gz"
    rescore(NBEST, SOURCE, fp32, models, options)
    values = np.array([[e.feature("RNN0")[0] for e in read_nbest(path)] for path in (reference, fp32)])
    tokens = np.array([len(split_words(e.hypothesis)) + 1 for e in read_nbest(NBEST)])
    moved = np.abs(values[0] - values[1]) / tokens
    assert moved.max() > 0 and moved.max() < 0.02

    out = tmp_path / "cut.gz"
    with rescore_stopped_after(monkeypatch, 2), pytest.raises(KeyboardInterrupt):
        rescore(NBEST, SOURCE, out, models, options, int8)
    with pytest.raises(PhraseScorerError, match=r"cannot resume: scoring changed since the interrupted run "
                                                r"\(scoring.0.precision: int8 -> fp32"):
        rescore(NBEST, SOURCE, out, models, options, run=RunOptions(resume=True))
    assert not out.exists()
    rescore(NBEST, SOURCE, out, models, options, int8, run=RunOptions(resume=True))
    assert out.read_bytes() == reference.read_bytes()


def test_annotate_in_int8_records_it(tmp_path, loaded_tiny):
    table = tmp_path / "t.txt"
    table.write_bytes(b"".join(head_lines(EXAMPLE_TABLE, 300)))
    annotate(table, tmp_path / "o.txt", loaded_tiny, AnnotateOptions(window_lines=100),
             ScoringOptions(precision="int8"))
    scoring = json.loads((tmp_path / "o.txt.json").read_text())["scoring"]
    assert (scoring["device"], scoring["precision"]) == ("cpu", "int8")


@pytest.mark.parametrize("setting", [["--precision", "int8"], ["--batch-tokens", "65536"]])
def test_translate_takes_scoring_settings_only_for_the_reranked_system(tiny_model, tmp_path, setting):
    source = tmp_path / "in.txt"
    source.write_text("a man .\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["translate", "-m", str(tiny_model), str(source), "-o", str(tmp_path / "out"),
                                      *setting])
    assert result.exit_code != 0 and f"{setting[0]} is an option of translate-system" in result.output
    assert not (tmp_path / "out").exists()


def test_a_pytorch_without_int8_kernels_is_told_to_use_fp32(monkeypatch):
    monkeypatch.delattr(torch, "quantize_per_channel")  # as in a PyTorch that dropped its quantized tensors
    with pytest.raises(PhraseScorerError, match=r"needs PyTorch's int8 CPU kernels .* \(use precision=fp32\)"):
        resolve_precision(torch.device("cpu"), "int8")
