"""The flags a message names are the running verb's own, read from its click options."""

import ast
import functools
import re
from pathlib import Path

import click
from click.testing import CliRunner

from phrase_scorer.cli import cli
from phrase_scorer.cli.group import flag, shown
from phrase_scorer.errors import PhraseScorerError, Text, setting

PACKAGE = Path(__file__).resolve().parent.parent / "phrase_scorer"


def verbs() -> dict:
    """Every verb of the command line: its names (``("plot", "embeddings")``) -> its command."""
    found, todo = {}, [((), cli)]
    while todo:
        names, command = todo.pop()
        if isinstance(command, click.Group):
            todo += [((*names, name), sub) for name, sub in command.commands.items()]
        else:
            found[names] = command
    return found


def named_settings() -> set:
    """(name, verb) of every ``setting("name", ...)`` the package writes; verb None: the running one's."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setting"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                verb = next((k.value.value for k in node.keywords if k.arg == "verb"), None)
                found.add((node.args[0].value, verb))
    return found


@functools.lru_cache(maxsize=None)
def help_flags(names) -> set:
    """The flags the verb ``names``'s --help lists."""
    result = CliRunner().invoke(cli, [*names, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return set(re.findall(r"(?<![\w-])-{1,2}[A-Za-z][\w-]*", result.output))


def test_every_setting_a_verb_can_name_renders_as_a_flag_in_that_verbs_help():
    """Each setting the package names, rendered while each verb runs (given, a switch on or off,
    short), is either a flag that verb's --help lists or the library's spelling: never a flag the
    verb does not have (the setting of another verb: that verb's own)."""
    settings = named_settings()
    assert ("html_output", None) in settings and ("decoder_flags", "rerank") in settings
    wrong = []
    for names in verbs():
        for name, verb in sorted(settings, key=str):
            helped = help_flags(tuple(verb.split()) if verb else names)
            for value, short in ((None, False), (True, False), (False, False), ("V", False), ("V", True)):
                text = flag(setting(name, value, short=short, verb=verb), names)
                if text.startswith("-") and text.split()[0] not in helped:
                    wrong.append(f"{' '.join(names)}: {name}={value!r} -> {text}")
                elif not text.startswith("-"):
                    assert text == str(setting(name, value))
    assert not wrong, "\n".join(wrong)


def test_every_setting_the_library_names_is_an_option_of_a_verb():
    """A setting is spelt by its library name, which is its option's parameter name in the verbs
    that take it: a name no verb's option carries would reach the command line's user unrendered."""
    options = {p.name for command in verbs().values() for p in command.params if isinstance(p, click.Option)}
    unknown = sorted({name for name, _ in named_settings()} - options)
    assert not unknown, unknown


def test_one_setting_is_each_verbs_own_flag():
    """One setting renders as the flag of the verb that runs: -o in one verb, --work in another;
    a switch's off side is its own negative flag; another verb's setting is that verb's flag."""
    assert flag(setting("work_dir", "DIR"), ("build-reranker",)) == "--output DIR"
    assert flag(setting("work_dir", "DIR", short=True), ("build-reranker",)) == "-o DIR"
    assert flag(setting("work_dir", "DIR"), ("ems-decoder",)) == "--work DIR"
    assert flag(setting("model_kinds"), ("build-reranker",)) == "--models"
    assert flag(setting("models", "M", short=True), ("rescore",)) == "-m M"
    assert flag(setting("side_by_side", False), ("build-reranker",)) == "--one-at-a-time"
    assert flag(setting("html_output", "a.html"), ("plot", "embeddings")) == "--html a.html"
    assert flag(setting("decoder_flags", verb="rerank"), ("translate",)) == "--decoder-flags"
    assert flag(setting("workers", 2), ("train",)) == "workers=2"  # train has no --workers


def test_a_library_caller_reads_python_names():
    """Outside the command line the settings keep the library's spelling, whatever verb they name."""
    said = Text("pass ", setting("resume", True), " or ", setting("decoder_flags", "X", verb="rerank"))
    assert shown(said) == str(said) == "pass resume=True or decoder_flags=X"


def test_plot_embeddings_refuses_its_page_on_its_figure_with_its_own_flags(tmp_path, tiny_model):
    """The library's rule (one home) names the page's setting, which plot embeddings shows as its
    own flag --html while it still runs; nothing is written."""
    figure = tmp_path / "map.png"
    result = CliRunner().invoke(cli, ["plot", "embeddings", "-m", str(tiny_model), "-o", str(figure),
                                      "--html", str(figure)], catch_exceptions=False)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"phrase-scorer: error: --html {figure} is the figure -o {figure}: give it another name")
    assert not figure.exists()


def test_an_error_raised_outside_a_verb_keeps_python_names():
    error = PhraseScorerError(Text(setting("threads", 0), " is no count"))
    assert shown(error, ()) == "threads=0 is no count"
