"""Where a batch of the batch scorer spends its time: start-up, steady rate and a stage table.

    python tools/bench_stages.py --write                              # 5M lines, 500,000 hypotheses
    python tools/bench_stages.py --lines small=300000,paper=40000 --hypotheses 20000 --device cpu

Runs ``phrase-scorer annotate`` on ``--lines`` lines (the phrase table repeated, in a generated
gzip file) and ``phrase-scorer rescore`` on ``--hypotheses`` hypotheses (the n-best list repeated
with renumbered sentence ids, beside its source's first sentences repeated alike), with an
untrained model of each ``--presets`` preset (shortlists counted on the table), each command in a
process of its own that instruments the scorer from the outside (wrappers installed before the
command starts; nothing in the package changes, and the scores are the ones the command writes
without them). It reports:

* start-up: the interpreter and the imports, the model's loading, and the first batch (from the
  loaded model to the first batch's scores: reading, worker start and preparing the first window
  included), apart from the steady rate: pairs per second over the batches after the first (from
  the first batch's end to the last one's, everything the command does meanwhile included);
* a stage table, per batch (the mean of the batches after the first) on the main thread:
  - *host*: on the main thread: grouping (``IdRows.of`` and ``batch_plan.batches``), tries
    (``trie_of_rows``) and the rest of the batches' plans (``plan_batch``: index arrays, labels,
    chunk bounds) and of ``BatchScorer.score_plans`` / ``_run`` (putting scores back in order),
    less the torch operators dispatched there (planning done in a worker process costs the main
    thread nothing);
  - *waiting*: on the worker processes (annotate: a window's prepared ids) and the reader and
    writer threads (``Pipeline``'s queues), and the pipeline's own work on the main thread;
  - *dispatch*: the operators' fixed cost; on a CPU the time inside the model's code less the
    time inside its operators, plus the scorer's own operators times the fixed cost of one
    operator (measured in the same process on tensors of a few elements); on a GPU the host's
    time inside the model's operators (launches) plus that estimate for the scorer's own;
  - *device*: on a GPU the batch's time times the share of the time the GPU's kernels run
    (torch's profiler, while the representative window is scored again); on a CPU the
    arithmetic: the time inside the torch operators (below the dispatcher), of the model and of
    the scorer (gathers of parent states, scatters of scores), measured per operator in the
    counting pass below and scaled to the batch's pairs;
  - *copies*: a batch's plan to the device and its pieces (``BatchScorer._slots``: one copy, none
    on a CPU, and one split) and the scores back (``Tensor.cpu``, or on a GPU ``_collected``: both
    wait for the device);
  - *device share*: device / wall time of a batch;
* the torch operators dispatched per batch and per 1,000 pairs, counted with a
  ``TorchDispatchMode`` while one representative window (the run's second, else its first) is
  scored again after the command, by stage.

The device is ``--device`` (``cuda`` when a GPU is there, else ``cpu``); on a CPU the scorer runs
in the main process with ``--threads`` threads (1 by default: the batches one after another, as on
a GPU) and the workers prepare and finish the windows, the layout ``annotate`` has on a GPU.
Every child runs with ``OMP_WAIT_POLICY=PASSIVE`` and ``THP_MEM_ALLOC_ENABLE=1`` (the command line's
defaults) unless the environment sets them (``THP_MEM_ALLOC_ENABLE=0``: the C library's 4 kB pages);
the section names both and the kernel's transparent huge page mode.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

SECTION = "bench_stages"
SHARED = benchlib.ROOT.parent / "shared" / "data"
DEFAULT_NBEST = SHARED / "moses-multi30k-en-fr" / "val.nbest.gz"
DEFAULT_SOURCE = SHARED / "multi30k-en-fr" / "val.tok.en.gz"
TARGETS = {"annotate": 3.0, "rescore": 10.0}  # the CPU targets: main-thread host µs per pair (a GPU fed by one process)
GPU_TARGETS = {("annotate", "small"): 300_000, ("annotate", "paper"): 170_000, ("rescore", "small"): 50_000}  # pairs/s
# operators per 1,000 pairs before the batch plans (the scorer copied each index array on its own), measured by
# this tool on the same inputs: on the 2-core CPU, and on an H200 (65,536 tokens a batch, 600,000 lines and
# 120,000 hypotheses for small, 300,000 and 50,000 for paper)
BEFORE_PLANS_CPU = {("annotate", "small"): 1_620, ("annotate", "paper"): 1_652, ("rescore", "small"): 4_268,
                    ("rescore", "paper"): 5_255}
BEFORE_PLANS_GPU = {("annotate", "small"): 84, ("annotate", "paper"): 99, ("rescore", "small"): 755,
                    ("rescore", "paper"): 755}

# the stage table's columns (tests read them)
STAGE_COLUMNS = ["command", "preset", "pairs/batch", "batch ms", "host: grouping", "host: tries",
                 "host: index arrays, order", "host µs/pair", "waiting", "dispatch", "device", "copies",
                 "device share", "ops/batch", "ops/1k pairs"]
START_COLUMNS = ["command", "preset", "pairs", "interpreter + imports s", "model load s", "first batch s",
                 "batches", "steady pairs/s", "whole command s"]


# --- inputs ----------------------------------------------------------------------------------


def sizes(text: str, presets: Sequence[str]) -> Dict[str, int]:
    """``N`` (every preset) or ``PRESET=N,...`` -> {preset: N}."""
    if "=" not in text:
        return {p: int(text) for p in presets}
    given = {k: int(v) for k, v in (item.split("=", 1) for item in text.split(","))}
    missing = [p for p in presets if p not in given]
    if missing:
        raise SystemExit(f"no size for preset {missing[0]} in {text!r}")
    return given


def repeated_lines(table: Path, lines: int, out: Path) -> Path:
    """The table's lines, over and over, until ``lines`` lines (gzip ``out``; kept if it exists)."""
    if out.exists():
        return out
    left = lines
    with gzip.open(out, "wb", compresslevel=1) as dst:
        while left > 0:
            before = left
            with gzip.open(table, "rb") as src:
                for line in itertools.islice(src, left):
                    dst.write(line)
                    left -= 1
            if left == before:
                raise SystemExit(f"{table} is empty")
    return out


