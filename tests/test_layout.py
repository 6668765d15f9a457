"""The package's import rules: phrase_scorer.moses and phrase_scorer.io (the Moses drivers and the
file formats) never reach torch, not even through an import inside a function, so the Moses-side
commands start at once and run where torch cannot be imported."""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "phrase_scorer"
TORCH_FREE = ("moses", "io")


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


def test_moses_and_io_never_reach_torch_not_even_lazily():
    sources = {module_name(p): set(imported_modules(p, package_of(p))) for p in PACKAGE.rglob("*.py")}
    for package in TORCH_FREE:
        for name in [n for n in sources if n == f"phrase_scorer.{package}" or n.startswith(f"phrase_scorer.{package}.")]:
            torchy = {m for m in reachable(name, sources) if m == "torch" or m.startswith("torch.")}
            assert not torchy, f"{name} reaches torch through its imports"


def test_the_rule_finds_a_lazy_torch_import(tmp_path):
    """The walk sees an import inside a function, through a second module."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("def f():\n    from phrase_scorer import second\n", encoding="utf-8")
    second.write_text("def g():\n    import torch.nn\n", encoding="utf-8")
    sources = {"a.first": set(imported_modules(first, "a")), "phrase_scorer.second": set(imported_modules(second, "phrase_scorer"))}
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
    for name in ("phrase_scorer.scoring", "phrase_scorer.annotate_work", "phrase_scorer.rescore"):
        assert "phrase_scorer.data.padding" in reachable(name, sources) or name != "phrase_scorer.scoring"
        assert not reachable(name, sources) & training_data, f"{name} reaches the training data's code"
