"""Our tlparse against PyTorch's (the Rust PyPI tlparse) on the same large trace, side by side.

    python tests/bench/bench_tlparse.py                    # builds /tmp/tlparse_bench/big.log (200 MB) if missing
    python tests/bench/bench_tlparse.py --mb 500 --runs 3
    REFERENCE_TLPARSE=/path/to/tlparse python tests/bench/bench_tlparse.py

Each run starts from an empty output directory after a `sync`, and the two tools take
turns, so both see the same page cache and disk. Wall time is measured around the child
process, CPU time and peak memory are the child's ru_utime + ru_stime and ru_maxrss
(os.wait4; CPU time is the steadier number on a busy machine). Prints both and the ratios
(ours / reference: lower is better; the goal is <= 0.5 for time and <= 0.33 for memory).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_REF = os.path.join(ROOT, ".venv", "reference-tlparse", "bin", "tlparse")


def run_once(cmd: list[str], out: str) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds (user + sys), peak RSS MiB, exit status) of one run."""
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd + ["-o", out, "--no-browser"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode:
        print(f"  {cmd[0]} exited {proc.returncode}: {err[-500:]}", file=sys.stderr)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, proc.returncode


def du(path: str) -> tuple[int, int]:
    files = size = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            files += 1
            size += os.path.getsize(os.path.join(dirpath, n))
    return files, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="/tmp/tlparse_bench/big.log")
    ap.add_argument("--mb", type=float, default=200.0, help="size of the trace to build when it is missing")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reference", default=os.environ.get("REFERENCE_TLPARSE", DEFAULT_REF))
    args = ap.parse_args()
    if not os.path.exists(args.trace):
        subprocess.run([sys.executable, os.path.join(HERE, "make_big_trace.py"), "--mb", str(args.mb),
                        "-o", args.trace], check=True)
    size_mb = os.path.getsize(args.trace) / 2**20
    ours = [sys.executable, "-m", "tlparse.cli", args.trace]
    tools = {"ours": ours}
    if os.path.exists(args.reference):
        tools["reference"] = [args.reference, args.trace]
    else:
        print(f"reference tlparse not found at {args.reference}: measuring ours only")
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in tools}
    outs = {k: f"/tmp/tlparse_bench/out_{k}" for k in tools}
    print(f"trace: {args.trace} ({size_mb:.0f} MiB), {args.runs} run(s) each, alternating")
    for i in range(args.runs):
        for name, cmd in tools.items():
            wall, cpu, rss, rc = run_once(cmd, outs[name])
            results[name].append((wall, cpu, rss))
            print(f"  run {i + 1} {name:9s} wall {wall:6.2f} s   cpu {cpu:6.2f} s   peak RSS {rss:7.1f} MiB   exit {rc}")
    print()
    print(f"{'tool':10s} {'wall (median)':>14s} {'wall (min)':>11s} {'cpu (median)':>13s} {'peak RSS':>10s} "
          f"{'output':>16s}")
    summary = {}
    for name, rs in results.items():
        walls = [w for w, _, _ in rs]
        cpus = [c for _, c, _ in rs]
        rss = max(r for _, _, r in rs)
        files, size = du(outs[name])
        summary[name] = (statistics.median(walls), min(walls), statistics.median(cpus), rss)
        print(f"{name:10s} {statistics.median(walls):12.2f} s {min(walls):9.2f} s {statistics.median(cpus):11.2f} s "
              f"{rss:7.0f} MiB {files:6d} files {size / 2**20:4.0f} MiB")
    if "reference" in summary:
        o, r = summary["ours"], summary["reference"]
        print()
        print(f"ratio ours/reference: wall {o[0] / r[0]:.2f} (median), {o[1] / r[1]:.2f} (min); "
              f"cpu {o[2] / r[2]:.2f}; peak RSS {o[3] / r[3]:.2f}   [goal: wall <= 0.50, memory <= 0.33]")


if __name__ == "__main__":
    main()
