// looprl view: the rollouts browser (filters, paging, previews, episode pane).
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
        $("f-source").value = run && run.kind !== "train" ? "eval" : "train"; // each run starts on its own kind
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
    if (!st.run || !runById(st.run)) st.run = list.length ? (list.find((r) => r.kind === "train") || list[0]).id : null;
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
    if (run && run.kind !== "train") $("f-source").value = "eval";
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
    const body = $("rollouts").querySelector("tbody");
    body.replaceChildren();
    const range = rewardRange(res.items);
    for (const it of res.items) {
      const tr = el("tr", { "data-file": it.file, "data-i": it.i, onclick: () => open(it) },
        el("td", {}, it.step ?? "–"), el("td", {}, it.rollout_index ?? ""),
        el("td", { class: "task", title: `${it.task_id ?? ""} · ${it.env || "no env"}` }, it.task_id ?? ""), previewCell(it),
        rewardCell(it, range), el("td", {}, it.num_turns ?? ""), el("td", {}, it.num_tool_calls ?? ""), flagsCell(it));
      if (st.selected && st.selected.file === it.file && st.selected.i === it.i) tr.classList.add("selected");
      body.append(tr);
    }
    if (res.complete && st.selected && !res.items.some((it) => it.file === st.selected.file && it.i === st.selected.i)) unselect();
  }

  // The selected episode left the list (a filter or another page hides it): the pane says so
  // instead of still showing an episode that the list no longer holds.
  function unselect() {
    st.selected = null;
    $("episode").replaceChildren(el("p", { class: "empty no-episode" },
      "No episode selected: the one shown before is not in this list (filters or page). Select an episode."));
  }

  // Shared by the rollouts and probe lists: reward colour range, preview, reward and flag cells.
  function rewardRange(items) {
    const rs = items.map((it) => it.reward).filter((r) => r !== null && r !== undefined);
    return [Math.min(...rs), Math.max(...rs)];
  }

  function previewCell(it) {
    const one = (s) => (s || "").replace(/\s+/g, " ").trim();
    return el("td", { class: "preview", title: `${one(it.prompt)}\n→ ${one(it.preview)}` },
      el("div", { class: "p-prompt" }, one(it.prompt) || "–"), el("div", { class: "p-reply" }, "→ " + (one(it.preview) || "(no reply)")));
  }

  function rewardCell(it, [lo, hi]) {
    return el("td", { class: "reward", style: `background:${LV.rewardColor(it.reward, lo, hi)}` }, LV.fmtReward(it.reward));
  }

  function flagsCell(it) {
    return el("td", { class: "flags" }, [...(it.errors || []).map((k) => el("span", { class: "pill bad" }, k)),
      Object.values(it.tool_errors || {}).some((n) => n) ? el("span", { class: "pill warn" }, "tool err") : null,
      it.truncated ? el("span", { class: "pill warn" }, "trunc") : null]);
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
        // held-out tasks recur at every eval step; training tasks rarely recur: show the eval grid
        onCompare: it.file.startsWith("eval:") ? () => LV.compare.open(st.run, data.episode.task.id, data.step, it.rollout_index)
          : () => LV.compare.open(st.run, null),
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

  return { init, onRuns, query, open, state: st, previewCell, rewardCell, flagsCell, rewardRange };
})();
