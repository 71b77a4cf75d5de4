"""Differential fuzzer: random programs (gen.py), run eagerly and compiled, compared call by
call (outputs, aliasing of outputs to inputs, mutated inputs, globals, module state,
gradients). Failures are shrunk and written as standalone repro scripts.

    python -m tests.fuzz --backend aot_eager --seed 0 --count 200 [--compare] [--out DIR]

Categories: pass; wrong (call 0 differs from eager); stale (call 0 matched, a later call
with changed inputs differs: guards that should have failed did not, or a recompile went
wrong); crash (the compiled function raised where eager did not; its first line is
kept); eager-error (eager raised: skipped; the generator already drops such programs);
noise (float values differ, but the program run in float64, eagerly and compiled, agrees:
rounding, amplified by an ill-conditioned program; or a branch on a value that is 0 in
exact arithmetic, or a maximum of 0.0 and -0.0 (eager's own loops break that tie both
ways), which eager takes the compiled way once flipped; counted, not a failure). A float
difference where the compiled value is as close to the float64 result as eager's own is
passes."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

import logging

import engine

import torch

# torch logs the errors of programs it fails on (fake-tensor propagation, ...) at ERROR level:
# the runner reports them itself
logging.getLogger("torch").setLevel(logging.CRITICAL)

from . import gen, harness, program

CATEGORIES = ("pass", "noise", "wrong", "stale", "crash", "eager-error")


@dataclass
class Outcome:
    category: str
    call: int = -1
    variant: str = ""
    section: str = ""
    detail: str = ""
    trace: str = ""

    @property
    def sig(self):
        if self.category == "crash":
            return (self.category, _normalize(self.detail))
        return (self.category, self.section, _mismatch_kind(self.detail))

    @property
    def failed(self):
        return self.category in ("wrong", "stale", "crash")

    def line(self):
        if self.category == "pass":
            return "pass"
        where = f" at call {self.call} ({self.variant})" if self.call > 0 else (" at call 0" if self.call == 0 else "")
        return f"{self.category}{where}: {self.detail.splitlines()[0] if self.detail else ''}"


def _mismatch_kind(detail):
    """What differs, in a word: so that shrinking keeps the same kind of mismatch."""
    first = detail.split("\n")[0]
    for key, kind in (("requires_grad", "requires_grad"), ("values differ", "values"), ("aliases", "aliasing"),
                      ("eager gives None, compiled gives a tensor", "None vs tensor"),
                      ("eager gives a tensor, compiled gives None", "tensor vs None"), ("items", "length"),
                      ("keys", "keys"), ("torch.", "dtype/shape")):
        if key in first:
            return kind
    return "value"


def _normalize(s):
    """An error line without what varies between programs failing the same way: the source
    line quoted in the engine's 'internal error ... at <file>:line (source): Error' form,
    addresses and numbers."""
    s = re.sub(r" at <[^>]*>:\d+ \(.*\): ", ": ", s)
    s = re.sub(r"0x[0-9a-f]+", "0x#", s)
    s = re.sub(r"<fuzz-\d+>", "<fuzz>", s)
    return re.sub(r"\d+", "#", s)[:200]


class FuzzTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds):
    def handler(signum, frame):
        raise FuzzTimeout(f"no result after {seconds} s")
    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(int(seconds))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def compiler(impl, backend):
    if impl == "engine":
        return lambda fn: engine.compile(fn, backend=backend)
    return lambda fn: torch.compile(fn, backend=backend)


def reset(impl):
    if impl == "engine":
        engine.reset()
    else:
        torch._dynamo.reset()


def check(prog, impl, backend, timeout=60):
    """Run every call of `prog` eagerly and compiled (fresh namespaces, one compiled function
    across all calls) and classify the first difference."""
    reset(impl)
    try:
        with gen.quiet(), time_limit(timeout):
            return _check(prog, impl, backend)
    except FuzzTimeout as e:
        return Outcome("crash", detail=f"FuzzTimeout: {e}")
    finally:
        torch.set_grad_enabled(True)
        reset(impl)


def _check(prog, impl, backend):
    ns_e, calls_e, gnames = gen.load(prog, tag="eager")
    ns_c, calls_c, _ = gen.load(prog, tag="compiled")
    try:
        fn_c = compiler(impl, backend)(ns_c["fn"])
    except Exception as e:  # noqa: BLE001
        return Outcome("crash", 0, "call 0", detail="compile: " + harness.error_line(e), trace=_tb(e))
    for i, (mk_e, mk_c) in enumerate(zip(calls_e, calls_c)):
        variant = prog.calls[i].variant
        e = harness.run_call(ns_e, ns_e["fn"], mk_e, gnames)
        if "error" in e:
            return Outcome("eager-error", i, variant, detail=f"{e['error'][0]}: " + harness.error_line(e["error"][1]))
        c = harness.run_call(ns_c, fn_c, mk_c, gnames)
        if "error" in c:
            phase, err = c["error"]
            if isinstance(err, FuzzTimeout):
                raise err
            return Outcome("crash", i, variant, detail=f"{phase}: " + harness.error_line(err), trace=_tb(err))
        d = harness.compare(e, c)
        if d and "values differ" in d[1]:
            d, noise = _rounding_noise(prog, impl, backend, i, e, c, gnames)
            if noise:
                return Outcome("noise", i, variant, section=noise[0], detail=noise[1])
        if d:
            return Outcome("wrong" if i == 0 else "stale", i, variant, section=d[0], detail=d[1])
    return Outcome("pass")


def _rounding_noise(prog, impl, backend, i, e, c, gnames):
    """Call i's float values differ from eager's: are they rounding noise? The program runs
    again in float64, eagerly and compiled afresh. Returns (difference, noise):
    - (None, None) where the compiled value is as close to the float64 result as eager's is;
    - (None, d) where not, but compiled and eager agree in float64: the same arithmetic,
      rounded differently (ill-conditioned programs: a BatchNorm of equal rows, a gradient
      that is 0 mathematically); the "noise" category, counted apart from the failures;
    - (None, d) too where the float64 eager run branches on a value that is 0 in exact
      arithmetic, or takes the maximum of 0.0 and -0.0 (harness.RoundingTies), and eager,
      that one taken the other way, gives the compiled result;
    - (d, None) otherwise: a wrong (or stale) result."""
    ns_e, calls_e, _ = gen.load(prog, harness.float64_source(prog.source()), tag="float64-eager")
    ties = harness.RoundingTies()
    ref = harness.float64_run(ns_e, ns_e["fn"], calls_e, i, gnames, ties)
    d = harness.compare(e, c, ref)
    if d is None or ref is None or "values differ" not in d[1]:
        return d, None
    ns_c, calls_c, _ = gen.load(prog, harness.float64_source(prog.source()), tag="float64-compiled")
    try:
        ref_c = harness.float64_run(ns_c, compiler(impl, backend)(ns_c["fn"]), calls_c, i, gnames)
    except Exception:  # noqa: BLE001
        ref_c = None
    if ref_c is not None and not harness.compare(ref, ref_c):
        return None, d
    flipped = (ties.found or ties.elements) and harness.branch_noise(lambda: gen.load(prog, tag="flipped")[0], calls_e, i, gnames,
                                                  e, c, ties)
    if flipped:
        return None, (d[0], f"{d[1]}\n  {flipped}; taken the other way, eager gives the compiled result")
    return d, None


def _tb(e):
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]


# ---------------------------------------------------------------------------- shrinking

def shrink(prog, impl, backend, outcome, budget=60.0, timeout=60):
    """Delete what the failure does not need, keeping each deletion that still fails the
    same way (same category, and the same section or the same error): later calls, single
    statements of fn's body, forward statements of the module, returned values, arguments,
    unused module-level helpers and globals."""
    sig = outcome.sig
    deadline = time.time() + budget
    best = prog.copy()
    best.calls = best.calls[:outcome.call + 1]

    def still(cand):
        if time.time() > deadline:
            return False
        try:
            return check(cand, impl, backend, timeout).sig == sig
        except Exception:   # noqa: BLE001  the deletion broke the program itself (a global a call still reads)
            return False

    def attempt(mutate):
        nonlocal best
        cand = best.copy()
        if mutate(cand) is False:
            return False
        if still(cand):
            best = cand
            return True
        return False

    if outcome.section not in ("out", "alias", "grads") and best.ret != ["None"]:   # returned values not needed
        attempt(lambda p: (setattr(p, "ret", ["None"]), setattr(p, "ret_form", "single")))
    # calls between call 0 and the failing one
    if len(best.calls) > 2:
        attempt(lambda p: setattr(p, "calls", [p.calls[0], p.calls[-1]]))
    for i in range(len(best.calls) - 2, 0, -1):
        attempt(lambda p, i=i: p.calls.pop(i))
    changed = True
    while changed and time.time() < deadline:
        changed = False
        for i in range(len(best.body) - 1, -1, -1):
            if i < len(best.body) and attempt(lambda p, i=i: p.body.pop(i)):
                changed = True
        if best.module is not None:
            for i in range(len(best.module.forward) - 1, 0, -1):
                if attempt(lambda p, i=i: p.module.forward.pop(i)):
                    changed = True
            for i in range(len(best.module.init) - 1, -1, -1):
                if attempt(lambda p, i=i: p.module.init.pop(i)):
                    changed = True
        for i in range(len(best.ret) - 1, -1, -1):
            if len(best.ret) > 1 and attempt(lambda p, i=i: p.ret.pop(i)):
                changed = True
    for name in [a.name for a in best.args]:
        attempt(lambda p, name=name: _drop_arg(p, name))
    for gname in [g.name for g in best.globals]:
        attempt(lambda p, gname=gname: _drop_global(p, gname))
    if best.module is not None and not re.search(r"\bMOD\b|\bm\b", best.source().split("def fn(")[1]):
        attempt(_drop_module)
    # simpler inputs: contiguous, no requires_grad, float32
    for ci in range(len(best.calls)):
        for ai, a in enumerate(best.calls[ci].args):
            if a.kind != "tensor":
                continue
            for fieldname, simple in (("layout", "contig"), ("rg", None)):
                if getattr(a.tensor, fieldname) != simple:
                    attempt(lambda p, ci=ci, ai=ai, f=fieldname, v=simple: setattr(p.calls[ci].args[ai].tensor, f, v))
    best.prune_helpers()
    return best


def _drop_arg(p, name):
    if any(c.alias and name in c.alias for c in p.calls):
        return False
    p.args = [a for a in p.args if a.name != name]
    for c in p.calls:
        c.args = [a for a in c.args if a.name != name]


def _drop_global(p, gname):
    code = "\n".join(x for x in p.source().splitlines() if not x.startswith("#"))
    if re.search(r"\b" + gname + r"\b", code):
        return False
    p.globals = [g for g in p.globals if g.name != gname]
    for c in p.calls:
        if c.globals is not None:
            c.globals = [g for g in c.globals if g.name != gname]


def _drop_module(p):
    p.module = None
    for c in p.calls:
        c.module = None


# ---------------------------------------------------------------------------- repros

HARNESS_SRC = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")).read()

REPRO_MAIN = '''

def _load(src):
    ns = {"__name__": "prog_flipped"}
    exec(compile(src, "<fuzz-program>", "exec"), ns)
    return ns


def main(impl):
    import linecache
    linecache.cache["<fuzz-program>"] = (len(SRC), None, SRC.splitlines(True), "<fuzz-program>")
    ns_e, ns_c = {"__name__": "prog_eager"}, {"__name__": "prog_compiled"}
    exec(compile(SRC, "<fuzz-program>", "exec"), ns_e)
    exec(compile(SRC, "<fuzz-program>", "exec"), ns_c)
    compile_fn = engine.compile if impl == "engine" else torch.compile
    fn_c = compile_fn(ns_c["fn"], backend=BACKEND)
    for i, call in enumerate(CALLS):
        e = run_call(ns_e, ns_e["fn"], call, GLOBALS)
        if "error" in e:
            print(f"call {i}: eager raised ({e['error'][0]}): {error_line(e['error'][1])}")
            return 2
        c = run_call(ns_c, fn_c, call, GLOBALS)
        if "error" in c:
            err = c["error"][1]
            traceback.print_exception(type(err), err, err.__traceback__)
            print(f"call {i}: CRASH ({c['error'][0]}): {error_line(err)}")
            return 1
        d = compare(e, c)
        if d and "values differ" in d[1]:   # rounding noise, or wrong? ask float64 runs
            ns_r, ns_rc = {"__name__": "prog_float64"}, {"__name__": "prog_float64_compiled"}
            exec(compile(float64_source(SRC), "<fuzz-program>", "exec"), ns_r)
            exec(compile(float64_source(SRC), "<fuzz-program>", "exec"), ns_rc)
            ties = RoundingTies()
            ref = float64_run(ns_r, ns_r["fn"], CALLS, i, GLOBALS, ties)
            d = compare(e, c, ref)
            if d and ref is not None:
                ref_c = float64_run(ns_rc, compile_fn(ns_rc["fn"], backend=BACKEND), CALLS, i, GLOBALS)
                if ref_c is not None and compare(ref, ref_c) is None:
                    print(f"call {i}: rounding noise ({d[0]}): {d[1]}\\n  (in float64, compiled and eager agree)")
                    return 0
                flipped = branch_noise(lambda: _load(SRC), CALLS, i, GLOBALS, e, c, ties)
                if flipped:
                    print(f"call {i}: rounding noise ({d[0]}): {d[1]}\\n  ({flipped}; taken the other way, "
                          "eager gives the compiled result)")
                    return 0
        if d:
            print(f"call {i}: MISMATCH ({d[0]}): {d[1]}")
            return 1
        print(f"call {i}: matches eager")
    print("every call matches eager")
    return 0


if __name__ == "__main__":
    import sys
    import traceback
    sys.exit(main("torch" if "--torch" in sys.argv else "engine"))
'''


def repro_source(prog, impl, backend, outcome):
    src = prog.source()
    q = "'''" if "'''" not in src else '"""'
    head = [f'"""Fuzz repro (tests/fuzz): seed {prog.seed}, {impl} backend={backend!r}.',
            f"{outcome.line()}", "",
            "Run from the repository root: python THIS_FILE.py   (--torch: torch.compile instead of engine.compile)", '"""',
            "import engine  # noqa: F401  (before torch)", "import torch", "",
            *(["engine.config.backward_in_graph = True  # --backward-inside", ""] if program.BACKWARD_INSIDE else []),
            f"BACKEND = {backend!r}",
            "", "# the program: exec'd once for eager and once for the compiled function",
            f"SRC = r{q}" + src + q, "", "# each call builds its inputs (and globals, module) in the program's namespace ns",
            prog.calls_source(), HARNESS_SRC, REPRO_MAIN]
    return "\n".join(head)