def repeated_nbest(nbest: Path, source: Path, hypotheses: int, work: Path) -> Tuple[Path, Path, int]:
    """The n-best list repeated (sentence ids renumbered: copy k's sentence s is k * S + s) until
    at least ``hypotheses`` lines, whole sentences, and the source's first S sentences repeated
    alike; the number of lines written."""
    out_nbest, out_source = work / f"nbest-{hypotheses}.gz", work / f"nbest-{hypotheses}.src.gz"
    by_sentence: Dict[int, List[str]] = {}
    with gzip.open(nbest, "rt", encoding="utf-8") if nbest.suffix == ".gz" else open(nbest, encoding="utf-8") as f:
        for line in f:
            sentence, rest = line.split(" ||| ", 1)
            by_sentence.setdefault(int(sentence), []).append(rest)
    count = max(by_sentence) + 1
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt", encoding="utf-8") as f:
        sources = list(itertools.islice(f, count))
    if len(sources) < count:
        raise SystemExit(f"{source} has {len(sources)} lines, the n-best list {count} sentences")
    written = 0
    with gzip.open(out_nbest, "wt", encoding="utf-8", compresslevel=1) as dst, \
            gzip.open(out_source, "wt", encoding="utf-8", compresslevel=1) as src_out:
        for copy in itertools.count():
            for s in range(count):
                if written >= hypotheses:
                    return out_nbest, out_source, written
                for rest in by_sentence.get(s, []):
                    dst.write(f"{copy * count + s} ||| {rest}")
                    written += 1
                src_out.write(sources[s])
    raise AssertionError("unreachable")


# --- the measured child process ----------------------------------------------------------------

HOST = ("ids", "grouping", "tries", "plan", "glue")  # main-thread host work inside the scorer
CATEGORIES = HOST + ("model", "to_device", "readback", "wait", "pipeline")


