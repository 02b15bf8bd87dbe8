// The node's console: runs SQL through the same public API as any client (POST /v1/sql,
// GET /v1/stores, GET /v1/metadata), so what it shows is what a client would get.
"use strict";

const PAGE_ROWS = 50;
const HISTORY_KEY = "federator.history";
const HISTORY_MAX = 50;
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// A node with --users-file wants a bearer token on every API call: the page asks for one when
// a call is refused (401) and keeps it for this tab only (sessionStorage), never in the URL.
const AUTH_KEY = "federator.auth";

async function call(path, init = {}) {
  const token = sessionStorage.getItem(AUTH_KEY);
  const headers = {...(init.headers || {}), ...(token ? {Authorization: "Bearer " + token} : {})};
  const resp = await fetch(path, {...init, headers});
  if (resp.status === 401) {
    $("login").hidden = false;
    $("login-why").textContent = token ? "That token was refused; paste another." : "This node asks for a token.";
  }
  return resp;
}

function signIn() {
  sessionStorage.setItem(AUTH_KEY, $("auth-token").value.trim());
  $("auth-token").value = "";
  $("login").hidden = true;
  route();
}

async function getJson(path) {
  const resp = await call(path, {headers: {Accept: "application/json"}});
  const body = await resp.json().catch(() => ({error: {code: "HTTP_" + resp.status, message: resp.statusText}}));
  if (!resp.ok || body.error) throw body.error || {code: "HTTP_" + resp.status, message: resp.statusText};
  return body;
}

// ---- the query page ---------------------------------------------------------------------

function requestBody(sql) {
  const body = {sql, timeout_ms: Number($("timeout").value) || 10000};
  const params = $("parameters").value.trim();
  if (params) body.parameters = JSON.parse(params);  // a bad list is reported before sending
  if ($("token").value.trim()) body.consistency_token = $("token").value.trim();
  if ($("dialect").value.trim()) body.dialect = $("dialect").value.trim();
  if ($("stale").checked) body.allow_stale = true;
  if ($("maxlag").value !== "") body.max_lag = Number($("maxlag").value);
  return body;
}

async function postSql(body, format) {
  return call("/v1/sql", {method: "POST", headers: {"Content-Type": "application/json"},
                          body: JSON.stringify({...body, format})});
}

function showError(where, err) {
  const at = err.line ? ` (line ${err.line}, column ${err.col})` : "";
  const parts = err.partitions ? `\npartitions: ${JSON.stringify(err.partitions)}` : "";
  where.replaceChildren(el("div", {class: "error"}, `${err.code || "ERROR"}: ${err.message || err}${at}${parts}`));
}

let answer = null;  // the last JSON answer, paged locally

async function run(explain) {
  const sql = $("sql").value.trim();
  if (!sql) return;
  let body;
  try {
    body = requestBody(explain ? "EXPLAIN " + sql : sql);
  } catch (e) {
    showError($("answer"), {code: "INVALID_PARAMETER", message: "Parameters must be a JSON list, e.g. [\"p001\", 3]: " + e.message});
    return;
  }
  remember(sql);
  $("status").textContent = "running…";
  $("answer").replaceChildren();
  $("pager").replaceChildren();
  const started = performance.now();
  const resp = await postSql(body, "json");
  const data = await resp.json().catch(() => ({error: {code: "HTTP_" + resp.status, message: resp.statusText}}));
  const took = performance.now() - started;
  if (!resp.ok || data.error) {
    $("status").textContent = `HTTP ${resp.status} after ${took.toFixed(0)} ms`;
    showError($("answer"), data.error || {});
    return;
  }
  showStatus(data, took);
  if (explain) { drawPlan(data); return; }
  answer = data;
  page(0);
}

function showStatus(data, took) {
  const s = data.stats || {};
  const token = data.consistency_token;
  $("status").replaceChildren(
    `${data.rows.length} rows · ${took.toFixed(0)} ms in the browser, ${s.elapsed_ms ?? "?"} ms on the node · `
    + `${s.partitions_queried ?? 0} partitions on ${s.nodes ?? 0} nodes`
    + (s.joined_on_owners ? " · joined on the owners" : "") + (s.answer_reused ? " · answer reused" : "") + (s.finished_in_arrow ? " · finished in Arrow" : "") + " · token ",
    el("span", {class: "token", id: "answer-token"}, token || "none"),
    " ",
    el("button", {id: "use-token", title: "read at least this state in the next query"}, "use token"));
  $("use-token").onclick = () => { $("token").value = token || ""; };
}

function page(n) {
  const rows = answer.rows, pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
  n = Math.min(Math.max(0, n), pages - 1);
  const head = el("tr", {}, ...answer.columns.map((c) => el("th", {}, c.name, " ", el("small", {}, c.type))));
  const body = rows.slice(n * PAGE_ROWS, (n + 1) * PAGE_ROWS).map((r) => el("tr", {}, ...r.map(cell)));
  $("answer").replaceChildren(el("table", {class: "rows", id: "result"}, el("thead", {}, head), el("tbody", {}, ...body)));
  const prev = el("button", {}, "‹ previous"), next = el("button", {}, "next ›");
  prev.disabled = n === 0; next.disabled = n >= pages - 1;
  prev.onclick = () => page(n - 1); next.onclick = () => page(n + 1);
  $("pager").replaceChildren(prev, ` page ${n + 1} of ${pages} `, next);
}

