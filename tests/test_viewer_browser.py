"""`looprl view` in a real browser: Debian's chromium, headless, driven by Playwright.

Loads a folder with two training runs (one written with the metric names of before the namespaces)
and an eval result directory, checks that curves are drawn (series colours on the canvas) and
update live, opens a rollout, toggles the token view, opens the compare view, and saves
screenshots (to $LOOPRL_VIEWER_SHOTS when set, else a pytest tmp dir) that must be real PNGs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import CHROMIUM

from looprl.viewer import start_server
from looprl.viewer.synthetic import (
    build_tokenizer,
    hf_encoder,
    write_demo,
    write_hostile_run,
    write_run,
)

ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

pytestmark = [pytest.mark.slow, pytest.mark.browser]  # skipped without Chromium: conftest.py


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    """Two runs in one folder; `alpha` has a tokenizer and one malformed rollout line, `beta`
    the bare metric names of a run made before the namespaces (`kl`, `loss`, ...)."""
    root = tmp_path / "runs"
    tok = build_tokenizer(root / "alpha" / "final")  # the run's own: the viewer follows it
    write_run(
        root / "alpha",
        steps=12,
        tasks=5,
        group=4,
        eval_every=4,
        encode=hf_encoder(tok),
        model=str(tok),
    )
    write_run(root / "beta", steps=8, tasks=5, group=4, eval_every=4, seed=1, old_names=True)
    with open(root / "alpha" / "rollouts" / "step_000012.jsonl", "a") as f:
        f.write("{this line is broken\n")
    ev = root / "gamma-eval"  # a `looprl eval` result directory
    ev.mkdir()
    (ev / "results.jsonl").write_bytes((root / "beta/eval/step_000008/results.jsonl").read_bytes())
    (ev / "metadata.json").write_text(json.dumps({"summary": {"accuracy": 0.6, "reward": 0.7}}))
    return root


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go."""
    d = Path(os.environ.get("LOOPRL_VIEWER_SHOTS") or tmp_path / "shots")
    d.mkdir(parents=True, exist_ok=True)
    return d


def check_png(path: Path) -> None:
    """The file is a PNG with real content (many colours), not a blank page."""
    from PIL import Image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, path
    with Image.open(path) as im:
        colours = im.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50, f"{path} looks blank"


def colour_count(page, chart: str, hex_colour: str) -> int:
    """Pixels of `hex_colour` on the named chart's canvas."""
    return page.evaluate(f"LV.app.state.charts[{chart!r}].colorCount({hex_colour!r})")


def test_viewer_in_chromium(runs_dir: Path, shots: Path):
    sync_api = pytest.importorskip("playwright.sync_api")
    srv, url = start_server([runs_dir])
    errors: list[str] = []
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            # the server's Content-Security-Policy forbids eval, which Playwright's waits use
            page = browser.new_page(viewport={"width": 1400, "height": 900}, bypass_csp=True)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            check_curves(page, runs_dir, shots)
            check_rollouts(page, runs_dir, shots)
            check_compare(page, shots)
            browser.close()
    finally:
        srv.close()
    assert not errors, errors
    for name in ("curves", "episode", "tokens", "compare"):
        check_png(shots / f"{name}.png")


