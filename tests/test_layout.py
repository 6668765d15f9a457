"""The package's import rules (docs/layout.md): which package may import which, at module level or
inside a function; phrase_scorer.moses, phrase_scorer.io (the Moses drivers and the file formats)
and the reranker's tuning and use never reach torch, so the Moses-side commands start at once and
run where torch cannot be imported; the top of phrase_scorer/ holds only what every package shares."""
import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "phrase_scorer"
# The Moses drivers, the file formats, and tuning and applying a reranker: never torch.
TORCH_FREE = ("moses", "io", "scoring.batch_plan", "rescoring.weights", "rescoring.mert_files", "rescoring.optimisers",
              "rescoring.reranker", "rescoring.rerank")

#: What each part of the package may import (besides itself and the version in phrase_scorer/__init__.py).
#: "shared" is the top level's config, records, vocab and subwords; model_dir stands apart because it builds models.
LOWER = {"errors": set(), "io": {"errors"}}
LOWER["shared"] = {"errors", "io"}
LOWER["runtime"] = LOWER["shared"] | {"shared"}
LOWER["models"] = {"errors", "shared"}
LOWER["model_dir"] = LOWER["models"] | {"io", "models"}
LOWER["data"] = LOWER["runtime"] | {"runtime"}
LOWER["moses"] = LOWER["runtime"] | {"runtime"}
LOWER["scoring"] = LOWER["data"] | LOWER["model_dir"] | {"data", "model_dir"}
LOWER["generation"] = LOWER["scoring"] | LOWER["moses"] | {"scoring", "moses"}
LOWER["rescoring"] = LOWER["scoring"] | LOWER["moses"] | {"scoring", "moses"}
LOWER["training"] = LOWER["generation"] | {"generation"}
LOWER["analysis"] = LOWER["generation"] | {"generation"}
LOWER["experiments"] = LOWER["training"] | LOWER["rescoring"] | {"training", "rescoring"}
LOWER["cli"] = LOWER["experiments"] | LOWER["analysis"] | {"experiments", "analysis", "training"}
LOWER["__main__"] = {"cli"}
TOP_LEVEL = {"__init__", "__main__", "errors", "config", "records", "vocab", "subwords", "model_dir"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, package: str):
    """Every module an import statement of ``path`` names, at module level or inside a function
    (``package``: the one relative imports start from)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # `from package import module`


def reachable(start: str, sources: dict) -> set:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [m for m in sources.get(name, ()) if m not in seen]
    return seen


def package_of(path: Path) -> str:
    return module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]


def part_of(module: str) -> str:
    """The part of the package (a key of LOWER) that holds ``module``."""
    parts = module.split(".")[1:]
    if not parts:
        return "phrase_scorer"
    if len(parts) == 1 and not (PACKAGE / parts[0]).is_dir():
        shared = {"config", "records", "vocab", "subwords"}
        return "shared" if parts[0] in shared else parts[0]
    return parts[0]


def all_imports():
    return {module_name(p): set(imported_modules(p, package_of(p))) for p in PACKAGE.rglob("*.py")}


def test_each_package_imports_only_the_packages_below_it():
    sources = all_imports()
    wrong = []
    for name, imported in sources.items():
        here = part_of(name)
        for target in sorted(m for m in imported if m in sources and m != "phrase_scorer"):
            there = part_of(target)
            if there != here and there not in LOWER[here]:
                wrong.append(f"{name} imports {target} ({here} may import {sorted(LOWER[here])})")
    assert not wrong, "\n".join(wrong)


def test_the_top_level_holds_only_what_every_package_shares():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules <= TOP_LEVEL, f"modules at the top of phrase_scorer/: {sorted(modules - TOP_LEVEL)}"
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LOWER) - {
        "errors", "shared", "model_dir", "__main__"}


def test_importing_the_package_installs_no_import_hook():
    """The package changes nothing of Python's import machinery: a module is where docs/layout.md
    says, and nowhere else."""
    done = subprocess.run([sys.executable, "-c", "import sys; before = list(sys.meta_path); import phrase_scorer; "
                           "assert sys.meta_path == before; import phrase_scorer.rescore"],
                          capture_output=True, text=True, cwd=PACKAGE.parent)
    assert "No module named 'phrase_scorer.rescore'" in done.stderr, done.stderr


def test_moses_and_io_never_reach_torch_not_even_lazily():
    sources = all_imports()
    for package in TORCH_FREE:
        for name in [n for n in sources
                     if n == f"phrase_scorer.{package}" or n.startswith(f"phrase_scorer.{package}.")]:
            torchy = {m for m in reachable(name, sources) if m == "torch" or m.startswith("torch.")}
            assert not torchy, f"{name} reaches torch through its imports"


def test_the_rule_finds_a_lazy_torch_import(tmp_path):
    """The walk sees an import inside a function, through a second module."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("def f():\n    from phrase_scorer import second\n", encoding="utf-8")
    second.write_text("def g():\n    import torch.nn\n", encoding="utf-8")
    sources = {"a.first": set(imported_modules(first, "a")),
               "phrase_scorer.second": set(imported_modules(second, "phrase_scorer"))}
    assert "torch.nn" in reachable("a.first", sources)


