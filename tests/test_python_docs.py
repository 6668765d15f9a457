"""The library as a Python caller uses it: docs/python.md's examples run exactly as written, and a
caller that never imports the command line gets the process settings the command line runs with."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LIBRARY_CALLER = ("import os, sys, phrase_scorer.rescoring.features; "
                  "assert 'phrase_scorer.cli' not in sys.modules and 'torch' not in sys.modules; "
                  "print(os.environ['OMP_WAIT_POLICY'], os.environ['THP_MEM_ALLOC_ENABLE'])")


def settings_seen(**given: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE")}
    return subprocess.run([sys.executable, "-c", LIBRARY_CALLER], env={**env, **given}, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_a_library_caller_gets_the_command_lines_process_settings_before_torch_loads():
    assert settings_seen() == "PASSIVE 1"


@pytest.mark.parametrize("given, seen", [
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE 1"),
    ({"THP_MEM_ALLOC_ENABLE": "0"}, "PASSIVE 0"),
])
def test_a_library_caller_keeps_the_process_settings_it_chose(given, seen):
    assert settings_seen(**given) == seen
