// looprl view: the rollouts browser (filters, paging, episode pane) and the compare view.
"use strict";
window.LV = window.LV || {};

LV.rollouts = (() => {
  const el = LV.el;
  const $ = (id) => document.getElementById(id);
  const st = { run: null, offset: 0, limit: 50, items: [], selected: null, tokens: false, raw: false, gen: 0, retry: null };
  let runs = [];

  function filters() {
    return { run: st.run, source: $("f-source").value, step: $("f-step").value, env: $("f-env").value,
      min: $("f-min").value, max: $("f-max").value, errors: $("f-errors").value, task: $("f-task").value.trim() };
  }

  function init() {
    $("filters").addEventListener("change", (e) => {
      if (e.target.id === "f-run") {
        st.run = e.target.value;
        const run = runById(st.run);
        $("f-source").value = run && run.kind === "eval" ? "eval" : "train"; // each run starts on its own kind
        fillSteps(true);
      }
      if (e.target.id === "f-source") fillSteps(true);
      st.offset = 0; query();
    });
    $("filters").addEventListener("submit", (e) => { e.preventDefault(); st.offset = 0; query(); });
    $("prev").onclick = () => { st.offset = Math.max(0, st.offset - st.limit); query(); };
    $("next").onclick = () => { st.offset += st.limit; query(); };
    document.addEventListener("keydown", onKey);
  }

  function runById(id) { return runs.find((r) => r.id === id); }

  function stepsOf(run, source) {
    const steps = (run ? run.files : []).filter((f) => f.source === source).map((f) => f.step);
    return steps.sort((a, b) => (b ?? -1) - (a ?? -1));
  }

  // Called by the app whenever /api/runs is polled.
  function onRuns(list) {
    const first = !runs.length;
    runs = list;
    LV.fillSelect($("f-run"), list.map((r) => [r.id, r.name]), st.run);
    if (!st.run || !runById(st.run)) st.run = list.length ? list[0].id : null;
    $("f-run").value = st.run || "";
    fillSteps(first);
    // Re-query when the files behind the current view grew (a run still training).
    const step = $("f-step").value, source = $("f-source").value, run = runById(st.run);
    const files = (run ? run.files : []).filter((f) => f.source === source && (step === "all" || String(f.step) === step));
    const sig = `${st.run}|${source}|${step}|` + files.map((f) => `${f.key}:${f.bytes}`).join(",");
    const changed = sig !== st.sig;
    st.sig = sig;
    if (first && st.run) query();
    else if (changed && $("tab-rollouts").classList.contains("active")) query();
  }

  function fillSteps(reset) {
    const run = runById(st.run);
    if (run && run.kind === "eval") $("f-source").value = "eval";
    const steps = stepsOf(run, $("f-source").value);
    const cur = $("f-step").value;
    const opts = [["all", "all steps"], ...steps.filter((s) => s !== null).map((s) => [String(s), `step ${s}`])];
    LV.fillSelect($("f-step"), opts, reset ? null : cur);
    $("f-step").value = reset || !cur ? (steps.length && steps[0] !== null ? String(steps[0]) : "all") : cur;
  }

  async function query() {
    if (!st.run) return;
    const gen = ++st.gen;
    clearTimeout(st.retry);
    let res;
    try {
      res = await LV.api("rollouts", { ...filters(), offset: st.offset, limit: st.limit });
    } catch (err) {
      $("page-info").textContent = `error: ${err.message}`;
      return;
    }
    if (gen !== st.gen) return;
    LV.fillSelect($("f-env"), [["", "all"], ...res.envs.map((e) => [e, e || "(none)"])], $("f-env").value);
    st.items = res.items;
    renderList(res);
    if (!res.complete) st.retry = setTimeout(query, 300);
  }

  function renderList(res) {
    const end = res.offset + res.items.length;
    const skipped = res.skipped ? ` · ${res.skipped} malformed line${res.skipped > 1 ? "s" : ""} skipped` : "";
    $("page-info").textContent = (res.total
      ? `${res.offset + 1}–${end} of ${res.total}${res.complete ? "" : "+ (indexing…)"}`
      : res.complete ? "no episodes match" : "indexing…") + skipped;
    $("prev").disabled = res.offset === 0;
    $("next").disabled = end >= res.total;
    const rs = res.items.map((it) => it.reward).filter((r) => r !== null && r !== undefined);
    const lo = Math.min(...rs), hi = Math.max(...rs);
    const body = $("rollouts").querySelector("tbody");
    body.replaceChildren();
    for (const it of res.items) {
      const flags = [...(it.errors || []).map((k) => el("span", { class: "pill bad" }, k)),
        Object.values(it.tool_errors || {}).some((n) => n) ? el("span", { class: "pill warn" }, "tool err") : null,
        it.truncated ? el("span", { class: "pill warn" }, "trunc") : null];
      const tr = el("tr", { "data-file": it.file, "data-i": it.i, onclick: () => open(it), title: it.preview || "" },
        el("td", {}, it.step ?? "–"), el("td", {}, it.rollout_index ?? ""),
        el("td", { class: "task" }, it.task_id ?? ""), el("td", { class: "env" }, it.env ?? ""),
        el("td", { class: "reward", style: `background:${LV.rewardColor(it.reward, lo, hi)}` }, LV.fmtReward(it.reward)),
        el("td", {}, it.num_turns ?? ""), el("td", {}, it.num_tool_calls ?? ""), el("td", {}, flags));
      if (st.selected && st.selected.file === it.file && st.selected.i === it.i) tr.classList.add("selected");
      body.append(tr);
    }
  }

  async function open(it) {
    st.selected = { file: it.file, i: it.i };
    for (const tr of $("rollouts").querySelectorAll("tbody tr")) {
      tr.classList.toggle("selected", tr.dataset.file === it.file && +tr.dataset.i === it.i);
    }
    const pane = $("episode");
    try {
      const data = await LV.api("episode", { run: st.run, file: it.file, i: it.i, tokens: st.tokens ? 1 : 0 });
      if (!st.selected || st.selected.file !== it.file || st.selected.i !== it.i) return;
      LV.episode.render(pane, data, {
        tokens: st.tokens, raw: st.raw,
        onChange: (patch) => { Object.assign(st, patch); open(it); },
        onCompare: () => LV.compare.open(st.run, it.file.split(":")[0], data.episode.task.id, data.step, it.rollout_index),
      });
    } catch (err) {
      pane.replaceChildren(el("div", { class: "errors" }, `could not open this episode: ${err.message}`));
    }
  }

  function onKey(e) {
    if (!$("tab-rollouts").classList.contains("active") || /INPUT|SELECT|TEXTAREA/.test(e.target.tagName)) return;
    const idx = st.items.findIndex((it) => st.selected && it.file === st.selected.file && it.i === st.selected.i);
    if ((e.key === "ArrowDown" || e.key === "j") && idx + 1 < st.items.length) { open(st.items[idx + 1]); e.preventDefault(); }
    if ((e.key === "ArrowUp" || e.key === "k") && idx > 0) { open(st.items[idx - 1]); e.preventDefault(); }
  }

  return { init, onRuns, query, open, state: st };
})();

