"""On a CUDA device: scores match CPU fp32 scores within stated tolerances, and training runs.

Tolerances, in nats of log p(y|x) per pair (tiny model, the "a man" slice of Multi30k):
fp32 (TF32 off) differs from the CPU only by summation order: max 1e-3. bf16 and fp16 round the
recurrent state and the logits (docs/precision.md measures a trained small model at a mean of
about 1e-2 nats for bf16 and 2e-3 for fp16): bf16 mean 0.05, max 0.5; fp16 mean 0.01, max 0.1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import A_MAN_TABLE, DATA, EXAMPLE_TABLE
from phrase_scorer.config import (
    GPU_BATCH_TOKENS, AnnotateOptions, RescoreOptions, RunOptions, ScoringOptions, TrainConfig,
)
from phrase_scorer.io.phrase_table import PhraseTableReader
from phrase_scorer.model_dir import load_model
from phrase_scorer.scoring.batch_scorer import BatchScorer
from phrase_scorer.training.run import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; PyTorch sees none"),
]

TOLERANCES = {"fp32": (1e-4, 1e-3), "bf16": (0.05, 0.5), "fp16": (0.01, 0.1)}  # (mean, max) |delta log p|


def table_pairs(loaded):
    lines = list(PhraseTableReader(A_MAN_TABLE, min_fields=2, check_scores=False))
    return ([loaded.source_vocab.encode(l.source_words) for l in lines],
            [loaded.target_vocab.encode(l.target_words) for l in lines])


@pytest.mark.parametrize("precision,batch_tokens", [("fp32", None), ("fp32", 64), ("bf16", None), ("fp16", None)])
def test_gpu_scores_match_cpu_fp32(tiny_model, precision, batch_tokens):
    """Also in many small batches (64 tokens): each batch's scores are read back while the next
    one runs, and must land on their own pairs."""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    cpu = load_model(tiny_model, "cpu")
    sources, targets = table_pairs(cpu)
    reference = BatchScorer(cpu.model, ScoringOptions(precision="fp32")).score(sources, targets)
    gpu = load_model(tiny_model, "cuda")
    scorer = BatchScorer(gpu.model, ScoringOptions(precision=precision, batch_tokens=batch_tokens))
    described = scorer.describe()
    assert described["device"] == f"cuda:{torch.cuda.get_device_name()}" and described["precision"] == precision
    assert described["batch_tokens"] == (batch_tokens or GPU_BATCH_TOKENS)
    scores = scorer.score(sources, targets)
    delta = np.abs(scores - reference)
    mean_tol, max_tol = TOLERANCES[precision]
    assert np.isfinite(scores).all()
    assert delta.mean() <= mean_tol and delta.max() <= max_tol, (delta.mean(), delta.max())


@pytest.mark.parametrize("precision", ["auto", "fp32"])
def test_training_steps_run_on_the_gpu(tmp_path, precision):
    config = TrainConfig(preset="tiny", max_steps=30, valid_every=10, valid_pairs=200, device="cuda",
                         precision=precision)
    state = train(EXAMPLE_TABLE, tmp_path / "m", config)
    assert state.step == 30 and math.isfinite(state.best_valid_nll)
    assert state.device == f"cuda:{torch.cuda.get_device_name()}"
    assert state.precision == ("fp32" if precision == "fp32"
                               else ("bf16" if torch.cuda.is_bf16_supported() else "fp16"))
    weights = torch.load(tmp_path / "m" / "model.pt", weights_only=True)
    assert all(t.dtype == torch.float32 for t in weights.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())
    loaded = load_model(tmp_path / "m", "cuda")
    sources, targets = table_pairs(loaded)
    assert np.isfinite(BatchScorer(loaded.model).score(sources[:100], targets[:100])).all()


def test_workers_planning_gives_the_same_bytes_on_the_gpu(tmp_path, tiny_model):
    """annotate and rescore on the GPU: the batches planned in worker processes (the default)
    give the bytes of those planned in the main process (no workers)."""
    from phrase_scorer.rescoring.rescore import FeatureModel, rescore
    from phrase_scorer.scoring.annotate import annotate

    loaded = load_model(tiny_model, "cuda")
    options = ScoringOptions(batch_tokens=256)  # many batches
    for workers in (0, 2):
        annotate(A_MAN_TABLE, tmp_path / f"a{workers}.txt", loaded, AnnotateOptions(window_lines=300), options,
                 run=RunOptions(workers=workers))
        rescore(DATA / "val.nbest.head.gz", DATA / "val.tok.en.head", tmp_path / f"r{workers}.txt",
                [FeatureModel("RNN0", loaded)], RescoreOptions(window_lines=200), options,
                run=RunOptions(workers=workers))
    for name in ("a", "r"):
        assert (tmp_path / f"{name}0.txt").read_bytes() == (tmp_path / f"{name}2.txt").read_bytes()