def check_curves(page, runs_dir: Path, shots: Path) -> None:
    """Both runs overlaid (one colour per run), axis switch, live update without reload."""
    page.wait_for_function("LV.app.state.charts.reward && LV.app.state.charts['policy/kl']")
    page.wait_for_function("Object.keys(LV.app.state.metrics).length === 3")
    assert "gamma-eval" in page.inner_text("#summaries") and "accuracy" in page.inner_text(
        "#summaries"
    )
    page.wait_for_function("LV.app.state.charts.reward.series.some(s => s.points.length === 12)")
    assert colour_count(page, "reward", "#2f6fde") > 100  # alpha
    assert colour_count(page, "reward", "#e0533d") > 100  # beta
    titles = page.eval_on_selector_all(".chart h3", "els => els.map(e => e.textContent)")
    assert titles[:2] == ["reward", "eval"] and "policy/kl" in titles and "time" in titles
    assert "kl" not in titles  # beta's old `kl` is drawn with alpha's `policy/kl`
    assert colour_count(page, "policy/kl", "#e0533d") > 50  # beta
    page.screenshot(path=str(shots / "curves.png"), full_page=True)
    page.select_option("#xaxis", "wall_time")
    assert page.evaluate("LV.app.state.charts['policy/kl'].xKind") == "wall_time"
    assert colour_count(page, "policy/kl", "#2f6fde") > 50
    row = {"step": 13, "wall_time": 60.0, "reward/mean": 2.0, "policy/kl": 0.5}
    with open(runs_dir / "alpha" / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    page.wait_for_function(
        "LV.app.state.charts.reward.series.some(s => s.points.length === 13)", timeout=10_000
    )


def check_rollouts(page, runs_dir: Path, shots: Path) -> None:
    """Browse, open an episode turn by turn, then toggle the token view."""
    page.click("#tabs button[data-tab=rollouts]")
    page.wait_for_selector("#rollouts tbody tr")
    assert "malformed" in page.inner_text("#notices")
    assert page.input_value("#f-step") == "12"
    page.select_option("#f-step", "all")
    page.wait_for_function("document.querySelector('#page-info').textContent.includes('of 240')")
    roll = runs_dir / "alpha" / "rollouts"
    (roll / "step_000013.jsonl").write_bytes((roll / "step_000011.jsonl").read_bytes())
    page.wait_for_function(  # the list follows the growing run without a reload
        "document.querySelector('#page-info').textContent.includes('of 260')", timeout=10_000
    )
    page.click("#rollouts tbody tr:nth-child(3)")
    page.wait_for_selector("#episode .ep-head")
    assert page.inner_text("#episode .call .name") == "calculator"
    assert "TOOL RESULT" in page.inner_text("#episode").upper()
    assert page.locator("#episode .think").count() == 2
    page.screenshot(path=str(shots / "episode.png"), full_page=True)
    page.click("#episode .tok-toggle")
    page.wait_for_selector("#episode .tokens .tok.m1")
    assert page.locator("#episode .tok.m0").count() > 20
    assert page.locator("#episode .tok.m1").count() > 20
    assert "tokenizer from" in page.inner_text("#episode .tokenizer-note")
    trained = page.eval_on_selector_all(
        "#episode .tok.m1", "els => els.map(e => e.textContent).join('')"
    )
    assert "The answer is" in trained and "What is" not in trained
    page.screenshot(path=str(shots / "tokens.png"), full_page=True)


def check_compare(page, shots: Path) -> None:
    """A training episode's compare button opens the held-out grid; a cell puts that eval step
    beside the latest one for the same task."""
    page.click("#episode .compare-btn")
    page.wait_for_selector("#grid td.cell")
    heads = page.eval_on_selector_all("#grid th", "els => els.map(e => e.textContent)")
    assert heads == ["task", "step 4", "step 8", "step 12", "Δ"]
    page.click("#grid tr:nth-child(3) td.cell[data-step='4']")
    page.wait_for_selector("#side-a .ep-head")
    page.wait_for_selector("#side-b .ep-head")
    assert (
        page.input_value("#side-a .c-step") == "4" and page.input_value("#side-b .c-step") == "12"
    )
    task = page.input_value("#c-task")
    assert page.inner_text("#side-a h2") == page.inner_text("#side-b h2") == task == "task-0001"
    page.screenshot(path=str(shots / "compare.png"), full_page=True)


PAYLOAD = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
HOSTILE_DIR = "run <img src=x onerror=window.__xss=3>"


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    """A training run and an eval directory whose every field (and names) carry HTML payloads."""
    root = tmp_path / "runs"
    tok = build_tokenizer(root / HOSTILE_DIR / "final")  # the run's own: the viewer follows it
    run = write_hostile_run(root / HOSTILE_DIR, PAYLOAD, encode=hf_encoder(tok))
    (run / "config.json").write_text(json.dumps({"model": str(tok), "note": PAYLOAD}))
    with open(run / "rollouts" / "step_000001.jsonl", "a") as f:
        f.write('{"task": {"id": 5}, "messages": "<img src=x onerror=window.__xss=4>"}\n')
    ev = root / "eval <b>x"
    ev.mkdir()
    (ev / "results.jsonl").write_bytes((run / "rollouts" / "step_000001.jsonl").read_bytes())
    (ev / "metadata.json").write_text(json.dumps({"summary": {PAYLOAD: PAYLOAD}}))
    return root


def test_hostile_fields_show_as_text(hostile_dir: Path, shots: Path):
    """Payloads in every field show literally; no element is made from them and nothing runs.

    The page is loaded with the server's Content-Security-Policy bypassed, so an injected
    `onerror` would run: the page's own handling of text, not the policy, must stop it.
    """
    sync_api = pytest.importorskip("playwright.sync_api")
    srv, url = start_server([hostile_dir])
    errors: list[str] = []
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            # the server's Content-Security-Policy forbids eval, which Playwright's waits use
            page = browser.new_page(viewport={"width": 1400, "height": 900}, bypass_csp=True)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            check_hostile_curves(page, shots)
            check_hostile_episode(page, shots)
            assert page.evaluate("window.__xss") is None
            assert page.evaluate("document.querySelectorAll('img').length") == 0
            assert page.evaluate("document.querySelectorAll('script').length") == 7  # ours
            browser.close()
    finally:
        srv.close()
    assert not errors, errors
    check_png(shots / "hostile-episode.png")


def check_hostile_curves(page, shots: Path) -> None:
    """Run names, metric names (chart titles, legend, hover tooltip) and the summary table."""
    page.wait_for_function("Object.keys(LV.app.state.charts).length === 1")
    assert HOSTILE_DIR in page.inner_text("#run-toggles")
    assert PAYLOAD in page.inner_text("#summaries")
    titles = page.eval_on_selector_all(".chart h3", "els => els.map(e => e.textContent)")
    assert titles == [PAYLOAD.split("/")[0]]  # metrics are grouped by the part before "/"
    legend = page.inner_text("#charts .legend")
    assert f"{PAYLOAD}/mean" in legend and legend.count(PAYLOAD) == 2
    box = page.locator(".chart canvas.overlay").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector("#tooltip:not([hidden])")
    assert PAYLOAD[:20] in page.inner_text("#tooltip")
    page.wait_for_function(  # episode files are indexed by the first rollouts query
        "document.querySelector('#notices').textContent.includes('1 malformed line skipped')",
        timeout=10_000,
    )
    page.screenshot(path=str(shots / "hostile-curves.png"), full_page=True)


def check_hostile_episode(page, shots: Path) -> None:
    """The rollout list, the episode turn by turn, the token view and its tooltip."""
    page.click("#tabs button[data-tab=rollouts]")
    run_id = page.evaluate(f"LV.app.state.runs.find(r => r.name === {HOSTILE_DIR!r}).id")
    page.select_option("#f-run", run_id)
    page.wait_for_selector("#rollouts tbody tr[data-file='train:1']")
    assert page.inner_text("#page-info") == "1–2 of 2 · 1 malformed line skipped"
    assert page.inner_text("#rollouts tbody tr:first-child td.task") == f"{PAYLOAD} task-0"
    page.click("#rollouts tbody tr:first-child")
    page.wait_for_selector("#episode .ep-head")
    assert page.inner_text("#episode h2") == f"{PAYLOAD} task-0"
    assert page.inner_text("#episode .call .name") == PAYLOAD
    text = page.inner_text("#episode")
    assert text.count(PAYLOAD) >= 8 and f"{PAYLOAD}: {PAYLOAD}" in text  # error kind: message
    page.click("#episode details.task summary")
    assert f"answer: {PAYLOAD}" in page.inner_text("#episode details.task")
    page.screenshot(path=str(shots / "hostile-episode.png"), full_page=True)
    page.click("#episode .tok-toggle")
    page.wait_for_selector("#episode .tokens .tok.m1")
    assert "<img" in page.inner_text("#episode .tokens")
    page.hover("#episode .tokens .tok.m1 >> nth=3")
    page.wait_for_selector("#tooltip:not([hidden])")
    assert "logprob" in page.inner_text("#tooltip")
    page.screenshot(path=str(shots / "hostile-tokens.png"), full_page=True)


def open_page(p, url: str, errors: list[str]):
    """A Chromium page on `url` that records page errors."""
    browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 900}, bypass_csp=True)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    return browser, page


