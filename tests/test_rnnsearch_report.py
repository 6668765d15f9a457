"""tools/rnnsearch_report.py end to end, on tiny models and fake Moses outputs (the references)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, VAL_EN, VAL_FR
from phrase_scorer.moses.evaluate import score

TOOL = ROOT / "tools" / "rnnsearch_report.py"
BEGIN, END = "<!-- rnnsearch_report: begin -->", "<!-- rnnsearch_report: end -->"


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def case(tmp_path_factory, sentence_models):
    """Dev: the first 40 lines of val100, test: the last 60; Moses 'outputs' are the references."""
    work = tmp_path_factory.mktemp("report")
    en, fr = VAL_EN.read_text(encoding="utf-8").splitlines(), VAL_FR.read_text(encoding="utf-8").splitlines()
    files = {
        "dev": (write_lines(work / "dev.en", en[:40]), write_lines(work / "dev.fr", fr[:40])),
        "test": (write_lines(work / "test.en", en[40:]), write_lines(work / "test.fr", fr[40:])),
    }
    doc = work / "docs" / "rnnsearch.md"
    doc.parent.mkdir()
    doc.write_text((ROOT / "docs" / "rnnsearch.md").read_text(encoding="utf-8"), encoding="utf-8")
    args = [sys.executable, str(TOOL), "--encdec", sentence_models("encdec"),
            "--rnnsearch", sentence_models("rnnsearch"),
            "--moses", files["dev"][1], files["test"][1], "--dev", *files["dev"], "--test", *files["test"],
            "--work", work / "translations", "--beam", 3, "--min-count", 10, "--images", doc.parent / "images",
            "--doc", doc, "--write"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    return {"work": work, "files": files, "doc": doc, "args": [str(a) for a in args], "env": env, "first": first}


def generated(doc) -> str:
    text = doc.read_text(encoding="utf-8")
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)]


def test_the_real_page_has_the_markers():
    text = (ROOT / "docs" / "rnnsearch.md").read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.index(BEGIN) < text.index(END)


def test_section_has_the_table_signatures_training_and_machine(case):
    section = generated(case["doc"])
    assert section.strip() == case["first"].stdout.strip()  # what it printed is what it wrote
    rows = re.findall(r"^\| (.+?) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", section, re.M)
    assert [r[0] for r in rows] == ["Moses (phrase-based)", "RNN Encoder–Decoder", "RNNsearch"]
    assert rows[0][1:] == ("100.00", "100.00", "100.00")  # the fake Moses outputs are the references
    # the models' rows are evaluate.score of their translations in the work folder
    dev_fr, test_fr = case["files"]["dev"][1], case["files"]["test"][1]
    for (name, bleu_dev, bleu_test, chrf_test), arch in zip(rows[1:], ("encdec", "rnnsearch")):
        hyps = {s: (case["work"] / "translations" / f"{arch}.{s}.hyp").read_text(encoding="utf-8").splitlines()
                for s in ("dev", "test")}
        assert len(hyps["dev"]) == 40 and len(hyps["test"]) == 60
        dev = score(hyps["dev"], dev_fr.read_text(encoding="utf-8").splitlines())
        test = score(hyps["test"], test_fr.read_text(encoding="utf-8").splitlines())
        assert (bleu_dev, bleu_test, chrf_test) == (f"{dev.bleu:.2f}", f"{test.bleu:.2f}", f"{test.chrf:.2f}")
    assert f"BLEU `{test.bleu_signature}`" in section and "tok:none" in test.bleu_signature
    assert f"chrF `{test.chrf_signature}`" in section
    assert "beam 3" in section and "(40 sentences)" in section and "(60 sentences)" in section
    commands = re.findall(r"^phrase-scorer train .*$", section, re.M)
    assert len(commands) == 2
    for command, arch in zip(commands, ("encdec", "rnnsearch")):
        assert (f"--arch {arch} --preset tiny" in command and "--max-steps 30" in command
                and "--max-length 12" in command)
        assert command.startswith("phrase-scorer train --corpus multi30k.train500.en.gz multi30k.train500.fr.gz")
    assert re.search(r"^\| RNNsearch \| rnnsearch \| tiny \| [\d,]+ \| 30 \|", section, re.M)
    assert "Translated and scored on: " in section and " cores" in section
    made_by = section.split("```")[1].strip()
    words = made_by.split()
    assert words[:2] == ["python", "tools/rnnsearch_report.py"]
    assert not [w for w in words if os.path.isabs(w)]  # paths as typed in the repository's root
    dev_ref = words[words.index("--dev") + 2]
    assert (ROOT / dev_ref).resolve() == case["files"]["dev"][1].resolve()


def test_images_exist_and_are_linked(case):
    section = generated(case["doc"])
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section)
    assert len(links) == 2 + 4  # BLEU by length (test, dev) and four heat maps
    for link in links:
        png = case["doc"].parent / link
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", link
    assert sum("rnnsearch-alignment-" in link for link in links) == 4
    peaks = re.findall(r"line (\d+): ([\d.]+) \(1/\|x\| = ([\d.]+)\)", section)
    assert len(peaks) == 4  # each drawn sentence: the mean of its rows' largest weights, beside uniform
    assert all(float(flat) - 0.01 <= float(peak) <= 1.0 for _, peak, flat in peaks)  # a row's largest >= its mean


def test_a_second_run_reuses_the_translations(case):
    hyps = sorted((case["work"] / "translations").glob("*.hyp"))
    assert len(hyps) == 4
    before = {p: p.stat().st_mtime_ns for p in hyps}
    again = subprocess.run(case["args"], capture_output=True, text=True, env=case["env"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("reusing ") == 4 and "translating" not in again.stderr
    assert {p: p.stat().st_mtime_ns for p in hyps} == before
    assert again.stdout == case["first"].stdout
