// The explorers of the HTML book: a chapter's `figure`, drawn again in the browser for the
// setting its controls choose.
//
// There is no Python here. When the book was built, minipar/teach/web.py drew the chapter's
// figure for every setting the page offers and read back what each picture is made of
// (axes, lines, boxes, texts: `figure_data`); _static/explorers/<chapter>.js gives
// window.miniparFrames the controls, the first frame and the file of every other frame
// (_static/explorers/<chapter>/<hash>.js, loaded by a script element when a control asks
// for it: that works from file:// too). This file builds the controls and redraws the chosen
// frame with Plotly (vendored in _static/plotly, `make vendor-plotly`): one Plotly subplot
// per matplotlib Axes, at the same place on the figure, with the same limits and ticks.
//
// For tests (tests/html/check.mjs): each explorer's element carries `minipar` = {chapter,
// key, values, frame, draws, firstDrawMs}, and window.miniparExplorers[chapter] is it.
(function () {
  "use strict";

  window.miniparExplorers = window.miniparExplorers || {};

  const DASH = { "-": "solid", "--": "dash", ":": "dot", "-.": "dashdot" };
  const MARKER = { o: "circle", s: "square", "^": "triangle-up", v: "triangle-down",
                   "*": "star", D: "diamond", d: "diamond", x: "x", "+": "cross", ".": "circle" };
  const VALIGN = { top: "top", bottom: "bottom", baseline: "bottom", center: "middle",
                   center_baseline: "middle" };

  // ------------------------------------------------------------ texts
  // Plotly reads a little HTML in its texts: escape the rest, keep line breaks, raise
  // exponents (10^{3}, as web.py writes a log axis' tick label).
  function html(text) {
    return String(text)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/\^\{([^}]*)\}/g, "<sup>$1</sup>")
      .replace(/\n/g, "<br>");
  }

  // ------------------------------------------------------------ one frame -> Plotly
  // Sizes in the frame are matplotlib's points on a figure `size` inches wide; on the page
  // the figure is `width` pixels wide, so a point is width / (72 * inches) pixels.
  function draw(frame, width) {
    const px = width / (72 * frame.size[0]);
    const pad = 10;         // pixels above and below: text matplotlib set on the edge shows
    const layout = {
      width: width, height: width * frame.size[1] / frame.size[0] + 2 * pad,
      margin: { l: 0, r: 0, t: pad, b: pad },    // paper coordinates = the whole figure
      paper_bgcolor: "#fff", plot_bgcolor: "#fff", dragmode: false,
      font: { family: "DejaVu Sans, Arial, sans-serif", size: 8 * px },
      annotations: [],
    };
    const traces = [];
    frame.axes.forEach((ax, i) => {
      const suffix = i === 0 ? "" : String(i + 1);
      const [x0, y0, w, h] = ax.position;
      layout["xaxis" + suffix] = axis(ax.x, [x0, x0 + w], "y" + suffix, ax.visible, px);
      layout["yaxis" + suffix] = axis(ax.y, [y0, y0 + h], "x" + suffix, ax.visible, px);
      const on = { xaxis: "x" + suffix, yaxis: "y" + suffix };
      const legend = ax.legend ? addLegend(layout, ax.legend, i, px) : null;
      const named = new Set();
      const inLegend = (label) => {        // each legend entry once, in its legend
        const show = legend !== null && label !== "" && !named.has(label) &&
          ax.legend.entries.some((entry) => entry.label === label);
        if (show) named.add(label);
        return show;
      };
      for (const trace of shapeTraces(ax.shapes, on)) {
        trace.showlegend = inLegend(trace.name);
        if (legend) trace.legend = legend;
        traces.push(trace);
      }
      for (const line of ax.lines) {
        const trace = lineTrace(line, on, px);
        trace.showlegend = inLegend(line.label);
        if (legend) trace.legend = legend;
        traces.push(trace);
      }
      for (const t of ax.title.concat(ax.texts)) layout.annotations.push(annotation(t, px));
    });
    for (const t of frame.texts) layout.annotations.push(annotation(t, px));
    return { traces, layout };
  }

  function axis(a, domain, anchor, visible, px) {
    const log = a.scale === "log";
    return {
      domain: domain, anchor: anchor, visible: visible,
      type: log ? "log" : "linear",
      range: log ? a.limits.map(Math.log10) : a.limits,   // Plotly: log axes in decades
      tickmode: "array", tickvals: a.ticks, ticktext: a.ticklabels.map(html),
      ticks: "outside", ticklen: 3.5 * px, tickfont: { size: 7 * px },
      title: { text: html(a.label), font: { size: 8 * px }, standoff: 3 * px },
      showline: true, mirror: true, linecolor: "#000", linewidth: 0.8 * px,
      showgrid: false, zeroline: false, fixedrange: true, automargin: false,
    };
  }

  // A legend per Axes (Plotly >= 2.22 has several), where matplotlib put it: held by the
  // corner of its box nearest the figure's edges (Plotly's legend is not exactly as large
  // as matplotlib's: so it grows away from the edge, never past it), in a row when it had
  // several columns.
  function addLegend(layout, legend, i, px) {
    const name = i === 0 ? "legend" : "legend" + (i + 1);
    const [x0, y0, x1, y1] = legend.box;
    const right = x0 + x1 > 1, low = y0 + y1 < 1;
    layout[name] = { x: right ? x1 : x0, y: low ? y0 : y1,
                     xanchor: right ? "right" : "left", yanchor: low ? "bottom" : "top",
                     orientation: legend.columns > 1 ? "h" : "v",
                     bgcolor: "rgba(255,255,255,0.8)", font: { size: 7 * px } };
    return name;
  }

  function lineTrace(line, on, px) {
    const style = DASH[line.style];
    const marker = MARKER[line.marker];
    const mode = [style ? "lines" : "", marker ? "markers" : ""].filter(Boolean).join("+");
    return Object.assign({
      type: "scatter", meta: "line", x: line.x, y: line.y, name: line.label,
      opacity: line.alpha,
      mode: mode || "lines", hoverinfo: "x+y" + (line.label ? "+name" : ""),
      line: { color: line.color, dash: style || "solid", width: line.width * px },
      marker: { symbol: marker || "circle", color: line.color, size: line.markersize * px },
    }, on);
  }

  // Boxes and other patches, one trace per (fill, edge, name): each shape a closed
  // polygon, the next one after a null. Its hover says where the box is.
  function shapeTraces(shapes, on) {
    const groups = new Map();
    for (const s of shapes) {
      const key = [s.facecolor, s.edgecolor, s.label].join("|");
      if (!groups.has(key)) groups.set(key, { s: s, x: [], y: [], text: [] });
      const g = groups.get(key);
      const [xs, ys] = corners(s);
      const tip = s.kind === "rect"
        ? `${s.label ? s.label + ": " : ""}x ${s.x}..${+(s.x + s.width).toPrecision(6)}, ` +
          `y ${s.y}..${+(s.y + s.height).toPrecision(6)}`
        : s.label;
      g.x.push(...xs, null);
      g.y.push(...ys, null);
      g.text.push(...xs.map(() => tip), null);
    }
    return Array.from(groups.values(), (g) => Object.assign({
      type: "scatter", meta: "shapes", mode: "lines", x: g.x, y: g.y, text: g.text,
      name: g.s.label,
      fill: g.s.facecolor ? "toself" : "none", fillcolor: g.s.facecolor || undefined,
      line: { color: g.s.edgecolor || g.s.facecolor || "rgba(0,0,0,0)",
              width: g.s.edgecolor ? 0.6 : 0 },
      hoveron: "fills+points", hoverinfo: "text",
    }, on));
  }

  function corners(s) {
    if (s.kind !== "rect") return [s.x, s.y];
    const x1 = s.x + s.width, y1 = s.y + s.height;
    return [[s.x, x1, x1, s.x, s.x], [s.y, s.y, y1, y1, s.y]];
  }

  // What a text in a frame leaves out (web.py's TEXT_DEFAULTS).
  const TEXT_DEFAULTS = { color: "#000000", ha: "left", va: "baseline", rotation: 0,
                          bold: false };

  function annotation(given, px) {
    const t = Object.assign({}, TEXT_DEFAULTS, given);
    const text = t.bold ? `<b>${html(t.text)}</b>` : html(t.text);
    return {
      xref: "paper", yref: "paper", x: t.x, y: t.y, text: text, showarrow: false,
      xanchor: t.ha, yanchor: VALIGN[t.va] || "middle", textangle: -t.rotation,
      align: t.ha, font: { size: t.size * px, color: t.color || "#000" },
    };
  }

  // ------------------------------------------------------------ controls
  function label(text) {
    const el = document.createElement("label");
    el.textContent = text + " ";
    return el;
  }

  // A value as the control shows it: a slider's fraction to three digits (10^-0.5 is 0.316),
  // anything else as it is.
  function shownValue(v) {
    return typeof v === "number" && !Number.isInteger(v) ? String(+v.toPrecision(3)) : String(v);
  }

  // A dropdown for a choice or a toggle, a slider over the offered values otherwise; both
  // report the index of the chosen value. Returns {element, set(index)}.
  function control(c, index, onChange) {
    const wrap = label(c.label);
    const shown = document.createElement("output");
    let input;
    if (c.kind === "choice" || c.kind === "toggle") {
      input = document.createElement("select");
      c.values.forEach((v, i) => input.add(new Option(String(v), String(i))));
    } else {
      input = document.createElement("input");
      Object.assign(input, { type: "range", min: 0, max: c.values.length - 1, step: 1 });
    }
    const show = () => {
      shown.textContent = input.tagName === "SELECT" ? "" : shownValue(c.values[+input.value]);
    };
    input.name = c.name;
    input.value = String(index);
    show();
    input.addEventListener("input", () => {
      show();
      onChange(+input.value);
    });
    wrap.append(input, shown);
    return { element: wrap, set: (i) => { input.value = String(i); show(); } };
  }

  // ------------------------------------------------------------ frames, loaded when asked
  // A frame's file calls window.miniparFrame(chapter, name, frame); `load` resolves with it.
  const waiting = {};
  window.miniparFrame = function (chapter, name, frame) {
    window.miniparFrames[chapter].frames[name] = frame;
    (waiting[chapter + "/" + name] || []).forEach((resolve) => resolve(frame));
    delete waiting[chapter + "/" + name];
  };

  function load(data, name) {
    if (data.frames[name]) return Promise.resolve(data.frames[name]);
    const id = data.chapter + "/" + name;
    return new Promise((resolve, reject) => {
      if (!waiting[id]) {
        waiting[id] = [];
        const script = document.createElement("script");
        script.src = data.folder + name + ".js";
        script.onerror = () => reject(new Error("no frame " + script.src));
        document.head.append(script);
      }
      waiting[id].push(resolve);
    });
  }

  // ------------------------------------------------------------ one explorer
  function start(el) {
    const chapter = el.dataset.chapter;
    const data = (window.miniparFrames || {})[chapter];
    if (!data || typeof Plotly === "undefined") return;      // the static picture stays
    const plot = el.querySelector(".minipar-explorer-plot");
    const home = data.first.split(",").map(Number);
    const index = home.slice();
    const state = { chapter: chapter, key: data.first, values: {}, frame: null, draws: 0,
                    firstDrawMs: null };
    el.minipar = state;
    window.miniparExplorers[chapter] = el;
    const inputs = [];
    let latest = 0;

    function redraw() {
      const key = index.join(",");
      const ticket = ++latest;           // a slower frame arriving late is not drawn
      return load(data, data.files[key]).then((frame) => {
        if (ticket !== latest) return null;
        state.key = key;
        state.frame = frame;
        state.values = Object.assign({}, data.base, ...data.controls.map(
          (c, i) => ({ [c.name]: c.values[index[i]] })));
        const { traces, layout } = draw(frame, plot.clientWidth || 672);
        return Plotly.react(plot, traces, layout,
                            { displayModeBar: false, responsive: false, typesetMath: false });
      }).then((drawn) => {
        if (drawn === null) return;
        state.draws += 1;
        if (state.firstDrawMs === null) state.firstDrawMs = performance.now();
        el.dataset.key = state.key;
        el.dataset.draws = String(state.draws);
        hideFallback(el);
      });
    }

    // A control of `ALONE` moves one at a time: the others of them go back to their first
    // value (the page has no picture of two moved together; the notebook has).
    function choose(i, chosen) {
      index[i] = chosen;
      if (data.controls[i].alone) {
        data.controls.forEach((c, j) => {
          if (c.alone && j !== i && index[j] !== home[j]) {
            index[j] = home[j];
            inputs[j].set(home[j]);
          }
        });
      }
      redraw();
    }

    const bar = el.querySelector(".minipar-explorer-controls");
    data.controls.forEach((c, i) => {
      const made = control(c, index[i], (chosen) => choose(i, chosen));
      inputs.push(made);
      bar.append(made.element);
    });
    const single = data.controls.filter((c) => c.alone).map((c) => c.label);
    if (single.length > 1) {
      const note = document.createElement("p");
      note.className = "minipar-explorer-alone";
      note.textContent = `Here ${single.join(", ")} move one at a time (moving one puts ` +
        "the others back); the notebook's explorer combines them.";
      bar.append(note);
    }
    redraw();
  }

  // The static picture of the default setting stays until the plot is drawn.
  function hideFallback(el) {
    const figure = el.closest("figure") || el.parentElement;
    figure.querySelectorAll("img.minipar-explorer-fallback").forEach((img) => {
      (img.closest("a.image-reference") || img).hidden = true;
    });
  }

  // At DOMContentLoaded (the page laid out, so the plot knows its width), or at once when
  // the script runs later than that; each explorer starts once.
  function startAll() {
    document.querySelectorAll(".minipar-explorer[data-chapter]").forEach((el) => {
      if (!el.minipar) start(el);
    });
  }
  if (document.readyState === "complete") startAll();
  else {
    document.addEventListener("DOMContentLoaded", startAll);
    window.addEventListener("load", startAll);
  }
})();