class Recorder:
    """Self time of nested regions on the main thread, by category, batch by batch.

    A region's time goes to its own category less the regions nested in it. A batch opens at
    each ``_run`` (the exact-overflow rescoring of the same batch excepted) and closes at
    the next one or at the end of ``score``; the work before a window's first batch (grouping,
    waiting for the window) goes into that batch."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.stack: List[list] = []  # [category, start, nested time]
        self.current = dict.fromkeys(CATEGORIES, 0.0)
        self.batches: List[dict] = []
        self.open_pairs: Optional[int] = None
        self.scores = 0  # score() calls
        self.sample: Optional[tuple] = None  # (scorer, sources, targets) of a representative window
        self.ops: Optional[Dict[str, int]] = None  # counting pass: operators by category
        self.loaded_at: Optional[float] = None
        self.load_seconds = 0.0
        self.main = threading.main_thread()

    def push(self, category: str) -> None:
        self.stack.append([category, time.perf_counter(), 0.0])

    def pop(self) -> None:
        category, start, nested = self.stack.pop()
        elapsed = time.perf_counter() - start
        self.current[category] += elapsed - nested
        if self.stack:
            self.stack[-1][2] += elapsed

    @contextlib.contextmanager
    def region(self, category: str):
        if threading.current_thread() is not self.main:
            yield
            return
        self.push(category)
        try:
            yield
        finally:
            self.pop()

    def open_batch(self, pairs: int) -> None:
        self.close_batch()
        self.open_pairs = pairs

    def close_batch(self) -> None:
        if self.open_pairs is None:
            return
        self.batches.append({"pairs": self.open_pairs, "end": time.perf_counter(), **self.current})
        self.current = dict.fromkeys(CATEGORIES, 0.0)
        self.open_pairs = None


def timed_method(recorder: Recorder, cls, name: str, category: str) -> None:
    original = getattr(cls, name)

    def wrapper(*args, **kwargs):
        with recorder.region(category):
            return original(*args, **kwargs)

    wrapper.__wrapped__ = original
    setattr(cls, name, wrapper)


def keeping(items, kept: list):
    for item in items:
        kept.append(item)
        yield item


def tensor_method_as_model(recorder: Recorder, cls, name: str) -> None:
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        if recorder.stack and recorder.stack[-1][0] == "glue":
            with recorder.region("model"):
                return original(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    setattr(cls, name, wrapper)


def timed_function(recorder: Recorder, module, name: str, category: str) -> None:
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        with recorder.region(category):
            return original(*args, **kwargs)

    setattr(module, name, wrapper)


def instrument(recorder: Recorder) -> None:
    """Install the wrappers (this process only)."""
    import torch

    from phrase_scorer import model_dir
    from phrase_scorer.data import padding
    from phrase_scorer.models import base
    from phrase_scorer.runtime import workers
    from phrase_scorer.scoring import batch_plan as bp
    from phrase_scorer.scoring import annotate as annotate_module
    from phrase_scorer.scoring import batch_scorer as bs

    load_model = model_dir.load_model

    def timed_load(*args, **kwargs):
        start = time.perf_counter()
        loaded = load_model(*args, **kwargs)
        recorder.load_seconds += time.perf_counter() - start
        recorder.loaded_at = time.perf_counter()
        return loaded

    model_dir.load_model = timed_load
    # annotate scores in the main process, the workers preparing and finishing (a GPU's layout)
    annotate_module.scoring_in_workers = lambda loaded, scorer, workers: None

    score_plans = bs.BatchScorer.score_plans

    def timed_score_plans(self, plans, pairs):
        recorder.scores += 1
        if recorder.scores <= 2:  # kept as they are planned (lazily, as in any other window), to be run again
            kept: list = []
            plans = keeping(plans, kept)
            recorder.sample = (self, kept, pairs)
        with recorder.region("glue"):
            out = score_plans(self, plans, pairs)
        recorder.close_batch()
        return out

    bs.BatchScorer.score_plans = timed_score_plans

    batches = bp.batches

    def timed_batches(*args, **kwargs):
        generator = batches(*args, **kwargs)
        while True:
            with recorder.region("grouping"):
                item = next(generator, None)
            if item is None:
                return
            yield item

    bp.batches = timed_batches

    run_plan = bs.BatchScorer._run

    def timed_run_plan(self, plan, exact_rows=None):
        if exact_rows is None:
            recorder.open_batch(plan.counts[0])
        with recorder.region("glue"):
            return run_plan(self, plan, exact_rows)

    bs.BatchScorer._run = timed_run_plan
    timed_function(recorder, bp, "trie_of_rows", "tries")
    timed_function(recorder, bp, "plan_batch", "plan")

    of = padding.IdRows.of.__func__

    def timed_of(cls, sequences):
        with recorder.region("ids"):
            return of(cls, sequences)

    padding.IdRows.of = classmethod(timed_of)
    timed_method(recorder, bs.BatchScorer, "_slots", "to_device")
    timed_method(recorder, bs.BatchScorer, "_collected", "readback")
    timed_method(recorder, base.Memory, "select", "model")
    timed_method(recorder, base.Memory, "first", "model")
    timed_method(recorder, bs.OutputSoftmax, "log_probs", "model")
    # the scorer's own device work inside _run (gathers of parent states, final states, additions of
    # scores) is the model's arithmetic too, not the host's
    for name in ("__getitem__", "__setitem__", "index_add_"):
        tensor_method_as_model(recorder, torch.Tensor, name)

    init = bs.BatchScorer.__init__

    def instrumented_init(self, model, *args, **kwargs):
        init(self, model, *args, **kwargs)
        for name in ("encode", "encode_from_final_states", "source_prefix_step", "encode_by_affixes", "start",
                     "step"):
            method = getattr(self.model, name, None)
            if method is not None and not hasattr(method, "__wrapped__"):
                def wrapper(*a, __method=method, **k):
                    with recorder.region("model"):
                        return __method(*a, **k)

                wrapper.__wrapped__ = method
                object.__setattr__(self.model, name, wrapper)

    bs.BatchScorer.__init__ = instrumented_init

    cpu = torch.Tensor.cpu

    def timed_cpu(self, *args, **kwargs):
        if not recorder.stack:
            return cpu(self, *args, **kwargs)
        with recorder.region("readback"):
            return cpu(self, *args, **kwargs)

    torch.Tensor.cpu = timed_cpu

    get, put, run = workers.Pipeline._get, workers.Pipeline._put, workers.Pipeline._run

    def timed_get(self, q):
        if q is not self.inbox:
            return get(self, q)
        with recorder.region("wait"):
            return get(self, q)

    def timed_put(self, q, item):
        if q is not self.outbox:
            return put(self, q, item)
        with recorder.region("wait"):
            return put(self, q, item)

    def timed_run(self, produce, work, consume):
        def timed_work(item):
            with recorder.region("pipeline"):
                return work(item)

        return run(self, produce, timed_work, consume)

    workers.Pipeline._get, workers.Pipeline._put, workers.Pipeline._run = timed_get, timed_put, timed_run

    result = workers.WorkerPool.result

    def timed_result(self, method, index):
        with recorder.region("wait"):
            return result(self, method, index)

    workers.WorkerPool.result = timed_result


def count_operators(recorder: Recorder) -> Dict[str, Any]:
    """Score the representative window again under a dispatch mode that counts every operator,
    by the category of the region it runs in; with the batches and pairs of that pass."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = dict.fromkeys(CATEGORIES, 0)
    counts["outside"] = 0
    seconds = dict.fromkeys(counts, 0.0)  # time inside the operators (below the dispatch), by stage
    names: Dict[str, int] = {}
    clock = time.perf_counter

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            category = recorder.stack[-1][0] if recorder.stack else "outside"
            counts[category] += 1
            name = str(func.overloadpacket)
            names[name] = names.get(name, 0) + 1
            start = clock()
            out = func(*args, **(kwargs or {}))
            seconds[category] += clock() - start
            return out

    scorer, plans, pairs = recorder.sample
    before = len(recorder.batches)
    with Counter():
        scorer.score_plans(plans, pairs)
    passed = recorder.batches[before:]
    del recorder.batches[before:]
    pairs = max(1, sum(b["pairs"] for b in passed))
    top = [(name, round(count * 1000 / pairs)) for name, count in sorted(names.items(), key=lambda kv: -kv[1])[:12]]
    return {"by_category": counts, "seconds": seconds, "batches": len(passed),
            "pairs": sum(b["pairs"] for b in passed), "top": top}