def write_repro(out_dir, prog, impl, backend, outcome, sub=""):
    d = os.path.join(out_dir, sub) if sub else out_dir
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{impl}_{backend}_seed{prog.seed}_{outcome.category}.py")
    with open(path, "w") as f:
        f.write(repro_source(prog, impl, backend, outcome))
    return path


# ---------------------------------------------------------------------------- driver

@dataclass
class Result:
    seed: int
    engine: Outcome
    torch: Outcome = None
    repro: str = ""
    shrunk_source: str = ""
    shrunk: Outcome = None
    discarded: int = 0
    extra: dict = field(default_factory=dict)


def fuzz(backend, seeds, compare=False, out="/tmp/fuzz-failures", do_shrink=True, shrink_budget=60.0,
         timeout=None, log=print, verbose=False, deadline=None):
    """Generate and check one program per seed; shrink and write every engine failure. With
    a `deadline` (time.time()), no program starts after it: the results cover the seeds
    that finished."""
    timeout = timeout or (180 if backend == "inductor" else 60)
    results = []
    t0 = time.time()
    for n, seed in enumerate(seeds):
        if deadline is not None and time.time() >= deadline:
            log(f"deadline: stopped after {n} of {len(seeds)} programs" + (f" (seeds {seeds[0]}..{seed - 1})" if n else ""))
            break
        try:
            prog, discarded = gen.generate(seed)
        except RuntimeError as e:
            log(f"seed {seed}: {e}")
            continue
        res = Result(seed, check(prog, "engine", backend, timeout), discarded=discarded)
        if compare:
            res.torch = check(prog, "torch", backend, timeout)
        if res.engine.failed:
            small = shrink(prog, "engine", backend, res.engine, shrink_budget, timeout) if do_shrink else prog
            res.shrunk = check(small, "engine", backend, timeout)
            if res.shrunk.sig != res.engine.sig:   # (a flaky shrink) keep the original
                small, res.shrunk = prog, res.engine
            res.repro = write_repro(out, small, "engine", backend, res.shrunk)
            res.shrunk_source = small.source()
        if res.torch is not None and res.torch.failed:
            res.extra["torch_repro"] = write_repro(out, prog, "torch", backend, res.torch, sub="torch")
        results.append(res)
        if verbose or res.engine.failed or (res.torch and res.torch.failed):
            tail = f" | torch: {res.torch.line()}" if res.torch else ""
            log(f"seed {seed}: engine: {res.engine.line()}{tail}" + (f"  -> {res.repro}" if res.repro else ""))
        if (n + 1) % 50 == 0:
            log(f"  ... {n + 1}/{len(seeds)} programs, {time.time() - t0:.0f} s")
    return results


