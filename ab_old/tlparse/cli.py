"""The `tlparse` command: a TORCH_TRACE directory or log file -> a report directory.

    tlparse /tmp/trace -o /tmp/report            # writes and opens /tmp/report/index.html
    tlparse /tmp/trace --latest --no-browser     # the newest log of the directory
    tlparse /tmp/trace --all-ranks-html          # one report over every rank's log
    tlparse trace.log --plain-text -o out        # text files that diff cleanly
    tlparse trace.log --strict                   # exit 1 if any line could not be parsed
    tlparse diff RUN_A RUN_B -o out              # what changed between two runs (exit 1: new breaks/recompiles)
    tlparse run [--open] script.py ARGS...       # trace the script, render its report, exit with its status
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import webbrowser
from typing import Optional

from . import __version__
from .report import Options


class UsageError(Exception):
    pass


def find_logs(path: str, latest: bool, all_ranks: bool) -> list[str]:
    if os.path.isfile(path):
        return [path]        # --latest on a file means that file
    if not os.path.isdir(path):
        raise UsageError(f"{path}: no such file or directory")
    logs = sorted(os.path.join(path, n) for n in os.listdir(path)
                  if os.path.isfile(os.path.join(path, n)) and not n.startswith("."))
    preferred = [p for p in logs if p.endswith(".log")] or logs
    if not preferred:
        raise UsageError(f"{path}: the directory holds no log file")
    if latest:
        return [max(preferred, key=lambda p: (os.path.getmtime(p), p))]
    return preferred


def diff_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="tlparse diff", description="Compare two runs' traces (before and after a "
                                 "code or config change). Exit status 1 when run B has a graph break or a recompile "
                                 "that run A did not have.")
    ap.add_argument("run_a", help="run A: a TORCH_TRACE directory or one log file")
    ap.add_argument("run_b", help="run B: a TORCH_TRACE directory or one log file")
    ap.add_argument("-o", "--output", default="tl_diff", help="output directory (default: tl_diff)")
    ap.add_argument("--plain", "--plain-text", dest="plain", action="store_true",
                    help="text (index.txt, also printed) instead of HTML")
    ap.add_argument("--overwrite", action="store_true", help="replace the output directory if it exists")
    ap.add_argument("--no-browser", action="store_true", help="do not open the diff in a browser")
    args = ap.parse_args(argv)
    try:
        logs_a = find_logs(args.run_a, False, True)
        logs_b = find_logs(args.run_b, False, True)
        if os.path.exists(args.output):
            if not args.overwrite:
                raise UsageError(f"{args.output} exists; pass --overwrite to replace it (or -o another directory)")
            shutil.rmtree(args.output) if os.path.isdir(args.output) else os.remove(args.output)
    except UsageError as exc:
        print(f"tlparse diff: error: {exc}", file=sys.stderr)
        return 2
    from .diff import render_plain, run_diff
    d = run_diff(logs_a, logs_b, args.output, args.plain, args.run_a, args.run_b)
    if args.plain:
        sys.stdout.write(render_plain(d))
    else:
        print(f"tlparse diff: {'REGRESSED' if d.regressed else 'no new graph break or recompile'} -> "
              f"{os.path.join(args.output, 'index.html')}", file=sys.stderr)
        if not args.no_browser:
            webbrowser.open("file://" + os.path.abspath(os.path.join(args.output, "index.html")))
    return 1 if d.regressed else 0


def run_main(argv: list[str]) -> int:
    """Run a Python script with TORCH_TRACE set to a fresh directory, render the report of
    what it wrote and say where it is; the exit status is the script's."""
    ap = argparse.ArgumentParser(prog="tlparse run", description="Run a Python script with TORCH_TRACE set to a "
                                 "fresh directory, then render its report. Exits with the script's exit status.")
    ap.add_argument("--open", action="store_true", help="open the report in a browser")
    ap.add_argument("-o", "--output", help="report directory (default: report/ next to the trace, in a fresh "
                    "temporary directory)")
    ap.add_argument("-p", "--plain-text", action="store_true", help="write text files, not HTML")
    ap.add_argument("script", help="the Python script to run")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = ap.parse_args(argv)
    if not os.path.isfile(args.script):
        print(f"tlparse run: error: {args.script}: no such file", file=sys.stderr)
        return 2
    if args.output and os.path.exists(args.output):
        print(f"tlparse run: error: {args.output} exists (pick another -o)", file=sys.stderr)
        return 2
    root = tempfile.mkdtemp(prefix="tlparse_run_")
    trace_dir = os.path.join(root, "trace")
    out = args.output or os.path.join(root, "report")
    env = {**os.environ, "TORCH_TRACE": trace_dir}
    proc = subprocess.Popen([sys.executable, args.script, *args.args], env=env)
    try:
        status = proc.wait()
    except KeyboardInterrupt:       # the script got the Ctrl-C too: report what it traced so far
        status = proc.wait()
    status = 128 - status if status < 0 else status      # killed by a signal: as a shell says it
    print(f"tlparse run: {args.script} exited with status {status}; trace: {trace_dir}", file=sys.stderr)
    try:
        logs = find_logs(trace_dir, False, True)
    except UsageError:
        print("tlparse run: the script wrote no trace (nothing was compiled, or it does not use the engine "
              "or torch.compile): no report", file=sys.stderr)
        return status
    opts = Options(plain=args.plain_text, command="tlparse run " + " ".join(shlex.quote(a) for a in argv))
    if len(logs) > 1:
        from .ranks import render_ranks
        render_ranks(logs, out, opts)
    else:
        from .report import render_log
        render_log(logs, out, opts)
    index = os.path.abspath(os.path.join(out, "index.txt" if args.plain_text else "index.html"))
    print(f"tlparse run: report: {index}", file=sys.stderr)
    if args.open and not args.plain_text:
        webbrowser.open("file://" + index)
    return status


