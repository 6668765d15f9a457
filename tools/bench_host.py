#!/usr/bin/env python3
"""Benchmark annotate's host pipeline: gzip libraries, worker processes, a large table, and the
whole command with a trained model before and after.

* gzip     -- decompressing the table and compressing 20,000-line windows with each installed
              library (the standard library's zlib, ISA-L `isal`, `zlib-ng`, `rapidgzip`).
* host     -- `annotate` with the model replaced by a constant (the host pipeline alone: read,
              gunzip, parse, look up ids, format, gzip, write) on 0 (all in one process), 1, 2,
              4, ... worker processes; the reference is 0 workers, measured in the same run.
* large    -- the host pipeline on the table repeated --repeat times, and the time that rate
              gives for 100M lines.
* ceiling  -- `phrase-scorer annotate` of the whole table with an untrained `tiny` model (the
              model's arithmetic almost nothing: what is left is the pipeline's own work), with the
              default workers and with --workers 0, against `zcat | gzip -1` of the same table
              timed just before each run (best of --repeats); with --reference-src DIR the same runs with that
              version's code, and where the scorer's time goes (cProfile of the scorer alone on
              the first --profile-lines lines) for both.
* busy     -- `phrase-scorer annotate` of the first 10,000 lines with an untrained `small` model,
              on the idle machine and beside as many busy processes (Python loops) as cores, with PyTorch's
              OpenMP threads spinning while they wait (OMP_WAIT_POLICY=ACTIVE) and sleeping
              (PASSIVE, the command line's default); the runs alternate, best of --repeats.
* model    -- `phrase-scorer annotate` end to end with --trained MODEL; with --reference-src DIR
              (a checkout of an earlier version) the same command with that version's code,
              measured in the same run, and whether both wrote the same lines.

Each measurement runs in its own process; results go to docs/benchmarks.md (--write) and stdout.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib  # noqa: E402

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


def gzip_libraries(table: Path) -> str:
    raw = table.read_bytes()
    text = gzip.decompress(raw)
    window = 20000
    lines = text.splitlines(keepends=True)[: 10 * window]
    windows = [b"".join(lines[i : i + window]) for i in range(0, len(lines), window)]
    plain = sum(map(len, windows))
    candidates = [("zlib (standard library)", gzip, (1, 6))]
    try:
        from isal import igzip

        candidates.append(("isal (ISA-L)", igzip, (1, 3)))
    except ImportError:
        pass
    try:
        from zlib_ng import gzip_ng

        candidates.append(("zlib-ng", gzip_ng, (1, 6)))
    except ImportError:
        pass
    rows = []
    for name, module, levels in candidates:
        compress = lambda data, level: module.compress(data, level, mtime=0)  # noqa: E731
        start = time.perf_counter()
        size = 0
        with module.open(table, "rb") as f:  # streamed in 1 MB reads, as annotate reads
            while block := f.read(1 << 20):
                size += len(block)
        assert size == len(text)
        read = len(text) / (time.perf_counter() - start) / 1e6
        for level in levels:
            start = time.perf_counter()
            packed = [compress(w, level) for w in windows]
            seconds = time.perf_counter() - start
            assert zlib.decompress(packed[0], 31) == windows[0]  # plain gzip
            ratio = sum(map(len, packed)) / plain
            rows.append([name, f"{read:,.0f}", level, f"{plain / seconds / 1e6:,.0f}", f"{ratio:.3f}"])
            print(rows[-1], flush=True)
    try:
        import rapidgzip

        start = time.perf_counter()
        with rapidgzip.open(str(table), parallelization=os.cpu_count()) as f:
            size = 0
            while block := f.read(1 << 20):
                size += len(block)
        rows.append([f"rapidgzip ({os.cpu_count()} threads)", f"{size / (time.perf_counter() - start) / 1e6:,.0f}",
                     "", "(reads only)", ""])
    except ImportError:
        pass
    return (
        f"Reading `{table.name}` ({len(raw) / 1e6:.0f} MB gzip, {len(text) / 1e6:.0f} MB of text) and compressing "
        f"its first {len(windows)} windows of {window:,} lines, each as one gzip member; MB/s of text.\n\n"
        + benchlib.markdown_table(["library", "decompress MB/s", "level", "compress MB/s", "compressed / text"], rows)
    )


def host_run(table: Path, model_dir: Path, workers: int, work: Path):
    out = work / "host.gz"
    stdout, _, seconds, peak = benchlib.run_measured(benchlib.python_command(
        HERE, "host-worker", "--table", table, "--model-dir", model_dir, "--workers", workers, "--out", out))
    result = json.loads(stdout.strip().splitlines()[-1])
    out.unlink()
    return result, seconds, peak


def host_worker(args) -> None:
    """One host-pipeline run (constant scores) in this process; prints its figures."""
    from phrase_scorer.config import RunOptions
    from phrase_scorer.scoring.annotate import annotate
    from phrase_scorer.model_dir import load_model

    loaded = load_model(args.model_dir)
    start = time.perf_counter()
    result = annotate(args.table, args.out, loaded, run=RunOptions(workers=args.workers), constant_log_prob=-1.0)
    import resource

    workers_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    print(json.dumps({"lines": result.lines, "seconds": time.perf_counter() - start, "peak_mb": benchlib.peak_rss_mb(),
                      "worker_peak_mb": workers_peak}))


def host(args, work: Path, model_dir: Path) -> str:
    table = Path(args.table)
    cores = os.cpu_count() or 1
    counts = sorted({0, 1, 2, 4, cores} | ({8, 16} if cores >= 8 else set()))
    rows, rates = [], {}
    for workers in counts:
        result, seconds, peak = host_run(table, model_dir, workers, work)
        rates[workers] = result["lines"] / result["seconds"]
        rows.append([workers, f"{result['lines']:,}", f"{result['seconds']:.1f}", f"**{rates[workers]:,.0f}**",
                     f"{rates[workers] / rates[0]:.2f}x", f"{result['peak_mb']:,.0f}",
                     f"{result['worker_peak_mb']:,.0f}" if workers else ""])
        print(rows[-1], flush=True)
    return (
        f"`annotate` with the model replaced by a constant (`annotate(..., constant_log_prob=-1)`, a benchmark hook) "
        f"on `{table.name}`: read, gunzip, parse and check, look up ids, format, gzip and write. Machine: {machine()}. "
        f"*vs 0* = rate / the rate with 0 workers (everything in one process), measured in the same run; peak RSS of "
        f"the main process (model loaded) and of the largest worker.\n\n"
        + benchlib.markdown_table(["workers", "lines", "seconds", "lines/s", "vs 0", "main peak RSS MB",
                                   "worker peak RSS MB"], rows)
    )


def large(args, work: Path, model_dir: Path) -> str:
    table = Path(args.table)
    big = benchlib.repeated_table(table, work / f"table-x{args.repeat}.gz", times=args.repeat)
    workers = args.large_workers or os.cpu_count()
    result, seconds, peak = host_run(big, model_dir, workers, work)
    rate = result["lines"] / result["seconds"]
    return (
        f"The host pipeline ({workers} workers, constant scores) on `{table.name}` repeated {args.repeat} times "
        f"({result['lines']:,} lines, {os.path.getsize(big) / 1e6:,.0f} MB gzip): {result['seconds']:.0f} s, "
        f"**{rate:,.0f} lines/s**, peak RSS {result['peak_mb']:,.0f} MB (main process), "
        f"{result['worker_peak_mb']:,.0f} MB (largest worker). At that rate 100M lines take "
        f"**{1e8 / rate / 60:.1f} minutes** of host work on this machine; the pipeline's rate grows with the workers "
        f"a machine has (table above).\n"
    )


def model(args, work: Path) -> str:
    if not args.trained:
        return ""
    table = Path(args.table)
    if args.model_lines:
        table = benchlib.table_head(table, args.model_lines, work)
    runs = []
    if args.reference_src:
        runs.append(("before (reference)", args.reference_src, []))
    runs.append(("after", str(ROOT), []))
    rows, outputs, rates = [], {}, {}
    for name, src, extra in runs:
        out = work / f"{name.split()[0]}.gz"
        env = code_env(src)
        _, _, seconds, peak = benchlib.run_measured(
            benchlib.phrase_scorer_command("annotate", table, "-m", args.trained, "-o", out, *extra), env=env)
        lines = json.loads(Path(str(out) + ".json").read_text())["lines"]
        rates[name] = lines / seconds
        outputs[name] = out
        rows.append([name, f"{lines:,}", f"{seconds:,.0f}", f"**{rates[name]:,.0f}**", f"{peak:,.0f}"])
        print(rows[-1], flush=True)
    text = ""
    if len(runs) == 2:
        same = benchlib.same_lines(*outputs.values())
        speedup = rates["after"] / rates["before (reference)"]
        text = (f"\nSpeed-up: **{speedup:.2f}x**, measured in the same run. The two outputs hold "
                f"{'the same lines, byte for byte once decompressed' if same else 'DIFFERENT lines'} "
                f"(the gzip bytes differ: the earlier version compressed with zlib).\n")
    config = json.loads((Path(args.trained) / "config.json").read_text())
    scored = ("the first " + format(args.model_lines, ",") + " lines of " + Path(args.table).name if args.model_lines
              else "the whole table")
    return (
        f"`phrase-scorer annotate {table.name} -m MODEL -o OUT.gz` (default options; "
        f"{scored}), MODEL a `{config['preset']}` "
        f"model trained on that table, fp32 on CPU; machine: {machine()}. *before*: the same command with the "
        f"code of an earlier checkout (`--reference-src`).\n\n"
        + benchlib.markdown_table(["code", "lines", "seconds", "lines/s", "peak RSS MB"], rows) + "\n" + text
    )


def code_env(src: str) -> dict:
    """The environment that makes ``python -m phrase_scorer`` (and the profile worker) import the
    package from ``src``: PYTHONPATH first, and not the working directory (PYTHONSAFEPATH)."""
    return dict(os.environ, PYTHONPATH=src, PYTHONSAFEPATH="1")


def zcat_gzip_seconds(table: Path) -> float:
    """Wall time of ``zcat TABLE | gzip -1 > /dev/null``: reading and writing the table and nothing else."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        zcat = subprocess.Popen(["zcat", str(table)], stdout=subprocess.PIPE)
        gzip_run = subprocess.run(["gzip", "-1"], stdin=zcat.stdout, stdout=sink, check=True)
        zcat.stdout.close()
        if zcat.wait() or gzip_run.returncode:
            raise RuntimeError("zcat | gzip -1 failed")
    return time.perf_counter() - start


def cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


SCORER_STAGES = {  # the scorer's functions (both versions' names) whose cumulative time makes a stage
    "sort and batch by source": ("_batches", "batches"),
    "build the prefix tries": ("build_trie", "trie_of_rows"),
    "softmax at the labels": ("_edge_log_probs", "_add_edge_log_probs"),
}


def scorer_profile(args) -> None:
    """(the profile-worker command) cProfile of BatchScorer.score on the first --lines lines, by
    stage, as JSON seconds; the package is PYTHONPATH's, so that a reference checkout runs its own."""
    import cProfile
    import pstats

    sys.path[:0] = os.environ.get("PYTHONPATH", "").split(os.pathsep)  # before this checkout's root
    import torch

    from phrase_scorer.scoring.annotate_work import WindowWork
    from phrase_scorer.config import AnnotateOptions, ScoringOptions
    from phrase_scorer.io.table_windows import RawWindows
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    torch.set_num_threads(1)
    loaded = load_model(args.model_dir)
    work = WindowWork(args.table, loaded.source_vocab, loaded.target_vocab, AnnotateOptions(), False)
    prepared = [work.prepare(w.index, w, None) for w in RawWindows(args.table, 20000, 0, args.lines)]
    scorer = BatchScorer(loaded.model, ScoringOptions())
    scorer.score(prepared[0].source_ids, prepared[0].target_ids)  # warm-up
    profile = cProfile.Profile()
    profile.enable()
    for p in prepared:
        scorer.score(p.source_ids, p.target_ids)
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, primitive calls, tottime, cumtime, callers)
    scoring = [(key, value) for key, value in stats.items() if key[0].endswith("scoring.py")]
    cumulative = lambda names: sum(v[3] for k, v in scoring if k[2] in names)  # noqa: E731
    stages = {stage: cumulative(names) for stage, names in SCORER_STAGES.items()}
    stages["whole scorer"] = cumulative(("score",))
    print(json.dumps({"lines": sum(len(p.source_ids) for p in prepared), "seconds": stages}))


