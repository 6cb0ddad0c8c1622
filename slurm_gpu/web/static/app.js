// slurm-gpu job page: turns each static chart into an interactive uPlot chart (drag to
// zoom, double-click to reset), with the idle phases shaded. Without JavaScript, or without
// uPlot, the static SVG charts stay. The data are the JSON blocks the server wrote.
(function () {
  "use strict";
  var COLOURS = ["#1f5fa8", "#d46a00", "#2a8a3e", "#8e3b9e", "#b8860b", "#0f8a8a", "#c0392b", "#555"];

  function shadeIdle(spans) {
    return {
      hooks: {
        drawClear: [function (u) {
          var ctx = u.ctx;
          ctx.save();
          ctx.fillStyle = "#e3e3e3";
          spans.forEach(function (s) {
            var x0 = u.valToPos(s[0], "x", true), x1 = u.valToPos(s[1], "x", true);
            var left = Math.max(Math.min(x0, x1), u.bbox.left);
            var right = Math.min(Math.max(x0, x1), u.bbox.left + u.bbox.width);
            if (right > left) { ctx.fillRect(left, u.bbox.top, right - left, u.bbox.height); }
          });
          ctx.restore();
        }]
      }
    };
  }

  function width(el) {
    return Math.max(200, Math.floor(el.getBoundingClientRect().width || el.clientWidth || 300));
  }

  function draw(figure) {
    var block = figure.querySelector("script.chart-data");
    if (!block || typeof window.uPlot !== "function") { return; }
    var d = JSON.parse(block.textContent);
    var data = [d.t].concat(d.lines.map(function (l) { return l.values; }));
    var seriesOpts = [{}].concat(d.lines.map(function (l, i) {
      return {label: l.label, stroke: COLOURS[i % COLOURS.length], width: 1.5,
              dash: i >= COLOURS.length ? [6, 3] : undefined, spanGaps: false};
    }));
    var holder = document.createElement("div");
    holder.className = "uplot-holder";
    figure.appendChild(holder);
    var opts = {
      width: width(figure), height: 200, series: seriesOpts,
      scales: {x: {time: true}, y: {range: function (u, min, max) {
        return [0, d.max !== null ? d.max : (max > 0 ? max * 1.05 : 1)];
      }}},
      axes: [{}, {label: d.unit, size: 50}],
      cursor: {drag: {x: true, y: false}},
      plugins: [shadeIdle(d.idle)]
    };
    var chart = new window.uPlot(opts, data, holder);
    figure.classList.add("interactive");
    figure.setAttribute("data-drawn-points", String(
      d.lines.reduce(function (n, l) {
        return n + l.values.filter(function (v) { return v !== null; }).length;
      }, 0)));
    figure.setAttribute("data-drawn-length", String(chart.data[0].length));
    window.addEventListener("resize", function () {
      chart.setSize({width: width(figure), height: 200});
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var figures = document.querySelectorAll("figure.chart");
    Array.prototype.forEach.call(figures, function (f) {
      try { draw(f); } catch (e) { f.setAttribute("data-error", String(e)); }
    });
    document.body.setAttribute("data-charts", String(figures.length));
  });
}());
