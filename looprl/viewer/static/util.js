// looprl view: small shared helpers (escaping, DOM building, JSON fetch, tooltip).
"use strict";
window.LV = window.LV || {};

LV.esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

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

LV.showTooltip = (x, y, html) => {
  const t = document.getElementById("tooltip");
  if (!html) { t.hidden = true; return; }
  t.innerHTML = html;
  t.hidden = false;
  const r = t.getBoundingClientRect();
  t.style.left = Math.min(x + 14, window.innerWidth - r.width - 8) + "px";
  t.style.top = Math.min(y + 14, window.innerHeight - r.height - 8) + "px";
};

LV.hideTooltip = () => { document.getElementById("tooltip").hidden = true; };

LV.fmtReward = (r) => (r === null || r === undefined ? "–" : LV.charts.fmt(r));

// Background colour for a reward cell: red (low) to green (high) within [lo, hi].
LV.rewardColor = (r, lo, hi) => {
  if (r === null || r === undefined || !(hi > lo)) return "";
  const t = Math.max(0, Math.min(1, (r - lo) / (hi - lo)));
  return `hsl(${Math.round(t * 120)}, 65%, 90%)`;
};

// Replace a <select>'s options with [value, label] pairs (only when they changed), keeping `keep`.
LV.fillSelect = (sel, options, keep) => {
  const same = sel.options.length === options.length &&
    options.every(([v, l], i) => sel.options[i].value === v && sel.options[i].textContent === l);
  if (!same) {
    sel.innerHTML = "";
    for (const [v, l] of options) sel.append(LV.el("option", { value: v }, l));
  }
  if (keep !== null && keep !== undefined && options.some(([v]) => v === keep)) sel.value = keep;
};