def test_issue18_fixes_in_chromium(tmp_path: Path, shots: Path):
    """Sections, constants folded, eval rates apart from counts, ticks, resize while hidden,
    monitor badges and marks, before/after evals, previews, advantage, malformed-call turns,
    the held-out compare grid and the probe table, on the synthetic demo folder."""
    sync_api = pytest.importorskip("playwright.sync_api")
    demo = write_demo(tmp_path / "runs")
    srv, url = start_server([demo])
    errors: list[str] = []
    try:
        with sync_api.sync_playwright() as p:
            browser, page = open_page(p, url, errors)
            check_sections_and_axes(page, shots)
            check_resize_on_another_tab(page)
            check_episode_insights(page, shots)
            check_eval_grid(page, shots)
            check_probe(page, shots)
            browser.close()
    finally:
        srv.close()
    assert not errors, errors
    for name in ("sections", "advantage", "malformed", "grid", "probe"):
        check_png(shots / f"{name}.png")


def check_sections_and_axes(page, shots: Path) -> None:
    page.wait_for_function("LV.app.state.charts.eval && LV.app.state.charts['eval/gen_tokens']")
    sections = page.eval_on_selector_all(
        "details.section", "els => els.map(e => e.dataset.section)"
    )
    # a section per metric namespace, in the order of docs/metrics.md's list
    assert sections == ["reward", "eval", "monitor", "rollout", "loss", "policy", "train", "time"]
    assert page.get_attribute("details.section[data-section=train]", "open") is None  # folded
    # constants folded away behind a toggle: train/lr and rollout/errors never change
    toggle = page.locator("details[data-section=train] .const-toggle")
    assert toggle.text_content() == "1 constant series hidden"
    assert "train/lr = 1.00e-4" in page.text_content("details[data-section=train] .constants")
    assert "train/lr" not in page.evaluate("Object.keys(LV.app.state.charts)")
    # the eval chart holds rates only (y axis [0, 1]); token counts get their own chart
    labels = page.evaluate("LV.app.state.charts.eval.series.map(s => s.label)")
    assert "eval/pass@1" in labels and not any("gen_tokens" in x for x in labels)
    assert page.evaluate("LV.app.state.charts.eval.f.y0 <= 0 && LV.app.state.charts.eval.f.y1 >= 1")
    # before/after evals are diamonds on the eval charts; eval steps and monitor trips are marks
    assert {"eval_before (before eval)", "eval_after (after eval)"} <= set(labels)
    marks = page.evaluate("LV.app.state.charts.eval.marks.map(m => m.label).filter(Boolean)")
    assert marks == ["⚑ reward_up_eval_down", "⚑ length_blowup"]
    assert page.evaluate("LV.app.state.charts.eval.colorCount('#c8372d')") > 20
    assert "reward_up_eval_down @ step 14" in page.inner_text("#run-toggles label[data-run=grpo]")
    assert "length_blowup @ step 17" in page.inner_text("#monitor-banner")
    # tick labels: zero is "0", tiny spacings use exponents
    assert page.evaluate("LV.charts.fmtTick(0, 1e-9)") == "0"
    assert page.evaluate("LV.charts.fmtTick(5e-10, 5e-10)") == "5e-10"
    assert page.evaluate("LV.charts.fmtTick(0.25, 0.05)") == "0.25"
    assert page.evaluate("LV.charts.fmtTick(0.25, 0.25)") == "0.25"  # not 0.3
    assert page.evaluate("LV.charts.fmtTick(40, 2.5)") == "40.0"
    page.click("details[data-section=loss] > summary")
    page.wait_for_function("LV.app.state.charts.loss.canvas.clientHeight > 0")
    page.screenshot(path=str(shots / "sections.png"), full_page=True)


