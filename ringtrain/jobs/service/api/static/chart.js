// A small SVG line chart: axes with round ticks, one path per line, a legend, and a hover read-out;
// TensorBoard's smoothing (the raw line kept faint behind the smoothed one) and a log-scale y axis.
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

  // TensorBoard's smoothing: an exponential moving average, debiased as Adam's moments are, so
  // the first points are not pulled towards 0. Non-finite values pass through and a constant
  // series is left as it is, as TensorBoard does.
  function smooth(ys, weight) {
    const out = new Array(ys.length);
    const constant = ys.every(v => v === ys[0]);
    let last = 0, n = 0;
    for (let i = 0; i < ys.length; i++) {
      const y = ys[i];
      if (constant || !isFinite(y) || !(weight > 0)) { out[i] = y; continue; }
      last = last * weight + (1 - weight) * y;
      n++;
      out[i] = last / (weight === 1 ? 1 : 1 - Math.pow(weight, n));
    }
    return out;
  }

  // Log-scale ticks on log10 values lo..hi: the powers of ten over more than two decades; 1, 2
  // and 5 times them over fewer, if that makes three ticks; else round values of the data's own
  // scale (a range within a decade).
  function logTicks(lo, hi) {
    const decades = Math.floor(hi) - Math.ceil(lo), out = [];
    const every = Math.max(1, Math.ceil(decades / 6)), times = decades > 2 ? [1] : [1, 2, 5];
    for (let k = Math.floor(lo); k <= hi + 1e-9; k += every) {
      for (const m of times) {
        const v = k + Math.log10(m);
        if (v >= lo && v <= hi) out.push(v);
      }
    }
    if (out.length >= 3) return out;
    return ticks(Math.pow(10, lo), Math.pow(10, hi), 6).filter(v => v > 0).map(Math.log10);
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
      this.options = { smoothing: 0, logY: false };
      this.svg.addEventListener("mousemove", e => this.hover(e));
      this.svg.addEventListener("mouseleave", () => this.draw());
    }

    // lines: [{name, color, xs, ys}] (xs ascending); xTime: x values are epoch seconds;
    // options: {smoothing: 0..0.99, logY: bool} (kept from the last call when not given)
    set(lines, xTime, options) {
      this.xTime = xTime;
      if (options) this.options = Object.assign({}, this.options, options);
      const w = this.options.smoothing, log = this.options.logY;
      this.hidden = 0;
      // Each line's values as drawn: smoothed (TensorBoard smooths the data, then scales it),
      // then log10 on a log axis, where values <= 0 have no place and are left out (counted).
      const toAxis = v => log ? (v > 0 ? Math.log10(v) : NaN) : v;
      this.lines = lines.map(l => {
        const sm = w > 0 ? smooth(l.ys, w) : l.ys;
        if (log) this.hidden += l.ys.filter(v => isFinite(v) && v <= 0).length;
        return Object.assign({}, l, { raw: l.ys.map(toAxis), ys: sm.map(toAxis), values: l.ys, smoothedValues: sm });
      });
      this.root.dataset.scale = log ? "log" : "linear";
      this.root.dataset.smoothing = String(w);
      this.root.dataset.hidden = String(this.hidden);
      this.draw();
    }

    points() { return this.lines.reduce((n, l) => n + l.xs.length, 0); }

    scale() {
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const l of this.lines) {
        for (const ys of [l.raw, l.ys]) {
          for (let i = 0; i < l.xs.length; i++) {
            const y = ys[i];
            if (!isFinite(y)) continue;
            x0 = Math.min(x0, l.xs[i]); x1 = Math.max(x1, l.xs[i]);
            y0 = Math.min(y0, y); y1 = Math.max(y1, y);
          }
        }
      }
      if (!isFinite(x0)) return null;
      if (x1 === x0) { x1 = x0 + 1; }
      const pad = (y1 - y0) * 0.05 || Math.abs(y0) * 0.05 || (this.options.logY ? 0.5 : 1);
      y0 -= pad; y1 += pad;
      const sx = v => M.l + (v - x0) / (x1 - x0) * (W - M.l - M.r);
      const sy = v => H - M.b - (v - y0) / (y1 - y0) * (H - M.t - M.b);
      return { x0, x1, y0, y1, sx, sy };
    }

    path(xs, ys, sc, attrs) {
      const n = xs.length, stride = Math.max(1, Math.ceil(n / MAX_DRAWN));
      let d = "";
      for (let i = 0; i < n; i += stride) {
        if (!isFinite(ys[i])) continue;
        d += (d ? "L" : "M") + sc.sx(xs[i]).toFixed(1) + "," + sc.sy(ys[i]).toFixed(1);
      }
      if (n > 1 && (n - 1) % stride && isFinite(ys[n - 1])) {
        d += "L" + sc.sx(xs[n - 1]).toFixed(1) + "," + sc.sy(ys[n - 1]).toFixed(1);
      }
      return svg("path", Object.assign({ d: d, fill: "none", "stroke-width": 1.6,
                                         "vector-effect": "non-scaling-stroke" }, attrs), this.svg);
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
      const log = this.options.logY, smoothed = this.options.smoothing > 0;
      for (const v of log ? logTicks(sc.y0, sc.y1) : ticks(sc.y0, sc.y1, 5)) {
        if (v < sc.y0 || v > sc.y1) continue;
        const y = sc.sy(v);
        svg("line", { x1: M.l, x2: W - M.r, y1: y, y2: y, class: "gridline" }, axis);
        const t = svg("text", { x: M.l - 6, y: y + 3, "text-anchor": "end" }, axis);
        t.textContent = fmt(log ? Math.pow(10, v) : v);
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
        const n = l.xs.length;
        if (smoothed) this.path(l.xs, l.raw, sc, { stroke: l.color, "stroke-opacity": 0.25, class: "raw" });
        this.path(l.xs, l.ys, sc, { stroke: l.color, class: smoothed ? "smoothed" : "line" });
        if (n === 1 && isFinite(l.ys[0])) {
          svg("circle", { cx: sc.sx(l.xs[0]), cy: sc.sy(l.ys[0]), r: 2.5, fill: l.color }, s);
        }
        const item = document.createElement("span");
        const sw = document.createElement("i");
        sw.style.background = l.color;
        item.appendChild(sw);
        const last = (smoothed ? l.smoothedValues : l.values)[n - 1];
        item.appendChild(document.createTextNode(`${l.name}${n ? " = " + fmt(last) : ""}`));
        this.legend.appendChild(item);
      }
      if (this.hidden) {
        const note = document.createElement("span");
        note.className = "hidden-points";
        note.textContent = `${this.hidden} value(s) ≤ 0 not shown on the log scale`;
        this.legend.appendChild(note);
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
        if (isFinite(l.ys[best])) svg("circle", { cx: sc.sx(l.xs[best]), cy: sc.sy(l.ys[best]), r: 3, fill: l.color }, this.svg);
        const value = fmt(l.values[best]);
        rows.push(`${l.name}: ${this.options.smoothing > 0 ? `${fmt(l.smoothedValues[best])} (${value})` : value}`);
      }
      if (nearX === null) return;
      const gx = sc.sx(nearX);
      svg("line", { x1: gx, x2: gx, y1: M.t, y2: H - M.b, class: "gridline" }, this.svg);
      const label = this.xTime ? `t=${Math.round(nearX - sc.x0)}s` : `step ${fmt(nearX)}`;
      const t = svg("text", { x: Math.min(gx + 6, W - 150), y: M.t + 12, class: "tip" }, this.svg);
      t.textContent = [label].concat(rows.slice(0, 4)).join("  ·  ");
    }
  }

  LineChart.smooth = smooth; // the page's tests check it against TensorBoard's formula
  window.LineChart = LineChart;
})();
