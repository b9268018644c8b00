// looprl view: one episode, turn by turn (reasoning, tool calls, tool results, rewards, errors)
// or token by token (colour = mask, shade = sampling probability).
"use strict";
window.LV = window.LV || {};

LV.episode = (() => {
  const el = LV.el;
  const THINK = /<think>([\s\S]*?)(<\/think>|$)/g;

  function render(pane, data, opts) {
    const ep = data.episode;
    const body = opts.tokens ? tokenView(ep, data.tokens, data.tokenizer) : messagesView(ep, opts.raw);
    pane.replaceChildren(...[header(data, opts), facts(ep), groupBlock(data.group), problems(ep), taskBlock(ep.task || {}), body].filter(Boolean));
  }

  function header(data, opts) {
    const ep = data.episode, task = ep.task || {};
    const where = data.step === null ? "eval" : `${data.file.split(":")[0]} step ${data.step}`;
    const toggle = (label, key, cls) => el("label", { class: "check" },
      el("input", { type: "checkbox", class: cls, checked: opts[key], onchange: (e) => opts.onChange({ [key]: e.target.checked }) }), " " + label);
    return el("div", { class: "ep-head" },
      el("h2", {}, task.id ?? "(no id)"),
      el("span", { class: "muted" }, `${task.env || "no env"} · ${where} · rollout #${ep.rollout_index ?? 0}`),
      el("span", { class: "big reward", title: "weighted total reward" }, LV.fmtReward(ep.reward)),
      el("span", { class: "actions" },
        toggle("token view", "tokens", "tok-toggle"),
        opts.tokens ? null : toggle("raw text", "raw", "raw-toggle"),
        opts.onCompare ? el("button", { type: "button", class: "compare-btn", onclick: opts.onCompare },
          data.file.startsWith("eval:") ? "compare across steps" : "held-out evals across steps") : null));
  }

  function facts(ep) {
    const kv = (k, v) => el("span", {}, `${k} `, el("b", {}, v));
    const rewards = Object.entries(ep.rewards || {}).map(([k, v]) => kv(k, LV.fmtReward(v)));
    const metrics = Object.entries(ep.metrics || {}).map(([k, v]) => kv(k, typeof v === "number" ? LV.charts.fmt(v) : JSON.stringify(v)));
    const trajs = ep.trajectories || [];
    const sampled = trajs.reduce((a, t) => a + (t.mask || []).reduce((x, y) => x + y, 0), 0);
    const total = trajs.reduce((a, t) => a + (t.token_ids || []).length, 0);
    const timings = Object.entries(ep.timings || {}).map(([k, v]) => `${k} ${LV.charts.fmt(v)}s`).join(", ");
    return el("div", {},
      rewards.length ? el("div", { class: "kv rewards" }, el("span", { class: "muted" }, "rewards:"), rewards) : null,
      metrics.length ? el("div", { class: "kv" }, el("span", { class: "muted" }, "metrics:"), metrics) : null,
      el("div", { class: "kv" },
        kv("turns", ep.num_turns ?? 0), kv("tool calls", ep.num_tool_calls ?? 0),
        kv("stop", ep.stop_reason || "–"), ep.truncated ? el("span", { class: "pill warn" }, "truncated") : null,
        kv("tokens", `${sampled} sampled / ${total}`), kv("segments", trajs.length),
        timings ? el("span", { class: "muted" }, `time: ${timings}`) : null));
  }

  // A training episode's advantage and its group's rewards (recomputed by the server from the
  // saved group and the run's algorithm config: the trainer does not store advantages).
  function groupBlock(g) {
    if (!g) return null;
    const adv = g.advantage === null ? el("span", { class: "muted" }, "not recomputed")
      : el("b", { class: g.advantage > 0 ? "up" : g.advantage < 0 ? "down" : "" }, (g.advantage > 0 ? "+" : "") + LV.charts.fmt(g.advantage));
    const how = `recomputed from the saved group's rewards (${[g.preset, g.estimator].filter(Boolean).join(" · ") || "?"})`;
    const chips = g.rewards.map((r, k) => el("span", { class: "chip" + (k === g.index ? " me" : ""),
      title: g.advantages && g.advantages[k] !== null ? `advantage ${LV.charts.fmt(g.advantages[k])}` : "no advantage" }, LV.fmtReward(r)));
    const size = g.expected && g.expected !== g.size ? ` (${g.size} of ${g.expected} saved)` : "";
    return el("div", { class: "group" },
      el("div", { class: "kv" }, el("span", { class: "muted" }, "advantage:"), adv, el("span", { class: "muted adv-how" }, how),
        g.kept ? null : el("span", { class: "pill warn" }, "dropped from the update")),
      el("div", { class: "kv" }, el("span", { class: "muted" }, `group rewards${size}:`), chips),
      g.note ? el("div", { class: "muted adv-note" }, g.note) : null);
  }

  function problems(ep) {
    const errs = ep.errors || [], tool = Object.entries(ep.tool_errors || {}).filter(([, n]) => n);
    if (!errs.length && !tool.length) return null;
    return el("div", { class: "errors" },
      errs.map((e) => el("div", {}, el("b", {}, `${e.kind || "error"}: `), e.message || JSON.stringify(e))),
      tool.length ? el("div", {}, el("b", {}, "tool errors: "), tool.map(([k, n]) => `${k} ×${n}`).join(", ")) : null);
  }

  function taskBlock(task) {
    const prompt = typeof task.prompt === "string" ? task.prompt
      : (task.prompt || []).map((m) => `[${m.role}] ${m.content ?? ""}`).join("\n\n");
    const info = task.info && Object.keys(task.info).length ? JSON.stringify(task.info, null, 2) : null;
    const answer = task.answer === null || task.answer === undefined ? "–"
      : typeof task.answer === "string" ? task.answer : JSON.stringify(task.answer);
    return el("details", { class: "task" }, el("summary", {}, "task: prompt, answer, info"),
      el("pre", {}, prompt),
      el("div", {}, el("b", {}, "answer: "), answer),
      info ? el("pre", {}, info) : null);
  }

  function messagesView(ep, raw) {
    const box = el("div", { class: "messages" });
    const msgs = ep.messages || [];
    let turn = 0, seenAssistant = false;
    msgs.forEach((m, n) => {
      if (m.role === "assistant") {
        box.append(el("div", { class: "turn-sep" }, `turn ${turn + 1}`));
        box.append(assistant(m, raw, unparsed(ep, msgs, n)));
        turn += 1; seenAssistant = true;
      } else if (m.role === "tool") {
        const who = [m.name, m.tool_call_id].filter(Boolean).join(" · ");
        box.append(el("div", { class: "msg tool" }, el("div", { class: "role" }, `tool result${who ? " · " + who : ""}`), el("pre", {}, m.content)));
      } else if (m.role === "system") {
        box.append(el("details", { class: "msg system" }, el("summary", { class: "role" }, "system"), el("pre", {}, m.content)));
      } else {
        const label = seenAssistant ? "environment" : m.role;
        box.append(el("div", { class: `msg ${m.role}` }, el("div", { class: "role" }, label), el("pre", {}, m.content)));
      }
    });
    return box;
  }

  // A turn whose text is all a tool call that did not parse has no content and no calls: find
  // the error the environment answered (the next tool message and its outcome's kind).
  function unparsed(ep, msgs, n) {
    const m = msgs[n];
    if ((m.content || "").trim() || (m.tool_calls || []).length) return null;
    const reply = msgs[n + 1] && msgs[n + 1].role === "tool" ? msgs[n + 1] : null;
    const outcomes = Array.isArray(ep.tool_outcomes) ? ep.tool_outcomes : [];
    const outcome = reply ? outcomes.find((o) => o && o.call_id === reply.tool_call_id && o.error_kind) : null;
    return { kind: outcome ? String(outcome.error_kind) : null, message: reply ? reply.content : null };
  }

  function assistant(m, raw, bad) {
    const box = el("div", { class: "msg assistant" }, el("div", { class: "role" }, raw ? "assistant · raw sampled text" : "assistant"));
    if (raw) { box.append(el("pre", {}, m.raw || m.content)); return box; }
    const text = m.content || "";
    let last = 0;
    for (const match of text.matchAll(THINK)) {
      const before = text.slice(last, match.index).trim();
      if (before) box.append(el("pre", {}, before));
      box.append(el("div", { class: "think", title: "reasoning" }, el("pre", {}, match[1].trim())));
      last = match.index + match[0].length;
      if (match[0].length === 0) break;
    }
    const rest = text.slice(last).trim();
    if (rest) box.append(el("pre", {}, rest));
    if (bad) {
      box.append(el("div", { class: "call bad-call" }, el("span", { class: "pill bad" }, bad.kind || "no parsed content"),
        el("span", { class: "muted" }, " the whole turn as sampled:"), el("pre", {}, m.raw || "(empty reply)"),
        bad.message ? el("div", { class: "call-error" }, el("b", {}, "environment: "), bad.message) : null));
    }
    for (const c of m.tool_calls || []) {
      const args = c.arguments && Object.keys(c.arguments).length ? JSON.stringify(c.arguments, null, 2) : (c.raw || "{}");
      box.append(el("div", { class: "call" }, "→ call ", el("span", { class: "name" }, c.name || "(unparsed)"),
        c.id ? el("span", { class: "muted" }, ` · ${c.id}`) : null, el("pre", {}, args)));
    }
    return box;
  }

  function tokenView(ep, pieces, note) {
    const box = el("div", { class: "tokens-view" },
      el("div", { class: "tok-legend" },
        el("span", { class: "tok m0" }, " not trained (mask 0) "),
        el("span", {}, "trained (mask 1), by sampling probability:"),
        el("span", {}, "p≈1"), el("span", { class: "grad" }), el("span", {}, "p≈0"),
        el("span", { class: "tok m1 bad" }, " logprob on a mask-0 token ")),
      el("div", { class: "muted tokenizer-note" }, note || ""));
    (ep.trajectories || []).forEach((t, k) => box.append(segment(t, pieces ? pieces[k] : null, k)));
    box.addEventListener("mouseover", (e) => tokenTip(e, ep));
    box.addEventListener("mouseout", LV.hideTooltip);
    return box;
  }

  function shade(lp) {
    const p = Math.exp(Math.min(0, lp));
    const l = 90 - 45 * (1 - p);
    return [`hsl(214,85%,${l}%)`, l < 62 ? "#fff" : "#0d1b3a"];
  }

  function segment(t, pieces, k) {
    const ids = t.token_ids || [], mask = t.mask || [], lps = t.logprobs || [], turns = t.turns || [];
    let bad = 0, sampled = 0;
    const frag = document.createDocumentFragment();
    let turn = null;
    for (let j = 0; j < ids.length; j++) {
      if (turns[j] !== turn) { turn = turns[j]; frag.append(el("span", { class: "tok-turn" }, `turn ${turn + 1}`)); }
      let text = pieces ? pieces[j] : `[${ids[j]}]`;
      if (text === "") text = "∅";
      const s = document.createElement("span");
      s.className = mask[j] ? "tok m1" : "tok m0";
      s.textContent = text.replace(/\n/g, "↵\n");
      s.dataset.k = k; s.dataset.j = j;
      if (mask[j]) { sampled += 1; const [bg, fg] = shade(lps[j] || 0); s.style.background = bg; s.style.color = fg; }
      else if (lps[j]) { bad += 1; s.classList.add("bad"); }
      frag.append(s);
    }
    const head = el("div", { class: "seg-head" }, `segment ${k + 1}: ${ids.length} tokens, ${sampled} trained`,
      bad ? el("span", { class: "pill bad" }, `${bad} mask-0 tokens carry a logprob`) : null,
      mask.length !== ids.length ? el("span", { class: "pill bad" }, "mask length differs from token ids") : null);
    return el("div", {}, head, el("div", { class: "tokens" }, frag));
  }

  function tokenTip(e, ep) {
    const s = e.target.closest(".tok[data-j]");
    if (!s) return;
    const t = ep.trajectories[+s.dataset.k], j = +s.dataset.j;
    const lp = (t.logprobs || [])[j] || 0;
    LV.showTooltip(e.clientX, e.clientY, [
      el("div", {}, "id ", el("b", {}, (t.token_ids || [])[j] ?? "–"), " · mask ", el("b", {}, (t.mask || [])[j] ?? "–"),
        ` · turn index ${(t.turns || [])[j] ?? "–"}`),
      el("div", {}, "logprob ", el("b", {}, LV.charts.fmt(lp)), ` (p = ${LV.charts.fmt(Math.exp(lp))})`),
      el("div", { class: "tip-text" }, JSON.stringify(s.textContent.replace(/↵\n/g, "\n")))]);
  }

  return { render };
})();