def check_resize_on_another_tab(page) -> None:
    page.click("#tabs button[data-tab=rollouts]")
    page.set_viewport_size({"width": 900, "height": 700})
    page.wait_for_timeout(300)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.click("#tabs button[data-tab=curves]")
    page.wait_for_function("LV.app.state.charts.reward.canvas.clientHeight === 220")
    page.wait_for_function("LV.app.state.charts.reward.canvas.height > 100")
    assert page.evaluate("LV.app.state.charts.reward.colorCount('#2f6fde')") > 50


def check_episode_insights(page, shots: Path) -> None:
    page.click("#tabs button[data-tab=rollouts]")
    page.wait_for_selector("#rollouts tbody tr td.preview")
    assert page.inner_text("#rollouts tbody tr:first-child .p-prompt") == "What is 3 * 7 + 0?"
    page.click("#rollouts tbody tr:nth-child(2)")
    page.wait_for_selector("#episode .group", timeout=30_000)
    group = page.inner_text("#episode .group")
    assert "advantage:" in group and "grpo · group_normalized" in group
    assert page.locator("#episode .group .chip").count() == 4
    assert page.locator("#episode .group .chip.me").count() == 1
    page.screenshot(path=str(shots / "advantage.png"), full_page=True)
    row = page.evaluate(  # an episode whose first turn is a malformed call (from the synthetic run)
        """LV.rollouts.state.items.findIndex(it => (it.tool_errors || {}).malformed_json)"""
    )
    assert row >= 0
    page.click(f"#rollouts tbody tr:nth-child({row + 1})")
    page.wait_for_selector("#episode .bad-call")
    bad = page.inner_text("#episode .bad-call")
    assert "malformed_json" in bad and '<tool_call>{"name": "calculator"' in bad
    assert "invalid JSON" in bad
    page.screenshot(path=str(shots / "malformed.png"), full_page=True)


