// Run charts drawn with uPlot (vendored under /static/vendor/uplot, never fetched from
// elsewhere). The server puts the chart specs and every metric column in
// <script id="chart-data">; this file draws them with hover values and axis ticks,
// smooths them (exponential moving average, as TensorBoard does), overlays a second
// run chosen in "Overlay run", and marks the iterations that raised a stability alarm.
// On /runs/compare the data holds "runs" (each with its label and colour): every chart
// then draws one line per run (dashed per key where a chart has several keys).
(function () {
  "use strict";
  var COLORS = ["#2456c7", "#1f7a4d", "#b45309", "#7c3aed", "#0e7490", "#be185d",
                "#4d7c0f", "#9a3412"];
  var ALARM = "#b42318";
  var state = { data: null, other: null, smoothing: 0, plots: [] };

  function readData() {
    var node = document.getElementById("chart-data");
    return node ? JSON.parse(node.textContent) : null;
  }

  function smooth(values, weight) {
    if (!weight) { return values; }
    var out = [], last = null, steps = 0;
    for (var i = 0; i < values.length; i++) {
      var v = values[i];
      if (v === null || v === undefined) { out.push(null); continue; }
      last = last === null ? 0 : last;
      last = last * weight + (1 - weight) * v;
      steps += 1;
      out.push(last / (1 - Math.pow(weight, steps)));  // debiased, as TensorBoard
    }
    return out;
  }

  // Both runs on one x axis: the union of their iterations, null where a run has none.
  function align(xs, mine, theirs) {
    var all = xs.slice();
    if (theirs) { theirs.iterations.forEach(function (x) { if (all.indexOf(x) < 0) { all.push(x); } }); }
    all.sort(function (a, b) { return a - b; });
    function column(run, key) {
      var byX = {};
      if (!run || !run.columns[key]) { return null; }
      run.iterations.forEach(function (x, i) { byX[x] = run.columns[key][i]; });
      return all.map(function (x) { return x in byX ? byX[x] : null; });
    }
    return { xs: all, mine: function (k) { return column(mine, k); },
             theirs: function (k) { return column(theirs, k); } };
  }

  function alarmPlugin(alarms) {
    return { hooks: { draw: [function (u) {
      var ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
      ctx.save();
      ctx.strokeStyle = ALARM; ctx.lineWidth = 1.5 * (window.devicePixelRatio || 1);
      ctx.setLineDash([4, 3]);
      alarms.forEach(function (x) {
        var px = u.valToPos(x, "x", true);
        if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) { return; }
        ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + height); ctx.stroke();
      });
      ctx.restore();
    }] } };
  }

  function fmt(v) {
    if (v === null || v === undefined) { return "—"; }
    var a = Math.abs(v);
    return (a !== 0 && (a >= 1000 || a < 0.001)) ? v.toExponential(2) : String(+v.toPrecision(4));
  }

  function build(figure, chart, data, other) {
    var host = figure.querySelector(".chart-plot");
    var aligned = align(data.iterations, data, other);
    var series = [{ label: "iteration", value: function (u, v) { return v === null ? "—" : v; } }];
    var columns = [aligned.xs];
    // A legend names a run by its name, or a short id: never a 32-character id.
    var otherName = other ? (other.run && (other.run.name || String(other.run.id).slice(0, 8))) : "";
    chart.series.forEach(function (line, i) {
      var color = COLORS[i % COLORS.length];
      columns.push(smooth(aligned.mine(line.key) || aligned.xs.map(function () { return null; }),
                          state.smoothing));
      series.push({ label: line.label, stroke: color, width: 2, spanGaps: true,
                    value: function (u, v) { return fmt(v); } });
      var theirs = other ? aligned.theirs(line.key) : null;
      if (theirs) {
        columns.push(smooth(theirs, state.smoothing));
        series.push({ label: line.label + " · " + otherName, stroke: color, width: 1.5,
                      dash: [6, 4], spanGaps: true, value: function (u, v) { return fmt(v); } });
      }
    });
    host.replaceChildren();
    var width = Math.max(260, host.clientWidth || figure.clientWidth - 16);
    var plot = new window.uPlot({
      width: width, height: 210,
      scales: { x: { time: false } },
      axes: [{ label: "iteration", size: 40 }, { size: 56, values: function (u, vals) { return vals.map(fmt); } }],
      series: series,
      cursor: { drag: { x: true, y: false } },
      legend: { live: true },
      plugins: [alarmPlugin(data.alarms)],
    }, columns, host);
    plot.root.setAttribute("data-series", String(series.length - 1));
    return plot;
  }

  // One x axis for every compared run: the union of their iterations.
  function alignRuns(runs) {
    var all = [];
    runs.forEach(function (run) {
      run.iterations.forEach(function (x) { if (all.indexOf(x) < 0) { all.push(x); } });
    });
    all.sort(function (a, b) { return a - b; });
    return { xs: all, column: function (run, k) {
      if (!run.columns[k]) { return null; }
      var byX = {};
      run.iterations.forEach(function (x, i) { byX[x] = run.columns[k][i]; });
      return all.map(function (x) { return x in byX ? byX[x] : null; });
    } };
  }

  function buildCompared(figure, chart, runs) {
    var host = figure.querySelector(".chart-plot");
    var aligned = alignRuns(runs);
    var series = [{ label: "iteration", value: function (u, v) { return v === null ? "—" : v; } }];
    var columns = [aligned.xs], alarms = [];
    runs.forEach(function (run) {
      run.alarms.forEach(function (x) { if (alarms.indexOf(x) < 0) { alarms.push(x); } });
      chart.series.forEach(function (line, i) {
        var values = aligned.column(run, line.key);
        if (!values) { return; }
        columns.push(smooth(values, state.smoothing));
        series.push({ label: chart.series.length > 1 ? run.label + " · " + line.label : run.label,
                      stroke: run.color, width: 2, dash: i ? [6, 3 + i] : undefined,
                      spanGaps: true, value: function (u, v) { return fmt(v); } });
      });
    });
    host.replaceChildren();
    var width = Math.max(260, host.clientWidth || figure.clientWidth - 16);
    var plot = new window.uPlot({
      width: width, height: 230,
      scales: { x: { time: false } },
      axes: [{ label: "iteration", size: 40 }, { size: 56, values: function (u, vals) { return vals.map(fmt); } }],
      series: series,
      cursor: { drag: { x: true, y: false } },
      legend: { live: true },
      plugins: [alarmPlugin(alarms)],
    }, columns, host);
    plot.root.setAttribute("data-series", String(series.length - 1));
    return plot;
  }

  function render() {
    var data = state.data;
    if (!data || !window.uPlot) { return; }
    state.plots.forEach(function (p) { p.destroy(); });
    state.plots = [];
    data.charts.forEach(function (chart) {
      var figure = document.getElementById(chart.id);
      if (!figure) { return; }
      state.plots.push(data.runs ? buildCompared(figure, chart, data.runs)
                                 : build(figure, chart, data, state.other));
    });
    var holder = document.getElementById("charts");
    if (holder) {
      if (!data.runs) {
        holder.setAttribute("data-last-iteration", String(data.last_iteration));
        holder.setAttribute("data-alarm-count", String(data.alarms.length));
      }
      holder.setAttribute("data-drawn", String(state.plots.length));
    }
  }

  function fetchRun(runId) {
    return fetch("/runs/" + encodeURIComponent(runId) + "/charts",
                 { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; });
  }

  function refresh() {
    var holder = document.getElementById("charts");
    var runId = holder && holder.getAttribute("data-run-id");
    if (!runId) { return Promise.resolve(); }
    return fetchRun(runId).then(function (data) { if (data) { state.data = data; render(); } });
  }

  function start() {
    state.data = readData();
    var slider = document.getElementById("smoothing");
    var shown = document.getElementById("smoothing-value");
    if (slider) {
      slider.addEventListener("input", function () {
        state.smoothing = parseFloat(slider.value) || 0;
        if (shown) { shown.textContent = slider.value; }
        render();
      });
    }
    var compare = document.getElementById("compare");
    if (compare) {
      compare.addEventListener("change", function () {
        if (!compare.value) { state.other = null; render(); return; }
        fetchRun(compare.value).then(function (other) { state.other = other; render(); });
      });
    }
    var resizeTimer = null;
    window.addEventListener("resize", function () {
      window.clearTimeout(resizeTimer);
      resizeTimer = window.setTimeout(render, 150);
    });
    render();
  }

  window.triloopCharts = { refresh: refresh };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