def kernel_time(recorder: Recorder) -> Dict[str, Any]:
    """On a GPU: the representative window scored again, once timed alone (wall seconds, the
    device synchronised at both ends) and once under torch's profiler, whose CUDA kernels' time
    over that wall time is the share of the time the card computes; with the kernels launched
    and the most frequent ones."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    scorer, plans, pairs = recorder.sample
    before = len(recorder.batches)
    scorer.score_plans(plans, pairs)  # warm
    torch.cuda.synchronize()
    start = time.perf_counter()
    scorer.score_plans(plans, pairs)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        scorer.score_plans(plans, pairs)
        torch.cuda.synchronize()
    passed = recorder.batches[before:]
    del recorder.batches[before:]
    pairs = sum(b["pairs"] for b in passed[len(passed) * 2 // 3:]) or 1  # the profiled pass's batches
    kernels: Dict[str, List[float]] = {}
    for event in prof.events():
        if str(event.device_type).endswith("CUDA"):
            entry = kernels.setdefault(event.name[:60], [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    total_us = sum(v[1] for v in kernels.values())
    launches = sum(v[0] for v in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:10]
    return {"wall_s": wall, "kernel_s": total_us / 1e6, "busy": total_us / 1e6 / wall, "launches": launches,
            "pairs": pairs, "pairs_per_s": pairs / wall, "batches": len(passed) // 3,
            "top": [(name, count, round(us)) for name, (count, us) in top]}


def operator_cost(seconds: float = 0.5) -> float:
    """The fixed cost of one torch operator on the host (s): the mean time of a mix of small
    operators (gather, add, product, cat, sum, index) on tensors of a few elements, in
    inference mode, as the scorer runs them."""
    import torch

    with torch.inference_mode():
        a, w, i = torch.randn(4, 8), torch.randn(8, 8), torch.tensor([0, 2])

        def six() -> None:
            for _ in range(200):
                a.index_select(0, i)
                a + a
                a @ w
                torch.cat([a, a])
                a.sum(1)
                a[i]

        best = benchlib.best_rate(six, 1200, seconds)  # operators/s
    return 1.0 / best


def child_main(argv: Sequence[str]) -> None:
    """``bench_stages.py measure OUT.json DEVICE -- phrase-scorer arguments``."""
    started_wall, started = time.time(), time.perf_counter()
    out, device, cli_args = argv[0], argv[1], list(argv[3:])
    from phrase_scorer.cli import cli  # its environment defaults first: torch reads them when it loads

    import torch  # noqa: F401

    imported = time.perf_counter()
    recorder = Recorder(cuda=device.startswith("cuda"))
    instrument(recorder)
    profile_to = os.environ.get("BENCH_STAGES_CPROFILE")  # a file: the command's Python profile (cProfile)
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(cli.main, args=cli_args, prog_name="phrase-scorer", standalone_mode=False)
        profiler.dump_stats(profile_to)
    else:
        cli.main(args=cli_args, prog_name="phrase-scorer", standalone_mode=False)
    finished = time.perf_counter()
    if recorder.cuda:
        torch.cuda.synchronize()
    operators = count_operators(recorder) if recorder.sample is not None else None
    kernels = kernel_time(recorder) if recorder.cuda and recorder.sample is not None else None
    result = {
        "started_wall": started_wall,
        "imports": imported - started,
        "load": recorder.load_seconds,
        "first_batch": (recorder.batches[0]["end"] - recorder.loaded_at) if recorder.batches else None,
        "command": finished - imported,
        "after_load": finished - (recorder.loaded_at or imported),
        "batches": recorder.batches,
        "operators": operators,
        "operator_cost": operator_cost(),
        "threads": torch.get_num_threads(),
        "huge_pages": os.environ.get("THP_MEM_ALLOC_ENABLE"),  # as the command line left it
        "cuda": recorder.cuda,
        "kernels": kernels,
    }
    Path(out).write_text(json.dumps(result))


# --- the parent: runs, figures, tables ---------------------------------------------------------


def run_child(work: Path, device: str, cli_args: Sequence[object], cprofile: Optional[Path] = None) -> dict:
    out = Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **({"BENCH_STAGES_CPROFILE": str(cprofile)} if cprofile else {}),
           "PYTHONPATH": os.pathsep.join([str(benchlib.ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    launched = time.time()
    _, _, seconds, peak = benchlib.run_measured(
        [sys.executable, str(Path(__file__).resolve()), "measure", str(out), device, "--", "-q",
         *map(str, cli_args)], env=env)
    result = json.loads(out.read_text())
    out.unlink()
    result["interpreter"] = result["started_wall"] - launched  # the interpreter's start, before the imports
    result["whole"] = seconds
    result["peak_rss_mb"] = peak
    return result


def figures(command: str, preset: str, result: dict) -> Dict[str, Any]:
    """Start-up, steady rate and the per-batch stage means (µs) of one run."""
    batches = result["batches"]
    steady = batches[1:] or batches
    pairs = sum(b["pairs"] for b in steady)
    rate = (sum(b["pairs"] for b in batches[1:]) / (batches[-1]["end"] - batches[0]["end"])
            if len(batches) > 1 else None)
    n = len(steady)

    def mean(key: str) -> float:
        return sum(b[key] for b in steady) / n * 1e6

    operators = result["operators"]
    cost = result["operator_cost"]  # s per operator
    by = operators["by_category"]
    per_pair = {k: v / max(1, operators["pairs"]) for k, v in by.items()}  # operators per pair, by stage
    pairs_per_batch = pairs / n
    ops_host = sum(per_pair[k] for k in HOST) * pairs_per_batch
    ops_total = sum(v for k, v in per_pair.items()) * pairs_per_batch
    host_ops_us = ops_host * cost * 1e6  # the torch operators among the host regions: their dispatch
    # time inside the operators (below the dispatch: the arithmetic on a CPU), per batch, by stage
    inside = {k: v / max(1, operators["pairs"]) * pairs_per_batch * 1e6 for k, v in operators["seconds"].items()}
    glue = mean("glue")
    glue_inside = min(sum(inside[k] for k in HOST),
                      max(0.0, glue - host_ops_us))
    grouping = mean("ids") + mean("grouping")
    tries = mean("tries")
    model = mean("model")
    wall = sum(mean(k) for k in CATEGORIES)
    if result["cuda"] and result.get("kernels"):
        rest = max(0.0, glue - host_ops_us)
        device = result["kernels"]["busy"] * wall  # the kernels' share of the profiled pass's time
        dispatch = model + host_ops_us  # the host's time inside the model's operators: launches
    else:  # the scorer's own operators (gathers, scatters of scores) count as device and dispatch too
        rest = max(0.0, glue - host_ops_us - glue_inside)
        model_inside = min(model, inside["model"])
        device = model_inside + glue_inside
        dispatch = model - model_inside + host_ops_us
    host = grouping + tries + mean("plan") + rest
    copies = mean("to_device") + mean("readback")
    waiting = mean("wait") + mean("pipeline")
    return {
        "command": command, "preset": preset, "pairs": sum(b["pairs"] for b in batches),
        "interpreter_imports": result["interpreter"] + result["imports"], "load": result["load"],
        "first_batch": result["first_batch"], "batches": len(batches), "rate": rate, "whole": result["whole"],
        "pairs_per_batch": pairs_per_batch, "wall_us": wall, "grouping_us": grouping, "tries_us": tries,
        "rest_us": rest, "host_us": host, "host_us_per_pair": host / pairs_per_batch, "waiting_us": waiting,
        "dispatch_us": dispatch, "device_us": device, "copies_us": copies, "device_share": device / wall,
        "ops_per_batch": ops_total, "ops_per_1k": ops_total / pairs_per_batch * 1000,
        "operator_cost_us": cost * 1e6, "top_operators": operators["top"], "threads": result["threads"],
        "huge_pages": result["huge_pages"],
        "kernels": result.get("kernels"),
        "peak_rss_mb": result["peak_rss_mb"], "ops_by_stage_per_1k": {k: v * 1000 for k, v in per_pair.items() if v},
    }


def ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def stage_row(f: Dict[str, Any]) -> List[object]:
    return [f["command"], f["preset"], f"{f['pairs_per_batch']:,.0f}", ms(f["wall_us"]), ms(f["grouping_us"]),
            ms(f["tries_us"]), ms(f["rest_us"]), f"**{f['host_us_per_pair']:.1f}**", ms(f["waiting_us"]),
            ms(f["dispatch_us"]), ms(f["device_us"]), ms(f["copies_us"]), f"{100 * f['device_share']:.0f}%",
            f"{f['ops_per_batch']:,.0f}", f"**{f['ops_per_1k']:,.0f}**"]


def start_row(f: Dict[str, Any]) -> List[object]:
    rate = f"**{f['rate']:,.0f}**" if f["rate"] else "n/a"
    return [f["command"], f["preset"], f"{f['pairs']:,}", f"{f['interpreter_imports']:.2f}", f"{f['load']:.2f}",
            f"{f['first_batch']:.2f}", f"{f['batches']:,}", rate, f"{f['whole']:.1f}"]


def huge_page_mode() -> str:
    """The kernel's transparent huge page setting (the bracketed word), or 'unknown'."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else text.strip()


