"""The report's one stylesheet and one script, written next to the pages (no CDN, no
network: the report opens from disk). The script holds a small syntax highlighter for
Python, C++, bytecode and guard text, the stack-trie toggles and the search box."""

CSS = r"""
:root { --ok:#1b7f3b; --resumed:#9be39b; --error:#d62728; --empty:#ffffff; --missing:#7b3fa0; --ink:#1d232b; --mute:#5d6875; --line:#d7dce2; --bg:#fafbfc; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); margin: 0; background: #fff; }
header.top { background: #1d232b; color: #fff; padding: 10px 20px; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
header.top a { color: #cfe3ff; }
header.top .brand { font-weight: 600; font-size: 16px; }
header.top form { margin-left: auto; }
header.top input[type=search] { width: 320px; padding: 4px 8px; border-radius: 4px; border: 0; }
main { padding: 12px 24px 40px; max-width: 1400px; }
h1 { font-size: 22px; margin: 12px 0; } h2 { font-size: 18px; margin: 26px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
a { color: #0b5cad; text-decoration: none; } a:hover { text-decoration: underline; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f4; font-weight: 600; }
tr:nth-child(even) td { background: var(--bg); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: var(--bg); border: 1px solid var(--line); padding: 8px 10px; overflow: auto; white-space: pre; }
pre.wrap { white-space: pre-wrap; word-break: break-word; }
.muted { color: var(--mute); } .small { font-size: 12px; }
.pill { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; border: 1px solid var(--line); }
.status-ok { background: var(--ok); color: #fff; } .status-resumed { background: var(--resumed); color: #000; }
.status-restart { background: var(--error); color: #fff; }
.status-error { background: var(--error); color: #fff; } .status-empty { background: var(--empty); color: #000; border: 1px solid #999; }
.status-missing { background: var(--missing); color: #fff; }
a.cid { padding: 0 4px; border-radius: 3px; font-family: ui-monospace, Menlo, monospace; margin-right: 2px; }
.legend span { margin-right: 8px; padding: 0 4px; border-radius: 3px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 8px 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 14px; min-width: 130px; background: var(--bg); }
.card b { display: block; font-size: 20px; } .card.bad b { color: var(--error); }
.warn { background: #fff4e5; border: 1px solid #f0b46b; padding: 8px 12px; border-radius: 4px; margin: 8px 0; }
.trie ul { list-style: none; padding-left: 18px; margin: 0; } .trie > ul { padding-left: 0; }
.trie li { white-space: nowrap; font-family: ui-monospace, Menlo, monospace; font-size: 12.5px; }
.trie .tog { cursor: pointer; user-select: none; display: inline-block; width: 1.2em; color: var(--mute); }
.trie li.closed > ul { display: none; }
.trie .loc { color: var(--mute); }
.tag { font-size: 11px; color: var(--mute); border: 1px solid var(--line); border-radius: 3px; padding: 0 3px; }
details > summary { cursor: pointer; }
.hl-kw { color: #8a3ffc; font-weight: 600; } .hl-str { color: #0a7d32; } .hl-com { color: #7a8590; font-style: italic; }
.hl-num { color: #b05a00; } .hl-fn { color: #0b5cad; } .hl-op { color: #c2185b; } .hl-ty { color: #00758f; }
#results li { margin: 6px 0; } #results .snip { display: block; color: var(--mute); font-family: ui-monospace, Menlo, monospace; font-size: 12px; white-space: pre-wrap; }
mark { background: #ffe27a; }
.picture { overflow: auto; max-height: 720px; border: 1px solid var(--line); background: #fff; margin: 6px 0 12px; }
svg.chart text { font: 12px system-ui, sans-serif; fill: #1d232b; } svg.chart text.label { text-anchor: end; }
svg.chart text.total { fill: var(--mute); }
.kernel-swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #39424c; border-radius: 2px; padding: 0 !important; vertical-align: middle; }
table.fixfirst td { max-width: 420px; }
"""

