// The celery-pq dashboard page: fetches /api/state every REFRESH_MS and draws it.
// No library: the DOM is built with textContent only (queue and tenant names are data, never
// markup), the histogram and the shares are inline SVG. Every figure carries data-queue and
// data-stat (and data-value, the raw number), so a test can read the page without parsing text.
"use strict";

const REFRESH_MS = 1500;
const TENANTS_SHOWN = 20;  // busiest first: waiting + leased + delivered in the window
const SVG = "http://www.w3.org/2000/svg";
let token = sessionStorage.getItem("pq-token") || "";
let refreshes = 0;
let actionError = "", actionErrorUntil = 0;  // an action's error stays up for a while (or a new token)

// The token may come in the address's fragment (/#token=...), at load or later.
function takeTokenFromAddress() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!m) return;
  token = decodeURIComponent(m[1]);
  sessionStorage.setItem("pq-token", token);
  history.replaceState(null, "", location.pathname);  // the token leaves the address bar
  document.getElementById("token-form").hidden = true;
  actionErrorUntil = 0;
  showError("");
}
takeTokenFromAddress();
window.addEventListener("hashchange", takeTokenFromAddress);

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function seconds(s) {
  if (s === null || s === undefined) return "-";
  if (Math.abs(s) < 60) return s.toFixed(1) + " s";
  if (Math.abs(s) < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function figure(queue, stat, value, label, text) {
  return el("div", { class: "fig" },
    el("b", { "data-queue": queue, "data-stat": stat, "data-value": value === null ? "" : value },
       text !== undefined ? text : value),
    el("span", {}, label));
}

function table(headers, rows) {
  const head = el("tr", {}, ...headers.map(([h, cls]) => el("th", { class: cls }, h)));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
}

// An id in short (a task id is a 36-character UUID); the whole of it on hover.
function idCell(id) {
  return el("td", { class: "id", title: id }, id.length > 12 ? id.slice(0, 8) + "…" : id);
}

function button(action, queue, tenant, label) {
  return el("button", { type: "button", "data-action": action, "data-queue": queue,
                        "data-tenant": tenant === null ? undefined : tenant }, label);
}

// Waiting entries per priority, in serving order (served first on the left), as bars.
function histogram(q) {
  // A JS object lists integer keys in ascending order whatever the JSON said: sort again.
  const first = q.priority_order === "lower_first" ? 1 : -1;
  const per = Object.entries(q.stats.per_priority).map(([p, n]) => [Number(p), n]).sort((a, b) => first * (a[0] - b[0]));
  if (!per.length) return el("p", { class: "empty" }, "no waiting entries");
  const width = 420, height = 130, base = 110;
  const max = Math.max(...per.map(([, n]) => n));
  const slot = Math.min(59, width / per.length), gap = Math.min(3, slot * 0.2), w = slot - gap;
  const left = (width - per.length * slot) / 2;
  const svg = el("svg:svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img",
                              "data-queue": q.queue, "data-chart": "priorities",
                              "aria-label": "waiting entries per priority" });
  per.forEach(([p, n], i) => {
    const h = max ? Math.max(1, (n / max) * (base - 16)) : 0, x = left + i * slot;
    const g = el("svg:g", { class: "bar", "data-priority": p, "data-count": n },
      el("svg:title", {}, `priority ${p}: ${n}`),
      el("svg:rect", { class: "bar", x, y: base - h, width: w, height: h }));
    if (per.length <= 24) {
      g.append(el("svg:text", { x: x + w / 2, y: base - h - 3, "text-anchor": "middle" }, n),
               el("svg:text", { x: x + w / 2, y: base + 12, "text-anchor": "middle" }, p));
    }
    svg.append(g);
  });
  return svg;
}

// Tenants: backlog from stats, share of the window's deliveries as a bar; the busiest TENANTS_SHOWN.
function tenants(q, actions) {
  const per = q.stats.per_tenant || {}, shares = q.deliveries.tenants || {};
  const paused = new Set(q.stats.paused_tenants || []);
  const load = (t) => (per[t] ? per[t].waiting + per[t].leased : 0) + (shares[t] ? shares[t].deliveries : 0);
  const all = [...new Set([...Object.keys(per), ...Object.keys(shares), ...paused])]
    .sort((a, b) => load(b) - load(a) || (a < b ? -1 : a > b ? 1 : 0));
  if (!all.length) return el("p", { class: "empty" }, q.fair ? "no tenant has work" : "not a fair queue");
  const names = all.slice(0, TENANTS_SHOWN);  // the busiest ones; the JSON has them all
  // fair_cost="time": each tenant's share of the worker time (leases held) of the last minutes
  const timed = Object.values(per).some((r) => r.worker_ms !== undefined);
  const recent = Object.values(per).reduce((n, r) => n + (r.recent_worker_ms || 0), 0);
  const worker = (t) => (recent && per[t] ? (per[t].recent_worker_ms || 0) / recent : 0);
  const rows = names.map((t) => {
    const b = per[t] || { waiting: 0, leased: 0 }, s = shares[t] || { deliveries: 0, share: 0 };
    const bar = el("svg:svg", { viewBox: "0 0 100 10", width: 100, height: 10 },
      el("svg:rect", { class: "track", x: 0, y: 0, width: 100, height: 10 }),
      el("svg:rect", { class: "bar", x: 0, y: 0, width: (100 * s.share).toFixed(1), height: 10 }));
    const act = actions.length && q.fair
      ? button(paused.has(t) ? "resume" : "pause", q.queue, t, paused.has(t) ? "resume" : "pause") : null;
    return el("tr", { "data-queue": q.queue, "data-tenant": t, "data-paused": paused.has(t) },
      el("td", {}, t || "(default)", paused.has(t) ? " ⏸" : ""),
      el("td", { class: "num", "data-stat": "waiting", "data-value": b.waiting }, b.waiting),
      el("td", { class: "num", "data-stat": "leased", "data-value": b.leased }, b.leased),
      el("td", { class: "num", "data-stat": "deliveries", "data-value": s.deliveries }, s.deliveries),
      el("td", { "data-stat": "share", "data-value": s.share }, bar, " ", (100 * s.share).toFixed(0) + "%"),
      timed ? el("td", { class: "num", "data-stat": "worker-share", "data-value": worker(t) },
        (100 * worker(t)).toFixed(0) + "%") : null,
      act ? el("td", {}, act) : null);
  });
  const headers = [["tenant"], ["waiting", "num"], ["leased", "num"], ["delivered", "num"], ["share"]];
  if (timed) headers.push(["worker time", "num"]);
  if (actions.length && q.fair) headers.push([""]);
  const more = all.length - names.length;
  return el("div", {}, table(headers, rows),
    more > 0 ? el("p", { class: "empty", "data-more-tenants": more }, `and ${more} more tenants (in /api/state)`) : null);
}

function leases(q) {
  if (!q.leases.length) return el("p", { class: "empty" }, "no leases in flight");
  return table([["id"], ["consumer"], ["priority", "num"], ["tenant"], ["deliveries", "num"], ["age", "num"], ["expires in", "num"]],
    q.leases.map((l) => el("tr", { "data-lease": l.id },
      idCell(l.id), el("td", {}, l.consumer), el("td", { class: "num" }, l.priority),
      el("td", {}, l.tenant === null ? "" : l.tenant), el("td", { class: "num" }, l.deliveries),
      el("td", { class: "num" }, seconds(l.age_seconds)), el("td", { class: "num" }, seconds(l.seconds_left)))));
}

function deadLetters(q, actions) {
  if (!q.dead_letters.length) return el("p", { class: "empty" }, "none");
  const replay = actions.includes("replay");
  const headers = [["id"], ["reason"], ["priority", "num"], ["tenant"], ["dead for", "num"]];
  if (replay) headers.push([""]);
  return table(headers,
    q.dead_letters.map((d) => el("tr", { "data-dead": d.id },
      idCell(d.id), el("td", { "data-stat": "reason" }, d.reason || ""), el("td", { class: "num" }, d.priority),
      el("td", {}, d.tenant === null ? "" : d.tenant), el("td", { class: "num" }, seconds(d.age_seconds)),
      replay ? el("td", {}, el("button", { type: "button", "data-action": "replay", "data-queue": q.queue,
                                           "data-id": d.id, title: "back to the queue" }, "replay")) : null)));
}

function panel(title, body) {
  return el("div", { class: "panel" }, el("h3", {}, title), body);
}

function queueSection(q, actions) {
  const s = q.stats, paused = !!s.paused, d = q.deliveries;
  const title = el("h2", {}, q.queue,
    el("span", { class: "badge " + (paused ? "paused" : "running"), "data-queue": q.queue, "data-stat": "paused",
                 "data-value": paused }, paused ? "paused" : "delivering"),
    el("span", { class: "badge" }, q.priority_order === "lower_first" ? "0 first" : "255 first"),
    q.fair ? el("span", { class: "badge" }, "fair") : null);
  if (actions.length) {
    title.append(el("span", { class: "actions" },
      button(paused ? "resume" : "pause", q.queue, null, paused ? "resume queue" : "pause queue")));
  }
  const figures = el("div", { class: "figures" },
    figure(q.queue, "waiting", s.waiting, "waiting"),
    figure(q.queue, "delayed", s.delayed, "delayed"),
    figure(q.queue, "leased", s.leased, "leased"),
    figure(q.queue, "dead", s.dead, "dead letters"),
    figure(q.queue, "head_age_seconds", s.head_age_seconds, "oldest waiting", seconds(s.head_age_seconds)),
    figure(q.queue, "delivered_per_second", d.per_second,
           `delivered/s (last ${seconds(d.span_seconds)})`, d.per_second === null ? "-" : d.per_second.toFixed(1)));
  return el("section", { class: "queue", "data-queue": q.queue }, title, figures,
    el("div", { class: "panels" },
      panel("priorities (waiting)", histogram(q)),
      panel("tenants", tenants(q, actions)),
      panel(`leases in flight (${s.leased})`, leases(q)),
      panel(`dead letters (${s.dead}; newest)`, deadLetters(q, actions))));
}

function showError(text) {
  const box = document.getElementById("error");
  box.textContent = text || "";
  box.hidden = !text;
}

let actions = [];

function render(state) {
  actions = state.actions || [];
  document.getElementById("mode").textContent = actions.length ? "actions allowed" : "read-only";
  document.getElementById("window").textContent = seconds(state.window_seconds);
  document.getElementById("token-form").hidden = !(actions.length && !token);
  const main = document.getElementById("queues");
  const sections = state.queues.map((q) => queueSection(q, actions));
  main.replaceChildren(...(sections.length ? sections : [el("p", { class: "empty" }, "no queues")]));
  const updated = document.getElementById("updated");
  refreshes += 1;
  updated.dataset.updated = String(refreshes);
  updated.textContent = "updated " + new Date().toLocaleTimeString();
}

async function refresh() {
  try {
    // beyond loopback the state, too, needs the token (401 without it: ask for it)
    const reply = await fetch("api/state", { cache: "no-store", headers: token ? { "X-PQ-Token": token } : {} });
    const body = await reply.json();
    if (reply.status === 401) {
      token = "";
      sessionStorage.removeItem("pq-token");
      document.getElementById("token-form").hidden = false;
    }
    if (!reply.ok) throw new Error(body.error || reply.statusText);
    render(body);
    showError(Date.now() < actionErrorUntil ? actionError : "");
  } catch (err) {
    showError("cannot refresh: " + err.message);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

async function act(action, request) {
  const reply = await fetch("api/" + action, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-PQ-Token": token },
    body: JSON.stringify(request),
  });
  const body = await reply.json().catch(() => ({}));
  actionError = reply.ok ? "" : `${action} ${request.queue}: ${body.error || reply.statusText}`;
  actionErrorUntil = Date.now() + 10000;
  if (reply.status === 403 && actions.length) {  // a wrong token: ask for it again
    token = "";
    sessionStorage.removeItem("pq-token");
  }
  showError(actionError);
}

document.getElementById("queues").addEventListener("click", (ev) => {
  const b = ev.target.closest("button[data-action]");
  if (!b) return;
  b.disabled = true;
  const request = { queue: b.dataset.queue };
  if (b.dataset.action === "replay") request.ids = [b.dataset.id];
  else request.tenant = b.dataset.tenant === undefined ? null : b.dataset.tenant;
  act(b.dataset.action, request)
    .catch((err) => showError(`${b.dataset.action} ${request.queue}: ${err.message}`))
    .finally(() => { b.disabled = false; });  // pressed again after a refusal, before a redraw
});

document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = document.getElementById("token-input").value;
  sessionStorage.setItem("pq-token", token);
  document.getElementById("token-form").hidden = true;
  actionErrorUntil = 0;
  showError("");
});

refresh();
