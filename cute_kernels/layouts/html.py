"""``layout_page``: one self-contained HTML file to explore a layout in a browser.

The page draws the layout's grid and, for each cell, shows on hover its coordinate, index,
offset and shared-memory bank and, with an access pattern, which thread reads it as which value
(instruction, phase). The layout is an editable text field: the page parses CuTe's notation and
re-evaluates it itself (shapes, strides, swizzles, composed layouts; a swizzle on byte addresses
when a dtype is set, as in :mod:`~cute_kernels.layouts.analysis`), and recounts the access's
bank conflicts live, so deleting a swizzle shows the conflicts it removed.

The access is fixed in *tile coordinates* (what the kernel's threads ask for), computed once here
by :func:`~cute_kernels.layouts.analysis.warp_accesses`; editing the layout changes where those
coordinates land in memory, hence the banks, which is the question a layout answers. The page
needs no network: everything (style, script, data) is inline. The URL fragment drives it too,
``#layout=...&dtype=bf16&hover=2,3`` (used by the headless-browser test).
"""

from __future__ import annotations

import json
from typing import Any
from xml.sax.saxutils import escape

from . import budget
from .errors import LayoutError

__all__ = ["layout_page"]

_STYLE = """
body{font-family:monospace;margin:16px;color:#222}
h1{font-size:16px;margin:0 0 8px}
form{margin:0 0 8px}
input#layout{width:44em;font-family:monospace}
#error{color:#b00;white-space:pre-wrap}
#summary{background:#f4f4f4;padding:4px 8px;margin:6px 0}
#tooltip{background:#fffbe6;border:1px solid #cc9;padding:4px 8px;margin:6px 0;min-height:1.2em}
#float{position:fixed;display:none;background:#333;color:#fff;padding:3px 6px;font-size:11px;pointer-events:none}
table{border-collapse:collapse}
td{border:1px solid #555;min-width:34px;height:22px;text-align:center;font-size:10px;cursor:default}
td.hover{background:#ff00ff !important;color:#fff;outline:3px solid #800080}
th{font-weight:normal;color:#666;font-size:10px;padding:0 3px}
#note{color:#666}
"""

