"""The Python version the package claims (pyproject's requires-python, the README) is one its code runs on.

Every module is parsed with the grammar of the claimed minimum (``ast.parse(feature_version=...)``
rejects syntax added later, e.g. ``except*`` or ``type X = ...``), and the parse tree is searched
for what the grammar cannot see: library features added in a later version (dataclass
``slots``/``kw_only``, ``zip(strict=...)``, ``tomllib``, ...), ``match`` statements and ``X | Y``
between types outside annotations (``isinstance(x, int | str)``), which need 3.10 at run time.
"""

from __future__ import annotations

import ast
import re
import sys
from typing import Iterator, List, Tuple

import pytest

from conftest import ROOT

SOURCES = sorted([*ROOT.glob("phrase_scorer/**/*.py"), *ROOT.glob("tools/*.py"), *ROOT.glob("tests/*.py")])

# names whose use needs at least this version
NEEDS_MODULE = {"tomllib": (3, 11), "zoneinfo": (3, 9), "graphlib": (3, 9)}
NEEDS_TYPING = {"TypeAlias": (3, 10), "ParamSpec": (3, 10), "Concatenate": (3, 10), "TypeGuard": (3, 10),
                "Self": (3, 11), "LiteralString": (3, 11), "Never": (3, 11), "Required": (3, 11),
                "NotRequired": (3, 11), "override": (3, 12)}
NEEDS_KEYWORD = {("dataclass", "slots"): (3, 10), ("dataclass", "kw_only"): (3, 10), ("zip", "strict"): (3, 10)}
TYPE_NAMES = {"int", "str", "float", "bool", "bytes", "list", "dict", "tuple", "set", "None", "type"}


def claimed_minimum() -> Tuple[int, int]:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', text, re.M)
    assert match, "pyproject.toml must declare requires-python = \">=3.N\""
    return int(match.group(1)), int(match.group(2))


def annotation_nodes(tree: ast.AST) -> set:
    """ids of every node inside an annotation (strings there under ``from __future__ import annotations``)."""
    inside = set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation is not None:
            annotations.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        for annotation in annotations:
            inside.update(id(n) for n in ast.walk(annotation))
    return inside


def is_type_expression(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.Name):
        return node.id in TYPE_NAMES
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return is_type_expression(node.left) or is_type_expression(node.right)
    return False


def features_used(tree: ast.AST, postponed_annotations: bool) -> Iterator[Tuple[Tuple[int, int], int, str]]:
    """(version needed, line, what) for each newer feature found in ``tree``."""
    in_annotation = annotation_nodes(tree) if postponed_annotations else set()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if sys.version_info >= (3, 10) and isinstance(node, ast.Match):
            yield (3, 10), line, "a match statement"
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            for keyword in node.keywords:
                if (name, keyword.arg) in NEEDS_KEYWORD:
                    yield NEEDS_KEYWORD[name, keyword.arg], line, f"{name}({keyword.arg}=...)"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NEEDS_MODULE:
                    yield NEEDS_MODULE[alias.name], line, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            if node.module in NEEDS_MODULE:
                yield NEEDS_MODULE[node.module], line, f"from {node.module} import"
            if node.module == "typing":
                for alias in node.names:
                    if alias.name in NEEDS_TYPING:
                        yield NEEDS_TYPING[alias.name], line, f"typing.{alias.name}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in in_annotation:
            if is_type_expression(node):
                yield (3, 10), line, "X | Y between types, evaluated at run time"


def needed_by(source: str) -> List[Tuple[Tuple[int, int], int, str]]:
    tree = ast.parse(source)
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
                    any(a.name == "annotations" for a in n.names) for n in tree.body)
    return list(features_used(tree, postponed))


def test_every_module_parses_with_the_claimed_minimum_grammar():
    minimum = claimed_minimum()
    for path in SOURCES:
        try:
            ast.parse(path.read_text(), filename=str(path), feature_version=minimum)
        except SyntaxError as exc:
            pytest.fail(f"{path.relative_to(ROOT)} line {exc.lineno} needs a Python newer than the claimed "
                        f"{minimum[0]}.{minimum[1]}: {exc.msg}")


def test_no_module_uses_a_feature_newer_than_the_claim():
    minimum = claimed_minimum()
    too_new = [f"{path.relative_to(ROOT)} line {line}: {what} needs {v[0]}.{v[1]}"
               for path in SOURCES for v, line, what in needed_by(path.read_text()) if v > minimum]
    assert not too_new, f"requires-python claims {minimum[0]}.{minimum[1]}:\n" + "\n".join(too_new)


def test_the_claim_is_no_lower_than_the_code_needs():
    """The code uses 3.10 features (dataclass slots), so 3.9 must not be claimed."""
    used = {v for path in SOURCES for v, _, _ in needed_by(path.read_text())}
    assert claimed_minimum() >= max(used, default=(3, 8))


def test_the_readme_states_the_same_minimum():
    major, minor = claimed_minimum()
    readme = (ROOT / "README.md").read_text()
    stated = set(re.findall(r"Python (\d+\.\d+)\+", readme))
    assert stated == {f"{major}.{minor}"}


@pytest.mark.parametrize("source, version", [
    ("from dataclasses import dataclass\n@dataclass(slots=True)\nclass A:\n    x: int\n", (3, 10)),
    ("from dataclasses import dataclass, field\n@dataclass(frozen=True, kw_only=True)\nclass A:\n    x: int\n",
     (3, 10)),
    ("ok = isinstance(1, int | str)\n", (3, 10)),
    ("Alias = list | None\n", (3, 10)),
    ("for a, b in zip([1], [2], strict=True):\n    pass\n", (3, 10)),
    ("import tomllib\n", (3, 11)),
    ("from typing import Self\n", (3, 11)),
])
def test_the_detector_sees_newer_features(source, version):
    assert max(v for v, _, _ in needed_by(source)) == version


def test_the_detector_ignores_postponed_annotations_and_integer_or():
    assert needed_by("from __future__ import annotations\ndef f(x: int | None) -> str | None:\n    return None\n") == []
    assert needed_by("flags = 1 | 2\nmask = a | b\n") == []
    # without the __future__ import an annotation is evaluated: 3.10
    assert needed_by("def f(x: int | None):\n    pass\n")[0][0] == (3, 10)


def test_the_grammar_check_rejects_newer_syntax():
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 9))
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))
