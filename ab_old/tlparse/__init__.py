"""tlparse: a TORCH_TRACE directory or log file -> a static HTML (or plain-text) report.

Reads PyTorch's structured-trace format (ours and PyTorch's own) as a stream:

    import tlparse
    tlparse.build_report(["/tmp/trace/dedicated_log_torch_trace_x.log"], "/tmp/report")

or from the shell: `tlparse /tmp/trace -o /tmp/report --no-browser`.
Depends only on the trace format, never on the compiler.
"""

__version__ = "0.1.0"


def build_report(paths, out, plain=False, all_ranks=False):
    """Write the report of `paths` (log files) into `out`; returns the Collector (one log)
    or the per-rank summaries (`all_ranks`, or several logs)."""
    from .report import Options, render_log

    opts = Options(plain=plain, command=f"tlparse.build_report({list(paths)!r}, {out!r})")
    if all_ranks or len(paths) > 1:
        from .ranks import render_ranks
        return render_ranks(list(paths), out, opts)
    return render_log(list(paths), out, opts)


__all__ = ["build_report", "__version__"]