def ceiling(args, work: Path, model_dir: Path) -> str:
    table = Path(args.table)
    runs = ([("before (reference)", args.reference_src)] if args.reference_src else []) + [("after", str(ROOT))]
    rows, outputs, ratios = [], {}, {}
    variants = [(name, src, workers, None) for name, src in runs for workers in (None, 0)]
    variants += [("after", str(ROOT), workers, 2) for workers in (None, 0)]  # the thread rule's alternative
    for name, src, workers, threads in variants:
        env = code_env(src)
        out = work / f"ceiling-{name.split()[0]}-{workers}-{threads}.gz"
        measured = []
        for _ in range(args.repeats):  # the best ratio of a few runs, each against its own zcat | gzip -1
            reference = zcat_gzip_seconds(table)
            cpu_before = cpu_seconds_of_children()
            _, _, seconds, peak = benchlib.run_measured(benchlib.phrase_scorer_command(
                "annotate", table, "-m", model_dir, "-o", out, "--overwrite",
                *(["--workers", workers] if workers is not None else []),
                *(["--threads", threads] if threads is not None else [])), env=env)
            measured.append((seconds / reference, reference, seconds, cpu_seconds_of_children() - cpu_before, peak))
        _, reference, seconds, cpu, peak = min(measured)
        signature = json.loads(Path(str(out) + ".json").read_text())
        lines = signature["lines"]
        outputs[(name, workers, threads)] = out
        ratios[(name, workers, threads)] = seconds / reference
        rows.append([name + (f", --threads {threads}" if threads else ""), "default" if workers is None else workers,
                     signature["scoring"].get("threads", ""),
                     f"{lines:,}", f"{reference:.2f}", f"{seconds:.1f}", f"**{seconds / reference:.1f}x**",
                     f"{lines / seconds:,.0f}", f"{cpu:.1f}", f"{peak:,.0f}"])
        print(rows[-1], flush=True)
    files = list(outputs.values())
    same = all(benchlib.same_lines(files[0], other) for other in files[1:])
    identical_bytes = all(other.read_bytes() == files[0].read_bytes() for other in files[1:])
    profile_rows = []
    profiles = {}
    for name, src in runs:
        stdout, _, _, _ = benchlib.run_measured(benchlib.python_command(
            HERE, "profile-worker", "--table", table, "--model-dir", model_dir, "--lines", args.profile_lines),
            env=code_env(src))
        profiles[name] = json.loads(stdout.strip().splitlines()[-1])
    for stage in [*SCORER_STAGES, "whole scorer"]:
        cells = [f"{1e6 * p['seconds'][stage] / p['lines']:.1f}" for p in profiles.values()]
        profile_rows.append([stage, *cells])
    whole = {name: p["seconds"]["whole scorer"] / p["lines"] for name, p in profiles.items()}
    rest = [f"{1e6 * (p['seconds']['whole scorer'] - sum(p['seconds'][s] for s in SCORER_STAGES)) / p['lines']:.1f}"
            for p in profiles.values()]
    profile_rows.insert(len(SCORER_STAGES), ["the model's steps, ids to tensors, the rest", *rest])
    after = ratios[("after", None, None)]
    return (
        f"`phrase-scorer annotate {table.name} -m TINY -o OUT.gz` ({lines:,} lines; TINY an untrained `tiny` "
        f"model, about 30,000 parameters, so the model's arithmetic is almost nothing) against `zcat {table.name} | "
        f"gzip -1 > /dev/null` timed just before each run, the best ratio of {args.repeats} runs; "
        f"machine: {machine()}. *threads*: the scorer's threads (of each worker where the workers score); *CPU s*: "
        f"user + system time of the command and its workers. "
        + ("*before*: the same commands with the code of an earlier checkout (`--reference-src`). "
           if len(runs) == 2 else "")
        + f"All {len(files)} outputs are "
        f"{'byte-identical' if identical_bytes else ('the same lines' if same else 'DIFFERENT')}.\n\n"
        + benchlib.markdown_table(["code", "workers", "threads", "lines", "zcat, gzip -1 s", "annotate s", "ratio",
                                   "lines/s", "CPU s", "peak RSS MB"], rows)
        + f"\n\nWith the default workers `annotate` takes **{after:.1f} times** `zcat | gzip -1` of the same table.\n\n"
        f"Where the scorer's time goes, in µs per line (cProfile of `BatchScorer.score` alone, one thread, on the "
        f"first {args.profile_lines:,} lines, each stage's cumulative time; `python tools/bench_host.py profile-worker "
        f"--table T --model-dir TINY --lines N` prints it for one version):\n\n"
        + benchlib.markdown_table(["stage", *[name for name, _ in runs]], profile_rows)
        + (f"\n\nThe scorer alone: {1 / whole[runs[0][0]]:,.0f} lines/s before, {1 / whole['after']:,.0f} after "
           f"(profiled, so slower than unprofiled).\n" if len(runs) == 2 else "")
    )


