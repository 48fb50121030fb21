// relaybus console: a single-page application over the dlqreplay API it is
// served by (same origin, same auth). No framework, no build step, nothing
// fetched from elsewhere. Every value from the API is set as text, never as
// HTML.
"use strict";

// The API is the console's parent path: <base>/console/ → <base>.
const API = location.pathname.replace(/\/console(\/.*)?$/, "");
const STATUSES = ["PENDING", "SENT", "CONSUMED", "PARTIAL", "FAILED", "RETRYING", "EXPIRED"];
const POLL_MS = 3000;

const state = {
  who: null,          // /whoami's answer
  token: sessionStorage.getItem("relaybus-token") || "",
  live: localStorage.getItem("relaybus-live") !== "paused",
  timer: null,        // the current view's polling timer
  view: 0,            // bumps on every navigation, so late answers are dropped
};

// ---------------------------------------------------------------- helpers

// h builds an element: h("a", {href: "#/", class: "x"}, "text", child...).
function h(tag, attrs, ...children) {
  const el = tag === "svg" || tag in SVG_TAGS ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const SVG_TAGS = { g: 1, line: 1, polyline: 1, text: 1, rect: 1, circle: 1, title: 1 };

function main() { return document.getElementById("main"); }

function render(...nodes) {
  main().replaceChildren(...nodes);
}

// api calls the API; it resolves to {status, data} and never throws on an
// HTTP error (the caller shows it).
async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (state.token) headers["X-Relaybus-Token"] = state.token;
  let resp;
  try {
    resp = await fetch(API + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: "same-origin" });
  } catch (e) {
    return { status: 0, data: { code: "network", message: "the API did not answer: " + e.message } };
  }
  let data = null;
  try { data = await resp.json(); } catch (e) { data = { code: "bad_answer", message: "the API answered " + resp.status + " without JSON" }; }
  if (resp.status === 401) showAuth(data);
  return { status: resp.status, data };
}

function errorText(r) {
  const d = r.data || {};
  return (d.code ? d.code + ": " : "") + (d.message || "HTTP " + r.status);
}

function notice(text, kind) {
  return h("div", { class: "notice" + (kind === "error" ? " error" : ""), "data-testid": "notice", role: "status" }, text);
}

function badge(text, cls, testid) {
  return h("span", { class: "badge " + cls, "data-testid": testid || "badge" }, text);
}
function statusBadge(s) { return badge(s || "?", "s-" + s, "status"); }
function outcomeBadge(o) { return badge(o || "waiting", "o-" + (o || "waiting"), "outcome"); }

// fmtTime shows a time in UTC, to the second.
function fmtTime(t) {
  if (!t || t.startsWith("0001-")) return "";
  const d = new Date(t);
  if (isNaN(d)) return "";
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}
function ms(v) {
  if (v === undefined || v === null) return "–";
  return v >= 10000 ? (v / 1000).toFixed(1) + " s" : v >= 1000 ? (v / 1000).toFixed(2) + " s" : Math.round(v) + " ms";
}
function between(a, b) {
  if (!a || !b || a.startsWith("0001-") || b.startsWith("0001-")) return null;
  return Math.max(new Date(b) - new Date(a), 0);
}

// errText joins an attempt's code and message, once.
function errText(a) {
  const code = a.errorCode || "", msg = a.errorMessage || "";
  if (!msg) return code;
  return !code || msg.startsWith(code) ? msg : code + ": " + msg;
}

function eventLink(id) { return h("a", { href: "#/events/" + encodeURIComponent(id), class: "mono" }, id); }

// cloudTraceLink links a trace id to Cloud Trace's Trace Explorer
// (https://cloud.google.com/trace/docs/finding-traces) in the project the
// API names (/whoami's traceProject), when it names one.
function cloudTraceLink(traceId) {
  const project = state.who && state.who.traceProject;
  if (!project || !/^[0-9a-f]{32}$/.test(traceId)) return "";
  return h("a", { href: "https://console.cloud.google.com/traces/list" + query({ project, tid: traceId }), target: "_blank", rel: "noopener",
    class: "small", "data-testid": "cloud-trace" }, " Cloud Trace ↗");
}

// can says whether the caller's roles (/whoami's roles, their own only)
// give role on topic and consumer, as the API decides it: a role of that
// rank or higher whose scope is everything, names the topic, or names the
// consumer. An empty topic is every topic, an empty consumer every
// consumer of the topic. The API refuses what this hides anyway.
const ranks = { viewer: 1, operator: 2, admin: 3 };
function can(role, topic, consumer) {
  const who = state.who;
  if (!who || (who.readOnly && ranks[role] > ranks.viewer)) return false;
  return (who.roles || []).some((b) => ranks[b.role] >= ranks[role] && (
    (!(b.topics || []).length && !(b.consumers || []).length) ||
    (topic && (b.topics || []).includes(topic)) ||
    (consumer && (b.consumers || []).includes(consumer))));
}

// canAny says whether the caller holds role somewhere (on some topic or
// consumer, or everything): whether to offer an action whose target the
// form chooses. The API decides on the target.
function canAny(role) {
  const who = state.who;
  if (!who || (who.readOnly && ranks[role] > ranks.viewer)) return false;
  return (who.roles || []).some((b) => ranks[b.role] >= ranks[role]);
}

// showFieldErrors marks each field a 400 names (its label carries
// data-field) with the API's rule, and clears the marks of the others.
function showFieldErrors(form, r) {
  for (const el of form.querySelectorAll(".field-error")) el.remove();
  for (const el of form.querySelectorAll("label.invalid")) el.classList.remove("invalid");
  for (const f of (r && r.data && r.data.fields) || []) {
    const label = form.querySelector("label[data-field=" + CSS.escape(f.field) + "]");
    if (!label) continue;
    label.classList.add("invalid");
    label.append(h("span", { class: "field-error", "data-testid": "field-error-" + f.field }, f.rule));
  }
}

// params reads the hash's query: #/events?status=SENT → {status: "SENT"}.
function params() {
  const q = location.hash.split("?")[1] || "";
  return Object.fromEntries(new URLSearchParams(q));
}
function query(obj) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(obj)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? "?" + s : "";
}

// datetime-local (read as UTC) ↔ RFC 3339.
function toRFC3339(v) { return v ? v + (v.length === 16 ? ":00" : "") + "Z" : ""; }
function fromRFC3339(v) { return v ? v.replace(/Z$/, "").slice(0, 19) : ""; }

// confirm shows the confirmation dialog and resolves to true on OK.
function confirmAction(title, body, okText) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-body").replaceChildren(...(Array.isArray(body) ? body : [body]));
  document.getElementById("confirm-ok").textContent = okText;
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
    dlg.returnValue = "cancel";
    dlg.showModal();
  });
}

// poll runs f now and every POLL_MS while the view is current and live.
function poll(f) {
  const v = state.view;
  const tick = async () => {
    if (v !== state.view) return;
    await f();
    if (v === state.view && state.live) state.timer = setTimeout(tick, POLL_MS);
  };
  tick();
}

function liveToggle(refresh) {
  const el = h("span", { class: "live" + (state.live ? "" : " paused"), "data-testid": "live" },
    h("span", { class: "dot" }), h("span", { "data-testid": "live-state" }, state.live ? "Live" : "Paused"),
    h("button", {
      type: "button", "data-testid": "live-toggle", onclick: () => {
        state.live = !state.live;
        localStorage.setItem("relaybus-live", state.live ? "live" : "paused");
        clearTimeout(state.timer);
        el.classList.toggle("paused", !state.live);
        el.querySelector("[data-testid=live-state]").textContent = state.live ? "Live" : "Paused";
        el.querySelector("button").textContent = state.live ? "Pause" : "Resume";
        if (state.live) refresh();
      },
    }, state.live ? "Pause" : "Resume"));
  return el;
}

// ------------------------------------------------------------------ auth

function showAuth(data) {
  const banner = document.getElementById("banner");
  banner.hidden = false;
  banner.className = "banner error";
  if (data && data.auth === "token") {
    const input = h("input", { type: "password", placeholder: "DLQREPLAY_TOKEN", "aria-label": "token", "data-testid": "token-input" });
    banner.replaceChildren(h("form", {
      class: "inline-form", onsubmit: (e) => {
        e.preventDefault();
        state.token = input.value;
        sessionStorage.setItem("relaybus-token", state.token);
        location.reload();
      },
    }, "This API takes a token (X-Relaybus-Token): ", input, h("button", { type: "submit" }, "Use it")));
  } else {
    banner.textContent = "Not authenticated: " + ((data && data.message) || "") +
      ". Behind Cloud Run IAM, open the console through `gcloud run services proxy <service> --port 8080`, which adds your ID token.";
  }
}

async function loadWho() {
  const r = await api("GET", "/whoami");
  if (r.status !== 200) return;
  state.who = r.data;
  const who = document.getElementById("who");
  const roles = (r.data.roles || []).map((b) => b.role + ([...(b.topics || []), ...(b.consumers || [])].length ? " of " + [...(b.topics || []), ...(b.consumers || [])].join(", ") : ""));
  who.replaceChildren(h("span", { "data-testid": "caller" }, r.data.caller),
    ...roles.map((t) => h("span", { class: "tag", "data-testid": "role" }, t)),
    r.data.canWrite ? "" : h("span", { class: "tag warn", "data-testid": "read-only" }, "read-only"));
  document.body.classList.toggle("read-only", !r.data.canWrite);
  if (!r.data.canWrite) {
    const banner = document.getElementById("banner");
    banner.hidden = false;
    banner.className = "banner";
    banner.setAttribute("data-testid", "read-only-banner");
    banner.textContent = "Read-only: " + (r.data.why || "you may not change anything here").replace(/\.?$/, ".") + " Write actions are hidden.";
  }
}

// ---------------------------------------------------------------- router

