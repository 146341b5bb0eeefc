/* kcollect site: filters kept in the URL hash (so a view can be linked), sortable tables that
   download as CSV, charts drawn with the local plotly.js, trend data loaded from data/*.js with
   <script> tags (fetch() of local files is blocked under file://). Text from the data is always
   set with textContent, never as HTML; Plotly's labels are escaped first. */
"use strict";
(function () {
  const root = document.body.dataset.root || "";
  const kind = document.body.dataset.page;
  const PLOT_CONFIG = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  const FILTER_KEYS = ["gpu", "mode", "dtype", "provider", "kind", "kernel", "machine", "y"];
  const SELECTS = ["gpu", "mode", "dtype", "kind", "kernel", "machine"];
  const NARROW = window.matchMedia("(max-width: 700px)");

  // -- data files ------------------------------------------------------------------------------
  const loaded = {};
  const waiting = {};
  window.KC = {
    put(name, value) {
      loaded[name] = value;
      (waiting[name] || []).forEach((w) => w.resolve(value));
      delete waiting[name];
    },
  };

  function load(name) {
    if (name in loaded) return Promise.resolve(loaded[name]);
    return new Promise((resolve, reject) => {
      if (!waiting[name]) {
        waiting[name] = [];
        const s = document.createElement("script");
        s.src = root + name;
        s.onerror = () => {
          (waiting[name] || []).forEach((w) => w.reject(new Error("could not load " + name)));
          delete waiting[name];
        };
        document.head.appendChild(s);
      }
      waiting[name].push({resolve, reject});
    });
  }

  let pageCache = null;
  function pageData() {
    if (!pageCache) {
      const el = document.getElementById("kc-page");
      pageCache = el ? JSON.parse(el.textContent) : {};
    }
    return pageCache;
  }

  // Plotly renders trace names and hover text as a small HTML subset: escape what came from data.
  function esc(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  // -- state in the URL hash -------------------------------------------------------------------
  function readState() {
    const q = new URLSearchParams(location.hash.replace(/^#/, ""));
    const s = {};
    for (const [k, v] of q) s[k] = v;
    s.providers = s.provider ? s.provider.split(",").filter(Boolean) : [];
    return s;
  }

  function hashOf(s, keys) {
    const q = new URLSearchParams();
    for (const k of keys) if (s[k]) q.set(k, s[k]);
    return q.toString();
  }

  function writeState(s) {
    const keys = Object.keys(s).filter((k) => k !== "providers");
    const hash = hashOf(s, keys);
    const url = location.href.split("#")[0] + (hash ? "#" + hash : "");
    if (url !== location.href) {
      try {
        history.replaceState(null, "", url);
      } catch (e) {
        location.replace(url);
      }
    }
    syncLinks(s);
  }

  // Navigation links carry the filters along, so the same view follows from page to page.
  function syncLinks(s) {
    const hash = hashOf(s, FILTER_KEYS);
    document.querySelectorAll("a.keep").forEach((a) => {
      a.setAttribute("href", a.getAttribute("href").split("#")[0] + (hash ? "#" + hash : ""));
    });
  }

  // -- filters ---------------------------------------------------------------------------------
  const form = document.getElementById("kc-filters");
  const axisForm = document.getElementById("kc-axis");

  function syncForm(s) {
    if (form) {
      for (const name of SELECTS) {
        const sel = form.elements.namedItem(name);
        if (sel) sel.value = s[name] || "";
      }
      form.querySelectorAll("input[name=provider]").forEach((box) => {
        box.checked = !s.providers.length || s.providers.includes(box.value);
      });
    }
    if (axisForm) axisForm.elements.namedItem("y").value = s.y || "log";
  }

  function formState(prev) {
    const s = Object.assign({}, prev);
    for (const name of SELECTS) {
      const sel = form && form.elements.namedItem(name);
      if (sel) s[name] = sel.value;
    }
    const boxes = form ? [...form.querySelectorAll("input[name=provider]")] : [];
    const on = boxes.filter((b) => b.checked).map((b) => b.value);
    s.providers = on.length === boxes.length ? [] : on;
    s.provider = s.providers.join(",");
    if (axisForm) s.y = axisForm.elements.namedItem("y").value === "log" ? "" : axisForm.elements.namedItem("y").value;
    delete s.shape; // a focus from a link is spent once the view changes
    delete s.flag;
    return s;
  }

  function matches(el, s) {
    const d = el.dataset;
    const narrowed = Boolean(s.mode || s.dtype);
    if ("gpu" in d && s.gpu && d.gpu !== s.gpu) return false;
    // Overview: the all-modes line shows until a mode or dtype is picked, then the detail lines.
    if ("detail" in d && !narrowed) return false;
    if (d.mode === "*") {
      if (narrowed) return false;
    } else if ("mode" in d && s.mode && d.mode !== s.mode) {
      return false;
    }
    if ("dtype" in d && d.dtype !== "*" && s.dtype && d.dtype !== s.dtype) return false;
    if ("provider" in d && s.providers.length && !s.providers.includes(d.provider)) return false;
    for (const key of ["kind", "kernel", "machine"]) {
      if (key in d && s[key] && d[key] !== s[key]) return false;
    }
    return true;
  }

  function visible(el) {
    return el.getClientRects().length > 0;
  }

  function applyFilters(s) {
    document.querySelectorAll("[data-f]").forEach((el) => {
      el.hidden = !matches(el, s);
    });
    const nothing = document.getElementById("kc-nothing");
    if (nothing) {
      const items = document.querySelectorAll("main tbody tr[data-f], main section.part");
      nothing.hidden = [...items].some((el) => !el.hidden && (!el.closest("[hidden]")));
    }
  }

  // -- tables: sort by any column, download what is shown as CSV ------------------------------
  function cellAt(row, col) {
    let c = 0;
    for (const cell of row.cells) {
      if (col < c + cell.colSpan) return c === col ? cell : null;
      c += cell.colSpan;
    }
    return null;
  }

  function text(el) {
    return el.textContent.replace(/\s+/g, " ").trim();
  }

  // A cell sorts by its data-v value where it has one, else by the number its text starts with
  // (2.00×, +5.3%, 1,234), else by its text; blanks sort last.
  const LEADING_NUMBER = /^[+-]?\d[\d,]*(\.\d+)?(e[+-]?\d+)?(?![\d-])/i;
  function sortKey(cell) {
    if (!cell) return null;
    const v = cell.dataset.v;
    const raw = v !== undefined ? v : text(cell);
    if (raw === "" || raw === "—") return null;
    if (v !== undefined) return Number.isFinite(Number(v)) ? Number(v) : v.toLowerCase();
    const m = raw.match(LEADING_NUMBER);
    return m ? Number(m[0].replace(/,/g, "")) : raw.toLowerCase();
  }

  function compareKeys(a, b) {
    if (a === null || b === null) return a === b ? 0 : a === null ? 1 : -1; // blanks last
    if (typeof a === typeof b) return a < b ? -1 : a > b ? 1 : 0;
    return typeof a === "number" ? -1 : 1;
  }

  function sortTable(table, col, th) {
    const body = table.tBodies[0];
    const dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
    table.tHead.querySelectorAll("th").forEach((h) => h.removeAttribute("aria-sort"));
    th.setAttribute("aria-sort", dir);
    const rows = [...body.rows].map((r) => [sortKey(cellAt(r, col)), Number(r.dataset.i), r]);
    rows.sort((x, y) => {
      const c = compareKeys(x[0], y[0]);
      if (x[0] === null || y[0] === null) return c || x[1] - y[1];
      return (dir === "ascending" ? c : -c) || x[1] - y[1];
    });
    rows.forEach(([, , r]) => body.appendChild(r));
  }

  function csvValue(v) {
    // A cell that a spreadsheet would run as a formula is quoted as text.
    if (/^[=@\t\r]/.test(v) || (/^[+-]/.test(v) && !/^[+-][\d.]/.test(v))) v = "'" + v;
    return /[",\n]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v;
  }

  function tableCSV(table) {
    const rows = [...(table.tHead ? table.tHead.rows : []), ...table.tBodies[0].rows].filter((r) => !r.hidden);
    return rows.map((r) => [...r.cells].filter((c) => !c.hidden).map((c) => csvValue(text(c))).join(",")).join("\n") + "\n";
  }

  function download(name, body, type) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([body], {type}));
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 5000);
  }

  function enhanceTable(table) {
    if (table._kc || !table.tHead || !table.tBodies.length) return;
    table._kc = true;
    [...table.tBodies[0].rows].forEach((r, i) => (r.dataset.i = i));
    const head = table.tHead.rows[table.tHead.rows.length - 1];
    let col = 0;
    for (const th of head.cells) {
      const here = col;
      col += th.colSpan;
      const b = document.createElement("button");
      b.type = "button";
      b.className = "sort";
      while (th.firstChild) b.appendChild(th.firstChild);
      th.appendChild(b);
      b.addEventListener("click", () => sortTable(table, here, th));
    }
    const caption = table.caption || table.createCaption();
    const csv = document.createElement("button");
    csv.type = "button";
    csv.className = "csv";
    csv.textContent = "CSV";
    csv.setAttribute("aria-label", "Download this table as CSV: " + (text(caption) || "table"));
    csv.addEventListener("click", () => download((table.dataset.name || "table") + ".csv", tableCSV(table), "text/csv"));
    const tools = document.createElement("span");
    tools.className = "table-tools";
    tools.appendChild(csv);
    caption.appendChild(tools);
  }

  // -- charts ----------------------------------------------------------------------------------
  function providerOn(s, p) {
    return !s.providers.length || s.providers.includes(p);
  }

  function yMode(s) {
    return s.y || "log";
  }

  // On a narrow screen a legend takes several rows above the plot, and rotated category labels
  // take their length below it: give the chart the height they take, so that the plot area keeps
  // its size and the legend never reaches over the lines. Plotly lays a horizontal legend out in
  // columns as wide as its longest entry.
  function fit(layout, div, data) {
    if (div.clientWidth >= 560) return layout;
    const names = data.filter((t) => t.visible !== false && t.showlegend !== false).map((t) => String(t.name));
    const entry = 40 + 6 * Math.max(0, ...names.map((n) => n.length));  // px at font size 10
    const rows = Math.ceil(names.length / Math.max(1, Math.floor((div.clientWidth - 20) / entry)));
    const xs = data.flatMap((t) => (t.x || []).map((x) => String(x).length));
    const ticks = layout.xaxis && layout.xaxis.type === "category" ? Math.min(300, 6 * Math.max(0, ...xs)) : 0;
    return Object.assign({}, layout, {height: layout.height + 20 * rows + 40 + ticks,
                                      legend: Object.assign({}, layout.legend, {font: {size: 10}})});
  }

  function drawShape(div, s) {
    const key = s.provider || "";
    if (div._kcKey === key) return;
    div._kcKey = key;
    if (!div._kcFig) div._kcFig = JSON.parse(document.getElementById(div.dataset.fig).textContent);
    const fig = div._kcFig;
    const data = fig.data.map((t) => Object.assign({}, t, {visible: !t.meta || providerOn(s, t.meta)}));
    Plotly.react(div, data, fit(fig.layout, div, data), PLOT_CONFIG);
  }

  function rgba(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${alpha})`;
  }

  function fmt(v) {
    return v === null || v === undefined ? "—" : Number(v).toPrecision(4);
  }

  // y values of one provider's series in the chosen view: times, or ratios to its first point or
  // to another provider at the same commit.
  function transform(series, shape, p, mode) {
    const [ci, med, p20, p80] = series[p][shape];
    if (mode === "log" || mode === "linear") return {med, p20, p80};
    let ref;
    if (mode === "first") {
      ref = ci.map(() => med[0]);
    } else {
      const other = (series[mode.slice(3)] || {})[shape];
      const at = {};
      if (other) other[0].forEach((c, j) => (at[c] = at[c] === undefined ? other[1][j] : at[c]));
      ref = ci.map((c) => (at[c] === undefined ? null : at[c]));
    }
    const div = (arr) => arr.map((v, j) => (ref[j] ? v / ref[j] : null));
    return {med: div(med), p20: div(p20), p80: div(p80), ref};
  }

  function segments(cond) {
    const out = [];
    cond.forEach((k, j) => {
      if (!out.length || out[out.length - 1].k !== k) out.push({k, idx: []});
      out[out.length - 1].idx.push(j);
    });
    return out;
  }

  function trendFigure(series, shape, s, page, marks) {
    const mode = yMode(s);
    const commits = page.commitsOf;
    const conds = page.conditions || {};
    const data = [];
    const shapes = [];
    const providers = page.providers || [];
    const order = providers.filter((p) => p in series).concat(Object.keys(series).filter((p) => !providers.includes(p)));
    const yOf = {};
    order.forEach((p) => {
      const ser = series[p][shape];
      if (!ser || !providerOn(s, p)) return;
      const [ci, med, p20, p80, cond, noise] = ser;
      const t = transform(series, shape, p, mode);
      yOf[p] = {ci, y: t.med};
      const color = (page.colors || {})[p] || "#7f7f7f";
      segments(cond).forEach((seg, n) => {
        const pick = (arr) => seg.idx.map((j) => arr[j]);
        const x = pick(ci);
        const nz = noise && noise[seg.k] !== undefined ? `±${(100 * noise[seg.k]).toPrecision(2)}%` : "—";
        const text = seg.idx.map((j) => {
          const c = commits[ci[j]] || [String(ci[j]), "", ""];
          const rel = t.ref ? `<br>${fmt(t.med[j])}× (${fmt(med[j])} ms)` : "";
          return esc(`${c[0]} · ${c[1]}`) + (c[2] ? "<br>" + esc(c[2].slice(0, 80)) : "") +
            `<br>median ${fmt(med[j])} ms, p20–p80 ${fmt(p20[j])}–${fmt(p80[j])} ms${rel}` +
            `<br>series noise ${nz} · ${esc(conds[seg.k] || "")}`;
        });
        data.push({type: "scatter", x, y: pick(t.p20), mode: "lines", line: {width: 0, color}, hoverinfo: "skip",
                   showlegend: false, legendgroup: p});
        data.push({type: "scatter", x, y: pick(t.p80), mode: "lines", line: {width: 0, color}, fill: "tonexty",
                   fillcolor: rgba(color, 0.2), hoverinfo: "skip", showlegend: false, legendgroup: p});
        data.push({type: "scatter", x, y: pick(t.med), mode: x.length > 1 ? "lines+markers" : "markers", name: esc(p),
                   legendgroup: p, showlegend: n === 0, line: {color, width: 1.5, dash: n % 2 ? "dot" : "solid"},
                   marker: {size: 5, color, symbol: n % 2 ? "circle-open" : "circle"}, text,
                   hovertemplate: "%{text}<extra>" + esc(p) + "</extra>"});
      });
    });
    const mine = marks.filter((f) => f.shape === shape && yOf[f.provider]);
    const groups = [["regression", "triangle-up", "#b71c1c"], ["improvement", "triangle-down", "#1b7335"],
                    ["change of conditions", "diamond", "#8a5300"]];
    for (const [name, symbol, color] of groups) {
      const fl = mine.filter((f) => (f.kind === "regression" || f.kind === "improvement" ? f.kind : "change of conditions") === name);
      if (!fl.length) continue;
      const y = fl.map((f) => {
        const o = yOf[f.provider];
        const j = o.ci.lastIndexOf(f.after_ci);
        return j >= 0 ? o.y[j] : null;
      });
      if (symbol === "diamond") {
        fl.forEach((f) => shapes.push({type: "line", xref: "x", yref: "paper", x0: f.after_ci - 0.5, x1: f.after_ci - 0.5,
                                       y0: 0, y1: 1, line: {color, width: 1, dash: "dash"}}));
      }
      data.push({type: "scatter", mode: "markers", name, x: fl.map((f) => f.after_ci), y,
                 marker: {symbol, size: 11, color, line: {width: 1, color: "#000"}},
                 text: fl.map((f) => esc(`${f.provider}: ${f.label}, ${(100 * f.change).toFixed(1)}%` + (f.what ? ` (${f.what})` : ""))),
                 hovertemplate: "%{text}<extra></extra>"});
    }
    const n = commits.length;
    const ticks = [];
    const step = Math.max(1, Math.ceil(n / 6));
    for (let i = 0; i < n; i += step) ticks.push(i);
    if (n && ticks[ticks.length - 1] !== n - 1) ticks.push(n - 1);
    const yTitle = mode === "first" ? "time / first commit's time" : mode.startsWith("vs:") ? `time / ${esc(mode.slice(3))}'s time` : "median time (ms)";
    const layout = {
      height: 280, margin: {l: 60, r: 10, t: 10, b: 10}, showlegend: true,
      legend: {orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom", font: {size: 10}},
      xaxis: {title: {text: "commit (oldest → newest)", font: {size: 11}}, tickmode: "array", tickvals: ticks,
              ticktext: ticks.map((i) => esc(commits[i][0])), tickfont: {size: 9}, automargin: true,
              range: [-0.5, Math.max(n - 0.5, 0.5)], zeroline: false},
      yaxis: {title: {text: yTitle, font: {size: 11}}, type: mode === "log" ? "log" : "linear", automargin: true},
      hovermode: "closest", shapes,
    };
    return {data, layout};
  }

  // One trend chart, from its box's data file (loaded once for all the box's charts).
  function drawTrend(div, s) {
    const key = (s.provider || "") + "|" + yMode(s);
    if (div._kcKey === key) return;
    div._kcKey = key;
    const box = div.closest(".trends");
    const page = pageData();
    const view = Object.assign({}, page, {commitsOf: page.commits[box.dataset.gid] || []});
    const marks = (page.marks || []).filter((f) => f.gid === box.dataset.gid && f.mode === box.dataset.mode &&
                                                    f.dtype === box.dataset.dtype);
    load(box.dataset.file).then((series) => {
      const fig = trendFigure(series, div.dataset.shape, s, view, marks);
      Plotly.react(div, fig.data, fit(fig.layout, div, fig.data), PLOT_CONFIG);
    }).catch((err) => {
      div._kcKey = undefined;
      div.textContent = err.message;
      console.error(err);
    });
  }

  const chartEls = [...document.querySelectorAll(".shape-chart, .trend")];
  let current = readState();

  function refresh(el) {
    if (!window.Plotly || !visible(el)) return;
    if (el.classList.contains("shape-chart")) drawShape(el, current);
    else drawTrend(el, current);
  }

  // Charts are drawn when they come near the viewport, each on its own: a kernel page can hold
  // hundreds of them, and a part's trends dozens.
  const observer = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (e.isIntersecting) {
        e.target._kcSeen = true;
        refresh(e.target);
      }
    }
  }, {rootMargin: "400px 0px"}) : null;

  function drawCharts() {
    for (const el of chartEls) {
      if (!observer || el._kcSeen) refresh(el);
    }
  }

  function focusTarget(s) {
    let target = null;
    if (s.shape) {
      const trend = [...document.querySelectorAll(".trend")].find((d) => d.dataset.shape === s.shape && visible(d));
      target = trend && trend.closest(".trend-box");
    } else if (s.flag) {
      target = document.getElementById("flag-" + s.flag);
      if (target && target.hidden) update({providers: [], flag: s.flag}); // a filter hid what the link asks for
    }
    if (target) {
      target.classList.add("focus");
      target.scrollIntoView({block: "center"});
    }
  }

  // -- compare ---------------------------------------------------------------------------------
  const cmpForm = document.getElementById("kc-compare");

  function option(sel, value, label) {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = label;
    sel.appendChild(o);
  }

  function compareOptions(page, s) {
    const groups = page.groups;
    const gpus = groups.filter((g) => g.kind === "gpu");
    const mode = s.cmp === "gpus" && gpus.length ? "gpus" : "commits";
    cmpForm.elements.namedItem("cmp").value = mode;
    cmpForm.querySelector(".by-commits").hidden = mode !== "commits";
    const gsel = cmpForm.elements.namedItem("g");
    const a = cmpForm.elements.namedItem("a");
    const b = cmpForm.elements.namedItem("b");
    a.textContent = "";
    b.textContent = "";
    const out = {cmp: mode};
    if (mode === "commits") {
      // By default the group with the longest history: its newest two commits most likely share
      // series (a GPU measured at two commits on different kernels would show nothing).
      const longest = groups.reduce((best, x) => (!best || x.commits.length > best.commits.length ? x : best), null);
      const g = groups.find((x) => x.id === s.g) || longest;
      if (!g) return out;
      gsel.value = g.id;
      // Commits by their short hash (newest first), so a linked comparison survives new history.
      g.commits.slice().reverse().forEach((c) => {
        const label = `${c[0]} · ${c[1]}` + (c[2] ? ` · ${c[2].slice(0, 50)}` : "");
        option(a, c[0], label);
        option(b, c[0], label);
      });
      const n = g.commits.length;
      const pick = (v, dflt) => (g.commits.some((c) => c[0] === v) ? v : g.commits[dflt][0]);
      a.value = pick(s.a, Math.max(n - 2, 0));
      b.value = pick(s.b, n - 1);
      Object.assign(out, {g: g.id, a: a.value, b: b.value});
    } else {
      gpus.forEach((g) => {
        option(a, g.id, g.label);
        option(b, g.id, g.label);
      });
      a.value = gpus.some((g) => g.id === s.a) ? s.a : gpus[0].id;
      b.value = gpus.some((g) => g.id === s.b) ? s.b : gpus[Math.min(1, gpus.length - 1)].id;
      Object.assign(out, {a: a.value, b: b.value});
    }
    return out;
  }

  function cellEl(tag, value, cls) {
    const el = document.createElement(tag);
    el.textContent = value;
    if (cls) el.className = cls;
    return el;
  }

  function table(caption, name, headers, rows) {
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    const t = document.createElement("table");
    t.className = "compare data";
    t.dataset.name = name;
    t.createCaption().textContent = caption;
    const head = t.createTHead().insertRow();
    headers.forEach((h) => {
      const th = cellEl("th", h, /ms|change|series/.test(h) ? "num" : "");
      th.scope = "col";
      head.appendChild(th);
    });
    const body = t.createTBody();
    rows.forEach((cells) => {
      const tr = body.insertRow();
      cells.forEach((c) => tr.appendChild(c));
    });
    wrap.appendChild(t);
    enhanceTable(t);
    return wrap;
  }

  function changeCell(ratio) {
    const change = ratio - 1;
    const cls = "num" + (change > 0.05 ? " bad" : change < -0.05 ? " good" : "");
    const td = cellEl("td", `${change >= 0 ? "+" : ""}${(100 * change).toFixed(1)}%`, cls);
    td.dataset.v = String(change);
    return td;
  }

  function runCompare(page, s) {
    const status = document.getElementById("kc-compare-status");
    const summary = document.getElementById("kc-compare-summary");
    const detail = document.getElementById("kc-compare-detail");
    summary.textContent = "";
    detail.textContent = "";
    const wanted = (e) => (!s.mode || e.m === s.mode) && (!s.dtype || e.d === s.dtype);
    const groupsWanted = s.cmp === "commits" ? [s.g] : [s.a, s.b];
    const entries = page.manifest.filter((e) => groupsWanted.includes(e.g) && wanted(e));
    if (!entries.length) {
      status.textContent = "Nothing to compare with these choices.";
      return;
    }
    status.textContent = "loading…";
    const token = (runCompare.token = (runCompare.token || 0) + 1);
    Promise.all(entries.map((e) => load(e.f))).then(() => {
      if (token !== runCompare.token) return;
      const rows = [];
      if (s.cmp === "commits") {
        const commits = page.groups.find((x) => x.id === s.g).commits;
        const ia = commits.findIndex((c) => c[0] === s.a);
        const ib = commits.findIndex((c) => c[0] === s.b);
        for (const e of entries) {
          const series = loaded[e.f];
          for (const p of Object.keys(series)) {
            if (!providerOn(s, p)) continue;
            for (const [shape, [ci, med, , , cond]] of Object.entries(series[p])) {
              const ja = ci.indexOf(ia);
              const jb = ci.indexOf(ib);
              if (ja >= 0 && jb >= 0) rows.push({e, p, shape, a: med[ja], b: med[jb], same: cond[ja] === cond[jb]});
            }
          }
        }
      } else {
        const last = {};
        for (const e of entries) {
          const series = loaded[e.f];
          for (const p of Object.keys(series)) {
            if (!providerOn(s, p)) continue;
            for (const [shape, [, med]] of Object.entries(series[p])) {
              const key = JSON.stringify([e.k, e.m, e.d, p, shape]);
              (last[key] = last[key] || {e, p, shape, same: true})[e.g === s.a ? "a" : "b"] = med[med.length - 1];
              if (s.a === s.b) last[key].b = last[key].a;
            }
          }
        }
        for (const r of Object.values(last)) if (r.a !== undefined && r.b !== undefined) rows.push(r);
      }
      renderCompare(rows, s, page);
    }).catch((err) => {
      status.textContent = err.message;
      console.error(err);
    });
  }

  function renderCompare(rows, s, page) {
    const status = document.getElementById("kc-compare-status");
    const summary = document.getElementById("kc-compare-summary");
    const detail = document.getElementById("kc-compare-detail");
    const names = s.cmp === "commits"
      ? [s.a, s.b]
      : [s.a, s.b].map((id) => page.groups.find((g) => g.id === id).label);
    if (!rows.length) {
      status.textContent = `No series was measured at both ${names[0]} and ${names[1]} with these filters.`;
      return;
    }
    const like = rows.filter((r) => r.same);
    const worse = like.filter((r) => r.b / r.a > 1.05).length;
    const better = like.filter((r) => r.b / r.a < 1 / 1.05).length;
    const other = rows.length - like.length;
    status.textContent = `A = ${names[0]}, B = ${names[1]}: ${rows.length} series, ${worse} slower by more than 5%, ` +
      `${better} faster by more than 5%` + (other ? `; ${other} changed timing method or environment in between ` +
      "(marked, and left out of these counts)." : ".");
    const groups = {};
    for (const r of like) {
      const key = JSON.stringify([r.e.k, r.p]);
      (groups[key] = groups[key] || {k: r.e.k, s: r.e.s, p: r.p, logs: []}).logs.push(Math.log(r.b / r.a));
    }
    const sumRows = Object.values(groups).sort((x, y) => (x.k + x.p).localeCompare(y.k + y.p)).map((g) => {
      const link = document.createElement("td");
      const a = cellEl("a", g.k);
      a.href = `kernels/${g.s}.html`;
      link.appendChild(a);
      const gm = Math.exp(g.logs.reduce((x, y) => x + y, 0) / g.logs.length);
      return [link, cellEl("td", g.p), cellEl("td", String(g.logs.length), "num"), changeCell(gm)];
    });
    summary.appendChild(cellEl("h2", "Per kernel and provider"));
    summary.appendChild(table("Change per kernel and provider (geometric mean)", "compare-summary",
                              ["kernel", "provider", "series", "change (geometric mean)"], sumRows));
    rows.sort((x, y) => Math.abs(Math.log(y.b / y.a)) - Math.abs(Math.log(x.b / x.a)));
    const detRows = rows.map((r) => [cellEl("td", r.e.k), cellEl("td", r.e.m), cellEl("td", r.e.d), cellEl("td", r.p),
      cellEl("td", r.shape), cellEl("td", r.a.toPrecision(4), "num"), cellEl("td", r.b.toPrecision(4), "num"),
      changeCell(r.b / r.a), cellEl("td", r.same ? "" : "timing method or environment changed: not a kernel change")]);
    detail.appendChild(cellEl("h2", "Every series, largest change first"));
    detail.appendChild(table("Every series", "compare-detail",
                             ["kernel", "mode", "dtype", "provider", "shape", "A ms", "B ms", "change", "note"], detRows));
  }

  function compareUpdate(s) {
    const page = pageData();
    Object.assign(s, compareOptions(page, s));
    writeState(s);
    runCompare(page, s);
  }

  // -- wiring ----------------------------------------------------------------------------------
  function update(s) {
    current = s;
    syncForm(s);
    if (kind === "compare") {
      compareUpdate(s);
      return;
    }
    applyFilters(s);
    writeState(s);
    drawCharts();
  }

  if (form) {
    form.addEventListener("change", () => update(formState(current)));
    form.addEventListener("submit", (ev) => ev.preventDefault());
    const reset = document.getElementById("kc-reset");
    if (reset) reset.addEventListener("click", () => update({providers: [], y: current.y}));
  }
  if (axisForm) {
    axisForm.addEventListener("change", () => update(formState(current)));
    axisForm.addEventListener("submit", (ev) => ev.preventDefault());
  }
  if (cmpForm) {
    cmpForm.addEventListener("change", (ev) => {
      const s = formState(current);
      s.cmp = cmpForm.elements.namedItem("cmp").value;
      s.g = cmpForm.elements.namedItem("g").value;
      if (ev.target.name === "cmp" || ev.target.name === "g") {
        delete s.a;
        delete s.b;
      } else {
        s.a = cmpForm.elements.namedItem("a").value;
        s.b = cmpForm.elements.namedItem("b").value;
      }
      update(s);
    });
  }
  window.addEventListener("hashchange", () => {
    const s = readState();
    if (hashOf(s, Object.keys(s)) !== hashOf(current, Object.keys(current))) {
      update(s);
      focusTarget(s);
    }
  });
  // In-page links (the skip link, "how to read this") move the focus without touching the hash,
  // which holds the view.
  document.addEventListener("click", (ev) => {
    const a = ev.target.closest && ev.target.closest('a[href^="#"]');
    if (!a) return;
    const target = document.getElementById(a.getAttribute("href").slice(1));
    if (!target) return;
    ev.preventDefault();
    if (target.tagName === "DETAILS") target.open = true;
    if (!target.hasAttribute("tabindex")) target.setAttribute("tabindex", "-1");
    target.focus();
    target.scrollIntoView({block: "start"});
  });
  // On a phone the kernel list and the filters start folded: the header must not take the screen.
  if (NARROW.matches) document.querySelectorAll("details.fold").forEach((d) => (d.open = false));

  document.querySelectorAll("table.data").forEach(enhanceTable);
  update(current);
  if (observer) chartEls.forEach((el) => observer.observe(el));
  focusTarget(current);
})();
