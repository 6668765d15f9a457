"""ems-decoder: EMS's evaluation decodes through the reranked system.

These tests need no Moses: they give the wrapper the arguments EMS's decode step gives a decoder
and an EMS working folder laid out as experiment.perl lays one out (its step scripts, their
``.DONE`` marks, the tuned moses.ini its tuning step copies), and check what it finds there. The
whole EMS run is in tests/test_ems_moses.py (marker `moses`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.experiments.ems_decoder import DecoderCall, find_corpus, find_tuning, parse_decoder_call
from phrase_scorer.io.output_lock import OutputLock

WEIGHTS = "[weight]\nLM0= 0.1\nTranslationModel0= 0.2 0.3 -0.1 0.05\n"


def test_the_decoder_call_is_read_as_ems_writes_it():
    # EMS: "$decoder $settings -v 0 -f $config", $settings ending in -text-type "test"
    args = ["/moses/bin/moses", "-threads", "4", "-text-type", "test", "-v", "0", "-f", "evaluation/test.ini.3"]
    assert parse_decoder_call(args) == DecoderCall("/moses/bin/moses", "evaluation/test.ini.3", 4)
    assert parse_decoder_call(["moses", "-config", "x.ini"]).config == "x.ini"


@pytest.mark.parametrize("args, said", [
    ([], "no decoder after --"),
    (["moses", "-v", "0"], "no -f CONFIG"),
    (["moses", "-f", "x.ini", "-n-best-list", "out.best100", "100"], "does not take Moses' option -n-best-list"),
    (["moses", "-f", "x.ini", "-t"], "does not take Moses' option -t"),
    (["moses", "-f", "x.ini", "-threads", "all"], "-threads all: not a number"),
])
def test_a_decoder_call_the_reranked_path_cannot_honour_is_refused(args, said):
    with pytest.raises(PhraseScorerError, match=said):
        parse_decoder_call(args)


def ems_step(ems: Path, run: int, name: str, command: str, done: bool = True) -> Path:
    """A step script as experiment.perl's create_step writes it."""
    folder = ems / "steps" / str(run)
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / f"{name}.{run}"
    script.write_text(f"#!/bin/bash\n\nPATH=\"/usr/bin\"\ncd {ems}\necho 'starting at '`date`' on '`hostname`\n"
                      f"mkdir -p {ems}/tuning\n\n{command}\n\necho 'finished at '`date`\ntouch {script}.DONE\n",
                      encoding="utf-8")
    if done:
        Path(f"{script}.DONE").touch()
    return script


def tuning_step(ems: Path, run: int, weights: str, done: bool = True) -> Path:
    tuned = ems / "tuning" / f"moses.ini.{run}"
    tuned.parent.mkdir(parents=True, exist_ok=True)
    tuned.write_text("[feature]\nKENLM name=LM0\n" + weights, encoding="utf-8")
    ems_step(ems, run, "TUNING_tune",
             f"/moses/scripts/training/mert-moses.pl {ems}/tuning/input.tok.{run} {ems}/tuning/reference.tok.{run} "
             f"/moses/bin/moses {ems}/tuning/filtered.{run}/moses.ini --nbest 100 --working-dir "
             f"{ems}/tuning/tmp.{run} --decoder-flags \"-threads 2 -v 0 \" --rootdir /moses/scripts "
             f"--no-filter-phrase-table\ncp {ems}/tuning/tmp.{run}/moses.ini {tuned}", done)
    return tuned


def test_the_tuning_with_the_evaluated_weights_is_found(tmp_path):
    ems = tmp_path / "ems"
    first = tuning_step(ems, 1, WEIGHTS)
    tuning_step(ems, 2, WEIGHTS.replace("0.1", "0.4"))
    tuning_step(ems, 3, WEIGHTS, done=False)  # crashed: not a tuning EMS finished
    config = tmp_path / "evaluation.ini"  # the evaluated system: the training config with run 1's weights
    config.write_text("[feature]\nKENLM name=LM0 path=/lm\n" + WEIGHTS.replace("0.2", "0.20"), encoding="utf-8")
    found = find_tuning(ems, config)
    assert (found.run, found.tuned_ini) == (1, str(first))
    assert found.input == f"{ems}/tuning/input.tok.1" and found.reference == f"{ems}/tuning/reference.tok.1"
    config.write_text(WEIGHTS.replace("0.3", "0.31"), encoding="utf-8")
    with pytest.raises(PhraseScorerError, match="no finished EMS tuning step .2 looked at. has the weights"):
        find_tuning(ems, config)


def test_the_training_corpus_is_the_newest_finished_one(tmp_path):
    ems = tmp_path / "ems"
    with pytest.raises(PhraseScorerError, match="no finished EMS training step names the training corpus"):
        find_corpus(ems)
    train = "/moses/scripts/training/train-model.perl -root-dir {ems}/model -corpus {stem} -f en -e fr -alignment x"
    ems_step(ems, 1, "TRAINING_run-giza", train.format(ems=ems, stem="training/corpus.1"))
    ems_step(ems, 2, "TRAINING_run-giza", train.format(ems=ems, stem=f"{ems}/training/corpus.2"), done=False)
    assert find_corpus(ems) == (f"{ems}/training/corpus.1.en", f"{ems}/training/corpus.1.fr")


def test_the_build_lock_is_never_taken_through_a_link(tmp_path):
    """ems-decoder's lock beside its build folder (rescoring.lock) is the output lock every writer
    takes, waiting instead of refusing: a link at its name is refused and the file it points to
    left alone."""
    target = tmp_path / "yours"
    target.write_text("keep", encoding="utf-8")
    os.symlink(target, tmp_path / "rescoring.lock")
    with pytest.raises(PhraseScorerError, match="is a symbolic link"):
        with OutputLock(tmp_path / "rescoring", wait=True):
            pass
    assert target.read_text(encoding="utf-8") == "keep"


def test_a_second_build_waits_for_the_first_instead_of_failing(tmp_path):
    """Two EMS test sets decode at once: the second run's lock waits until the first lets go,
    then is taken (where a plain output lock refuses)."""
    import subprocess
    import sys

    work = tmp_path / "rescoring"
    taken = tmp_path / "taken"
    second = [sys.executable, "-c",
              "import sys; from phrase_scorer.io.output_lock import OutputLock\n"
              "with OutputLock(sys.argv[1], wait=True):\n    open(sys.argv[2], 'w').write('taken')",
              str(work), str(taken)]
    with OutputLock(work):
        refused = subprocess.run([sys.executable, "-c",
                                  "import sys; from phrase_scorer.io.output_lock import OutputLock\n"
                                  "OutputLock(sys.argv[1]).acquire()", str(work)], capture_output=True, text=True)
        assert refused.returncode != 0 and "another phrase-scorer run is writing" in refused.stderr
        waiting = subprocess.Popen(second)
        assert not taken.exists()  # it cannot have the lock while this process holds it
    assert waiting.wait(timeout=120) == 0
    assert taken.read_text() == "taken"
    assert not (tmp_path / "rescoring.lock").exists()  # the last holder removed its lock file
