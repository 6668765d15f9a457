"""Whole commands of two versions of the package on the same inputs, one after the other, alone on
the machine: seconds, pairs per second, the GPU's utilisation (nvidia-smi, sampled every 100 ms)
and whether the outputs are the same bytes.

    python tools/bench_versions.py --before OLD_CHECKOUT --work-dir W --device cuda

``--before`` is a folder holding an older ``phrase_scorer`` package (``git archive COMMIT
phrase_scorer | tar -x -C OLD_CHECKOUT``); the other version is this checkout's. The inputs are
those ``tools/bench_stages.py --work-dir W`` leaves there (its untrained models ``PRESET-initial``,
the repeated table ``table-N.gz``, the repeated n-best list ``nbest-N.gz`` and its source): run it
first with the same ``--work-dir``. Each command runs as ``phrase-scorer annotate|rescore ...
--device D`` with the version's defaults, in a process of its own started in the version's
folder (so that it imports that version).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
MAIN = "import sys; from phrase_scorer.cli import main; sys.argv[0] = 'phrase-scorer'; main()"


def sample_utilisation(stop: threading.Event, values: List[float]) -> None:
    try:
        process = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                    "-lms", "100"], stdout=subprocess.PIPE, text=True)
    except OSError:
        return
    assert process.stdout is not None
    for line in process.stdout:
        if stop.is_set():
            break
        try:
            values.append(float(line))
        except ValueError:
            pass
    process.kill()


def run(code: Path, args: List[str], pairs: int) -> Dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]),
           "OMP_WAIT_POLICY": "PASSIVE"}
    stop, values = threading.Event(), []  # type: ignore[var-annotated]
    sampler = threading.Thread(target=sample_utilisation, args=(stop, values))
    sampler.start()
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", MAIN, "-q", *args], env=env, capture_output=True, text=True,
                            cwd=code)
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join(timeout=5)
    row: Dict[str, object] = {"seconds": round(seconds, 2), "pairs/s": round(pairs / seconds),
                              "gpu_busy": round(sum(values) / len(values), 1) if values else None,
                              "rc": result.returncode}
    if result.returncode:
        row["error"] = result.stderr[-800:]
    return row


def differing_lines(a: Path, b: Path) -> int:
    with gzip.open(a, "rb") as x, gzip.open(b, "rb") as y:
        return sum(la != lb for la, lb in zip(x, y))


def lines_of(path: Path) -> int:
    with gzip.open(path, "rb") as f:
        return sum(1 for _ in f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="a folder holding the older phrase_scorer package")
    parser.add_argument("--work-dir", required=True, help="bench_stages.py's work folder (models, inputs)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--presets", default="small,paper")
    parser.add_argument("--table", default=None, help="the table to annotate [default: W's largest table-N.gz]")
    parser.add_argument("--nbest", default=None, help="the n-best list [default: W's largest nbest-N.gz]")
    parser.add_argument("--batch-tokens", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    work = Path(args.work_dir)

    def largest(pattern: str, given: Optional[str]) -> Path:
        if given:
            return Path(given)
        return max(work.glob(pattern), key=lambda p: int(p.name.split("-")[1].split(".")[0]))

    table, nbest = largest("table-*.gz", args.table), largest("nbest-*[0-9].gz", args.nbest)
    source = nbest.with_name(nbest.name.replace(".gz", ".src.gz"))
    sizes = {"annotate": lines_of(table), "rescore": lines_of(nbest)}
    versions = {"before": Path(args.before).resolve(), "now": ROOT}
    extra = ["--batch-tokens", str(args.batch_tokens)] if args.batch_tokens else []
    rows = []
    for command in ("annotate", "rescore"):
        for preset in args.presets.split(","):
            model = work / f"{preset}-initial"
            outputs = {}
            for label, code in versions.items():
                out = work / f"versions-{command}-{preset}-{label}.gz"
                inputs = [str(table)] if command == "annotate" else [str(nbest), "--source", str(source)]
                row = {"command": command, "preset": preset, "version": label, "pairs": sizes[command],
                       **run(code, [command, *inputs, "-m", str(model), "-o", str(out), "--device", args.device,
                                    "--overwrite", *extra], sizes[command])}
                outputs[label] = out
                rows.append(row)
                print(json.dumps(row), flush=True)
            if all(r["rc"] == 0 for r in rows[-2:]):
                print(json.dumps({"command": command, "preset": preset,
                                  "differing_lines": differing_lines(outputs["before"], outputs["now"])}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