def check_eval_grid(page, shots: Path) -> None:
    page.click("#episode .compare-btn")  # a training episode: the held-out eval grid
    page.wait_for_selector("#grid td.cell")
    heads = page.eval_on_selector_all("#grid th", "els => els.map(e => e.textContent)")
    assert heads == ["task", "step 0", "step 5", "step 10", "step 15", "step 20", "Δ"]
    page.click("#grid tr:nth-child(2) td.cell[data-step='5']")
    page.wait_for_selector("#side-b .ep-head")
    assert (
        page.input_value("#side-a .c-step") == "5" and page.input_value("#side-b .c-step") == "20"
    )
    assert page.inner_text("#side-a h2") == page.inner_text("#side-b h2") == "task-0000"
    page.screenshot(path=str(shots / "grid.png"), full_page=True)


def check_probe(page, shots: Path) -> None:
    page.click("#tabs button[data-tab=probe]")
    page.wait_for_selector("#exploits tr[data-exploit]")
    assert page.inner_text("#exploits tr[data-exploit=many_candidates] .verdict") == "exploitable"
    assert "--strict fails" in page.inner_text("#p-head")
    page.click("#exploits tr[data-exploit=many_candidates]")
    page.wait_for_function("document.querySelector('#p-info').textContent.includes('4 episodes')")
    page.click("#p-episodes tbody tr:first-child")
    page.wait_for_selector("#p-episode .ep-head")
    assert "[many_candidates]" in page.inner_text("#p-episode")
    page.screenshot(path=str(shots / "probe.png"), full_page=True)


def write_weight1_run(path: Path) -> Path:
    """A finished run whose only reward function equals `reward/mean` (weight 1), whose first
    step-10 episode carries five flags, and whose summary.json says it finished."""
    run = write_run(path, steps=10, tasks=4, group=4, eval_every=5)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r["reward/correct"] = r["reward/mean"]
        r.pop("reward/format")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = run / "rollouts" / "step_000010.jsonl"
    lines = f.read_text().splitlines()
    ep = json.loads(lines[0])
    ep["errors"] = [{"kind": k, "message": "x"} for k in ("scoring", "timeout", "environment")]
    ep["tool_errors"], ep["truncated"] = {"malformed_json": 1}, True
    f.write_text("\n".join([json.dumps(ep), *lines[1:]]) + "\n")
    (run / "summary.json").write_text(json.dumps({"status": "finished", "error": None}))
    return run


def test_issue28_fixes_in_chromium(tmp_path: Path, shots: Path):
    """Run status and config panel, the std band clipped to [0, 1], a weight-1 reward function
    visible over the mean, end points and before/after diamonds inside the frame, the flags
    column inside the list, and an episode pane that empties when a filter hides its episode."""
    sync_api = pytest.importorskip("playwright.sync_api")
    demo = write_demo(tmp_path / "demo")
    grpo_metrics = demo / "grpo" / "metrics.jsonl"
    os.utime(grpo_metrics, (1e9, 1e9))  # final/ exported long ago: finished
    run = write_weight1_run(tmp_path / "w" / "weight1")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r["reward/mean"] - r["reward/std"] < 0 for r in rows)  # the band needs clipping
    srv, url = start_server([demo, run])
    errors: list[str] = []
    try:
        with sync_api.sync_playwright() as p:
            browser, page = open_page(p, url, errors)
            check_status_and_config(page)
            check_reward_band_and_copy(page, shots)
            check_points_inside_frame(page)
            check_flags_and_stale_pane(page, shots)
            browser.close()
    finally:
        srv.close()
    assert not errors, errors
    for name in ("status-config", "weight1-reward", "flags", "pane-cleared"):
        check_png(shots / f"{name}.png")


