// looprl view: tabs, polling for new data (live runs), and the curves tab.
"use strict";
window.LV = window.LV || {};

LV.app = (() => {
  const $ = (id) => document.getElementById(id);
  const POLL_MS = 2000;
  const ORDER = ["reward", "eval", "kl", "entropy", "clip_frac", "mismatch_kl", "tokens_per_s", "time", "loss"];
  const st = { runs: [], metrics: {}, shown: new Set(), charts: {}, dirty: true, polling: false };

  function showTab(name) {
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === name);
    for (const s of document.querySelectorAll(".tab")) s.classList.toggle("active", s.id === `tab-${name}`);
    if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
    if (name === "curves") drawCharts();
    if (name === "rollouts") LV.rollouts.query();
  }

  async function poll() {
    if (st.polling) return;
    st.polling = true;
    try {
      const { runs } = await LV.api("runs");
      onRuns(runs);
      for (const r of runs) if (st.shown.has(r.id)) await pullMetrics(r.id);
      $("live").classList.remove("stale");
      $("live").title = `updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      $("live").classList.add("stale");
      $("live").title = `cannot reach the viewer server: ${err.message}`;
    } finally {
      st.polling = false;
    }
    if (st.dirty && $("tab-curves").classList.contains("active")) drawCharts();
  }

  async function pullMetrics(id) {
    const m = st.metrics[id] || (st.metrics[id] = { rows: [], next: 0 });
    const res = await LV.api("metrics", { run: id, since: m.next });
    if (res.rows.length) { m.rows.push(...res.rows); st.dirty = true; }
    m.next = res.next;
  }

  function onRuns(runs) {
    const fresh = runs.filter((r) => !st.runs.some((o) => o.id === r.id));
    st.runs = runs;
    for (const r of fresh) if (st.shown.size < 8) st.shown.add(r.id);
    if (fresh.length) { renderRunToggles(); st.dirty = true; }
    renderNotices(runs);
    renderSummaries(runs);
    LV.rollouts.onRuns(runs);
    LV.compare.onRuns(runs);
  }

  function renderRunToggles() {
    const box = $("run-toggles");
    box.replaceChildren();
    st.runs.forEach((r, i) => {
      const cb = LV.el("input", { type: "checkbox", checked: st.shown.has(r.id), "data-run": r.id, onchange: async (e) => {
        if (e.target.checked) { st.shown.add(r.id); await pullMetrics(r.id); } else st.shown.delete(r.id);
        st.dirty = true; drawCharts();
      } });
      box.append(LV.el("label", { title: r.path }, cb,
        LV.el("i", { class: "swatch", style: `background:${LV.charts.PALETTE[i % LV.charts.PALETTE.length]}` }),
        ` ${r.name}${r.kind === "eval" ? " (eval)" : ""}`));
    });
  }

  function renderNotices(runs) {
    const lines = [];
    for (const r of runs) {
      const mn = r.metrics_notice;
      if (mn.skipped) lines.push(`${r.name}/metrics.jsonl: ${mn.skipped} malformed lines skipped (lines ${mn.skipped_lines.join(", ")})`);
      for (const f of r.files) if (f.skipped) lines.push(`${r.name} ${f.key}: ${f.skipped} malformed lines skipped`);
    }
    const total = runs.reduce((a, r) => a + r.skipped_total, 0);
    $("notices").textContent = total ? `⚠ ${total} malformed line${total > 1 ? "s" : ""} skipped` : "";
    $("notices").title = lines.join("\n");
  }

  // Eval result directories have no curves: show their `summary` numbers as a table.
  function renderSummaries(runs) {
    const rows = runs.filter((r) => r.summary && typeof r.summary === "object");
    const box = $("summaries");
    box.hidden = !rows.length;
    if (!rows.length) return;
    const keys = [...new Set(rows.flatMap((r) => Object.keys(r.summary)))].sort();
    const cell = (v) => (typeof v === "number" ? LV.charts.fmt(v) : JSON.stringify(v ?? "–"));
    box.replaceChildren(LV.el("tr", {}, LV.el("th", {}, "eval"), keys.map((k) => LV.el("th", {}, k))));
    for (const r of rows) box.append(LV.el("tr", {}, LV.el("td", {}, r.name), keys.map((k) => LV.el("td", {}, cell(r.summary[k])))));
  }

  function groupOf(key) { return key.includes("/") ? key.split("/")[0] : key; }

  function groupRank(g) { const i = ORDER.indexOf(g); return i < 0 ? ORDER.length : i; }

  function seriesFor(groupKeys, runs, xaxis) {
    const multi = runs.length > 1, out = [];
    runs.forEach((r) => {
      const rows = (st.metrics[r.id] || { rows: [] }).rows, ri = st.runs.indexOf(r);
      groupKeys.forEach((k, ki) => {
        if (k.endsWith("/std") && groupKeys.includes(k.slice(0, -4) + "/mean")) return;
        const points = [], band = [], std = k.endsWith("/mean") ? k.slice(0, -5) + "/std" : null;
        for (const row of rows) {
          const x = row[xaxis], y = row[k];
          if (x === undefined || y === undefined) continue;
          points.push([x, y]);
          if (std && row[std] !== undefined) band.push([x, y - row[std], y + row[std]]);
        }
        if (!points.length) return; // this run does not log this metric
        const P = LV.charts.PALETTE, D = LV.charts.DASHES;
        out.push({ name: `${r.id}::${k}`, label: multi ? `${r.name} · ${k}` : k + (band.length ? " ± std" : ""),
          color: multi ? P[ri % P.length] : P[ki % P.length], dash: multi ? D[ki % D.length] : [], points, band });
      });
    });
    return out;
  }

  function drawCharts() {
    st.dirty = false;
    const runs = st.runs.filter((r) => st.shown.has(r.id));
    const xaxis = $("xaxis").value, filt = $("metric-filter").value.trim().toLowerCase();
    const keys = new Set();
    for (const r of runs) for (const row of (st.metrics[r.id] || { rows: [] }).rows) for (const k in row) keys.add(k);
    keys.delete("step"); keys.delete("wall_time");
    const groups = new Map();
    for (const k of [...keys].sort()) {
      if (filt && !k.toLowerCase().includes(filt)) continue;
      const g = groupOf(k);
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push(k);
    }
    const names = [...groups.keys()].sort((a, b) => groupRank(a) - groupRank(b) || a.localeCompare(b));
    const box = $("charts");
    for (const g of Object.keys(st.charts)) if (!groups.has(g)) { st.charts[g].el.remove(); delete st.charts[g]; }
    const smoothing = +$("smoothing").value;
    for (const g of names) {
      const chart = st.charts[g] || (st.charts[g] = new LV.charts.LineChart(box, g));
      box.append(chart.el); // keeps the display order
      chart.setData(seriesFor(groups.get(g), runs, xaxis), xaxis, smoothing);
    }
    $("charts-empty").hidden = names.length > 0 || st.runs.every((r) => r.kind === "eval");
  }

  function init() {
    for (const b of document.querySelectorAll("#tabs button")) b.onclick = () => showTab(b.dataset.tab);
    $("xaxis").onchange = drawCharts;
    $("metric-filter").oninput = drawCharts;
    $("smoothing").oninput = () => { $("smoothing-val").textContent = $("smoothing").value; drawCharts(); };
    let timer = null;
    for (const id of ["f-task", "c-task"]) $(id).addEventListener("input", (e) => {
      clearTimeout(timer);
      timer = setTimeout(() => suggestTasks(e.target === $("c-task") ? $("c-run").value : LV.rollouts.state.run, e.target.value), 200);
    });
    LV.rollouts.init();
    LV.compare.init();
    const tab = location.hash.slice(1);
    if (["curves", "rollouts", "compare"].includes(tab)) showTab(tab);
    poll();
    setInterval(poll, POLL_MS);
  }

  async function suggestTasks(run, q) {
    if (!run) return;
    const res = await LV.api("tasks", { run, q, limit: 30 });
    const dl = $("task-ids");
    dl.replaceChildren();
    for (const t of res.tasks) dl.append(LV.el("option", { value: t }));
  }

  document.addEventListener("DOMContentLoaded", init);
  return { state: st, showTab, drawCharts, poll };
})();