def section(rows: List[Dict[str, Any]], args, where: str, load: str, shared: bool) -> str:
    info = benchlib.machine()
    unit = {"annotate": "lines", "rescore": "hypotheses"}
    sizes_text = "; ".join(f"{r['command']} `{r['preset']}`: {r['pairs']:,} {unit[r['command']]}" for r in rows)
    device = "GPU" if args.device.startswith("cuda") else "CPU"
    text = [
        f"## The batch scorer's stages{' on a GPU' if device == 'GPU' else ''} (`tools/bench_stages.py`)\n",
        f"Command: `python tools/bench_stages.py --device {args.device} --presets {args.presets} --lines "
        f"{args.lines} --hypotheses {args.hypotheses} --threads {args.threads} --write`; machine: {where}, torch "
        f"{info['torch']}, fp32, OMP_WAIT_POLICY=PASSIVE, "
        f"THP_MEM_ALLOC_ENABLE={rows[0]['huge_pages']} (the kernel's transparent huge pages: "
        f"{huge_page_mode()}), the scorer on {rows[0]['threads']} thread(s) in the main "
        f"process, annotate's default workers preparing and finishing the windows; {load}."
        + (" **The machine was shared with other work during this run: rerun for idle figures.**" if shared else "")
        + f" Models: untrained ones of each preset (shortlists counted on the table). Inputs: `{Path(args.table).name}`"
        f" repeated ({'; '.join(s for s in sizes_text.split('; ') if s.startswith('annotate'))}), and "
        f"`{Path(args.nbest).name}` repeated with renumbered sentence ids beside `{Path(args.source).name}`'s "
        f"sentences ({'; '.join(s for s in sizes_text.split('; ') if s.startswith('rescore'))}); each command "
        f"in a process of its own, instrumented from the outside (the package unchanged).\n",
        "**Start-up and steady rate.** *interpreter + imports*: from the process's start to the package and torch "
        "imported; *model load*: `load_model`; *first batch*: from the loaded model to the first batch's scores "
        "(reading, worker start and the first window's preparation included); *steady pairs/s*: pairs (lines or "
        "hypotheses) of the batches after the first over the time from the first batch's end to the last one's "
        "(everything the command does meanwhile included); *whole command*: the process, start to end.\n",
        benchlib.markdown_table(START_COLUMNS, [start_row(r) for r in rows]) + "\n",
        f"**Stages of a batch**, the main thread, ms per batch (mean of the batches after the first; {device}). "
        "*host: grouping*: `IdRows.of` and `batch_plan.batches` (sorting and cutting the window, padding a "
        "rescore window's ids); *host: tries*: `trie_of_rows` (sources and targets); *host: index arrays, order*: "
        "the rest of the batches' plans (`plan_batch`: per-depth node and label arrays, chunk bounds) and of "
        "`score_plans` and `_run` (putting the scores back in input order) less the torch operators run there "
        "(their dispatch and, on a CPU, their time); "
        "*host µs/pair*: the three host columns per pair "
        f"(the targets: {TARGETS['annotate']:.0f} µs for annotate, {TARGETS['rescore']:.0f} µs for "
        "rescore); *waiting*: on the workers (annotate's prepared windows), the reader and the writer, and the "
        "pipeline's own work; *dispatch*: "
        + ("the host's time inside the model's operators (launches) plus the host regions' operators times the "
           "fixed cost of one operator" if device == "GPU" else
           "the time inside the model's code (encoder, decoder steps, memory gathers, softmax) less the time "
           "inside its operators, plus the scorer's own operators (gathers of parent states, scatters of scores) "
           f"times the fixed cost of one operator ({rows[0]['operator_cost_us']:.1f} µs, measured in the same "
           "process on tensors of a few elements)")
        + "; *device*: "
        + ("the batch's time times the share of the time the GPU's kernels ran (torch's profiler, while the "
           "representative window is scored again; the card busy)" if device == "GPU" else
           "the arithmetic: the time inside the torch operators (below the dispatcher) of the model and of the "
           "scorer, measured per operator while the representative window is scored again and scaled to the "
           "batch's pairs")
        + "; *copies*: a batch's plan to the device and its pieces (`_slots`: one copy, none on a CPU, and one "
        "split) and the scores back (`Tensor.cpu`, on a GPU `_collected`); *device share*: device / the batch's "
        "wall time; *ops*: torch operators dispatched (counted with a "
        "`TorchDispatchMode` while the run's second window is scored again, scaled to the batch's pairs).\n",
        benchlib.markdown_table(STAGE_COLUMNS, [stage_row(r) for r in rows]) + "\n",
        "Operators per 1,000 pairs by stage (*model*: the model's steps, the softmax, and the scorer's gathers of "
        "states and additions of scores; *glue*: `score_plans` and "
        "`_run` themselves; *to_device*: `_slots`):\n",
        benchlib.markdown_table(
            ["command", "preset", "model", "glue", "to_device", "other", "total", "most dispatched, per 1,000 pairs"],
            [[r["command"], r["preset"], *(f"{r['ops_by_stage_per_1k'].get(k, 0):,.0f}" for k in
                                           ("model", "glue", "to_device")),
              f"{sum(v for k, v in r['ops_by_stage_per_1k'].items() if k not in ('model', 'glue', 'to_device')):,.0f}",
              f"**{r['ops_per_1k']:,.0f}**",
              ", ".join(f"{name.replace('aten.', '')} {count}" for name, count in r["top_operators"][:6])]
             for r in rows]) + "\n",
    ]
    verdicts = []
    for r in rows:
        key = (r["command"], r["preset"])
        before = (BEFORE_PLANS_GPU if device == "GPU" else BEFORE_PLANS_CPU).get(key)
        ops = (f"{r['ops_per_1k']:,.0f} operators per 1,000 pairs" + (
            f" against {before:,} before the batch plans ({before / r['ops_per_1k']:.1f}x fewer)" if before else ""))
        if device == "GPU":
            busy = r["kernels"]["busy"] if r.get("kernels") else None
            rate = GPU_TARGETS.get(key)
            verdicts.append(f"{r['command']} `{r['preset']}`: {r['rate']:,.0f} pairs/s steady"
                            + (f" against the target of {rate:,} ({'met' if r['rate'] >= rate else 'not met'})"
                               if rate else "")
                            + (f"; the card busy {100 * busy:.0f}% of the time against 50% "
                               f"({'met' if busy >= 0.5 else 'not met'})" if busy is not None else "")
                            + f"; {ops}")
        else:
            target = TARGETS[r["command"]]
            verdicts.append(f"{r['command']} `{r['preset']}`: {r['host_us_per_pair']:.1f} µs of main-thread host work "
                            f"per pair against the target of {target:.0f} µs "
                            f"({'met' if r['host_us_per_pair'] <= target else 'not met'}); {ops}")
    text.append(("Against the GPU targets:\n\n" if device == "GPU" else
                 "Against the CPU targets (the host work that lets one process feed a GPU):\n\n")
                + "\n".join(f"- {v}" for v in verdicts) + "\n")
    return "\n".join(text)


