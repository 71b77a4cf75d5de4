"""How explain()'s output prints: PyTorch's layout (Graph Count, Graph Break Count, Op
Count, Break Reasons with user frames, Ops per Graph, Out Guards), plain when piped and
styled by rich on a terminal."""

import dataclasses
import io
import operator
import traceback

import torch

from engine.debug import explain_render


@dataclasses.dataclass
class BreakReason:
    reason: str
    user_stack: list
    graph_break_id: str = ""
    hint: str = ""


@dataclasses.dataclass
class Output:
    graphs: list
    graph_count: int
    graph_break_count: int
    break_reasons: list
    op_count: int
    ops_per_graph: list = None
    out_guards: list = None
    compile_times: str = None


def toy_output():
    return Output(
        graphs=[None, None, None], graph_count=3, graph_break_count=2, op_count=5,
        break_reasons=[
            BreakReason("Call to a builtin that cannot be traced: print",
                        [traceback.FrameSummary("foo.py", 5, "toy_example")], "GB0001",
                        "Move the call out of the compiled function"),
            BreakReason("Data-dependent control flow on a tensor value",
                        [{"filename": "foo.py", "line": 6, "name": "resume_in_toy_example_at_5"}], "GB0003"),
        ],
        ops_per_graph=[[torch.abs, operator.add, operator.truediv], [operator.lt], [operator.mul]],
        out_guards=["TENSOR_MATCH: L['a'] f32[10]", "TENSOR_MATCH: L['b'] f32[10]"],
    )


EXPECTED_HEAD = """\
Graph Count: 3
Graph Break Count: 2
Op Count: 5
Break Reasons:
  Break Reason 1:
    Reason: Call to a builtin that cannot be traced: print
    Registry Id: GB0001
    Hint: Move the call out of the compiled function
    User Stack:
      <FrameSummary file foo.py, line 5 in toy_example>
  Break Reason 2:
    Reason: Data-dependent control flow on a tensor value
    Registry Id: GB0003
    User Stack:
      <FrameSummary file foo.py, line 6 in resume_in_toy_example_at_5>
Ops per Graph:
  Ops 1:
    <built-in method abs of type object at """


def test_plain_text_reads_like_pytorchs():
    text = explain_render.render(toy_output(), color=False)
    assert text.startswith(EXPECTED_HEAD)
    assert "  Ops 3:\n    <built-in function mul>\n" in text
    assert text.endswith("Out Guards:\n  Guard 1:\n    TENSOR_MATCH: L['a'] f32[10]\n"
                         "  Guard 2:\n    TENSOR_MATCH: L['b'] f32[10]\n")


def test_optional_sections_are_left_out_when_absent():
    out = Output(graphs=[], graph_count=1, graph_break_count=0, break_reasons=[], op_count=1,
                 compile_times="entire_frame_compile 0.0123")
    assert explain_render.render(out, color=False) == (
        "Graph Count: 1\nGraph Break Count: 0\nOp Count: 1\nBreak Reasons:\n"
        "Compile Times: entire_frame_compile 0.0123\n")


def test_terminal_output_is_styled_with_the_same_lines():
    styled = explain_render.render(toy_output(), color=True)
    assert "\x1b[" in styled
    import re

    unstyled = re.sub(r"\x1b\[[0-9;]*m", "", styled)
    assert unstyled == explain_render.render(toy_output(), color=False)


def test_print_to_a_pipe_is_plain():
    buf = io.StringIO()
    explain_render.print_explain(toy_output(), file=buf)
    assert buf.getvalue().startswith("Graph Count: 3\n") and "\x1b[" not in buf.getvalue()


def test_engine_explain_output_renders_with_user_frames_and_source(capsys):
    import engine

    def toy_example(a, b):
        x = a / (torch.abs(a) + 1)
        print("woo")
        if b.sum() < 0:
            b = b * -1
        return x * b

    engine.reset()
    out = engine.explain(toy_example)(torch.randn(10), torch.randn(10))
    text = explain_render.render(out, color=False)
    line = toy_example.__code__.co_firstlineno
    assert text.startswith("Graph Count: 3\nGraph Break Count: 2\n")
    assert f"      <FrameSummary file {__file__}, line {line + 2} in toy_example>\n        print(\"woo\")\n" in text
    assert "    Registry Id: GB0003\n" in text
    assert "  Guard 1:\n" in text and "Compile Times: TorchDynamo compilation metrics:" in text