# The page's evaluator: CuTe's notation parsed and evaluated as cute_kernels.layouts does
# (colexicographic indices, Sw<B,M,S>, "outer o offset o inner"), in BigInt so XORs stay exact.
_SCRIPT = r"""
const DATA = JSON.parse(document.getElementById('data').textContent);
const THREAD_COLORS = ["#afafff","#afffaf","#ffafaf","#ffffaf","#afffff","#ffafff","#d7d7ff","#ffd7af"];
const BANK_COLORS = ["#fbb4ae","#b3cde3","#ccebc5","#decbe4","#fed9a6","#ffffcc","#e5d8bd","#fddaec"];
const BITS = {f64:64,f32:32,tf32:32,s32:32,u32:32,f16:16,bf16:16,s16:16,u16:16,e4m3:8,e5m2:8,s8:8,u8:8};

function tokenize(text) {
  const re = /\s*(?:(-?_?\d+)|([():,<>@])|(Sw?)(?=<)|(o)(?![A-Za-z0-9_]))/y;
  const out = []; let pos = 0;
  while (pos < text.length) {
    if (text.slice(pos).trim() === '') break;
    re.lastIndex = pos; const m = re.exec(text);
    if (!m || re.lastIndex === pos) throw new Error('cannot parse ' + JSON.stringify(text) + ' at column ' + pos);
    out.push(m[1] !== undefined ? {k:'int', v:BigInt(m[1].replace('_',''))} : m[2] !== undefined ? {k:'sym', v:m[2]}
             : m[3] !== undefined ? {k:'sw', v:m[3]} : {k:'o', v:'o'});
    pos = re.lastIndex;
  }
  return out;
}
function parse(text) {
  const t = tokenize(text); let i = 0;
  const peek = () => t[i];
  const take = (v) => { const x = t[i]; if (!x || (v !== undefined && x.v !== v)) throw new Error('expected ' + v + ' in ' + text); i++; return x; };
  function tuple() {
    if (peek() && peek().v === '(') { take('('); const items = [tuple()]; while (peek() && peek().v === ',') { take(','); items.push(tuple()); } take(')'); return items; }
    const x = take(); if (x.k !== 'int') throw new Error('expected an integer in ' + text);
    if (peek() && peek().v === '@') throw new Error('basis strides (1@0) are not drawn on this page');
    return x.v;
  }
  function fn() {
    if (peek() && peek().k === 'sw') { take(); take('<'); const b = take().v; take(','); const m = take().v; take(','); const s = take().v;
      if (peek() && peek().v === '>') take('>'); return {kind:'swizzle', b:b, m:m, s:s}; }
    const shape = tuple(); take(':'); const stride = tuple(); return {kind:'layout', shape:shape, stride:stride};
  }
  function composed() { const f = fn(); if (!peek()) return f; take('o'); const off = take().v; take('o'); return {kind:'composed', outer:f, offset:off, inner:composed()}; }
  const out = composed(); if (i !== t.length) throw new Error('trailing text in ' + text); return out;
}
const flat = (x) => Array.isArray(x) ? x.flatMap(flat) : [x];
const prod = (x) => flat(x).reduce((a, b) => a * b, 1n);
function shapeOf(f) { return f.kind === 'layout' ? f.shape : f.kind === 'composed' ? shapeOf(f.inner) : null; }
function swz(sw, x) {
  const mask = ((1n << sw.b) - 1n) << (sw.m + (sw.s > 0n ? sw.s : 0n));
  const y = x & mask; return x ^ (sw.s >= 0n ? y >> sw.s : y << -sw.s);
}
function evaluate(f, x) {
  if (f.kind === 'swizzle') return swz(f, x);
  if (f.kind === 'composed') return evaluate(f.outer, f.offset + evaluate(f.inner, x));
  const s = flat(f.shape), d = flat(f.stride); let off = 0n, rest = x;
  for (let k = 0; k < s.length - 1; k++) { off += (rest % s[k]) * d[k]; rest /= s[k]; }
  return off + rest * d[s.length - 1];
}
function elementOffset(f, dtype) {  // the analysis's convention: an outer swizzle acts on bytes
  if (dtype && f.kind === 'composed' && f.outer.kind === 'swizzle' && f.inner.kind === 'layout') {
    const nb = BigInt(BITS[dtype] / 8);
    return (i) => { const b = swz(f.outer, (f.offset + evaluate(f.inner, i)) * nb);
      if (b % nb) throw new Error('the swizzle splits a ' + dtype + ' element'); return b / nb; };
  }
  return (i) => evaluate(f, i);
}
function clip(rows, cols, budget) {
  if (rows * cols <= budget) return [rows, cols];
  const side = Math.max(1, Math.floor(Math.sqrt(budget)));
  if (rows <= side) return [rows, Math.min(cols, Math.floor(budget / rows))];
  if (cols <= side) return [Math.min(rows, Math.floor(budget / cols)), cols];
  return [side, side];
}
function grid(shape) {
  if (!Array.isArray(shape)) return [Number(shape), 1];
  if (shape.length === 1) return [Number(prod(shape[0])), 1];
  return [Number(prod(shape[0])), Number(prod(shape.slice(1)))];
}

let state = null;
function owners() {  // tile index -> [instruction, lane, value]
  const own = new Map(); const acc = DATA.access; if (!acc) return own;
  acc.instrs.forEach((lanes, k) => lanes.forEach((vals, t) => vals.forEach((idx, v) => { if (!own.has(idx)) own.set(idx, [k, t, v]); })));
  return own;
}
const OWNERS = owners();
function banksSummary(offset, dtype) {
  const acc = DATA.access; if (!acc || !dtype) return '';
  const nb = BITS[dtype] / 8, pt = acc.phase; const per = [], ideals = []; let way = 0;
  for (const lanes of acc.instrs) {
    let total = 0, ideal = 0;
    for (let p = 0; p < lanes.length; p += pt) {
      const banks = new Map(), words = new Set();
      for (const vals of lanes.slice(p, p + pt)) {
        const offs = vals.map((i) => Number(offset(BigInt(i))));
        if (offs.length > 1 && (offs.some((o, j) => o !== offs[0] + j) || offs[0] % offs.length))
          throw new Error(acc.name + ': a lane\u2019s vector is not contiguous and aligned under this layout');
        for (const o of offs) for (let b = 0; b < Math.max(1, nb); b += 4) {
          const w = Math.floor((o * nb + b) / 4); words.add(w);
          if (!banks.has(w % 32)) banks.set(w % 32, new Set()); banks.get(w % 32).add(w); }
      }
      if (!words.size) continue;
      const deepest = Math.max(...[...banks.values()].map((s) => s.size));
      total += deepest; ideal += Math.ceil(words.size / 32); way = Math.max(way, deepest);
    }
    per.push(total); ideals.push(ideal);
  }
  let worst = 0;
  per.forEach((w, i) => { const a = [w / Math.max(ideals[i], 1), w], b = [per[worst] / Math.max(ideals[worst], 1), per[worst]];
    if (a[0] > b[0] || (a[0] === b[0] && a[1] > b[1])) worst = i; });
  const free = per[worst] === ideals[worst], degree = ideals[worst] ? per[worst] / ideals[worst] : 1;
  const mean = per.reduce((a, b) => a + b, 0) / per.length;
  const g = (x) => String(Number(x.toPrecision(6)));
  return acc.name + ' on ' + dtype + ': ' + per.length + ' instruction(s), ' + Math.ceil(acc.active / pt) + ' phase(s) each\n'
    + '  wavefronts per instruction: ' + per[worst] + ' (ideal ' + ideals[worst] + ', mean ' + g(mean) + ')\n'
    + '  conflict degree ' + g(degree) + 'x: ' + (free ? 'conflict-free' : way + '-way bank conflict');
}
function describe(r, c) {
  const s = state, i = r + s.rows * c, o = s.offset(BigInt(i));
  let text = '(' + r + ', ' + c + ') = index ' + i + ' \u2192 offset ' + o;
  if (s.dtype) { const byte = o * BigInt(BITS[s.dtype] / 8); text += ' \u00b7 bank ' + ((byte / 4n) % 32n) + ' (byte ' + byte + ')'; }
  const own = OWNERS.get(i);
  if (own) text += ' \u00b7 thread ' + own[1] + ', value ' + own[2] + ' (instruction ' + own[0] + ', phase ' + Math.floor(own[1] / DATA.access.phase) + ')';
  else if (DATA.access) text += ' \u00b7 read by no thread';
  return text;
}
function show(td, ev) {
  document.querySelectorAll('td.hover').forEach((x) => x.classList.remove('hover'));
  td.classList.add('hover');
  const text = describe(Number(td.dataset.r), Number(td.dataset.c));
  document.getElementById('tooltip').textContent = text;
  const fl = document.getElementById('float'); fl.textContent = text;
  if (ev) { fl.style.display = 'block'; fl.style.left = (ev.clientX + 12) + 'px'; fl.style.top = (ev.clientY + 12) + 'px'; }
}
function draw(text, dtype) {
  const err = document.getElementById('error'); err.textContent = '';
  try {
    const f = parse(text); const shape = shapeOf(f);
    if (shape === null) throw new Error('draw a layout or a composed layout, not a bare swizzle');
    const [rows, cols] = grid(shape), [vr, vc] = clip(rows, cols, DATA.maxCells);
    const offset = elementOffset(f, dtype);
    state = {rows: rows, cols: cols, offset: offset, dtype: dtype};
    const nb = dtype ? BigInt(BITS[dtype] / 8) : 0n;
    let html = '<tr><th></th>' + Array.from({length: vc}, (_, c) => '<th>' + c + '</th>').join('') + '</tr>';
    for (let r = 0; r < vr; r++) {
      html += '<tr><th>' + r + '</th>';
      for (let c = 0; c < vc; c++) {
        const o = offset(BigInt(r + rows * c));
        const fill = dtype ? BANK_COLORS[Number(((o * nb) / 16n) % 8n)] : THREAD_COLORS[Number(((o % 8n) + 8n) % 8n)];
        html += '<td data-r="' + r + '" data-c="' + c + '" style="background:' + fill + '">' + o + '</td>';
      }
      html += '</tr>';
    }
    document.getElementById('grid').innerHTML = html;
    document.getElementById('title').textContent = text + '  (' + rows + ' x ' + cols + (dtype ? ', ' + dtype : '') + ')';
    document.getElementById('note').textContent = (vr < rows || vc < cols) ? 'showing rows 0-' + (vr - 1) + ' and columns 0-' + (vc - 1)
      + ' of the ' + rows + ' x ' + cols + ' grid (budget ' + DATA.maxCells + ' cells)' : '';
    document.querySelectorAll('#grid td').forEach((td) => { td.onmouseover = (ev) => show(td, ev);
      td.onmouseout = () => { document.getElementById('float').style.display = 'none'; }; });
  } catch (e) { err.textContent = String(e.message || e); return; }
  try { document.getElementById('summary').textContent = banksSummary(state.offset, dtype); }
  catch (e) { document.getElementById('summary').textContent = String(e.message || e); }
}
function fromHash() {
  const q = new URLSearchParams(location.hash.slice(1));
  if (q.has('layout')) document.getElementById('layout').value = q.get('layout');
  if (q.has('dtype')) document.getElementById('dtype').value = q.get('dtype');
  draw(document.getElementById('layout').value, document.getElementById('dtype').value);
  if (q.has('hover')) { const [r, c] = q.get('hover').split(',').map(Number);
    const td = document.querySelector('td[data-r="' + r + '"][data-c="' + c + '"]'); if (td) show(td, null); }
}
document.getElementById('edit').onsubmit = (ev) => { ev.preventDefault();
  draw(document.getElementById('layout').value, document.getElementById('dtype').value); };
window.onhashchange = fromHash;
fromHash();
"""


