"""A wall-clock limit for test harnesses (the zoo, the OpInfo sweep): one model or op that
hangs ends with an error instead of stopping the run."""

import contextlib
import signal


class TimeLimit(BaseException):
    """Not an Exception: no `except Exception` in the engine, torch or the model swallows it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise TimeLimit in the main thread after `seconds` (0: no limit)."""
    if not seconds or seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise TimeLimit(f"timed out after {seconds:g}s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
