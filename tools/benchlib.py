"""Helpers shared by the benchmark and report scripts: their command line and work folder,
machine description, matmul rate, peak memory of a child process, and replacing one marked
section of a page of docs/."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"
DEFAULT_TABLE = ROOT.parent / "shared" / "data" / "moses-multi30k-en-fr" / "phrase-table.gz"


def bench_parser(description: str, worker_command: Optional[str] = None
                 ) -> Tuple[argparse.ArgumentParser, Optional[argparse.ArgumentParser]]:
    """The command line every benchmark shares (--table, --work-dir, --write), and the
    sub-command its measured child processes run as (``worker_command``, where it has one)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.commands = parser.add_subparsers(dest="command")  # for more sub-commands
    worker = parser.commands.add_parser(worker_command) if worker_command else None
    parser.add_argument("--table", default=str(DEFAULT_TABLE))
    parser.add_argument("--work-dir", default=None, help="keep models and generated tables here")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    return parser, worker


@contextlib.contextmanager
def work_dir(kept: Optional[str], prefix: str) -> Iterator[Path]:
    """``kept`` (created if needed and left in place), or a temporary folder removed afterwards."""
    if kept:
        path = Path(kept)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def report(name: str, markdown: str, write: bool) -> None:
    """Print a measured section, and with ``write`` put it into docs/benchmarks.md."""
    print(markdown, flush=True)
    if write:
        update_section(name, markdown)


def machine() -> Dict[str, str]:
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def best_rate(run: Callable[[], None], amount: float, seconds: float, sync: Callable[[], None] = lambda: None) -> float:
    """The best of repeated timings of ``run`` (which does ``amount`` units of work), in units/s,
    timing for about ``seconds``; ``sync`` waits for a device's queued work."""
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        sync()
        start = time.perf_counter()
        run()
        sync()
        best = max(best, amount / (time.perf_counter() - start))
        if time.perf_counter() > deadline:
            return best


def matmul_rate(device: str = "cpu", n: int = 2048, seconds: float = 1.0) -> float:
    """Measured fp32 matrix-product rate in FLOP/s (n x n by n x n, best of a few timings)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    for _ in range(3):
        a @ b

    def three_products() -> None:
        for _ in range(3):
            a @ b

    return best_rate(three_products, 3 * 2 * n**3, seconds, torch.cuda.synchronize if device != "cpu" else lambda: None)


def exp_rate(rows: int, columns: int, seconds: float = 0.5) -> float:
    """Measured rate of the scorer's in-place exp over a (rows, columns) fp32 block, in
    elements/s (best of a few timings): the softmax's one elementwise pass that is not a product."""
    import torch

    block = -20 * torch.rand(rows, columns)  # logits minus the row's reference value
    out = torch.empty_like(block)

    def ten_exps() -> None:
        for _ in range(10):
            torch.exp(block, out=out)

    return best_rate(ten_exps, 10 * rows * columns, seconds)


def run_measured(args: Sequence[str], env=None, cwd=None) -> Tuple[str, str, float, float]:
    """Run a command (in ``cwd``) and return (stdout, stderr, seconds, peak RSS in MB) using wait4."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    stdout_chunks: List[bytes] = []
    stderr_chunks: List[bytes] = []

    def drain(stream, sink):
        for block in iter(lambda: stream.read(65536), b""):
            sink.append(block)

    threads = [threading.Thread(target=drain, args=(proc.stdout, stdout_chunks)),
               threading.Thread(target=drain, args=(proc.stderr, stderr_chunks))]
    for t in threads:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for t in threads:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    out, err = b"".join(stdout_chunks).decode(), b"".join(stderr_chunks).decode()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{err[-3000:]}")
    return out, err, seconds, usage.ru_maxrss / 1024.0


def repeated_table(table: Path, out: Path, times: int = 10) -> Path:
    """``table`` written ``times`` times over into ``out`` (gzip), unless ``out`` exists."""
    import gzip
    import shutil

    if not out.exists():
        with gzip.open(out, "wb", compresslevel=1) as dst:
            for _ in range(times):
                with gzip.open(table, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
    return out


def write_slice(table: Path, lines: int, out: Path) -> None:
    """The first ``lines`` lines of ``table`` (gzip) into ``out`` (gzip)."""
    import gzip
    import itertools

    with gzip.open(table, "rb") as src, gzip.open(out, "wb", compresslevel=1) as dst:
        for line in itertools.islice(src, lines):
            dst.write(line)


def table_head(table: Path, lines: int, work: Path) -> Path:
    """``work/first-LINES.gz``, the first ``lines`` lines of ``table``, written unless it exists."""
    out = work / f"first-{lines}.gz"
    if not out.exists():
        write_slice(table, lines, out)
    return out


def same_lines(a: Path, b: Path) -> bool:
    """Whether two gzip files hold the same bytes once decompressed (read in 4 MiB blocks)."""
    import gzip

    with gzip.open(a, "rb") as fa, gzip.open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 22), fb.read(1 << 22)
            if x != y:
                return False
            if not x:
                return True


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def replace_marked(path: Path, begin: str, end: str, markdown: str, *, append: bool = False) -> None:
    """Replace the text between the marker lines ``begin`` and ``end`` of ``path`` with
    ``markdown``; where the markers are missing, append them with it (``append``) or stop."""
    block = f"{begin}\n{markdown.rstrip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    elif append:
        text = text.rstrip() + "\n\n" + block + "\n"
    else:
        raise SystemExit(f"{path}: no {begin} ... {end} block to replace")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def update_section(name: str, markdown: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the section between ``<!-- name:start -->`` and ``<!-- name:end -->``."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# Benchmarks\n", encoding="utf-8")
    replace_marked(path, f"<!-- {name}:start -->", f"<!-- {name}:end -->", markdown, append=True)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def phrase_scorer_command(*args: object) -> List[str]:
    """``phrase-scorer -q ARGS`` run by this Python (the package it imports: PYTHONPATH's, else the installed one)."""
    return [sys.executable, "-m", "phrase_scorer", "-q", *map(str, args)]


def python_command(script: Path, *args: object) -> List[str]:
    return [sys.executable, str(script), *map(str, args)]


def dump(obj) -> str:
    return json.dumps(obj)
