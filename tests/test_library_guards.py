"""The library functions behind the writing verbs guard their own outputs, for a Python caller as
for the command line: an output that is one of the inputs (or a link to one) is refused and the
input keeps its bytes; an existing output is replaced only with ``overwrite``; and a file or link
found at a name written beside the output (the old ``OUT.part``, ``OUT.input``, ``OUT.log``) is
never written through, truncated or removed.

The Moses functions check their output before they look for Moses, so the refusals need no Moses
build; where a run must get past the check, a folder of small scripts stands in for Moses.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import A_MAN_TABLE, DATA
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.moses.installation import MosesInstallation

NBEST = DATA / "val.nbest.head.gz"
USERS = b"the user's own file\n"


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def no_moses(tmp_path: Path) -> MosesInstallation:
    """An installation with no programs: a function that got past its output check fails on it."""
    return MosesInstallation(tmp_path / "no-moses")


def fake_moses(tmp_path: Path) -> MosesInstallation:
    """Scripts in place of Moses: the decoder copies its input, mert-moses.pl writes a tuned ini."""
    home = tmp_path / "moses"
    executable(home / "bin" / "moses", "#!/bin/sh\necho 'decoding' >&2\ncat\n")
    for name in ("extractor", "mert", "kbmira", "pro", "evaluator"):
        executable(home / "bin" / name, "#!/bin/sh\nexit 0\n")
    executable(home / "scripts" / "training" / "mert-moses.pl", r"""
use strict;
my $dir;
for (my $i = 0; $i < @ARGV; $i++) { $dir = $ARGV[$i + 1] if $ARGV[$i] eq "--working-dir"; }
mkdir $dir or die "cannot make $dir";
open(my $ini, ">", "$dir/moses.ini") or die;
print $ini "# BLEU 0.25 on dev\n[weight]\nTranslationModel0= 0.3 0.3 0.3 0.3\n";
close $ini;
print "(1) BEST at 1: 0.3 0.3 0.3 0.3 => 0.25 at Sun Nov 22\n";
""")
    return MosesInstallation(home)


@pytest.fixture
def files(tmp_path):
    """Copies of the inputs, and a file of the user's kept beside them."""
    ini = tmp_path / "moses.ini"
    ini.write_text(f"[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path={A_MAN_TABLE} "
                   "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    source, reference = tmp_path / "dev.en", tmp_path / "dev.fr"
    source.write_text("a man\na dog\n")
    reference.write_text("un homme\nun chien\n")
    nbest = tmp_path / "nbest.gz"
    shutil.copyfile(NBEST, nbest)
    users = tmp_path / "users.txt"
    users.write_bytes(USERS)
    return {"ini": ini, "source": source, "reference": reference, "nbest": nbest, "users": users}


def reranker_file(tmp_path: Path) -> Path:
    from phrase_scorer.io.nbest import dense_layout, read_nbest
    from phrase_scorer.rescoring.reranker import Reranker
    from phrase_scorer.rescoring.weights import Weights

    layout = dense_layout(next(iter(read_nbest(NBEST))))
    weights = Weights(layout, [0.1] * sum(count for _, count in layout))
    path = tmp_path / "reranker.json"
    path.write_text(json.dumps(Reranker(weights, (), {}, nbest_size=10).to_json()))
    return path


def score_table(tmp_path: Path) -> Path:
    table = tmp_path / "t.txt"
    table.write_text("".join(f"a{i} ||| b ||| {p} 0.5 0.5 0.5 {p / 2} 1\n" for i, p in enumerate((0.1, 0.2, 0.4, 0.8))))
    return table


# --- each library function, called as a Python caller calls it ------------------------------------


def call_apply_reranker(tmp_path, f, output, **overwrite):
    from phrase_scorer.rescoring.reranker import apply_reranker

    reranker = reranker_file(tmp_path)
    apply_reranker(reranker, f["nbest"], output, **overwrite)


def call_rerank(tmp_path, f, output, **overwrite):
    from phrase_scorer.rescoring.rerank import rerank

    rerank((f["nbest"], f["reference"]), f["nbest"], output, moses=no_moses(tmp_path), **overwrite)


def call_tune(tmp_path, f, output, **overwrite):
    from phrase_scorer.moses.tune import tune

    tune(f["ini"], f["source"], f["reference"], output, moses=no_moses(tmp_path), **overwrite)


def call_evaluate(tmp_path, f, output, **overwrite):
    from phrase_scorer.moses.evaluate import evaluate

    evaluate(f["ini"], f["source"], f["reference"], output, moses=no_moses(tmp_path), **overwrite)


def call_moses_ini(tmp_path, f, output, **overwrite):
    from phrase_scorer.config import MosesIniOptions
    from phrase_scorer.moses.ini_patch import patch_moses_ini

    patch_moses_ini(f["ini"], output, phrase_table=A_MAN_TABLE, options=MosesIniOptions(add_features=0), **overwrite)


def call_plot_scores(tmp_path, f, output, **overwrite):
    pytest.importorskip("matplotlib")
    from phrase_scorer.analysis.plots import plot_scores

    plot_scores(f["table"], output, **overwrite)


def call_experiment_report(tmp_path, f, output, **overwrite):
    from phrase_scorer.experiments.experiment import run_experiment
    from phrase_scorer.experiments.report import ExperimentOutputs

    run_experiment(f["ini"], (f["source"], f["reference"]), (f["source"], f["reference"]),
                   ExperimentOutputs(tmp_path / "work", report=output, **overwrite), moses=no_moses(tmp_path),
                   annotated=A_MAN_TABLE)


def call_rescore_experiment_report(tmp_path, f, output, **overwrite):
    from phrase_scorer.experiments.report import ExperimentOutputs
    from phrase_scorer.experiments.rescore_experiment import Comparison, EvalSet, run_rescore_experiment

    sets = [EvalSet("dev", f["source"], f["reference"], f["nbest"]), EvalSet("test", f["source"], f["reference"], None)]
    run_rescore_experiment(f["ini"], sets, ExperimentOutputs(tmp_path / "work", report=output, **overwrite),
                           comparison=Comparison([]), moses=no_moses(tmp_path))


CALLS = {  # name -> (the call, the input that names the output in the refusal)
    "apply_reranker": (call_apply_reranker, "nbest"),
    "rerank": (call_rerank, "nbest"),
    "tune": (call_tune, "ini"),
    "evaluate": (call_evaluate, "reference"),
    "moses-ini": (call_moses_ini, "ini"),
    "plot_scores": (call_plot_scores, "table"),
    "experiment report": (call_experiment_report, "reference"),
    "rescore-experiment report": (call_rescore_experiment_report, "source"),
}


@pytest.mark.parametrize("link", [False, True], ids=["the input", "a link to the input"])
@pytest.mark.parametrize("name", CALLS)
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, files, name, link):
    call, which = CALLS[name]
    files["table"] = score_table(tmp_path)
    victim = files[which]
    kept = victim.read_bytes()
    output = victim
    if link:
        output = tmp_path / "out.png"
        os.symlink(victim, output)
    for overwrite in ({}, {"overwrite": True}):
        with pytest.raises(PhraseScorerError, match="is the same file as") as caught:
            call(tmp_path, files, output, **overwrite)
        assert ("(through a link)" in caught.value.message) == link
        assert victim.read_bytes() == kept
    assert not link or os.path.islink(output)
    assert not (tmp_path / "work").exists() and not (tmp_path / "out.png.work").exists()