def summarize(results, backend, compare):
    lines = [f"backend {backend}: {len(results)} programs"]
    for who in ("engine", "torch") if compare else ("engine",):
        counts = {c: 0 for c in CATEGORIES}
        for r in results:
            counts[getattr(r, who).category] += 1
        lines.append(f"  {who:7s} " + "  ".join(f"{c}={n}" for c, n in counts.items()))
    fails = [r for r in results if r.engine.failed]
    if compare:
        own = [r for r in fails if not (r.torch and r.torch.failed)]
        shared = [r for r in fails if r.torch and r.torch.failed]
        lines.append(f"engine-only failures ({len(own)}):")
        lines += [f"  seed {r.seed}: {r.engine.line()}  [{r.repro}]" for r in own]
        lines.append(f"failures shared with torch.compile ({len(shared)}):")
        lines += [f"  seed {r.seed}: {r.engine.line()} | torch: {r.torch.line()}  [{r.repro}]" for r in shared]
        tonly = [r for r in results if r.torch and r.torch.failed and not r.engine.failed]
        lines.append(f"torch.compile-only failures ({len(tonly)}):")
        lines += [f"  seed {r.seed}: {r.torch.line()}  [{r.extra.get('torch_repro')}]" for r in tonly]
    else:
        lines.append(f"failures ({len(fails)}):")
        lines += [f"  seed {r.seed}: {r.engine.line()}  [{r.repro}]" for r in fails]
    noise = [r for r in results if r.engine.category == "noise"]
    lines.append(f"rounding noise: the float64 runs agree, or a tie eager breaks either way ({len(noise)}):")
    lines += [f"  seed {r.seed}: {r.engine.line()}" for r in noise]
    kinds = {}
    for r in fails:
        kinds.setdefault(r.engine.sig, []).append(r.seed)
    lines.append(f"distinct engine failure kinds ({len(kinds)}):")
    lines += [f"  {' '.join(map(str, k))}: seeds {v[:10]}{' ...' if len(v) > 10 else ''}" for k, v in
              sorted(kinds.items(), key=lambda kv: -len(kv[1]))]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="eager", choices=["eager", "aot_eager", "inductor"])
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--count", type=int, default=100, help="number of programs (seeds seed .. seed+count-1)")
    ap.add_argument("--compare", action="store_true", help="also run torch.compile on the same programs")
    ap.add_argument("--out", default="/tmp/fuzz-failures", help="folder for the repro scripts")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--shrink-budget", type=float, default=60.0, help="seconds of shrinking per failure")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per program and implementation")
    ap.add_argument("--json", default=None, help="write every result here (default OUT/results-BACKEND-SEED.json)")
    ap.add_argument("--show", action="store_true", help="print the program of --seed and exit")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes, each a contiguous share of the seeds")
    ap.add_argument("--minutes", type=float, default=None,
                    help="start no program after this many minutes; results and summary cover what finished")
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)   # for workers: time.time()
    ap.add_argument("--backward-inside", action="store_true",
                    help="run each program's backward inside the compiled call (engine.config.backward_in_graph)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.backward_inside:
        program.BACKWARD_INSIDE = True
        engine.config.backward_in_graph = True
    if args.show:
        prog, _ = gen.generate(args.seed)
        print(prog.source())
        print(prog.calls_source())
        return 0
    os.makedirs(args.out, exist_ok=True)
    if args.minutes is not None and args.deadline is None:
        args.deadline = time.time() + 60 * args.minutes
    if args.jobs > 1:
        results = _in_workers(args, argv if argv is not None else sys.argv[1:])
    else:
        seeds = list(range(args.seed, args.seed + args.count))
        results = fuzz(args.backend, seeds, args.compare, args.out, not args.no_shrink, args.shrink_budget,
                       args.timeout, log=lambda s: print(s, flush=True), verbose=args.verbose,
                       deadline=args.deadline)
    print(summarize(results, args.backend, args.compare), flush=True)
    if len(results) < args.count:
        print(f"{len(results)} of the {args.count} programs asked for ran (the deadline, or workers that "
              f"wrote no results); the JSON lists their seeds", flush=True)
    path = args.json or os.path.join(args.out, f"results-{args.backend}-{args.seed}-{args.count}.json")
    with open(path, "w") as f:
        json.dump([{"seed": r.seed, "engine": asdict(r.engine), "torch": asdict(r.torch) if r.torch else None,
                    "shrunk": asdict(r.shrunk) if r.shrunk else None, "repro": r.repro,
                    "shrunk_source": r.shrunk_source, **r.extra} for r in results], f, indent=1)
    print(f"results: {path}")
    return 1 if any(r.engine.category in ("wrong", "stale") for r in results) else 0


def _in_workers(args, argv):
    """Split the seeds over args.jobs `python -m tests.fuzz` processes (logs in OUT/worker-K.log)
    and read their results back."""
    per = -(-args.count // args.jobs)
    keep = []
    skip = {"--jobs", "--seed", "--count", "--json", "--minutes", "--deadline"}
    it = iter(argv)
    for a in it:
        if a.split("=")[0] in skip:
            if "=" not in a:
                next(it, None)
        else:
            keep.append(a)
    # Each worker gets its share of the cores for torch's (and generated kernels') threads,
    # unless the caller chose: 64 workers of 64 threads each spent 10 s a program on a 64-core
    # host (4 s at 2 threads each).
    threads = str(max(1, (os.cpu_count() or 1) // args.jobs))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, **os.environ}
    procs = []
    for k in range(args.jobs):
        first, n = args.seed + k * per, min(per, args.count - k * per)
        if n <= 0:
            break
        part = os.path.join(args.out, f"worker-{k}.json")
        log = open(os.path.join(args.out, f"worker-{k}.log"), "w")
        cmd = [sys.executable, "-m", "tests.fuzz", *keep, "--seed", str(first), "--count", str(n), "--json", part]
        if args.deadline is not None:
            cmd += ["--deadline", repr(args.deadline)]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), part, log))
    results = []
    for proc, part, log in procs:
        proc.wait()
        log.close()
        if not os.path.exists(part):
            print(f"worker {part} wrote no results (exit {proc.returncode}); see its .log", flush=True)
            continue
        for row in json.load(open(part)):
            r = Result(row["seed"], Outcome(**row["engine"]), Outcome(**row["torch"]) if row["torch"] else None,
                       row["repro"], row["shrunk_source"], Outcome(**row["shrunk"]) if row["shrunk"] else None,
                       extra={k: v for k, v in row.items() if k not in _RESULT_KEYS})
            results.append(r)
    return results


_RESULT_KEYS = {"seed", "engine", "torch", "shrunk", "repro", "shrunk_source", "discarded"}
