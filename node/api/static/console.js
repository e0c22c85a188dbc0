// The operator console: plain JavaScript over the JSON API, no library.
//
// Served with a strict Content-Security-Policy (node/api/cluster.py): no
// inline script or style, fetches to this origin only. Whatever the store
// holds (ids, labels, keys, payloads, errors) reaches the page through
// textContent and createElement only, never as HTML, so stored text cannot
// run as script whatever it contains.
//
// With AUTH=on, the API key is typed once and kept in sessionStorage (this
// tab only), sent as "Authorization: Bearer": no cookie, so no request the
// browser makes on its own carries it, and there is nothing to forge (CSRF).
"use strict";

const KEY_STORAGE = "scheduler-key";
const PREVIEW_CHARS = 2000; // the payload shown on a schedule's page
const PAGE_SIZE = 50;
const HISTORY_LIMIT = 20;
// The statuses each bulk verb changes (README "The API"): a status filter
// outside them is left out of the verb's selector.
const BULK_STATUSES = {
  pause: ["PENDING"],
  resume: ["PAUSED"],
  retry: ["DELIVERY_FAILED"],
  cancel: ["PENDING", "PAUSED"],
};
const FINDERS = ["labels", "key", "topic", "host"];

const $ = (id) => document.getElementById(id);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function show(node, visible) {
  node.hidden = !visible;
}

// -- the API ------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "http_error";
    this.field = error.field;
  }
}

function key() {
  return sessionStorage.getItem(KEY_STORAGE);
}

// One call: JSON in and out, the key as a Bearer token, If-Match when given.
async function api(method, path, {body, ifMatch} = {}) {
  const headers = {};
  const given = key();
  if (given) headers.Authorization = `Bearer ${given}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (ifMatch !== undefined) headers["If-Match"] = `"${ifMatch}"`;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
  });
  let answer = null;
  try {
    answer = await response.json();
  } catch (_) {
    answer = null;
  }
  if (response.status === 401) askForKey("This node has auth on: enter an API key.");
  if (!response.ok) throw new ApiError(response.status, answer);
  return answer;
}

function schedulePath(tenant, id, suffix = "") {
  // An id is [A-Za-z0-9._:-] (the API refuses anything else): ':' stays
  // literal, since the verbs are ":pause" and the like after it.
  const safe = encodeURIComponent(id).replace(/%3A/gi, ":");
  return `/v1/schedules/${safe}${suffix}?tenant=${encodeURIComponent(tenant)}`;
}

// -- the key and who it is ---------------------------------------------------

let admin = false;
let searched = false; // the browser's first listing is made once, when first shown

function notice(text) {
  $("notice").textContent = text || "";
  show($("notice"), Boolean(text));
}

function askForKey(text) {
  notice(text);
  $("key-input").focus();
}

function showKeyState() {
  const given = key();
  $("key-state").textContent = given ? `key …${given.slice(-4)} in use for this tab` : "";
  show($("key-forget"), Boolean(given));
  // A key acts for its own tenant only; with auth off the listing may name any.
  show($("tenant-filter"), !given);
}

// Which views this caller may see: /v1/cluster answers an admin tenant's
// key (or anyone with auth off), 403 to another tenant's.
async function whoAmI() {
  try {
    const view = await api("GET", "/v1/cluster");
    admin = true;
    $("self").textContent = view.self;
  } catch (_) {
    admin = false; // 403: a tenant's key; 401: none yet (the page asks)
    $("self").textContent = "";
  }
  show($("tab-cluster"), admin);
  show($("self-line"), admin);
}

$("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const given = $("key-input").value.trim();
  if (!given) return;
  sessionStorage.setItem(KEY_STORAGE, given);
  $("key-input").value = "";
  notice("");
  showKeyState();
  await whoAmI();
  searched = false;
  route();
});

$("key-forget").addEventListener("click", async () => {
  sessionStorage.removeItem(KEY_STORAGE);
  showKeyState();
  await whoAmI();
  searched = false;
  route();
});

// -- the schedule browser -----------------------------------------------------

let nextCursor = null;

function localToIso(value) {
  // datetime-local is the browser's local time: sent as UTC with its Z.
  return value ? new Date(value).toISOString() : "";
}

function filters() {
  const form = new FormData($("filters"));
  const value = (name) => String(form.get(name) || "").trim();
  return {
    status: value("status"),
    label: value("label"),
    key: value("key"),
    topic: value("topic"),
    host: value("host"),
    destination: value("destination"),
    dueAfter: localToIso(value("dueAfter")),
    dueBefore: localToIso(value("dueBefore")),
    tenant: value("tenant"),
  };
}

function listingQuery(f, after) {
  const query = new URLSearchParams();
  for (const name of ["status", "label", "key", "topic", "host", "destination", "dueAfter",
                      "dueBefore", "tenant"]) {
    if (f[name]) query.set(name, f[name]);
  }
  query.set("limit", String(PAGE_SIZE));
  if (after) query.set("after", after);
  else query.set("counts", "true");
  return query;
}

function labelChips(labels) {
  const cell = el("td");
  for (const [name, value] of Object.entries(labels || {})) {
    cell.append(el("span", `${name}=${value}`, "label"));
  }
  return cell;
}

function destinationOf(s) {
  return s.topic !== undefined ? `kafka ${s.topic}` : `http ${s.http ? s.http.url : ""}`;
}

function scheduleRow(s) {
  const tr = el("tr");
  tr.dataset.id = s.id;
  const link = el("a", s.id);
  link.href = `#/schedule/${encodeURIComponent(s.tenant)}/${encodeURIComponent(s.id)}`;
  const idCell = el("td");
  idCell.append(link);
  const status = el("td");
  status.append(el("span", s.status, `status ${s.status}`));
  tr.append(idCell, el("td", s.tenant), status, el("td", s.nextExecuteAt || s.executeAt),
            el("td", destinationOf(s)), labelChips(s.labels), el("td", s.attempts),
            el("td", s.version));
  return tr;
}

