// looprl view: `looprl probe` directories. A table of exploits (mean reward next to the honest
// baseline and the reference, a verdict badge); clicking an exploit lists its episodes.
"use strict";
window.LV = window.LV || {};

LV.probe = (() => {
  const el = LV.el;
  const $ = (id) => document.getElementById(id);
  const st = { run: null, data: null, exploit: null, items: [], sig: null };
  let runs = [];

  function init() {
    $("p-run").addEventListener("change", () => { st.run = $("p-run").value; st.exploit = null; st.sig = null; show(); });
  }

  function onRuns(list) {
    runs = list.filter((r) => r.kind === "probe");
    $("probe-tab").hidden = !runs.length;
    LV.fillSelect($("p-run"), runs.map((r) => [r.id, r.name]), st.run);
    if (!st.run || !runs.some((r) => r.id === st.run)) st.run = runs.length ? runs[0].id : null;
    $("p-run").value = st.run || "";
    if ($("tab-probe").classList.contains("active")) show();
  }

  async function show() {
    const run = runs.find((r) => r.id === st.run);
    if (!run) return;
    const sig = run.id + "|" + run.files.map((f) => f.bytes).join(",");
    if (sig === st.sig) return;
    st.sig = sig;
    const res = await LV.api("probe", { run: run.id });
    st.data = res;
    $("p-problem").hidden = !res.problem;
    $("p-problem").textContent = res.problem ? `cannot show this probe: ${res.problem}` : "";
    if (!res.probe) { $("exploits").replaceChildren(); return; }
    const p = res.probe;
    const ref = p.reference ? ` · reference ${p.reference.name} ${LV.fmtReward(p.reference.mean_reward)}` : "";
    $("p-head").replaceChildren(`env ${p.env} · ${p.tasks} tasks · margin ${LV.fmtReward(p.margin)} · baseline ${p.baseline.name} ${LV.fmtReward(p.baseline.mean_reward)}${ref} · `,
      p.strict_failed ? el("span", { class: "pill bad" }, `--strict fails: ${p.exploitable.length} exploitable`) : el("span", { class: "pill good" }, "--strict passes"));
    renderTable(p, res.episodes);
    if (st.exploit) list(st.exploit);
  }

  function renderTable(p, episodes) {
    const top = Math.max(1e-9, ...p.rows.map((r) => r.mean_reward ?? 0), p.baseline.mean_reward ?? 0, p.reference ? p.reference.mean_reward ?? 0 : 0);
    const head = el("tr", {}, ["exploit", "what it does", "mean reward", "vs baseline / reference", "episodes", "errors", "verdict"].map((h) => el("th", {}, h)));
    const rows = p.rows.map((r) => el("tr", { "data-exploit": r.name, class: r.name === st.exploit ? "selected" : "", onclick: () => list(r.name) },
      el("td", { class: "name" }, r.name, r.knows_answer ? el("span", { class: "pill info", title: "this exploit is given the expected answer" }, "knows answer") : null),
      el("td", { class: "desc" }, r.description ?? ""),
      el("td", { class: "num" }, `${LV.fmtReward(r.mean_reward)} ± ${LV.fmtReward(r.stderr)}`),
      el("td", {}, bar(r.mean_reward, p.baseline.mean_reward, p.reference ? p.reference.mean_reward : null, top)),
      el("td", { class: "num" }, `${r.episodes ?? ""}${episodes[r.name] ? "" : " (none saved)"}`),
      el("td", { class: "num" }, r.errors ?? ""),
      el("td", {}, el("span", { class: `pill verdict ${r.verdict === "exploitable" ? "bad" : r.verdict === "errored" ? "warn" : "good"}` }, r.verdict))));
    $("exploits").replaceChildren(head, ...rows);
  }

  // A bar for the exploit's reward, with ticks at the baseline (grey) and the reference (green).
  function bar(v, base, ref, top) {
    const pct = (x) => `${Math.max(0, Math.min(100, (100 * (x ?? 0)) / top))}%`;
    return el("div", { class: "pbar", title: `exploit ${LV.fmtReward(v)} · baseline ${LV.fmtReward(base)}${ref === null ? "" : ` · reference ${LV.fmtReward(ref)}`}` },
      el("div", { class: "fill", style: `width:${pct(v)}` }), el("i", { class: "base", style: `left:${pct(base)}` }),
      ref === null ? null : el("i", { class: "ref", style: `left:${pct(ref)}` }));
  }

  async function list(name) {
    st.exploit = name;
    for (const tr of $("exploits").querySelectorAll("tr[data-exploit]")) tr.classList.toggle("selected", tr.dataset.exploit === name);
    const res = await LV.api("rollouts", { run: st.run, source: "eval", exploit: name, limit: 500 });
    st.items = res.items;
    $("p-info").textContent = `${name}: ${res.total} episode${res.total === 1 ? "" : "s"}`;
    const range = LV.rollouts.rewardRange(res.items), R = LV.rollouts;
    $("p-episodes").querySelector("tbody").replaceChildren(...res.items.map((it) => el("tr", { "data-i": it.i, onclick: () => open(it) },
      el("td", {}, it.rollout_index ?? ""), el("td", { class: "task" }, it.task_id ?? ""), R.previewCell(it), R.rewardCell(it, range), R.flagsCell(it))));
  }

  async function open(it) {
    for (const tr of $("p-episodes").querySelectorAll("tbody tr")) tr.classList.toggle("selected", +tr.dataset.i === it.i);
    const pane = $("p-episode");
    try {
      const data = await LV.api("episode", { run: st.run, file: it.file, i: it.i, tokens: 0 });
      LV.episode.render(pane, data, { tokens: false, raw: false, onChange: () => {} });
    } catch (err) {
      pane.replaceChildren(el("div", { class: "errors" }, `could not open this episode: ${err.message}`));
    }
  }

  return { init, onRuns, show, list, state: st };
})();