function cell(v) {
  if (v === null) return el("td", {class: "null"}, "NULL");
  return el("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v));
}

async function download(format) {
  const sql = $("sql").value.trim();
  if (!sql) return;
  const resp = await postSql(requestBody(sql), format);
  if (!resp.ok) {
    showError($("answer"), (await resp.json().catch(() => ({}))).error || {code: "HTTP_" + resp.status, message: resp.statusText});
    return;
  }
  const blob = await resp.blob();
  const a = el("a", {href: URL.createObjectURL(blob), download: `answer.${format === "arrow" ? "arrows" : format}`});
  document.body.append(a);
  a.click();
  a.remove();
}

// EXPLAIN as a picture: one box per node with the calls it gets, then the receiver.
function drawPlan(data) {
  const names = data.columns.map((c) => c.name);
  const rows = data.rows.map((r) => Object.fromEntries(names.map((n, i) => [n, r[i]])));
  const byNode = new Map();
  for (const r of rows) {
    if (!byNode.has(r.node)) byNode.set(r.node, []);
    byNode.get(r.node).push(r);
  }
  const owners = [...byNode.entries()].map(([node, calls]) => el("div", {class: "owner"},
    el("h4", {}, node),
    ...calls.map((c) => el("div", {class: "call"},
      el("b", {}, c.store), ` ${c.query}`, el("br"), `partitions ${c.partitions || "-"}`, el("br"),
      "pushed down: ", el("code", {}, c.pushed_down)))));
  const receiver = el("div", {class: "receiver"}, el("h4", {}, "receiver"),
                      el("code", {}, rows.length ? rows[0].at_receiver : ""));
  $("answer").replaceChildren(el("div", {class: "plan", id: "plan"}, ...owners, el("span", {class: "arrow"}, "→"), receiver));
}

function remember(sql) {
  const list = history().filter((s) => s !== sql);
  list.unshift(sql);
  localStorage.setItem(HISTORY_KEY, JSON.stringify(list.slice(0, HISTORY_MAX)));
  fillHistory();
}

function history() {
  try { return JSON.parse(localStorage.getItem(HISTORY_KEY) || "[]"); } catch { return []; }
}

function fillHistory() {
  $("history").replaceChildren(el("option", {value: ""}, "History"),
    ...history().map((s) => el("option", {value: s}, s.length > 80 ? s.slice(0, 77) + "…" : s)));
}

// ---- the store browser -------------------------------------------------------------------

async function showStores(selected) {
  try {
    const {stores} = await getJson("/v1/stores");
    $("store-list").replaceChildren(...stores.map((s) => {
      const li = el("li", {"data-store": s.name, "data-scope": s.scope}, s.name,
                    ...(s.scope === "global" ? [el("span", {class: "scope"}, " global")] : []));
      if (s.name === selected) li.className = "active";
      li.onclick = () => { location.hash = "#stores/" + encodeURIComponent(s.name); };
      return li;
    }));
    if (selected) await showStore(selected);
  } catch (e) { showError($("store-detail"), e); }
}

async function showStore(name) {
  const detail = $("store-detail");
  try {
    const info = await getJson("/v1/stores/" + encodeURIComponent(name));
    const defn = el("dl", {class: "definition"});
    for (const [k, v] of Object.entries(info)) {
      if (k === "columns" || k === "partition_owners") continue;
      defn.append(el("dt", {}, k), el("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v)));
    }
    const columns = el("table", {class: "rows"}, el("tr", {}, el("th", {}, "column"), el("th", {}, "type")),
      ...info.columns.map((c) => el("tr", {}, el("td", {}, c.name), el("td", {}, c.type))));
    const sample = el("div", {id: "sample"}, "sample rows: loading…");
    detail.replaceChildren(el("h3", {}, name), defn, el("h4", {}, "Columns"), columns,
                           el("h4", {}, "Sample rows (LIMIT 20)"), sample);
    const quoted = '"' + name.replaceAll('"', '""') + '"';
    const resp = await postSql({sql: `SELECT * FROM ${quoted} LIMIT 20`}, "json");
    const data = await resp.json();
    if (!resp.ok || data.error) { showError(sample, data.error || {}); return; }
    sample.replaceChildren(el("table", {class: "rows"},
      el("tr", {}, ...data.columns.map((c) => el("th", {}, c.name))),
      ...data.rows.map((r) => el("tr", {}, ...r.map(cell)))));
  } catch (e) { showError(detail, e); }
}

// ---- the cluster map ---------------------------------------------------------------------

async function showCluster() {
  try {
    const meta = await getJson("/v1/metadata");
    $("node").textContent = `node ${meta.node_id} · application ${meta.application_id}`;
    const nodes = meta.nodes || [];
    const tables = Object.entries(meta.stores).map(([store, s]) => {
      const cells = [];
      const global = s.scope === "global";
      for (let p = 0; p < s.partitions; p++) cells.push((global ? globalCell : partitionCell)(store, p, nodes));
      const title = `${store} (${s.type}, ${s.topic}${global ? ", global: every node keeps every partition" : ""})`;
      return el("table", {"data-store": store, "data-scope": s.scope}, el("tr", {}, el("th", {colspan: s.partitions}, title)),
                el("tr", {}, ...cells));
    });
    $("cluster-map").replaceChildren(...tables);
    $("cluster-nodes").replaceChildren(el("table", {class: "rows"},
      el("tr", {}, ...["node", "endpoint", "state", "last heartbeat"].map((h) => el("th", {}, h))),
      ...nodes.map((n) => el("tr", {}, el("td", {}, n.node_id), el("td", {}, n.endpoint), el("td", {}, n.state),
                                 el("td", {}, new Date(n.last_heartbeat_ms).toISOString())))));
  } catch (e) { showError($("cluster-map"), e); }
}

function partitionCell(store, p, nodes) {
  const has = (list) => (list[store] || []).includes(p);
  const active = nodes.filter((n) => has(n.active || {}));
  const standbys = nodes.filter((n) => has(n.standby || {}));
  const restoring = active.some((n) => has(n.restoring || {}));
  const lagOf = (n) => (n.lags[store] || {})[String(p)];
  const lagging = standbys.some((n) => (lagOf(n) || 0) > 0);
  const kind = active.length === 0 ? "uncovered" : restoring ? "restoring" : lagging ? "lagging" : "ok";
  const lines = [`p${p}`, active.length ? `active ${active.map((n) => n.node_id).join(",")}` : "NO ACTIVE OWNER"];
  if (restoring) lines.push(`restoring, lag ${active.map(lagOf).join(",")}`);
  for (const n of standbys) lines.push(`standby ${n.node_id} lag ${lagOf(n) ?? "?"}`);
  return el("td", {class: "cell " + kind, "data-partition": p, "data-state": kind}, ...lines.flatMap((l, i) => i ? [el("br"), l] : [l]));
}

// A global store's partition: no owner, a copy on every node (each answers it alone).
function globalCell(store, p, nodes) {
  const has = (list) => (list[store] || []).includes(p);
  const copies = nodes.filter((n) => has(n.global || {}));
  const restoring = copies.filter((n) => has(n.restoring || {}));
  const lagOf = (n) => (n.lags[store] || {})[String(p)];
  const lagging = copies.filter((n) => (lagOf(n) || 0) > 0);
  const kind = copies.length === 0 ? "uncovered" : restoring.length ? "restoring" : lagging.length ? "lagging" : "ok";
  const lines = [`p${p}`, copies.length ? `copies ${copies.map((n) => n.node_id).join(",")}` : "NO COPY"];
  for (const n of restoring) lines.push(`restoring ${n.node_id} lag ${lagOf(n) ?? "?"}`);
  for (const n of lagging) if (!restoring.includes(n)) lines.push(`lagging ${n.node_id} lag ${lagOf(n)}`);
  return el("td", {class: "cell " + kind, "data-partition": p, "data-state": kind},
            ...lines.flatMap((l, i) => i ? [el("br"), l] : [l]));
}

// ---- pages -------------------------------------------------------------------------------

let refresh = null;

function route() {
  const [name, rest] = (location.hash.slice(1) || "query").split(/[?/](.*)/s);
  const page = ["query", "stores", "cluster"].includes(name) ? name : "query";
  for (const p of document.querySelectorAll(".page")) p.classList.toggle("shown", p.id === "page-" + page);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
  clearInterval(refresh);
  if (page === "stores") showStores(rest ? decodeURIComponent(rest) : null);
  if (page === "cluster") { showCluster(); refresh = setInterval(showCluster, 2000); }
  if (page === "query" && rest) {  // #query?sql=...&run=1: a link that opens (and runs) a query
    const q = new URLSearchParams(rest);
    if (q.has("sql")) $("sql").value = q.get("sql");
    if (q.get("run") === "1") run(false);
    if (q.get("explain") === "1") run(true);
  }
}

$("sign-in").onclick = signIn;
$("auth-token").addEventListener("keydown", (e) => { if (e.key === "Enter") signIn(); });
$("run").onclick = () => run(false);
$("explain").onclick = () => run(true);
for (const b of document.querySelectorAll(".download button")) b.onclick = () => download(b.dataset.format);
$("history").onchange = (e) => { if (e.target.value) $("sql").value = e.target.value; };
$("sql").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run(false); });
window.addEventListener("hashchange", route);
fillHistory();
getJson("/v1/metadata").then((m) => { $("node").textContent = `node ${m.node_id} · application ${m.application_id}`; }).catch(() => {});
route();
