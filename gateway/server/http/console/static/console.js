// Tidegate console: draws the usage charts and keeps a table's partitions live.
// Everything it writes into the page goes through textContent, never HTML.
"use strict";

(function () {
  const LIVE_MS = 1000;
  const USAGE_MS = 15000;
  const LIVE_POINTS = 300;

  function humanBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let size = Number(n);
    for (let i = 0; i < units.length; i++) {
      if (size < 1024 || i === units.length - 1) {
        return i === 0 ? Math.trunc(size) + " B" : size.toFixed(1) + " " + units[i];
      }
      size /= 1024;
    }
    return String(n);
  }

  function show(cell, value) {
    const format = cell.dataset.format;
    let text = String(value);
    if (format === "bytes") text = humanBytes(value);
    else if (format === "seconds") text = Number(value).toFixed(1) + " s";
    if (cell.textContent !== text) cell.textContent = text;
  }

  function chartWidth(el) {
    return el.dataset.chart === "lag" ? 760 : 380;
  }

  function makeChart(el, labels, yFormat) {
    const title = el.dataset.title || "";
    const series = [{}].concat(labels.map(function (label, i) {
      return {
        label: label,
        stroke: ["#1f6feb", "#d9480f", "#2b8a3e", "#862e9c"][i % 4],
        width: 2,
        value: function (u, v) { return v == null ? "–" : yFormat(v); },
      };
    }));
    const opts = {
      title: title,
      width: chartWidth(el),
      height: 200,
      series: series,
      // One point would otherwise stretch the time axis over years.
      scales: { x: { time: true, range: function (u, min, max) {
        return min != null && min === max ? [min - 60, max + 60] : [min, max];
      } } },
      axes: [{}, { values: function (u, vals) { return vals.map(yFormat); }, size: 70 }],
    };
    const empty = [[]].concat(labels.map(function () { return []; }));
    return new uPlot(opts, empty, el);
  }

  // Usage per minute ----------------------------------------------------------------
  function startUsage(section) {
    const url = section.dataset.usageUrl;
    const charts = [];
    section.querySelectorAll("[data-chart]").forEach(function (el) {
      const pairs = (el.dataset.series || "").split(",").map(function (p) { return p.split(":"); });
      const fmt = el.dataset.chart === "records" ? function (v) { return String(Math.round(v)); } : humanBytes;
      charts.push({
        fields: pairs.map(function (p) { return p[0]; }),
        plot: makeChart(el, pairs.map(function (p) { return p[1]; }), fmt),
      });
    });
    const empty = section.querySelector("[data-usage-empty]");

    function load() {
      fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (data) {
          charts.forEach(function (c) {
            c.plot.setData([data.minutes].concat(c.fields.map(function (f) { return data[f]; })));
          });
          if (empty) empty.hidden = data.minutes.length > 0;
          section.dataset.loaded = String(data.minutes.length);
        })
        .catch(function () { section.dataset.loaded = "error"; });
    }
    load();
    setInterval(function () { if (!document.hidden) load(); }, USAGE_MS);
  }

  // A table's partitions, live -------------------------------------------------------
  function startLive(section) {
    const url = section.dataset.liveUrl;
    const state = document.getElementById("live-state");
    const rateIn = document.getElementById("rate-in");
    const rateTiered = document.getElementById("rate-tiered");
    const chartEl = section.querySelector("[data-chart=lag]");
    const plot = chartEl ? makeChart(chartEl, ["lag (records)", "appends/s", "tiered/s"],
      function (v) { return String(Math.round(v)); }) : null;
    const points = [[], [], [], []];
    let previous = null;
    let ticks = 0;

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
      let inRate = null;
      let tierRate = null;
      if (previous) {
        const dt = (data.at_ms - previous.at_ms) / 1000;
        if (dt > 0) {
          inRate = Math.max(0, data.totals.high_watermark - previous.totals.high_watermark) / dt;
          tierRate = Math.max(0, data.totals.tiered_watermark - previous.totals.tiered_watermark) / dt;
          rateIn.textContent = inRate.toFixed(1);
          rateTiered.textContent = tierRate.toFixed(1);
        }
      }
      previous = data;
      points[0].push(data.at_ms / 1000);
      points[1].push(data.totals.lag_records);
      points[2].push(inRate);
      points[3].push(tierRate);
      if (points[0].length > LIVE_POINTS) points.forEach(function (s) { s.shift(); });
      if (plot) plot.setData(points);
      ticks += 1;
      document.body.dataset.liveTicks = String(ticks);
    }

    function poll() {
      if (document.hidden) { setTimeout(poll, LIVE_MS); return; }
      fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (data) { update(data); if (state) state.textContent = "live"; })
        .catch(function (status) { if (state) state.textContent = "not refreshing (" + status + ")"; })
        .finally(function () { setTimeout(poll, LIVE_MS); });
    }
    poll();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-usage-url]").forEach(startUsage);
    document.querySelectorAll("[data-live-url]").forEach(startLive);
  });
})();
