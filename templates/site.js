/* kcollect site: filters kept in the URL hash (so a view can be linked), tables drawn from the pages'
   data files (sortable, paginated, downloadable as CSV with the raw numbers), charts drawn with the
   local plotly.js when they come into view. Data files are loaded with <script> tags (fetch() of
   local files is blocked under file://). Text from the data is always set with textContent, never
   as HTML; Plotly's labels are escaped first. */
"use strict";
(function () {
  const root = document.body.dataset.root || "";
  const kind = document.body.dataset.page;
  const PLOT_CONFIG = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  const FILTER_KEYS = ["gpu", "mode", "dtype", "provider", "kind", "kernel", "machine", "y"];
  const SELECTS = ["gpu", "mode", "dtype", "kind", "kernel", "machine"];
  const PAGE_ROWS = 50; // rows a table shows at once: the rest is a click away, and the page stays light
  const OURS = "triton";

  // -- data files ------------------------------------------------------------------------------
  const loaded = {};
  const waiting = {};
  window.KC = {
    put(name, value) {
      if (value && value.enc) unpack(value);
      if (value && value.bands) unband(value);
      loaded[name] = value;
      (waiting[name] || []).forEach((w) => w.resolve(value));
      delete waiting[name];
    },
  };

  // A packed table (site.py: packed): its string columns hold indexes into value.strings.
  function unpack(value) {
    for (const row of value.rows) {
      for (const c of value.enc) if (row[c] !== null) row[c] = value.strings[row[c]];
    }
    delete value.enc;
    delete value.strings;
  }

  // A trend file's band edges, sent as offsets from each median in 1/bands of it (site.py: BANDS).
  function unband(value) {
    for (const shapes of Object.values(value.series)) {
      for (const s of Object.values(shapes)) {
        for (const e of [2, 3]) s[e] = s[e].map((d, j) => s[1][j] * (1 + d / value.bands));
      }
    }
    delete value.bands;
  }

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

  // Each group's commits ([short, date, subject, url]): one file for every page that needs them.
  let commitsOf = {};
  const commitsReady = () => load("data/commits.js").then((c) => (commitsOf = c));

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

  // -- numbers as the templates print them -------------------------------------------------------
  const none = (v) => v === null || v === undefined || Number.isNaN(v);
  const sig = (v, n) => String(Number(Number(v).toPrecision(n)));
  const ms = (v) => (none(v) ? "—" : sig(v, 4));
  const rate = (v) => (none(v) ? "—" : v >= 100 ? Math.round(v).toLocaleString("en-US") : sig(v, 3));
  const pct = (v) => (none(v) ? "—" : v >= 0.01 || v === 0 ? `${Math.round(100 * v)}%` : `${sig(100 * v, 1)}%`);
  const times = (v) => (none(v) ? "—" : v >= 100 ? `${Math.round(v)}×` : v >= 10 ? `${v.toFixed(1)}×` : v >= 0.1 ? `${v.toFixed(2)}×` : `${sig(v, 2)}×`);
  const signed = (v) => (none(v) ? "—" : `${v >= 0 ? "+" : ""}${(100 * v).toFixed(1)}%`);
  const sci = (v) => (none(v) ? "—" : Number(v).toExponential(1));
  const noiseText = (v) => (none(v) ? "—" : `±${sig(100 * v, 2)}%`);
  function count(v) {
    if (none(v)) return "—";
    for (const [scale, prefix] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
      if (v >= scale) return sig(v / scale, 3) + prefix;
    }
    return sig(v, 3);
  }
  function mib(v) {
    if (none(v)) return "—";
    return v < 2 ** 30 ? `${sig(v / 2 ** 20, 3)} MiB` : `${sig(v / 2 ** 30, 3)} GiB`;
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
      const href = a.getAttribute("href");
      if (href.includes("#") && !a.dataset.base) a.dataset.base = href; // a link that names its own view keeps it
      a.setAttribute("href", a.dataset.base || href.split("#")[0] + (hash ? "#" + hash : ""));
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
      const active = SELECTS.filter((k) => s[k] && form.elements.namedItem(k)).length + (s.providers.length ? 1 : 0);
      const mark = document.getElementById("kc-active");
      if (mark) mark.textContent = active ? `(${active} on)` : "";
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

  function providerOn(s, p) {
    return !s.providers.length || s.providers.includes(p);
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
    if ("provider" in d && !providerOn(s, d.provider)) return false;
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
    tables.forEach((t) => t.update(s));
    const nothing = document.getElementById("kc-nothing");
    if (nothing) {
      const items = document.querySelectorAll("main tbody tr[data-f], main section.part, main section.group");
      nothing.hidden = !items.length || [...items].some((el) => !el.hidden && !el.closest("[hidden]"));
    }
  }

  // -- server-rendered tables: sort by any column, download as CSV -----------------------------
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
    v = v === null || v === undefined ? "" : String(v);
    // A cell that a spreadsheet would run as a formula is quoted as text.
    if (/^[=@\t\r]/.test(v) || (/^[+-]/.test(v) && !/^[+-][\d.]/.test(v))) v = "'" + v;
    return /[",\n]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v;
  }

  // What a cell gives a CSV: its raw values where the page says them (data-csv: a JSON list, for
  // a cell that shows several numbers; data-v: the number a cell shows as 1.23× or 8%), else its text.
  function cellValues(c, head) {
    if (c.dataset.csv) return JSON.parse(c.dataset.csv);
    if (c.dataset.v !== undefined && !(head && head.dataset.csv)) return [c.dataset.v];
    const width = head && head.dataset.csv ? JSON.parse(head.dataset.csv).length : 1;
    return [text(c).replace(/[↕↑↓]$/, "").trim(), ...Array(width - 1).fill("")];
  }

  function tableCSV(table) {
    const heads = [...table.tHead.rows[table.tHead.rows.length - 1].cells].filter((c) => !c.hidden);
    const lines = [heads.flatMap((h) => (h.dataset.csv ? JSON.parse(h.dataset.csv) : [text(h).replace(/[↕↑↓]$/, "").trim()]))];
    for (const r of table.tBodies[0].rows) {
      if (r.hidden) continue;
      lines.push([...r.cells].filter((c) => !c.hidden).flatMap((c, i) => cellValues(c, heads[i])));
    }
    return lines.map((l) => l.map(csvValue).join(",")).join("\n") + "\n";
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

  function csvButton(caption, name, body) {
    const csv = document.createElement("button");
    csv.type = "button";
    csv.className = "csv";
    csv.textContent = "CSV";
    csv.setAttribute("aria-label", "Download this table as CSV: " + (text(caption) || "table"));
    csv.addEventListener("click", () => download(name + ".csv", body(), "text/csv"));
    const tools = document.createElement("span");
    tools.className = "table-tools";
    tools.appendChild(csv);
    caption.appendChild(tools);
  }

  function sortButton(th, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "sort";
    while (th.firstChild) b.appendChild(th.firstChild);
    th.appendChild(b);
    b.addEventListener("click", onClick);
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
      sortButton(th, () => sortTable(table, here, th));
    }
    csvButton(table.caption || table.createCaption(), table.dataset.name || "table", () => tableCSV(table));
  }

  // -- tables drawn from data: sorted and filtered over every row, shown a page at a time -------
  function el(tag, cls, value) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (value !== undefined && value !== null) e.textContent = value;
    return e;
  }

  function shapeCode(shape) {
    // shape labels (M=4096,N=14336) may wrap after a comma, never inside a number
    const code = el("code");
    String(shape).split(",").forEach((part, i) => {
      if (i) {
        code.appendChild(document.createTextNode(","));
        code.appendChild(document.createElement("wbr"));
      }
      code.appendChild(document.createTextNode(part));
    });
    return code;
  }

  function swatch(p) {
    const s = el("span", "swatch");
    s.style.background = (pageData().colors || {})[p] || "#777";
    return s;
  }

  function commitLink(c) {
    // c: [short, date, subject, url]
    if (!c) return el("code", "commit", "?");
    const code = el("code", null, c[0]);
    const title = [c[0], c[2], c[1]].filter(Boolean).join("\n");
    if (!c[3]) {
      code.className = "commit";
      code.title = title;
      return code;
    }
    const a = el("a", "ext commit");
    a.href = c[3];
    a.title = title;
    a.appendChild(code);
    return a;
  }

  function spark(sp) {
    if (!sp || !sp.points) return null;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 100 24");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", sp.points);
    svg.appendChild(line);
    if (sp.x !== null) {
      const dot = document.createElementNS(ns, "circle");
      dot.setAttribute("cx", sp.x);
      dot.setAttribute("cy", sp.y);
      dot.setAttribute("r", "2.5");
      svg.appendChild(dot);
    }
    return svg;
  }

  const tables = [];

  // A table over data rows (objects). spec: {name, caption, note, columns, rows, filter(row, s),
  // row(row, tr)}; a column: {label, title, num, value(row) (sorts; the CSV's value), cell(row, td),
  // span(row) (columns a cell covers), csvHead [names], csv(row) -> [values]}.
  class DataTable {
    constructor(host, spec) {
      this.spec = spec;
      this.page = 0;
      this.sortCol = null;
      this.dir = 1;
      this.shown = spec.rows;
      host.textContent = "";
      const wrap = el("div", "table-wrap");
      const t = (this.table = el("table", "data " + (spec.cls || "")));
      t.dataset.name = spec.name;
      const cap = t.createCaption();
      cap.appendChild(document.createTextNode(spec.caption + " "));
      if (spec.note) cap.appendChild(el("span", "small", spec.note + " "));
      this.countEl = cap.appendChild(el("span", "small"));
      csvButton(cap, spec.name, () => this.csv());
      const head = t.createTHead().insertRow();
      this.ths = spec.columns.map((c, i) => {
        const th = el("th", c.num ? "num" : "", c.label);
        th.scope = "col";
        if (c.title) th.title = c.title;
        head.appendChild(th);
        sortButton(th, () => this.sortBy(i));
        return th;
      });
      this.body = t.createTBody();
      wrap.appendChild(t);
      host.appendChild(wrap);
      const pager = (this.pager = el("nav", "pager"));
      pager.setAttribute("aria-label", "pages of " + spec.caption);
      this.prev = pager.appendChild(el("button", null, "‹ previous"));
      this.where = pager.appendChild(el("span", "small"));
      this.next = pager.appendChild(el("button", null, "next ›"));
      this.prev.type = this.next.type = "button";
      this.prev.addEventListener("click", () => this.go(this.page - 1));
      this.next.addEventListener("click", () => this.go(this.page + 1));
      host.appendChild(pager);
      tables.push(this);
    }

    update(s) {
      const keep = this.spec.filter || (() => true);
      this.shown = this.spec.rows.filter((r) => keep(r, s));
      this.order();
      this.page = Math.min(this.page, Math.max(0, Math.ceil(this.shown.length / PAGE_ROWS) - 1));
      this.render();
    }

    order() {
      if (this.sortCol === null) return;
      const c = this.spec.columns[this.sortCol];
      const key = (r) => {
        const v = c.value(r);
        return v === null || v === undefined || v === "" ? null : typeof v === "string" ? v.toLowerCase() : v;
      };
      const keyed = this.shown.map((r, i) => [key(r), i, r]);
      keyed.sort((x, y) => {
        const k = compareKeys(x[0], y[0]);
        return (x[0] === null || y[0] === null ? k : this.dir * k) || x[1] - y[1];
      });
      this.shown = keyed.map((x) => x[2]);
    }

    sortBy(i) {
      this.dir = this.sortCol === i ? -this.dir : 1;
      this.sortCol = i;
      this.page = 0; // a new order starts from its top
      this.ths.forEach((th, j) => (j === i ? th.setAttribute("aria-sort", this.dir > 0 ? "ascending" : "descending")
                                           : th.removeAttribute("aria-sort")));
      this.update(current);
    }

    go(page) {
      this.page = Math.max(0, Math.min(page, Math.ceil(this.shown.length / PAGE_ROWS) - 1));
      this.render();
    }

    render() {
      const {columns} = this.spec;
      const from = this.page * PAGE_ROWS;
      const rows = this.shown.slice(from, from + PAGE_ROWS);
      this.body.textContent = "";
      const group = this.spec.group || (() => null);
      rows.forEach((r, j) => {
        // the first row of a run of rows of one group (a shape's providers) leads it: only it names the group
        const lead = j === 0 || group(r) === null || group(r) !== group(rows[j - 1]);
        const tr = this.body.insertRow();
        tr._row = r;
        if (this.spec.row) this.spec.row(r, tr, lead);
        for (let i = 0; i < columns.length; i++) {
          const c = columns[i];
          const td = tr.insertCell();
          if (c.num) td.className = "num";
          td.dataset.label = c.label; // the card layout of a narrow screen names each cell
          c.cell(r, td, lead);
          const span = c.span ? c.span(r) : 1;
          if (span > 1) {
            td.colSpan = span;
            i += span - 1;
          }
        }
      });
      const n = this.shown.length;
      const total = this.spec.rows.length;
      this.countEl.textContent = n === total ? `(${n} rows)` : `(${n} of ${total} rows shown by the filters)`;
      this.where.textContent = n ? `rows ${from + 1}–${from + rows.length} of ${n}` : "no row matches these filters";
      this.pager.hidden = n <= PAGE_ROWS;
      this.prev.disabled = this.page === 0;
      this.next.disabled = from + PAGE_ROWS >= n;
    }

    // The table row of a data row, after turning to its page; null where the filters hide it.
    reveal(pred) {
      const i = this.shown.findIndex(pred);
      if (i < 0) return null;
      this.go(Math.floor(i / PAGE_ROWS));
      return [...this.body.rows].find((tr) => pred(tr._row)) || null;
    }

    csv() {
      const cols = this.spec.columns;
      const lines = [cols.flatMap((c) => c.csvHead || [c.label])];
      for (const r of this.shown) lines.push(cols.flatMap((c) => (c.csv ? c.csv(r) : [c.value(r)])));
      return lines.map((l) => l.map(csvValue).join(",")).join("\n") + "\n";
    }
  }

  function objects(data) {
    return data.rows.map((row) => Object.fromEntries(data.cols.map((c, i) => [c, row[i]])));
  }

  // -- a kernel's results, part by part (one GPU, mode and dtype) ------------------------------
  function partColumns(part, baseline, unit) {
    const okCols = 8 + (part.has_tokens ? 1 : 0); // median .. vs best other: one cell with the reason where not ok
    const numCell = (f, key) => (r, td) => {
      td.textContent = f(r[key]);
      if (!none(r[key])) td.dataset.v = r[key];
    };
    const ratioCell = (key) => (r, td) => {
      td.textContent = times(r[key]);
      if (!none(r[key]) && Math.abs(Math.log(r[key])) >= 0.005) td.classList.add(r[key] > 1 ? "good" : "bad");
      if (r[key] !== null && r.mixed) {
        const sup = el("sup", "mixed", "≠");
        sup.title = r.mixed;
        td.appendChild(sup);
      }
    };
    const cols = [
      {label: "shape", value: (r) => r._i, csv: (r) => [r.shape], cell: (r, td, lead) => {
        td.className = "shape";
        if (lead) td.appendChild(shapeCode(r.shape));
      }},
      {label: "provider", value: (r) => r.provider, cell: (r, td) => {
        td.className = "provider";
        td.appendChild(swatch(r.provider));
        td.appendChild(document.createTextNode(r.provider));
        if (r.provider === baseline) td.appendChild(el("span", "small", " (baseline)"));
      }},
      {label: "median ms", num: true, value: (r) => r.median_ms, span: (r) => (r.status === "ok" ? 1 : okCols), cell: (r, td) => {
        if (r.status !== "ok") {
          td.className = "";
          td.appendChild(el("span", "why", (r.error || r.status).slice(0, 160)));
          return;
        }
        td.textContent = ms(r.median_ms);
        if (r.timing === "cuda-events") {
          const ab = el("abbr", "small", " ev");
          ab.title = "CUDA-graph capture failed for this provider: timed with CUDA events, host overhead included";
          td.appendChild(ab);
        }
      }},
      {label: "p20–p80 ms", num: true, title: "a cell's tooltip: mean, std, min, p99 and max of the timed calls",
       value: (r) => r.p20_ms, csvHead: ["p20 ms", "p80 ms"], csv: (r) => [r.p20_ms, r.p80_ms], cell: (r, td) => {
        td.textContent = `${ms(r.p20_ms)}–${ms(r.p80_ms)}`;
        if (!none(r.mean_ms)) {
          td.title = `of ${r.reps} timed calls: mean ${ms(r.mean_ms)}, std ${ms(r.std_ms)}, min ${ms(r.min_ms)}` +
            (none(r.p99_ms) ? "" : `, p99 ${ms(r.p99_ms)}, max ${ms(r.max_ms)}`) + " ms";
        }
      }},
      {label: "reps", num: true, value: (r) => r.reps, cell: numCell((v) => (none(v) ? "—" : String(v)), "reps")},
      {label: unit, num: true, value: (r) => r.rate, cell: numCell(rate, "rate")},
      {label: "% of ceiling", num: true, value: (r) => r.frac_of_peak, csvHead: ["fraction of ceiling"], cell: numCell(pct, "frac_of_peak")},
    ];
    if (part.has_tokens) {
      cols.push({label: "tokens/s", num: true, title: "tokens one call processes / median time", value: (r) => r.tokens_per_s,
                 cell: numCell(count, "tokens_per_s")});
    }
    cols.push(
      {label: "vs " + baseline, num: true, value: (r) => r.vs_base, cell: ratioCell("vs_base")},
      {label: "vs best other", num: true, title: "time of the fastest other provider / this time", value: (r) => r.vs_best,
       cell: ratioCell("vs_best")},
      {label: "peak memory", num: true, value: (r) => r.peak_mem_bytes, csvHead: ["peak memory bytes"], cell: numCell(mib, "peak_mem_bytes")},
      {label: "rel. error / tolerance", num: true, value: (r) => r.rel_err, csvHead: ["rel. error", "tolerance"],
       csv: (r) => [r.rel_err, r.tolerance], cell: (r, td) => (td.textContent = `${sci(r.rel_err)} / ${sci(r.tolerance)}`)},
    );
    if (part.has_config) {
      cols.push({label: "config", value: (r) => r.config, cell: (r, td) => {
        td.className = "config";
        if (r.config) {
          const code = el("code", null, r.config.length > 60 ? r.config.slice(0, 57) + "..." : r.config);
          code.title = r.config;
          td.appendChild(code);
        }
      }});
    }
    cols.push({label: "status", value: (r) => r.status, csvHead: ["status", "error"], csv: (r) => [r.status, r.error],
               cell: (r, td) => td.appendChild(el("span", "badge " + r.status, r.status))});
    return cols;
  }

  function partRows(part) {
    const rows = objects(part);
    rows.forEach((r) => (r._i = part.shapes.indexOf(r.shape)));
    return rows;
  }

  function showPart(section) {
    if (section._kc) return section._kc;
    section._kc = Promise.all([load(section.dataset.part), commitsReady()]).then(([part]) => {
      const page = pageData();
      const host = section.querySelector(".jtable");
      part.objects = partRows(part);
      const t = new DataTable(host, {
        name: host.dataset.name, caption: host.dataset.caption, cls: "results",
        note: "rel. error against the float64 reference, beside the tolerance it must stay under",
        columns: partColumns(part, page.baseline, page.unit), rows: part.objects,
        filter: (r, s) => providerOn(s, r.provider), group: (r) => r.shape,
        row: (r, tr, lead) => {
          tr.className = r.status + (lead ? " first" : "");
          tr.dataset.provider = r.provider;
        },
      });
      t.update(current);
      section._part = part;
      section.querySelectorAll(".shape-chart").forEach(refresh);
      return part;
    });
    section._kc.catch((err) => {
      section.querySelector(".jtable").textContent = err.message;
      console.error(err);
    });
    return section._kc;
  }

  // -- flags: the regressions table, and each kernel page's folded list ------------------------
  function flagColumns(data) {
    const commits = commitsOf;
    const c = (r, ci) => (ci === null || ci === undefined ? null : (commits[r.gid] || [])[ci]);
    return [
      {label: "state", value: (r) => r.order, csvHead: ["state", "decision", "reason"],
       csv: (r) => [r.label, r.ack ? r.ack.state : "", r.ack ? r.ack.reason : ""], cell: (r, td) => {
        td.appendChild(el("span", `badge ${r.kind} ${r.state}`, r.label));
        if (r.end !== null) {
          const d = td.appendChild(el("div", "small", (r.state === "recovered" ? "back" : "lost") + " at "));
          d.appendChild(commitLink(c(r, r.end)));
        }
        if (r.undoes !== null) {
          const d = td.appendChild(el("div", "small", "undoes the regression at "));
          d.appendChild(commitLink(c(r, r.undoes)));
        }
        if (r.ack) {
          const d = td.appendChild(el("div", "ack"));
          d.appendChild(el("strong", null, r.ack.state + ": "));
          d.appendChild(document.createTextNode(r.ack.reason + (r.ack.by ? ` (${r.ack.by})` : "")));
        }
      }},
      // the change next to the state: the answer in view without scrolling a wide table
      {label: "change", num: true, value: (r) => r.change, cell: (r, td) => {
        td.textContent = signed(r.change);
        td.classList.add(r.change > 0 ? "bad" : "good");
      }},
      {label: "kernel", value: (r) => r.kernel, cell: (r, td) => {
        const a = el("a", null, r.kernel);
        const q = new URLSearchParams({gpu: r.gid, mode: r.mode, dtype: r.dtype, shape: r.shape});
        a.href = `${root}kernels/${r.slug}.html#${q}`;
        td.appendChild(a);
      }},
      {label: "mode · dtype", value: (r) => r.mode + " " + r.dtype, csvHead: ["mode", "dtype"], csv: (r) => [r.mode, r.dtype],
       cell: (r, td) => (td.textContent = `${r.mode} · ${r.dtype}`)},
      {label: "provider", value: (r) => r.provider, cell: (r, td) => {
        td.textContent = r.provider;
        if (r.ours) td.appendChild(el("span", "small", " (ours)"));
      }},
      {label: "shape", value: (r) => r.shape, cell: (r, td) => td.appendChild(shapeCode(r.shape))},
      {label: "GPU · machine", value: (r) => (data.labels[r.gid] || r.gid) + " " + r.machine, csvHead: ["GPU", "machine"],
       csv: (r) => [data.labels[r.gid] || r.gid, r.machine], cell: (r, td) => {
        td.textContent = data.labels[r.gid] || r.gid;
        td.appendChild(el("span", "small", " · " + r.machine));
      }},
      {label: "commits", value: (r) => (c(r, r.a) || [])[1] || null, csvHead: ["before commit", "after commit", "date", "subject or what changed"],
       csv: (r) => [(c(r, r.b) || [])[0], (c(r, r.a) || [])[0], (c(r, r.a) || [])[1], r.what || (c(r, r.a) || [])[2]],
       cell: (r, td) => {
        td.className = "commits";
        const after = c(r, r.a) || [];
        td.appendChild(commitLink(c(r, r.b)));
        td.appendChild(document.createTextNode(" → "));
        td.appendChild(commitLink(after));
        if (r.n_commits > 1) td.appendChild(el("span", "small", ` (${r.n_commits} commits)`));
        td.appendChild(el("span", "small", " " + (after[1] || "")));
        const why = td.appendChild(el("div", "why"));
        if (r.what) {
          why.appendChild(el("strong", null, "not a kernel change: "));
          why.appendChild(document.createTextNode(r.what));
        } else if (after[2]) {
          why.appendChild(el("span", "subject", after[2].length > 140 ? after[2].slice(0, 137) + "..." : after[2]));
        }
      }},
      {label: "before ms", num: true, value: (r) => r.before_ms, cell: (r, td) => (td.textContent = ms(r.before_ms))},
      {label: "after ms", num: true, value: (r) => r.after_ms, cell: (r, td) => (td.textContent = ms(r.after_ms))},
      {label: "× noise (series noise)", num: true, value: (r) => r.z, csvHead: ["z (standard errors)", "series noise"],
       csv: (r) => [r.z, r.noise], cell: (r, td) => {
        if (none(r.z)) {
          td.textContent = "—";
          return;
        }
        td.textContent = `${r.z.toFixed(1)}× `;
        td.appendChild(el("span", "small", `(${noiseText(r.noise)})`));
      }},
      {label: "trend", value: () => null, csvHead: [], csv: () => [], cell: (r, td) => {
        const s = spark(r.spark);
        if (s) td.appendChild(s);
      }},
    ];
  }

  function showFlags(host) {
    if (host._kc) return host._kc;
    host._kc = Promise.all([load("data/flags.js"), commitsReady()]).then(([data]) => {
      const only = host.dataset.kernel; // a kernel page: its own steps, never the changes of conditions
      const rows = objects(data).filter((r) => !only || (r.kernel === only && r.state !== "condition"));
      const t = new DataTable(host, {
        name: host.dataset.name, caption: host.dataset.caption, cls: "flags-table",
        note: "open regressions first (ours, the most severe first), then recovered ones, improvements, and changes of timing method, machine or environment",
        columns: flagColumns(data), rows,
        filter: (r, s) => (only || ((!s.kind || r.filter_kind === s.kind) && (!s.kernel || r.kernel === s.kernel) &&
                                    (!s.machine || r.machine === s.machine))) &&
          (!s.gpu || r.gid === s.gpu) && (!s.mode || r.mode === s.mode) && (!s.dtype || r.dtype === s.dtype) &&
          providerOn(s, r.provider),
        row: (r, tr) => {
          tr.className = `${r.kind} ${r.state}${r.ack ? " acked" : ""}`;
          if (r.id) tr.id = "flag-" + r.id;
        },
      });
      t.update(current);
      host._table = t;
      return t;
    });
    host._kc.catch((err) => {
      host.textContent = err.message;
      console.error(err);
    });
    return host._kc;
  }

  // -- charts ----------------------------------------------------------------------------------
  function yMode(s) {
    return s.y || "log";
  }

  // Beside the plot on a wide screen, above it on a narrow one: never over the lines.
  function legendAt(div) {
    return div.clientWidth >= 560
      ? {orientation: "v", x: 1.02, xanchor: "left", y: 1, yanchor: "top", font: {size: 11}}
      : {orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom", font: {size: 10}};
  }

  // On a narrow screen a legend takes several rows above the plot, and category labels take their
  // length below it: give the chart the height they take, so that the plot area keeps its size.
  // Plotly lays a horizontal legend out in columns as wide as its longest entry.
  function fit(layout, div, data) {
    layout = Object.assign({}, layout, {legend: legendAt(div)});
    if (div.clientWidth >= 560 || layout.showlegend === false) return layout;
    const names = data.filter((t) => t.visible !== false && t.showlegend !== false).map((t) => String(t.name));
    const entry = 40 + 6 * Math.max(0, ...names.map((n) => n.length)); // px at font size 10
    const rows = Math.ceil(names.length / Math.max(1, Math.floor((div.clientWidth - 20) / entry)));
    const xs = data.flatMap((t) => (t.x || []).map((x) => String(x).length));
    const ticks = layout.xaxis && layout.xaxis.type === "category" ? Math.min(300, 6 * Math.max(0, ...xs)) : 0;
    return Object.assign(layout, {height: layout.height + 20 * rows + 40 + ticks});
  }

  // A click on a point opens its commit, where the point knows one (customdata).
  function clickable(div) {
    if (div._kcClick) return;
    div._kcClick = true;
    div.on("plotly_click", (ev) => {
      const url = ev.points && ev.points[0] && ev.points[0].customdata;
      if (url) window.open(url, "_blank", "noopener");
    });
  }

  function commitUrl(gid, ci) {
    const c = (commitsOf[gid] || [])[ci];
    return (c && c[3]) || "";
  }

  // ours last, so that its thick line is drawn over the others
  function drawOrder(names) {
    return names.filter((p) => p !== OURS).concat(names.filter((p) => p === OURS));
  }

  function lineOf(p, color) {
    const ours = p === OURS;
    return {line: {color, width: ours ? 3.5 : 1.5}, marker: {size: ours ? 9 : 6, color}};
  }

  function shapeFigure(part, metric, gid, s) {
    const page = pageData();
    const by = {};
    for (const r of part.objects) (by[r.provider] = by[r.provider] || {})[r.shape] = r;
    const providers = (page.providers || []).filter((p) => p in by);
    const traces = [];
    for (const p of drawOrder(providers)) {
      const rows = part.shapes.map((sh) => by[p][sh]);
      const y = rows.map((r) => (!r ? null : metric === "rate" ? r.rate : none(r.peak_mem_bytes) ? null : r.peak_mem_bytes / 2 ** 20));
      if (y.every(none)) continue;
      const text = rows.map((r, i) => !r ? "" : esc(part.shapes[i]) + ": " + (metric === "memory" ? `${sig(y[i], 4)} MiB`
        : r.status !== "ok" ? esc(r.status)
          : `${sig(r.rate, 4)} ${esc(part.unit)}, ${ms(r.median_ms)} ms` + (none(r.frac_of_peak) ? "" : `, ${pct(r.frac_of_peak)} of ceiling`)));
      traces.push(Object.assign({type: "scatter", mode: "lines+markers", name: esc(p), meta: p, x: part.ticks, y, text,
        customdata: rows.map((r) => (r ? commitUrl(gid, r.ci) : "")), visible: providerOn(s, p),
        hovertemplate: "%{text}<extra>" + esc(p) + "</extra>"}, lineOf(p, page.colors[p] || "#777")));
    }
    if (!traces.length) return null;
    if (metric === "rate" && part.ceiling) {
      traces.push({type: "scatter", mode: "lines", name: `measured ${part.ceiling_name} (${rate(part.ceiling)} ${esc(part.unit)})`,
                   x: part.ticks, y: part.ticks.map(() => part.ceiling), hoverinfo: "skip",
                   line: {color: "#444", dash: "dash", width: 1.5}});
    }
    const log = metric === "rate" ? part.ylog : part.memlog;
    const yTitle = metric === "rate" ? `${esc(part.unit)} (higher is faster)` : "peak memory per call (MiB)";
    return {data: traces, layout: {
      height: 340, margin: {l: 64, r: 10, t: 10, b: 10}, hovermode: "closest",
      xaxis: {title: {text: esc(part.xtitle).replace(/\n/g, "<br>")}, type: "category", automargin: true},
      yaxis: {title: {text: yTitle + (log ? ", log scale" : "")}, type: log ? "log" : "linear", automargin: true}}};
  }

  function drawShape(div, s) {
    const section = div.closest("section.part");
    const part = section && section._part;
    if (!part) {
      if (section) showPart(section);
      return;
    }
    const key = s.provider || "";
    if (div._kcKey === key) return;
    div._kcKey = key;
    const fig = shapeFigure(part, div.dataset.kind, section.closest("section.group").dataset.gpu, s);
    if (!fig) {
      div.closest("figure").hidden = true; // nothing recorded (peak memory on old rows)
      return;
    }
    Plotly.react(div, fig.data, fit(fig.layout, div, fig.data), PLOT_CONFIG).then(() => clickable(div));
  }

  function rgba(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${alpha})`;
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
    const order = drawOrder(providers.filter((p) => p in series).concat(Object.keys(series).filter((p) => !providers.includes(p))));
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
        const look = lineOf(p, color);
        look.line.dash = n % 2 ? "dot" : "solid";
        look.marker.size -= 1;
        look.marker.symbol = n % 2 ? "circle-open" : "circle";
        data.push(Object.assign({type: "scatter", x, y: pick(t.med), mode: x.length > 1 ? "lines+markers" : "markers", name: esc(p),
                   legendgroup: p, showlegend: n === 0, text, customdata: x.map((c) => (commits[c] || [])[3] || ""),
                   hovertemplate: "%{text}<extra>" + esc(p) + "</extra>"}, look));
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
                 customdata: fl.map((f) => (commits[f.after_ci] || [])[3] || ""),
                 text: fl.map((f) => esc(`${f.provider}: ${f.label}, ${(100 * f.change).toFixed(1)}%` + (f.what ? ` (${f.what})` : ""))),
                 hovertemplate: "%{text}<extra></extra>"});
    }
    const n = commits.length;
    const ticks = [];
    const step = Math.max(1, Math.ceil(n / 6));
    for (let i = 0; i < n; i += step) ticks.push(i);
    if (n && ticks[ticks.length - 1] !== n - 1) ticks.push(n - 1);
    const yTitle = mode === "first" ? "time / first commit's time" : mode.startsWith("vs:") ? `time / ${esc(mode.slice(3))}'s time` : "median time (ms)";
    // no legend: the part's key above the charts names the colours, the same on every chart of the site
    const layout = {
      height: 260, margin: {l: 60, r: 10, t: 10, b: 10}, showlegend: false,
      xaxis: {title: {text: "commit (oldest → newest)", font: {size: 11}}, tickmode: "array", tickvals: ticks,
              ticktext: ticks.map((i) => esc(commits[i][0])), tickfont: {size: 9}, automargin: true,
              range: [-0.5, Math.max(n - 0.5, 0.5)], zeroline: false},
      yaxis: {title: {text: yTitle, font: {size: 11}}, type: mode === "log" ? "log" : "linear", automargin: true},
      hovermode: "closest", shapes,
    };
    return {data, layout};
  }

  function fmt(v) {
    return v === null || v === undefined ? "—" : Number(v).toPrecision(4);
  }

  // One trend chart, from its box's data file (loaded once for all the box's charts).
  function drawTrend(div, s) {
    const key = (s.provider || "") + "|" + yMode(s);
    if (div._kcKey === key) return;
    div._kcKey = key;
    const box = div.closest(".trends");
    Promise.all([load(box.dataset.file), commitsReady()]).then(([trend]) => {
      const view = Object.assign({}, pageData(), {commitsOf: commitsOf[box.dataset.gid] || []});
      const fig = trendFigure(trend.series, div.dataset.shape, s, view, trend.marks);
      return Plotly.react(div, fig.data, fit(fig.layout, div, fig.data), PLOT_CONFIG);
    }).then(() => clickable(div)).catch((err) => {
      div._kcKey = undefined;
      div.textContent = err.message;
      console.error(err);
    });
  }

  const chartEls = [...document.querySelectorAll(".shape-chart, .trend")];
  let current = readState();

  function refresh(chart) {
    if (!window.Plotly || !visible(chart)) return;
    if (chart.classList.contains("shape-chart")) drawShape(chart, current);
    else drawTrend(chart, current);
  }

  // Parts, flag tables and charts load and draw when they come near the viewport, each on its own:
  // a kernel page can hold hundreds of charts, and a part's trends dozens.
  const observer = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (!e.isIntersecting) continue;
      const t = e.target;
      t._kcSeen = true;
      if (t.matches("section.part")) showPart(t);
      else if (t.matches("[data-flags]")) showFlags(t);
      else refresh(t);
    }
  }, {rootMargin: "600px 0px"}) : null;

  function drawCharts() {
    for (const chart of chartEls) {
      if (!observer || chart._kcSeen) refresh(chart);
    }
  }

  function focusTarget(s) {
    let target = null;
    if (s.shape) {
      const trend = [...document.querySelectorAll(".trend")].find((d) => d.dataset.shape === s.shape && visible(d));
      target = trend && trend.closest(".trend-box");
    } else if (s.flag) {
      const host = document.querySelector("[data-flags]");
      if (!host) return;
      const fold = host.closest("details");
      if (fold) fold.open = true;
      showFlags(host).then((t) => {
        let row = t.reveal((r) => r.id === s.flag);
        if (!row && t.spec.rows.some((r) => r.id === s.flag)) {
          update({providers: [], flag: s.flag}); // a filter hid what the link asks for
          row = t.reveal((r) => r.id === s.flag);
        }
        if (row) {
          row.classList.add("focus");
          row.scrollIntoView({block: "center"});
        }
      });
      return;
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
      // By default the group with the longest history, its newest commit as B and, once the data
      // is loaded, as A the newest commit before it that shares a series with it (runCompare).
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
    const t = pageData().threshold || 0;
    const cls = "num" + (change > t ? " bad" : change < -t ? " good" : "");
    const td = cellEl("td", `${change >= 0 ? "+" : ""}${(100 * change).toFixed(1)}%`, cls);
    td.dataset.v = String(change);
    return td;
  }

  // The newest commit before index ib that measured a series B measured too (-1: none), among the
  // loaded series of `entries`: the default A when B's predecessor measured other kernels only.
  function sharedBefore(entries, fileOf, s, ib) {
    let best = -1;
    for (const e of entries) {
      const series = loaded[fileOf.get(e)].series;
      for (const p of Object.keys(series)) {
        if (!providerOn(s, p)) continue;
        for (const [ci] of Object.values(series[p])) {
          if (ci.includes(ib)) for (const c of ci) if (c < ib && c > best) best = c;
        }
      }
    }
    return best;
  }

  // runCompare's file of entry e: its recent points where both commits (B alone while A is not
  // chosen) are among them, else the whole trend file (`whole`: always)
  function compareFile(e, ia, ib, autoA, whole) {
    return !whole && e.r && ib >= e.rs && (autoA || ia >= e.rs) ? e.r : e.f;
  }

  function runCompare(page, s, autoA, whole) {
    const status = document.getElementById("kc-compare-status");
    const summary = document.getElementById("kc-compare-summary");
    const detail = document.getElementById("kc-compare-detail");
    summary.textContent = "";
    detail.textContent = "";
    const wanted = (e) => (!s.mode || e.m === s.mode) && (!s.dtype || e.d === s.dtype);
    const groupsWanted = s.cmp === "commits" ? [s.g] : [s.a, s.b];
    let entries = page.manifest.filter((e) => groupsWanted.includes(e.g) && wanted(e));
    if (!entries.length) {
      status.textContent = "Nothing to compare with these choices.";
      return;
    }
    const fileOf = new Map(entries.map((e) => [e, e.f]));  // across GPUs: each series' last point, however old
    if (s.cmp === "commits") {  // only the files with points at B (and at A, once chosen)
      const commits = page.groups.find((x) => x.id === s.g).commits;
      const ib = commits.findIndex((c) => c[0] === s.b);
      const ia = commits.findIndex((c) => c[0] === s.a);
      entries = entries.filter((e) => e.c.includes(ib) && (autoA || e.c.includes(ia)));
      if (!entries.length) {
        renderCompare([], s, page);
        return;
      }
      for (const e of entries) fileOf.set(e, compareFile(e, ia, ib, autoA, whole));
    }
    status.textContent = "loading…";
    const token = (runCompare.token = (runCompare.token || 0) + 1);
    Promise.all(entries.map((e) => load(fileOf.get(e)))).then(() => {
      if (token !== runCompare.token) return;
      const rows = [];
      if (s.cmp === "commits") {
        const commits = page.groups.find((x) => x.id === s.g).commits;
        const ib = commits.findIndex((c) => c[0] === s.b);
        if (autoA) {  // A not chosen: the newest commit before B that shares a series with it
          const shared = sharedBefore(entries, fileOf, s, ib);
          if (shared < 0 && !whole && entries.some((e) => fileOf.get(e) !== e.f)) {
            runCompare(page, s, autoA, true);  // none among the recent points: look in the whole files
            return;
          }
          if (shared >= 0 && commits[shared][0] !== s.a) {
            s.a = cmpForm.elements.namedItem("a").value = commits[shared][0];
            writeState(s);
          }
        }
        const ia = commits.findIndex((c) => c[0] === s.a);
        for (const e of entries) {
          const series = loaded[fileOf.get(e)].series;
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
          const series = loaded[fileOf.get(e)].series;
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

  // The verdict engine's steps between the two commits (as the regressions page and `kcollect
  // compare` find them), by series: [{dir: +1 slower from A to B / -1 faster, ours, at: commit}].
  function stepsBetween(page, s) {
    const out = new Map();
    if (s.cmp !== "commits" || !page.steps) return out;
    const commits = page.groups.find((x) => x.id === s.g).commits;
    const ia = commits.findIndex((c) => c[0] === s.a);
    const ib = commits.findIndex((c) => c[0] === s.b);
    const lo = Math.min(ia, ib);
    const hi = Math.max(ia, ib);
    const sign = ia <= ib ? 1 : -1;  // B older than A: a step up is a step down from A to B
    for (const [si, before, after, dir, ours] of page.steps.steps) {
      const [g, k, m, d, p, shape] = page.steps.series[si];
      if (g !== s.g || before < lo || after > hi) continue;
      const key = JSON.stringify([k, m, d, p, shape]);
      (out.get(key) || out.set(key, []).get(key)).push({dir: dir * sign, ours, at: commits[after][0]});
    }
    return out;
  }

  function verdictText(steps) {
    if (!steps || !steps.length) return "";
    const net = steps.reduce((x, st) => x + st.dir, 0);
    const what = steps.map((st) => `${st.dir > 0 ? "slower" : "faster"} at ${st.at}`).join(", ");
    return net > 0 ? `slower (${what})` : net < 0 ? `faster (${what})` : `stepped and back (${what})`;
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
    const t = page.threshold;
    const worse = like.filter((r) => r.b / r.a > 1 + t).length;
    const better = like.filter((r) => r.b / r.a < 1 / (1 + t)).length;
    const other = rows.length - like.length;
    const raw = `${worse} slower and ${better} faster by more than ${pct(t)}`;
    let text = `A = ${names[0]}, B = ${names[1]}: ${rows.length} series. `;
    if (s.cmp === "commits") {
      // the engine's verdicts lead; the raw moves are two medians apart, most of them inside their noise
      const steps = stepsBetween(page, s);
      for (const r of rows) r.steps = steps.get(JSON.stringify([r.e.k, r.e.m, r.e.d, r.p, r.shape]));
      const net = (r) => (r.steps || []).reduce((x, st) => x + st.dir, 0);
      const count = (f) => [rows.filter((r) => f(net(r)) && r.steps.some((st) => st.ours)).length,
                            rows.filter((r) => f(net(r))).length];
      const [slowOurs, slow] = count((n) => n > 0);
      const [fastOurs, fast] = count((n) => n < 0);
      text += `The verdict engine (as on the regressions page and in kcollect compare) finds ${slow} slower ` +
        `(${slowOurs} of our code) and ${fast} faster (${fastOurs} of ours) between them. Raw moves: ${raw}, ` +
        "most of them within their series' noise";
    } else {
      text += `Raw moves of the latest medians: ${raw} (not verdicts: two GPUs differ by design)`;
    }
    status.textContent = text + (other ? `; ${other} changed timing method or environment in between ` +
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
      changeCell(r.b / r.a), cellEl("td", verdictText(r.steps)),
      cellEl("td", r.same ? "" : "timing method or environment changed: not a kernel change")]);
    detail.appendChild(cellEl("h2", "Every series, largest change first"));
    detail.appendChild(table("Every series", "compare-detail",
                             ["kernel", "mode", "dtype", "provider", "shape", "A ms", "B ms", "change", "verdict", "note"],
                             detRows));
  }

  function compareUpdate(s) {
    const page = pageData();
    const autoA = s.a === undefined;
    Object.assign(s, compareOptions(page, s));
    writeState(s);
    runCompare(page, s, autoA);
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
  // The header's menus (kernels, filters): one open at a time, closed by Escape or a click elsewhere.
  const drops = [...document.querySelectorAll("details.drop")];
  drops.forEach((d) => d.addEventListener("toggle", () => {
    if (d.open) drops.forEach((o) => o !== d && (o.open = false));
  }));
  document.addEventListener("click", (ev) => {
    drops.forEach((d) => d.open && !d.contains(ev.target) && (d.open = false));
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key !== "Escape") return;
    const open = drops.find((d) => d.open);
    if (open) {
      open.open = false;
      open.querySelector("summary").focus();
    }
  });
  // Folded content draws when it is unfolded: its charts, its tables.
  document.querySelectorAll("main details").forEach((d) => d.addEventListener("toggle", () => {
    if (!d.open) return;
    d.querySelectorAll("[data-flags]").forEach(showFlags);
    drawCharts();
  }));

  document.querySelectorAll("table.data").forEach(enhanceTable);
  update(current);
  if (observer) {
    chartEls.forEach((c) => observer.observe(c));
    document.querySelectorAll("section.part, [data-flags]").forEach((x) => {
      if (!x.closest("details:not([open])")) observer.observe(x);
    });
  } else {
    document.querySelectorAll("section.part").forEach(showPart);
    document.querySelectorAll("[data-flags]").forEach(showFlags);
  }
  focusTarget(current);
})();
