"""The logs sink: `TORCH_LOGS` / `set_logs()` choose which channels and artifacts are
printed; events reach Python `logging` under `engine.<name>` loggers."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Optional, Union

from . import bus, registry

ROOT_LOGGER = "engine"
_DEBUG, _INFO, _ERROR = logging.DEBUG, logging.INFO, logging.ERROR


class Formatter(logging.Formatter):
    """glog-style prefix like PyTorch's: `I1122 02:08:22.184000 8673 dynamo] [0/0] msg`,
    with the artifact name in brackets (`[__graph_breaks]`). Multi-line messages keep
    the prefix on their first line only."""

    def format(self, record: logging.LogRecord) -> str:
        t = record.created
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1e6):06d}"
        prefix = f"{record.levelname[0]}{stamp} {record.process} {getattr(record, 'stage', None) or record.name}]"
        cid = getattr(record, "compile_id", None)
        if cid is not None:
            prefix += f" [{cid}]"
        artifact = getattr(record, "artifact", None)
        if artifact:
            prefix += f" [__{artifact}]"
        return f"{prefix} {record.getMessage()}"


class LogsSink:
    """Holds the chosen levels and is subscribed only to what is switched on."""

    def __init__(self) -> None:
        self.levels: dict[str, int] = {}
        self.handler: Optional[logging.Handler] = None

    def configure(self, levels: dict[str, int]) -> None:
        self.levels = dict(levels)
        bus.unsubscribe(self.on_event)
        if self.levels:
            bus.subscribe(self.on_event, logs=self.levels)
            self._install_handler()
        for name in registry.TABLE:
            logger = logging.getLogger(_logger_name(name))
            logger.setLevel(self.levels.get(name, logging.WARNING))

    def _install_handler(self) -> None:
        root = logging.getLogger(ROOT_LOGGER)
        if self.handler is None:
            self.handler = logging.StreamHandler(sys.stderr)
            self.handler.setFormatter(Formatter())
        if self.handler not in root.handlers:
            root.addHandler(self.handler)
        root.propagate = False
        root.setLevel(logging.DEBUG)

    def on_event(self, event: bus.Event) -> None:
        name = event.log
        if name is None or event.level < self.levels.get(name, 100):
            return
        entry = registry.TABLE[name]
        if event.name == "log":
            md = event.metadata
            text = md["msg"] % md["args"] if md["args"] else md["msg"]
        else:
            title = event.metadata.get("title")
            body = event.payload()
            text = "\n".join(part for part in (title, body) if part) or event.name
        logging.getLogger(_logger_name(name)).log(
            event.level if event.level >= _DEBUG else _DEBUG,
            "%s",
            text,
            extra={
                "compile_id": event.compile_id,
                "stage": event.stage,
                "artifact": name if entry.kind == "artifact" else None,
            },
        )


def _logger_name(name: str) -> str:
    entry = registry.TABLE[name]
    return f"{ROOT_LOGGER}.{name}" if entry.kind == "channel" else f"{ROOT_LOGGER}.__{name}"


SINK = LogsSink()


def parse(spec: str) -> tuple[dict[str, int], list[str]]:
    """`"+dynamo,graph_breaks,-aot"` -> ({name: level}, [unknown names]).
    `name` is INFO, `+name` DEBUG, `-name` ERROR (and switches an artifact off)."""
    levels: dict[str, int] = {}
    unknown: list[str] = []
    for raw in spec.replace(" ", ",").split(","):
        item = raw.strip()
        if not item:
            continue
        sign = item[0] if item[0] in "+-" else ""
        name = item[1:] if sign else item
        level = {"+": _DEBUG, "-": _ERROR, "": _INFO}[sign]
        if name == "all":
            for entry in registry.TABLE.values():
                if entry.kind == "channel":
                    levels[entry.name] = level
                elif not entry.off_by_default:
                    if sign == "-":
                        levels.pop(entry.name, None)
                    else:
                        levels[entry.name] = _INFO
            continue
        entry = registry.lookup(name)
        if entry is None:
            unknown.append(item)
            continue
        if entry.kind == "channel":
            levels[entry.name] = level
        elif sign == "-":
            levels.pop(entry.name, None)
        else:
            levels[entry.name] = _INFO
    return _with_debug_artifacts(levels), unknown


def _with_debug_artifacts(levels: dict[str, int]) -> dict[str, int]:
    """A channel at DEBUG also shows its artifacts (`+dynamo` shows graph breaks)."""
    out = dict(levels)
    for entry in registry.ARTIFACTS:
        if entry.channel and levels.get(entry.channel, 100) <= _DEBUG and not entry.off_by_default:
            out.setdefault(entry.name, _INFO)
    return out


def unknown_names_message(unknown: list[str]) -> str:
    return (
        f"observe: ignoring unknown TORCH_LOGS name(s) {', '.join(repr(u) for u in unknown)}.\n"
        f"  Valid names (prefix + for DEBUG, - for ERROR): {', '.join(registry.valid_names())}\n"
        "  See docs/logging.md for what each shows."
    )


def set_logs(**settings: Union[bool, int, None]) -> None:
    """Programmatic TORCH_LOGS: `set_logs(graph_breaks=True, dynamo=logging.DEBUG)`.
    Channels take a logging level (or True for INFO); artifacts take True/False.
    `set_logs()` with no arguments switches everything off. Unknown names raise
    ValueError listing the valid ones (in code, a typo should stop you)."""
    levels: dict[str, int] = {}
    for key, value in settings.items():
        if value is None or value is False:
            continue
        if key == "all":
            level = _INFO if value is True else int(value)
            spec_levels, _ = parse(("+all" if level <= _DEBUG else "all"))
            levels.update(spec_levels)
            continue
        entry = registry.lookup(key)
        if entry is None:
            raise ValueError(unknown_names_message([key]))
        if entry.kind == "channel":
            levels[entry.name] = _INFO if value is True else int(value)
        else:
            levels[entry.name] = _INFO
    SINK.configure(_with_debug_artifacts(levels))


def configure_from_env() -> None:
    spec = os.environ.get("TORCH_LOGS", "")
    if not spec.strip():
        return
    levels, unknown = parse(spec)
    if unknown:
        print(unknown_names_message(unknown), file=sys.stderr)
    SINK.configure(levels)
