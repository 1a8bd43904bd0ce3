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
  const GRID_LIMIT = 48; // node cards drawn before "Show all" (a 1000-node grid is 8000 rows)
  let showAll = false;
  const POD_LIMIT = 200; // pod rows drawn before "Show all pods"
  let showAllPods = false;
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
    const rows = [...groups.values()].sort((a, b) => (a.vendor + a.model).localeCompare(b.vendor + b.model)).map((g) =>
      el("tr", { "data-vendor": g.vendor, "data-model": g.model },
        el("td", { text: g.vendor }), el("td", { text: g.model }), el("td", { text: g.devices }),
        el("td", { text: g.inUse }),
        el("td", {}, bar(t("bar.memoryAllocated"), g.memA, g.memT, null, mib)),
        el("td", { text: g.memLive ? t("summary.liveOn", { used: mib(g.memU), live: g.memLive, devices: g.devices }) : t("summary.noLive") }),
        el("td", {}, bar(t("bar.coresAllocated"), g.coreA, g.coreT, null, (v) => cores(v, g.unit)))));
    $("summary-table").tBodies[0].replaceChildren(...rows);
  }

  // ------------------------------------------------------------------ node grid
  function monitorBadge(m) {
    if (m.state === "live") return el("span", { class: "badge ok", text: t("nodes.live") });
    if (m.state === "stale") return el("span", { class: "badge warn", title: m.error || "", text: t("nodes.stale", { age: m.ageSeconds }) });
    return el("span", { class: "badge", title: m.error || "", text: t("nodes.noLive") });
  }

  function renderNodes(nodes, f) {
    const cards = [];
    let hidden = 0;
    for (const n of nodes) {
      if (f.node && n.name !== f.node) continue;
      const devices = n.devices.filter((d) => !f.model || d.model === f.model);
      if (!devices.length) continue;
      if (!showAll && cards.length >= GRID_LIMIT) { hidden += 1; continue; }
      const rows = devices.map((d) => {
        const flags = [!d.health && el("span", { class: "badge bad", text: t("device.unhealthy") }),
                       d.cordoned && el("span", { class: "badge warn", text: t("device.cordoned") }),
                       d.mode !== "hami-core" && el("span", { class: "badge", text: d.mode }),
                       // one short badge (the model column is narrow); the claims are in its title
                       (d.frontEnd === "dra" || (d.claims || []).length > 0) && el("span", { class: "badge dra",
                         title: t("device.claims", { claims: (d.claims || []).join(", ") || t("device.noClaims") }),
                         text: d.frontEnd === "dra" ? "DRA" : "+DRA" }),
                       d.usage.state === "stale" && el("span", { class: "badge warn", text: t("device.stale") })];
        return el("div", { class: "gpu", "data-gpu-uuid": d.uuid, "data-vendor": d.vendor },
          el("span", { class: "idx", text: "#" + d.index }),
          el("span", { class: "model", title: d.uuid }, d.model, " ", flags),
          bar(t("bar.memory"), d.memoryMiB.allocated, d.memoryMiB.total, d.usage.memoryUsedMiB, mib),
          bar(t("bar.cores"), d.cores.allocated, d.cores.total, d.usage.utilizationPercent === null || d.cores.unit !== "percent"
              ? null : Math.round((d.usage.utilizationPercent * d.cores.total) / 100), (v) => cores(v, d.cores.unit)),
          el("span", { class: "bar-label", title: t("device.slots"), text: d.slots.allocated + "/" + d.slots.total }));
      });
      cards.push(el("article", { class: "node", "data-node": n.name, "aria-label": t("nodes.aria", { name: n.name }) },
        el("h3", {}, n.name,
          n.ready === false ? el("span", { class: "badge bad", text: t("nodes.notReady") }) : null,
          n.unschedulable ? el("span", { class: "badge warn", text: t("nodes.cordoned") }) : null,
          monitorBadge(n.monitor)),
        rows));
    }
    if (hidden) {
      const more = el("button", { type: "button", id: "show-all-nodes",
        text: t("nodes.showAll", { total: cards.length + hidden, hidden }) });
      more.addEventListener("click", () => { showAll = true; render(); });
      cards.push(more);
    }
    $("node-grid").replaceChildren(...(cards.length ? cards : [el("p", { class: "muted", text: t("nodes.none") })]));
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

  function renderPods(pods, f) {
    const shown = pods.filter((p) => (!f.namespace || p.namespace === f.namespace) && (!f.node || p.node === f.node))
      .filter((p) => !f.model || p.containers.some((c) => c.grants.some((g) => g.model === f.model)));
    const hidden = showAllPods ? 0 : Math.max(0, shown.length - POD_LIMIT);
    const rows = shown.slice(0, shown.length - hidden).map((p) => {
      const grants = p.containers.flatMap((c) => c.grants.map((g) =>
        el("span", { class: "grant", "data-grant-uuid": g.uuid, text: grantText(c, g) })));
      const phase = p.phase + (p.bindPhase ? " (" + p.bindPhase + ")" : "") + (p.reserved ? t("pods.reserved") : "");
      // a DRA allocation is a ResourceClaim (kube-scheduler placed it): named, and its pods listed
      const claim = p.frontEnd === "dra" && p.claim;
      const holders = claim ? claim.reservedFor.filter((r) => r.resource === "pods").map((r) => r.name) : [];
      const head = claim ? [p.namespace + "/" + (p.name || t("pods.noPod")), " ",
        el("span", { class: "badge", title: t("pods.claimTitle", { claim: claim.namespace + "/" + claim.name }) +
          (holders.length ? t("pods.reservedFor", { pods: holders.join(", ") }) : t("pods.reservedForNone")),
          text: t("pods.claimBadge", { name: claim.name }) })] : [p.namespace + "/" + p.name];
      return el("tr", claim ? { "data-pod": p.namespace + "/" + p.name, "data-claim": claim.namespace + "/" + claim.name }
                            : { "data-pod": p.namespace + "/" + p.name },
        el("th", { scope: "row" }, ...head),
        el("td", { text: p.node }), el("td", { text: phase }), el("td", {}, grants));
    });
    if (hidden) {
      const more = el("button", { type: "button", id: "show-all-pods",
        text: t("pods.showAll", { total: shown.length, hidden }) });
      more.addEventListener("click", () => { showAllPods = true; render(); });
      rows.push(el("tr", {}, el("td", { colspan: 4 }, more)));
    }
    $("pod-table").tBodies[0].replaceChildren(...(rows.length ? rows :
      [el("tr", {}, el("td", { colspan: 4, class: "muted", text: t("pods.none") }))]));
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
        el("h3", { text: p.namespace + "/" + p.name }),
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
            n.node + ": " + (n.fits ? t("pending.fits") : n.reason) + (n.container === null ? "" : t("pending.container", { n: n.container })),
            n.devices.length ? el("ul", {}, n.devices.map((d) => el("li", { text: t("pending.device", {
              index: d.index, model: d.model, slots: d.slots.allocated + "/" + d.slots.total,
              memory: mib(d.memoryMiB.allocated) + "/" + mib(d.memoryMiB.total),
              cores: cores(d.cores.allocated, d.cores.unit) + "/" + cores(d.cores.total, d.cores.unit), reason: d.reason }) }))) : null)));
  }

  function renderQuotas(quotas, f) {
    const rows = [];
    for (const q of quotas.filter((x) => !f.namespace || x.namespace === f.namespace)) {
      for (const r of q.resources) {
        const fmt = r.unit === "MiB" ? mib : (v) => cores(v, r.unit);
        rows.push(el("tr", {}, el("td", { text: q.namespace }), el("td", { text: q.name }), el("td", { text: r.resource }),
          el("td", {}, bar(r.resource, r.used, r.limit, null, fmt))));
      }
    }
    $("quota-table").tBodies[0].replaceChildren(...(rows.length ? rows :
      [el("tr", {}, el("td", { colspan: 4, class: "muted", text: t("quotas.none") }))]));
  }

  function render() {
    if (!docs) return;
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

  async function fetchDoc(name, query) {
    const headers = { Accept: "application/json" };
    const bearer = token();
    if (bearer) headers.Authorization = "Bearer " + bearer;
    const r = await fetch("api/v1/" + name + (query ? "?" + query : ""), { headers, credentials: "omit", cache: "no-store" });
    if (r.status === 401) {
      const body = await r.json().catch(() => ({}));
      const e = new Error(body.error || t("signin.needed"));
      e.signIn = true;
      e.hadToken = !!bearer;
      throw e;
    }
    if (r.status === 403) {
      const body = await r.json().catch(() => ({}));
      showDenied(name, body.error || "HTTP 403");
      return { items: [], total: 0, denied: true };
    }
    if (!r.ok) throw new Error(t("error.http", { path: "/api/v1/" + name, status: r.status }));
    showDenied(name, "");
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
      render();
      loadHistory();
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
    if (!chosen) { note.textContent = historyDoc ? t("history.none") : ""; return; }
    const p = chosen.points;
    const count = p.memoryAllocatedMiB.filter((v) => v !== null).length;
    box.dataset.points = String(count);
    box.dataset.usedPoints = String(p.memoryUsedMiB.filter((v) => v !== null).length);
    const notes = [t("history.points", { n: count, step: stepText(historyDoc.step) })];
    if (historyDoc.truncated) notes.push(t("history.truncated", { shown: items.length, total: historyDoc.total }));
    if (!window.uPlot) notes.push(t("history.noLibrary"));
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
    $(id).addEventListener("change", () => { render(); loadHistory(); });
  }
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
