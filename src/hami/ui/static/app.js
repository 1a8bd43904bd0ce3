// hami UI: renders the /api/v1 documents (or an embedded snapshot from `hami simulate --output html`).
// Vanilla JS, no dependency. Every text from the API goes through textContent, never parsed as HTML.
"use strict";
(function () {
  const API = ["nodes", "pods", "pending", "quotas"];
  const $ = (id) => document.getElementById(id);
  const snapshotEl = document.getElementById("hami-snapshot");
  const snapshot = snapshotEl ? JSON.parse(snapshotEl.textContent) : null;
  let docs = null;
  let timer = null;
  let loading = false; // one refresh at a time: a slow answer never piles up requests
  const GRID_PAGE = 12; // node cards per page of the grid: ~100 device rows at 8 GPUs a node (1000 nodes: 8000)
  const PAGE_SIZE = 100; // rows per page of a table (docs/ui.md "Tables")
  // Signing in (docs/ui.md): the Kubernetes token lives in this tab's sessionStorage only (never
  // localStorage or a cookie) and is sent as "Authorization: Bearer" to this server's /api/v1.
  const TOKEN_KEY = "hami.ui.token";
  const SECTION = { nodes: "nodes", pods: "pods", pending: "pending", quotas: "quotas", history: "history" };
  let memoryToken = ""; // where sessionStorage is unavailable (a sandboxed frame)
  function token() {
    try { return window.sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return memoryToken; }
  }
  function keepToken(value) {
    memoryToken = value;
    try {
      if (value) window.sessionStorage.setItem(TOKEN_KEY, value); else window.sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* memory only */ }
  }
  let needSignIn = false;

  // ------------------------------------------------------------------ languages (docs/ui.md)
  // Every text of the page is in the catalogue (static/messages.*.json, served in front of this file
  // or inlined in a snapshot): English and Chinese, chosen from navigator.languages unless the
  // switch chose one in this tab. Texts from the API (names, reasons, phases) are shown as they are.
  const CATALOGUE = window.HAMI_MESSAGES || { en: {} };
  const LANG_KEY = "hami.ui.lang";
  function pickLanguage() {
    try {
      const kept = window.sessionStorage.getItem(LANG_KEY);
      if (kept && CATALOGUE[kept]) return kept;
    } catch (e) { /* no storage: the browser's languages */ }
    for (const wanted of navigator.languages || [navigator.language || ""]) {
      const base = String(wanted).toLowerCase().split("-")[0];
      if (CATALOGUE[base]) return base;
    }
    return "en";
  }
  let lang = pickLanguage();
  let messages = CATALOGUE[lang] || {};
  let numbers = new Intl.NumberFormat(lang, { maximumFractionDigits: 1, minimumFractionDigits: 1, useGrouping: false });
  // a template split once into [text, name, text, ...] (8000 device rows format ~100k messages)
  let parsed = new Map();
  function t(key, params) {
    let parts = parsed.get(key);
    if (parts === undefined) {
      let text = messages[key];
      if (text === undefined) text = (CATALOGUE.en || {})[key];
      parts = text === undefined ? [key] : text.split(/\{(\w+)\}/);
      parsed.set(key, parts);
    }
    if (parts.length === 1) return parts[0];
    let out = parts[0];
    for (let i = 1; i < parts.length; i += 2) {
      const name = parts[i];
      out += (params && name in params ? params[name] : "{" + name + "}") + parts[i + 1];
    }
    return out;
  }
  function plural(key, n, params) {
    const one = key + ".one";
    return t(n === 1 && one in messages ? one : key + ".other", Object.assign({ n }, params));
  }
  // a template whose {slots} are elements (kept, with their ids): "{devices} devices on {nodes} nodes"
  function fillSlots(node, template) {
    const slots = {};
    for (const child of node.querySelectorAll("[data-slot]")) slots[child.dataset.slot] = child;
    const parts = template.split(/\{(\w+)\}/);
    node.replaceChildren(...parts.map((part, i) => (i % 2 ? slots[part] || "" : part)));
  }
  function applyLanguage() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : lang;
    for (const node of document.querySelectorAll("[data-i18n]")) {
      const template = t(node.dataset.i18n, node.dataset.i18nN === undefined ? null : { n: node.dataset.i18nN });
      if (node.querySelector("[data-slot]")) fillSlots(node, template); else node.textContent = template;
    }
    for (const node of document.querySelectorAll("[data-i18n-aria-label]")) {
      node.setAttribute("aria-label", t(node.dataset.i18nAriaLabel));
    }
    const select = $("lang");
    select.replaceChildren(...Object.keys(CATALOGUE).map((code) =>
      el("option", { value: code, lang: code, text: CATALOGUE[code]["meta.language"] || code })));
    select.value = lang;
  }
  function setLanguage(code) {
    if (!CATALOGUE[code]) return;
    lang = code;
    messages = CATALOGUE[code];
    parsed = new Map();
    numbers = new Intl.NumberFormat(lang, { maximumFractionDigits: 1, minimumFractionDigits: 1, useGrouping: false });
    try { window.sessionStorage.setItem(LANG_KEY, code); } catch (e) { /* this page only */ }
    applyLanguage();
    if (snapshot) $("source-label").textContent = t("source.snapshot");
    render();
    if (historyDoc) drawHistory();
    if (docs && !snapshot) showUpdated();
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k === "width") node.style.width = v + "%"; // CSSOM, allowed by the CSP (a style attribute is not)
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  // Units per vendor (docs/ui.md): memory in MiB / GiB, cores in the vendor's unit
  function mib(v) {
    if (v === null || v === undefined) return "–";
    return v >= 1024 ? t("unit.GiB", { n: numbers.format(v / 1024) }) : t("unit.MiB", { n: v });
  }
  function cores(v, unit) {
    if (v === null || v === undefined) return "–";
    const key = "unit." + unit;
    return key in messages || key in (CATALOGUE.en || {}) ? t(key, { n: v }) : t("unit.other", { n: v, unit });
  }
  function pct(a, b) { return b > 0 ? Math.min(100, Math.round((100 * a) / b)) : 0; }

  function bar(label, allocated, total, used, fmt) {
    const p = pct(allocated, total);
    const u = used === null || used === undefined ? null : pct(used, total);
    const text = fmt(allocated) + " / " + fmt(total) + (u === null ? "" : t("bar.used", { used: fmt(used) }));
    return el("div", {},
      el("div", { class: "bar", role: "meter", "aria-label": label + ": " + text, "aria-valuemin": 0,
                  "aria-valuemax": total, "aria-valuenow": allocated, title: label + " " + text },
        el("span", { class: "alloc", width: p }),
        u === null ? null : el("span", { class: "used", width: u })),
      el("span", { class: "bar-label", text: text }));
  }

  function filters() {
    return { namespace: $("filter-namespace").value, node: $("filter-node").value, model: $("filter-model").value };
  }

  function fillSelect(select, values) {
    const keep = select.value;
    const wanted = ["", ...[...new Set(values)].sort()];
    const have = [...select.options].map((o) => o.value);
    if (wanted.join("\n") !== have.join("\n") || select.options[0].textContent !== t("filter.all")) {
      select.replaceChildren(...wanted.map((v) => el("option", { value: v, text: v || t("filter.all") })));
    }
    select.value = wanted.includes(keep) ? keep : "";
  }

  // ------------------------------------------------------------------ tables: search, sort, pages
  // Every table (and the node grid) keeps the rows it was given and draws one page of those that
  // match its search box, in the order of the header clicked last. Its state survives a refresh.
  const tables = new Map();
  function compare(a, b) {
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b), lang, { numeric: true });
  }
  function tableState(box) {
    let s = tables.get(box.id);
    if (s && s.box === box) return s;
    s = { box, q: "", col: -1, dir: 1, page: 0, rows: [], spec: null };
    const search = el("input", { type: "search", class: "table-search", "data-table": box.id, autocomplete: "off", spellcheck: "false" });
    search.addEventListener("input", () => { s.q = search.value.trim().toLowerCase(); s.page = 0; drawTable(s); });
    const prev = el("button", { type: "button", class: "page-prev" });
    const next = el("button", { type: "button", class: "page-next" });
    prev.addEventListener("click", () => { s.page -= 1; drawTable(s); });
    next.addEventListener("click", () => { s.page += 1; drawTable(s); });
    s.search = search; s.prev = prev; s.next = next;
    s.label = el("span", {});
    s.count = el("span", { class: "table-count muted" });
    s.where = el("span", { class: "page-where muted" });
    s.pager = el("div", { class: "pager", "data-table": box.id }, prev, s.where, next);
    box.before(el("div", { class: "table-tools", "data-table": box.id }, el("label", {}, s.label, " ", search), s.count));
    box.after(s.pager);
    for (const button of box.tHead ? box.tHead.querySelectorAll("button.sort") : []) {
      button.addEventListener("click", () => {
        const col = Number(button.dataset.col);
        s.dir = s.col === col ? -s.dir : 1;
        s.col = col;
        s.page = 0;
        drawTable(s);
      });
    }
    tables.set(box.id, s);
    return s;
  }
  // spec: text(row) what the search matches, keys[col](row) the sort value of each column,
  // draw(row) its element, empty the text when nothing matches, size rows per page
  function fillTable(box, spec, rows) {
    const s = tableState(box);
    s.spec = spec;
    s.rows = rows;
    drawTable(s);
  }
  function drawTable(s) {
    const spec = s.spec;
    let rows = s.q ? s.rows.filter((r) => spec.text(r).toLowerCase().includes(s.q)) : s.rows;
    const key = s.col >= 0 && spec.keys ? spec.keys[s.col] : null;
    if (key) rows = rows.map((r) => [key(r), r]).sort((a, b) => s.dir * compare(a[0], b[0])).map((pair) => pair[1]);
    const size = spec.size || PAGE_SIZE;
    const pages = Math.max(1, Math.ceil(rows.length / size));
    s.page = Math.min(Math.max(0, s.page), pages - 1);
    const shown = rows.slice(s.page * size, (s.page + 1) * size).map(spec.draw);
    const body = s.box.tBodies ? s.box.tBodies[0] : s.box;
    const columns = s.box.tHead ? s.box.tHead.rows[0].cells.length : 1;
    body.replaceChildren(...(shown.length ? shown : [s.box.tBodies
      ? el("tr", {}, el("td", { colspan: columns, class: "muted", text: spec.empty }))
      : el("p", { class: "muted", text: spec.empty })]));
    s.label.textContent = t("table.search");
    s.count.textContent = s.q ? t("table.matching", { shown: rows.length, total: s.rows.length }) : t("table.count", { total: s.rows.length });
    s.where.textContent = t("table.page", { page: s.page + 1, pages, first: rows.length ? s.page * size + 1 : 0,
                                            last: Math.min(rows.length, (s.page + 1) * size), total: rows.length });
    s.prev.textContent = t("table.prev");
    s.next.textContent = t("table.next");
    s.prev.disabled = s.page === 0;
    s.next.disabled = s.page >= pages - 1;
    s.pager.hidden = pages <= 1;
    s.box.dataset.rows = String(rows.length);
    s.box.dataset.page = String(s.page + 1);
    for (const th of s.box.tHead ? s.box.tHead.rows[0].cells : []) {
      const b = th.querySelector("button.sort");
      th.setAttribute("aria-sort", b && Number(b.dataset.col) === s.col ? (s.dir > 0 ? "ascending" : "descending") : "none");
    }
  }

  // ------------------------------------------------------------------ links between the pages
  // Hash routes (they work under a path prefix and in a snapshot file): #/node/NAME, #/gpu/UUID,
  // #/pod/NAMESPACE/NAME; anything else is the overview.
  function href(kind, ...parts) { return "#/" + kind + "/" + parts.map(encodeURIComponent).join("/"); }
  function link(kind, parts, text, attrs) { return el("a", Object.assign({ href: href(kind, ...parts), text }, attrs || {})); }
  function route() {
    const m = /^#\/(node|gpu|pod)\/(.+)$/.exec(location.hash);
    if (!m) return null;
    let parts;
    try { parts = m[2].split("/").map(decodeURIComponent); } catch (e) { return null; }
    if (parts.some((x) => !x)) return null;
    if (m[1] === "pod") return parts.length === 2 ? { kind: "pod", namespace: parts[0], name: parts[1] } : null;
    return parts.length === 1 ? { kind: m[1], name: parts[0] } : null;
  }
  const pct100 = (a, b) => (b > 0 ? a / b : 0);

  // ------------------------------------------------------------------ summary
  function renderSummary(nodes, f) {
    const groups = new Map();
    let count = 0;
    for (const n of nodes) {
      if (f.node && n.name !== f.node) continue;
      for (const d of n.devices) {
        if (f.model && d.model !== f.model) continue;
        count += 1;
        const key = d.vendor + "\u0000" + d.model;
        const g = groups.get(key) || { vendor: d.vendor, model: d.model, devices: 0, inUse: 0, memA: 0, memT: 0,
                                       memU: 0, memLive: 0, coreA: 0, coreT: 0, unit: d.cores.unit };
        g.devices += 1;
        g.inUse += d.slots.allocated > 0 ? 1 : 0;
        g.memA += d.memoryMiB.allocated; g.memT += d.memoryMiB.total;
        if (d.usage.memoryUsedMiB !== null) { g.memU += d.usage.memoryUsedMiB; g.memLive += 1; }
        g.coreA += d.cores.allocated; g.coreT += d.cores.total;
        groups.set(key, g);
      }
    }
    const gpuCount = $("gpu-count");
    gpuCount.textContent = String(count);
    gpuCount.dataset.count = String(count);
    const rows = [...groups.values()].sort((a, b) => (a.vendor + a.model).localeCompare(b.vendor + b.model));
    fillTable($("summary-table"), { text: (g) => g.vendor + " " + g.model, empty: t("nodes.none"),
      keys: [(g) => g.vendor, (g) => g.model, (g) => g.devices, (g) => g.inUse, (g) => pct100(g.memA, g.memT),
             (g) => g.memU, (g) => pct100(g.coreA, g.coreT)],
      draw: (g) => el("tr", { "data-vendor": g.vendor, "data-model": g.model },
        el("td", { text: g.vendor }), el("td", { text: g.model }), el("td", { text: g.devices }),
        el("td", { text: g.inUse }),
        el("td", {}, bar(t("bar.memoryAllocated"), g.memA, g.memT, null, mib)),
        el("td", { text: g.memLive ? t("summary.liveOn", { used: mib(g.memU), live: g.memLive, devices: g.devices }) : t("summary.noLive") }),
        el("td", {}, bar(t("bar.coresAllocated"), g.coreA, g.coreT, null, (v) => cores(v, g.unit)))) }, rows);
  }

  // ------------------------------------------------------------------ node grid
  function monitorBadge(m) {
    if (m.state === "live") return el("span", { class: "badge ok", text: t("nodes.live") });
    if (m.state === "stale") return el("span", { class: "badge warn", title: m.error || "", text: t("nodes.stale", { age: m.ageSeconds }) });
    return el("span", { class: "badge", title: m.error || "", text: t("nodes.noLive") });
  }

  function deviceFlags(d) {
    return [!d.health && el("span", { class: "badge bad", text: t("device.unhealthy") }),
            d.cordoned && el("span", { class: "badge warn", text: t("device.cordoned") }),
            d.mode !== "hami-core" && el("span", { class: "badge", text: d.mode }),
            // one short badge (the model column is narrow); the claims are in its title
            (d.frontEnd === "dra" || (d.claims || []).length > 0) && el("span", { class: "badge dra",
              title: t("device.claims", { claims: (d.claims || []).join(", ") || t("device.noClaims") }),
              text: d.frontEnd === "dra" ? "DRA" : "+DRA" }),
            d.usage.state === "stale" && el("span", { class: "badge warn", text: t("device.stale") })];
  }
  function memoryBar(d) { return bar(t("bar.memory"), d.memoryMiB.allocated, d.memoryMiB.total, d.usage.memoryUsedMiB, mib); }
  function coresBar(d) {
    return bar(t("bar.cores"), d.cores.allocated, d.cores.total, d.usage.utilizationPercent === null || d.cores.unit !== "percent"
      ? null : Math.round((d.usage.utilizationPercent * d.cores.total) / 100), (v) => cores(v, d.cores.unit));
  }
  function nodeBadges(n) {
    return [n.ready === false ? el("span", { class: "badge bad", text: t("nodes.notReady") }) : null,
            n.unschedulable ? el("span", { class: "badge warn", text: t("nodes.cordoned") }) : null,
            monitorBadge(n.monitor)];
  }

  function nodeCard(entry) {
    const n = entry.node;
    const rows = entry.devices.map((d) => el("div", { class: "gpu", "data-gpu-uuid": d.uuid, "data-vendor": d.vendor },
      link("gpu", [d.uuid], "#" + d.index, { class: "idx", title: d.uuid }),
      el("span", { class: "model", title: d.uuid }, d.model, " ", deviceFlags(d)),
      memoryBar(d), coresBar(d),
      el("span", { class: "bar-label", title: t("device.slots"), text: d.slots.allocated + "/" + d.slots.total })));
    return el("article", { class: "node", "data-node": n.name, "aria-label": t("nodes.aria", { name: n.name }) },
      el("h3", {}, link("node", [n.name], n.name), nodeBadges(n)), rows);
  }

  function renderNodes(nodes, f) {
    const entries = [];
    const devices = [];
    for (const n of nodes) {
      if (f.node && n.name !== f.node) continue;
      const shown = n.devices.filter((d) => !f.model || d.model === f.model);
      if (!shown.length) continue;
      entries.push({ node: n, devices: shown, text: n.name + " " + shown.map((d) => d.model + " " + d.uuid).join(" ") });
      for (const d of shown) devices.push({ node: n.name, d });
    }
    fillTable($("node-grid"), { text: (e) => e.text, empty: t("nodes.none"), size: GRID_PAGE, draw: nodeCard }, entries);
    fillTable($("gpu-table"), { text: (r) => r.node + " " + r.d.model + " " + r.d.uuid + " " + r.d.vendor, empty: t("nodes.none"),
      keys: [(r) => r.node, (r) => r.d.index, (r) => r.d.model, (r) => pct100(r.d.memoryMiB.allocated, r.d.memoryMiB.total),
             (r) => pct100(r.d.cores.allocated, r.d.cores.total), (r) => r.d.slots.allocated, (r) => (r.d.health ? 1 : 0) + (r.d.cordoned ? 0 : 2)],
      draw: gpuRow }, devices);
  }
  function gpuRow(r) {
    const d = r.d;
    return el("tr", { "data-gpu-uuid": d.uuid },
      el("td", {}, link("node", [r.node], r.node)), el("td", {}, link("gpu", [d.uuid], "#" + d.index, { title: d.uuid })),
      el("td", {}, d.model, " ", deviceFlags(d)), el("td", {}, memoryBar(d)), el("td", {}, coresBar(d)),
      el("td", { title: t("device.slots"), text: d.slots.allocated + "/" + d.slots.total }),
      el("td", { text: !d.health ? t("device.unhealthy") : d.cordoned ? t("device.cordoned") : t("device.healthy") }));
  }

  // ------------------------------------------------------------------ pods
  function grantText(c, g) {
    let text = (c.name || t("pods.claim")) + ": " + g.vendor + " #" + (g.index === null ? "?" : g.index) + " " + g.model + ", " +
      mib(g.memoryMiB) + ", " + cores(g.cores, g.coreUnit) + (g.slice ? t("pods.mig", { profile: g.slice.profile }) : "");
    if (g.usage.memoryUsedMiB !== null) {
      text += t("pods.using", { memory: mib(g.usage.memoryUsedMiB) });
      if (g.usage.utilizationPercent !== null) text += t("pods.sm", { percent: t("unit.percent", { n: g.usage.utilizationPercent }) });
      if (g.usage.state === "stale") text += t("pods.stale");
    }
    return text;
  }

  function podRow(p) {
    const grants = p.containers.flatMap((c) => c.grants.map((g) =>
      el("span", { class: "grant", "data-grant-uuid": g.uuid }, g.uuid ? link("gpu", [g.uuid], grantText(c, g)) : grantText(c, g))));
    const phase = p.phase + (p.bindPhase ? " (" + p.bindPhase + ")" : "") + (p.reserved ? t("pods.reserved") : "");
    // a DRA allocation is a ResourceClaim (kube-scheduler placed it): named, and its pods listed
    const claim = p.frontEnd === "dra" && p.claim;
    const holders = claim ? claim.reservedFor.filter((r) => r.resource === "pods").map((r) => r.name) : [];
    const head = claim ? [p.name ? link("pod", [p.namespace, p.name], p.namespace + "/" + p.name) : p.namespace + "/" + t("pods.noPod"), " ",
      el("span", { class: "badge", title: t("pods.claimTitle", { claim: claim.namespace + "/" + claim.name }) +
        (holders.length ? t("pods.reservedFor", { pods: holders.join(", ") }) : t("pods.reservedForNone")),
        text: t("pods.claimBadge", { name: claim.name }) })] : [link("pod", [p.namespace, p.name], p.namespace + "/" + p.name)];
    return el("tr", claim ? { "data-pod": p.namespace + "/" + p.name, "data-claim": claim.namespace + "/" + claim.name }
                          : { "data-pod": p.namespace + "/" + p.name },
      el("th", { scope: "row" }, ...head),
      el("td", {}, p.node ? link("node", [p.node], p.node) : ""), el("td", { text: phase }), el("td", {}, grants));
  }
  // The memory an allocation holds: a DRA claim's grants are repeated on every container using
  // the claim (each line says what that container sees) but held once (found by review, 1 Dec:
  // a pod with two containers on one 3000 MiB claim sorted as 6000 MiB).
  function podMemory(p) {
    const seen = new Set();
    let sum = 0;
    for (const c of p.containers) for (const g of c.grants) {
      const key = [g.node, g.device, g.request, g.uuid].join("\u0000");
      if (p.frontEnd === "dra" && seen.has(key)) continue;
      seen.add(key);
      sum += g.memoryMiB || 0;
    }
    return sum;
  }
  const podSpec = () => ({ text: (p) => p.namespace + "/" + p.name + " " + (p.node || "") + " " + p.phase, empty: t("pods.none"),
    keys: [(p) => p.namespace + "/" + p.name, (p) => p.node || "", (p) => p.phase, podMemory],
    draw: podRow });

  function renderPods(pods, f) {
    const shown = pods.filter((p) => (!f.namespace || p.namespace === f.namespace) && (!f.node || p.node === f.node))
      .filter((p) => !f.model || p.containers.some((c) => c.grants.some((g) => g.model === f.model)));
    fillTable($("pod-table"), podSpec(), shown);
    $("pod-count").textContent = String(shown.length);
    // pods of namespaces this identity may not list, on the same devices: totals only, no names
    const others = (docs.pods.othersOnSharedDevices || []).filter((o) => !f.node || o.node === f.node);
    $("shared-devices").replaceChildren(...others.map((o) => el("li", { "data-shared-uuid": o.uuid, text:
      plural("pods.shared", o.pods, { node: o.node, uuid: o.uuid, memory: mib(o.memoryMiB), cores: cores(o.cores, "cores") }) })));
  }

  // ------------------------------------------------------------------ pending
  function renderPending(doc, f) {
    const items = doc.items.filter((p) => !f.namespace || p.namespace === f.namespace).map((p) => {
      const asks = p.requests.map((r) => r.container + ": " + r.vendor + " ×" + r.count +
        (r.memoryMiB ? " " + mib(r.memoryMiB) : r.memoryPercent !== null ? " " + t("pending.memoryPercent", { percent: t("unit.percent", { n: r.memoryPercent }) }) : "") +
        (r.cores ? " " + cores(r.cores, "cores") : "")).join("; ");
      const nodes = p.nodes.filter((n) => !f.node || n.node === f.node);
      return el("article", { class: "pending-pod", "data-pending": p.namespace + "/" + p.name },
        el("h3", {}, link("pod", [p.namespace, p.name], p.namespace + "/" + p.name)),
        asks ? el("p", { class: "muted", text: t("pending.asks", { asks }) }) : null,
        p.error ? el("p", { class: "reason", text: p.error }) :
          el("p", { class: "reason", text: p.fitsNow ? (p.wouldChoose ? t("pending.fitsOn", { node: p.wouldChoose }) : t("pending.fitsNow")) : p.summary || t("pending.noNode") }),
        nodes.length ? verdictDetails(p, nodes) : null);
    });
    const extra = doc.truncated ? [el("p", { class: "muted", text: t("pending.truncated", { shown: doc.items.length, total: doc.total }) })] : [];
    $("pending-list").replaceChildren(...(items.length ? items.concat(extra) : [el("p", { class: "muted", text: t("pending.none") })]));
    $("pending-count").textContent = String(doc.total === undefined ? items.length : doc.total);
  }

  // The per-node list is built when opened (1000 nodes x 8 devices per pod would be drawn for nothing);
  // which pods are open survives a refresh.
  const openVerdicts = new Set();
  function verdictDetails(p, nodes) {
    const key = p.namespace + "/" + p.name;
    const details = el("details", {}, el("summary", { text: t("pending.details", { n: nodes.length }) }));
    const fill = () => { if (details.childElementCount < 2) details.append(verdictList(nodes)); };
    details.addEventListener("toggle", () => {
      if (details.open) { openVerdicts.add(key); fill(); } else openVerdicts.delete(key);
    });
    if (openVerdicts.has(key)) { details.open = true; fill(); }
    return details;
  }

  function verdictList(nodes) {
    return el("ul", {}, nodes.map((n) => el("li", { "data-node": n.node },
            n.node + ": " + (n.leftOut ? t("pending.leftOut", { why: n.leftOut }) + " " : "") + (n.fits ? t("pending.fits") : n.reason) + (n.container === null ? "" : t("pending.container", { n: n.container })),
            n.devices.length ? el("ul", {}, n.devices.map((d) => el("li", { text: t("pending.device", {
              index: d.index, model: d.model, slots: d.slots.allocated + "/" + d.slots.total,
              memory: mib(d.memoryMiB.allocated) + "/" + mib(d.memoryMiB.total),
              cores: cores(d.cores.allocated, d.cores.unit) + "/" + cores(d.cores.total, d.cores.unit), reason: d.reason }) }))) : null)));
  }

  function renderQuotas(quotas, f) {
    const rows = [];
    for (const q of quotas.filter((x) => !f.namespace || x.namespace === f.namespace)) {
      for (const r of q.resources) rows.push({ q, r });
    }
    fillTable($("quota-table"), { text: (x) => x.q.namespace + " " + x.q.name + " " + x.r.resource, empty: t("quotas.none"),
      keys: [(x) => x.q.namespace, (x) => x.q.name, (x) => x.r.resource, (x) => pct100(x.r.used, x.r.limit)],
      draw: (x) => {
        const fmt = x.r.unit === "MiB" ? mib : (v) => cores(v, x.r.unit);
        return el("tr", {}, el("td", { text: x.q.namespace }), el("td", { text: x.q.name }), el("td", { text: x.r.resource }),
          el("td", {}, bar(x.r.resource, x.r.used, x.r.limit, null, fmt)));
      } }, rows);
  }

  // ------------------------------------------------------------------ node, GPU and pod pages
  // Drawn from the same answers as the overview (each refresh redraws them); a pod's Kubernetes
  // events are fetched when its page opens and on each refresh, at most EVENTS of them.
  const EVENTS = 20;
  let detailKey = "";
  let detail = null; // the open page's elements
  let eventsDoc = null;

  function section(titleKey, table) {
    return el("section", { class: "detail-part" }, el("h3", { text: t(titleKey) }), table);
  }
  function headTable(id, keys) {
    return el("table", { id }, el("thead", {}, el("tr", {}, keys.map((k, i) => el("th", { scope: "col", "aria-sort": "none" },
      el("button", { type: "button", class: "sort", "data-col": i, text: t(k) }))))), el("tbody", {}));
  }
  function openDetail(r) {
    const key = JSON.stringify(r) + "\u0000" + lang;
    if (key === detailKey && detail) return;
    const box = $("detail");
    const first = detailKey.split("\u0000")[0] !== JSON.stringify(r);
    detailKey = key;
    detail = { title: el("h2", { id: "detail-title" }), info: el("div", { class: "detail-info" }), parts: [] };
    const back = el("a", { href: "#", id: "detail-back", text: t("detail.back") });
    if (r.kind === "node") {
      detail.devices = headTable("detail-devices", ["gpus.index", "gpus.model", "gpus.memory", "gpus.cores", "gpus.slots", "gpus.state"]);
      detail.pods = headTable("detail-pods", ["pods.pod", "pods.phase", "pods.grants"]);
      detail.parts = [section("detail.devices", detail.devices), section("detail.pods", detail.pods)];
    } else if (r.kind === "gpu") {
      detail.pods = headTable("detail-pods", ["pods.pod", "detail.container", "gpus.memory", "gpus.cores"]);
      detail.parts = [section("detail.holders", detail.pods)];
    } else {
      detail.grants = headTable("detail-grants", ["detail.container", "detail.gpu", "gpus.model", "gpus.memory", "gpus.cores"]);
      detail.reasons = el("div", { id: "detail-reasons" });
      detail.events = headTable("detail-events", ["detail.eventType", "detail.eventReason", "detail.eventMessage", "detail.eventCount", "detail.eventLast"]);
      detail.eventsNote = el("p", { id: "detail-events-note", class: "muted" });
      detail.parts = [section("detail.grants", detail.grants),
        el("div", { class: "side-by-side" }, section("detail.reasons", detail.reasons),
          el("section", { class: "detail-part", id: "detail-events-part" }, el("h3", { text: t("detail.events") }), detail.eventsNote, detail.events))];
      if (first) { eventsDoc = null; loadEvents(); }
    }
    box.replaceChildren(back, detail.title, detail.info, ...detail.parts);
    if (first) box.focus();
  }

  function notAllowed(doc) { return el("p", { class: "denied", text: t("denied", { error: doc.error || "HTTP 403" }) }); }

  function renderDetail(r) {
    openDetail(r);
    if (r.kind === "node") renderNodePage(r.name);
    else if (r.kind === "gpu") renderGpuPage(r.name);
    else renderPodPage(r.namespace, r.name);
  }

  function grantRows(filter) {
    const rows = [];
    for (const p of docs.pods.items) {
      for (const c of p.containers) for (const g of c.grants) if (filter(p, g)) rows.push({ p, c, g });
    }
    return rows;
  }

  function renderNodePage(name) {
    detail.title.textContent = t("detail.node", { name });
    const n = docs.nodes.items.find((x) => x.name === name);
    if (docs.nodes.denied) detail.info.replaceChildren(notAllowed(docs.nodes));
    else if (!n) detail.info.replaceChildren(el("p", { class: "muted", text: t("detail.nodeMissing", { name }) }));
    else detail.info.replaceChildren(el("p", {}, nodeBadges(n)));
    fillTable(detail.devices, { text: (d) => d.model + " " + d.uuid, empty: t("nodes.none"),
      keys: [(d) => d.index, (d) => d.model, (d) => pct100(d.memoryMiB.allocated, d.memoryMiB.total),
             (d) => pct100(d.cores.allocated, d.cores.total), (d) => d.slots.allocated, (d) => (d.health ? 1 : 0)],
      draw: (d) => { const row = gpuRow({ node: name, d }); row.firstChild.remove(); return row; } }, n ? n.devices : []);
    const pods = docs.pods.items.filter((p) => p.node === name);
    fillTable(detail.pods, { text: (p) => p.namespace + "/" + p.name + " " + p.phase, empty: t("pods.none"),
      keys: [(p) => p.namespace + "/" + p.name, (p) => p.phase, (p) => p.containers.length],
      draw: (p) => { const row = podRow(p); row.children[1].remove(); return row; } }, pods);
  }

  function renderGpuPage(uuid) {
    detail.title.textContent = t("detail.gpuTitle", { uuid });
    let found = null;
    for (const n of docs.nodes.items) for (const d of n.devices) if (d.uuid === uuid) found = { node: n.name, d };
    if (docs.nodes.denied && !found) detail.info.replaceChildren(notAllowed(docs.nodes));
    else if (!found) detail.info.replaceChildren(el("p", { class: "muted", text: t("detail.gpuMissing", { uuid }) }));
    else {
      const d = found.d;
      detail.info.replaceChildren(
        el("p", {}, t("detail.onNode"), " ", link("node", [found.node], found.node), " · ", d.vendor + " " + d.model + " #" + d.index, " ", deviceFlags(d)),
        el("div", { class: "detail-bars" }, memoryBar(d), coresBar(d)));
    }
    const others = (docs.pods.othersOnSharedDevices || []).filter((o) => o.uuid === uuid);
    detail.info.append(...others.map((o) => el("p", { class: "muted", text:
      plural("pods.shared", o.pods, { node: o.node, uuid: o.uuid, memory: mib(o.memoryMiB), cores: cores(o.cores, "cores") }) })));
    fillTable(detail.pods, { text: (x) => x.p.namespace + "/" + x.p.name + " " + x.c.name, empty: t("pods.none"),
      keys: [(x) => x.p.namespace + "/" + x.p.name, (x) => x.c.name || "", (x) => x.g.memoryMiB || 0, (x) => x.g.cores || 0],
      draw: (x) => el("tr", { "data-pod": x.p.namespace + "/" + x.p.name },
        el("th", { scope: "row" }, link("pod", [x.p.namespace, x.p.name], x.p.namespace + "/" + x.p.name)),
        el("td", { text: x.c.name || t("pods.claim") }), el("td", { text: mib(x.g.memoryMiB) }), el("td", { text: cores(x.g.cores, x.g.coreUnit) })) },
      grantRows((p, g) => g.uuid === uuid));
  }

  function renderPodPage(namespace, name) {
    const ref = namespace + "/" + name;
    detail.title.textContent = t("detail.pod", { name: ref });
    const p = docs.pods.items.find((x) => x.namespace === namespace && x.name === name);
    const waiting = docs.pending.items.find((x) => x.namespace === namespace && x.name === name);
    if (p) {
      const phase = p.phase + (p.bindPhase ? " (" + p.bindPhase + ")" : "");
      detail.info.replaceChildren(el("p", {}, t("detail.onNode"), " ", p.node ? link("node", [p.node], p.node) : "–", " · ", phase));
    } else if (waiting) detail.info.replaceChildren(el("p", {}, el("span", { class: "badge warn", text: t("detail.pending") })));
    else if (docs.pods.denied) detail.info.replaceChildren(notAllowed(docs.pods));
    else detail.info.replaceChildren(el("p", { class: "muted", text: t("detail.podMissing", { name: ref }) }));
    fillTable(detail.grants, { text: (x) => x.c.name + " " + x.g.model + " " + x.g.uuid, empty: t("detail.noGrants"),
      keys: [(x) => x.c.name || "", (x) => x.g.index ?? -1, (x) => x.g.model, (x) => x.g.memoryMiB || 0, (x) => x.g.cores || 0],
      draw: (x) => el("tr", { "data-grant-uuid": x.g.uuid },
        el("td", { text: x.c.name || t("pods.claim") }),
        el("td", {}, x.g.uuid ? link("gpu", [x.g.uuid], "#" + (x.g.index === null ? "?" : x.g.index) + " " + x.g.uuid) : "–"),
        el("td", { text: x.g.model }), el("td", { text: mib(x.g.memoryMiB) }), el("td", { text: cores(x.g.cores, x.g.coreUnit) })) },
      grantRows((q) => q === p));
    // our reasons beside the Kubernetes events
    detail.reasons.replaceChildren(...(waiting ? [
      el("p", { class: "reason", text: waiting.error || (waiting.fitsNow ? (waiting.wouldChoose ? t("pending.fitsOn", { node: waiting.wouldChoose })
        : t("pending.fitsNow")) : waiting.summary || t("pending.noNode")) }),
      waiting.nodes.length ? verdictDetails(waiting, waiting.nodes) : null] : [el("p", { class: "muted", text: t("detail.notPending") })]));
    drawEvents();
  }

  async function loadEvents() {
    const r = route();
    if (!r || r.kind !== "pod") return;
    if (snapshot) { eventsDoc = { items: [], error: t("detail.eventsSnapshot") }; drawEvents(); return; }
    try {
      const doc = await fetchDoc("pods/" + encodeURIComponent(r.namespace) + "/" + encodeURIComponent(r.name) + "/events",
        "limit=" + EVENTS, null);
      const now = route();
      if (!now || now.kind !== "pod" || now.namespace !== r.namespace || now.name !== r.name) return;
      eventsDoc = doc;
    } catch (err) {
      if (err.signIn) return; // the next refresh asks for a token
      eventsDoc = { items: [], error: err.message };
    }
    drawEvents();
  }

  function drawEvents() {
    if (!detail || !detail.events) return;
    const note = detail.eventsNote;
    if (!eventsDoc) { note.textContent = t("status.loading"); return; }
    note.className = eventsDoc.denied || eventsDoc.error ? "denied" : "muted";
    note.textContent = eventsDoc.denied ? t("denied", { error: eventsDoc.error }) : eventsDoc.error ? eventsDoc.error
      : eventsDoc.truncated ? t("detail.eventsTruncated", { shown: eventsDoc.items.length, total: eventsDoc.total }) : "";
    fillTable(detail.events, { text: (e) => e.type + " " + e.reason + " " + e.message, empty: t("detail.noEvents"),
      keys: [(e) => e.type, (e) => e.reason, (e) => e.message, (e) => e.count, (e) => e.lastSeen || ""],
      draw: (e) => el("tr", { "data-event-reason": e.reason, class: /^warning$/i.test(e.type) ? "warning" : null },
        el("td", { text: e.type }), el("td", { text: e.reason }), el("td", { text: e.message }), el("td", { text: e.count }),
        el("td", { text: e.lastSeen ? new Date(e.lastSeen).toLocaleString(lang) : "–" })) }, eventsDoc.items || []);
  }

  function render() {
    if (!docs) return;
    const r = route();
    $("overview").hidden = !!r;
    $("detail").hidden = !r;
    if (r) { renderDetail(r); return; }
    detailKey = "";
    detail = null;
    const nodes = docs.nodes.items;
    fillSelect($("filter-node"), nodes.map((n) => n.name));
    fillSelect($("filter-model"), nodes.flatMap((n) => n.devices.map((d) => d.model)));
    fillSelect($("filter-namespace"), docs.pods.items.map((p) => p.namespace)
      .concat(docs.pending.items.map((p) => p.namespace), docs.quotas.items.map((q) => q.namespace)));
    const f = filters();
    $("node-count").textContent = String(nodes.length);
    renderSummary(nodes, f);
    renderNodes(nodes, f);
    renderPods(docs.pods.items, f);
    renderPending(docs.pending, f);
    renderQuotas(docs.quotas.items, f);
  }

  function showDenied(name, message) {
    const section = $(SECTION[name]);
    let note = section.querySelector("p.denied");
    if (!message) { if (note) note.remove(); return; }
    if (!note) {
      note = el("p", { class: "denied", "data-denied": name });
      section.querySelector("h2").after(note);
    }
    note.textContent = t("denied", { error: message });
  }

  function showSignIn(message) {
    needSignIn = true;
    docs = null;
    $("signin").hidden = false;
    $("session").hidden = true;
    const err = $("signin-error");
    err.hidden = !message;
    err.textContent = message || "";
    $("status").classList.remove("error");
    $("status").textContent = t("status.signIn");
    for (const name of API) showDenied(name, "");
    showDenied("history", "");
    historyDoc = null;
    drawHistory();
    docs = { nodes: { items: [] }, pods: { items: [] }, pending: { items: [], total: 0 }, quotas: { items: [] } };
    render();
    docs = null;
    $("token").focus();
  }

  // A 503 with Retry-After (the server busy: too many sign-ins or event reads at once, a review
  // the API server could not answer) is waited out as the server asks, at least 1 s and at most
  // RETRY_MAX_S, RETRIES times for one document, the status line saying so; then it fails as any
  // other error. One refresh at a time (`loading`): waiting never piles up requests.
  const RETRY_MAX_S = 30;
  const RETRIES = 3;
  let waits = 0; // documents waiting out a Retry-After now

  function retryAfter(r) {
    const value = (r.headers.get("Retry-After") || "").trim();
    if (!value) return null;
    const seconds = /^\d+$/.test(value) ? Number(value) : (Date.parse(value) - Date.now()) / 1000; // seconds or an HTTP date
    if (!Number.isFinite(seconds)) return null;
    return Math.min(RETRY_MAX_S, Math.max(1, Math.ceil(seconds)));
  }

  async function waitOut(seconds) {
    const status = $("status");
    waits += 1;
    status.classList.remove("error");
    status.dataset.waiting = String(seconds);
    status.textContent = t("status.busy", { seconds });
    try {
      await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
    } finally {
      waits -= 1;
      if (!waits) {
        delete status.dataset.waiting;
        if (docs && updatedAt && !loading) showUpdated(); // an events wait after the refresh: back to "Updated"
      }
    }
  }

  async function fetchDoc(name, query, section = name) {
    const headers = { Accept: "application/json" };
    const bearer = token();
    if (bearer) headers.Authorization = "Bearer " + bearer;
    let r;
    for (let attempt = 0; ; attempt++) {
      r = await fetch("api/v1/" + name + (query ? "?" + query : ""), { headers, credentials: "omit", cache: "no-store" });
      const wait = r.status === 503 && attempt < RETRIES ? retryAfter(r) : null;
      if (wait === null) break;
      await r.body?.cancel().catch(() => {});
      await waitOut(wait);
    }
    if (r.status === 401) {
      const body = await r.json().catch(() => ({}));
      const e = new Error(body.error || t("signin.needed"));
      e.signIn = true;
      e.hadToken = !!bearer;
      throw e;
    }
    if (r.status === 403) {
      const body = await r.json().catch(() => ({}));
      if (section) showDenied(section, body.error || "HTTP 403");
      return { items: [], total: 0, denied: true, error: body.error || "HTTP 403" };
    }
    if (!r.ok) throw new Error(t("error.http", { path: "/api/v1/" + name, status: r.status }));
    if (section) showDenied(section, "");
    return r.json();
  }

  let updatedAt = null;
  function showUpdated() {
    const status = $("status");
    status.classList.remove("error");
    status.dataset.updated = updatedAt.toISOString();
    status.textContent = t("status.updated", { time: updatedAt.toLocaleTimeString(lang) }) +
      (docs.nodes.cacheSynced === false ? t("status.syncing") : "");
  }

  async function load() {
    const status = $("status");
    if (snapshot) {
      docs = snapshot;
      render();
      status.textContent = t("status.snapshot", { title: snapshot.title || "hami simulate", time: snapshot.nodes.generatedAt });
      return;
    }
    if (loading || needSignIn) return;
    loading = true;
    try {
      const answers = await Promise.all(API.map((name) => fetchDoc(name)));
      if (needSignIn) return; // signed out while the answers were on their way: show nothing of them
      docs = Object.fromEntries(API.map((name, i) => [name, answers[i]]));
      $("session").hidden = !token();
      const open = detailKey;
      render();
      loadHistory();
      if (open && open === detailKey) loadEvents(); // a page just opened fetched its events already
      updatedAt = new Date();
      showUpdated();
    } catch (err) {
      if (err.signIn) {
        if (err.hadToken) keepToken("");
        showSignIn(err.hadToken ? t("signin.rejected", { error: err.message }) : "");
        return;
      }
      status.classList.add("error");
      status.textContent = t("status.failed", { error: err.message }) + (docs ? t("status.keptPrevious") : "");
    } finally {
      loading = false;
    }
  }

  // ------------------------------------------------------------------ history (docs/ui.md "History")
  // Fetched only while its section is open: a closed one costs nothing per refresh. Drawn with
  // uPlot (static/uplot.iife.min.js, installed from npm at build time) when it is there.
  let historyDoc = null;
  let plot = null;
  let historyLoading = false;
  const HISTORY_FILTERS = { namespace: ["namespace"], gpu: ["node"], pod: ["namespace", "node"] };

  async function loadHistory() {
    if (snapshot || needSignIn || historyLoading || !$("history-details").open) return;
    historyLoading = true;
    try {
      const kind = $("history-kind").value;
      const f = filters();
      const params = new URLSearchParams({ kind, range: $("history-range").value });
      for (const name of HISTORY_FILTERS[kind]) if (f[name]) params.set(name, f[name]);
      const [doc] = await Promise.all([fetchDoc("history", params.toString()), loadChartLibrary()]);
      historyDoc = doc.denied ? null : doc;
      drawHistory();
    } catch (err) {
      if (err.signIn) {
        if (err.hadToken) keepToken("");
        showSignIn(err.hadToken ? t("signin.rejected", { error: err.message }) : "");
        return;
      }
      $("history-note").textContent = t("status.failed", { error: err.message });
    } finally {
      historyLoading = false;
    }
  }

  // uPlot is fetched the first time a chart is drawn (never on the first paint)
  let chartLibrary = null;
  function loadChartLibrary() {
    if (window.uPlot) return Promise.resolve();
    if (chartLibrary) return chartLibrary;
    const meta = document.querySelector('meta[name="hami-chart-library"]');
    if (!meta) return Promise.resolve();
    const [js, css] = meta.content.split(" ");
    document.head.append(el("link", { rel: "stylesheet", href: css }));
    chartLibrary = new Promise((resolve) => {
      const script = el("script", { src: js });
      script.addEventListener("load", resolve);
      script.addEventListener("error", resolve); // drawn without it: the note says so
      document.head.append(script);
    });
    return chartLibrary;
  }

  function seriesLabel(s) { return s.kind === "gpu" ? s.key + " (" + (s.labels.node || "") + ")" : s.key; }
  function stepText(seconds) { return t("unit.minutes", { n: Math.round(seconds / 60) }); }

  function drawHistory() {
    const select = $("history-series");
    const items = historyDoc ? historyDoc.items : [];
    const keep = select.value;
    select.replaceChildren(...items.map((s) => el("option", { value: s.key, text: seriesLabel(s) })));
    if (items.some((s) => s.key === keep)) select.value = keep;
    const chosen = items.find((s) => s.key === select.value);
    const box = $("history-chart");
    if (plot) { plot.destroy(); plot = null; }
    box.replaceChildren();
    box.dataset.points = box.dataset.usedPoints = "0";
    const note = $("history-note");
    const source = !historyDoc ? "" : historyDoc.error ? t("history.fallback", { error: historyDoc.error })
      : historyDoc.source === "prometheus" ? t("history.fromPrometheus") : "";
    if (!chosen) { note.textContent = historyDoc ? [t("history.none"), source].filter(Boolean).join(" ") : ""; return; }
    const p = chosen.points;
    const count = p.memoryAllocatedMiB.filter((v) => v !== null).length;
    box.dataset.points = String(count);
    box.dataset.usedPoints = String(p.memoryUsedMiB.filter((v) => v !== null).length);
    const notes = [t("history.points", { n: count, step: stepText(historyDoc.step) })];
    if (historyDoc.truncated) notes.push(t("history.truncated", { shown: items.length, total: historyDoc.total }));
    if (!window.uPlot) notes.push(t("history.noLibrary"));
    if (source) notes.push(source);
    note.textContent = notes.join(" ");
    if (!window.uPlot) return;
    const memory = (u, v) => mib(v === null || v === undefined ? v : Math.round(v));
    plot = new window.uPlot({
      width: Math.max(320, Math.min(1200, box.clientWidth || 800)), height: 260,
      scales: { x: { time: true } },
      series: [{ label: t("history.time") },
        { label: t("history.allocated"), stroke: "#3b6fd4", width: 2, value: memory },
        { label: t("history.used"), stroke: "#1a7f37", width: 2, value: memory }],
      axes: [{}, { size: 80, values: (u, ticks) => ticks.map((v) => memory(u, v)) }],
    }, [p.t, p.memoryAllocatedMiB, p.memoryUsedMiB], box);
  }

  function schedule() {
    if (timer) clearInterval(timer);
    timer = null;
    if (!snapshot && $("auto-refresh").checked) timer = setInterval(load, 1000 * Number($("refresh-seconds").value));
  }

  for (const id of ["filter-namespace", "filter-node", "filter-model"]) {
    $(id).addEventListener("change", () => {
      for (const table of tables.values()) table.page = 0; // other rows: from their first page
      render();
      loadHistory();
    });
  }
  window.addEventListener("hashchange", () => {
    const fromPage = !$("detail").hidden;
    render();
    if (fromPage && !route()) window.scrollTo(0, 0); // the overview from its top (not "#nodes", the skip link)
  });
  $("history-details").addEventListener("toggle", loadHistory);
  $("history-kind").addEventListener("change", loadHistory);
  $("history-range").addEventListener("change", loadHistory);
  $("history-series").addEventListener("change", drawHistory);
  $("auto-refresh").addEventListener("change", schedule);
  $("refresh-seconds").addEventListener("change", schedule);
  $("refresh-now").addEventListener("click", load);
  $("signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    $("token").value = "";
    keepToken(value);
    needSignIn = false;
    $("signin").hidden = true;
    load();
  });
  $("sign-out").addEventListener("click", () => {
    keepToken("");
    showSignIn("");
  });
  applyLanguage();
  $("lang").addEventListener("change", () => setLanguage($("lang").value));
  if (snapshot) {
    $("source-label").textContent = t("source.snapshot");
    $("history").hidden = true; // a snapshot has no past
    for (const id of ["auto-refresh", "refresh-seconds", "refresh-now"]) $(id).disabled = true;
  }
  load().then(schedule);
})();
