// looprl view: the compare tab. Held-out tasks recur at every eval step (training tasks rarely
// recur), so it opens on a grid of held-out tasks x eval steps (mean reward per cell); clicking a
// cell shows that task at that step beside the same task at the latest step (or the first).
"use strict";
window.LV = window.LV || {};

LV.compare = (() => {
  const el = LV.el;
  const $ = (id) => document.getElementById(id);
  const st = { byStep: new Map(), tokens: false, raw: false, gen: 0, retry: null, gridRun: null, gridSig: null };
  const sides = () => [$("side-a"), $("side-b")];
  let runs = [];

  function init() {
    $("c-load").onclick = () => load();
    $("c-task").addEventListener("change", () => load());
    $("c-run").addEventListener("change", () => { $("c-source").value = defaultSource($("c-run").value); grid(true); load(); });
    $("c-source").addEventListener("change", () => load());
    $("c-tokens").addEventListener("change", (e) => { st.tokens = e.target.checked; sides().forEach(show); });
    for (const side of sides()) {
      side.querySelector(".c-step").addEventListener("change", () => { fillRollouts(side); show(side); });
      side.querySelector(".c-roll").addEventListener("change", () => show(side));
    }
  }

  function defaultSource(runId) {
    const run = runs.find((r) => r.id === runId);
    return run && run.files.some((f) => f.source === "eval") ? "eval" : "train";
  }

  function onRuns(list) {
    runs = list;
    const first = !$("c-run").value;
    const start = first && list.length ? (list.find((r) => r.kind === "train") || list[0]).id : $("c-run").value;
    LV.fillSelect($("c-run"), list.map((r) => [r.id, r.name]), start);
    if (first && list.length) $("c-source").value = defaultSource($("c-run").value);
    if ($("tab-compare").classList.contains("active")) grid(false);
  }

  // The grid of held-out tasks x eval steps; redrawn when the run's eval files change.
  async function grid(force) {
    const run = runs.find((r) => r.id === $("c-run").value);
    if (!run) return;
    const sig = run.id + "|" + run.files.filter((f) => f.source === "eval").map((f) => `${f.key}:${f.bytes}`).join(",");
    if (!force && sig === st.gridSig) return;
    st.gridSig = sig;
    const res = await LV.api("grid", { run: run.id });
    const table = $("grid");
    if (!res.columns.length) {
      $("grid-note").textContent = "This run has no held-out evals (eval/step_*/results.jsonl): pick a task id above to compare training rollouts.";
      table.replaceChildren();
      return;
    }
    $("grid-note").textContent = `${res.tasks.length} held-out tasks × ${res.columns.length} evals: mean reward per cell. Click a cell to compare that task with the latest eval.`;
    const all = res.tasks.flatMap((t) => t.cells.filter(Boolean).map((c) => c.mean)).filter((v) => v !== null);
    const lo = Math.min(...all), hi = Math.max(...all);
    const head = el("tr", {}, el("th", {}, "task"), res.columns.map((c) => el("th", {}, c.step === null ? "eval" : `step ${c.step}`)),
      el("th", { title: "last eval minus first" }, "Δ"));
    const rows = res.tasks.map((t) => {
      const first = t.cells.find(Boolean), last = [...t.cells].reverse().find(Boolean);
      const delta = first && last && first.mean !== null && last.mean !== null ? last.mean - first.mean : null;
      return el("tr", {}, el("td", { class: "task" }, t.task_id), t.cells.map((c, n) => c
        ? el("td", { class: "cell", "data-step": String(res.columns[n].step ?? "-"), style: `background:${LV.rewardColor(c.mean, lo, hi)}`,
          title: `${c.n} episode${c.n > 1 ? "s" : ""}`, onclick: () => open(run.id, t.task_id, res.columns[n].step, undefined) }, LV.fmtReward(c.mean))
        : el("td", { class: "muted" }, "")),
      el("td", { class: delta > 0 ? "up" : delta < 0 ? "down" : "" }, delta === null ? "" : (delta > 0 ? "+" : "") + LV.charts.fmt(delta)));
    });
    table.replaceChildren(head, ...rows);
  }

  // Jump here: the run's grid, and with a task that task's step on the left, the latest on the right.
  function open(run, task, step, rolloutIndex) {
    $("c-run").value = run;
    $("c-source").value = defaultSource(run);
    LV.app.showTab("compare");
    grid(false);
    if (task === null || task === undefined) return;
    $("c-task").value = task;
    load(step, rolloutIndex);
  }

  async function load(stepA, rolloutA) {
    const task = $("c-task").value.trim();
    if (!task) { $("c-status").textContent = "pick a cell of the grid or enter a task id"; return; }
    const gen = ++st.gen;
    clearTimeout(st.retry);
    let res;
    try {
      res = await LV.api("rollouts", { run: $("c-run").value, source: $("c-source").value, task, step: "all", limit: 500 });
    } catch (err) {
      $("c-status").textContent = `error: ${err.message}`;
      return;
    }
    if (gen !== st.gen) return;
    st.byStep = new Map();
    for (const it of res.items) {
      const k = String(it.step ?? "-");
      if (!st.byStep.has(k)) st.byStep.set(k, []);
      st.byStep.get(k).push(it);
    }
    const steps = [...st.byStep.keys()];
    const skipped = res.skipped ? ` · ${res.skipped} malformed line${res.skipped > 1 ? "s" : ""} skipped` : "";
    $("c-status").textContent = (res.complete ? `${res.total} episodes of ${task} over ${steps.length} steps` : "indexing…") + skipped;
    const [a, b] = sides();
    const opts = steps.map((s) => [s, s === "-" ? "(no step)" : `step ${s}`]);
    // Left: the given step (or the earliest); right: the latest. Earlier step always on the left.
    const first = steps[0], last = steps[steps.length - 1];
    let left = stepA !== undefined && stepA !== null ? String(stepA) : a.querySelector(".c-step").value;
    if (!st.byStep.has(left) || left === last) left = first;
    LV.fillSelect(a.querySelector(".c-step"), opts, left);
    LV.fillSelect(b.querySelector(".c-step"), opts, last);
    for (const side of sides()) fillRollouts(side);
    const pick = (st.byStep.get(a.querySelector(".c-step").value) || []).findIndex((it) => it.rollout_index === rolloutA);
    if (pick >= 0) a.querySelector(".c-roll").value = String(pick);
    sides().forEach(show);
    if (!res.complete) st.retry = setTimeout(() => load(stepA, rolloutA), 400);
  }

  function fillRollouts(side) {
    const items = st.byStep.get(side.querySelector(".c-step").value) || [];
    const cur = side.querySelector(".c-roll").value;
    LV.fillSelect(side.querySelector(".c-roll"), items.map((it, n) => [String(n), `#${it.rollout_index} · reward ${LV.fmtReward(it.reward)}`]), cur);
  }

  async function show(side) {
    const items = st.byStep.get(side.querySelector(".c-step").value) || [];
    const it = items[+side.querySelector(".c-roll").value || 0];
    const pane = side.querySelector(".episode-pane");
    if (!it) { pane.replaceChildren(el("p", { class: "empty" }, "No episode of this task at this step.")); return; }
    try {
      const data = await LV.api("episode", { run: $("c-run").value, file: it.file, i: it.i, tokens: st.tokens ? 1 : 0 });
      LV.episode.render(pane, data, { tokens: st.tokens, raw: st.raw, onChange: (p) => {
        Object.assign(st, p); $("c-tokens").checked = st.tokens; sides().forEach(show);
      } });
    } catch (err) {
      pane.replaceChildren(el("div", { class: "errors" }, err.message));
    }
  }

  return { init, onRuns, open, load, grid, state: st };
})();
