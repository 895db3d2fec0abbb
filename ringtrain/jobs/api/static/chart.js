// A small SVG line chart: axes with round ticks, one path per line, a legend, and a hover read-out.
// No dependencies; text goes in through textContent only.
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const W = 600, H = 220, M = { l: 56, r: 14, t: 10, b: 26 };
  const MAX_DRAWN = 1500; // points per line drawn; more are thinned to keep redraws cheap

  function svg(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function ticks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; lo = lo - 1; }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map(s => s * mag).find(s => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
    return String(Math.round(v * 1e4) / 1e4);
  }

  class LineChart {
    constructor(parent, title) {
      this.root = document.createElement("div");
      this.root.className = "chart";
      const h = document.createElement("h3");
      h.textContent = title;
      this.root.appendChild(h);
      this.svg = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" }, this.root);
      this.legend = document.createElement("div");
      this.legend.className = "legend";
      this.root.appendChild(this.legend);
      parent.appendChild(this.root);
      this.lines = [];
      this.svg.addEventListener("mousemove", e => this.hover(e));
      this.svg.addEventListener("mouseleave", () => this.draw());
    }

    // lines: [{name, color, xs, ys}] (xs ascending); xTime: x values are epoch seconds
    set(lines, xTime) {
      this.lines = lines;
      this.xTime = xTime;
      this.draw();
    }

    points() { return this.lines.reduce((n, l) => n + l.xs.length, 0); }

    scale() {
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const l of this.lines) {
        for (let i = 0; i < l.xs.length; i++) {
          const y = l.ys[i];
          if (!isFinite(y)) continue;
          x0 = Math.min(x0, l.xs[i]); x1 = Math.max(x1, l.xs[i]);
          y0 = Math.min(y0, y); y1 = Math.max(y1, y);
        }
      }
      if (!isFinite(x0)) return null;
      if (x1 === x0) { x1 = x0 + 1; }
      const pad = (y1 - y0) * 0.05 || Math.abs(y0) * 0.05 || 1;
      y0 -= pad; y1 += pad;
      const sx = v => M.l + (v - x0) / (x1 - x0) * (W - M.l - M.r);
      const sy = v => H - M.b - (v - y0) / (y1 - y0) * (H - M.t - M.b);
      return { x0, x1, y0, y1, sx, sy };
    }

    draw(hoverX) {
      const s = this.svg;
      while (s.firstChild) s.removeChild(s.firstChild);
      this.legend.textContent = "";
      const sc = this.scale();
      this.sc = sc;
      if (!sc) {
        const t = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "tip" }, s);
        t.textContent = "no points yet";
        return;
      }
      const axis = svg("g", { class: "axis" }, s);
      for (const v of ticks(sc.y0, sc.y1, 5)) {
        const y = sc.sy(v);
        svg("line", { x1: M.l, x2: W - M.r, y1: y, y2: y, class: "gridline" }, axis);
        const t = svg("text", { x: M.l - 6, y: y + 3, "text-anchor": "end" }, axis);
        t.textContent = fmt(v);
      }
      const xt = this.xTime ? ticks(0, sc.x1 - sc.x0, 6).map(v => v + sc.x0) : ticks(sc.x0, sc.x1, 6);
      for (const v of xt) {
        if (v < sc.x0 || v > sc.x1) continue;
        const x = sc.sx(v);
        svg("line", { x1: x, x2: x, y1: H - M.b, y2: H - M.b + 4 }, axis);
        const t = svg("text", { x: x, y: H - 8, "text-anchor": "middle" }, axis);
        t.textContent = this.xTime ? `${Math.round(v - sc.x0)}s` : fmt(v);
      }
      svg("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b }, axis);
      for (const l of this.lines) {
        const n = l.xs.length, stride = Math.max(1, Math.ceil(n / MAX_DRAWN));
        let d = "";
        for (let i = 0; i < n; i += stride) {
          const j = Math.min(n - 1, i);
          if (!isFinite(l.ys[j])) continue;
          d += (d ? "L" : "M") + sc.sx(l.xs[j]).toFixed(1) + "," + sc.sy(l.ys[j]).toFixed(1);
        }
        if (n > 1 && (n - 1) % stride && isFinite(l.ys[n - 1])) {
          d += "L" + sc.sx(l.xs[n - 1]).toFixed(1) + "," + sc.sy(l.ys[n - 1]).toFixed(1);
        }
        if (n === 1) {
          svg("circle", { cx: sc.sx(l.xs[0]), cy: sc.sy(l.ys[0]), r: 2.5, fill: l.color }, s);
        }
        svg("path", { d: d, fill: "none", stroke: l.color, "stroke-width": 1.6,
                      "vector-effect": "non-scaling-stroke" }, s);
        const item = document.createElement("span");
        const sw = document.createElement("i");
        sw.style.background = l.color;
        item.appendChild(sw);
        const last = l.ys[n - 1];
        item.appendChild(document.createTextNode(`${l.name}${n ? " = " + fmt(last) : ""}`));
        this.legend.appendChild(item);
      }
      if (hoverX !== undefined) this.readout(hoverX);
    }

    hover(e) {
      if (!this.sc) return;
      const r = this.svg.getBoundingClientRect();
      const px = (e.clientX - r.left) / r.width * W;
      const x = this.sc.x0 + (px - M.l) / (W - M.l - M.r) * (this.sc.x1 - this.sc.x0);
      this.draw(x);
    }

    readout(x) {
      const sc = this.sc, rows = [];
      let nearX = null;
      for (const l of this.lines) {
        let best = -1, dist = Infinity;
        let lo = 0, hi = l.xs.length - 1; // binary search: xs ascending
        while (lo < hi) { const mid = (lo + hi) >> 1; if (l.xs[mid] < x) lo = mid + 1; else hi = mid; }
        for (const i of [lo - 1, lo]) {
          if (i >= 0 && i < l.xs.length && Math.abs(l.xs[i] - x) < dist) { best = i; dist = Math.abs(l.xs[i] - x); }
        }
        if (best < 0) continue;
        nearX = nearX === null ? l.xs[best] : nearX;
        svg("circle", { cx: sc.sx(l.xs[best]), cy: sc.sy(l.ys[best]), r: 3, fill: l.color }, this.svg);
        rows.push(`${l.name}: ${fmt(l.ys[best])}`);
      }
      if (nearX === null) return;
      const gx = sc.sx(nearX);
      svg("line", { x1: gx, x2: gx, y1: M.t, y2: H - M.b, class: "gridline" }, this.svg);
      const label = this.xTime ? `t=${Math.round(nearX - sc.x0)}s` : `step ${fmt(nearX)}`;
      const t = svg("text", { x: Math.min(gx + 6, W - 150), y: M.t + 12, class: "tip" }, this.svg);
      t.textContent = [label].concat(rows.slice(0, 4)).join("  ·  ");
    }
  }

  window.LineChart = LineChart;
})();
