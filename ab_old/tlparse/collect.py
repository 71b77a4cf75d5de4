"""One pass over a log: write each payload out as it arrives (artifact pages, timeline,
raw.jsonl, search shards) and keep only the small per-compile summaries in memory."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import BinaryIO, Optional

from . import interpret
from . import pictures
from .templating import render
from .writer import FileWriter
from .provenance import ProvenanceIndex
from .cache_report import CacheIndex
from .replay import ReplayIndex
from .model import Artifact, BreakGroup, Compile, CompileKey, Unparsed, compile_label, compile_slug
from .reader import Record, decode_json, read_records

# Envelope keys that are not the event's name.
ID_KEYS = frozenset({"frame_id", "frame_compile_id", "attempt", "compiled_autograd_id", "has_payload", "rank"})
KNOWN = frozenset({
    "str", "chromium_event", "artifact", "dynamo_start", "dynamo_output_graph", "dynamo_cpp_guards_str",
    "compilation_metrics", "bwd_compilation_metrics", "aot_joint_graph", "aot_forward_graph",
    "aot_backward_graph", "aot_inference_graph", "inductor_output_code", "describe_storage",
    "describe_tensor", "describe_source", "create_symbol", "guard_added_fast", "guard_added",
    "symbolic_shape_specialization", "propagate_real_tensors", "optimize_ddp_split_graph",
    "optimize_ddp_split_child", "compiled_autograd_graph", "dynamo_guards", "graph_break", "kernel_code",
    "link", "dump_file", "missing_fake_kernel", "mismatched_fake_kernel", "exported_program",
    "inductor_post_grad_graph", "inductor_pre_grad_graph", "cache_hit", "cache_miss", "compile_declined",
})
EVENTS_PER_COMPILE = 300          # metadata-only events listed on a compile page; the rest in raw.jsonl
UNPARSED_KEPT = 1000              # unparsable lines listed (all are counted)
SEARCH_CODE_PER_ARTIFACT = 200_000
SEARCH_CODE_TOTAL = 32 << 20
SHARD_BYTES = 2 << 20
METRIC_DROP = ("dynamo_config", "inductor_config")
# compilation_metrics fields kept in memory (the front page and the status need them); the
# whole record goes to the spool and onto the compile page
KEPT_METRICS = ("entire_frame_compile_time_s", "backend_compile_time_s", "inductor_compile_time_s",
                "code_gen_time_s", "dynamo_time_before_restart_s", "guard_count", "shape_env_guard_count",
                "graph_op_count", "graph_node_count", "graph_input_count", "cache_size", "accumulated_cache_size",
                "has_guarded_code", "fail_type")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_VOLATILE_METRIC = re.compile(r"(_s$|_us$|_ms$|_ns$|time|duration|overhead|start)")
_ADDRESS = re.compile(rb"0x[0-9a-fA-F]{6,}")
_UUID = re.compile(rb"[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}")


def artifact_lang(name: str, text: str, encoding: Optional[str] = None) -> str:
    """Which highlighter suits a payload."""
    low = name.lower()
    if "bytecode" in low:
        return "bytecode"
    if "guard" in low:
        return "guards"
    if encoding == "json" or low.endswith("metrics") or low in ("chromium_event", "torch_version"):
        return "json"
    head = text[:4000]
    if "kernel" not in low and any(w in low for w in (
            "graph", "output_code", "runnable", "wrapper", "prologue", "epilogue", "compiled_fn",
            "compiled_function")):
        return "python"   # inductor's output code is Python, even with C++ kernels in strings
    if "#include" in head and not re.search(r"^(def|import|from|class) ", head, re.M):
        return "cpp"
    if "kernel" in low or "code" in low or head.startswith(("class ", "def ", "import ", "from ")) or "\ndef " in head:
        return "python"
    return "text"


class SearchWriter:
    """The search index as JS shards (`TL_SEARCH.add([...])`) written as we go; identical
    code is indexed once (entries for copies point at the first by id)."""

    def __init__(self, root: str) -> None:
        self.dir = os.path.join(root, "search")
        os.makedirs(self.dir, exist_ok=True)
        self.pending: list = []
        self.pending_bytes = 0
        self.shards = 0
        self.code_bytes = 0
        self.truncated = False
        self.seen: dict[str, int] = {}
        self.next_id = 0

    def add(self, kind: str, title: str, url: str, text: str) -> None:
        self._push({"k": kind, "t": title, "u": url, "x": text}, len(text) + len(title) + 60)

    def add_code(self, title: str, url: str, text: str, md5: str) -> None:
        same = self.seen.get(md5)
        if same is not None:
            self._push({"k": "code", "t": title, "u": url, "same": same}, len(title) + 60)
            return
        if self.code_bytes >= SEARCH_CODE_TOTAL:
            self.truncated = True
            self._push({"k": "code", "t": title, "u": url, "x": ""}, len(title) + 60)
            return
        if len(text) > SEARCH_CODE_PER_ARTIFACT:
            text = text[:SEARCH_CODE_PER_ARTIFACT]
            self.truncated = True
        self.code_bytes += len(text)
        self.seen[md5] = self.next_id
        self._push({"k": "code", "t": title, "u": url, "x": text, "id": self.next_id}, len(text) + len(title) + 60)
        self.next_id += 1

    def _push(self, entry: dict, size: int) -> None:
        self.pending.append(entry)
        self.pending_bytes += size
        if self.pending_bytes >= SHARD_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        with open(os.path.join(self.dir, f"shard_{self.shards}.js"), "w", encoding="utf-8") as f:
            f.write("TL_SEARCH.add(")
            f.write(json.dumps(self.pending, ensure_ascii=False, separators=(",", ":")))
            f.write(");\n")
        self.shards += 1
        self.pending, self.pending_bytes = [], 0


class Collector:
    """Feed it records (`consume`); it writes artifacts under `root` and keeps summaries."""

    def __init__(self, root: str, plain: bool = False, search: Optional[SearchWriter] = None,
                 timeline: Optional[BinaryIO] = None, raw: Optional[BinaryIO] = None,
                 rank: Optional[int] = None) -> None:
        self.root = root
        # Page fragments that only the compile pages need (all metrics fields, other events)
        # wait here on disk, not in memory, until the pages are written.
        self._spool_path = os.path.join(root, ".tlparse-spool")
        self._spool = open(self._spool_path, "w+b")
        self._spool_end = 0
        self._spool_dirty = False
        self.files = FileWriter()
        self.plain = plain
        self.search = search
        self.timeline = timeline
        self.timeline_count = 0
        self.raw = raw
        self.rank = rank
        self.compiles: dict[CompileKey, Compile] = {}
        self.strings: dict[int, str] = {}
        self.breaks: dict[tuple, BreakGroup] = {}
        self.unparsed: list[Unparsed] = []
        self.unparsed_count = 0
        self.md5_mismatch: list[int] = []
        self.md5_mismatch_count = 0
        self.counts: dict[str, int] = {}
        self.unknown: dict[str, int] = {}
        self.records = 0
        self.versions: dict = {}
        self.config: dict[str, str] = {}          # name -> url of a config artifact
        self.dynamo_config: Optional[str] = None
        self.dynamo_configs: list = []            # (compile label, url) of each distinct dynamo_config, in order
        self.config_pages: dict[str, str] = {}    # md5 of a config text -> its page
        self.pending_recompile: list = []
        self.ranks_seen: set = set()
        self.artifact_no = 0
        self._chromium_stacks: dict = {}
        self.first_ts: Optional[str] = None
        self.graph_shapes: dict = {}              # compile key -> pictures.GraphShape of its captured graph
        self._shape_cache: dict = {}              # md5 of a graph's text -> its GraphShape (or None)
        self.kernel_of: dict = {}                 # compile key -> {fx node name: kernel it was fused into}
        self.stage_depth: dict[str, int] = {}     # stage name -> least nesting seen (0: outermost)
        self.cache = CacheIndex()                # kernel_cache_{hit,miss,bypass} artifacts
        self.replays = ReplayIndex()             # replay_record artifacts (engine.debug.replay)
        self.provenance = ProvenanceIndex()      # kernel_provenance artifacts: kernels <-> user lines
        self.declined: list = []                 # (function, file, line, reason) engine.compile ran eagerly

    # ---- the pass
    def consume_stream(self, stream: BinaryIO, chunk: Optional[int] = None) -> None:
        for record in (read_records(stream, chunk) if chunk else read_records(stream)):
            self.consume(record)

    def consume(self, r: Record) -> None:
        self.records += 1
        env = r.envelope
        if env is None:
            self.unparsed_count += 1
            if len(self.unparsed) < UNPARSED_KEPT:
                self.unparsed.append(Unparsed(r.lineno, r.error or "unparsable",
                                              r.raw[:300].decode("utf-8", "replace")))
            self._raw(r, None, unparsed=True)
            return
        if "str" in env and len(env) == 1:
            try:
                name, index = env["str"]
                self.strings[int(index)] = str(name)
            except (TypeError, ValueError):
                self._note_unparsed(r, "malformed string-table entry")
            self._raw(r, None)
            return
        kind = next((k for k in env if k not in ID_KEYS), None)
        if kind is None:
            kind = "(no event key)"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind not in KNOWN:
            self.unknown[kind] = self.unknown.get(kind, 0) + 1
        if "rank" in env:
            self.ranks_seen.add(env["rank"])
        payload = r.payload
        md5 = env.get("has_payload")
        if payload is not None and isinstance(md5, str):
            if hashlib.md5(payload).hexdigest() != md5:
                self.md5_mismatch_count += 1
                if len(self.md5_mismatch) < 100:
                    self.md5_mismatch.append(r.lineno)
        key = _compile_key(env)
        comp = self._compile(key)
        attempt = env.get("attempt") if isinstance(env.get("attempt"), int) else 0
        comp.attempts.add(attempt)
        meta = env.get(kind)

        if kind == "chromium_event":
            self._chromium(comp, payload, meta)
            self._raw(r, None)
            return
        if kind == "dynamo_start" and self.pending_recompile and key != (None, None, None):
            comp.recompile.extend(self.pending_recompile)  # reasons logged just before this compile began
            self.pending_recompile = []
        if kind == "dynamo_start" and isinstance(meta, dict):
            comp.stack = [f for f in (interpret.format_frame(fr, self.strings) for fr in meta.get("stack") or [])
                          if f]
        elif kind in ("compilation_metrics", "bwd_compilation_metrics") and isinstance(meta, dict):
            url = self._metrics(comp, kind, meta, attempt, r.lineno)
            self._raw(r, url)
            return
        elif kind == "compile_declined" and isinstance(meta, dict):   # engine.compile(f) that runs eagerly
            entry = (str(meta.get("function")), str(meta.get("filename")), meta.get("line"), str(meta.get("reason")))
            if entry not in self.declined:
                self.declined.append(entry)
        elif kind == "graph_break":
            self._add_break(comp, interpret.break_from_event(meta, self.strings))
        elif kind == "dynamo_output_graph":
            comp.has_graph = True
            comp.graph_md5 = md5 if isinstance(md5, str) else (
                hashlib.md5(payload).hexdigest() if payload is not None else None)

        url = None
        if payload is not None:
            name = kind
            encoding = None
            if kind == "artifact" and isinstance(meta, dict):
                name = str(meta.get("name") or "artifact")
                encoding = meta.get("encoding")
            url = self._artifact(comp, attempt, name, payload, md5, r.lineno, encoding)
            if kind == "dynamo_output_graph":
                comp.graph_url = url
            elif kind == "inductor_output_code" and isinstance(meta, dict):
                self.provenance.note_output_code(str(meta.get("filename") or ""), url)
            if kind == "artifact":
                self._artifact_meaning(comp, name, payload, url)
        elif kind not in ("dynamo_start",):
            if len(comp.events) < EVENTS_PER_COMPILE:
                raw = r.raw if len(r.raw) <= 1500 else r.raw[:1500] + "…".encode()
                comp.events.append((attempt, sys.intern(kind), r.lineno, self.spill(raw)))
            else:
                comp.events_dropped += 1
        self._raw(r, url)

    # ---- the spool
    def spill(self, data: bytes) -> tuple[int, int]:
        self._spool.write(data)
        self._spool_dirty = True
        ref = (self._spool_end, len(data))
        self._spool_end += len(data)
        return ref

    def unspill(self, ref: Optional[tuple[int, int]]) -> str:
        if not ref:
            return ""
        if self._spool_dirty:   # one flush, then positioned reads that leave the file offset alone
            self._spool.flush()
            self._spool_dirty = False
        return os.pread(self._spool.fileno(), ref[1], ref[0]).decode("utf-8", "replace")

    def close(self) -> None:
        """Finish writing the pages and drop the spool."""
        self.files.close()
        if self._spool is not None:
            self._spool.close()
            self._spool = None
            os.remove(self._spool_path)

    # ---- pieces
    def _note_unparsed(self, r: Record, why: str) -> None:
        self.unparsed_count += 1
        if len(self.unparsed) < UNPARSED_KEPT:
            self.unparsed.append(Unparsed(r.lineno, why, r.raw[:300].decode("utf-8", "replace")))

    def _compile(self, key: CompileKey) -> Compile:
        comp = self.compiles.get(key)
        if comp is None:
            comp = self.compiles[key] = Compile(key=key, order=len(self.compiles), label=compile_label(key),
                                                slug=compile_slug(key))
        return comp

    def _raw(self, r: Record, url: Optional[str], unparsed: bool = False) -> None:
        if self.raw is None:
            return
        info = {"line": r.lineno}
        if url:
            info["payload_file"] = url
        if unparsed:
            info["unparsed"] = r.error
            info["text"] = r.raw[:2000].decode("utf-8", "replace")
            self.raw.write(json.dumps({"tlparse": info}).encode() + b"\n")
            return
        prefix = r.prefix
        if prefix.isascii() and b'"' not in prefix and b"\\" not in prefix:
            glog = b'"' + prefix + b'"'
        else:
            glog = json.dumps(prefix.decode("utf-8", "replace")).encode()
        # built by hand: json.dumps per record is a third of the raw export's cost
        head = b'{"tlparse": {"line": %d, %s"glog": %s}' % (
            r.lineno, b'"payload_file": "%s", ' % url.encode() if url else b"", glog)
        body = r.raw.strip()
        # splice our fields into the original JSON text: no re-serialisation of big envelopes
        if body == b"{}" or body[1:].lstrip()[:1] == b"}":
            self.raw.write(head + b"}\n")
        else:
            self.raw.write(head + b", " + body[1:] + b"\n")

    def _artifact(self, comp: Compile, attempt: int, name: str, payload: bytes, md5, lineno: int,
                  encoding: Optional[str], title: Optional[str] = None) -> str:
        n = self.artifact_no
        self.artifact_no += 1
        safe = _SAFE.sub("_", name)[:80] or "artifact"
        label = compile_label(comp.key, attempt)
        # One flat folder: a mkdir per compile costs more than it helps on big traces.
        if self.plain:
            rel = f"artifacts/{comp.slug}-{n}_{safe}.txt"
            self.files.submit(os.path.join(self.root, rel), mask_volatile(payload))
        else:
            rel = f"artifacts/{comp.slug}-{n}_{safe}.html"
            text = payload.decode("utf-8", "replace")
            lang = artifact_lang(name, text, encoding)
            if name in pictures.GRAPH_ARTIFACTS:
                self._graph_shape(comp, text, md5)
            self.files.submit(os.path.join(self.root, rel), render(
                "artifact.html", depth=1, title=f"{label} {title or name}", label=label, name=title or name,
                slug=comp.slug, lineno=lineno, size=len(payload), text=text, lang=lang,
                picture=name in pictures.GRAPH_ARTIFACTS))
            if self.search is not None and name not in ("torch_version",) and encoding != "json":
                self.search.add_code(f"{label} {name}", rel, text,
                                     md5 if isinstance(md5, str) else hashlib.md5(payload).hexdigest())
        comp.artifacts.append(Artifact(attempt, name, rel, len(payload), lineno, md5 if isinstance(md5, str) else None))
        return rel

    def _graph_shape(self, comp: Compile, text: str, md5) -> None:
        """Keep the graph's nodes and edges (not its text) for the picture on the compile page;
        a trace that repeats a graph parses it once."""
        digest = md5 if isinstance(md5, str) else hashlib.md5(text.encode("utf-8", "replace")).hexdigest()
        shape = self._shape_cache.get(digest, False)
        if shape is False:
            shape = self._shape_cache[digest] = pictures.parse_graph(text)
        if shape is not None:
            self.graph_shapes.setdefault(comp.key, shape)

    def _artifact_meaning(self, comp: Compile, name: str, payload: bytes, url: str) -> None:
        if name == "kernel_provenance" and not self.plain:
            try:
                value = json.loads(payload)
            except ValueError:
                value = None
            kernels = value.get("kernels") if isinstance(value, dict) else None
            fused = self.kernel_of.setdefault(comp.key, {})
            for k in kernels if isinstance(kernels, list) else []:
                if isinstance(k, dict) and isinstance(k.get("fx"), list):
                    for node in k["fx"]:
                        fused.setdefault(str(node), str(k.get("kernel") or "?"))
        if name == "dynamo_graph_break_reason":
            self._add_break(comp, interpret.parse_graph_break_text(payload.decode("utf-8", "replace")))
        elif name == "recompile_reasons":
            reasons = interpret.parse_recompile_reasons(payload.decode("utf-8", "replace"))
            if comp.key == (None, None, None):
                self.pending_recompile.extend(reasons)   # no compile id: it belongs to the next compile
            else:
                comp.recompile.extend(reasons)
        elif name == "torch_version":
            try:
                value = json.loads(payload)
                if isinstance(value, dict):
                    for k, v in value.items():
                        self.versions.setdefault(k, v)
            except ValueError:
                self.versions.setdefault("torch_version", payload[:200].decode("utf-8", "replace"))
        elif name == "kernel_provenance":
            self.provenance.add(comp.label, comp.slug, payload, url)
        elif name.startswith("kernel_cache_") and name[len("kernel_cache_"):] in ("hit", "miss", "bypass"):
            self.cache.add(comp.label, comp.slug, name[len("kernel_cache_"):], payload, url)
        elif name == "replay_record" and not self.plain:
            self.replays.add(payload, url)
        elif name in ("dynamo_error", "inductor_error", "backend_error") or name.endswith("_error"):
            comp.error_artifacts.append(url)
        if "config" in name.lower() and name not in self.config:
            self.config[name] = url

    def _add_break(self, comp: Compile, info: interpret.BreakInfo) -> None:
        # One break is often reported twice in a compile (a structured `graph_break` event
        # and the text artifact): same reason in the same compile = one break; keep the
        # report that knows the user line.
        for gk in comp.breaks:
            same_line = info.user_file is not None and gk[0] == info.user_file and gk[1] == info.user_line
            if gk[2] == info.reason or same_line:
                if gk[0] is not None or info.user_file is None:
                    self._merge(self.breaks[gk].info, info)
                    return
                old = self.breaks[gk]
                comp.breaks.remove(gk)
                old.compiles = [k for k in old.compiles if k != comp.key]
                if not old.compiles:
                    del self.breaks[gk]
                self._merge(info, old.info)
                break
        gkey = (info.user_file, info.user_line, info.reason)
        group = self.breaks.get(gkey)
        if group is None:
            group = self.breaks[gkey] = BreakGroup(info=info)
        else:
            self._merge(group.info, info)
        if comp.key not in group.compiles:
            group.compiles.append(comp.key)
        if gkey not in comp.breaks:
            comp.breaks.append(gkey)

    @staticmethod
    def _merge(into: interpret.BreakInfo, other: interpret.BreakInfo) -> None:
        for h in other.hints:
            if h not in into.hints:
                into.hints.append(h)
        into.explanation = into.explanation or other.explanation
        into.user_code = into.user_code or other.user_code
        into.break_id = into.break_id or other.break_id
        if len(other.user_stack) > len(into.user_stack):
            into.user_stack = other.user_stack

    def _metrics(self, comp: Compile, kind: str, meta: dict, attempt: int, lineno: int) -> Optional[str]:
        small = {k: v for k, v in meta.items() if k not in METRIC_DROP}
        for k in METRIC_DROP:
            # Configs are big and the same for every compile: written once, linked after.
            if isinstance(meta.get(k), str):
                digest = hashlib.md5(meta[k].encode("utf-8", "replace")).hexdigest()
                url = self.config_pages.get(digest)
                if url is None:
                    try:
                        pretty = json.dumps(json.loads(meta[k]), indent=1, sort_keys=True)
                    except ValueError:
                        pretty = meta[k]
                    title = f"{k} (first seen in {compile_label(comp.key, attempt)})"
                    url = self._artifact(self._compile((None, None, None)), 0, k, pretty.encode("utf-8"), None,
                                         lineno, "json", title=title)
                    self.config_pages[digest] = url
                    self.config.setdefault(k, url)
                    if k == "dynamo_config":
                        self.dynamo_config = self.dynamo_config or meta[k]
                        self.dynamo_configs.append((compile_label(comp.key, attempt), url))
                small[k] = f"see {url}"
        if kind != "bwd_compilation_metrics":
            comp.metrics = {k: small[k] for k in KEPT_METRICS if k in small}
            if meta.get("fail_type"):
                comp.fail_type = str(meta["fail_type"])
                comp.fail_reason = str(meta.get("fail_reason") or "")
                if meta.get("fail_user_frame_filename"):
                    comp.fail_where = f"{meta['fail_user_frame_filename']}:{meta.get('fail_user_frame_lineno')}"
            reasons = meta.get("restart_reasons") or []
            comp.restart_reasons = [str(x) for x in reasons] if isinstance(reasons, list) else [str(reasons)]
            for k in ("co_name", "co_filename", "co_firstlineno"):
                if meta.get(k) is not None:
                    setattr(comp, k, meta[k])
        shown = small
        if self.plain:  # times and start stamps differ between runs; timings.txt has them
            shown = {k: v for k, v in small.items() if not _VOLATILE_METRIC.search(k)}
        # one field a line, from one call of the C encoder (indent= would use the slow Python one)
        text = json.dumps(shown, sort_keys=True, default=str, separators=(",\n", ": ")).encode()
        if kind == "bwd_compilation_metrics":
            comp.bwd_metrics_text = self.spill(text)
        else:
            comp.metrics_text = self.spill(text)
        return f"compiles/{comp.slug}.{'txt' if self.plain else 'html'}#{kind}"

    def _chromium(self, comp: Compile, payload: Optional[bytes], meta) -> None:
        if payload is None:
            return
        try:
            ev = decode_json(payload)
        except ValueError:
            return
        if not isinstance(ev, dict):
            return
        if self.timeline is not None:
            if self.rank is not None:
                ev["pid"] = self.rank
                data = json.dumps(ev).encode()
            else:
                data = payload
            self.timeline.write((b",\n" if self.timeline_count else b"") + data)
            self.timeline_count += 1
        ph = ev.get("ph")
        name = sys.intern(str(ev.get("name")))   # a few stage names, repeated in every compile
        ts = ev.get("ts")
        if not isinstance(ts, (int, float)):
            return
        if ph == "X" and isinstance(ev.get("dur"), (int, float)):
            comp.stages[name] = comp.stages.get(name, 0.0) + ev["dur"]
            return
        stack = self._chromium_stacks.setdefault((ev.get("pid"), ev.get("tid")), [])
        if ph == "B":
            stack.append((name, ts, comp.key))
        elif ph == "E":
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == name:
                    _, start, key = stack[i]
                    del stack[i]
                    target = self.compiles.get(key, comp)
                    dur = ts - start
                    target.stages[name] = target.stages.get(name, 0.0) + dur
                    depth = sum(1 for s in stack if s[2] == key)
                    if depth < self.stage_depth.get(name, 1 << 30):
                        self.stage_depth[name] = depth
                    if not depth:
                        target.top_us += dur
                    break

    # ---- after the pass
    def finish(self) -> None:
        """Fill what a compile's own events lacked from its frame's other compiles, and
        cost the graph breaks: the frames they caused (resume functions compiled) and the
        compile time those frames and restarts took."""
        known: dict = {}
        for comp in self.compiles.values():
            if comp.co_name or comp.stack:
                known.setdefault((comp.key[0], comp.key[1]), comp)
        for comp in self.compiles.values():
            other = known.get((comp.key[0], comp.key[1]))
            if other is not None and other is not comp:
                comp.stack = comp.stack or other.stack
                comp.co_name = comp.co_name or other.co_name
                comp.co_filename = comp.co_filename or other.co_filename
                comp.co_firstlineno = comp.co_firstlineno or other.co_firstlineno
        by_resume: dict[tuple, list[Compile]] = {}
        for comp in self.compiles.values():
            name = comp.co_name or (comp.stack[-1][0].rsplit(" in ", 1)[-1] if comp.stack else None)
            target = interpret.resume_target(name)
            if target:
                by_resume.setdefault(target, []).append(comp)
        for group in self.breaks.values():
            info = group.info
            fn = info.user_stack[-1].rsplit(" in ", 1)[-1] if info.user_stack else None
            resumes = by_resume.get((fn, info.user_line), []) if fn and info.user_line else []
            group.resume_compiles = [c.key for c in resumes]
            group.frames_caused = len(group.compiles) + len(resumes)
            t = 0.0
            for key in group.compiles:
                c = self.compiles.get(key)
                if c is not None and c.restart_reasons:
                    before = c.metrics.get("dynamo_time_before_restart_s")
                    if isinstance(before, (int, float)):
                        t += before
            for c in resumes:
                t += c.compile_time_s() or 0.0
            group.time_caused_s = t
        if self.search is not None:
            self.search.flush()

    def ranked_breaks(self) -> list[BreakGroup]:
        return sorted(self.breaks.values(), key=lambda g: (-g.time_caused_s, -g.frames_caused, g.info.reason))


def mask_volatile(payload: bytes) -> bytes:
    """Addresses and uuids change between runs; plain-text output masks them to diff cleanly."""
    return _UUID.sub(b"<uuid>", _ADDRESS.sub(b"0x...", payload))


def _compile_key(env: dict) -> CompileKey:
    fid, fcid, caid = env.get("frame_id"), env.get("frame_compile_id"), env.get("compiled_autograd_id")
    return (caid if isinstance(caid, int) else None, fid if isinstance(fid, int) else None,
            fcid if isinstance(fcid, int) else None)