def test_moses_and_io_import_with_torch_unimportable():
    modules = sorted(module_name(p) for package in TORCH_FREE for p in (PACKAGE / package).rglob("*.py"))
    code = ("import importlib, sys\n"
            "sys.modules['torch'] = None  # any import of torch now fails\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(len([m for m in sys.modules if m.startswith('phrase_scorer.')]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= len(modules)


def test_inference_reaches_no_training_data_code():
    """The scorer pads with data.padding and reaches none of the training data's modules."""
    sources = {module_name(p): set(imported_modules(p, package_of(p))) for p in PACKAGE.rglob("*.py")}
    training_data = {f"phrase_scorer.data.{m}" for m in ("cache", "batches", "phrase_pairs", "sentence_pairs")}
    for name in ("phrase_scorer.scoring.batch_scorer", "phrase_scorer.scoring.annotate_work",
                 "phrase_scorer.rescoring.rescore"):
        assert "phrase_scorer.data.padding" in reachable(name, sources) or name != "phrase_scorer.scoring.batch_scorer"
        assert not reachable(name, sources) & training_data, f"{name} reaches the training data's code"


def test_every_import_of_the_package_names_a_module_that_exists():
    """An import inside a function runs only when the function does: one that names a module no
    longer there (moved, renamed) would fail late, in front of a user."""
    sources = all_imports()
    missing = []
    for name, imported in sources.items():
        for module in imported:
            if module.startswith("phrase_scorer.") and module not in sources:
                parent = module.rpartition(".")[0]  # `from phrase_scorer.x import name`: x must exist
                if parent not in sources:
                    missing.append(f"{name} imports {module}")
    assert not missing, "\n".join(missing)


def test_no_module_imports_itself_through_others_not_even_inside_a_function():
    imports = all_imports()
    sources = {name: {m for m in imported if m in imports} for name, imported in imports.items()}
    for start in sources:
        for first in sources[start] - {start}:
            assert start not in reachable(first, sources) - {first} or first == start, (
                f"{start} imports {first}, which leads back to {start}")


#: Arguments of other programs (Moses', Python's) that are spelled like one of our flags, and the
#: one recorded command name a signature file holds (changing it would change the records on disk).
FOREIGN_FLAGS = {
    "moses/tune.py": {"--working-dir", "--mertdir", "--decoder-flags", "--nbest", "--return-best-dev", "-r"},
    "rescoring/optimisers.py": {"--threads", "-o", "-n", "-r"},  # mert, kbmira, extractor
    "config.py": {"-v"},  # the decoder's default flags
    "runtime/distributed.py": {"-m"},  # python -m phrase_scorer
    "runtime/resources.py": {"-v", "-n"},  # the shell's ulimit
    "io/os_errors.py": {"-v", "-n"},  # the shell's ulimit
    "rescoring/translation.py": {"--moses", "--reranker"},  # the signature's "command"
    "experiments/build_reranker.py": {"--moses", "--reranker", "-o"},  # the report's next command
    "experiments/ems_decoder.py": {"-v", "--working-dir"},  # what EMS passes Moses and mert-moses.pl
}
FLAG = re.compile(r"(?<![\w-])-{1,2}[A-Za-z][\w-]*")


def cli_flags() -> set:
    """Every flag of every command of the command line, as its options declare them."""
    import click

    from phrase_scorer.cli import cli

    flags, todo = set(), [cli]
    while todo:
        command = todo.pop()
        flags.update(o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-"))
        if isinstance(command, click.Group):
            todo += command.commands.values()
    return flags


def flags_in_string_literals(path: Path, flags: set) -> list:
    """(line, flag) of the command line's flags written in a string literal of ``path`` (docstrings aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [(node.lineno, flag) for flag in FLAG.findall(node.value) if flag in flags]
    return found


def test_the_library_names_settings_and_leaves_flag_spellings_to_the_command_line():
    """A library message names a setting (phrase_scorer.errors.setting), which the command line
    renders as its flag: no string outside cli/ spells one of the command line's flags."""
    flags = cli_flags()
    assert {"--overwrite", "--resume", "-m", "--valid-pairs", "--moses-home"} <= flags
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("cli/"):
            continue
        allowed = FOREIGN_FLAGS.get(relative, set())
        spelled += [f"{relative} line {line}: {flag}" for line, flag in flags_in_string_literals(path, flags)
                    if flag not in allowed]
    assert not spelled, "\n".join(spelled)


def test_the_flag_check_sees_a_flag_in_an_f_string_and_skips_docstrings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Give --overwrite."""\n\ndef f(n):\n    """--resume."""\n'
                      '    return f"pass --valid-pairs {n}", "-n-best-list", "--input-pt"\n', encoding="utf-8")
    flags = {"--overwrite", "--resume", "--valid-pairs", "-n"}
    assert flags_in_string_literals(module, flags) == [(5, "--valid-pairs")]


def settings_lost_in_f_strings(path: Path) -> list:
    """Lines of ``path`` where a setting (``setting(...)``) or a message naming settings
    (``Text(...)``) is formatted into an f-string, which keeps only its library spelling."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FormattedValue) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Name) and func.id in ("setting", "Text"):
                found.append(node.value.lineno)
    return found


def test_settings_travel_as_data_never_as_marked_text():
    """A message names a setting as a Setting inside a Text (phrase_scorer.errors), never as
    characters inside a string: no string of the package holds a control character used as a
    marker, and no setting is formatted into an f-string, where the command line could not find it."""
    marked, lost = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        assert "\x1e" not in path.read_text(encoding="utf-8"), relative
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                if (b"\x1e" if isinstance(node.value, bytes) else "\x1e") in node.value:
                    marked.append(f"{relative} line {node.lineno}")
        lost += [f"{relative} line {line}" for line in settings_lost_in_f_strings(path)]
    assert not marked, "\n".join(marked)
    assert not lost, "\n".join(lost)


def test_the_f_string_check_sees_a_setting_formatted_into_text(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('def f(n):\n    return (f"pass {setting(\'resume\', True)}", Text("pass ", setting("resume")),\n'
                      '            f"{n} and {Text(setting(\'lang\'))}")\n', encoding="utf-8")
    assert settings_lost_in_f_strings(module) == [2, 3]


def calls_of(path: Path, names: set) -> list:
    """Lines of ``path`` that call one of ``names`` (``f(...)`` or ``x.f(...)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in names:
                found.append(node.lineno)
    return found


def test_a_reranker_is_made_and_its_features_dropped_in_one_module():
    """rerank and both experiments make their rerankers through rescoring/reranker.py's
    tuned_reranker (one rule for the features dropped and the n-best size recorded): no other
    module builds a Reranker, drops features or reads a reranker file's schema itself."""
    made_elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative != "rescoring/reranker.py":
            made_elsewhere += [f"{relative} line {line}"
                               for line in calls_of(path, {"Reranker", "RerankerFile", "drop_unhelpful"})]
    assert not made_elsewhere, "\n".join(made_elsewhere)
    for caller in ("rescoring/rerank.py", "experiments/system_steps.py"):
        assert calls_of(PACKAGE / caller, {"tuned_reranker"}), caller


def test_the_call_check_sees_a_constructor_and_a_method(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import r\n\nx = Reranker(1)\ny = r.drop_unhelpful(2)\nz = Rerankers(3)\n", encoding="utf-8")
    assert calls_of(module, {"Reranker", "drop_unhelpful"}) == [3, 4]


def test_the_experiments_share_their_steps_through_one_module():
    """build-reranker and rescore-experiment run the steps they share (decoding, rescoring,
    tuning a row, writing its reranker) from experiments/system_steps.py, and neither imports the
    other's module."""
    sources = all_imports()
    steps = "phrase_scorer.experiments.system_steps"
    defined = {node.name for node in ast.parse((PACKAGE / "experiments" / "system_steps.py").read_text(
        encoding="utf-8")).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert {"EvalSet", "Row", "RowRun", "decoded_nbest", "rescored_nbest", "tuned_row_run",
            "write_rerankers"} <= defined
    for verb, other in (("build_reranker", "rescore_experiment"), ("rescore_experiment", "build_reranker")):
        imported = sources[f"phrase_scorer.experiments.{verb}"]
        assert steps in imported, verb
        assert not any(m == f"phrase_scorer.experiments.{other}" or m.startswith(f"phrase_scorer.experiments.{other}.")
                       for m in imported), f"{verb} imports {other}"


def test_no_two_modules_share_a_name():
    """A module's name says what it holds: outside cli/ (whose modules are named for the package
    whose verbs they parse), no two modules share a name, and no module is named like a package."""
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    seen: dict = {}
    clashes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" or relative.startswith("cli/"):
            continue
        if path.stem in packages:
            clashes.append(f"{relative} is named like the package {path.stem}/")
        if path.stem in seen:
            clashes.append(f"{relative} and {seen[path.stem]}")
        seen.setdefault(path.stem, relative)
    assert not clashes, "\n".join(clashes)


def test_each_experiment_is_found_by_its_verb():
    """A reader who knows an experiment's verb finds its module without docs/layout.md:
    experiments/<verb>.py, dashes written as underscores."""
    from phrase_scorer.cli import cli

    verbs = [name for name, command in cli.commands.items()
             if command.callback is not None and command.callback.__module__ == "phrase_scorer.cli.experiments"]
    assert {"experiment", "rescore-experiment", "build-reranker", "ems-config", "ems-decoder"} <= set(verbs)
    missing = [verb for verb in verbs if not (PACKAGE / "experiments" / f"{verb.replace('-', '_')}.py").is_file()]
    assert not missing, f"no module experiments/<verb>.py for {', '.join(missing)}"


#: The verbs whose module is not named for them, and where each lives instead (docs/layout.md, "The verbs").
VERBS_ELSEWHERE = {
    "train": "training/run.py",  # the training package: run.py sets up the run, loop.py trains
    "sample": "generation/sampling.py",
    "plot": "analysis/plots.py",
    "apply-reranker": "rescoring/reranker.py",  # the reranker's file and its use on a list
    "translate-system": "rescoring/translation.py",
    "moses-ini": "moses/ini_patch.py",  # io/moses_ini.py reads and edits the file itself
}


def test_each_verb_is_found_by_its_name():
    """A reader who knows a verb finds its module without docs/layout.md: a module named for it
    (dashes written as underscores) outside cli/, or one of the few listed above."""
    from phrase_scorer.cli import cli

    modules = {path.stem for path in PACKAGE.rglob("*.py") if "cli" not in path.relative_to(PACKAGE).parts}
    lost = [verb for verb in cli.commands if verb.replace("-", "_") not in modules and verb not in VERBS_ELSEWHERE]
    assert not lost, f"no module named for the verbs {', '.join(lost)}"
    for verb, module in VERBS_ELSEWHERE.items():
        assert verb in cli.commands and (PACKAGE / module).is_file(), (verb, module)


#: The modules that start processes or signal them: the supervisor (the package's own children: tasks
#: side by side, a local training run's ranks, worker pools) and the drivers of external programs.
PROCESS_STARTERS = {"runtime/supervisor.py", "runtime/programs.py", "moses/streaming.py"}
STARTING = {"Popen", "Process", "fork", "forkpty", "get_context", "spawnv", "spawnl", "posix_spawn"}
SIGNALLING = {"send_signal", "terminate", "kill", "killpg"}


def processes_started_or_signalled(path: Path) -> list:
    """Lines of ``path`` that start a process or send one a signal (``os.kill(pid, 0)``, which only
    asks whether a process exists, is neither)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        probe = name == "kill" and len(node.args) == 2 and isinstance(node.args[1], ast.Constant) \
            and node.args[1].value == 0
        if (name in STARTING or name in SIGNALLING) and not probe:
            found.append(node.lineno)
    return found


def test_only_the_supervisor_starts_and_signals_the_packages_own_processes():
    """One supervisor of child processes (runtime/supervisor.py): no other module starts a process
    or sends one a signal, except the drivers of external programs."""
    elsewhere = [f"{path.relative_to(PACKAGE).as_posix()} line {line}" for path in sorted(PACKAGE.rglob("*.py"))
                 if path.relative_to(PACKAGE).as_posix() not in PROCESS_STARTERS
                 for line in processes_started_or_signalled(path)]
    assert not elsewhere, "\n".join(elsewhere)


def test_the_process_check_sees_a_start_and_a_signal_but_not_a_probe(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os, subprocess\nsubprocess.Popen(['x'])\nos.kill(1, 0)\nchild.send_signal(2)\n"
                      "ctx.Process(target=f)\nos.kill(pid, 9)\n", encoding="utf-8")
    assert processes_started_or_signalled(module) == [2, 4, 5, 6]


def test_the_signals_that_end_a_run_are_listed_once():
    """The signals that end a run have one home (runtime/supervisor.py), and a child's end is named
    without Python's private table of signal numbers."""
    names = re.compile(r"\bSIG(INT|TERM|HUP)\b|_value2member_map_")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "runtime/supervisor.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Tuple) and sum(bool(names.search(ast.unparse(e))) for e in node.elts) >= 2:
                found.append(f"{relative} line {node.lineno}")
            elif isinstance(node, ast.Attribute) and node.attr == "_value2member_map_":
                found.append(f"{relative} line {node.lineno}")
    assert not found, "\n".join(found)


def test_lint_type_checks_the_whole_package():
    """``make lint``, which ``make test`` runs first, type-checks the whole package with mypy, not
    a chosen few modules."""
    makefile = (PACKAGE.parent / "Makefile").read_text(encoding="utf-8")
    lint = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert lint is not None, "no lint target"
    mypy = [line.split() for line in lint.group(1).splitlines() if "/mypy " in line]
    assert len(mypy) == 1 and mypy[0][-1] == "phrase_scorer", mypy
    assert re.search(r"^test: .*\blint\b", makefile, re.M), "make test does not run the lint target"


#: The most parameters a function of the package takes (self and cls not counted; a verb's own
#: callback, one parameter per option, is its command line's). Those at the limit include
#: runtime/job.py OutputJob.__init__, experiments/experiment.py run_experiment and
#: rescoring/rerank.py rerank; a function with more passes an options object (config.py), or a
#: small frozen dataclass beside it for values that are not settings.
MOST_PARAMETERS = 8


def parameter_counts(path: Path) -> list:
    """(parameters, line, name) of each function in ``path`` but a verb's callback."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if any("command" in ast.unparse(d) for d in node.decorator_list):
            continue
        args = node.args
        names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
        found.append((len(names) - (int(names[:1] in (["self"], ["cls"]))), node.lineno, node.name))
    return found


def test_no_function_takes_a_long_list_of_parameters():
    """Settings travel as the options objects of config.py, not as parameter lists that spell
    their fields again."""
    long = [f"{path.relative_to(PACKAGE)} line {line}: {name} takes {count}"
            for path in sorted(PACKAGE.rglob("*.py")) for count, line, name in parameter_counts(path)
            if count > MOST_PARAMETERS]
    assert not long, "\n".join(long)


def test_the_parameter_check_counts_keywords_but_not_self_nor_a_verb(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class A:\n    def f(self, a, *, b=1):\n        pass\n"
                      "@cli.command()\ndef verb(a, b, c):\n    pass\n"
                      "def g(a, /, b, *, c):\n    pass\n", encoding="utf-8")
    assert sorted(parameter_counts(module)) == [(2, 2, "f"), (3, 7, "g")]