JS = r"""
(function () {
  'use strict';
  function esc(s) { return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;'); }

  // ---- stack trie: click a marker to fold a subtree
  document.querySelectorAll('.trie .tog').forEach(function (t) {
    t.addEventListener('click', function () {
      var li = t.parentNode; li.classList.toggle('closed');
      t.textContent = li.classList.contains('closed') ? '+' : '-';
    });
  });

  // ---- syntax highlighting (text comes from textContent, so it is escaped again here)
  var KW = {
    python: 'False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield',
    cpp: 'auto bool break case char const constexpr continue default do double else enum extern false float for if inline int long namespace return short signed sizeof static struct switch template true typedef typename unsigned using void volatile while int64_t int32_t uint8_t',
    bytecode: '', guards: '', text: '', json: 'true false null'
  };
  var RULES = {
    python: /(#[^\n]*)|("{3}[\s\S]*?"{3}|'{3}[\s\S]*?'{3}|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')|(\b\d[\d_]*\.?\d*(?:e[+-]?\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)(?=\s*\()|([A-Za-z_][A-Za-z0-9_]*)/g,
    cpp: /(\/\/[^\n]*|\/\*[\s\S]*?\*\/|#\s*\w+)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')|(\b\d[\d.]*[fFuUlL]*\b)|([A-Za-z_][A-Za-z0-9_]*)(?=\s*\()|([A-Za-z_][A-Za-z0-9_]*)/g,
    bytecode: /(\([^\n)]*\))|(>>)|(\b\d+\b)|(\b[A-Z][A-Z_0-9]{2,}\b)|()/g,
    guards: /(#[^\n]*)|('(?:[^'\\\n])*'|"(?:[^"\\\n])*")|(\b\d+\b)|(\b[A-Z][A-Z_]{3,}\b)|()/g,
    json: /()|("(?:\\.|[^"\\])*")|(-?\b\d[\d.eE+-]*\b)|()|(\b[a-z]+\b)/g,
    text: null
  };
  function highlight(pre) {
    var lang = pre.getAttribute('data-lang') || 'text';
    var re = RULES[lang];
    var src = pre.textContent;
    if (!re || src.length > 3000000) return;
    var kws = {}; (KW[lang] || '').split(' ').forEach(function (k) { if (k) kws[k] = 1; });
    var out = [], last = 0, m;
    re.lastIndex = 0;
    while ((m = re.exec(src)) !== null) {
      if (m[0] === '') { re.lastIndex++; continue; }
      out.push(esc(src.slice(last, m.index)));
      var cls = m[1] ? (lang === 'bytecode' ? 'hl-str' : 'hl-com') : m[2] ? (lang === 'bytecode' ? 'hl-op' : 'hl-str') : m[3] ? 'hl-num'
              : m[4] ? (lang === 'bytecode' || lang === 'guards' ? 'hl-kw' : 'hl-fn')
              : (kws[m[5]] ? 'hl-kw' : (/^(Tensor|torch|aten|prims|f32|f16|bf16|i64|b8)$/.test(m[5]) ? 'hl-ty' : ''));
      out.push(cls ? '<span class="' + cls + '">' + esc(m[0]) + '</span>' : esc(m[0]));
      last = m.index + m[0].length;
    }
    out.push(esc(src.slice(last)));
    pre.innerHTML = out.join('');
  }
  document.querySelectorAll('pre[data-lang]').forEach(highlight);

  // ---- search: shards of a JSON index, loaded as scripts (fetch() is blocked on file://)
  var box = document.getElementById('q'), results = document.getElementById('results');
  if (!box || !results) return;
  var cfg = window.TL_SEARCH_CONFIG || {shards: 0};
  var entries = [], loaded = 0, pending = null;
  window.TL_SEARCH = { add: function (list) { entries = entries.concat(list); } };
  function loadAll(done) {
    if (loaded >= cfg.shards) { done(); return; }
    var s = document.createElement('script');
    s.src = 'search/shard_' + loaded + '.js';
    s.onload = function () { loaded++; loadAll(done); };
    s.onerror = function () { loaded++; loadAll(done); };
    document.head.appendChild(s);
  }
  function snippet(text, q) {
    var i = text.toLowerCase().indexOf(q);
    if (i < 0) return '';
    var a = Math.max(0, i - 60), b = Math.min(text.length, i + q.length + 100);
    return (a > 0 ? '\u2026' : '') + esc(text.slice(a, i)) + '<mark>' + esc(text.slice(i, i + q.length)) + '</mark>' + esc(text.slice(i + q.length, b)) + (b < text.length ? '\u2026' : '');
  }
  function run() {
    var q = box.value.trim().toLowerCase();
    var status = document.getElementById('status');
    if (!q) { results.innerHTML = ''; status.textContent = entries.length + ' entries indexed'; return; }
    var hits = [], byId = {};
    entries.forEach(function (e) { if (e.id !== undefined) byId[e.id] = e; });
    entries.forEach(function (e) {
      var text = e.x !== undefined ? e.x : (byId[e.same] ? byId[e.same].x : '');
      var hay = (e.t + '\n' + text).toLowerCase();
      if (hay.indexOf(q) >= 0) hits.push([e, text]);
    });
    status.textContent = hits.length + ' match(es) for "' + box.value + '"' + (cfg.truncated ? ' (code index truncated, see report)' : '');
    results.innerHTML = hits.slice(0, 500).map(function (h) {
      var e = h[0];
      return '<li><span class="tag">' + esc(e.k) + '</span> <a href="' + esc(e.u) + '">' + esc(e.t) + '</a><span class="snip">' + snippet(h[1], q) + '</span></li>';
    }).join('') + (hits.length > 500 ? '<li class="muted">first 500 shown</li>' : '');
  }
  box.addEventListener('input', function () { clearTimeout(pending); pending = setTimeout(run, 150); });
  var params = new URLSearchParams(window.location.search);
  if (params.get('q')) box.value = params.get('q');
  loadAll(run);
})();
"""
