"""Device and precision are resolved in one place and recorded: in the annotated table's signature,
in what annotate --resume compares, and in a training checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLE_TABLE, head_lines
from phrase_scorer.scoring.annotate import annotate
from phrase_scorer.config import AnnotateOptions, RunOptions, ScoringOptions, TrainConfig
from phrase_scorer.runtime.device import resolve_precision
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.training.run import train


def test_scoring_defaults_to_fp32_and_a_cpu_always_computes_in_fp32():
    assert ScoringOptions().precision == "fp32"
    cpu = torch.device("cpu")
    assert [resolve_precision(cpu, p) for p in ("auto", "fp32", "bf16", "fp16")] == ["fp32"] * 4
    with pytest.raises(PhraseScorerError, match="unknown precision 'fp8'"):
        resolve_precision(cpu, "fp8")




def interrupted_annotation(tmp_path: Path, loaded) -> tuple:
    """An annotation interrupted after its first chunk, as a run on this machine leaves it:
    (table, output, record, the uninterrupted output)."""
    from phrase_scorer.runtime.job import OutputJob

    table = tmp_path / "t.txt"
    table.write_bytes(b"".join(head_lines(EXAMPLE_TABLE, 600)))
    whole = tmp_path / "whole.gz"
    annotate(table, whole, loaded, AnnotateOptions(window_lines=200))
    out = tmp_path / "o.gz"
    write = OutputJob.write

    def first_chunk_only(self, lines, data):
        if self.lines_done:
            raise KeyboardInterrupt
        write(self, lines, data)

    OutputJob.write = first_chunk_only  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            annotate(table, out, loaded, AnnotateOptions(window_lines=200), run=RunOptions(workers=0))
    finally:
        OutputJob.write = write  # type: ignore[method-assign]
    record = Path(str(out) + ".part.json")
    assert json.loads(record.read_text())["lines_done"] == 200
    return table, out, record, whole


def test_signature_names_device_and_precision(tmp_path, loaded_tiny):
    table = tmp_path / "t.txt"
    table.write_bytes(b"".join(head_lines(EXAMPLE_TABLE, 50)))
    result = annotate(table, tmp_path / "o.txt", loaded_tiny)
    signature = json.loads((tmp_path / "o.txt.json").read_text())
    scoring = signature["scoring"]
    assert (scoring["device"], scoring["precision"]) == ("cpu", "fp32") and scoring == result.signature["scoring"]
    assert scoring["softmax"] == "base 2"  # the log-sum-exp's method (OutputSoftmax) moves last digits


@pytest.mark.parametrize("key, saved", [("precision", "bf16"), ("device", "cuda:NVIDIA H100 80GB HBM3")])
def test_resume_refuses_chunks_from_another_device_or_precision(tmp_path, loaded_tiny, key, saved):
    table, out, record, whole = interrupted_annotation(tmp_path, loaded_tiny)
    data = json.loads(record.read_text())
    # as if the interrupted run had scored on a GPU, or in bf16
    data["settings"]["scoring"][key] = saved
    record.write_text(json.dumps(data))
    now = {"precision": "fp32", "device": "cpu"}[key]
    with pytest.raises(PhraseScorerError, match=f"cannot resume: scoring changed since the interrupted run "
                                                f"\\(scoring.{key}: {saved} -> {now}\\)") as info:
        annotate(table, out, loaded_tiny, AnnotateOptions(window_lines=200), run=RunOptions(resume=True))
    assert "\n" not in str(info.value)
    assert not out.exists()
    # the same record with this machine's device and precision resumes, and gives the same table
    data["settings"]["scoring"][key] = now
    record.write_text(json.dumps(data))
    annotate(table, out, loaded_tiny, AnnotateOptions(window_lines=200), run=RunOptions(resume=True))
    assert out.read_bytes() == whole.read_bytes()


def test_training_resumed_on_another_device_says_so(tmp_path, caplog):
    out = tmp_path / "m"
    quick = dict(preset="tiny", valid_every=5, valid_pairs=100, batch_size=16)
    state = train(EXAMPLE_TABLE, out, TrainConfig(max_steps=5, **quick))
    assert (state.device, state.precision) == ("cpu", "fp32")
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (checkpoint["state"]["device"], checkpoint["state"]["precision"]) == ("cpu", "fp32")
    checkpoint["state"].update(device="cuda:NVIDIA H100 80GB HBM3", precision="bf16")
    torch.save(checkpoint, out / "checkpoint.pt")
    logger = logging.getLogger("phrase_scorer.training.run")  # the CLI tests may stop propagation at "phrase_scorer"
    logger.addHandler(caplog.handler)
    try:
        state = train(EXAMPLE_TABLE, out, TrainConfig(max_steps=8, **quick), resume=True, explicit={"max_steps"})
    finally:
        logger.removeHandler(caplog.handler)
    assert state.step == 8 and (state.device, state.precision) == ("cpu", "fp32")
    assert "the interrupted run trained on cuda:NVIDIA H100 80GB HBM3 in bf16; it goes on on cpu in fp32" in caplog.text
