// looprl view: small shared helpers (DOM building, JSON fetch, tooltip).
//
// Everything the API returns comes from run files, which may be crafted: it reaches the page
// only as text (LV.el appends strings as text nodes, attributes are set with setAttribute). No
// code here builds HTML from strings or uses a DOM call that parses HTML (tests/test_viewer.py
// checks static/ for them); the server's Content-Security-Policy also forbids inline scripts.
"use strict";
window.LV = window.LV || {};

// el("div", {class: "x", onclick: fn}, child, "text", ...) -> HTMLElement
LV.el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) if (k !== null && k !== undefined && k !== false) e.append(k instanceof Node ? k : String(k));
  return e;
};

LV.api = async (path, params) => {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") qs.set(k, v);
  const res = await fetch(`/api/${path}?${qs}`);
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || `${res.status} ${res.statusText}`);
  return body;
};

// Show `nodes` (an element or a list of elements built with LV.el) in the tooltip at (x, y).
LV.showTooltip = (x, y, nodes) => {
  const t = document.getElementById("tooltip");
  const kids = [nodes].flat().filter(Boolean);
  if (!kids.length) { t.hidden = true; return; }
  t.replaceChildren(...kids);
  t.hidden = false;
  const r = t.getBoundingClientRect();
  t.style.left = Math.min(x + 14, window.innerWidth - r.width - 8) + "px";
  t.style.top = Math.min(y + 14, window.innerHeight - r.height - 8) + "px";
};

LV.hideTooltip = () => { document.getElementById("tooltip").hidden = true; };

LV.fmtReward = (r) => (r === null || r === undefined ? "–" : LV.charts.fmt(r));

// Background colour for a reward cell: red (low) to green (high) within [lo, hi].
LV.rewardColor = (r, lo, hi) => {
  if (typeof r !== "number" || !(hi > lo)) return "";
  const t = Math.max(0, Math.min(1, (r - lo) / (hi - lo)));
  return `hsl(${Math.round(t * 120)}, 65%, 90%)`;
};

// Replace a <select>'s options with [value, label] pairs (only when they changed), keeping `keep`.
LV.fillSelect = (sel, options, keep) => {
  const same = sel.options.length === options.length &&
    options.every(([v, l], i) => sel.options[i].value === v && sel.options[i].textContent === l);
  if (!same) {
    sel.replaceChildren();
    for (const [v, l] of options) sel.append(LV.el("option", { value: v }, l));
  }
  if (keep !== null && keep !== undefined && options.some(([v]) => v === keep)) sel.value = keep;
};
