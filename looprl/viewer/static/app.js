// looprl view: tabs, polling for new data (live runs), and the curves tab.
"use strict";
window.LV = window.LV || {};

LV.app = (() => {
  const $ = (id) => document.getElementById(id);
  const POLL_MS = 2000;
  const st = { runs: [], metrics: {}, shown: new Set(), charts: {}, sections: {}, configs: {}, dirty: true, polling: false };

  function showTab(name) {
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === name);
    for (const s of document.querySelectorAll(".tab")) s.classList.toggle("active", s.id === `tab-${name}`);
    if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
    if (name === "curves") drawCharts();
    if (name === "rollouts") LV.rollouts.query();
    if (name === "compare") LV.compare.grid(false);
    if (name === "probe") LV.probe.show();
  }

  async function poll() {
    if (st.polling) return;
    st.polling = true;
    try {
      const { runs } = await LV.api("runs");
      onRuns(runs);
      for (const r of runs) if (st.shown.has(r.id)) await pullMetrics(r.id);
      await pullConfigs(runs);
      $("live").classList.remove("stale");
      $("live").title = `${$("live").dataset.why}\nupdated ${new Date().toLocaleTimeString()}`;
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
    const sig = JSON.stringify(runs.map((r) => [r.monitors, r.anchors, r.files.map((f) => f.key)]));
    if (sig !== st.sig) { st.sig = sig; st.dirty = true; }
    renderNotices(runs);
    renderStatus(runs);
    renderSummaries(runs);
    LV.rollouts.onRuns(runs);
    LV.compare.onRuns(runs);
    LV.probe.onRuns(runs);
  }

  function renderRunToggles() {
    const box = $("run-toggles");
    box.replaceChildren();
    st.runs.forEach((r, i) => {
      const cb = LV.el("input", { type: "checkbox", checked: st.shown.has(r.id), "data-run": r.id, onchange: async (e) => {
        if (e.target.checked) { st.shown.add(r.id); await pullMetrics(r.id); } else st.shown.delete(r.id);
        st.dirty = true; drawCharts();
      } });
      box.append(LV.el("label", { title: r.path, "data-run": r.id }, cb,
        LV.el("i", { class: "swatch", style: `background:${LV.charts.PALETTE[i % LV.charts.PALETTE.length]}` }),
        ` ${r.name}${r.kind === "train" ? "" : ` (${r.kind})`}`, LV.el("span", { class: "run-status" }), LV.el("span", { class: "badges" }, badges(r))));
    });
  }

  // The header says "live" while a training run is being written, else how the run (or runs)
  // ended: the status of RUN/summary.json, or "finished" once final/ is exported (runs/insights.py).
  function renderStatus(runs) {
    const train = runs.filter((r) => r.kind === "train"), live = train.some((r) => r.status === "live");
    const ends = new Set(train.map((r) => r.status)); // one status shared by every run, or "ended"
    const text = live ? "live" : ends.size === 1 ? [...ends][0] : train.length ? "ended" : "finished";
    $("live").textContent = text;
    $("live").classList.toggle("ended", !live);
    $("live").classList.toggle("bad", ["failed", "interrupted", "crashed"].includes(text));
    $("live").dataset.why = runs.map((r) => `${r.name}: ${r.status} (${r.why})`).join("\n");
    for (const lab of document.querySelectorAll("#run-toggles label")) {
      const r = runs.find((x) => x.id === lab.dataset.run), pill = lab.querySelector(".run-status");
      if (!r || !pill || r.kind !== "train") continue;
      pill.className = `run-status pill ${r.status === "live" ? "good" : r.status === "finished" ? "info" : "warn"}`;
      pill.textContent = r.status;
      pill.title = r.why;
    }
  }

  // Each training run's saved config.json (the resolved config), folded in a <details> panel.
  async function pullConfigs(runs) {
    for (const r of runs) {
      if (r.kind !== "train" || st.configs[r.id]) continue;
      const { config } = await LV.api("config", { run: r.id });
      if (!config) continue; // not written yet: asked again at the next poll
      st.configs[r.id] = LV.el("details", { class: "config-panel", "data-run": r.id },
        LV.el("summary", {}, `config · ${r.name}`, LV.el("span", { class: "muted" }, `  ${r.path}/config.json`)),
        LV.el("pre", {}, JSON.stringify(config, null, 2)));
      $("configs").append(st.configs[r.id]);
    }
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

  // Eval result directories have no curves: their `summary` numbers as a table, one column per
  // directory and one row per number (nested tables are flattened to `rewards/correct`; lists
  // show their length, with the items in the cell's tooltip).
  function renderSummaries(runs) {
    const rows = runs.filter((r) => r.summary && typeof r.summary === "object");
    const box = $("summaries");
    box.hidden = !rows.length;
    if (!rows.length) return;
    const flat = rows.map((r) => flatten(r.summary, ""));
    const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))];
    box.replaceChildren(LV.el("tr", {}, LV.el("th", {}, "eval"), rows.map((r) => LV.el("th", { title: r.path }, r.name))));
    for (const k of keys) box.append(LV.el("tr", {}, LV.el("td", { class: "key" }, k), flat.map((f) => summaryCell(f[k]))));
  }

  function flatten(obj, prefix) {
    const out = {};
    for (const [k, v] of Object.entries(obj)) {
      const key = prefix + k;
      if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) Object.assign(out, flatten(v, key + "/"));
      else out[key] = v;
    }
    return out;
  }

  function summaryCell(v) {
    if (v === undefined) return LV.el("td", { class: "muted" }, "");
    if (Array.isArray(v)) return LV.el("td", { title: v.map((x) => (typeof x === "string" ? x : JSON.stringify(x))).join("\n") }, v.length ? `${v.length} item${v.length > 1 ? "s" : ""}` : "none");
    if (v && typeof v === "object") return LV.el("td", {}, "–");
    return LV.el("td", { class: typeof v === "number" ? "num" : "" }, typeof v === "number" ? LV.charts.fmt(v) : String(v ?? "–"));
  }

  // Sections of the curves tab, in order: one per metric namespace (docs/metrics.md; the server
  // renames the bare keys of older runs), `env/` beside `reward/`, anything else under "other".
  const SECTIONS = ["reward", "eval", "monitor", "curriculum", "rollout", "loss", "policy", "value", "train", "async", "stream", "time"];
  const OPEN_BY_DEFAULT = new Set(["reward", "eval", "monitor", "curriculum"]);
  // Namespaces whose metrics differ in scale: one chart per metric. The series of any other
  // namespace (reward/, eval/, loss/, time/, ...) share one chart, named after the namespace.
  const OWN_CHART = new Set(["rollout", "policy", "value", "train"]);

  function namespaceOf(key) { return key.includes("/") ? key.split("/")[0] : ""; }
  function sectionOf(key) { const ns = namespaceOf(key) === "env" ? "reward" : namespaceOf(key); return SECTIONS.includes(ns) ? ns : "other"; }
  function sectionRank(name) { const i = SECTIONS.indexOf(name); return i < 0 ? SECTIONS.length : i; }
  function groupOf(key) { const ns = namespaceOf(key); return ns && !OWN_CHART.has(ns) ? ns : key; }

  // Every value of `key` over the shown runs, and whether they are all the same number.
  function valuesOf(key, runs) {
    const vals = [];
    for (const r of runs) for (const row of (st.metrics[r.id] || { rows: [] }).rows) if (row[key] !== undefined) vals.push(row[key]);
    return vals;
  }
  const isConstant = (vals) => vals.length > 1 && vals.every((v) => v === vals[0]);
  const isRate = (vals) => vals.every((v) => v >= 0 && v <= 1);

  // Charts of one group: rates in [0, 1] together; when the group mixes them with counts (token
  // counts, turns), each count gets its own chart so it cannot flatten the rates.
  function chartsOfGroup(g, keys, runs) {
    const vals = Object.fromEntries(keys.map((k) => [k, valuesOf(k, runs)]));
    const rates = keys.filter((k) => isRate(vals[k]));
    const counts = keys.filter((k) => !rates.includes(k) && Math.max(...vals[k].map(Math.abs)) > 1.5);
    if (!rates.length || !counts.length || g === "reward" || g === "env") return [[g, keys, false]]; // rewards share a scale
    const rest = keys.filter((k) => !counts.includes(k));
    return [[g, rest, rest.every((k) => rates.includes(k))], ...counts.map((k) => [k, [k], false])];
  }

  function seriesFor(groupKeys, runs, xaxis) {
    const multi = runs.filter((r) => r.kind === "train").length > 1, out = [];
    runs.forEach((r) => {
      const rows = (st.metrics[r.id] || { rows: [] }).rows, ri = st.runs.indexOf(r), [lo, hi] = bandLimits(groupKeys, rows);
      groupKeys.forEach((k, ki) => {
        if (k.endsWith("/std") && groupKeys.includes(k.slice(0, -4) + "/mean")) return;
        const points = [], band = [], std = k.endsWith("/mean") ? k.slice(0, -5) + "/std" : null;
        for (const row of rows) {
          const x = row[xaxis], y = row[k];
          if (x === undefined || y === undefined) continue;
          points.push([x, y]);
          if (std && row[std] !== undefined) band.push([x, Math.max(lo, y - row[std]), Math.min(hi, y + row[std])]);
        }
        if (!points.length) return; // this run does not log this metric
        const P = LV.charts.PALETTE, D = LV.charts.DASHES, same = sameAsMean(k, groupKeys, rows);
        const label = (multi ? `${r.name} · ${k}` : k + (band.length ? " ± std" : "")) + (same ? ` (= ${same})` : "");
        out.push({ name: `${r.id}::${k}`, label, color: multi ? P[ri % P.length] : P[ki % P.length],
          dash: same ? [7, 5] : multi ? D[ki % D.length] : [], width: same ? 2.6 : undefined, same: Boolean(same), points, band });
      });
      if (xaxis === "step") out.push(...anchorSeries(r, groupKeys, rows));
    });
    return out.filter((s) => !s.same).concat(out.filter((s) => s.same)); // a copy of the mean is drawn over it
  }

  // Where a mean ± std band may reach: values that all lie in [0, 1] (rewards, accuracies) keep
  // it in [0, 1]; values that are all >= 0 keep it >= 0; otherwise it is not clipped.
  function bandLimits(keys, rows) {
    let min = Infinity, max = -Infinity;
    for (const row of rows) for (const k of keys) {
      const v = row[k];
      if (typeof v === "number" && !k.endsWith("/std")) { if (v < min) min = v; if (v > max) max = v; }
    }
    if (!(min >= 0)) return [-Infinity, Infinity];
    return [0, max <= 1 ? 1 : Infinity];
  }

  // A function that equals the mean at every step (a single reward function of weight 1) would
  // hide under it: the mean's key when `k` is such a copy, else null.
  function sameAsMean(k, keys, rows) {
    const mean = `${namespaceOf(k)}/mean`;
    if (!namespaceOf(k) || k === mean || k.endsWith("/std") || !keys.includes(mean)) return null;
    let n = 0;
    for (const row of rows) {
      if (row[k] === undefined && row[mean] === undefined) continue;
      if (typeof row[k] !== "number" || typeof row[mean] !== "number") return null;
      if (Math.abs(row[k] - row[mean]) > 1e-9 * Math.max(1, Math.abs(row[mean]))) return null;
      n += 1;
    }
    return n ? mean : null;
  }

  // Before/after evals (eval directories of the run's start model or final model) as diamonds.
  function anchorSeries(r, keys, rows) {
    const last = rows.length ? Math.max(...rows.map((row) => row.step)) : 0, out = [];
    (r.anchors || []).forEach((a, ai) => {
      for (const k of keys) {
        if (a.metrics[k] === undefined) continue;
        const x = a.step === null ? last : a.step;
        out.push({ name: `${r.id}::${a.run}::${k}`, label: `${a.name} (${a.label} eval)`, marker: true,
          color: a.label === "before" ? "#6d7b8d" : "#c2185b", dash: [], points: [[x, a.metrics[k]]], band: [], idx: ai });
      }
    });
    return out;
  }

  // Vertical marks: held-out eval steps (grey, dashed) and monitor trips (red; labelled at the first).
  function marksFor(runs, xaxis) {
    if (xaxis !== "step") return [];
    const marks = [];
    for (const r of runs) {
      for (const f of r.files) if (f.source === "eval" && f.step !== null) marks.push({ x: f.step, color: "rgba(47,111,222,.35)", dash: [3, 3] });
      (r.monitors || []).forEach((m, mi) => {
        for (const s of m.steps) marks.push({ x: s, color: "rgba(200,55,45,.45)", dash: [] });
        marks.push({ x: m.first_step, color: "#c8372d", width: 1.5, label: `⚑ ${m.name}`, row: mi });
      });
    }
    return marks;
  }

  function metricKeys(runs) {
    const filt = $("metric-filter").value.trim().toLowerCase(), keys = new Set();
    for (const r of runs) for (const row of (st.metrics[r.id] || { rows: [] }).rows) for (const k in row) keys.add(k);
    keys.delete("step"); keys.delete("wall_time");
    return [...keys].sort().filter((k) => !filt || k.toLowerCase().includes(filt));
  }

  function section(name, only) {
    let sec = st.sections[name];
    if (!sec) {
      const grid = LV.el("div", { class: "charts" }), consts = LV.el("div", { class: "constants", hidden: true });
      const toggle = LV.el("button", { type: "button", class: "const-toggle", onclick: () => { consts.hidden = !consts.hidden; } });
      const el = LV.el("details", { class: "section", "data-section": name, open: OPEN_BY_DEFAULT.has(name) || only },
        LV.el("summary", {}, LV.el("span", { class: "sec-name" }, name), LV.el("span", { class: "muted sec-count" })), grid, toggle, consts);
      sec = st.sections[name] = { el, grid, consts, toggle };
    }
    return sec;
  }

  function drawCharts() {
    st.dirty = false;
    const runs = st.runs.filter((r) => st.shown.has(r.id));
    const xaxis = $("xaxis").value, smoothing = +$("smoothing").value;
    const bySection = new Map();
    for (const k of metricKeys(runs)) {
      const name = sectionOf(k);
      if (!bySection.has(name)) bySection.set(name, { groups: new Map(), constants: [] });
      const sec = bySection.get(name), vals = valuesOf(k, runs);
      if (isConstant(vals)) { sec.constants.push([k, vals[0]]); continue; }
      const g = groupOf(k);
      if (!sec.groups.has(g)) sec.groups.set(g, []);
      sec.groups.get(g).push(k);
    }
    const names = [...bySection.keys()].sort((a, b) => sectionRank(a) - sectionRank(b) || a.localeCompare(b));
    const box = $("charts"), marks = marksFor(runs, xaxis), seen = new Set();
    for (const name of names) {
      const data = bySection.get(name), sec = section(name, names.length === 1);
      box.append(sec.el);
      let n = 0;
      for (const [g, keys] of data.groups) {
        for (const [title, ks, unit] of chartsOfGroup(g, keys, runs)) {
          const chart = st.charts[title] || (st.charts[title] = new LV.charts.LineChart(sec.grid, title));
          sec.grid.append(chart.el); seen.add(title); n += 1;
          chart.setData(seriesFor(ks, runs, xaxis), xaxis, smoothing, marks);
          chart.el.classList.toggle("unit", unit);
        }
      }
      renderConstants(sec, data.constants);
      sec.el.querySelector(".sec-count").textContent = ` ${n} chart${n === 1 ? "" : "s"}` + (data.constants.length ? ` · ${data.constants.length} constant` : "");
    }
    for (const t of Object.keys(st.charts)) if (!seen.has(t)) { st.charts[t].el.remove(); delete st.charts[t]; }
    for (const n of Object.keys(st.sections)) if (!bySection.has(n)) { st.sections[n].el.remove(); delete st.sections[n]; }
    renderBadges(runs);
    $("charts-empty").hidden = names.length > 0 || st.runs.every((r) => r.kind !== "train");
  }

  // Constant series are folded away: a toggle names how many, and opens name = value pairs.
  function renderConstants(sec, constants) {
    sec.toggle.hidden = !constants.length;
    sec.toggle.textContent = `${constants.length} constant series hidden`;
    sec.consts.replaceChildren(...constants.map(([k, v]) => LV.el("span", { class: "const" }, `${k} = `, LV.el("b", {}, LV.charts.fmt(v)))));
  }

  // Monitor badges: on each run's toggle (the run list) and above the charts (the run page).
  function renderBadges(runs) {
    for (const lab of document.querySelectorAll("#run-toggles label")) {
      const r = st.runs.find((x) => x.id === lab.dataset.run);
      lab.querySelector(".badges").replaceChildren(...badges(r));
    }
    const lines = runs.filter((r) => (r.monitors || []).length).map((r) => LV.el("div", { class: "monitor-line" },
      LV.el("b", {}, r.name), ": ", badges(r), LV.el("span", { class: "muted" }, " (red lines on the charts mark the steps where a monitor was on)")));
    $("monitor-banner").replaceChildren(...lines);
    $("monitor-banner").hidden = !lines.length;
  }

  function badges(r) {
    return ((r && r.monitors) || []).map((m) => LV.el("span", { class: "pill bad monitor-badge", title: `on at steps ${m.steps.join(", ")}` },
      `⚑ ${m.name} @ step ${m.first_step}`));
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
    LV.probe.init();
    const tab = location.hash.slice(1);
    if (["curves", "rollouts", "compare", "probe"].includes(tab)) showTab(tab);
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