def main(argv: Optional[list[str]] = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "diff" and not os.path.exists("diff"):
        return diff_main(list(raw[1:]))
    if raw and raw[0] == "run" and not os.path.exists("run"):
        return run_main(list(raw[1:]))
    ap = argparse.ArgumentParser(prog="tlparse", description="Turn a TORCH_TRACE directory or log file into an "
                                 "HTML report of what the compiler did.")
    ap.add_argument("path", help="a TORCH_TRACE directory or one log file")
    ap.add_argument("-o", "--output", default="tl_out", help="report directory (default: tl_out)")
    ap.add_argument("--no-browser", action="store_true", help="do not open the report in a browser")
    ap.add_argument("--overwrite", action="store_true", help="replace the output directory if it exists")
    ap.add_argument("--latest", action="store_true", help="only the newest log file of the directory")
    ap.add_argument("--all-ranks-html", action="store_true", help="one report over every rank's log")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 if any line could not be parsed")
    ap.add_argument("-p", "--plain-text", action="store_true", help="write text files that diff cleanly, not HTML")
    ap.add_argument("-V", "--version", action="version", version=f"tlparse {__version__}")
    args = ap.parse_args(argv)
    command = "tlparse " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    try:
        logs = find_logs(args.path, args.latest, args.all_ranks_html)
        out = args.output
        if os.path.exists(out):
            if not args.overwrite:
                raise UsageError(f"{out} exists; pass --overwrite to replace it (or -o another directory)")
            if os.path.isdir(out) and not os.path.islink(out):
                shutil.rmtree(out)
            else:
                os.remove(out)
    except UsageError as exc:
        print(f"tlparse: error: {exc}", file=sys.stderr)
        return 2
    opts = Options(plain=args.plain_text, command=command)
    if args.all_ranks_html or len(logs) > 1:
        from .ranks import render_ranks
        if len(logs) > 1 and not args.all_ranks_html:
            print(f"tlparse: {len(logs)} logs in {args.path}: one report per log, compared side by side "
                  "(as --all-ranks-html)", file=sys.stderr)
        summaries = render_ranks(logs, out, opts)
        unparsed = sum(s.unparsed for s in summaries)
        print(f"tlparse: {len(summaries)} rank(s), {unparsed} unparsed line(s) -> {out}", file=sys.stderr)
    else:
        from .report import render_log
        col = render_log(logs, out, opts)
        unparsed = col.unparsed_count
        n = sum(1 for k in col.compiles if k != (None, None, None))
        print(f"tlparse: {col.records} records, {n} compiles, {unparsed} unparsed line(s) -> {out}",
              file=sys.stderr)
    index = os.path.join(out, "index.txt" if args.plain_text else "index.html")
    if not args.no_browser and not args.plain_text:
        webbrowser.open("file://" + os.path.abspath(index))
    if args.strict and unparsed:
        print(f"tlparse: --strict: {unparsed} line(s) could not be parsed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
