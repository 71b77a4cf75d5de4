"""Build a large TORCH_TRACE log (hundreds of MB) from the real PyTorch fixtures.

    python tests/bench/make_big_trace.py --mb 200 -o /tmp/tlparse_bench/big.log

The single-process fixtures are appended round after round; each round shifts frame ids
(envelope, compilation_metrics.compile_id) and string-table indexes so that every compile
stays distinct, as in one long training job. Payloads are copied unchanged, so their
`has_payload` md5s stay valid. The result goes to /tmp, never into the repository.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "shared", "fixtures", "torch-traces")
CASES = ["graph_breaks", "recompiles", "dynamic", "inductor", "compile_error"]


def _shift_stack(stack, str_offset):
    if isinstance(stack, list):
        for frame in stack:
            if isinstance(frame, dict) and isinstance(frame.get("filename"), int):
                frame["filename"] += str_offset


def _rewrite(envelope: dict, frame_offset: int, str_offset: int) -> dict:
    if "str" in envelope:
        name, index = envelope["str"]
        envelope["str"] = [name, index + str_offset]
        return envelope
    if isinstance(envelope.get("frame_id"), int):
        envelope["frame_id"] += frame_offset
    for value in envelope.values():
        if isinstance(value, dict):
            for key in ("stack", "user_stack", "frame_stack"):
                _shift_stack(value.get(key), str_offset)
    metrics = envelope.get("compilation_metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("compile_id"), str):
        frame, _, rest = metrics["compile_id"].partition("/")
        if frame.isdigit():
            metrics["compile_id"] = f"{int(frame) + frame_offset}/{rest}"
    return envelope


def _load(path):
    """(prefix, envelope, payload lines) per event of one fixture."""
    events = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("\t"):
                events[-1][2].append(line)
                continue
            prefix, _, body = line.partition("] ")
            events.append((prefix, json.loads(body), []))
    return events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0)
    ap.add_argument("-o", "--output", default="/tmp/tlparse_bench/big.log")
    args = ap.parse_args()
    cases = []
    for case in CASES:
        (path,) = glob.glob(f"{FIXTURES}/{case}/*.log")
        events = _load(path)
        frames = max((e[1]["frame_id"] for e in events if isinstance(e[1].get("frame_id"), int)), default=0) + 1
        strings = max((e[1]["str"][1] for e in events if "str" in e[1]), default=-1) + 1
        cases.append((events, frames, strings))
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    target = int(args.mb * 1024 * 1024)
    frame_offset = str_offset = written = rounds = 0
    with open(args.output, "w", encoding="utf-8") as out:
        while written < target:
            for events, frames, strings in cases:
                for prefix, envelope, payload in events:
                    if rounds and "artifact" in envelope and envelope["artifact"].get("name") == "torch_version":
                        continue  # one version header per file, as a real log has
                    env = _rewrite(json.loads(json.dumps(envelope)), frame_offset, str_offset)
                    text = prefix + "] " + json.dumps(env) + "\n" + "".join(payload)
                    out.write(text)
                    written += len(text)
                frame_offset += frames
                str_offset += strings
            rounds += 1
    print(f"wrote {args.output}: {written / 2**20:.0f} MiB, {rounds} rounds, {frame_offset} frames")


if __name__ == "__main__":
    main()
