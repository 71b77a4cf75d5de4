"""Cost of one bus event: with no sink, with the logs sink on but filtering the event out,
and with the trace sink writing it. Prints nanoseconds per event.

    python tests/bench/bench_bus.py
"""

import logging
import tempfile
import time

import observe
from observe import trace


def per_event_ns(fn, n=200_000):
    fn()
    start = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - start) / n


def emit_graph():
    observe.emit("dynamo_output_graph", {"sizes": {}}, lambda: "def forward(self): ...", log="graph_code")


def emit_debug_line():
    observe.log("dynamo", logging.DEBUG, "tracing %s", "fn")


def main():
    rows = []
    rows.append(("no sink: emit", per_event_ns(emit_graph)))
    rows.append(("no sink: log line", per_event_ns(emit_debug_line)))
    observe.set_logs(dynamo=logging.INFO)  # subscribed to `dynamo`, but DEBUG lines are filtered out
    rows.append(("logs sink filtering it out: log line", per_event_ns(emit_debug_line)))
    rows.append(("logs sink, other channel: emit", per_event_ns(emit_graph)))
    observe.set_logs()
    with tempfile.TemporaryDirectory() as d:
        trace.start(d)
        rows.append(("trace sink writing it: emit", per_event_ns(emit_graph, n=20_000)))
        trace.stop()
    width = max(len(name) for name, _ in rows)
    for name, ns in rows:
        print(f"{name:<{width}}  {ns:9.1f} ns/event")


if __name__ == "__main__":
    main()