function showCounts(body) {
  if (!body.counts) return;
  const capped = new Set(body.countsCapped || []);
  const parts = Object.entries(body.counts)
    .filter(([, n]) => n > 0)
    .map(([status, n]) => `${status} ${capped.has(status) ? "≥" : ""}${n}`);
  $("counts").textContent = parts.length ? `Matches by status: ${parts.join(" · ")}` :
    "Matches by status: none";
}

let searches = 0; // only the latest search's answer is shown

async function search(after) {
  const f = filters();
  const mine = ++searches;
  try {
    const body = await api("GET", `/v1/schedules?${listingQuery(f, after)}`);
    if (mine !== searches) return;
    const rows = body.schedules.map(scheduleRow);
    if (after) $("rows").append(...rows);
    else {
      $("rows").replaceChildren(...rows);
      showCounts(body);
    }
    nextCursor = body.next;
    show($("next-page"), Boolean(nextCursor));
    show($("empty"), $("rows").children.length === 0);
    notice("");
  } catch (error) {
    if (error.status !== 401) notice(`The listing was refused: ${error.message}`);
  }
}

$("filters").addEventListener("submit", (event) => {
  event.preventDefault();
  resetBulk();
  search(null);
});
$("next-page").addEventListener("click", () => search(nextCursor));

// -- bulk verbs by selector: a dry run, then a confirmation ---------------------

let pendingBulk = null;

function selector(verb) {
  const f = filters();
  const body = {};
  if (f.label) {
    const [name, ...rest] = f.label.split("=");
    body.labels = {[name]: rest.join("=")};
  }
  for (const name of ["key", "topic", "host", "destination", "tenant"]) {
    if (f[name]) body[name] = f[name];
  }
  if (f.dueBefore) body.dueBefore = f.dueBefore;
  if (f.status && BULK_STATUSES[verb].includes(f.status)) body.status = f.status;
  return body;
}