const routes = [
  [/^#?\/?$/, viewOverview, "overview"],
  [/^#\/events\/([^/?]+)$/, viewEvent, "events"],
  [/^#\/events$/, viewEvents, "events"],
  [/^#\/traces\/([^/?]+)$/, viewTrace, "events"],
  [/^#\/deadletters\/([^/?]+)$/, viewLetter, "deadletters"],
  [/^#\/deadletters$/, viewLetters, "deadletters"],
  [/^#\/consumers$/, viewConsumers, "consumers"],
  [/^#\/catalog$/, viewCatalog, "catalog"],
  [/^#\/consumers\/([^/?]+)\/([^/?]+)\/gaps$/, viewGaps, "consumers"],
  [/^#\/consumers\/([^/?]+)\/([^/?]+)\/rebuild$/, viewRebuild, "consumers"],
  [/^#\/jobs$/, viewJobs, "jobs"],
  [/^#\/scheduled$/, viewScheduled, "scheduled"],
  [/^#\/backfills$/, viewBackfills, "backfills"],
  [/^#\/forwarders$/, viewForwarders, "forwarders"],
];

function route() {
  state.view++;
  clearTimeout(state.timer);
  const path = location.hash.split("?")[0];
  for (const [re, view, nav] of routes) {
    const m = path.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
    view(...m.slice(1).map(decodeURIComponent));
    return;
  }
  render(h("h1", {}, "Not found"), h("p", { class: "muted" }, "The console has no page at " + location.hash + "."));
}

// ----------------------------------------------------------- overview

function viewOverview() {
  const p = params();
  const windowSel = h("select", { "data-testid": "window", onchange: () => { location.hash = "#/" + query({ window: windowSel.value }); } },
    ...["1h", "24h", "168h"].map((w) => h("option", { value: w, selected: (p.window || "24h") === w }, w === "168h" ? "7 days" : w)));
  const body = h("div", { "data-testid": "overview" }, h("p", { class: "muted" }, "Loading…"));
  const updated = h("span", { class: "muted small", "data-testid": "updated" });
  const refresh = async () => {
    const v = state.view;
    const r = await api("GET", "/overview" + query({ window: p.window }));
    if (v !== state.view) return;
    if (r.status !== 200) { body.replaceChildren(notice(errorText(r), "error")); return; }
    body.replaceChildren(...overviewBody(r.data));
    updated.textContent = "updated " + fmtTime(r.data.generatedAt);
  };
  render(h("div", { class: "head" }, h("h1", {}, "Overview"), h("span", { class: "spacer" }),
    h("label", { class: "muted small" }, "events of the last ", windowSel), liveToggle(refresh), updated), body);
  poll(refresh);
}

function overviewBody(o) {
  const out = [];
  if (o.unavailable && o.unavailable.length) out.push(notice("Could not read: " + o.unavailable.join(", "), "error"));
  const counts = o.counts || {};
  out.push(h("div", { class: "cards", "data-testid": "status-counts" }, ...STATUSES.map((s) =>
    h("a", { class: "card s-" + s, href: "#/events" + query({ status: s }), "data-testid": "count-" + s },
      h("div", { class: "l" }, s), h("div", { class: "n" }, String(counts[s] || 0))))));
  out.push(h("p", { class: "muted small" }, "Events by status that occurred in the last " + o.window + "."));

  const dl = o.deadLetters;
  const dlPanel = h("div", { class: "panel", "data-testid": "dead-letter-summary" }, h("h2", {}, "Dead letters", dl ? " (" + dl.total + ")" : ""));
  if (!dl) dlPanel.append(h("p", { class: "muted" }, "unavailable"));
  else if (!dl.byTopicConsumer.length) dlPanel.append(h("p", { class: "empty" }, "No dead letters."));
  else dlPanel.append(h("table", {}, h("tr", {}, h("th", {}, "Topic"), h("th", {}, "Consumer"), h("th", { class: "num" }, "Letters")),
    ...dl.byTopicConsumer.map((x) => h("tr", {},
      h("td", {}, x.topic), h("td", {}, x.consumer || "(unknown)"),
      h("td", { class: "num" }, h("a", { href: "#/deadletters" + query({ topic: x.topic, consumer: x.consumer }) }, String(x.count)))))));

  const obPanel = h("div", { class: "panel", "data-testid": "outbox-backlog" }, h("h2", {}, "Outbox backlog"));
  const dbs = Object.keys(o.outbox || {}).sort();
  if (!dbs.length) obPanel.append(h("p", { class: "muted" }, "unavailable"));
  else obPanel.append(h("table", {}, h("tr", {}, h("th", {}, "Database"), h("th", { class: "num" }, "Pending"), h("th", { class: "num" }, "Failed")),
    ...dbs.map((d) => h("tr", {}, h("td", {}, d), h("td", { class: "num" }, String(o.outbox[d].pending)),
      h("td", { class: "num" }, String(o.outbox[d].failed))))),
  h("p", { class: "muted small" }, "Pending rows wait for the relay; failed rows gave up publishing and block their aggregate until re-pushed."));
  out.push(h("div", { class: "row" }, dlPanel, obPanel));

  const lag = o.lag;
  const lagPanel = h("div", { class: "panel", "data-testid": "lag" }, h("h2", {}, "Lag of each hop over the last hour"));
  if (!lag) lagPanel.append(h("p", { class: "muted" }, "unavailable"));
  else {
    lagPanel.append(lagChart(lag), h("table", {},
      h("tr", {}, h("th", {}, "Hop"), h("th", { class: "num" }, "Events"), h("th", { class: "num" }, "p50"), h("th", { class: "num" }, "p95"), h("th", { class: "num" }, "max")),
      ...lag.hops.map((x) => h("tr", { "data-testid": "hop" }, h("td", {}, x.hop), h("td", { class: "num" }, String(x.count)),
        h("td", { class: "num" }, x.count ? ms(x.p50Ms) : "–"), h("td", { class: "num" }, x.count ? ms(x.p95Ms) : "–"), h("td", { class: "num" }, x.count ? ms(x.maxMs) : "–"))),
      ...lag.consumers.map((x) => h("tr", { class: "muted" }, h("td", {}, "  published → " + x.hop + " commit"), h("td", { class: "num" }, String(x.count)),
        h("td", { class: "num" }, ms(x.p50Ms)), h("td", { class: "num" }, ms(x.p95Ms)), h("td", { class: "num" }, ms(x.maxMs))))),
    h("p", { class: "muted small" }, "From the newest " + lag.events + " events of the hour (consumer commits from the newest 100)." +
      (lag.missingEnqueuedAt ? " " + lag.missingEnqueuedAt + " events have no outbox commit time in the ledger: their first hop is not counted." : "")));
  }
  out.push(lagPanel);
  return out;
}

const HOP_COLORS = { "commit → published": "#2f5bd3", "published → consumer commit": "#13795b", "consumer commit → final status": "#b25e09", "commit → final status": "#7c3aed" };

// lagChart draws each hop's per-minute median over the last hour.
function lagChart(lag) {
  const W = 900, H = 240, L = 56, R = 12, T = 12, B = 26;
  const end = Date.now(), start = end - 3600e3;
  const x = (t) => L + (W - L - R) * (t - start) / (end - start);
  let maxV = 1;
  for (const p of lag.series) for (const v of Object.values(p.p50Ms)) maxV = Math.max(maxV, v);
  const y = (v) => T + (H - T - B) * (1 - v / maxV);
  const svg = h("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": "lag chart" });
  for (let i = 0; i <= 4; i++) {
    const v = maxV * i / 4;
    svg.append(h("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }), h("text", { x: L - 6, y: y(v) + 3, "text-anchor": "end" }, ms(v)));
  }
  for (let m = 0; m <= 60; m += 10) {
    const t = start + m * 60e3;
    svg.append(h("text", { x: x(t), y: H - 8, "text-anchor": "middle" }, m === 60 ? "now" : "-" + (60 - m) + "m"));
  }
  svg.append(h("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  for (const [hop, color] of Object.entries(HOP_COLORS)) {
    const pts = lag.series.filter((p) => p.p50Ms[hop] !== undefined).map((p) => [x(new Date(p.minute).getTime() + 30e3), y(p.p50Ms[hop])]);
    if (!pts.length) continue;
    svg.append(h("polyline", { points: pts.map((p) => p.join(",")).join(" "), fill: "none", stroke: color, "stroke-width": 2 }));
    for (const [px, py] of pts) svg.append(h("circle", { cx: px, cy: py, r: 2.5, fill: color }));
  }
  return h("div", { class: "chart", "data-testid": "lag-chart" }, svg,
    h("div", { class: "legend" }, ...Object.keys(HOP_COLORS).map((hop, i) => h("span", {}, h("i", { class: "c" + i }), hop + " (p50 per minute)"))));
}

// -------------------------------------------------------------- events

function viewEvents() {
  const p = params();
  const field = (name, label, attrs) => h("label", {}, label, h("input", Object.assign({ name, value: p[name] || "", "data-testid": "filter-" + name }, attrs || {})));
  const status = h("select", { name: "status", "data-testid": "filter-status" }, h("option", { value: "" }, "any"),
    ...STATUSES.map((s) => h("option", { value: s, selected: p.status === s }, s)));
  const from = h("input", { type: "datetime-local", step: 1, name: "from", value: fromRFC3339(p.from), "data-testid": "filter-from" });
  const to = h("input", { type: "datetime-local", step: 1, name: "to", value: fromRFC3339(p.to), "data-testid": "filter-to" });
  const form = h("form", {
    class: "filters panel", "data-testid": "event-filters", onsubmit: (e) => {
      e.preventDefault();
      const f = Object.fromEntries(new FormData(form));
      f.from = toRFC3339(f.from); f.to = toRFC3339(f.to);
      location.hash = "#/events" + query(f);
    },
  },
  h("label", {}, "Status", status), field("topic", "Topic", { placeholder: "shop.order.events" }), field("eventType", "Event type", { placeholder: "order.purchased" }),
  field("service", "Initiator service"), field("traceId", "Trace id"), field("aggregateId", "Aggregate id"),
  h("label", {}, "From (UTC)", from), h("label", {}, "To (UTC)", to),
  h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", "data-testid": "apply" }, "Apply"),
    h("button", { type: "button", onclick: () => { location.hash = "#/events"; } }, "Clear")));
  const list = h("div", { class: "panel", "data-testid": "events" }, h("p", { class: "muted" }, "Loading…"));
  const tokens = [];
  let token = "";
  const load = async () => {
    const v = state.view;
    const r = await api("GET", "/events" + query(Object.assign({}, p, { pageToken: token })));
    if (v !== state.view) return;
    if (r.status !== 200) { list.replaceChildren(notice(errorText(r), "error")); return; }
    list.replaceChildren(eventsTable(r.data.events), h("div", { class: "pager" },
      h("button", { type: "button", disabled: !tokens.length, "data-testid": "prev-page", onclick: () => { token = tokens.pop() || ""; refresh(); } }, "← Previous"),
      h("button", { type: "button", disabled: !r.data.nextPageToken, "data-testid": "next-page", onclick: () => { tokens.push(token); token = r.data.nextPageToken; refresh(); } }, "Next →"),
      h("span", { class: "muted small" }, r.data.events.length + " events on this page" + (token ? "" : " (first page)"))));
  };
  const refresh = () => { clearTimeout(state.timer); if (!token && state.live) poll(load); else load(); };
  render(h("div", { class: "head" }, h("h1", {}, "Events"), h("span", { class: "spacer" }), liveToggle(refresh)), form, list);
  refresh();
}

function eventsTable(events) {
  if (!events.length) return h("p", { class: "empty", "data-testid": "no-events" }, "No event matches.");
  return h("table", {}, h("tr", {}, h("th", {}, "Occurred (UTC)"), h("th", {}, "Event"), h("th", {}, "Type"), h("th", {}, "Topic"),
    h("th", {}, "Aggregate"), h("th", {}, "Status"), h("th", {}, "Consumed"), h("th", {}, "Initiator"), h("th", {}, "Trace")),
  ...events.map((e) => h("tr", { "data-testid": "event-row", "data-event-id": e.eventId },
    h("td", { class: "small" }, fmtTime(e.occurredAt)), h("td", {}, eventLink(e.eventId)), h("td", {}, e.eventType), h("td", {}, e.topic),
    h("td", {}, e.aggregateId + " v" + e.version), h("td", {}, statusBadge(e.status)),
    h("td", { "data-testid": "consumed" }, e.consumed + "/" + e.expected + " consumed"),
    h("td", {}, (e.initiator && e.initiator.service) || h("span", { class: "muted" }, e.source)),
    h("td", {}, e.traceId ? h("a", { href: "#/traces/" + encodeURIComponent(e.eventId), class: "mono small", title: e.traceId }, e.traceId.slice(0, 8) + "…") : ""))));
}

// ---------------------------------------------------------------- event

function viewEvent(id) {
  const box = h("div", { "data-testid": "event" }, h("p", { class: "muted" }, "Loading…"));
  const flash = h("div", { "data-testid": "flash" });
  const refresh = async () => {
    const v = state.view;
    const r = await api("GET", "/events/" + encodeURIComponent(id));
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    if (box.contains(document.activeElement) && document.activeElement.tagName === "SELECT") return; // not under the operator's hand
    box.replaceChildren(...eventBody(r.data, refresh, flash));
  };
  render(h("div", { class: "head" }, h("h1", {}, "Event"), h("span", { class: "mono muted" }, id), h("span", { class: "spacer" }), liveToggle(refresh)), flash, box);
  poll(refresh);
}

function eventBody(d, refresh, flash) {
  const e = d.event;
  const out = [h("div", { class: "head" }, h("h2", { class: "flat" }, e.eventType + " · " + e.aggregateId + " v" + e.version),
    statusBadge(e.status), h("span", { "data-testid": "summary" }, d.summary),
    e.traceId ? h("a", { href: "#/traces/" + encodeURIComponent(e.eventId), "data-testid": "open-trace" }, "Trace →") : "")];

  const initiator = e.initiator || {};
  const initText = [initiator.service, initiator.operation, initiator.userId && "user " + initiator.userId, initiator.clientRequestId && "request " + initiator.clientRequestId]
    .filter(Boolean).join(" · ");
  const kv = [
    ["Event id", e.eventId], ["Type", e.eventType], ["Topic", e.topic], ["Source", e.source + (e.sourceVersion ? " " + e.sourceVersion : "")], ["Aggregate", (e.aggregateType || "") + " " + e.aggregateId + " v" + e.version],
    ["Occurred", fmtTime(e.occurredAt)], ["Schema", e.schemaVersion],
    ["Change", changeOf(e) ? h("span", {}, h("span", { class: "mono" }, changeOf(e)), " · published side by side in several schema versions; ",
      h("a", { href: "#/traces/" + encodeURIComponent(e.eventId) }, "the trace"), " lists them all") : undefined], ["Payload type", e.payloadType + " (" + e.payloadSize + " bytes)"],
    ["Initiator", h("span", {}, initText || "–", e.initiatorDerivedFrom ? h("span", { class: "tag warn" }, "filled from " + e.initiatorDerivedFrom.join(", ")) : "")],
    ["Trace", e.traceId ? h("span", {}, h("a", { href: "#/traces/" + encodeURIComponent(e.eventId), class: "mono" }, e.traceId), cloudTraceLink(e.traceId)) : "–"], ["Span", e.spanId],
    ["Parent event", e.parentEventId ? eventLink(e.parentEventId) : "–"], ["Correlation", e.correlationId],
    ["Expires", fmtTime(e.expireAt)], ["Sent", fmtTime(e.sentAt)], ["Last sent", fmtTime(e.lastSentAt)], ["Status since", fmtTime(e.statusAt)],
    ["Re-pushed", String(e.retryCount) + " times"], ["Expected consumers", (e.expectedConsumers || []).join(", ") || "none"],
  ];
  out.push(h("div", { class: "row" },
    h("div", { class: "panel" }, h("h2", {}, "Envelope"), h("table", { class: "kv" }, ...kv.filter(([, v]) => v !== undefined && v !== "").map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v))))),
    h("div", { class: "panel" }, h("h2", {}, "Payload"), payloadView(e))));

  // The fate matrix: each consumer's latest outcome.
  out.push(h("div", { class: "panel", "data-testid": "fate" }, h("h2", {}, "Consumers (" + d.summary + ")"),
    d.consumers.length ? h("table", {}, h("tr", {}, h("th", {}, "Consumer"), h("th", {}, "Expected"), h("th", {}, "Latest"), h("th", { class: "num" }, "Attempts"), h("th", {}, "Last error")),
      ...d.consumers.map((c) => {
        const last = c.attempts[c.attempts.length - 1];
        const err = c.attempts.slice().reverse().find((a) => a.errorCode || a.errorMessage);
        return h("tr", { "data-testid": "fate-row", "data-consumer": c.consumerId }, h("td", {}, c.consumerId), h("td", {}, c.expected ? "yes" : "no (reported anyway)"),
          h("td", {}, outcomeBadge(last && last.outcome), c.repushPending ? h("span", { class: "tag warn" }, "re-push pending") : ""),
          h("td", { class: "num", "data-testid": "attempt-count" }, String(c.attempts.length)), h("td", { class: "small" }, err ? errText(err) : ""));
      })) : h("p", { class: "empty" }, "No consumer is expected.")));

  const attempts = [];
  for (const c of d.consumers) for (const a of c.attempts) attempts.push(a);
  attempts.sort((a, b) => (a.consumedAt || "").localeCompare(b.consumedAt || "") || a.attemptNo - b.attemptNo);
  out.push(h("div", { class: "panel", "data-testid": "attempts" }, h("h2", {}, "Attempts, in order"),
    attempts.length ? h("table", {}, h("tr", {}, h("th", {}, "At (UTC)"), h("th", {}, "Consumer"), h("th", { class: "num" }, "#"), h("th", {}, "Outcome"),
      h("th", {}, "Error"), h("th", { class: "num" }, "Delivery"), h("th", {}, "Message")),
    ...attempts.map((a) => h("tr", { "data-testid": "attempt", "data-consumer": a.consumerId, "data-attempt": a.attemptNo },
      h("td", { class: "small" }, fmtTime(a.consumedAt)), h("td", {}, a.consumerId), h("td", { class: "num" }, String(a.attemptNo)), h("td", {}, outcomeBadge(a.outcome)),
      h("td", { class: "small" }, errText(a)), h("td", { class: "num" }, a.deliveryAttempt ? String(a.deliveryAttempt) : ""),
      h("td", { class: "mono small" }, a.messageId || "")))) : h("p", { class: "empty" }, "No consumer reported yet.")));

  const ob = d.outbox;
  const family = h("div", { class: "panel" }, h("h2", {}, "Outbox, parent and children"),
    h("p", { "data-testid": "outbox-state" }, ob ? ["Outbox (" + ob.database + "): ", h("b", {}, ob.state), " after " + ob.attempts + " attempt(s)",
      ob.publishedAt ? ", published " + fmtTime(ob.publishedAt) : "", ob.lastError ? " — last error: " + ob.lastError : ""]
      : h("span", { class: "muted" }, "Not in a reachable outbox (published and purged after the retention, or in another database).")),
    h("p", {}, "Parent: ", d.parent ? [eventLink(d.parent.eventId), " " + d.parent.eventType + " ", statusBadge(d.parent.status)] : h("span", { class: "muted" }, "none")),
    h("div", {}, "Children: ", d.children.length ? h("ul", {}, ...d.children.map((c) => h("li", { "data-testid": "child" }, eventLink(c.eventId), " " + c.eventType + " " + c.aggregateId + " v" + c.version + " ", statusBadge(c.status))))
      : h("span", { class: "muted" }, "none")),
    d.deadLetters.length ? h("p", {}, "Dead letters: ", ...d.deadLetters.map((l) => h("span", {}, h("a", { href: "#/deadletters/" + encodeURIComponent(l.id) }, l.id), " (" + l.consumer + ", " + l.reason + ") "))) : "");
  out.push(h("div", { class: "row" }, family, repushPanel(d, refresh, flash)));
  return out;
}

function payloadView(e) {
  if (e.payloadEncoding === "omitted") return h("p", { class: "muted" }, "Too large for the ledger; the outbox and Pub/Sub hold it.");
  if (e.payloadEncoding === "erased") return h("p", { class: "muted", "data-testid": "privacy" }, "Erased: its data subject's erasure removed the payload.");
  if (e.payloadEncoding === "withheld") return h("p", { class: "muted", "data-testid": "privacy" }, "Withheld: the topic's privacy rule keeps none of the payload here.");
  const note = redactedNote(e.redactedFields);
  if (e.payloadEncoding === "json") return h("div", {}, note, h("pre", { "data-testid": "payload" }, JSON.stringify(e.payload, null, 2)));
  return h("div", {}, note, h("p", { class: "muted small" }, e.payloadType + ", shown as hex"), h("pre", { "data-testid": "payload" }, hexDump(e.payload || "")));
}

// redactedNote says which personal fields the topic's privacy rule hashed
// or removed from the payload shown ("" when none).
function redactedNote(fields) {
  if (!fields || !fields.length) return "";
  return h("p", { class: "muted small", "data-testid": "privacy" }, "Redacted by the topic's privacy rule: ", h("span", { class: "mono" }, fields.join(", ")));
}

function hexDump(b64) {
  let bin;
  try { bin = atob(b64); } catch (e) { return b64; }
  const lines = [];
  for (let i = 0; i < bin.length && i < 4096; i += 16) {
    const chunk = bin.slice(i, i + 16);
    const hex = Array.from(chunk, (c) => c.charCodeAt(0).toString(16).padStart(2, "0")).join(" ");
    const txt = Array.from(chunk, (c) => (c >= " " && c <= "~" ? c : ".")).join("");
    lines.push(i.toString(16).padStart(6, "0") + "  " + hex.padEnd(48) + "  " + txt);
  }
  if (bin.length > 4096) lines.push("… " + (bin.length - 4096) + " more bytes");
  return lines.join("\n");
}

function repushPanel(d, refresh, flash) {
  const e = d.event;
  const rules = d.repush || {};
  const panel = h("div", { class: "panel", "data-testid": "repush" }, h("h2", {}, "Re-push"),
    h("p", { "data-testid": "repush-rules" }, rules.allowed ? "The re-push rules allow it." : ["Not allowed now: ", h("b", {}, rules.code || ""), " — " + (rules.message || "")]));
  const targets = (e.expectedConsumers || []).filter((c) => can("operator", e.topic, c));
  const everyone = can("operator", e.topic, "");
  if (everyone || targets.length) {
    const target = h("select", { "data-testid": "repush-consumer" }, everyone ? h("option", { value: "" }, "every consumer") : "",
      ...targets.map((c) => h("option", { value: c }, c)));
    panel.append(h("div", { class: "inline-form" }, "to ", target, h("button", {
      type: "button", "data-testid": "repush-button", onclick: async () => {
        const to = target.value || "every consumer";
        if (!(await confirmAction("Re-push " + e.eventId + "?", [h("p", {}, "The event goes through the outbox again, in order behind its aggregate's earlier versions, to " + to + ".")], "Re-push"))) return;
        const r = await api("POST", "/events/" + encodeURIComponent(e.eventId) + ":repush", { consumer: target.value });
        flash.replaceChildren(r.status === 200 ? notice("Re-pushed to " + to + ": status " + r.data.status + ", re-push " + r.data.retryCount + ".")
          : notice("Refused: " + errorText(r), "error"));
        refresh();
      },
    }, "Re-push…")));
  }
  return panel;
}

// ---------------------------------------------------------------- trace

function viewTrace(id) {
  const box = h("div", { "data-testid": "trace" }, h("p", { class: "muted" }, "Loading…"));
  render(h("div", { class: "head" }, h("h1", {}, "Trace"), h("span", { class: "muted" }, "of event "), eventLink(id)), box);
  (async () => {
    const v = state.view;
    const r = await api("GET", "/traces/" + encodeURIComponent(id));
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    const t = r.data;
    let first = null, last = null;
    const walk = (ns) => { for (const n of ns) { const e = n.event; if (!first || e.occurredAt < first) first = e.occurredAt; const end = e.statusAt || e.occurredAt; if (!last || end > last) last = end; walk(n.children || []); } };
    walk(t.roots || []);
    box.replaceChildren(h("p", { class: "muted" }, "Trace ", h("span", { class: "mono" }, t.traceId || "(none)"), ": " + t.count + " events, " + ms(between(first, last)) +
      " from the first event to the last status." + (t.truncated ? " Only the newest 1000 events are shown." : "")),
    h("div", { class: "panel" }, h("ul", { class: "tree" }, ...(t.roots || []).map((n) => traceNode(n, null, id)))));
  })();
}

// changeOf returns the change id of an event published side by side in
// several schema versions (shared/event's SideBySide: the id is
// <change id>.<schema version>, the versions share one trace and span),
// or "" for an event published in one version.
function changeOf(e) {
  const suffix = "." + (e.schemaVersion || "");
  return e.schemaVersion && e.eventId.length > suffix.length && e.eventId.endsWith(suffix) ? e.eventId.slice(0, -suffix.length) : "";
}

function traceNode(n, parent, selfId) {
  const e = n.event;
  const hops = [];
  const publish = between(e.enqueuedAt || e.occurredAt, e.sentAt);
  if (publish !== null) hops.push((e.enqueuedAt ? "commit" : "occurred") + " → published " + ms(publish));
  if (["CONSUMED", "FAILED", "PARTIAL"].includes(e.status)) {
    const consume = between(e.sentAt, e.statusAt);
    if (consume !== null) hops.push("published → " + e.status.toLowerCase() + " " + ms(consume));
  }
  if (parent) {
    const after = between(parent.occurredAt, e.occurredAt);
    if (after !== null) hops.push("+" + ms(after) + " after its parent");
  }
  return h("li", { "data-testid": "trace-node", "data-event-id": e.eventId },
    h("div", { class: "node" + (e.eventId === selfId ? " self" : "") }, h("b", {}, e.eventType), h("span", {}, e.aggregateId + " v" + e.version), h("span", { class: "muted small" }, e.topic),
      statusBadge(e.status), eventLink(e.eventId),
      changeOf(e) ? h("span", { class: "tag", "data-testid": "change", title: "one change published side by side in several schema versions" }, "change " + changeOf(e) + " · " + e.schemaVersion) : "",
      h("span", { class: "hops", "data-testid": "hops" }, hops.join(" · "))),
    n.children && n.children.length ? h("ul", {}, ...n.children.map((c) => traceNode(c, e, selfId))) : "");
}

// --------------------------------------------------------- dead letters

function viewLetters() {
  const p = params();
  const field = (name, label, attrs) => h("label", {}, label, h("input", Object.assign({ name, value: p[name] || "", "data-testid": "filter-" + name }, attrs || {})));
  const since = h("input", { type: "datetime-local", step: 1, name: "since", value: fromRFC3339(p.since), "data-testid": "filter-since" });
  const until = h("input", { type: "datetime-local", step: 1, name: "until", value: fromRFC3339(p.until), "data-testid": "filter-until" });
  const deleted = h("input", { type: "checkbox", name: "deleted", value: "true", checked: p.deleted === "true" });
  const form = h("form", {
    class: "filters panel", "data-testid": "letter-filters", onsubmit: (e) => {
      e.preventDefault();
      const f = Object.fromEntries(new FormData(form));
      f.since = toRFC3339(f.since); f.until = toRFC3339(f.until);
      location.hash = "#/deadletters" + query(f);
    },
  }, field("topic", "Topic"), field("consumer", "Consumer"), field("reason", "Reason", { placeholder: "max_delivery_attempts" }), field("eventId", "Event id"),
  h("label", {}, "Archived since (UTC)", since), h("label", {}, "Until (UTC)", until), h("label", {}, h("span", {}, deleted, " deleted ones too")),
  h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", "data-testid": "apply" }, "Apply"),
    h("button", { type: "button", onclick: () => { location.hash = "#/deadletters"; } }, "Clear")));
  const list = h("div", { class: "panel", "data-testid": "letters" }, h("p", { class: "muted" }, "Loading…"));
  const result = h("div", { "data-testid": "bulk-result" });
  const tokens = [];
  let token = "";
  const load = async () => {
    const v = state.view;
    const r = await api("GET", "/deadletters" + query(Object.assign({}, p, { pageToken: token })));
    if (v !== state.view) return;
    if (r.status !== 200) { list.replaceChildren(notice(errorText(r), "error")); return; }
    list.replaceChildren(lettersTable(r.data.deadLetters), h("div", { class: "pager" },
      h("button", { type: "button", disabled: !tokens.length, onclick: () => { token = tokens.pop() || ""; load(); } }, "← Previous"),
      h("button", { type: "button", disabled: !r.data.nextPageToken, onclick: () => { tokens.push(token); token = r.data.nextPageToken; load(); } }, "Next →")));
  };
  const head = h("div", { class: "head" }, h("h1", {}, "Dead letters"), h("span", { class: "spacer" }));
  if (can("operator", p.topic || "", p.consumer || "")) {
    head.append(h("button", { type: "button", "data-testid": "bulk-replay", onclick: () => bulkReplay(p, result, load) }, "Replay all matching…"));
  }
  render(head, form, result, list);
  load();
}

async function bulkReplay(p, result, reload) {
  if (!p.topic && !p.consumer && !p.reason) {
    result.replaceChildren(notice("Filter by topic, consumer or reason first: a bulk replay needs a filter.", "error"));
    return;
  }
  const filter = { topic: p.topic, consumer: p.consumer, reason: p.reason, since: p.since, until: p.until };
  const dry = await api("POST", "/deadletters:replay", Object.assign({ dryRun: true }, filter));
  if (dry.status !== 200) { result.replaceChildren(notice(errorText(dry), "error")); return; }
  const n = dry.data.matched;
  if (!n) { result.replaceChildren(notice("No letter matching the filter waits for a replay.")); return; }
  const body = [h("p", { "data-testid": "bulk-count" }, n + " dead letter(s) match and were never replayed. Each goes back to the one consumer that failed it" +
    (n > dry.data.limit ? "; this replays the first " + dry.data.limit + "." : ".")),
  h("table", {}, h("tr", {}, h("th", {}, "Topic"), h("th", {}, "Consumer"), h("th", { class: "num" }, "Letters")),
    ...dry.data.byTopicConsumer.map((x) => h("tr", {}, h("td", {}, x.topic), h("td", {}, x.consumer || "(unknown)"), h("td", { class: "num" }, String(x.count)))))];
  if (!(await confirmAction("Replay " + n + " dead letter(s)?", body, "Replay " + n))) return;
  const r = await api("POST", "/deadletters:replay", Object.assign({ expect: n }, filter));
  result.replaceChildren(r.status === 200 ? notice("Replayed " + r.data.replayed + " of " + r.data.matched + " dead letter(s)" + (r.data.remaining ? "; " + r.data.remaining + " remain" : "") + ".")
    : notice(errorText(r), "error"));
  reload();
}

function lettersTable(letters) {
  if (!letters.length) return h("p", { class: "empty", "data-testid": "no-letters" }, "No dead letter matches.");
  return h("table", {}, h("tr", {}, h("th", {}, "Archived (UTC)"), h("th", {}, "Letter"), h("th", {}, "Topic"), h("th", {}, "Consumer"), h("th", {}, "Reason"),
    h("th", {}, "Event"), h("th", { class: "num" }, "Deliveries"), h("th", { class: "num" }, "Replays")),
  ...letters.map((l) => h("tr", { "data-testid": "letter-row", "data-letter-id": l.id },
    h("td", { class: "small" }, fmtTime(l.archivedAt)), h("td", {}, h("a", { href: "#/deadletters/" + encodeURIComponent(l.id), class: "mono" }, l.id)),
    h("td", {}, l.topic), h("td", {}, l.consumer || h("span", { class: "muted" }, "(unknown)")), h("td", {}, l.reason, l.deleted ? h("span", { class: "tag warn" }, "deleted") : ""),
    h("td", {}, l.eventId ? eventLink(l.eventId) : ""), h("td", { class: "num" }, String(l.deliveries)), h("td", { class: "num", "data-testid": "replays" }, String((l.replays || []).length)))));
}

function viewLetter(id) {
  const box = h("div", { "data-testid": "letter" }, h("p", { class: "muted" }, "Loading…"));
  const flash = h("div", { "data-testid": "flash" });
  render(h("div", { class: "head" }, h("h1", {}, "Dead letter"), h("span", { class: "mono muted" }, id)), flash, box);
  const load = async () => {
    const v = state.view;
    const r = await api("GET", "/deadletters/" + encodeURIComponent(id));
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    box.replaceChildren(...letterBody(r.data, load, flash));
  };
  load();
}

function letterBody(l, reload, flash) {
  const kv = [["Topic", l.topic], ["Consumer", l.consumer || "(unknown)"], ["Subscription", l.subscription + (l.pubsubSubscription ? " (Pub/Sub: " + l.pubsubSubscription + ")" : "")],
    ["Reason", l.reason], ["Error", l.error], ["Deliveries", String(l.deliveries)], ["Dead-lettered", fmtTime(l.deadLetteredAt)], ["Archived", fmtTime(l.archivedAt)],
    ["Kept until", fmtTime(l.deleteAt)], ["Event", l.eventId ? eventLink(l.eventId) : "–"], ["Ordering key", l.orderingKey]];
  if (l.deleted) kv.push(["Deleted", "by " + l.deletedBy + " at " + fmtTime(l.deletedAt)]);
  const attrs = Object.keys(l.attributes || {}).sort();
  let data = "";
  try { data = atob(l.data || ""); } catch (e) { data = ""; }
  let shown;
  try { shown = h("pre", { "data-testid": "letter-data" }, JSON.stringify(JSON.parse(data), null, 2)); } catch (e) { shown = h("pre", { "data-testid": "letter-data" }, hexDump(l.data || "")); }
  if (l.erased) shown = h("p", { class: "muted", "data-testid": "privacy" }, "Erased: its data subject's erasure removed the data.");
  else if (l.payloadWithheld) shown = h("p", { class: "muted", "data-testid": "privacy" }, "Withheld: the topic's privacy rule keeps none of the payload in the archive, so the letter cannot be replayed; re-push the event while its outbox row is kept.");
  else if (l.redactedFields && l.redactedFields.length) shown = h("div", {}, redactedNote(l.redactedFields), h("p", { class: "muted small" }, "A redacted letter is not replayed; re-push the event while its outbox row is kept."), shown);
  const out = [h("div", { class: "row" },
    h("div", { class: "panel" }, h("h2", {}, "Why and where"), h("table", { class: "kv" }, ...kv.filter(([, v]) => v).map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v))))),
    h("div", { class: "panel" }, h("h2", {}, "Original message"), h("table", { class: "kv small" }, ...attrs.map((k) => h("tr", {}, h("th", { class: "mono" }, k), h("td", { class: "mono" }, l.attributes[k])))),
      h("h2", { class: "spaced" }, "Data"), shown))];

  // Delivery history: the consumer's attempts from the ledger and the operators' replays.
  const hist = [];
  const report = l.ledger && l.ledger.consumers.find((c) => c.consumerId === l.consumer);
  for (const a of (report ? report.attempts : [])) hist.push([a.consumedAt, "attempt " + a.attemptNo, outcomeBadge(a.outcome), errText(a)]);
  for (const r of l.replays || []) hist.push([r.at, "replay", badge("replayed", "s-SENT", "replayed"), "by " + r.by + " to " + r.consumer + " as message " + r.messageId]);
  hist.sort((a, b) => (a[0] || "").localeCompare(b[0] || ""));
  out.push(h("div", { class: "panel", "data-testid": "history" }, h("h2", {}, "Delivery history of " + (l.consumer || "its consumer")),
    hist.length ? h("table", {}, ...hist.map(([at, what, b, detail]) => h("tr", { "data-testid": "history-row" }, h("td", { class: "small" }, fmtTime(at)), h("td", {}, what), h("td", {}, b), h("td", { class: "small" }, detail))))
      : h("p", { class: "empty" }, "The ledger has no attempt of " + (l.consumer || "this consumer") + " at this event.")));

  const plan = h("div", { "data-testid": "plan" });
  const result = flash;
  const actions = h("div", { class: "inline-form" }, h("button", {
    type: "button", "data-testid": "dry-run", onclick: async () => {
      const r = await api("POST", "/deadletters/" + encodeURIComponent(l.id) + ":replay", { dryRun: true });
      plan.replaceChildren(r.status === 200 ? planView(r.data) : notice(errorText(r), "error"));
    },
  }, "Dry run"));
  if (can("operator", l.topic, l.consumer) && !l.deleted) {
    actions.append(h("button", {
      type: "button", class: "primary", "data-testid": "replay", onclick: async () => {
        const dry = await api("POST", "/deadletters/" + encodeURIComponent(l.id) + ":replay", { dryRun: true });
        if (dry.status !== 200) { result.replaceChildren(notice(errorText(dry), "error")); return; }
        if (!(await confirmAction("Replay to " + l.consumer + " only?", [planView(dry.data)], "Replay"))) return;
        const r = await api("POST", "/deadletters/" + encodeURIComponent(l.id) + ":replay", {});
        result.replaceChildren(r.status === 200 ? notice("Replayed to " + r.data.consumer + " as message " + r.data.messageId + ". " + r.data.summary) : notice(errorText(r), "error"));
        reload();
      },
    }, "Replay to " + (l.consumer || "its consumer") + "…"), h("button", {
      type: "button", class: "danger", "data-testid": "delete", onclick: async () => {
        if (!(await confirmAction("Delete dead letter " + l.id + "?", [h("p", {}, "It leaves the list and can no longer be replayed; a tombstone keeps who deleted it and when.")], "Delete"))) return;
        const r = await api("DELETE", "/deadletters/" + encodeURIComponent(l.id));
        result.replaceChildren(r.status === 200 ? notice("Deleted.") : notice(errorText(r), "error"));
        reload();
      },
    }, "Delete…"));
  }
  out.push(h("div", { class: "panel", "data-testid": "letter-actions" }, h("h2", {}, "Replay"), actions, plan));
  return out;
}

function planView(p) {
  return h("div", { class: "plan", "data-testid": "plan-view" }, h("div", {}, badge(p.outcome, "p-" + p.outcome, "plan-outcome"), " ", h("span", { "data-testid": "plan-summary" }, p.summary)),
    h("ul", { class: "checks" }, ...p.checks.map((c) => h("li", {}, h("b", {}, c.check + ": "), c.result))));
}

// ------------------------------------------------------------ consumers

function viewConsumers() {
  const box = h("div", { "data-testid": "consumers" }, h("p", { class: "muted" }, "Loading…"));
  const result = h("div", { "data-testid": "consumer-result" });
  render(h("div", { class: "head" }, h("h1", {}, "Consumers"), h("span", { class: "muted" }, "the topic_consumers registry")), result, box);
  const load = async () => {
    const v = state.view;
    const r = await api("GET", "/consumers");
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    box.replaceChildren(...consumersBody(r.data, result, load));
  };
  load();
}

function consumersBody(d, result, reload) {
  const change = async (c, body, verb) => {
    const r = await api("PATCH", "/consumers/" + encodeURIComponent(c.topic) + "/" + encodeURIComponent(c.consumerId), body);
    result.replaceChildren(r.status === 200 ? notice(c.consumerId + " on " + c.topic + ": " + (r.data.changed ? verb : "nothing changed") + "." + (r.data.warning ? " " + r.data.warning : ""))
      : notice(errorText(r), "error"));
    reload();
  };
  const topics = [...new Set(d.consumers.map((c) => c.topic))].sort();
  // A topic's last enabled consumer is disabled by an admin of the topic
  // only: its new events would be dropped (SKIPPED).
  const enabled = {};
  for (const c of d.consumers) if (c.inRegistry && c.enabled) enabled[c.topic] = (enabled[c.topic] || 0) + 1;
  const mayChange = (c) => can("operator", c.topic, c.consumerId);
  const out = [h("p", { class: "muted small" }, d.cacheNote + "."), h("p", { class: "muted small", "data-testid": "ownership" }, d.ownership)];
  const delivery = async (c, verb) => {
    const r = await api("POST", "/consumers/" + encodeURIComponent(c.topic) + "/" + encodeURIComponent(c.consumerId) + ":" + verb, {});
    result.replaceChildren(r.status === 200 ? notice(c.consumerId + " on " + c.topic + ": " + (r.data.changed ? (verb === "pause" ? "paused: messages wait in its subscription" : "resumed") : "nothing changed") + ".")
      : notice(errorText(r), "error"));
    reload();
  };
  for (const t of topics) {
    out.push(h("div", { class: "panel", "data-testid": "topic", "data-topic": t }, h("h2", {}, t),
      h("table", {}, h("tr", {}, h("th", {}, "Consumer"), h("th", {}, "State"), h("th", {}, "Description"), h("th", {}, "Delivery"), h("th", {}, "Subscription"),
        h("th", {}, "Changed"), d.consumers.some((c) => c.topic === t && (mayChange(c) || can("admin", t, ""))) ? h("th", {}, "") : ""),
      ...d.consumers.filter((c) => c.topic === t).map((c) => {
        const row = h("tr", { "data-testid": "consumer-row", "data-consumer": c.consumerId },
          h("td", {}, h("b", {}, c.consumerId)),
          h("td", { "data-testid": "consumer-state" }, !c.inRegistry ? badge("not in registry", "s-PENDING") : c.enabled ? badge("enabled", "s-CONSUMED") : badge("disabled", "s-EXPIRED"),
            c.declared || c.subscription ? "" : h("span", { class: "tag warn" }, "no subscription"),
            c.paused ? (c.pausedBy === "breaker"
              ? h("span", { title: "Its forward target is down: the circuit breaker " + (c.delivery === "push" ? "detached the push endpoint" : "keeps its deliveries in its database") + " (no delivery attempt is counted) and resumes it once a probe finds the target up. Resume now to deliver at once." }, badge("paused by breaker", "s-RETRYING"))
              : badge("paused", "s-RETRYING")) : "",
            h("span", { class: "tag", "data-testid": "consumer-owner", title: d.ownership }, c.owner === "operator" ? "operator's" : "topology's")),
          h("td", { class: "small" }, c.description || ""), h("td", {}, c.delivery || "–", c.handler ? h("span", { class: "muted small" }, " · " + c.handler) : "", flowLimits(c), consumerLinks(c)),
          h("td", { class: "mono small" }, c.subscription || "", c.pubsubSubscription ? h("div", { class: "muted" }, c.pubsubSubscription) : ""),
          h("td", { class: "small" }, c.updatedBy ? c.updatedBy + ", " + fmtTime(c.updatedAt) : fmtTime(c.updatedAt)));
        if (mayChange(c) || can("admin", c.topic, "")) {
          const cell = h("td", { class: "nowrap" });
          if (!c.inRegistry) {
            if (can("admin", c.topic, "")) {
            cell.append(h("button", { type: "button", "data-testid": "add-declared", onclick: async () => {
              const r = await api("POST", "/consumers", { topic: c.topic, consumerId: c.consumerId, enabled: c.enabled, description: c.description, sortOrder: c.sortOrder });
              result.replaceChildren(r.status === 200 ? notice("Added " + c.consumerId + " to " + c.topic + ".") : notice(errorText(r), "error"));
              reload();
            } }, "Add to registry"));
            }
          } else if (!mayChange(c)) {
            // an admin of the topic without a right on this consumer: nothing to change here
          } else if (c.enabled && enabled[c.topic] === 1 && !can("admin", c.topic, "")) {
            cell.append(h("span", { class: "muted small", "data-testid": "last-consumer" }, "last enabled consumer: an admin of " + c.topic + " may disable it"));
          } else if (c.enabled) {
            cell.append(h("button", { type: "button", "data-testid": "disable", onclick: async () => {
              const last = enabled[c.topic] === 1;
              if (!(await confirmAction("Disable " + c.consumerId + " on " + c.topic + "?", [h("p", {}, "Events sent to " + c.topic + " from now on will not expect " + c.consumerId +
                " (within " + "the services' registry cache, 30 s). Events already sent keep it. Its subscription still delivers."),
              last ? h("p", { class: "warn", "data-testid": "last-consumer-warning" }, "It is the topic's last enabled consumer: from then on every new event of " + c.topic +
                " is SKIPPED (publish answers 200 SKIPPED and writes nothing) until a consumer is enabled again.") : ""], "Disable"))) return;
              change(c, { enabled: false }, "disabled");
            } }, "Disable…"));
          } else {
            cell.append(h("button", { type: "button", "data-testid": "enable", onclick: () => change(c, { enabled: true }, "enabled") }, "Enable"));
          }
          if (mayChange(c) && c.declared && c.delivery === "push" && c.paused !== undefined) {
            cell.append(" ", c.paused
              ? h("button", { type: "button", "data-testid": "resume", onclick: () => delivery(c, "resume") }, "Resume")
              : h("button", { type: "button", "data-testid": "pause", onclick: async () => {
                if (!(await confirmAction("Pause " + c.consumerId + " on " + c.topic + "?", [h("p", {}, "Its push endpoint is detached: Pub/Sub delivers nothing, counts no attempt and dead-letters nothing; " +
                  "messages wait in " + c.subscription + " (up to its retention) until you resume it. A deploy does not resume it.")], "Pause"))) return;
                delivery(c, "pause");
              } }, "Pause…"));
          }
          if (mayChange(c) && c.inRegistry) {
            cell.append(" ", h("button", { type: "button", "data-testid": "describe", onclick: () => {
              const input = h("input", { value: c.description || "", maxlength: 256, size: 40, "data-testid": "description-input" });
              row.replaceChildren(h("td", { colspan: 7 }, h("form", { class: "inline-form", onsubmit: (e) => { e.preventDefault(); change(c, { description: input.value }, "described"); } },
                h("b", {}, c.consumerId), " description: ", input, h("button", { type: "submit", class: "primary" }, "Save"), h("button", { type: "button", onclick: reload }, "Cancel"))));
              input.focus();
            } }, "Describe"));
          }
          row.append(cell);
        }
        return row;
      }))));
  }
  const addable = topics.filter((t) => can("admin", t, ""));
  if (addable.length) {
    const topic = h("select", { name: "topic", "data-testid": "add-topic" }, ...addable.map((t) => h("option", { value: t }, t)));
    const id = h("input", { name: "consumerId", placeholder: "consumer service", maxlength: 63, "data-testid": "add-consumer" });
    const desc = h("input", { name: "description", placeholder: "what it does", maxlength: 256, size: 36 });
    out.push(h("div", { class: "panel" }, h("h2", {}, "Add a consumer"), h("form", {
      class: "inline-form", onsubmit: async (e) => {
        e.preventDefault();
        const r = await api("POST", "/consumers", { topic: topic.value, consumerId: id.value, description: desc.value });
        result.replaceChildren(r.status === 200 ? notice("Added " + id.value + " to " + topic.value + "." + (r.data.warning ? " " + r.data.warning : "")) : notice(errorText(r), "error"));
        if (r.status === 200) reload();
      },
    }, topic, id, desc, h("button", { type: "submit", class: "primary" }, "Add")),
    h("p", { class: "muted small" }, "A consumer needs a subscription and a consume service (infra/topology.yaml, then deploy); until it reports, new events wait for it.")));
  }
  out.push(h("div", { class: "panel", "data-testid": "audit" }, h("h2", {}, "Changes (audit)"),
    d.audit.length ? h("table", {}, h("tr", {}, h("th", {}, "At (UTC)"), h("th", {}, "By"), h("th", {}, "Action"), h("th", {}, "Topic"), h("th", {}, "Consumer"), h("th", {}, "What")),
      ...d.audit.map((a) => h("tr", { "data-testid": "audit-row" }, h("td", { class: "small" }, fmtTime(a.at)), h("td", {}, a.by), h("td", {}, a.action), h("td", {}, a.topic),
        h("td", {}, a.consumerId), h("td", { class: "small" }, a.detail)))) : h("p", { class: "empty" }, "No change yet.")));
  return out;
}

// flowLimits shows a consumer's flow control from the topology (nothing
// when it sets none) and whether it is at its limits, as its consume
// instances report it: now (a report in the last seconds), or when it last
// was, with the deliveries they refused.
function flowLimits(c) {
  const f = c.flow;
  if (!f || !(f.maxInFlight || f.maxPerSecond || f.maxInstances)) return "";
  const parts = [];
  if (f.maxInFlight) parts.push("≤ " + f.maxInFlight + " in flight");
  if (f.maxPerSecond) parts.push("≤ " + f.maxPerSecond + "/s");
  if (f.maxInstances) parts.push("≤ " + f.maxInstances + " instances");
  let state = "";
  if (f.atLimit) state = h("span", { class: "tag warn", "data-testid": "consumer-at-limit", title: "A consume instance held deliveries to these limits in the last seconds" }, "at its limits");
  else if (f.lastAtLimit) state = h("span", { class: "small", "data-testid": "consumer-last-at-limit" }, " last at its limits " + fmtTime(f.lastAtLimit));
  const refused = f.refused ? h("span", { class: "small", "data-testid": "consumer-refused" }, " · " + f.refused + " refused") : "";
  return h("div", { class: "muted small", "data-testid": "consumer-flow", title: "At its limits: metric " + f.atLimitMetric }, parts.join(" · "), " ", state, refused);
}

// consumerLinks links a declared consumer's gaps (strict handler) and
// projection rebuild (projection or strict handler, push delivery): the
// dry runs are reads, so every caller sees the links.
function consumerLinks(c) {
  if (!c.declared) return "";
  const base = "#/consumers/" + encodeURIComponent(c.topic) + "/" + encodeURIComponent(c.consumerId);
  const links = [];
  if (c.handler === "strict") links.push(h("a", { href: base + "/gaps", "data-testid": "gaps-link" }, "Gaps"));
  if ((c.handler === "strict" || c.handler === "projection") && c.delivery === "push") links.push(h("a", { href: base + "/rebuild", "data-testid": "rebuild-link" }, "Rebuild"));
  return links.length ? h("div", { class: "small" }, ...links.flatMap((l, i) => (i ? [" · ", l] : [l]))) : "";
}

function consumerPath(topic, id) { return "/consumers/" + encodeURIComponent(topic) + "/" + encodeURIComponent(id); }

// ----------------------------------------------------------------- gaps

// viewGaps lists a strict consumer's open version gaps (read from its own
// database by the API) and releases one by skipping its missing versions.
function viewGaps(topic, id) {
  const box = h("div", { "data-testid": "gaps" }, h("p", { class: "muted" }, "Loading…"));
  const result = h("div", { "data-testid": "gap-result" });
  const load = async () => {
    const v = state.view;
    const r = await api("GET", consumerPath(topic, id) + "/gaps");
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    box.replaceChildren(...gapsBody(r.data, result, load));
  };
  render(h("div", { class: "head" }, h("h1", {}, "Gaps"), h("span", { class: "muted" }, id + " on " + topic), h("span", { class: "spacer" }),
    liveToggle(load), h("a", { href: "#/consumers" }, "← Consumers")), result, box);
  poll(load);
}

function gapsBody(d, result, reload) {
  const out = [h("p", { class: "muted small" }, "A strict consumer applies each aggregate's versions in order; a version that never arrives parks the later ones behind it. " +
    "After " + d.gapTimeout + " a gap is overdue and reported. Skipping records the missing versions as skipped (audited); " + d.consumer +
    "'s next gap check (Scheduler, every minute) applies what was parked behind them. Database " + d.database + ", subscription " + d.subscription + ".")];
  if (!d.gaps.length) { out.push(h("p", { class: "empty", "data-testid": "no-gaps" }, "No open gap.")); return out; }
  out.push(h("div", { class: "panel" }, h("table", {},
    h("tr", {}, h("th", {}, "Aggregate"), h("th", { class: "num" }, "Applied"), h("th", { class: "num" }, "Missing"), h("th", { class: "num" }, "First parked"),
      h("th", { class: "num" }, "Parked"), h("th", {}, "Parked since (UTC)"), h("th", {}, "Age"), can("operator", d.topic, d.consumer) ? h("th", {}, "") : ""),
    ...d.gaps.map((g) => {
      const last = Math.max(g.firstParked - 1, g.missing);
      const missing = last > g.missing ? g.missing + "–" + last : String(g.missing);
      const row = h("tr", { "data-testid": "gap-row", "data-aggregate-id": g.aggregateId },
        h("td", {}, (g.aggregateType ? g.aggregateType + " " : ""), h("b", { class: "mono" }, g.aggregateId)),
        h("td", { class: "num" }, String(g.applied)), h("td", { class: "num", "data-testid": "gap-missing" }, missing), h("td", { class: "num" }, String(g.firstParked)),
        h("td", { class: "num" }, String(g.parked)), h("td", { class: "small" }, fmtTime(g.since)),
        h("td", {}, g.age, g.overdue ? h("span", { class: "tag warn" }, "overdue") : "", g.reported ? h("span", { class: "tag" }, "reported") : ""));
      if (can("operator", d.topic, d.consumer)) {
        row.append(h("td", {}, h("button", { type: "button", class: "danger", "data-testid": "skip", onclick: async () => {
          const reason = h("input", { maxlength: 500, size: 48, placeholder: "why (kept in the audit log)", "data-testid": "skip-reason" });
          const through = last > g.missing ? last : 0;
          if (!(await confirmAction("Skip " + (g.aggregateType ? g.aggregateType + " " : "") + g.aggregateId + " version " + missing + "?",
            [h("p", {}, "Versions " + missing + " are recorded as skipped and never applied, even if they arrive later; the " + g.parked + " parked version(s) behind them are applied at " +
              d.consumer + "'s next gap check."), h("p", {}, "Reason: ", reason)], "Skip"))) return;
          const r = await api("POST", consumerPath(d.topic, d.consumer) + "/gaps:skip",
            { aggregateType: g.aggregateType, aggregateId: g.aggregateId, version: g.missing, through, reason: reason.value });
          result.replaceChildren(r.status === 200 ? notice("Skipped " + r.data.aggregateId + " version(s) " + (r.data.skipped || []).join(", ") + ". " + r.data.next + ".")
            : notice(errorText(r), "error"));
          reload();
        } }, "Skip…")));
      }
      return row;
    }))));
  return out;
}

// -------------------------------------------------------------- rebuild

// viewRebuild rebuilds a consumer's projection: a dry run says what would
// be cleared and replayed; the run pauses, seeks, clears and resumes.
function viewRebuild(topic, id) {
  const p = params();
  const at = h("input", { type: "datetime-local", step: 1, value: fromRFC3339(p.time || ""), "data-testid": "rebuild-time", "aria-label": "seek to (UTC)" });
  const snap = h("input", { value: p.snapshot || "", placeholder: "or a snapshot", maxlength: 255, "data-testid": "rebuild-snapshot" });
  const agg = h("input", { value: p.aggregateType || "", placeholder: "every aggregate type", maxlength: 128, "data-testid": "rebuild-aggregate-type" });
  const plan = h("div", { "data-testid": "rebuild-plan" });
  const result = h("div", { "data-testid": "rebuild-result" });
  const body = () => ({ time: snap.value ? "" : toRFC3339(at.value), snapshot: snap.value, aggregateType: agg.value });
  const dry = async () => {
    const r = await api("POST", consumerPath(topic, id) + ":rebuild", { ...body(), dryRun: true });
    plan.replaceChildren(r.status === 200 ? rebuildPlan(r.data) : notice(errorText(r), "error"));
    return r;
  };
  const form = h("form", { class: "inline-form", onsubmit: (e) => { e.preventDefault(); dry(); } },
    "Seek to (UTC) ", at, " ", snap, " scope ", agg, h("button", { type: "submit", "data-testid": "rebuild-dry-run" }, "Dry run"));
  if (can("admin", topic, id)) {
    form.append(h("button", { type: "button", class: "danger", "data-testid": "rebuild-run", onclick: async () => {
      const d = await dry();
      if (d.status !== 200) return;
      if (!(await confirmAction("Rebuild " + id + "'s projection?", [rebuildPlan(d.data)], "Rebuild"))) return;
      result.replaceChildren(notice("Rebuilding…"));
      const r = await api("POST", consumerPath(topic, id) + ":rebuild", body());
      result.replaceChildren(r.status === 200 ? notice("Rebuilt " + r.data.consumer + " (" + r.data.scope + "): cleared " + countsText(r.data.cleared) + "; " +
        r.data.subscription + " seeked to " + (r.data.time || r.data.snapshot) + (r.data.resumed ? " and resumed." : "; it was paused before and stays paused."))
        : notice(errorText(r), "error"));
    } }, "Rebuild…"));
  }
  render(h("div", { class: "head" }, h("h1", {}, "Rebuild"), h("span", { class: "muted" }, id + " on " + topic), h("span", { class: "spacer" }),
    h("a", { href: "#/consumers" }, "← Consumers")), result,
  h("div", { class: "panel" }, h("p", { class: "muted small" }, "Pauses the consumer, deletes its projection state for the scope and its inbox rows in its own database, " +
    "seeks its subscription to the time or snapshot and resumes it: Pub/Sub delivers again, in order, every message retained since. A time older than the subscription's retention is refused."),
  form, plan));
}

function countsText(n) {
  if (!n) return "";
  return n.projectionRows + " projection row(s), " + n.inboxRows + " inbox row(s)" +
    (n.strictPositions || n.strictParked || n.strictSkipped ? ", " + n.strictPositions + " position(s), " + n.strictParked + " parked, " + n.strictSkipped + " skipped" : "");
}

function rebuildPlan(p) {
  return h("div", { class: "plan", "data-testid": "rebuild-plan-view" },
    h("p", {}, h("b", {}, "Would clear: "), h("span", { "data-testid": "would-clear" }, countsText(p.wouldClear)), " in database " + p.database + " (scope: " + p.scope + ")."),
    p.warning ? h("p", { class: "warn", "data-testid": "rebuild-warning" }, p.warning) : "",
    h("ol", { class: "checks" }, ...(p.steps || []).map((s) => h("li", {}, s))),
    h("p", { class: "muted small" }, p.subscription + " retains messages for " + p.retention + "."));
}

// -------------------------------------------------------------- catalog

// viewCatalog shows every topic's contract and its parties (GET /catalog):
// its schema versions, who publishes, who consumes how and what each
// consumer emits. ?topic= shows one topic.
function viewCatalog() {
  const p = params();
  const box = h("div", { "data-testid": "catalog" }, h("p", { class: "muted" }, "Loading…"));
  const pick = h("select", { "data-testid": "catalog-topic-filter", onchange: () => { location.hash = "#/catalog" + query({ topic: pick.value }); } },
    h("option", { value: "" }, "every topic"));
  render(h("div", { class: "head" }, h("h1", {}, "Catalog"), h("span", { class: "muted" }, "topics, schemas, publishers and consumers"),
    h("span", { class: "spacer" }), h("label", { class: "muted small" }, "show ", pick)), box);
  (async () => {
    const v = state.view;
    const [r, all] = await Promise.all([api("GET", "/catalog" + query({ topic: p.topic })), p.topic ? api("GET", "/catalog") : null]);
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    for (const t of ((all && all.status === 200 ? all : r).data.catalog.topics)) pick.append(h("option", { value: t.name, selected: t.name === p.topic }, t.name));
    box.replaceChildren(...catalogBody(r.data));
  })();
}

function catalogBody(d) {
  const c = d.catalog;
  const out = [h("p", { class: "muted small" }, "From the topology (infra/topology.yaml), its compiled schemas and the live consumer registry" +
    (c.registry ? "" : " (not read)") + ". Every message's ordering key is its aggregate id. ", h("code", {}, "relaybus catalog"), " writes the same as an AsyncAPI 3.0 document.")];
  if (d.schemaError) out.push(notice(d.schemaError, "error"));
  for (const t of c.topics) out.push(catalogTopic(t));
  return out;
}

function catalogTopic(t) {
  const mode = t.mode === "binary" ? "CloudEvents binary mode: the data is the payload, validated by the topic's Pub/Sub schema"
    : "CloudEvents structured mode (" + t.contentType + ")";
  const schemas = t.schemas.length ? h("table", {}, h("tr", {}, h("th", {}, "Version"), h("th", {}, "Schema"), h("th", {}, "Payload type"), h("th", {}, "File"), h("th", {}, "Shape")),
    ...t.schemas.map((s) => h("tr", { "data-testid": "schema-row", "data-version": s.version },
      h("td", {}, h("b", {}, s.version)), h("td", {}, s.type + " · " + s.encoding, s.message ? h("div", { class: "mono small" }, s.message) : ""),
      h("td", { class: "mono small" }, s.payloadType), h("td", { class: "mono small" }, s.file),
      h("td", { class: "shape" }, s.jsonSchema || s.definition ? h("details", {}, h("summary", {}, s.jsonSchema ? "JSON Schema" : "definition"),
        h("pre", { "data-testid": "schema-shape" }, s.jsonSchema ? JSON.stringify(s.jsonSchema, null, 2) : s.definition)) : "–"))))
    : h("p", { class: "muted", "data-testid": "no-schema" }, "No schema: the topic takes any payload.");
  const pubs = t.publishers.length ? h("ul", {}, ...t.publishers.map((p) => h("li", { "data-testid": "publisher" },
    p.kind === "http" ? [h("b", {}, p.name), " over HTTP (the publish function)"]
      : [h("b", {}, p.name), " emits them handling ", h("a", { href: "#/catalog" + query({ topic: p.from }) }, p.from)])))
    : h("p", { class: "muted", "data-testid": "no-publisher" }, "None declared: producers enqueue in their own transaction (the topology names HTTP callers and emitting consumers only).");
  const cons = t.consumers.length ? h("table", {}, h("tr", {}, h("th", {}, "Consumer"), h("th", {}, "State"), h("th", {}, "Delivery"), h("th", {}, "Handler"), h("th", {}, "Emits"), h("th", {}, "Registry")),
    ...t.consumers.map((c) => h("tr", { "data-testid": "catalog-consumer", "data-consumer": c.service },
      h("td", {}, h("b", {}, c.service), c.role ? h("span", { class: "muted small" }, " (" + c.role + ")") : "", c.description ? h("div", { class: "small muted" }, c.description) : ""),
      h("td", { "data-testid": "catalog-state" }, !c.declared ? badge("no subscription", "s-FAILED") : !c.inRegistry ? badge("not in registry", "s-PENDING")
        : c.enabled ? badge("enabled", "s-CONSUMED") : badge("disabled", "s-EXPIRED")),
      h("td", { "data-testid": "catalog-delivery" }, c.declared ? [c.delivery, h("span", { class: c.ordered ? "tag" : "tag warn" }, c.ordered ? "ordered" : "unordered"),
        h("div", { class: "mono small muted" }, c.subscription)] : "–"),
      h("td", { "data-testid": "catalog-handler" }, c.declared ? [c.handler, c.handlerKind !== c.handler ? h("span", { class: "muted small" }, " (" + c.handlerKind + ")") : "",
        c.forwardUrl ? h("div", { class: "mono small" }, "→ " + c.forwardUrl) : "", h("div", { class: "small muted" }, "database " + c.database)] : "–"),
      h("td", { "data-testid": "catalog-emits" }, c.emits.length ? c.emits.map((e) => h("div", {}, h("a", { href: "#/catalog" + query({ topic: e }) }, e))) : "–"),
      h("td", { class: "small" }, c.registration ? (c.registration.updatedBy ? c.registration.updatedBy + ", " : "deploy, ") + fmtTime(c.registration.updatedAt) : "–"))))
    : h("p", { class: "muted" }, "No consumer.");
  return h("div", { class: "panel", "data-testid": "catalog-topic", "data-topic": t.name },
    h("h2", {}, t.name, t.description ? h("span", { class: "muted small" }, " " + t.description) : ""),
    h("p", { class: "small" }, mode, ". Aggregates: ", t.aggregateTypes.join(", "), ". Dead letters: ", h("span", { class: "mono" }, t.deadLetterTopic), ". Ledger: " + t.ledger + "."),
    h("h3", {}, "Schemas"), schemas, h("h3", {}, "Publishers"), pubs, h("h3", {}, "Consumers"), cons);
}

// ------------------------------------------------------------ replay jobs

// viewJobs: count the events a consumer failed in a window, start a replay
// job with the count confirmed, and follow every job's progress. A job
// advances while a caller drives it (POST /jobs/{id}:run): this view drives
// the running jobs the caller may operate while it is open.
function viewJobs() {
  const p = params();
  const field = (name, label, attrs) => h("label", {}, label, h("input", Object.assign({ name, value: p[name] || "", "data-testid": "job-" + name }, attrs || {})));
  const select = (name, label, options) => h("label", {}, label, h("select", { name, "data-testid": "job-" + name },
    ...options.map(([v, t]) => h("option", { value: v, selected: (p[name] || "") === v }, t))));
  const since = h("input", { type: "datetime-local", step: 1, name: "since", value: fromRFC3339(p.since), "data-testid": "job-since" });
  const until = h("input", { type: "datetime-local", step: 1, name: "until", value: fromRFC3339(p.until), "data-testid": "job-until" });
  const result = h("div", { "data-testid": "job-result" });
  const filter = () => {
    const f = Object.fromEntries(new FormData(form));
    f.since = toRFC3339(f.since); f.until = toRFC3339(f.until);
    for (const k of Object.keys(f)) if (f[k] === "") delete f[k];
    if (f.rate) f.rate = Number(f.rate);
    return f;
  };
  const count = async () => {
    const f = filter();
    location.hash = "#/jobs" + query(f);
  };
  const form = h("form", { class: "filters panel", "data-testid": "job-filters", onsubmit: (e) => { e.preventDefault(); count(); } },
    field("topic", "Topic"), field("consumer", "Consumer"),
    h("label", {}, "Published since (UTC)", since), h("label", {}, "Until (UTC)", until),
    select("outcome", "Outcome", [["dead_lettered", "dead-lettered"], ["failed", "failed"]]),
    select("errorClass", "Error class", [["", "any"], ["transient", "transient"], ["permanent", "permanent"], ["poison", "poison"]]),
    field("errorCode", "Error code", { placeholder: "timeout" }), field("rate", "Events/s", { type: "number", min: "0.1", max: "100", step: "0.1", placeholder: "10" }),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", "data-testid": "job-count" }, "Count")));
  const list = h("div", { class: "panel", "data-testid": "jobs" }, h("p", { class: "muted" }, "Loading…"));
  const driving = new Set();
  const load = async () => {
    const v = state.view;
    const r = await api("GET", "/jobs");
    if (v !== state.view) return;
    if (r.status !== 200) { list.replaceChildren(notice(errorText(r), "error")); return; }
    list.replaceChildren(jobsTable(r.data.jobs, load));
    for (const j of r.data.jobs) {
      if (j.state === "running" && !driving.has(j.id) && can("operator", j.filter.topic, j.filter.consumer)) driveJob(j.id, v, driving, load);
    }
  };
  render(h("div", { class: "head" }, h("h1", {}, "Replay jobs"), h("span", { class: "spacer" })), form, result, list);
  if (p.topic && p.consumer && p.since && p.until) countJobs(p, form, filter, result, load);
  poll(load);
}

// countJobs shows the dry run's count and sample, and offers the job.
async function countJobs(p, form, filter, result, reload) {
  const f = filter();
  const dry = await api("POST", "/replays", Object.assign({}, f, { dryRun: true }));
  if (dry.status !== 200) { result.replaceChildren(notice(errorText(dry), "error")); return; }
  const n = dry.data.matched;
  const sample = h("table", { class: "list" }, h("tr", {}, h("th", {}, "Event"), h("th", {}, "Occurred"), h("th", {}, "Outcome"), h("th", {}, "Code")),
    ...dry.data.sample.map((x) => h("tr", { "data-testid": "job-sample" }, h("td", {}, eventLink(x.eventId)), h("td", {}, fmtTime(x.occurredAt)),
      h("td", {}, outcomeBadge(x.outcome)), h("td", { class: "mono" }, x.errorCode || ""))));
  const panel = h("div", { class: "panel" }, h("p", { "data-testid": "job-matched" }, n + " event(s) match (" + dry.data.scanned + " read); they go to " +
    f.consumer + " alone by " + dry.data.via + " at " + dry.data.rate + "/s."), n ? sample : "");
  if (n && can("operator", f.topic, f.consumer)) {
    panel.append(h("button", {
      type: "button", class: "primary", "data-testid": "job-start", onclick: async () => {
        if (!(await confirmAction("Replay " + n + " event(s) to " + f.consumer + "?", h("p", {}, n + " event(s) of " + f.topic + " go to " + f.consumer +
          " alone, at most " + dry.data.rate + " a second. The job stops if the count changed."), "Start the job"))) return;
        const r = await api("POST", "/replays", Object.assign({}, f, { expect: n }));
        result.replaceChildren(r.status === 200 ? notice("Job " + r.data.id + " started.") : notice(errorText(r), "error"));
        reload();
      },
    }, "Start a job…"));
  }
  result.replaceChildren(panel);
}

// driveJob drives a running job in slices while the view is current.
async function driveJob(id, view, driving, reload) {
  driving.add(id);
  try {
    while (view === state.view) {
      const r = await api("POST", "/jobs/" + encodeURIComponent(id) + ":run", { seconds: 5 });
      if (r.status !== 200 || r.data.state !== "running" || r.data.busy) break;
      if (view === state.view) reload();
    }
  } finally {
    driving.delete(id);
  }
  if (view === state.view) reload();
}

function jobsTable(jobs, reload) {
  if (!jobs.length) return h("p", { class: "muted" }, "No replay jobs yet.");
  return h("table", { class: "list" },
    h("tr", {}, h("th", {}, "Job"), h("th", {}, "State"), h("th", {}, "Filter"), h("th", { class: "num" }, "Sent"), h("th", { class: "num" }, "Failed"),
      h("th", { class: "num" }, "Remaining"), h("th", { class: "num" }, "Rate"), h("th", {}, "ETA"), h("th", {}, "")),
    ...jobs.map((j) => {
      const f = j.filter;
      const cancel = j.state === "running" && can("operator", f.topic, f.consumer) ? h("button", {
        type: "button", "data-testid": "job-cancel", onclick: async (e) => {
          const button = e.currentTarget;
          if (!(await confirmAction("Cancel job " + j.id + "?", h("p", {}, "It sends nothing more; what it sent stays sent."), "Cancel the job"))) return;
          const r = await api("POST", "/jobs/" + encodeURIComponent(j.id) + ":cancel");
          if (r.status !== 200) { button.replaceWith(notice(errorText(r), "error")); return; }
          reload();
        },
      }, "Cancel") : "";
      return h("tr", { "data-testid": "job-row", "data-job-id": j.id },
        h("td", { class: "mono small" }, j.id), h("td", {}, badge(j.state, "s-" + j.state, "job-state")),
        h("td", { class: "small" }, f.outcome + " of " + f.consumer + ", " + f.topic + " " + fmtTime(f.since) + " – " + fmtTime(f.until) +
          (f.errorClass ? ", " + f.errorClass : "") + (f.errorCode ? ", " + f.errorCode : "")),
        h("td", { class: "num", "data-testid": "job-sent" }, j.sent + "/" + j.matched), h("td", { class: "num" }, String(j.failed)),
        h("td", { class: "num", "data-testid": "job-remaining" }, String(j.remaining)), h("td", { class: "num" }, j.measuredRate.toFixed(1) + "/s"),
        h("td", {}, j.state === "running" && j.measuredRate ? Math.round(j.etaSeconds) + " s" : ""),
        h("td", {}, j.cancelledBy ? "cancelled by " + j.cancelledBy : cancel, j.lastError ? h("div", { class: "small warn" }, j.lastError) : ""));
    }));
}

// ------------------------------------------------------------ scheduled

// viewScheduled lists the outboxes' scheduled events not yet published
// and cancels one before it is due (an operator on its topic).
function viewScheduled() {
  const box = h("div", { "data-testid": "scheduled" }, h("p", { class: "muted" }, "Loading…"));
  const result = h("div", { "data-testid": "scheduled-result" });
  const load = async () => {
    const v = state.view;
    const r = await api("GET", "/scheduled");
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    box.replaceChildren(...scheduledBody(r.data, result, load));
  };
  render(h("div", { class: "head" }, h("h1", {}, "Scheduled"), h("span", { class: "spacer" }), liveToggle(load)), result, box);
  poll(load);
}

function scheduledBody(d, result, reload) {
  const out = [h("p", { class: "muted small" }, "Events with a deliverAt, held in the outbox until then; a scheduled version holds its aggregate's later versions. " +
    "Cancelling one (its aggregate's first unpublished version, before its time) means it is never published and the versions after it flow; a strict consumer sees the version missing.")];
  if (!d.scheduled.length) { out.push(h("p", { class: "empty", "data-testid": "no-scheduled" }, "Nothing scheduled.")); return out; }
  out.push(h("div", { class: "panel" }, h("table", {},
    h("tr", {}, h("th", {}, "Deliver at (UTC)"), h("th", {}, "Event"), h("th", {}, "Topic"), h("th", {}, "Aggregate"), h("th", { class: "num" }, "Version"), h("th", {}, "State"), h("th", {}, "")),
    ...d.scheduled.map((e) => {
      const row = h("tr", { "data-testid": "scheduled-row", "data-event-id": e.eventId },
        h("td", { class: "small" }, fmtTime(e.deliverAt)), h("td", {}, h("span", { class: "mono" }, e.eventId)), h("td", {}, e.topic),
        h("td", {}, e.aggregateType + " ", h("b", { class: "mono" }, e.aggregateId)), h("td", { class: "num" }, String(e.version)),
        h("td", { "data-testid": "scheduled-state" }, e.due ? h("span", { class: "tag warn" }, "due") : "waiting"), h("td", {}));
      if (!e.due && can("operator", e.topic)) {
        row.lastChild.append(h("button", { type: "button", class: "danger", "data-testid": "cancel-scheduled", onclick: async () => {
          const reason = h("input", { maxlength: 500, size: 48, placeholder: "why (kept in the audit log)", "data-testid": "cancel-reason" });
          if (!(await confirmAction("Cancel " + e.eventId + "?", [h("p", {}, e.aggregateType + " " + e.aggregateId + " version " + e.version +
            " is never published; the versions after it flow at once (or at their own time)."), h("p", {}, "Reason: ", reason)], "Cancel event"))) return;
          const r = await api("POST", "/scheduled/" + encodeURIComponent(e.eventId) + ":cancel", { reason: reason.value });
          result.replaceChildren(r.status === 200 ? notice("Cancelled " + r.data.eventId + ": it will never be published.") : notice(errorText(r), "error"));
          reload();
        } }, "Cancel…"));
      }
      return row;
    }))));
  return out;
}

// ------------------------------------------------------------ backfills

// viewBackfills lists the backfills (GET /backfills) with their progress,
// and pauses, resumes and cancels one (an operator on its topic or
// consumer). It does not drive them: `relaybus backfill run` or
// POST /backfills/{id}:run does.
function viewBackfills() {
  const box = h("div", { class: "panel", "data-testid": "backfills" }, h("p", { class: "muted" }, "Loading…"));
  const result = h("div", { "data-testid": "backfill-result" });
  const p = params();
  const load = async () => {
    const v = state.view;
    const r = await api("GET", "/backfills");
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    box.replaceChildren(backfillsTable(r.data.backfills, result, load));
  };
  render(h("div", { class: "head" }, h("h1", {}, "Backfills"), h("span", { class: "spacer" }), liveToggle(load)),
    h("p", { class: "muted small" }, "Each backfill delivers a topic's history to one consumer, in aggregate and version order, as re-pushes addressed to it. " +
      "It advances while something drives it (relaybus backfill run <id>); queued counts the events handed to the relay."),
    canAny("operator") ? backfillForm(p, result, load) : "", result, box);
  poll(load);
}

// backfillForm starts a backfill (POST /backfills): the count first (a
// dry run), then the backfill itself once confirmed. The Forwarders page
// links here with the topic and consumer filled in.
function backfillForm(p, result, reload) {
  const field = (name, label, attrs) => h("label", { "data-field": name }, label,
    h("input", Object.assign({ name, value: p[name] || "", "data-testid": "backfill-new-" + name }, attrs || {})));
  const form = h("form", {
    class: "filters panel", "data-testid": "backfill-form", novalidate: true, onsubmit: async (e) => {
      e.preventDefault();
      const f = Object.fromEntries(new FormData(form));
      const body = { topic: f.topic, consumer: f.consumer, since: toRFC3339(f.since), until: toRFC3339(f.until) };
      if (f.rate) body.rate = Number(f.rate);
      const dry = await api("POST", "/backfills", Object.assign({ dryRun: true }, body));
      showFieldErrors(form, dry);
      if (dry.status !== 200) { result.replaceChildren(notice(errorText(dry), "error")); return; }
      const n = dry.data.matched;
      if (!(await confirmAction("Backfill " + n + " event(s) to " + body.consumer + "?", h("p", {}, n + " event(s) of " + body.topic + " from " +
        fmtTime(dry.data.since) + " to " + fmtTime(dry.data.until) + " go to " + body.consumer + " alone, in order, at most " + dry.data.rate + " a second."), "Start the backfill"))) return;
      const r = await api("POST", "/backfills", body);
      showFieldErrors(form, r);
      result.replaceChildren(r.status === 200 ? notice("Backfill " + r.data.id + " created: " + r.data.matched + " event(s). It advances while something drives it: relaybus backfill run " + r.data.id)
        : notice(errorText(r), "error"));
      reload();
    },
  },
  field("topic", "Topic", { placeholder: "shop.order.events" }), field("consumer", "Consumer"),
  h("label", { "data-field": "since" }, "Since (UTC)", h("input", { type: "datetime-local", step: 1, name: "since", value: fromRFC3339(p.since), "data-testid": "backfill-new-since" })),
  h("label", { "data-field": "until" }, "Until (UTC, default now)", h("input", { type: "datetime-local", step: 1, name: "until", value: fromRFC3339(p.until), "data-testid": "backfill-new-until" })),
  field("rate", "Events/s", { type: "number", step: "1", placeholder: "default" }),
  h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", "data-testid": "backfill-start" }, "Start a backfill…")));
  return form;
}

// eta writes a number of seconds as "1 h 5 min", "3 min 20 s" or "12 s".
function eta(s) {
  s = Math.round(s);
  if (s >= 3600) return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  if (s >= 60) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return s + " s";
}

function backfillsTable(bfs, result, reload) {
  if (!bfs.length) return h("p", { class: "empty", "data-testid": "no-backfills" }, "No backfills yet.");
  const action = (b, name, label, cls) => h("button", {
    type: "button", class: cls || "", "data-testid": "backfill-" + name, onclick: async (e) => {
      const button = e.currentTarget;
      if (name === "cancel" && !(await confirmAction("Cancel backfill " + b.id + "?",
        h("p", {}, "Nothing more of it is queued; what it queued (" + b.queued + " of " + b.matched + ") still goes to " + b.consumer + "."), "Cancel the backfill"))) return;
      button.disabled = true;
      const r = await api("POST", "/backfills/" + encodeURIComponent(b.id) + ":" + name);
      result.replaceChildren(r.status === 200 ? notice("Backfill " + b.id + " is " + r.data.state + ".") : notice(errorText(r), "error"));
      reload();
    },
  }, label);
  return h("table", { class: "list" },
    h("tr", {}, h("th", {}, "Backfill"), h("th", {}, "State"), h("th", {}, "Scope"), h("th", { class: "num" }, "Queued"),
      h("th", { class: "num" }, "Rate"), h("th", {}, "ETA"), h("th", {}, "")),
    ...bfs.map((b) => {
      const buttons = [];
      if (can("operator", b.topic, b.consumer)) {
        if (b.state === "running") buttons.push(action(b, "pause", "Pause"));
        if (b.state === "paused") buttons.push(action(b, "resume", "Resume"));
        if (b.state === "running" || b.state === "paused") buttons.push(action(b, "cancel", "Cancel…", "danger"));
      }
      const pct = b.matched ? Math.floor((100 * b.queued) / b.matched) : 100;
      return h("tr", { "data-testid": "backfill-row", "data-backfill-id": b.id },
        h("td", { class: "mono small" }, b.id), h("td", {}, badge(b.state, "s-" + b.state, "backfill-state")),
        h("td", { class: "small" }, b.topic + " → ", h("b", {}, b.consumer), ", " + fmtTime(b.since) + " – " + fmtTime(b.until) +
          (b.aggregates.length ? ", " + b.aggregates.length + " aggregate(s)" : "") + ", at most " + b.rate + "/s"),
        h("td", { class: "num", "data-testid": "backfill-done" }, b.queued + "/" + b.matched + " (" + pct + "%)"),
        h("td", { class: "num", "data-testid": "backfill-rate" }, b.measuredRate ? b.measuredRate.toFixed(1) + "/s" : "–"),
        h("td", { "data-testid": "backfill-eta" }, b.state === "running" && b.measuredRate ? eta(b.etaSeconds) : b.state === "paused" && b.remaining ? "paused" : ""),
        h("td", {}, ...buttons.flatMap((x, i) => (i ? [" ", x] : [x]))));
    }));
}

// ----------------------------------------------------------- forwarders

// viewForwarders lists the forward consumers added at run time
// (GET /forwarders) with their delivery state from the consumers'
// registry, adds one (an admin), changes one or rotates its signing secret
// (an operator on it), removes one (an admin, confirmed), and links to a
// backfill of its topic's history.
function viewForwarders() {
  const box = h("div", { class: "panel", "data-testid": "forwarders" }, h("p", { class: "muted" }, "Loading…"));
  const result = h("div", { "data-testid": "forwarder-result" });
  const formBox = h("div", { "data-testid": "forwarder-form-box" });
  const topics = h("datalist", { id: "forwarder-topics" });
  const load = async () => {
    const v = state.view;
    const [r, c] = await Promise.all([api("GET", "/forwarders"), api("GET", "/consumers")]);
    if (v !== state.view) return;
    if (r.status !== 200) { box.replaceChildren(notice(errorText(r), "error")); return; }
    const entries = {};
    if (c.status === 200) {
      for (const x of c.data.consumers) entries[x.topic + "/" + x.consumerId] = x;
      const names = [...new Set(c.data.consumers.map((x) => x.topic))].sort();
      topics.replaceChildren(...names.map((t) => h("option", { value: t })));
    }
    box.replaceChildren(forwardersTable(r.data.forwarders, entries, { edit, remove, rotate }));
  };
  const done = (r, text) => {
    const out = [r.status === 200 ? notice(text) : notice(errorText(r), "error")];
    if (r.status === 200 && r.data.signingSecret) out.push(secretPanel(r.data.signingSecret));
    result.replaceChildren(...out);
  };
  const edit = (f) => {
    formBox.replaceChildren(forwarderForm(f, topics, async (body, form) => {
      const r = f ? await api("PATCH", "/forwarders/" + encodeURIComponent(f.name), body) : await api("POST", "/forwarders", body);
      showFieldErrors(form, r);
      if (r.status !== 200) { result.replaceChildren(notice(errorText(r), "error")); return; }
      formBox.replaceChildren();
      const g = r.data.forwarder;
      done(r, f ? (r.data.changed ? "Forwarder " + g.name + " changed (revision " + g.revision + "); the forwarders service applies it within seconds."
        : "Nothing changed.") : "Forwarder " + g.name + " added: it receives " + g.topic + "'s events from now on.");
      load();
    }, () => formBox.replaceChildren()));
    formBox.querySelector("input:not([disabled])").focus();
  };
  const remove = async (f) => {
    if (!(await confirmAction("Remove forwarder " + f.name + "?", [h("p", {}, "Its subscription " + f.subscription + " is deleted: delivery to " + f.url +
      " stops and the events waiting for it are dropped. The ledger stops expecting it on new events.")], "Remove"))) return;
    const r = await api("DELETE", "/forwarders/" + encodeURIComponent(f.name));
    done(r, "Forwarder " + f.name + " removed: its subscription is deleted and delivery has stopped.");
    load();
  };
  const rotate = async (f) => {
    if (!(await confirmAction("Rotate the signing secret of " + f.name + "?", [h("p", {}, "A new secret signs from now on and is shown once. " +
      "The current one signs beside it for 24 hours, so the target can switch without refusing a request.")], "Rotate"))) return;
    const r = await api("PATCH", "/forwarders/" + encodeURIComponent(f.name), { rotateSecret: true });
    done(r, "The signing secret of " + f.name + " is rotated.");
    load();
  };
  render(h("div", { class: "head" }, h("h1", {}, "Forwarders"), h("span", { class: "spacer" }),
    canAny("admin") ? h("button", { type: "button", class: "primary", "data-testid": "forwarder-add", onclick: () => edit(null) }, "Add a forwarder…") : "",
    liveToggle(load)),
  h("p", { class: "muted small" }, "Forward consumers added at run time: each POSTs its topic's events, as CloudEvents, to its URL, " +
    "with the inbox, ordering, retries and dead letters of a deployed consumer. One added receives the events published from then on; a backfill delivers the ones before."),
  topics, result, formBox, box);
  poll(load);
}

// forwarderForm is the add form (f null) or the change form of f, whose
// name, topic and filter are fixed. submit gets the body and the form.
function forwarderForm(f, topics, submit, cancel) {
  const v = f || { auth: "none" };
  const field = (name, label, attrs) => h("label", { "data-field": name }, label, h("input", Object.assign({
    name, value: v[name] === undefined || v[name] === 0 ? "" : String(v[name]), "data-testid": "forwarder-" + name, disabled: !!f && ["name", "topic", "filter"].includes(name),
  }, attrs || {})));
  const auth = h("select", { name: "auth", "data-testid": "forwarder-auth" }, ...[["none", "none"], ["google", "google (an ID token)"], ["hmac", "hmac (signed; a secret is made)"]]
    .map(([val, text]) => h("option", { value: val, selected: v.auth === val }, text)));
  const form = h("form", {
    class: "filters panel", "data-testid": "forwarder-form", novalidate: true, onsubmit: (e) => {
      e.preventDefault();
      const d = Object.fromEntries(new FormData(form));
      const num = (x) => (x === undefined || x === "" ? 0 : Number(x));
      const body = { url: d.url, auth: d.auth, audience: d.audience, maxInFlight: num(d.maxInFlight), maxPerSecond: num(d.maxPerSecond),
        timeoutSeconds: num(d.timeoutSeconds), description: d.description };
      if (!f) Object.assign(body, { name: d.name, topic: d.topic, filter: d.filter });
      submit(body, form);
    },
  },
  h("h2", {}, f ? "Change " + f.name : "Add a forwarder"),
  field("name", "Name", { placeholder: "crm-webhook" }), field("topic", "Topic", { list: topics.id, placeholder: "shop.order.events" }),
  field("url", "Target URL", { placeholder: "https://crm.example.com/hooks/orders" }), h("label", { "data-field": "auth" }, "Auth", auth),
  field("audience", "Audience (google; default the URL)"), field("filter", "Filter (fixed once added)", { placeholder: 'attributes.event_type = "order.purchased"' }),
  field("maxInFlight", "Max in flight (0: no bound)", { inputmode: "numeric" }), field("maxPerSecond", "Max per second (0: no limit)", { inputmode: "decimal" }),
  field("timeoutSeconds", "Timeout, s (0: 10 s)", { inputmode: "numeric" }), field("description", "Description"),
  h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", "data-testid": "forwarder-save" }, f ? "Save" : "Add"),
    h("button", { type: "button", "data-testid": "forwarder-cancel", onclick: cancel }, "Cancel")));
  return form;
}

// secretPanel shows a signing secret the API answered, the one time it does.
function secretPanel(s) {
  return h("div", { class: "panel", "data-testid": "signing-secret-panel" }, h("h2", {}, "Signing secret"),
    h("code", { class: "secret mono", "data-testid": "signing-secret" }, s.secret), h("p", { class: "small" }, s.note + "."),
    h("p", { class: "muted small" }, "The target checks each request's webhook-signature with it (docs/forwarding.md, Verifying a signature)."));
}

function forwardersTable(fs, entries, act) {
  if (!fs.length) return h("p", { class: "empty", "data-testid": "no-forwarders" }, "No forwarders yet.");
  const flow = (f) => [f.maxInFlight ? f.maxInFlight + " in flight" : "", f.maxPerSecond ? f.maxPerSecond + "/s" : "",
    f.timeoutSeconds ? "timeout " + f.timeoutSeconds + " s" : ""].filter(Boolean).join(", ") || "–";
  const stateOf = (f) => {
    const e = entries[f.topic + "/" + f.name];
    const paused = f.paused !== undefined ? f.paused : e && e.paused;
    const by = f.pausedBy || (e && e.pausedBy);
    if (paused) return badge("paused" + (by ? " by " + by : ""), "s-paused", "forwarder-state");
    if (!e) return h("span", { class: "muted", "data-testid": "forwarder-state" }, "unknown");
    return badge(e.enabled ? "enabled" : "disabled", e.enabled ? "s-running" : "s-cancelled", "forwarder-state");
  };
  const button = (label, testid, onclick, cls) => h("button", { type: "button", class: cls || "", "data-testid": testid, onclick }, label);
  return h("table", { class: "list" },
    h("tr", {}, h("th", {}, "Forwarder"), h("th", {}, "Topic"), h("th", {}, "Target URL"), h("th", {}, "Auth"), h("th", {}, "Filter"),
      h("th", {}, "Flow"), h("th", {}, "Changed"), h("th", {}, "State"), h("th", {}, "")),
    ...fs.map((f) => {
      const buttons = [];
      if (can("operator", f.topic, f.name)) {
        buttons.push(button("Change…", "forwarder-change", () => act.edit(f)));
        if (f.auth === "hmac") buttons.push(button("Rotate secret…", "forwarder-rotate", () => act.rotate(f)));
        buttons.push(h("a", { href: "#/backfills" + query({ topic: f.topic, consumer: f.name }), "data-testid": "forwarder-backfill" }, "Backfill…"));
      }
      if (can("admin", f.topic)) buttons.push(button("Remove…", "forwarder-remove", () => act.remove(f), "danger"));
      return h("tr", { "data-testid": "forwarder-row", "data-forwarder": f.name },
        h("td", {}, h("b", {}, f.name), f.description ? h("div", { class: "small muted" }, f.description) : ""),
        h("td", {}, f.topic), h("td", { class: "mono small", "data-testid": "forwarder-url" }, f.url),
        h("td", { "data-testid": "forwarder-auth-kind" }, f.auth + (f.auth === "google" && f.audience ? " (" + f.audience + ")" : ""),
          f.previousSecretUntil && new Date(f.previousSecretUntil) > Date.now() ? h("div", { class: "small muted" }, "previous secret signs until " + fmtTime(f.previousSecretUntil)) : ""),
        h("td", { class: "mono small" }, f.filter || "–"), h("td", { "data-testid": "forwarder-flow" }, flow(f)),
        h("td", { class: "small", "data-testid": "forwarder-changed" }, "added by " + f.createdBy + " " + fmtTime(f.createdAt),
          f.revision > 1 ? h("div", {}, "revision " + f.revision + " by " + f.updatedBy + " " + fmtTime(f.updatedAt)) : ""),
        h("td", {}, stateOf(f)), h("td", {}, ...buttons.flatMap((x, i) => (i ? [" ", x] : [x]))));
    }));
}

// ------------------------------------------------------------------ boot

document.getElementById("lookup").addEventListener("submit", (e) => {
  e.preventDefault();
  const id = document.getElementById("lookup-id").value.trim();
  if (id) location.hash = "#/events/" + encodeURIComponent(id);
});
window.addEventListener("hashchange", route);
loadWho().then(route);
