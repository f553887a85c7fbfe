// Tidegate console: draws the charts and keeps a table's numbers live.
// Everything it writes into the page goes through textContent, never HTML.
"use strict";

(function () {
  const LIVE_MS = 1000;
  const USAGE_MS = 15000;
  const LIVE_POINTS = 600; // ten minutes of samples
  const SMOOTH_S = 10; // rates are averaged over this window
  const COLOURS = ["#1f6feb", "#d9480f", "#2b8a3e", "#862e9c"];

  function humanBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let size = Number(n);
    for (let i = 0; i < units.length; i++) {
      if (Math.abs(size) < 1024 || i === units.length - 1) {
        return i === 0 ? Math.trunc(size) + " B" : size.toFixed(1) + " " + units[i];
      }
      size /= 1024;
    }
    return String(n);
  }

  function count(v) {
    const n = Number(v);
    if (Math.abs(n) >= 100 || Number.isInteger(n)) return Math.round(n).toLocaleString("en-US");
    return n.toFixed(1);
  }

  function ago(ms) {
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 120) return s + " s ago";
    if (s < 7200) return Math.round(s / 60) + " min ago";
    return Math.round(s / 3600) + " h ago";
  }

  function show(cell, value) {
    const format = cell.dataset.format;
    let text = String(value);
    if (format === "bytes") text = humanBytes(value);
    else if (format === "count") text = count(value);
    else if (format === "seconds") text = Number(value).toFixed(1) + " s";
    if (cell.textContent !== text) cell.textContent = text;
  }

  // A chart that fills its box's width (and follows it), with a legend of each series'
  // latest value under it (uPlot's own legend reads "--" until the cursor is on the plot).
  function makeChart(el, labels, yFormat, dots) {
    const box = document.createElement("div");
    const legend = document.createElement("figcaption");
    legend.className = "legend";
    el.appendChild(box);
    el.appendChild(legend);
    const items = labels.map(function (label, i) {
      const item = document.createElement("span");
      item.className = "item";
      const swatch = document.createElement("i");
      swatch.style.background = COLOURS[i % COLOURS.length];
      const name = document.createElement("span");
      name.textContent = label + " ";
      const value = document.createElement("b");
      value.textContent = "–";
      item.appendChild(swatch);
      item.appendChild(name);
      item.appendChild(value);
      legend.appendChild(item);
      return value;
    });
    const series = [{}].concat(labels.map(function (label, i) {
      return {
        label: label,
        stroke: COLOURS[i % COLOURS.length],
        width: 2,
        spanGaps: false, // no sample is no sample: a gap, never a line across it
        // Per-minute usage is drawn with a dot per sample: a lone sample between gaps
        // has no line to show it.
        points: dots ? { show: true, size: 4 } : {},
        value: function (u, v) { return v == null ? "–" : yFormat(v); },
      };
    }));
    const opts = {
      title: el.dataset.title || "",
      width: Math.max(200, el.clientWidth),
      height: 220,
      legend: { show: false },
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); }, // as the page's times
      series: series,
      // One point would otherwise stretch the time axis over years.
      scales: { x: { time: true, range: function (u, min, max) {
        return min != null && min === max ? [min - 60, max + 60] : [min, max];
      } } },
      axes: [{}, { values: function (u, vals) { return vals.map(yFormat); }, size: 84 }],
    };
    const empty = [[]].concat(labels.map(function () { return []; }));
    const plot = new uPlot(opts, empty, box);
    if (window.ResizeObserver) {
      new ResizeObserver(function () {
        const width = Math.max(200, el.clientWidth);
        if (width !== plot.width) plot.setSize({ width: width, height: 220 });
      }).observe(el);
    }
    return {
      plot: plot,
      setData: function (data) {
        plot.setData(data);
        data.slice(1).forEach(function (column, i) {
          let last = null;
          for (let k = column.length - 1; k >= 0; k--) {
            if (column[k] != null) { last = column[k]; break; }
          }
          items[i].textContent = last == null ? "–" : yFormat(last);
        });
        el.dataset.points = String(data[0].length);
      },
    };
  }

  // Usage per minute ----------------------------------------------------------------
  function startUsage(section) {
    const url = section.dataset.usageUrl;
    const charts = [];
    section.querySelectorAll("[data-chart]").forEach(function (el) {
      const pairs = (el.dataset.series || "").split(",").map(function (p) { return p.split(":"); });
      const fmt = el.dataset.chart === "records" ? count : humanBytes;
      charts.push({
        fields: pairs.map(function (p) { return p[0]; }),
        // Storage is sampled: a lone sample between gaps is drawn as a dot.
        chart: makeChart(el, pairs.map(function (p) { return p[1]; }), fmt, el.dataset.chart === "storage"),
      });
    });
    const empty = section.querySelector("[data-usage-empty]");

    function load() {
      fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (data) {
          charts.forEach(function (c) {
            c.chart.setData([data.minutes].concat(c.fields.map(function (f) { return data[f]; })));
          });
          if (empty) empty.hidden = data.minutes.length > 0;
          section.dataset.loaded = String(data.minutes.length);
        })
        .catch(function () { section.dataset.loaded = "error"; });
    }
    load();
    setInterval(function () { if (!document.hidden) load(); }, USAGE_MS);
  }

  // A table's numbers, live ------------------------------------------------------------
  // Rates are the high and tiered watermarks' growth over the last SMOOTH_S seconds of
  // contiguous samples: a one-second rate jumps with every batch (348 to 3,112 at a
  // steady 2,000/s). A missed sample (an error, a hidden tab) is a gap in the charts.
  function rate(samples, field) {
    const last = samples[samples.length - 1];
    let first = last;
    for (let i = samples.length - 2; i >= 0; i--) {
      const s = samples[i];
      if (s === null || last.t - s.t > SMOOTH_S) break;
      first = s;
    }
    if (first === last || last.t <= first.t) return null;
    return Math.max(0, last[field] - first[field]) / (last.t - first.t);
  }

  function startLive(section) {
    const url = section.dataset.liveUrl;
    const state = document.getElementById("live-state");
    const rateIn = document.getElementById("rate-in");
    const rateTiered = document.getElementById("rate-tiered");
    const lastTiered = document.getElementById("last-tiered");
    const failuresCount = document.getElementById("failures-count");
    const failures = document.getElementById("failures");
    const errorsTile = document.getElementById("tile-errors");
    const throughputEl = section.querySelector("[data-chart=throughput]");
    const lagEl = section.querySelector("[data-chart=lag]");
    const throughput = throughputEl ? makeChart(throughputEl, ["appended/s", "tiered/s"], count) : null;
    const lag = lagEl ? makeChart(lagEl, ["lag (records)"], count) : null;
    const samples = []; // {t, hw, tw} or null for a gap
    const points = [[], [], [], []]; // time, appended/s, tiered/s, lag
    let ticks = 0;
    let tieredMs = lastTiered && lastTiered.dataset.ms ? Number(lastTiered.dataset.ms) : null;

    function push(t, a, b, c) {
      points[0].push(t); points[1].push(a); points[2].push(b); points[3].push(c);
      if (points[0].length > LIVE_POINTS) points.forEach(function (s) { s.shift(); });
      if (samples.length > LIVE_POINTS) samples.shift();
    }

    function draw() {
      if (throughput) throughput.setData([points[0], points[1], points[2]]);
      if (lag) lag.setData([points[0], points[3]]);
    }

    function gap(t) {
      if (samples.length && samples[samples.length - 1] !== null) {
        samples.push(null);
        push(t, null, null, null);
        draw();
      }
    }

    function update(data) {
      const rows = {};
      section.querySelectorAll("tr[data-partition]").forEach(function (tr) {
        rows[tr.dataset.partition] = tr;
      });
      data.partitions.forEach(function (p) {
        const tr = rows[String(p.partition)];
        if (!tr) return;
        tr.querySelectorAll("[data-field]").forEach(function (cell) {
          if (cell.dataset.field in p) show(cell, p[cell.dataset.field]);
        });
      });
      document.querySelectorAll("[data-total]").forEach(function (cell) {
        show(cell, data.totals[cell.dataset.total]);
      });
      const t = data.at_ms / 1000;
      const previous = samples.length ? samples[samples.length - 1] : null;
      if (previous !== null && t - previous.t > 3 * LIVE_MS / 1000) gap(previous.t + LIVE_MS / 1000);
      samples.push({ t: t, hw: data.totals.high_watermark, tw: data.totals.tiered_watermark });
      const inRate = rate(samples, "hw");
      const tierRate = rate(samples, "tw");
      if (inRate !== null) rateIn.textContent = count(inRate);
      if (tierRate !== null) rateTiered.textContent = count(tierRate);
      push(t, inRate, tierRate, data.totals.lag_records);
      draw();
      if (data.last_tiered_ms != null) tieredMs = data.last_tiered_ms;
      if (lastTiered) lastTiered.textContent = tieredMs == null ? "none recorded" : ago(tieredMs);
      if (failuresCount) {
        failuresCount.textContent = String(data.failures.length);
        failures.textContent = data.failures.length
          ? data.failures.map(function (f) { return f.job + ": " + f.detail; }).join("; ")
          : "every last run succeeded";
        errorsTile.classList.toggle("tile-bad", data.failures.length > 0);
      }
      ticks += 1;
      document.body.dataset.liveTicks = String(ticks);
    }

    function poll() {
      if (document.hidden) { gap(Date.now() / 1000); setTimeout(poll, LIVE_MS); return; }
      fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (data) { update(data); if (state) state.textContent = "live"; })
        .catch(function (status) {
          gap(Date.now() / 1000);
          if (state) state.textContent = "not refreshing (" + status + ")";
        })
        .finally(function () { setTimeout(poll, LIVE_MS); });
    }
    poll();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-usage-url]").forEach(startUsage);
    document.querySelectorAll("[data-live-url]").forEach(startLive);
  });
})();