function resetBulk() {
  pendingBulk = null;
  $("bulk-result").textContent = "";
  show($("bulk-confirm"), false);
  show($("bulk-abort"), false);
}

$("bulk-count").addEventListener("click", async () => {
  resetBulk();
  const verb = $("bulk-verb").value;
  const body = selector(verb);
  if (!FINDERS.some((name) => name in body)) {
    $("bulk-result").textContent = "Name a label, key, topic or host first: a bulk verb " +
      "never reads a whole tenant.";
    return;
  }
  try {
    const counted = await api("POST", `/v1/schedules:${verb}`, {body: {...body, dryRun: true}});
    const many = `${counted.matched}${counted.more ? "+" : ""}`;
    $("bulk-result").textContent = `${many} schedules match and would be changed by ${verb}.`;
    if (counted.matched > 0) {
      pendingBulk = {verb, body};
      $("bulk-confirm").textContent = `Yes, ${verb} ${many} schedules`;
      show($("bulk-confirm"), true);
      show($("bulk-abort"), true);
    }
  } catch (error) {
    $("bulk-result").textContent = `Refused: ${error.message}`;
  }
});

$("bulk-abort").addEventListener("click", resetBulk);

$("bulk-confirm").addEventListener("click", async () => {
  if (!pendingBulk) return;
  const {verb, body} = pendingBulk;
  resetBulk();
  try {
    const done = await api("POST", `/v1/schedules:${verb}`, {body});
    $("bulk-result").textContent =
      `${verb}: ${done.matched} matched, ${done.changed} changed` +
      (done.more ? "; more remain (or are in flight): count again and repeat." : ".");
    search(null);
  } catch (error) {
    $("bulk-result").textContent = `Refused: ${error.message}`;
  }
});

// -- one schedule -------------------------------------------------------------

let shown = null; // the schedule as this page last read it

const VERB_STATUSES = {
  pause: ["PENDING"],
  resume: ["PAUSED"],
  trigger: ["PENDING"],
  retry: ["DELIVERY_FAILED"],
  cancel: ["PENDING", "PAUSED"],
};

function fieldRows(s) {
  const rows = [
    ["tenant", s.tenant],
    ["destination", destinationOf(s)],
    ["executeAt", s.executeAt],
    ["nextExecuteAt", s.nextExecuteAt],
    ["nextAttemptAt", s.nextAttemptAt],
    ["recurrence", s.recurrence ? JSON.stringify(s.recurrence) : undefined],
    ["attempts", s.attempts],
    ["key", s.key],
    ["priority", s.priority],
    ["headers", Object.keys(s.headers || {}).length ? JSON.stringify(s.headers) : undefined],
    ["bucket", s.bucket],
    ["createdAt", s.createdAt],
    ["deliveredAt", s.deliveredAt],
    ["pausedAt", s.pausedAt],
    ["cancelledAt", s.cancelledAt],
    ["expiredAt", s.expiredAt],
    ["triggeredAt", s.triggeredAt],
    ["expireAfter", s.expireAfter],
    ["deadline", s.deadline],
    ["retry", s.retry ? JSON.stringify(s.retry) : undefined],
    ["flowControl", s.flowControl ? JSON.stringify(s.flowControl) : undefined],
    ["lastError", s.lastError],
    ["requestId", s.requestId],
  ];
  const trs = rows
    .filter(([, value]) => value !== undefined && value !== null)
    .map(([name, value]) => {
      const tr = el("tr");
      tr.dataset.field = name;
      tr.append(el("th", name), el("td", value));
      return tr;
    });
  const labels = el("tr");
  labels.dataset.field = "labels";
  labels.append(el("th", "labels"), labelChips(s.labels));
  trs.push(labels);
  return trs;
}

