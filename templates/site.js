/* kcollect site: filters kept in the URL hash (so a view can be linked), charts drawn with the
   local plotly.js, trend data loaded from data/*.js with <script> tags (fetch() of local files is
   blocked under file://). Text from the data is always set with textContent, never as HTML. */
"use strict";
(function () {
  const root = document.body.dataset.root || "";
  const kind = document.body.dataset.page;
  const PLOT_CONFIG = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  const FILTER_KEYS = ["gpu", "mode", "dtype", "provider"];

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

  function pageData() {
    const el = document.getElementById("kc-page");
    return el ? JSON.parse(el.textContent) : {};
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

  function syncForm(s) {
    if (!form) return;
    for (const name of ["gpu", "mode", "dtype"]) {
      const sel = form.elements.namedItem(name);
      if (sel) sel.value = s[name] || "";
    }
    form.querySelectorAll("input[name=provider]").forEach((box) => {
      box.checked = !s.providers.length || s.providers.includes(box.value);
    });
  }

  function formState(prev) {
    const s = Object.assign({}, prev);
    for (const name of ["gpu", "mode", "dtype"]) {
      const sel = form.elements.namedItem(name);
      if (sel) s[name] = sel.value;
    }
    const boxes = [...form.querySelectorAll("input[name=provider]")];
    const on = boxes.filter((b) => b.checked).map((b) => b.value);
    s.providers = on.length === boxes.length ? [] : on;
    s.provider = s.providers.join(",");
    delete s.shape; // a focus from a link is spent once the view changes
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
      nothing.hidden = [...items].some(visible);
    }
  }

  // -- charts ----------------------------------------------------------------------------------
  function providerOn(s, p) {
    return !s.providers.length || s.providers.includes(p);
  }

  function drawShape(div, s) {
    const key = s.provider || "";
    if (div._kcKey === key) return;
    div._kcKey = key;
    if (!div._kcFig) div._kcFig = JSON.parse(document.getElementById(div.dataset.fig).textContent);
    const fig = div._kcFig;
    const data = fig.data.map((t) => Object.assign({}, t, {visible: !t.meta || providerOn(s, t.meta)}));
    Plotly.react(div, data, fig.layout, PLOT_CONFIG);
  }

  function rgba(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${alpha})`;
  }

  function trendFigure(series, shape, s, commits, flags, colors, providers) {
    const data = [];
    const order = providers.filter((p) => p in series).concat(Object.keys(series).filter((p) => !providers.includes(p)));
    order.forEach((p) => {
      const ser = series[p][shape];
      if (!ser || !providerOn(s, p)) return;
      const [ci, med, p20, p80] = ser;
      const color = colors[p] || "#7f7f7f";
      const text = ci.map((c) => (commits[c] ? esc(commits[c][0] + " · " + commits[c][1]) : String(c)));
      data.push({type: "scatter", x: ci, y: p20, mode: "lines", line: {width: 0, color}, hoverinfo: "skip",
                 showlegend: false, legendgroup: p});
      data.push({type: "scatter", x: ci, y: p80, mode: "lines", line: {width: 0, color}, fill: "tonexty",
                 fillcolor: rgba(color, 0.2), hoverinfo: "skip", showlegend: false, legendgroup: p});
      data.push({type: "scatter", x: ci, y: med, mode: ci.length > 1 ? "lines+markers" : "markers", name: esc(p),
                 legendgroup: p, line: {color, width: 1.5}, marker: {size: 4, color}, text,
                 hovertemplate: "%{text}<br>%{y:.4g} ms<extra>" + esc(p) + "</extra>"});
    });
    const mine = flags.filter((f) => f.shape === shape && f.ci !== null && providerOn(s, f.provider));
    for (const kindName of ["regression", "improvement"]) {
      const fl = mine.filter((f) => f.kind === kindName);
      if (!fl.length) continue;
      data.push({type: "scatter", mode: "markers", name: kindName, x: fl.map((f) => f.ci), y: fl.map((f) => f.after_ms),
                 marker: {symbol: kindName === "regression" ? "triangle-up" : "triangle-down", size: 12,
                          color: kindName === "regression" ? "#c62828" : "#2e7d32", line: {width: 1, color: "#000"}},
                 text: fl.map((f) => esc(`${f.provider}: ${f.before} → ${f.after}, ${(100 * f.change).toFixed(1)}%`)),
                 hovertemplate: "%{text}<extra>" + kindName + "</extra>"});
    }
    const n = commits.length;
    const ticks = [];
    const step = Math.max(1, Math.ceil(n / 6));
    for (let i = 0; i < n; i += step) ticks.push(i);
    if (n && ticks[ticks.length - 1] !== n - 1) ticks.push(n - 1);
    const layout = {
      title: {text: esc(shape), font: {size: 13}, x: 0.02}, height: 250, margin: {l: 55, r: 10, t: 30, b: 40},
      showlegend: true, legend: {orientation: "h", y: -0.22, font: {size: 10}},
      xaxis: {tickmode: "array", tickvals: ticks, ticktext: ticks.map((i) => esc(commits[i][0])), tickfont: {size: 9},
              range: [-0.5, Math.max(n - 0.5, 0.5)], zeroline: false},
      yaxis: {title: {text: "ms"}, rangemode: "tozero"}, hovermode: "closest",
    };
    return {data, layout};
  }

  function drawTrends(box, s) {
    const key = s.provider || "";
    if (box._kcKey === key) return;
    box._kcKey = key;
    const page = pageData();
    const commits = page.commits[box.dataset.gid] || [];
    const flags = (page.flags || []).filter((f) => f.gid === box.dataset.gid && f.mode === box.dataset.mode &&
                                                    f.dtype === box.dataset.dtype);
    load(box.dataset.file).then((series) => {
      box.querySelectorAll(".trend").forEach((div) => {
        const fig = trendFigure(series, div.dataset.shape, s, commits, flags, page.colors || {}, page.providers || []);
        Plotly.react(div, fig.data, fig.layout, PLOT_CONFIG);
      });
    }).catch((err) => {
      box._kcKey = undefined;
      box.textContent = err.message;
      console.error(err);
    });
  }

  const chartEls = [...document.querySelectorAll(".shape-chart, .trends")];
  let current = readState();

  function refresh(el) {
    if (!window.Plotly || !visible(el)) return;
    if (el.classList.contains("shape-chart")) drawShape(el, current);
    else drawTrends(el, current);
  }

  // Charts are drawn when they come near the viewport: a kernel page can hold a hundred of them.
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

  function focusShape(s) {
    if (!s.shape) return;
    const target = [...document.querySelectorAll(".trend")].find((d) => d.dataset.shape === s.shape && visible(d));
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
      const g = groups.find((x) => x.id === s.g) || groups[0];
      if (!g) return out;
      gsel.value = g.id;
      // Commits by their short hash (newest first), so a linked comparison survives new history.
      g.commits.slice().reverse().forEach((c) => {
        option(a, c[0], `${c[0]} · ${c[1]}`);
        option(b, c[0], `${c[0]} · ${c[1]}`);
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

  function cellEl(tag, text, cls) {
    const el = document.createElement(tag);
    el.textContent = text;
    if (cls) el.className = cls;
    return el;
  }

  function table(headers, rows) {
    const t = document.createElement("table");
    t.className = "compare";
    const head = t.createTHead().insertRow();
    headers.forEach((h) => head.appendChild(cellEl("th", h, /ms|change|ratio|series/.test(h) ? "num" : "")));
    const body = t.createTBody();
    rows.forEach((cells) => {
      const tr = body.insertRow();
      cells.forEach((c) => tr.appendChild(c));
    });
    return t;
  }

  function changeCell(ratio) {
    const change = ratio - 1;
    const cls = "num" + (change > 0.05 ? " bad" : change < -0.05 ? " good" : "");
    return cellEl("td", `${change >= 0 ? "+" : ""}${(100 * change).toFixed(1)}%`, cls);
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
            for (const [shape, [ci, med]] of Object.entries(series[p])) {
              const ja = ci.indexOf(ia);
              const jb = ci.indexOf(ib);
              if (ja >= 0 && jb >= 0) rows.push({e, p, shape, a: med[ja], b: med[jb]});
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
              (last[key] = last[key] || {e, p, shape})[e.g === s.a ? "a" : "b"] = med[med.length - 1];
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
    const worse = rows.filter((r) => r.b / r.a > 1.05).length;
    const better = rows.filter((r) => r.b / r.a < 1 / 1.05).length;
    status.textContent = `A = ${names[0]}, B = ${names[1]}: ${rows.length} series, ${worse} slower by more than 5%, ` +
      `${better} faster by more than 5%.`;
    const groups = {};
    for (const r of rows) {
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
    summary.appendChild(table(["kernel", "provider", "series", "change (geometric mean)"], sumRows));
    rows.sort((x, y) => Math.abs(Math.log(y.b / y.a)) - Math.abs(Math.log(x.b / x.a)));
    const detRows = rows.map((r) => [cellEl("td", r.e.k), cellEl("td", r.e.m), cellEl("td", r.e.d), cellEl("td", r.p),
      cellEl("td", r.shape), cellEl("td", r.a.toPrecision(4), "num"), cellEl("td", r.b.toPrecision(4), "num"),
      changeCell(r.b / r.a)]);
    detail.appendChild(cellEl("h2", "Every series, largest change first"));
    detail.appendChild(table(["kernel", "mode", "dtype", "provider", "shape", "A ms", "B ms", "change"], detRows));
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
    if (reset) reset.addEventListener("click", () => update({providers: []}));
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
    if (hashOf(s, Object.keys(s)) !== hashOf(current, Object.keys(current))) update(s);
  });

  update(current);
  if (observer) chartEls.forEach((el) => observer.observe(el));
  focusShape(current);
})();