def _access_data(layout: Any, dtype: str | None, access: Any, max_cells: int) -> dict | None:
    """The access in tile coordinates: per instruction, per lane, the tile indices of its values."""
    if access is None:
        return None
    from .analysis import element_offset_fn, parse_access, warp_accesses
    from .atoms import dtype_bits

    if dtype is None:
        raise LayoutError("a page with an access pattern needs a dtype (the banks depend on the element width)")
    size = layout.size()
    budget.check(size, max_cells, f"the access of tile {layout} on the page", "pass max_cells= or draw a tile of it")
    acc = parse_access(access, dtype)
    offset = element_offset_fn(layout, dtype_bits(dtype))
    index_of: dict[int, int] = {}
    for i in range(size):
        index_of.setdefault(offset(i), i)
    instrs = warp_accesses(layout, dtype, acc)
    return {"name": acc.name, "phase": acc.phase_threads, "active": acc.active_threads,
            "instrs": [[[index_of[o] for o in offs] for offs in lanes] for lanes in instrs]}


def layout_page(layout: Any, dtype: Any = None, access: Any = None, *, max_cells: int = budget.PICTURE_CELLS) -> str:
    """The interactive page for ``layout`` (a layout, composed layout, GMMA smem atom, or its text):
    see the module docstring. ``access`` (any access :func:`~cute_kernels.layouts.analysis.bank_conflicts`
    takes) adds thread/value on hover and the live bank-conflict count; it needs ``dtype``.
    The grid is clipped to ``max_cells`` cells, and an access is shown for tiles up to that size."""
    from .atoms import dtype_name
    from .parse import as_layout

    obj = as_layout(layout)
    if hasattr(obj, "element_layout"):  # a GMMA smem atom: its CuTe form, the swizzle on bytes
        dtype = dtype or obj.dtype
        obj = obj.layout
    dtype = dtype_name(dtype) if dtype is not None else None
    data = {"layout": str(obj), "dtype": dtype, "maxCells": max_cells, "access": _access_data(obj, dtype, access, max_cells)}
    options = "".join(f'<option value="{d}"{" selected" if d == (dtype or "") else ""}>{d or "(no dtype)"}</option>'
                      for d in ("", "bf16", "f16", "f32", "e4m3", "s8", "f64"))
    access_text = escape(data["access"]["name"]) if data["access"] else "(none: pass access= / --access)"
    blob = json.dumps(data).replace("</", "<\\/")  # keep "</script>" out of the inline JSON
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>cute-kernels: {escape(str(obj))}</title>
<style>{_STYLE}</style></head>
<body>
<h1>cute-kernels layout workbench: <span id="title"></span></h1>
<form id="edit">layout <input id="layout" value="{escape(str(obj), {'"': '&quot;'})}"> dtype <select id="dtype">{options}</select>
access {access_text} <button type="submit">draw</button></form>
<div id="error"></div>
<pre id="summary"></pre>
<div id="tooltip">hover a cell: its coordinate, index, offset, bank and the thread that reads it</div>
<div id="note"></div>
<table id="grid"></table>
<div id="float"></div>
<script id="data" type="application/json">{blob}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
