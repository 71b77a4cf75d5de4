"""The tlparse command line and its streaming reader: bad lines are counted and listed
(fatal only with --strict), a truncated last line is fine, the log is never read whole."""

import glob
import io
import json
import os
import shutil
import time
import tracemalloc

import pytest

from tlparse.cli import main
from tlparse.reader import read_records

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "fixtures", "torch-traces")
needs_fixtures = pytest.mark.skipif(not os.path.isdir(FIXTURES), reason="PyTorch trace fixtures not present")

GOOD = ('V1122 02:08:22.133000 8673 torch/_dynamo/convert_frame.py:303] {"dynamo_start": {"stack": '
        '[{"line": 4, "name": "f", "filename": "/u/f.py"}]}, "frame_id": 0, "frame_compile_id": 0, "attempt": 0}\n'
        'V1122 02:08:22.194000 8673 torch/_dynamo/output_graph.py:2841] {"dynamo_output_graph": {}, '
        '"frame_id": 0, "frame_compile_id": 0, "attempt": 0, "has_payload": "x"}\n'
        '\tdef forward(self, x):\n\t    return (x,)\n')


def write(tmp_path, text, name="dedicated_log_torch_trace_abc.log"):
    d = tmp_path / "trace"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    return d / name


def test_bad_and_truncated_lines_are_counted_and_listed(tmp_path, capsys):
    log = write(tmp_path, GOOD + "this is not a trace line\n" + GOOD
                + 'V1122 02:08:23.000000 8673 x.py:1] {"compilation_metrics": {"co_na')  # cut off mid-line
    out = tmp_path / "out"
    assert main([str(log), "-o", str(out), "--no-browser"]) == 0
    index = (out / "index.html").read_text()
    section = index.split('id="unparsed"')[1]
    assert "Unparsed lines: 2" in section
    assert "<td class=num>5</td>" in section and "this is not a trace line" in section      # line numbers
    assert "<td class=num>10</td>" in section and "invalid JSON" in section
    assert "2 line(s) could not be parsed" in index
    assert "2 unparsed line(s)" in capsys.readouterr().err
    # the good parts are all there
    assert (out / "compiles" / "0_0.html").exists()
    raw = [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]
    assert [r["tlparse"]["line"] for r in raw if "unparsed" in r["tlparse"]] == [5, 10]


def test_strict_fails_on_unparsed_lines_but_still_writes_the_report(tmp_path):
    log = write(tmp_path, GOOD + "garbage\n")
    assert main([str(log), "-o", str(tmp_path / "a"), "--no-browser", "--strict"]) == 1
    assert (tmp_path / "a" / "index.html").exists()
    clean = write(tmp_path, GOOD, name="clean.log")
    assert main([str(clean), "-o", str(tmp_path / "b"), "--no-browser", "--strict"]) == 0


def test_payload_md5_mismatch_is_reported(tmp_path):
    out = tmp_path / "out"
    assert main([str(write(tmp_path, GOOD)), "-o", str(out), "--no-browser"]) == 0
    assert "do not match their has_payload md5" in (out / "index.html").read_text()


def test_output_directory_needs_overwrite(tmp_path, capsys):
    log = write(tmp_path, GOOD)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    assert main([str(log), "-o", str(out), "--no-browser"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([str(log), "-o", str(out), "--no-browser", "--overwrite"]) == 0
    assert not (out / "old.txt").exists() and (out / "index.html").exists()


def test_latest_picks_the_newest_log(tmp_path):
    old = write(tmp_path, GOOD, "dedicated_log_torch_trace_old.log")
    new = write(tmp_path, GOOD.replace('"name": "f"', '"name": "newest_fn"'), "dedicated_log_torch_trace_new.log")
    now = time.time()
    os.utime(old, (now - 100, now - 100))
    os.utime(new, (now, now))
    out = tmp_path / "out"
    assert main([str(tmp_path / "trace"), "--latest", "-o", str(out), "--no-browser"]) == 0
    assert "newest_fn" in (out / "index.html").read_text()
    assert not (out / "rank_0").exists()


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "-o", str(tmp_path / "o"), "--no-browser"]) == 2
    assert "no such file or directory" in capsys.readouterr().err


@needs_fixtures
def test_reader_gives_the_same_records_at_any_chunk_size():
    path = glob.glob(f"{FIXTURES}/inductor/*.log")[0]
    data = open(path, "rb").read()
    whole = [(r.lineno, r.envelope, r.payload) for r in read_records(io.BytesIO(data), chunk=len(data) + 1)]
    assert len(whole) == 393 and whole[-1][0] <= data.count(b"\n")
    for chunk in (7, 1000, 65536):
        assert [(r.lineno, r.envelope, r.payload) for r in read_records(io.BytesIO(data), chunk=chunk)] == whole


@needs_fixtures
def test_reader_memory_stays_flat(tmp_path):
    """20 MB of log through a 256 KB window: the reader's peak allocation stays near the window."""
    path = glob.glob(f"{FIXTURES}/inductor/*.log")[0]
    big = tmp_path / "big.log"
    with open(big, "wb") as f:
        chunk = open(path, "rb").read()
        for _ in range(20):
            f.write(chunk)
    tracemalloc.start()
    try:
        with open(big, "rb") as f:
            n = sum(1 for _ in read_records(f, chunk=256 << 10))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 393 * 20
    assert peak < 4 << 20, peak


@needs_fixtures
def test_directory_of_several_logs_is_reported_per_rank(tmp_path):
    d = tmp_path / "trace"
    d.mkdir()
    for f in glob.glob(f"{FIXTURES}/two_ranks/*.log"):
        shutil.copy(f, d)
    out = tmp_path / "out"
    assert main([str(d), "-o", str(out), "--no-browser"]) == 0
    assert (out / "rank_0" / "index.html").exists() and (out / "rank_1" / "index.html").exists()
    assert "Ranks diverge" in (out / "index.html").read_text()


def test_compiled_autograd_ids_get_their_own_pages(tmp_path):
    line = ('V1122 02:08:22.133000 1 x.py:1] {"dynamo_start": {"stack": [{"line": 3, "name": "bwd", '
            '"filename": "/u/f.py"}]}, "compiled_autograd_id": 0, "frame_id": 1, "frame_compile_id": 0, "attempt": 0}\n')
    out = tmp_path / "out"
    assert main([str(write(tmp_path, line)), "-o", str(out), "--no-browser"]) == 0
    assert "[!0/1/0]" in (out / "compiles" / "ca0_1_0.html").read_text()
    assert "[!0/1/0]" in (out / "index.html").read_text()
