"""Shared fixtures: real data files and small real models trained once per session."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# PyTorch's OpenMP threads spin while they wait for each other. On a machine whose cores are
# shared (CI, a training run beside the suite) a spinning thread holds a core that the thread it
# waits for needs: training the tiny model took 21.5 s instead of 1.7 s beside one busy process.
# Passive waiting (set before torch is loaded, inherited by the commands the tests start) costs
# about 15% on an idle machine and keeps the suite's time the same on a busy one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# As the package does (phrase_scorer/__init__.py): torch's CPU allocator asks for huge pages.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
EXAMPLE_TABLE = ROOT / "examples" / "phrase-table.sample.gz"
# A contiguous, sorted slice of the real Multi30k table: every pair whose source starts with
# "a man in a ", plus the pairs of "a", "a man" and "man" (many targets per source).
A_MAN_TABLE = DATA / "phrase-table.a-man.gz"
SHARED = ROOT.parent / "shared" / "data"
SHARED_SYSTEM = SHARED / "moses-multi30k-en-fr"
SHARED_TABLE = SHARED_SYSTEM / "phrase-table.gz"
# The first 500 sentence pairs of the Multi30k training set (gzip) and 100 of its validation set
# (plain), tokenised as the Moses system's data.
TRAIN_EN = DATA / "multi30k.train500.en.gz"
TRAIN_FR = DATA / "multi30k.train500.fr.gz"
VAL_EN = DATA / "multi30k.val100.en"
VAL_FR = DATA / "multi30k.val100.fr"


PAUSE_AT = Path(__file__).resolve().parent / "pause_at.py"


def run_cli(*args, input=None):
    """The CLI in this process: an exception it did not handle fails the test (no traceback allowed)."""
    from click.testing import CliRunner

    from phrase_scorer.cli import cli

    result = CliRunner().invoke(cli, [str(a) for a in args], input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def error_line(result) -> str:
    """The one error line of a failed run (log lines, such as a busy-machine warning, may precede it)."""
    assert result.exit_code == 1, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("phrase-scorer: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[-1]


def default_sigint() -> None:
    """``preexec_fn`` of a child a test interrupts with SIGINT. A test run started in the
    background by a script (``make test &``) has SIGINT ignored, and a child inherits that: it
    would then ignore Ctrl-C as every program started that way does, and the test would wait.
    SIGHUP likewise: a test run under ``nohup`` has it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def ignored_sigint() -> None:
    """``preexec_fn`` of a child started as a script's background job is: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_halted(point: str, args, ready: Path, timeout: float = 600.0, *,
                 sigint_ignored: bool = False) -> subprocess.Popen:
    """Start ``phrase-scorer ARGS`` under tests/pause_at.py and return once it has halted at ``point``
    (with SIGINT ignored from the start where ``sigint_ignored``, else with its default action).

    The run cannot move past the point, so a signal sent next arrives exactly there, however busy
    the machine is. Fails (with the run's stderr) if the run ends first; ``timeout`` only bounds a
    hang, it does not decide the outcome.
    """
    ready = Path(ready)
    ready.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, str(PAUSE_AT), point, str(ready), "--", *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ignored_sigint if sigint_ignored else default_sigint)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (status {proc.returncode}) before reaching {point}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"the run did not reach {point} within {timeout:.0f}s")
        time.sleep(0.02)
    return proc


def kill(proc: subprocess.Popen, sig=None) -> int:
    """Send ``sig`` (SIGKILL by default) and wait for the process; returns its status."""
    import signal

    proc.send_signal(signal.SIGKILL if sig is None else sig)
    return proc.wait(timeout=120)


def require_shared():
    if not SHARED_TABLE.exists():
        pytest.skip(f"needs the Multi30k Moses system in {SHARED_SYSTEM}")


def head_lines(path: Path, n: int) -> list:
    out = []
    with gzip.open(path, "rb") as f:
        for i, line in enumerate(f):
            if i == n:
                break
            out.append(line)
    return out


def in_fp64(loaded):
    """A copy of a loaded model computing in fp64. fp32 results move in their last bits with the
    batch shape (docs/precision.md), which can flip a near-tie between two candidates of a search;
    whether a search has such a near-tie depends on the model's weights, which differ between CPUs
    and library builds. A test that compares searches run in different batches uses this copy:
    its batch-shape noise is ~1e-15 of a value, so the fp32 log-probabilities a search computes
    from its logits differ only where a logit lies that close to an fp32 rounding boundary (about
    one logit in 1e8)."""
    import copy
    import dataclasses

    return dataclasses.replace(loaded, model=copy.deepcopy(loaded.model).double())


def assert_beams_batched_as_alone(loaded, phrases, tolerance: float):
    """Beam search of ``phrases`` in one batch finds, for each, the hypotheses and scores (within
    ``tolerance``) that a search of the phrase alone finds; returns (source ids, the batched
    results). Give ``loaded`` in fp64 (:func:`in_fp64`), where the batch shape cannot flip a near-tie."""
    from phrase_scorer.generation.sampling import beam_search, beam_search_batch

    sources = [loaded.source_vocab.encode(p.split()) for p in phrases]
    batched = beam_search_batch(loaded.model, sources, 4, max_length=6)
    alone = [beam_search(loaded.model, s, 4, max_length=6) for s in sources]
    for together, single in zip(batched, alone):
        assert [seq for seq, _ in together] == [seq for seq, _ in single]
        assert [score for _, score in together] == pytest.approx([score for _, score in single], abs=tolerance)
    return sources, batched


def assert_translates(hypotheses: list, sources: list, references: list):
    """``hypotheses`` translate ``sources``: one non-empty line per source, whose BLEU is above that
    of the untranslated sources and whose word (1-gram) precision is at least three times theirs,
    both scored alike here (sacrebleu on the tokenized, lowercased text, as multi-bleu.perl -lc).

    This is what a Moses system tuned inside a test can be held to: one tuning iteration with a
    tiny model trained in the test session may reorder words badly, and how badly depends on the
    model's weights, which differ between CPUs and library builds; a copied or untranslated
    output fails it. Returns the hypotheses' BLEU (a sacrebleu ``BLEUScore``)."""
    from sacrebleu.metrics import BLEU

    assert len(hypotheses) == len(sources) == len(references)
    assert all(h.strip() for h in hypotheses)
    bleu = BLEU(tokenize="none", lowercase=True)
    system, copied = bleu.corpus_score(hypotheses, [references]), bleu.corpus_score(sources, [references])
    assert system.score > copied.score and system.precisions[0] >= 3 * copied.precisions[0], (system, copied)
    return system


@contextlib.contextmanager
def rescore_stopped_after(monkeypatch, windows: int):
    """``rescore``'s writer stops with Ctrl-C (KeyboardInterrupt) when it would write window
    ``windows`` + 1, as a run interrupted there; yields the first line of each window it wrote.
    The writer is itself again after the block."""
    from phrase_scorer.runtime.job import OutputJob

    write, written = OutputJob.write, []

    def stop(self, lines, data):
        if len(written) == windows:
            raise KeyboardInterrupt
        written.append(self.lines_done + 1)
        write(self, lines, data)

    monkeypatch.setattr(OutputJob, "write", stop)
    try:
        yield written
    finally:
        monkeypatch.setattr(OutputJob, "write", write)


@pytest.fixture(scope="module")
def moses():
    """The Moses installation of MOSES_HOME (and the shared Multi30k system); skips without them."""
    home = os.environ.get("MOSES_HOME")
    if not home:
        pytest.skip("set MOSES_HOME to a Moses build (bin/moses, the mert tools, scripts/) to run Moses tests")
    require_shared()
    from phrase_scorer.moses.installation import MosesInstallation

    return MosesInstallation.find(home)


def train_tiny(table: Path, out: Path) -> Path:
    """A tiny model trained for a few hundred steps on the phrase table ``table``, into ``out``."""
    from phrase_scorer.config import TrainConfig
    from phrase_scorer.training.run import train

    train(table, out, TrainConfig(preset="tiny", max_steps=400, valid_every=200, valid_pairs=300, seed=3))
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny model trained for a few hundred steps on the bundled example table."""
    return train_tiny(EXAMPLE_TABLE, tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_reverse_model(tmp_path_factory) -> Path:
    """The tiny model's twin the other way round (French→English): trained as ``tiny_model`` on
    the bundled example table with its source and target swapped, what a reverse feature reads."""
    folder = tmp_path_factory.mktemp("models")
    swapped = folder / "phrase-table.swapped.gz"
    with gzip.open(EXAMPLE_TABLE, "rt", encoding="utf-8") as table, gzip.open(swapped, "wt", encoding="utf-8") as out:
        for line in table:
            fields = line.split(" ||| ")
            out.write(" ||| ".join([fields[1], fields[0], *fields[2:]]))
    return train_tiny(swapped, folder / "tiny-reverse")


@pytest.fixture(scope="session")
def loaded_tiny_reverse(tiny_reverse_model):
    from phrase_scorer.model_dir import load_model

    return load_model(tiny_reverse_model)


@pytest.fixture(scope="session")
def sentence_models(tmp_path_factory):
    """``sentence_models(arch)``: the directory of a tiny model of ``arch`` trained briefly on the
    500 Multi30k sentence pairs, trained on first use and shared by the session."""
    from phrase_scorer.config import TrainConfig
    from phrase_scorer.data.sentence_pairs import SentenceCorpus
    from phrase_scorer.training.run import train

    made = {}

    def model(arch: str) -> Path:
        if arch not in made:
            out = tmp_path_factory.mktemp("sentences") / arch
            train(SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR)), out,
                  TrainConfig(arch=arch, preset="tiny", max_length=12, max_steps=30, valid_every=30, valid_pairs=50,
                              seed=2))
            made[arch] = out
        return made[arch]

    return model


@pytest.fixture(scope="session")
def loaded_tiny(tiny_model):
    from phrase_scorer.model_dir import load_model

    return load_model(tiny_model)


@pytest.fixture(autouse=True)
def _quiet_progress(monkeypatch):
    from phrase_scorer.runtime import progress

    monkeypatch.setattr(progress, "show_bars", False)
    monkeypatch.setenv("PYTHONHASHSEED", os.environ.get("PYTHONHASHSEED", "0"))


def process_state(pid: int):
    """Process ``pid``'s state letter from /proc (``R``, ``S``, ``Z`` for one dead and not yet
    reaped, ...), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def child_processes(pid: int) -> dict:
    """The processes whose parent is ``pid`` (Linux /proc): {pid: command line}."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if parent == pid:
            children[int(entry)] = command
    return children


def kill_and_see_it_dead(pid: int, timeout: float = 120.0) -> None:
    """SIGKILL process ``pid`` and return once it is dead (a zombie, or gone); ``timeout`` only
    bounds a hang."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while process_state(pid) not in ("Z", "X", None):
        assert time.monotonic() < deadline, f"process {pid} did not die"
        time.sleep(0.02)