def busy(args, work: Path) -> str:
    table = benchlib.table_head(Path(args.table), 10000, work)
    from bench_annotate import make_model_dir

    model_dir = make_model_dir(work / "small", "small", Path(args.table), work / "counts.json")
    best: dict = {}
    outputs = []
    cores = os.cpu_count() or 1
    loaded = f"beside {cores} busy processes"
    for state in ("idle", loaded):
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(cores if state != "idle" else 0)]
        try:
            for _ in range(args.repeats):
                for policy in ("ACTIVE", "PASSIVE"):
                    out = work / f"busy-{policy}.gz"
                    _, _, seconds, _ = benchlib.run_measured(benchlib.phrase_scorer_command(
                        "annotate", table, "-m", model_dir, "-o", out, "--overwrite"),
                        env=dict(os.environ, OMP_WAIT_POLICY=policy))
                    best[(state, policy)] = min(seconds, best.get((state, policy), seconds))
                    outputs.append(out.read_bytes())
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    rows = [[state, policy, f"{best[(state, policy)]:.1f}", f"{best[(state, 'ACTIVE')] / best[(state, policy)]:.2f}x"]
            for state in ("idle", loaded) for policy in ("ACTIVE", "PASSIVE")]
    same = all(o == outputs[0] for o in outputs)
    return (
        f"`phrase-scorer annotate` of the first 10,000 lines of `{Path(args.table).name}` with an untrained `small` "
        f"model (the default threads: all {os.cpu_count()} cores), whole command with start-up, best of "
        f"{args.repeats} alternating runs; machine: {machine()}. *ACTIVE*: PyTorch's OpenMP threads spin while they "
        f"wait (the OpenMP default); *PASSIVE*: they sleep (the command line's default since this measurement). "
        f"*Speed-up* is against ACTIVE in the same state. All outputs are "
        f"{'byte-identical' if same else 'NOT identical'}.\n\n"
        + benchlib.markdown_table(["machine", "OMP_WAIT_POLICY", "seconds", "speed-up"], rows) + "\n"
    )


