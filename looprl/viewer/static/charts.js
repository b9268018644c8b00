// looprl view: line charts drawn on <canvas> (axes, legend, EMA smoothing, std bands, hover,
// vertical marks for eval steps and monitor trips, diamond markers for before/after evals).
"use strict";
window.LV = window.LV || {};

LV.charts = (() => {
  const PALETTE = ["#2f6fde", "#e0533d", "#2f8a4b", "#9b59b6", "#d9962b", "#17a2b8",
    "#c2185b", "#6d7b8d", "#7cb342", "#5c6bc0", "#8d6e63", "#00897b"];
  const DASHES = [[], [6, 3], [2, 3], [8, 3, 2, 3], [1, 2]];
  const M = { left: 56, right: 12, top: 8, bottom: 24 };
  const EDGE_PX = 8; // a diamond marker's half width (6) and its outline

  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
    if (Number.isInteger(v)) return String(v);
    return String(Number(v.toPrecision(4)));
  }

  // Tick labels: as many digits as the tick spacing needs, no more; zero is always "0". Small
  // or huge spacings use exponents (1e-9 steps would otherwise print as 0.000000001).
  function fmtTick(v, step) {
    if (Math.abs(v) < step * 1e-6) return "0";
    if (step < 1e-3 || Math.abs(v) >= 1e5) {
      const digits = Math.max(0, Math.min(4, Math.floor(Math.log10(Math.abs(v))) - Math.floor(Math.log10(step) + 1e-9)));
      return v.toExponential(digits).replace("e+", "e");
    }
    let dec = 0; // the fewest decimals that write the spacing exactly (0.25 needs 2, not 1)
    while (dec < 8 && Math.abs(Math.round(step * 10 ** dec) - step * 10 ** dec) > 1e-6) dec += 1;
    return v.toFixed(dec);
  }

  function fmtDuration(s) {
    if (!isFinite(s)) return "–";
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    const p = (n) => String(n).padStart(2, "0");
    return h ? `${h}:${p(m)}:${p(sec)}` : `${m}:${p(sec)}`;
  }

  function ticks(lo, hi, n) {
    const span = hi - lo;
    if (!(span > 0)) return [lo];
    const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((k) => k * mag).find((s) => span / s <= n) || 10 * mag;
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
    out.step = step;
    return out;
  }

  function ema(points, w) {
    if (!(w > 0)) return points;
    const out = [];
    let acc = 0, n = 0;
    for (const [x, y] of points) {
      n += 1;
      acc = acc * w + (1 - w) * y;
      out.push([x, acc / (1 - Math.pow(w, n))]); // debiased, as TensorBoard does
    }
    return out;
  }

  // Keep at most two points (min and max) per pixel column so huge series draw fast.
  function decimate(points, x2px, width) {
    if (points.length <= width * 2) return points;
    const out = [];
    let col = null, lo = null, hi = null;
    const flush = () => { if (lo) { out.push(lo[0] <= hi[0] ? lo : hi); out.push(lo[0] <= hi[0] ? hi : lo); } };
    for (const p of points) {
      const c = Math.round(x2px(p[0]));
      if (c !== col) { flush(); col = c; lo = hi = p; continue; }
      if (p[1] < lo[1]) lo = p;
      if (p[1] > hi[1]) hi = p;
    }
    flush();
    return out;
  }

  function nearest(points, x) {
    let lo = 0, hi = points.length - 1;
    if (hi < 0) return null;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (points[mid][0] < x) lo = mid + 1; else hi = mid;
    }
    if (lo > 0 && Math.abs(points[lo - 1][0] - x) < Math.abs(points[lo][0] - x)) lo -= 1;
    return points[lo];
  }

  // The legend's sample of a series' line (colour and dash pattern come from PALETTE / DASHES).
  function swatchLine(color, dash) {
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg"), line = document.createElementNS(NS, "line");
    for (const [k, v] of Object.entries({ width: 20, height: 8 })) svg.setAttribute(k, v);
    const attrs = { x1: 0, y1: 4, x2: 20, y2: 4, stroke: color, "stroke-width": 2.5, "stroke-dasharray": (dash || []).join(",") };
    for (const [k, v] of Object.entries(attrs)) line.setAttribute(k, v);
    svg.append(line);
    return svg;
  }

  class LineChart {
    constructor(parent, title) {
      this.canvas = document.createElement("canvas");
      this.overlay = LV.el("canvas", { class: "overlay", style: "position:absolute;left:0;top:0" });
      this.legend = LV.el("div", { class: "legend" });
      this.el = LV.el("div", { class: "chart", "data-title": title },
        LV.el("h3", {}, title), LV.el("div", { style: "position:relative" }, this.canvas, this.overlay), this.legend);
      this.series = [];
      this.marks = [];
      this.hidden = new Set();
      this.xKind = "step";
      this.smoothing = 0;
      parent.appendChild(this.el);
      this.overlay.addEventListener("mousemove", (e) => this.hover(e));
      this.overlay.addEventListener("mouseleave", () => this.unhover());
      // redrawn whenever its size changes, including when a hidden tab or section is shown again
      new ResizeObserver(() => this.draw()).observe(this.canvas);
    }

    // marks: vertical lines [{x, color, dash, label}] (eval steps, monitor trips)
    setData(series, xKind, smoothing, marks) {
      this.series = series;
      this.marks = marks || [];
      this.xKind = xKind;
      this.smoothing = smoothing;
      this.renderLegend();
      this.draw();
    }

    renderLegend() {
      this.legend.replaceChildren();
      const labels = new Map(); // series sharing a label (a before/after eval's metrics) share an entry
      for (const s of this.series) (labels.get(s.label) || labels.set(s.label, []).get(s.label)).push(s);
      for (const [label, group] of labels) {
        const s = group[0], span = document.createElement("span");
        span.className = this.hidden.has(s.name) ? "off" : "";
        span.append(s.marker ? LV.el("i", { class: "diamond", style: `background:${s.color}` }) : swatchLine(s.color, s.dash), label);
        span.onclick = () => {
          const hide = !this.hidden.has(s.name);
          for (const x of group) if (hide) this.hidden.add(x.name); else this.hidden.delete(x.name);
          this.renderLegend();
          this.draw();
        };
        this.legend.appendChild(span);
      }
    }

    visible() { return this.series.filter((s) => !this.hidden.has(s.name) && s.points.length); }

    frame() {
      const w = this.canvas.clientWidth, h = this.canvas.clientHeight;
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const s of this.visible()) {
        for (const [x, y] of s.points) {
          if (x < x0) x0 = x; if (x > x1) x1 = x;
          if (y < y0) y0 = y; if (y > y1) y1 = y;
        }
        for (const [, lo, hi] of s.band || []) { if (lo < y0) y0 = lo; if (hi > y1) y1 = hi; }
      }
      if (!isFinite(x0)) return null;
      if (this.el.classList.contains("unit")) { y0 = Math.min(y0, 0); y1 = Math.max(y1, 1); } // rates: the whole [0, 1]
      if (x0 === x1) { x0 -= 1; x1 += 1; }
      if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
      const pw = w - M.left - M.right, ph = h - M.top - M.bottom;
      // room for the end points' dots and the before/after diamonds (EDGE_PX from each edge)
      const xpad = ((x1 - x0) * EDGE_PX) / Math.max(1, pw - 2 * EDGE_PX);
      const ypad = Math.max((y1 - y0) * 0.05, ((y1 - y0) * EDGE_PX) / Math.max(1, ph - 2 * EDGE_PX));
      x0 -= xpad; x1 += xpad; y0 -= ypad; y1 += ypad;
      return { w, h, x0, x1, y0, y1, pw, ph,
        xp: (x) => M.left + ((x - x0) / (x1 - x0)) * pw,
        yp: (y) => M.top + (1 - (y - y0) / (y1 - y0)) * ph,
        xv: (px) => x0 + ((px - M.left) / pw) * (x1 - x0) };
    }

    // The backing store follows the element's CSS size; the CSS size itself is never written, so
    // a chart drawn while hidden (size 0) comes back at full size once shown.
    setup(canvas) {
      const dpr = window.devicePixelRatio || 1;
      const w = this.canvas.clientWidth, h = this.canvas.clientHeight;
      canvas.width = Math.max(1, Math.round(w * dpr));
      canvas.height = Math.max(1, Math.round(h * dpr));
      const ctx = canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      return ctx;
    }

    draw() {
      if (!this.canvas.clientWidth || !this.canvas.clientHeight) return; // hidden: drawn when shown
      const ctx = this.setup(this.canvas);
      this.setup(this.overlay);
      const f = this.frame();
      this.f = f;
      ctx.clearRect(0, 0, this.canvas.clientWidth, this.canvas.clientHeight);
      ctx.font = "11px system-ui, sans-serif";
      if (!f) { ctx.fillStyle = "#6b7385"; ctx.fillText("no data yet", M.left + 8, 40); return; }
      this.drawAxes(ctx, f);
      ctx.save();
      ctx.beginPath(); ctx.rect(M.left, M.top, f.pw, f.ph); ctx.clip();
      this.drawMarks(ctx, f);
      for (const s of this.visible()) this.drawSeries(ctx, f, s);
      ctx.restore();
    }

    drawMarks(ctx, f) {
      for (const m of this.marks) {
        if (m.x < f.x0 || m.x > f.x1) continue;
        const x = Math.round(f.xp(m.x)) + 0.5;
        ctx.strokeStyle = m.color; ctx.lineWidth = m.width || 1; ctx.setLineDash(m.dash || []);
        ctx.beginPath(); ctx.moveTo(x, M.top); ctx.lineTo(x, M.top + f.ph); ctx.stroke();
        ctx.setLineDash([]);
        if (m.label) {
          ctx.fillStyle = m.color; ctx.textAlign = "left"; ctx.textBaseline = "top";
          ctx.fillText(m.label, x + 3, M.top + 2 + 12 * (m.row || 0));
        }
      }
      ctx.lineWidth = 1;
    }

    drawAxes(ctx, f) {
      ctx.strokeStyle = "#eceff4"; ctx.fillStyle = "#6b7385"; ctx.lineWidth = 1;
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      const yt = ticks(f.y0, f.y1, 5);
      for (const t of yt) {
        const y = Math.round(f.yp(t)) + 0.5;
        ctx.beginPath(); ctx.moveTo(M.left, y); ctx.lineTo(M.left + f.pw, y); ctx.stroke();
        ctx.fillText(fmtTick(t, yt.step), M.left - 6, y);
      }
      ctx.textAlign = "center"; ctx.textBaseline = "top";
      const xt = ticks(f.x0, f.x1, Math.max(2, Math.floor(f.pw / 80)));
      for (const t of xt) {
        const x = Math.round(f.xp(t)) + 0.5;
        ctx.beginPath(); ctx.moveTo(x, M.top); ctx.lineTo(x, M.top + f.ph); ctx.stroke();
        ctx.fillText(this.xKind === "wall_time" ? fmtDuration(t) : fmtTick(t, xt.step), x, M.top + f.ph + 5);
      }
      ctx.strokeStyle = "#c5cbd6";
      ctx.strokeRect(M.left + 0.5, M.top + 0.5, f.pw, f.ph);
    }

    drawSeries(ctx, f, s) {
      if (s.band && s.band.length) {
        ctx.fillStyle = s.color; ctx.globalAlpha = 0.12; ctx.beginPath();
        s.band.forEach(([x, , hi], i) => (i ? ctx.lineTo(f.xp(x), f.yp(hi)) : ctx.moveTo(f.xp(x), f.yp(hi))));
        for (let i = s.band.length - 1; i >= 0; i--) ctx.lineTo(f.xp(s.band[i][0]), f.yp(s.band[i][1]));
        ctx.fill(); ctx.globalAlpha = 1;
      }
      if (s.marker) { // a before/after eval: one diamond per point, no line
        ctx.fillStyle = s.color; ctx.strokeStyle = "#fff";
        for (const [x, y] of s.points) {
          const px = f.xp(x), py = f.yp(y);
          ctx.beginPath(); ctx.moveTo(px, py - 6); ctx.lineTo(px + 6, py); ctx.lineTo(px, py + 6); ctx.lineTo(px - 6, py); ctx.closePath();
          ctx.fill(); ctx.stroke();
        }
        return;
      }
      const smooth = this.smoothing > 0;
      this.line(ctx, f, s, s.points, smooth ? 0.25 : 1);
      if (smooth) this.line(ctx, f, s, ema(s.points, this.smoothing), 1);
      if (s.points.length <= 40) {
        ctx.fillStyle = s.color;
        for (const [x, y] of s.points) { ctx.beginPath(); ctx.arc(f.xp(x), f.yp(y), 2.5, 0, 2 * Math.PI); ctx.fill(); }
      }
    }

    line(ctx, f, s, points, alpha) {
      const pts = decimate(points, f.xp, f.pw);
      ctx.strokeStyle = s.color; ctx.globalAlpha = alpha; ctx.lineWidth = s.width || 1.6;
      ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      pts.forEach(([x, y], i) => (i ? ctx.lineTo(f.xp(x), f.yp(y)) : ctx.moveTo(f.xp(x), f.yp(y))));
      ctx.stroke();
      ctx.setLineDash([]); ctx.globalAlpha = 1;
    }

    hover(e) {
      const f = this.f;
      if (!f) return;
      const rect = this.overlay.getBoundingClientRect();
      const x = f.xv(e.clientX - rect.left);
      const ctx = this.overlay.getContext("2d");
      ctx.clearRect(0, 0, f.w, f.h);
      const rows = [];
      let px = null;
      for (const s of this.visible()) {
        const p = nearest(s.points, x);
        if (!p) continue;
        px = f.xp(p[0]);
        ctx.fillStyle = s.color; ctx.beginPath(); ctx.arc(px, f.yp(p[1]), 3.5, 0, 2 * Math.PI); ctx.fill();
        const at = this.xKind === "wall_time" ? fmtDuration(p[0]) : fmt(p[0]);
        rows.push(LV.el("div", { class: "tip-row" }, LV.el("i", { class: "swatch", style: `background:${s.color}` }),
          LV.el("span", { class: "tip-label" }, s.label), ":", LV.el("b", {}, fmt(p[1])), LV.el("span", { class: "tip-at" }, `@ ${at}`)));
      }
      if (px !== null) {
        ctx.strokeStyle = "rgba(29,35,48,.35)"; ctx.beginPath();
        ctx.moveTo(px, M.top); ctx.lineTo(px, M.top + f.ph); ctx.stroke();
      }
      LV.showTooltip(e.clientX, e.clientY, rows);
    }

    unhover() {
      if (this.f) this.overlay.getContext("2d").clearRect(0, 0, this.f.w, this.f.h);
      LV.hideTooltip();
    }

    // Pixels close to colour `hex` (tests use it to check that a series was really drawn).
    colorCount(hex) {
      const c = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
      const d = this.canvas.getContext("2d").getImageData(0, 0, this.canvas.width, this.canvas.height).data;
      let n = 0;
      for (let i = 0; i < d.length; i += 4) {
        if (d[i + 3] > 200 && Math.abs(d[i] - c[0]) + Math.abs(d[i + 1] - c[1]) + Math.abs(d[i + 2] - c[2]) < 40) n += 1;
      }
      return n;
    }
  }

  return { LineChart, PALETTE, DASHES, M, EDGE_PX, fmt, fmtTick, fmtDuration, ema, ticks };
})();