@pytest.mark.parametrize("name", CALLS)
def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path, files, name):
    call, _ = CALLS[name]
    files["table"] = score_table(tmp_path)
    output = tmp_path / "out.png"
    output.write_bytes(USERS)
    with pytest.raises(PhraseScorerError, match="already exists") as caught:
        call(tmp_path, files, output)
    assert caught.value.path == str(output) and "overwrite" in caught.value.hint
    assert output.read_bytes() == USERS
    assert not (tmp_path / "work").exists() and not (tmp_path / "out.png.work").exists()


# --- nothing beside the output is written through a link --------------------------------------------


def test_tune_never_writes_through_a_link_at_out_part(tmp_path, files):
    from phrase_scorer.moses.tune import tune

    output = tmp_path / "tuned.ini"
    os.symlink(files["users"], tmp_path / "tuned.ini.part")
    result = tune(files["ini"], files["source"], files["reference"], output, moses=fake_moses(tmp_path))
    assert files["users"].read_bytes() == USERS
    assert os.path.islink(tmp_path / "tuned.ini.part")
    assert output.read_text().startswith("# BLEU 0.25 on dev\n") and result.dev_bleu == pytest.approx(25.0)


@pytest.mark.parametrize("companion", [".part", ".input", ".log"])
def test_evaluate_never_writes_through_a_link_beside_its_output(tmp_path, files, companion):
    from phrase_scorer.moses.evaluate import evaluate

    output = tmp_path / "test.hyp"
    planted = tmp_path / f"test.hyp{companion}"
    os.symlink(files["users"], planted)
    try:
        result = evaluate(files["ini"], files["source"], files["reference"], output, moses=fake_moses(tmp_path))
    except PhraseScorerError as exc:  # a link where the log goes is refused, not followed
        assert companion == ".log" and "symbolic link" in exc.message and exc.path == str(planted)
        assert not output.exists() and not list(tmp_path.glob("test.hyp.*.part"))
    else:
        assert companion != ".log"
        assert output.read_text() == "a man\na dog\n" and result.sentences == 2
    assert files["users"].read_bytes() == USERS and os.path.islink(planted)


def probing_ini(tmp_path: Path) -> Path:
    ini = tmp_path / "probing.ini"
    ini.write_text("[feature]\nProbingPT name=TranslationModel0 num-features=4 path=pt.probing input-factor=0 "
                   "output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    executable(tmp_path / "moses" / "bin" / "CreateProbingPT",
               '#!/bin/sh\necho "building $4" >&2\nmkdir -p "$4"; printf "num_scores\\t$6\\n" > "$4/config"\n')
    return ini


@pytest.mark.parametrize("companion", [".part", ".log"])
def test_moses_ini_binarising_never_writes_through_or_removes_a_link_beside_the_table(tmp_path, companion):
    from phrase_scorer.config import MosesIniOptions
    from phrase_scorer.moses.ini_patch import patch_moses_ini

    users = tmp_path / "users.txt"
    users.write_bytes(USERS)
    planted = tmp_path / f"pt.probing{companion}"
    os.symlink(users, planted)
    with pytest.raises(PhraseScorerError) as caught:
        patch_moses_ini(probing_ini(tmp_path), tmp_path / "o.ini", phrase_table=tmp_path / "pt.probing",
                        options=MosesIniOptions(add_features=0), binarize_from=A_MAN_TABLE,
                        moses_home=tmp_path / "moses")
    assert caught.value.path == str(planted)
    assert users.read_bytes() == USERS and os.path.islink(planted)
    assert not (tmp_path / "o.ini").exists() and not (tmp_path / "pt.probing").exists()
