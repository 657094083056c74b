// Reamer's live dashboard: polls /api/rounds for the rounds it has not seen and redraws.
// window.reamerDashboard holds what the page knows (the browser tests read it).
(function () {
  "use strict";
  var body = document.body;
  var POLL_MS = parseInt(body.dataset.pollMs, 10) || 1000;
  var BANDS = body.dataset.bands.split(",");
  var BAND_NAMES = {system: "system reserve", training_need: "training need", training_unused: "training unused",
                    inference: "inference", idle: "idle"};
  var BAND_COLORS = {system: "#9e9e9e", training_need: "#1f77b4", training_unused: "#aec7e8",
                     inference: "#ff7f0e", idle: "#e8e8e8"};
  var MAX_NODES = 60;   // the node bar chart shows the busiest ones beyond this
  var MAX_DECISIONS = 40;
  var state = window.reamerDashboard = {rounds: [], next: 0, finished: false, meta: {}, draws: 0, errors: 0};
  var config = {displaylogo: false, responsive: true};

  function layout(title, xtitle, ytitle, extra) {
    var l = {title: {text: title, font: {size: 14}, x: 0.01, xanchor: "left"}, margin: {l: 60, r: 20, t: 40, b: 50},
             xaxis: {title: {text: xtitle}, zeroline: false}, yaxis: {title: {text: ytitle}, rangemode: "tozero"},
             legend: {orientation: "h", y: -0.25}, hovermode: "closest"};
    for (var k in extra) { l[k] = extra[k]; }
    return l;
  }

  // the rounds that measured the nodes: with inference in the run, those that measured it too
  // (the simulator also runs rounds at arrivals and completions, between measurements)
  function cpuRounds() {
    var withInference = state.rounds.some(function (r) { return Object.keys(r.inference).length > 0; });
    return state.rounds.filter(function (r) {
      return Object.keys(r.nodes).length > 0 && (!withInference || Object.keys(r.inference).length > 0);
    });
  }

  function drawCpu() {
    var rounds = cpuRounds();
    if (!rounds.length) { return; }
    var t = rounds.map(function (r) { return r.t; });
    var traces = BANDS.map(function (b) {
      return {name: BAND_NAMES[b], x: t, type: "scatter", mode: "lines", stackgroup: "cpu",
              line: {width: 0.5, color: BAND_COLORS[b]},
              y: rounds.map(function (r) {
                var s = 0;
                for (var n in r.nodes) { s += r.nodes[n][b] || 0; }
                return s;
              })};
    });
    Plotly.react("plot-cpu-time", traces, layout("Cluster CPU by use", "time (s)", "cores"), config);
    var last = rounds[rounds.length - 1];
    var names = Object.keys(last.nodes);
    names.sort(function (a, b) {
      var na = last.nodes[a], nb = last.nodes[b];
      return (nb.cores - nb.idle) - (na.cores - na.idle) || (a < b ? -1 : 1);
    });
    var shown = names.slice(0, MAX_NODES);
    shown.sort();
    var bars = BANDS.map(function (b) {
      return {name: BAND_NAMES[b], type: "bar", x: shown, marker: {color: BAND_COLORS[b]},
              y: shown.map(function (n) { return last.nodes[n][b] || 0; })};
    });
    var title = "CPU by node at t = " + last.t.toFixed(0) + " s" +
      (names.length > shown.length ? " (the " + shown.length + " busiest of " + names.length + ")" : "");
    Plotly.react("plot-cpu-nodes", bars, layout(title, "node", "cores", {barmode: "stack"}), config);
  }

  function serviceIds() {
    var ids = {};
    state.rounds.forEach(function (r) { for (var s in r.inference) { ids[s] = true; } });
    return Object.keys(ids).sort();
  }

  function drawInference() {
    var ids = serviceIds();
    document.getElementById("row-inference").classList.toggle("hidden", ids.length === 0);
    if (!ids.length) { return; }
    var p99 = [], err = [];
    ids.forEach(function (s, i) {
      var rs = state.rounds.filter(function (r) { return s in r.inference; });
      var x = rs.map(function (r) { return r.t; });
      p99.push({name: s + " p99", x: x, type: "scatter", mode: "lines+markers", legendgroup: s,
                y: rs.map(function (r) { return r.inference[s].p99_ms; }),
                text: rs.map(function (r) {
                  return r.inference[s].replicas.map(function (p) { return p[0] + ":" + p[1]; }).join(" ") ||
                    "no replica"; }),
                hovertemplate: "%{y:.0f} ms at %{x:.0f} s<br>replicas %{text}<extra>" + s + "</extra>"});
      p99.push({name: s + " SLO", x: x, type: "scatter", mode: "lines", legendgroup: s,
                line: {dash: "dash", width: 1.5},
                y: rs.map(function (r) { return r.inference[s].slo_ms; })});
      var measured = rs.filter(function (r) { return r.inference[s].error_rate !== null; });
      if (measured.length) {
        err.push({name: s, x: measured.map(function (r) { return r.t; }), type: "scatter", mode: "lines+markers",
                  y: measured.map(function (r) { return 100 * r.inference[s].error_rate; })});
      }
    });
    Plotly.react("plot-p99", p99, layout("Inference p99 latency against its SLO", "time (s)", "p99 latency (ms)"),
                 config);
    var errDiv = document.getElementById("plot-errors");
    if (err.length) {
      if (!errDiv.classList.contains("js-plotly-plot")) { errDiv.textContent = ""; }
      Plotly.react(errDiv, err, layout("Inference errors", "time (s)", "failed requests (%)"), config);
    } else {
      Plotly.purge(errDiv);
      errDiv.textContent = "This backend does not measure request errors (the simulator models latency only).";
    }
  }

  function jobIds() {
    var ids = {};
    state.rounds.forEach(function (r) { for (var j in r.shapes) { ids[j] = true; } });
    return Object.keys(ids).sort();
  }

  function drawTraining() {
    var ids = jobIds();
    document.getElementById("row-training").classList.toggle("hidden", ids.length === 0);
    if (!ids.length) { return; }
    var many = ids.length > 20;  // a big simulation: lines without markers, no legend
    var cores = [], speed = [];
    ids.forEach(function (j) {
      var rs = state.rounds.filter(function (r) { return j in r.shapes; });
      cores.push({name: j, x: rs.map(function (r) { return r.t; }), type: "scatter",
                  mode: many ? "lines" : "lines+markers", line: {shape: "hv"}, legendgroup: j,
                  y: rs.map(function (r) { return r.shapes[j][2]; }),
                  text: rs.map(function (r) {
                    return r.shapes[j][0] + " PS, " + r.shapes[j][1] + " workers; " + (r.bottlenecks[j] || "no telemetry");
                  }),
                  hovertemplate: "%{y} cores at %{x:.0f} s<br>%{text}<extra>" + j + "</extra>"});
      var ss = rs.filter(function (r) { return j in r.speeds; });
      speed.push({name: j, x: ss.map(function (r) { return r.t; }), type: "scatter",
                  mode: many ? "lines" : "lines+markers", legendgroup: j, showlegend: false,
                  y: ss.map(function (r) { return r.speeds[j]; }),
                  text: ss.map(function (r) { return r.bottlenecks[j] || ""; }),
                  hovertemplate: "%{y:.1f} samples/s at %{x:.0f} s<br>diagnosed %{text}<extra>" + j + "</extra>"});
    });
    Plotly.react("plot-cores", cores, layout("Training jobs: allocated CPU (shape and diagnosis on hover)",
                 "time (s)", "cores", {showlegend: !many}), config);
    Plotly.react("plot-speed", speed, layout("Training speed", "time (s)", "samples/s", {showlegend: false}), config);
  }

  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) { td.className = cls; }
    tr.appendChild(td);
  }

  function drawTables() {
    var last = state.rounds[state.rounds.length - 1];
    var tbody = document.querySelector("#jobs-table tbody");
    tbody.textContent = "";
    var running = Object.keys(last.shapes).sort();
    if (!running.length) {
      var none = document.createElement("tr");
      cell(none, "no training job running");
      none.firstChild.colSpan = 6;
      tbody.appendChild(none);
    }
    running.forEach(function (j) {
      var tr = document.createElement("tr"), sh = last.shapes[j];
      cell(tr, j);
      cell(tr, sh[0], "num");
      cell(tr, sh[1], "num");
      cell(tr, sh[2], "num");
      cell(tr, j in last.speeds ? last.speeds[j].toFixed(1) : "–", "num");
      cell(tr, last.bottlenecks[j] || "no telemetry yet");
      tbody.appendChild(tr);
    });
    var rows = [];
    for (var i = state.rounds.length - 1; i >= 0 && rows.length < MAX_DECISIONS; i--) {
      var r = state.rounds[i];
      for (var k = r.decisions.length - 1; k >= 0 && rows.length < MAX_DECISIONS; k--) {
        rows.push([r.t, r.decisions[k], (r.reasons || [])[k] || ""]);
      }
    }
    tbody = document.querySelector("#decisions-table tbody");
    tbody.textContent = "";
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      cell(tr, row[0].toFixed(0), "num");
      cell(tr, row[1]);
      cell(tr, row[2]);
      tbody.appendChild(tr);
    });
  }

  function draw() {
    var m = state.meta;
    document.getElementById("run").textContent =
      [m.scenario, m.backend, m.policy, m.harvest].filter(function (v) { return v; }).join(" · ") || "run";
    var st = document.getElementById("status");
    if (!state.rounds.length) {
      st.textContent = state.finished ? "the run had no rounds" : "waiting for the first round";
      return;
    }
    var last = state.rounds[state.rounds.length - 1];
    st.textContent = state.rounds.length + " rounds, t = " + last.t.toFixed(0) + " s" +
      (state.finished ? ", finished" : "");
    st.classList.toggle("live", !state.finished);
    drawCpu();
    drawInference();
    drawTraining();
    drawTables();
    state.draws += 1;
  }

  function poll() {
    fetch("api/rounds?since=" + state.next, {cache: "no-store"})
      .then(function (resp) {
        if (!resp.ok) { throw new Error("api/rounds answered " + resp.status); }
        return resp.json();
      })
      .then(function (got) {
        state.meta = got.meta;
        var fresh = got.rounds.length > 0;
        Array.prototype.push.apply(state.rounds, got.rounds);
        state.next = got.next;
        var changed = fresh || got.finished !== state.finished || state.draws === 0;
        state.finished = got.finished;
        if (changed) { draw(); }
        if (!state.finished) { setTimeout(poll, fresh && got.rounds.length >= 5000 ? 0 : POLL_MS); }
      })
      .catch(function (e) {
        // the run's controller went away (it finished or crashed): say so, try again
        state.errors += 1;
        document.getElementById("status").textContent = "no answer from the controller (" + e.message + "); retrying";
        setTimeout(poll, POLL_MS * 2);
      });
  }
  poll();
})();
