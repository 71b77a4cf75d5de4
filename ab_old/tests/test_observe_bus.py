"""The log bus: events carry the compile id and stage from context, payloads are built
lazily, and a failing sink never breaks the program."""

import observe
from observe import bus


def collect(**kw):
    seen = []
    fn = observe.subscribe(seen.append, **kw)
    return seen, fn


def test_event_carries_compile_id_and_stage():
    seen, fn = collect(events=["dynamo_start"])
    try:
        with observe.compile_context(observe.CompileId(2, 1, 1)), observe.stage("dynamo"):
            observe.emit("dynamo_start", {"stack": []})
    finally:
        observe.unsubscribe(fn)
    (event,) = seen
    assert str(event.compile_id) == "2/1_1"
    assert event.stage == "dynamo"
    assert observe.current_compile_id() is None


def test_payload_is_built_only_when_asked_and_only_once():
    calls = []

    def payload():
        calls.append(1)
        return "graph text"

    observe.emit("dynamo_output_graph", {}, payload)  # nobody listens
    assert calls == []
    seen, fn = collect(events=["dynamo_output_graph"])
    try:
        observe.emit("dynamo_output_graph", {}, payload)
    finally:
        observe.unsubscribe(fn)
    assert calls == []  # delivered, but not formatted until read
    assert seen[0].payload() == "graph text" and seen[0].payload() == "graph text"
    assert calls == [1]


def test_payload_that_is_not_text_or_raises_is_rendered_not_raised():
    seen, fn = collect(events=["x"])
    try:
        observe.emit("x", {}, lambda: {"a": 1})
        observe.emit("x", {}, lambda: 1 / 0)
    finally:
        observe.unsubscribe(fn)
    assert seen[0].payload() == "{'a': 1}"
    assert "ZeroDivisionError" in seen[1].payload()


def test_sink_failure_is_reported_and_other_sinks_still_run(capsys):
    good = []

    def broken(event):
        raise RuntimeError("sink bug")

    observe.subscribe(broken, events=["e"])
    observe.subscribe(good.append, events=["e"])
    try:
        observe.emit("e", {})
    finally:
        observe.unsubscribe(broken)
        observe.unsubscribe(good.append)
    assert len(good) == 1
    assert "sink bug" in capsys.readouterr().err


def test_subscription_by_log_name_and_wildcard():
    by_log, f1 = collect(logs=["graph_breaks"])
    every, f2 = collect()
    try:
        observe.emit("artifact", {"name": "dynamo_graph_break_reason"}, log="graph_breaks")
        observe.emit("other", {})
    finally:
        observe.unsubscribe(f1)
        observe.unsubscribe(f2)
    assert [e.name for e in by_log] == ["artifact"]
    assert [e.name for e in every] == ["artifact", "other"]


def test_stage_reports_duration_and_failure():
    seen, fn = collect(events=["stage_end"])
    try:
        with observe.stage("ok_stage"):
            pass
        try:
            with observe.stage("bad_stage"):
                raise ValueError
        except ValueError:
            pass
    finally:
        observe.unsubscribe(fn)
    assert [(e.metadata["name"], e.metadata["ok"]) for e in seen] == [("ok_stage", True), ("bad_stage", False)]
    assert all(e.metadata["duration_ns"] >= 0 for e in seen)


def test_no_subscriber_means_nothing_is_left_behind():
    assert not bus.enabled("never_subscribed")
    observe.log("dynamo", 10, "%s", object())  # must not format or fail
