// Live run page: poll the JSON metrics endpoint; when a new iteration or status arrives,
// ask charts.js to fetch the run's chart data again and redraw. The progress line (n of N,
// elapsed, the estimate) and the sign of starved rollouts follow each poll; when the run
// ends, the page reloads once to show what it proposed. No framework, no CDN.
(function () {
  "use strict";
  var script = document.currentScript;
  var runId = script && script.getAttribute("data-run-id");
  if (!runId) { return; }
  var terminal = { completed: true, completed_with_alarms: true, cancelled: true, failed: true };
  var periodMs = 5000;

  function lastIteration() {
    var charts = document.getElementById("charts");
    return charts ? parseInt(charts.getAttribute("data-last-iteration") || "-1", 10) : -1;
  }

  function refreshCharts() {
    return window.triloopCharts ? window.triloopCharts.refresh() : Promise.resolve();
  }

  function showProgress(progress) {
    if (!progress) { return; }
    var line = document.getElementById("run-progress");
    if (line) { line.textContent = progress.timing; }
    var total = document.getElementById("run-iterations-total");
    if (total) { total.textContent = String(progress.iterations); }
    var starved = document.getElementById("rollouts-starved");
    if (starved) {
      starved.hidden = !progress.starved;
      if (progress.starved && starved.textContent.indexOf(progress.starved.message) < 0) {
        starved.textContent = progress.starved.message + ".";
      }
    }
  }

  function tick() {
    var after = lastIteration();
    fetch("/api/runs/" + encodeURIComponent(runId) + "/metrics?after=" + after,
          { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) { return; }
        var status = document.getElementById("run-status");
        if (status && status.textContent.trim() !== data.status.replace(/_/g, " ")) {
          var badge = document.createElement("span");
          badge.className = "badge badge-" + data.status.replace(/[^a-z_]/g, "").replace(/_/g, "-");
          badge.textContent = data.status.replace(/_/g, " ");
          status.replaceChildren(badge);
        }
        var iterations = document.getElementById("run-iterations");
        if (iterations) { iterations.textContent = String(data.iterations_done); }
        showProgress(data.progress);
        var next = data.metrics.length ? refreshCharts() : Promise.resolve();
        return next.then(function () {
          if (terminal[data.status]) { window.location.reload(); return; }
          window.setTimeout(tick, periodMs);
        });
      })
      .catch(function () { window.setTimeout(tick, periodMs * 3); });
  }

  window.setTimeout(tick, periodMs);
})();