def machine_load() -> Tuple[float, str]:
    """The 1-minute load average, and the running (not stopped) processes of tests or of this
    package other than this benchmark's own."""
    load = os.getloadavg()[0]
    listing = subprocess.run(["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    busy = []
    for line in listing.splitlines():
        pid, stat, command = (line.split(None, 2) + ["", ""])[:3]
        if stat.startswith("T") or int(pid) == os.getpid() or "bench_stages" in command:
            continue  # stopped (paused) or this benchmark
        if any(name in command for name in ("pytest", "phrase-scorer", "phrase_scorer")):
            busy.append(command)
    return load, "\n".join(busy)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        child_main(sys.argv[2:])
        return
    parser, _ = benchlib.bench_parser(__doc__)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when a GPU is there)")
    parser.add_argument("--presets", default="small,paper")
    parser.add_argument("--commands", default="annotate,rescore")
    parser.add_argument("--lines", default="5000000", help="annotate: N, or PRESET=N,... (default 5,000,000)")
    parser.add_argument("--hypotheses", default="500000", help="rescore: N, or PRESET=N,... (default 500,000)")
    parser.add_argument("--nbest", default=str(DEFAULT_NBEST))
    parser.add_argument("--source", default=str(DEFAULT_SOURCE))
    parser.add_argument("--threads", type=int, default=1, help="the scorer's CPU threads")
    parser.add_argument("--batch-tokens", type=int, default=None, help="default: the device's own")
    parser.add_argument("--cprofile", default=None,
                        help="a folder: each command's Python profile (COMMAND-PRESET.prof)")
    args = parser.parse_args()
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    presets = args.presets.split(",")
    lines, hypotheses = sizes(args.lines, presets), sizes(args.hypotheses, presets)
    info = benchlib.machine()
    where = (f"{torch.cuda.get_device_name(0)}, {info['cores']} CPU cores" if args.device.startswith("cuda")
             else f"{info['cpu']}, {info['cores']} cores")
    load_before, busy_before = machine_load()
    rows = []
    with benchlib.work_dir(args.work_dir, "bench-stages-") as work:
        for preset in presets:
            model = work / f"{preset}-initial"
            if not (model / "config.json").exists():
                from bench_annotate import make_model_dir

                make_model_dir(model, preset, Path(args.table), work / "counts.json")
            common = ["-m", model, "-o", None, "--device", args.device, "--threads", args.threads,
                      *(["--batch-tokens", args.batch_tokens] if args.batch_tokens else [])]
            for command in args.commands.split(","):
                out = work / f"{command}-{preset}.out.gz"
                common[3] = out
                if command == "annotate":
                    table = repeated_lines(Path(args.table), lines[preset], work / f"table-{lines[preset]}.gz")
                    cli_args = ["annotate", table, *common, "--overwrite"]
                else:
                    nbest, source, _ = repeated_nbest(Path(args.nbest), Path(args.source), hypotheses[preset], work)
                    cli_args = ["rescore", nbest, "--source", source, *common, "--overwrite"]
                profile = Path(args.cprofile) / f"{command}-{preset}.prof" if args.cprofile else None
                result = run_child(work, args.device, cli_args, profile)
                for leftover in (out, Path(f"{out}.json")):
                    leftover.unlink(missing_ok=True)
                row = figures(command, preset, result)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "top_operators"}), flush=True)
    load_after, busy_after = machine_load()
    shared = load_before > 1.0 or bool(busy_before or busy_after)  # the load after includes the benchmark's workers
    load = (f"1-minute load average {load_before:.2f} before and {load_after:.2f} after (the benchmark's own "
            "included)")
    name = SECTION + ("_gpu" if args.device.startswith("cuda") else "")
    benchlib.report(name, section(rows, args, where, load, shared), args.write)


if __name__ == "__main__":
    main()