function payloadText(s) {
  if (s.payload !== undefined) return JSON.stringify(s.payload, null, 2);
  if (s.payloadBase64 !== undefined) return s.payloadBase64;
  return "";
}

function showPayload(s) {
  const text = payloadText(s);
  const kind = s.payloadBase64 !== undefined ? "bytes, shown as base64" : "bytes of JSON";
  const cut = text.length > PREVIEW_CHARS;
  $("s-payload").textContent = cut ? `${text.slice(0, PREVIEW_CHARS)}\n…` : text;
  $("s-payload-size").textContent = `${s.payloadBytes} ${kind}` +
    (cut ? `; the first ${PREVIEW_CHARS} characters shown` : "");
}

function showEditForm(s) {
  const form = $("s-edit");
  form.elements.executeAt.value = s.executeAt;
  const text = s.payload !== undefined ? JSON.stringify(s.payload, null, 2) : "";
  const editable = s.payload !== undefined && text.length <= PREVIEW_CHARS;
  form.elements.payload.value = editable ? text : "";
  form.elements.payload.disabled = !editable;
  $("s-edit-note").textContent = editable ? "" :
    "The payload is too large or binary to edit here: PATCH it through the API.";
  const changeable = ["PENDING", "PAUSED"].includes(s.status);
  show(form, changeable);
}

function showSchedule(s) {
  shown = s;
  $("s-id").textContent = s.id;
  $("s-status").textContent = s.status;
  $("s-status").className = `status ${s.status}`;
  $("s-version").textContent = s.version;
  $("s-field-rows").replaceChildren(...fieldRows(s));
  for (const button of $("s-actions").querySelectorAll("button[data-verb]")) {
    button.disabled = !VERB_STATUSES[button.dataset.verb].includes(s.status);
  }
  showPayload(s);
  showEditForm(s);
}

function showHistory(body) {
  const rows = body.history.map((r) => {
    const tr = el("tr");
    tr.append(el("td", r.at), el("td", r.executeAt), el("td", r.attempt), el("td", r.outcome),
              el("td", r.node), el("td", r.token), el("td", r.error));
    return tr;
  });
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", "No delivery attempt yet.", "muted");
    td.colSpan = 7;
    tr.append(td);
    rows.push(tr);
  }
  $("s-history").replaceChildren(...rows);
}

function scheduleMessage(text, ok) {
  $("s-message").textContent = text || "";
  $("s-message").className = ok ? "ok" : "";
  show($("s-message"), Boolean(text));
}

async function loadSchedule(tenant, id) {
  try {
    const [s, history] = await Promise.all([
      api("GET", schedulePath(tenant, id)),
      api("GET", `${schedulePath(tenant, id, "/history")}&limit=${HISTORY_LIMIT}`),
    ]);
    showSchedule(s);
    showHistory(history);
    notice("");
    return s;
  } catch (error) {
    if (error.status !== 401) notice(`Schedule ${id}: ${error.message}`);
    return null;
  }
}

// A change sent with If-Match of the version on screen: 412 means someone
// (a person, a bulk verb, or delivery itself) changed it since.
async function change(method, suffix, body, done) {
  const s = shown;
  if (!s) return;
  try {
    const after = await api(method, schedulePath(s.tenant, s.id, suffix), {body, ifMatch: s.version});
    await loadSchedule(after.tenant, after.id);
    scheduleMessage(`${done}: now ${after.status}, version ${after.version}.`, true);
  } catch (error) {
    if (error.status === 412) {
      const now = await loadSchedule(s.tenant, s.id);
      const at = now ? ` It is now at version ${now.version}, ${now.status}.` : "";
      scheduleMessage(
        `Not changed: the schedule changed since this page showed version ${s.version}.${at} ` +
        "The page shows it as it is now: check it and try again.");
    } else {
      scheduleMessage(`Not changed: ${error.message} (${error.code}).`);
    }
  }
}