LV.compare = (() => {
  const el = LV.el;
  const $ = (id) => document.getElementById(id);
  const st = { byStep: new Map(), tokens: false, raw: false, gen: 0, retry: null };
  const sides = () => [$("side-a"), $("side-b")];

  function init() {
    $("c-load").onclick = () => load();
    $("c-task").addEventListener("change", () => load());
    $("c-run").addEventListener("change", () => load());
    $("c-source").addEventListener("change", () => load());
    $("c-tokens").addEventListener("change", (e) => { st.tokens = e.target.checked; sides().forEach(show); });
    for (const side of sides()) {
      side.querySelector(".c-step").addEventListener("change", () => { fillRollouts(side); show(side); });
      side.querySelector(".c-roll").addEventListener("change", () => show(side));
    }
  }

  function onRuns(list) {
    LV.fillSelect($("c-run"), list.map((r) => [r.id, r.name]), $("c-run").value);
  }

  // Jump here from an episode: same run and task, this step on the left, the latest on the right.
  function open(run, source, task, step, rolloutIndex) {
    $("c-run").value = run; $("c-source").value = source; $("c-task").value = task;
    LV.app.showTab("compare");
    load(step, rolloutIndex);
  }

  async function load(stepA, rolloutA) {
    const task = $("c-task").value.trim();
    if (!task) { $("c-status").textContent = "enter a task id"; return; }
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
    let left = stepA !== undefined ? String(stepA) : a.querySelector(".c-step").value;
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

  return { init, onRuns, open, load, state: st };
})();
