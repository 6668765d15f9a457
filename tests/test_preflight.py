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


# --- build-reranker checks everything before its first step ----------------------------------------

import math  # noqa: E402
from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from conftest import DATA, error_line  # noqa: E402
from phrase_scorer.errors import PhraseScorerError  # noqa: E402

TRAIN_CS = DATA / "multi30k.train500.cs.gz"  # the Czech side of the same 500 English sentences
QUICK = ["--preset", "tiny", "--max-steps", "2", "--valid-every", "2", "--vocabulary", "words", "--device", "cpu",
         "--threads", "1"]
WORKING_INI = "[feature]\nWordPenalty\n\n[weight]\nWordPenalty0= -1\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny models trained for two updates on the 500 Multi30k pairs: English→French read left to
    right (``forward``) and right to left, French→English (``reverse``), English→Czech (``czech``)."""
    from phrase_scorer.config import TrainConfig
    from phrase_scorer.data.sentence_pairs import SentenceCorpus
    from phrase_scorer.training.run import train

    folder = tmp_path_factory.mktemp("models")
    made = {}
    for name, source, target, right_to_left in (("forward", TRAIN_EN, TRAIN_FR, False),
                                                ("right-to-left", TRAIN_EN, TRAIN_FR, True),
                                                ("reverse", TRAIN_FR, TRAIN_EN, False),
                                                ("czech", TRAIN_EN, TRAIN_CS, False)):
        made[name] = folder / name
        train(SentenceCorpus(str(source), str(target)), made[name],
              TrainConfig(preset="tiny", max_steps=2, valid_every=2, batch_size=8, device="cpu", vocabulary="words",
                          right_to_left=right_to_left, valid_pairs=0))
    return made


@pytest.fixture
def failing_moses(tmp_path) -> Path:
    """A Moses installation whose every program fails: what a build reaches only past its checks."""
    home = tmp_path / "moses"
    (home / "bin").mkdir(parents=True)
    for name in ("moses", "extractor", "mert", "kbmira", "pro", "evaluator"):
        program = home / "bin" / name
        program.write_text("#!/bin/sh\necho 'this Moses fails' >&2\nexit 3\n", encoding="utf-8")
        program.chmod(0o755)
    (home / "scripts" / "training").mkdir(parents=True)
    (home / "scripts" / "training" / "mert-moses.pl").write_text("exit 3\n", encoding="utf-8")
    return home


def build(tmp_path, *more, moses_home=None):
    ini = tmp_path / "system.ini"
    if not ini.exists():
        ini.write_text(WORKING_INI, encoding="utf-8")
    home = ["--moses-home", moses_home] if moses_home else []
    return run_cli("build-reranker", ini, "--corpus", TRAIN_EN, TRAIN_FR, "--tuning-set", VAL_EN, VAL_FR,
                   "-o", tmp_path / "work", "--nbest-size", 10, "--runs", 1, *QUICK, *home, *more)


def test_a_misspelt_model_folder_is_refused_before_any_training(tmp_path, failing_moses):
    result = build(tmp_path, "--models", "forward,reverse", "-m", f"forward={tmp_path / 'fwdd'}",
                   moses_home=failing_moses)
    line = error_line(result)
    assert "fwdd" in line and "does not exist" in line
    assert not (tmp_path / "work").exists()  # nothing trained, nothing decoded


@pytest.mark.parametrize("role, model, said", [
    ("forward", "reverse", "given as forward, but it was trained on the corpus read target to source"),
    ("reverse", "forward", "given as reverse, but it was trained on the corpus read source to target"),
    ("right-to-left", "forward", "given as right-to-left, but it predicts its target left to right"),
    ("forward", "right-to-left", "given as forward, but it predicts its target right to left"),
])
def test_a_model_of_another_direction_is_refused_naming_its_folder(tmp_path, failing_moses, models, role, model,
                                                                    said):
    result = build(tmp_path, "--models", "forward", "-m", f"{role}={models[model]}", moses_home=failing_moses)
    line = error_line(result)
    assert said in line and models[model].name in line
    assert not (tmp_path / "work").exists()


def test_an_english_to_czech_model_is_refused_for_an_english_to_french_build(tmp_path, failing_moses, models):
    result = build(tmp_path, "--models", "forward", "-m", f"forward={models['czech']}", moses_home=failing_moses)
    line = error_line(result)
    assert "given as forward, but it translates into another language" in line and "multi30k.val100.fr" in line
    assert not (tmp_path / "work").exists()


def test_without_its_corpus_a_model_of_the_other_direction_is_known_by_its_vocabularies(tmp_path, models):
    """The corpus given is not the one the model recorded (the same sentences, unzipped): its
    vocabularies against the tuning set decide."""
    from phrase_scorer.model_dir import check_model_reads

    import gzip

    corpus = []
    for side in (TRAIN_EN, TRAIN_FR):
        plain = tmp_path / side.name.replace(".gz", "")
        plain.write_bytes(gzip.decompress(side.read_bytes()))
        corpus.append(plain)
    with pytest.raises(PhraseScorerError, match="given as forward, but it translates the other way"):
        check_model_reads(models["reverse"], "forward", reverse=False, right_to_left=False, corpus=tuple(corpus),
                          texts=(VAL_EN, VAL_FR))
    check_model_reads(models["forward"], "forward", reverse=False, right_to_left=False, corpus=tuple(corpus),
                      texts=(VAL_EN, VAL_FR))  # the right model passes
    check_model_reads(models["reverse"], "reverse", reverse=True, right_to_left=False, corpus=tuple(corpus),
                      texts=(VAL_EN, VAL_FR))


def test_more_members_than_the_machine_can_train_at_once_are_refused(tmp_path):
    """--members 1000 would start 2,000 trainings side by side (2,001 with a reverse model):
    refused naming --members and the memory, before the working folder exists (and before Moses
    is looked for)."""
    result = build(tmp_path, "--members", 1000, "--side-by-side")
    line = error_line(result)
    assert "2,000 trainings side by side (--members 1000)" in line and "GiB" in line
    line = error_line(build(tmp_path, "--members", 1000, "--side-by-side", "--models", "forward,right-to-left,reverse"))
    assert "2,001 trainings side by side (--members 1000)" in line
    assert not (tmp_path / "work").exists()


def test_a_missing_file_of_the_moses_ini_is_refused_before_any_training(tmp_path, failing_moses):
    (tmp_path / "system.ini").write_text("[feature]\nKENLM name=LM0 factor=0 path=lm.arpa.gz order=5\n\n"
                                         "[weight]\nLM0= 0.5\n", encoding="utf-8")
    result = build(tmp_path, "--models", "forward", moses_home=failing_moses)
    line = error_line(result)
    assert "system.ini line 2" in line and "LM0's file lm.arpa.gz is missing" in line
    assert not (tmp_path / "work").exists()


def test_corpus_sides_of_different_lengths_are_refused_before_any_training(tmp_path, failing_moses):
    short = tmp_path / "short.fr"
    short.write_text("une ligne\n", encoding="utf-8")
    ini = tmp_path / "system.ini"
    ini.write_text(WORKING_INI, encoding="utf-8")
    result = run_cli("build-reranker", ini, "--corpus", TRAIN_EN, short, "--tuning-set", VAL_EN, VAL_FR,
                     "-o", tmp_path / "work", *QUICK, "--moses-home", failing_moses)
    line = error_line(result)
    assert "the corpus: 500 lines, but its other side" in line and "short.fr" in line
    assert not (tmp_path / "work").exists()


def test_the_checks_are_logged_before_the_first_step_and_made_again_by_a_run_given_again(tmp_path, failing_moses,
                                                                                        models):
    given = ["--models", "forward", "-m", f"forward={models['forward']}", "-m", f"reverse={models['reverse']}"]
    first = build(tmp_path, *given, moses_home=failing_moses)
    assert "this Moses fails" in error_line(first)  # past the checks: the decoding failed
    log = first.stderr
    assert "checked before the first step" in log and log.index("checked before the first step") < log.index("step 1")
    # the same folder again, with the reverse model given as the forward one: refused before any step
    again = build(tmp_path, "--models", "forward", "-m", f"forward={models['reverse']}", moses_home=failing_moses)
    assert "given as forward, but it was trained on the corpus read target to source" in error_line(again)
    assert "step 1" not in again.stderr


@pytest.mark.parametrize("change, said", [
    (dict(tie_margin=math.nan), "tie_margin is nan"),
    (dict(training_hours=math.inf), "training_hours is inf"),
    (dict(members=0), "members is 0"),
    (dict(bpe_above=2.0), "bpe_above is 2.0"),
])
def test_a_library_caller_s_bad_value_is_refused_before_the_folder_exists(tmp_path, change, said):
    from phrase_scorer.config import BuildRerankerOptions
    from phrase_scorer.experiments.build_reranker import build_reranker

    ini = tmp_path / "system.ini"
    ini.write_text(WORKING_INI, encoding="utf-8")
    with pytest.raises(PhraseScorerError, match=said):
        build_reranker(ini, (str(TRAIN_EN), str(TRAIN_FR)), (str(VAL_EN), str(VAL_FR)), tmp_path / "work",
                       options=replace(BuildRerankerOptions(), **change))
    assert not (tmp_path / "work").exists()


# --- rescore-experiment checks everything before its first step ----------------------------------


def rescore_experiment(tmp_path, moses_home, *more):
    ini = tmp_path / "system.ini"
    if not ini.exists():
        ini.write_text(WORKING_INI, encoding="utf-8")
    sets = []
    for name in ("dev", "test"):
        for side, source in (("en", VAL_EN), ("fr", VAL_FR)):
            copy = tmp_path / f"{name}.{side}"
            if not copy.exists():
                copy.write_bytes(source.read_bytes())
        sets.append((tmp_path / f"{name}.en", tmp_path / f"{name}.fr"))
    return run_cli("rescore-experiment", ini, "--dev", *sets[0], "--test", *sets[1], "-o", tmp_path / "work",
                   "--nbest-size", 10, "--runs", 1, "--moses-home", moses_home, "--device", "cpu", *more)


@pytest.mark.parametrize("option, model, said", [
    ("-m", "reverse", "given as RNN, but it translates the other way"),
    ("-r", "forward", "given as RNN, but it translates the other way"),
    ("-m", "czech", "given as RNN, but it translates into another language"),
])
def test_rescore_experiment_refuses_a_model_of_another_direction_or_language_before_decoding(
        tmp_path, failing_moses, models, option, model, said):
    result = rescore_experiment(tmp_path, failing_moses, option, f"RNN={models[model]}")
    assert said in error_line(result)
    assert not (tmp_path / "work").exists()


def test_rescore_experiment_refuses_a_missing_file_of_its_system_before_decoding(tmp_path, failing_moses, models):
    (tmp_path / "system.ini").write_text("[feature]\nKENLM name=LM0 factor=0 path=lm.arpa.gz order=5\n\n"
                                         "[weight]\nLM0= 0.5\n", encoding="utf-8")
    result = rescore_experiment(tmp_path, failing_moses, "-m", f"RNN={models['forward']}")
    assert "LM0's file lm.arpa.gz is missing" in error_line(result)
    assert not (tmp_path / "work").exists()


def test_rescore_experiment_logs_its_checks_and_makes_them_again_when_given_again(tmp_path, failing_moses, models):
    first = rescore_experiment(tmp_path, failing_moses, "-m", f"RNN={models['forward']}",
                               "-r", f"RNNReverse={models['reverse']}")
    assert "this Moses fails" in error_line(first)  # past the checks: the decoding failed
    assert "checked before the first step" in first.stderr
    (tmp_path / "test.fr").write_text("une ligne\n", encoding="utf-8")  # the test set cut to one line
    again = rescore_experiment(tmp_path, failing_moses, "-m", f"RNN={models['forward']}")
    assert "the test set test: 100 lines, but its other side" in error_line(again)


# --- experiment (Table 1) checks everything before its first step ---------------------------------


def table1(tmp_path, moses_home, *more):
    from conftest import A_MAN_TABLE

    ini = tmp_path / "system.ini"
    ini.write_text(f"[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path={A_MAN_TABLE} "
                   "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n",
                   encoding="utf-8")
    return run_cli("experiment", ini, "--dev", VAL_EN, VAL_FR, "--test", VAL_EN, VAL_FR, "-o", tmp_path / "work",
                   "--runs", 1, "--moses-home", moses_home, *more)


def test_experiment_refuses_a_model_of_the_other_direction_before_annotating(tmp_path, failing_moses, models):
    result = table1(tmp_path, failing_moses, "-m", models["reverse"])
    assert "given as the phrase table's model, but it translates the other way" in error_line(result)
    assert not (tmp_path / "work").exists()


def test_experiment_refuses_a_misspelt_model_folder_before_making_its_folder(tmp_path, failing_moses):
    result = table1(tmp_path, failing_moses, "-m", tmp_path / "modle")
    line = error_line(result)
    assert "modle" in line and "does not exist" in line
    assert not (tmp_path / "work").exists()


def test_experiment_logs_its_checks_before_the_first_step(tmp_path, failing_moses, models):
    result = table1(tmp_path, failing_moses, "-m", models["forward"])
    assert "checked before the first step" in result.stderr
    assert result.stderr.index("checked before the first step") < result.stderr.index("annotating")


# --- ems-decoder checks the system it translates with before it builds ----------------------------


def test_ems_decoder_refuses_a_missing_file_of_the_evaluated_system_before_the_build(tmp_path, failing_moses,
                                                                                     monkeypatch):
    from test_ems_reranking import WEIGHTS, tuning_step

    ems = tmp_path / "ems"
    tuning_step(ems, 1, WEIGHTS)
    monkeypatch.chdir(ems)  # EMS runs its decoder in its working folder
    config = tmp_path / "evaluation.ini"  # EMS's -f: the tuned weights on tables filtered for the test set
    config.write_text("[feature]\nKENLM name=LM0 path=filtered/lm.bin\n" + WEIGHTS, encoding="utf-8")
    result = run_cli("ems-decoder", "--corpus", TRAIN_EN, TRAIN_FR, "--work", tmp_path / "rescoring", *QUICK,
                     "--", failing_moses / "bin" / "moses", "-v", "0", "-f", config, input="a man .\n")
    assert "LM0's file filtered/lm.bin is missing" in error_line(result)
    assert not (tmp_path / "rescoring").exists()


def test_a_corpus_side_given_as_a_pipe_is_refused_before_it_is_read(tmp_path):
    """A FIFO (what a process substitution gives) could be read once: the checks refuse it by its
    kind, without opening it (which would wait for a writer, or consume what the steps need)."""
    import os

    fifo = tmp_path / "corpus.fr"
    os.mkfifo(fifo)
    ini = tmp_path / "system.ini"
    ini.write_text(WORKING_INI, encoding="utf-8")
    result = run_cli("build-reranker", ini, "--corpus", TRAIN_EN, fifo, "--tuning-set", VAL_EN, VAL_FR,
                     "-o", tmp_path / "work", *QUICK)
    line = error_line(result)
    assert "corpus.fr" in line and "not a regular file" in line
    assert not (tmp_path / "work").exists()


def test_nbest_lists_larger_than_the_disk_are_refused_naming_the_size(tmp_path):
    result = build(tmp_path, "--nbest-size", 10 ** 9)
    line = error_line(result)
    assert "--nbest-size 1000000000" in line and "GiB free there" in line
    assert not (tmp_path / "work").exists()


# --- tune checks the system's files before it starts mert ------------------------------------------


def test_tune_refuses_a_missing_file_of_the_moses_ini_before_its_working_folder(tmp_path, failing_moses):
    from conftest import A_MAN_TABLE

    ini = tmp_path / "system.ini"
    ini.write_text(f"[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path={A_MAN_TABLE} "
                   "input-factor=0 output-factor=0\nKENLM name=LM0 factor=0 path=lm.arpa.gz order=5\n\n"
                   "[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\nLM0= 0.5\n", encoding="utf-8")
    result = run_cli("tune", ini, "--dev", VAL_EN, VAL_FR, "-o", tmp_path / "tuned.ini", "--moses-home", failing_moses)
    assert "system.ini line 3: LM0's file lm.arpa.gz is missing" in error_line(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moses", "system.ini"]  # no working folder, no output


def test_texts_without_words_decide_nothing_about_a_model(tmp_path, models):
    from phrase_scorer.model_dir import check_model_reads

    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n", encoding="utf-8")
    check_model_reads(models["reverse"], "forward", reverse=False, texts=(blank, blank))  # no grounds to refuse


def test_a_model_trained_as_another_architecture_is_refused_not_removed(tmp_path, failing_moses):
    """A build continued with other architectures (an option, or a default that changed since):
    the models it trained stay as they were, and the one line names the folder and the option
    that goes on with that build."""
    first = build(tmp_path, "--models", "forward", "--archs", "rnnsearch", moses_home=failing_moses)
    assert "this Moses fails" in error_line(first)  # trained, then the decoding failed
    weights = tmp_path / "work" / "models" / "forward" / "model.pt"
    before = weights.read_bytes()
    again = build(tmp_path, "--models", "forward", "--archs", "transformer", moses_home=failing_moses)
    line = error_line(again)
    assert "models/forward was trained as rnnsearch" in line and "a transformer in its place" in line
    assert "--archs rnnsearch" in line
    assert weights.read_bytes() == before
    reverse = build(tmp_path, "--models", "forward,reverse", "--archs", "rnnsearch", "--reverse-arch", "encdec",
                    moses_home=failing_moses)
    assert "this Moses fails" in error_line(reverse)  # the reverse model trained as encdec
    line = error_line(build(tmp_path, "--models", "forward,reverse", "--archs", "rnnsearch",
                            "--reverse-arch", "transformer", moses_home=failing_moses))
    assert "models/reverse was trained as encdec" in line and "--reverse-arch encdec" in line