const VERB_CALLS = {
  pause: ["POST", ":pause", "Paused"],
  resume: ["POST", ":resume", "Resumed"],
  trigger: ["POST", ":trigger", "Triggered"],
  retry: ["POST", ":retry", "Redriven"],
  cancel: ["DELETE", "", "Cancelled"],
};

for (const button of $("s-actions").querySelectorAll("button[data-verb]")) {
  button.addEventListener("click", () => {
    const [method, suffix, done] = VERB_CALLS[button.dataset.verb];
    change(method, suffix, undefined, done);
  });
}

$("s-reload").addEventListener("click", () => {
  scheduleMessage("");
  if (shown) loadSchedule(shown.tenant, shown.id);
});

$("s-edit").addEventListener("submit", (event) => {
  event.preventDefault();
  const s = shown;
  const form = event.target;
  const patch = {};
  const executeAt = form.elements.executeAt.value.trim();
  if (executeAt && executeAt !== s.executeAt) patch.executeAt = executeAt;
  if (!form.elements.payload.disabled) {
    const text = form.elements.payload.value;
    if (text.trim() !== JSON.stringify(s.payload, null, 2).trim()) {
      try {
        patch.payload = JSON.parse(text);
      } catch (error) {
        scheduleMessage(`Not sent: the payload is not JSON (${error.message}).`);
        return;
      }
    }
  }
  if (!Object.keys(patch).length) {
    scheduleMessage("Nothing changed: edit executeAt or the payload first.");
    return;
  }
  change("PATCH", "", patch, "Changed");
});

// -- the cluster view (admin) -------------------------------------------------

const COLOURS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b",
                 "#b279a2", "#ff9da6", "#9d755d", "#bab0ac"];
const colour = {};
function colourOf(member) {
  if (member === null || member === undefined) return "#ddd";
  if (!(member in colour)) colour[member] = COLOURS[Object.keys(colour).length % COLOURS.length];
  return colour[member];
}

function memberRow(m, held) {
  const tr = el("tr");
  tr.dataset.member = m.id;
  tr.dataset.state = m.state;
  const swatch = el("span", "", "swatch");
  swatch.style.background = colourOf(m.id); // CSSOM, which the policy allows
  const swatchCell = el("td");
  swatchCell.append(swatch);
  const name = el("td");
  if (m.http) {
    const a = el("a", m.id);
    a.href = `http://${m.http}/#/cluster`;
    name.append(a);
  } else name.textContent = m.id;
  tr.append(swatchCell, name, el("td", m.state, m.state), el("td", m.address),
            el("td", held[m.id] || 0), el("td", `v${m.placementVersion}`));
  return tr;
}

function showCluster(view, backlog) {
  $("self").textContent = view.self;
  $("drain-node").textContent = view.self;
  const held = {};
  for (const o of view.buckets.owners) if (o.owner) held[o.owner] = (held[o.owner] || 0) + 1;
  const members = view.members.slice().sort((a, b) => a.id.localeCompare(b.id));
  $("members").replaceChildren(...members.map((m) => memberRow(m, held)));

  const due = backlog ? backlog.dueNow : {};
  const cells = view.buckets.owners.map((o) => {
    const div = el("div");
    div.style.background = colourOf(o.owner);
    const waiting = due[o.bucket] || 0;
    if (o.placed && o.owner !== o.placed) div.className = "moving";
    if (waiting) div.className = "backlog";
    div.title = `bucket ${o.bucket}: ${o.owner || "no owner"}, token ${o.token}` +
                (o.owner !== o.placed ? `, placed on ${o.placed}` : "") +
                (waiting ? `, ${waiting} due now` : "");
    return div;
  });
  $("buckets").replaceChildren(...cells);
  const b = view.buckets;
  $("bucket-summary").textContent =
    `${b.count} in all; this node holds ${b.held} and wants ${b.wanted}; ` +
    (b.settled ? "settled" : "moving");
  $("backlog-total").textContent = backlog ? `${backlog.total} schedules` : "unknown";
}

