"""The minifier's goal: a 200-node graph with one bad op minified in under a minute on CPU.

For each injected relu bug (engine.config.inject_relu_bug_TESTING_ONLY) and each stage
(after dynamo, after aot), a program of N pointwise ops and matmuls with one relu at a
random place runs with TORCHDYNAMO_REPRO_AFTER set; then its minifier_launcher.py runs as
the user would run it, and the trials, the seconds and the repro's size are reported.

    .venv/bin/python tests/bench/bench_minifier.py [--nodes 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent('''\
    import sys, torch, engine

    def model(x, w):
    {body}
        return x

    engine.config.inject_relu_bug_TESTING_ONLY = sys.argv[1]
    engine.config.repro_after = sys.argv[2]
    engine.config.repro_level = 4 if sys.argv[1] == "accuracy" else 2
    try:
        engine.compile(model)(torch.randn(16, 16), torch.randn(16, 16))
    except Exception as exc:
        print("failed as expected:", type(exc).__name__)
''')
# Residual ops: a wrong relu stays visible at the output (a chain of tanh and shrinking
# matmuls washes it out, and no accuracy check could see it there).
OPS = ["x = x + torch.sin(x)", "x = x * 0.7", "x = x + 0.1", "x = x - 0.1", "x = (x @ w) * 0.25",
       "x = x + torch.tanh(x)", "x = x * torch.sigmoid(x) + x"]
NODES = {"sin": 2, "tanh": 2, "sigmoid": 3, "@": 2}


def program(ops: int, seed: int) -> str:
    """One straight-line function of about `ops` graph nodes, one relu in its middle half."""
    import random
    rng = random.Random(seed)
    lines, nodes = [], 0
    bad_at = rng.randrange(ops // 4, 3 * ops // 4)
    while nodes < ops:
        if bad_at is not None and nodes >= bad_at:
            lines.append("x = torch.relu(x)")
            bad_at, nodes = None, nodes + 1
            continue
        line = rng.choice(OPS)
        lines.append(line)
        nodes += max([n for k, n in NODES.items() if k in line], default=1)
    return PROGRAM.replace("{body}", "\n".join("    " + line for line in lines))


def run(bug: str, stage: str, ops: int, seed: int, folder: str) -> dict:
    script = os.path.join(folder, f"prog_{bug}_{stage}.py")
    with open(script, "w") as f:
        f.write(program(ops, seed))
    env = dict(os.environ, TORCH_COMPILE_DEBUG_DIR=os.path.join(folder, f"debug_{bug}_{stage}"),
               PYTHONPATH=ROOT)
    t0 = time.time()
    subprocess.run([sys.executable, script, bug, stage], env=env, check=True, capture_output=True, text=True)
    first = time.time() - t0
    launcher = glob.glob(os.path.join(env["TORCH_COMPILE_DEBUG_DIR"], "run_*", "minifier", "minifier_launcher.py"))[0]
    t0 = time.time()
    out = subprocess.run([sys.executable, launcher], env=env, capture_output=True, text=True)
    wall = time.time() - t0
    done = [line for line in out.stderr.splitlines() if " trials, " in line]
    m = re.search(r"(\d+) nodes -> (\d+) in (\d+) trials, ([\d.]+) s", done[-1] if done else "")
    repro = os.path.join(os.path.dirname(launcher), "repro.py")
    ops_left = sum(1 for line in open(repro) if re.search(r"= (torch\.|\w+ [@*+]|\w+\.\w+\()", line)) \
        if os.path.exists(repro) else None
    return {"bug": bug, "stage": stage, "program_s": first, "launcher_wall_s": wall,
            "nodes": int(m.group(1)) if m else None, "left": int(m.group(2)) if m else None,
            "trials": int(m.group(3)) if m else None, "minify_s": float(m.group(4)) if m else None,
            "repro_lines": ops_left}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bugs", default="compile_error,runtime_error,accuracy")
    parser.add_argument("--stages", default="dynamo,aot")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from observe.tables import format_table

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for bug in args.bugs.split(","):
            for stage in args.stages.split(","):
                r = run(bug, stage, args.nodes, args.seed, folder)
                rows.append([r["bug"], r["stage"], r["nodes"], r["left"], r["trials"], f"{r['minify_s']:.1f}",
                             f"{r['launcher_wall_s']:.1f}"])
                print(rows[-1], flush=True)
    print(format_table(["bug", "after", "graph nodes", "repro nodes", "trials", "minify s", "launcher wall s"], rows))


if __name__ == "__main__":
    main()