def machine() -> str:
    info = benchlib.machine()
    load = os.getloadavg()[0]
    return f"{info['cpu']}, {info['cores']} cores, load average {load:.1f} at the end"


def main() -> None:
    parser, w = benchlib.bench_parser(__doc__, "host-worker")
    w.add_argument("--table", required=True)
    w.add_argument("--model-dir", required=True)
    w.add_argument("--workers", type=int, required=True)
    w.add_argument("--out", required=True)
    parser.add_argument("--repeat", type=int, default=10, help="copies of the table in the large table")
    parser.add_argument("--large-workers", type=int, default=None)
    parser.add_argument("--trained", default=None, metavar="MODEL", help="a trained model for the end-to-end run")
    parser.add_argument("--model-lines", type=int, default=None, help="end-to-end runs on the first N lines only")
    parser.add_argument("--reference-src", default=None, metavar="DIR",
                        help="a checkout of an earlier version, measured in the same run as the reference")
    parser.add_argument("--parts", default="gzip,host,large,ceiling,busy,model")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting in the ceiling and busy parts")
    parser.add_argument("--profile-lines", type=int, default=200000, help="lines of the ceiling part's scorer profile")
    p = parser.commands.add_parser("profile-worker")
    p.add_argument("--table", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--lines", type=int, required=True)
    args = parser.parse_args()
    if args.command == "host-worker":
        host_worker(args)
        return
    if args.command == "profile-worker":
        scorer_profile(args)
        return
    from bench_annotate import make_model_dir

    with benchlib.work_dir(args.work_dir, "bench-host-") as work:
        model_dir = Path(args.trained) if args.trained else make_model_dir(
            work / "tiny", "tiny", Path(args.table), work / "counts.json")
        sections = {
            "gzip": ("bench_host_gzip", "Host pipeline: gzip libraries", lambda: gzip_libraries(Path(args.table))),
            "host": ("bench_host_workers", "Host pipeline: worker processes", lambda: host(args, work, model_dir)),
            "large": ("bench_host_large", "Host pipeline: a large table", lambda: large(args, work, model_dir)),
            "ceiling": ("bench_host_ceiling", "Annotate's ceiling: a tiny model against `zcat | gzip -1`",
                        lambda: ceiling(args, work, make_model_dir(work / "tiny", "tiny", Path(args.table),
                                                                   work / "counts.json"))),
            "busy": ("bench_host_busy", "Annotate on a busy machine: OpenMP's waiting threads",
                     lambda: busy(args, work)),
            "model": ("bench_host_model", "Annotate end to end with a trained model, before and after",
                      lambda: model(args, work)),
        }
        for part in args.parts.split(","):
            name, title, measure = sections[part]
            body = measure()
            if body:
                benchlib.report(name, f"## {title} (`tools/bench_host.py --parts {part}`)\n\n{body}", args.write)


if __name__ == "__main__":
    main()