function showLateness(metrics) {
  // Cumulative Prometheus buckets -> per-bucket counts.
  const bounds = [];
  for (const line of metrics.split("\n")) {
    const m = line.match(/^scheduler_delivery_lateness_seconds_bucket\{.*le="([^"]+)".*\} (\S+)$/);
    if (m) bounds.push([m[1] === "+Inf" ? Infinity : parseFloat(m[1]), parseFloat(m[2])]);
  }
  bounds.sort((a, b) => a[0] - b[0]);
  let previous = 0;
  const counts = bounds.map(([le, cumulative]) => {
    const n = cumulative - previous;
    previous = cumulative;
    return [le, n];
  });
  const top = Math.max(1, ...counts.map((c) => c[1]));
  const bars = counts.map(([le, n]) => {
    const div = el("div");
    div.style.height = `${Math.max(1, (100 * n) / top)}px`;
    div.title = `${n} delivered within ${le === Infinity ? "more" : le + " s"}`;
    div.append(el("span", le === Infinity ? "more" : `≤${le}s`));
    return div;
  });
  $("histogram").replaceChildren(...bars);
  $("lateness-count").textContent = `${previous} deliveries by this node`;
}

async function refreshCluster() {
  const status = $("status");
  try {
    const [view, backlog, metrics] = await Promise.all([
      api("GET", "/v1/cluster"),
      api("GET", "/v1/cluster/backlog").catch(() => null),
      fetch("/metrics", {credentials: "omit", cache: "no-store"}).then((r) => r.text()),
    ]);
    showCluster(view, backlog);
    showLateness(metrics);
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.className = "";
  } catch (error) {
    status.textContent = `this node does not answer (${error.message})`;
    status.className = "stale";
  }
}

// By status, from the store: counted every 10 s at most (the node caches it).
async function refreshCounts() {
  try {
    const body = await api("GET", "/v1/cluster/counts");
    $("status-counts").textContent =
      Object.entries(body.counts).map(([status, n]) => `${status} ${n}`).join(" · ") +
      ` (${body.buckets} buckets)`;
  } catch (error) {
    $("status-counts").textContent = `unknown (${error.message})`;
  }
}

$("drain").addEventListener("click", () => show($("drain-confirm"), true));
$("drain-confirm").addEventListener("click", async () => {
  show($("drain-confirm"), false);
  try {
    const body = await api("POST", "/v1/admin/drain");
    $("drain-result").textContent = `${body.node} is ${body.state}.`;
  } catch (error) {
    $("drain-result").textContent = `Refused: ${error.message}`;
  }
});

// -- routing: #/schedules, #/schedule/TENANT/ID, #/cluster ---------------------

let timers = [];

function stopTimers() {
  for (const timer of timers) clearInterval(timer);
  timers = [];
}

function showView(name) {
  for (const view of ["schedules", "schedule", "cluster"]) show($(`view-${view}`), view === name);
  $("tab-schedules").className = name === "cluster" ? "" : "current";
  $("tab-cluster").className = name === "cluster" ? "current" : "";
}

function route() {
  stopTimers();
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  if (parts[0] === "schedule" && parts.length === 3) {
    showView("schedule");
    scheduleMessage("");
    loadSchedule(decodeURIComponent(parts[1]), decodeURIComponent(parts[2]));
    return;
  }
  if (parts[0] === "cluster") {
    if (!admin) {
      showView("schedules");
      notice("The cluster view needs an admin tenant's API key.");
      return;
    }
    showView("cluster");
    refreshCluster();
    refreshCounts();
    timers.push(setInterval(refreshCluster, 1000), setInterval(refreshCounts, 10000));
    return;
  }
  showView("schedules");
  if (!searched) {
    searched = true;
    search(null);
  }
}

window.addEventListener("hashchange", route);

async function start() {
  showKeyState();
  await whoAmI();
  route();
}
start();