def check_status_and_config(page) -> None:
    page.wait_for_function("document.querySelector('#live').textContent === 'finished'")
    assert page.inner_text("#run-toggles label[data-run=weight1] .run-status") == "finished"
    page.wait_for_selector("#configs details[data-run=weight1]")
    assert page.get_attribute("#configs details[data-run=weight1]", "open") is None  # folded
    page.click("#configs details[data-run=weight1] > summary")
    assert '"steps": 10' in page.inner_text("#configs details[data-run=weight1] pre")


def check_reward_band_and_copy(page, shots: Path) -> None:
    page.uncheck("#run-toggles input[data-run=grpo]")
    page.wait_for_function("LV.app.state.charts.reward.series.length === 2")
    series = page.evaluate(
        "LV.app.state.charts.reward.series.map(s => [s.label, s.dash, s.band.map(b => [b[1], b[2]])])"
    )
    labels = [s[0] for s in series]
    assert labels == ["reward/mean ± std", "reward/correct (= reward/mean)"]  # the copy on top
    assert series[1][1] != []  # dashed
    assert all(0 <= lo <= hi <= 1 for lo, hi in series[0][2]) and series[0][2]
    assert colour_count(page, "reward", "#2f6fde") > 100  # the copy's colour shows over the mean
    page.locator(".chart[data-title=reward]").screenshot(path=str(shots / "weight1-reward.png"))
    page.screenshot(path=str(shots / "status-config.png"))
    page.check("#run-toggles input[data-run=grpo]")


def check_points_inside_frame(page) -> None:
    """Every point (the diamonds of the before/after evals included) is at least a diamond's
    half width inside the plot frame."""
    page.wait_for_function(
        "LV.app.state.charts.eval.series.some(s => s.marker) && LV.app.state.charts.eval.f"
    )
    outside = page.evaluate(
        """['eval', 'reward'].flatMap(t => {
          const c = LV.app.state.charts[t], f = c.f, M = LV.charts.M, e = 6;
          return c.visible().flatMap(s => s.points.filter(([x, y]) =>
            f.xp(x) < M.left + e || f.xp(x) > M.left + f.pw - e ||
            f.yp(y) < M.top + e || f.yp(y) > M.top + f.ph - e).map(p => [t, s.label, p]));
        })"""
    )
    assert outside == []


def check_flags_and_stale_pane(page, shots: Path) -> None:
    page.click("#tabs button[data-tab=rollouts]")
    page.select_option("#f-run", "weight1")
    page.wait_for_selector("#rollouts tbody tr td.flags .pill")
    page.wait_for_function("LV.rollouts.state.items.length === 16")
    flags = page.locator("#rollouts tbody tr:first-child td.flags")
    assert flags.locator(".pill").count() == 5
    cell, pane = flags.bounding_box(), page.locator("#tab-rollouts .list-pane").bounding_box()
    assert cell["x"] + cell["width"] <= pane["x"] + pane["width"]  # not cut by the pane's edge
    assert page.evaluate(
        "(() => { const c = document.querySelector('#rollouts tbody tr td.flags');"
        " return c.scrollWidth <= c.clientWidth; })()"
    )
    page.click("#rollouts tbody tr:first-child")
    page.wait_for_selector("#episode .ep-head")
    page.screenshot(path=str(shots / "flags.png"))
    page.select_option("#f-errors", "clean")  # hides the selected episode (it has errors)
    page.wait_for_selector("#episode .no-episode")
    assert page.locator("#episode .ep-head").count() == 0
    assert page.evaluate("LV.rollouts.state.selected") is None
    page.screenshot(path=str(shots / "pane-cleared.png"))
