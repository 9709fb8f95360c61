// The dpsql console: plain JavaScript over the /v1 API. Data is only ever written with
// textContent or SVG attributes, never parsed as HTML.
"use strict";

const STORAGE_KEY = "dpsql-token";
const SVG = "http://www.w3.org/2000/svg";
const state = { token: null, me: null, schema: null, previewTimer: null, previewSeq: 0 };
const $ = (id) => document.getElementById(id);

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.token}`, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({ detail: `HTTP status ${response.status}` }));
  if (!response.ok) {
    const error = new Error(data.detail || data.title || `HTTP status ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

function showError(error) {
  $("error").textContent = error ? error.message : "";
  $("error").hidden = !error;
}

function format(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(6)));
}

// A float with an interval, shown to two significant digits of its half-width (ends outwards);
// display only: the result keeps every digit.
function shownWithNoise(value, [low, high]) {
  const numbers = [value, low, high].every((v) => typeof v === "number" && Number.isFinite(v));
  if (!numbers || Number.isInteger(value) || !(high > low)) return [value, low, high];
  const step = 10 ** (Math.floor(Math.log10((high - low) / 2)) - 1);
  const digits = Math.max(0, -Math.round(Math.log10(step)));
  const at = (v, how) => Number((how(v / step) * step).toFixed(digits));
  return [at(value, Math.round), at(low, Math.floor), at(high, Math.ceil)];
}

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function fillTable(table, columns, rows) {
  table.replaceChildren();
  const head = table.createTHead().insertRow();
  for (const column of columns) head.appendChild(element("th", column));
  const body = table.createTBody();
  for (const row of rows) {
    const line = body.insertRow();
    for (const value of row) {
      line.appendChild(element("td", format(value), typeof value === "number" ? "number" : ""));
    }
  }
}

// Sign in -------------------------------------------------------------------------------------
async function signIn(token) {
  state.token = token;
  try {
    state.me = await api("GET", "/v1/me");
  } catch (error) {
    state.token = null;
    sessionStorage.removeItem(STORAGE_KEY);
    showError(error);
    return;
  }
  sessionStorage.setItem(STORAGE_KEY, token);
  showError(null);
  document.body.classList.add(`role-${state.me.role}`);
  $("who").textContent = `${state.me.name} (${state.me.role})`;
  $("who").hidden = $("sign-out").hidden = false;
  $("signin").hidden = true;
  $("app").hidden = false;
  await Promise.all([refreshSchema(), refreshBudget(), refreshLedger()]);
  if (state.me.role === "analyst") schedulePreview(0);
}

// Schema: the tables the policy exposes; a click on a column inserts it into the editor --------
function identifier(name) {
  return /^[A-Za-z_][A-Za-z0-9_]*$/.test(name) ? name : `"${name.replaceAll('"', '""')}"`;
}

function insertIntoEditor(text) {
  const editor = $("sql");
  const start = editor.selectionStart ?? editor.value.length;
  const end = editor.selectionEnd ?? start;
  editor.setRangeText(text, start, end, "end");
  editor.focus();
  schedulePreview();
}

function columnRules(column) {
  const rules = [];
  if (column.bounds) rules.push(`bounds [${column.bounds.map(format).join(", ")}]`);
  if (column.public_keys) rules.push(`public keys ${column.public_keys.map(format).join(", ")}`);
  if (column.key_domain) rules.push(`key domain ${JSON.stringify(column.key_domain)}`);
  if (column.auto_bounds) rules.push(`automatic bounds (${column.auto_bounds})`);
  return rules.join("; ");
}

function tableBlock(table, title, rules) {
  const block = element("div", undefined, "table");
  block.dataset.table = table.name;
  const heading = element("h3");
  const name = element("button", table.name, "column");
  name.dataset.insert = identifier(table.name);
  name.title = "insert the table's name";
  heading.append(name, element("span", title, "muted"));
  block.appendChild(heading);
  if (rules) block.appendChild(element("div", rules, "rules muted"));
  const columns = element("div");
  for (const column of table.columns) {
    const button = element("button", column.name, "column");
    button.type = "button";
    button.dataset.insert = identifier(column.name);
    button.appendChild(element("span", column.type, "type"));
    const described = column.public_keys !== undefined ? columnRules(column) : "";
    button.title = described || column.type;
    columns.appendChild(button);
  }
  block.appendChild(columns);
  return block;
}

async function refreshSchema() {
  try {
    const schema = await api("GET", "/v1/schema");
    state.schema = schema;
    const box = $("schema");
    box.replaceChildren();
    for (const table of schema.tables) {
      const rules =
        `privacy unit ${table.privacy_unit}; per unit at most ${table.max_groups_per_unit} groups, ` +
        `${table.max_rows_per_group} rows per group, ${table.max_rows_per_unit} rows` +
        (table.partition_column ? `; partitioned by ${table.partition_column}` : "");
      const described = table.columns.map((c) => [c.name, columnRules(c)]).filter(([, r]) => r);
      const detail = described.map(([name, r]) => `${name}: ${r}`).join(" · ");
      box.appendChild(tableBlock(table, ` ${rules}`, detail));
    }
    for (const table of schema.public_tables) {
      box.appendChild(tableBlock(table, ` public table${table.description ? `: ${table.description}` : ""}`));
    }
    const dataset = schema.dataset;
    const epsilon = dataset.default_query_epsilon;
    $("schema-defaults").textContent =
      `Dataset ${dataset.name}: default ε ${epsilon === null ? "none (give one per query)" : format(epsilon)}, ` +
      `${Math.round(dataset.confidence * 100)}% intervals. Click a name to insert it into the query.`;
    if ($("sql").value.trim() === "" && schema.example_query) $("sql").value = schema.example_query;
    if ($("epsilon").value === "" && epsilon !== null) $("epsilon").value = String(epsilon);
  } catch (error) {
    showError(error);
  }
}

function signOut() {
  sessionStorage.removeItem(STORAGE_KEY);
  window.location.reload();
}

// Query, cost preview and result ----------------------------------------------------------------
function queryRequest() {
  const body = { sql: $("sql").value };
  if ($("epsilon").value !== "") body.epsilon = Number($("epsilon").value);
  if ($("delta").value !== "" && Number($("delta").value) !== 0) body.delta = Number($("delta").value);
  if ($("mechanism").value) body.mechanism = $("mechanism").value;
  return body;
}

function schedulePreview(delay = 300) {
  clearTimeout(state.previewTimer);
  state.previewTimer = setTimeout(preview, delay);
}

async function preview() {
  const seq = ++state.previewSeq;
  const line = $("cost");
  try {
    const report = await api("POST", "/v1/explain", queryRequest());
    if (seq !== state.previewSeq) return;
    const cost = report.cost;
    const parts = [`Costs ε=${format(cost.epsilon)}, δ=${format(cost.delta)} (${report.plan.mechanism}).`];
    let exceeds = false;
    for (const budget of report.draws_on) {
      const after = budget.epsilon_remaining - cost.epsilon;
      exceeds = exceeds || after < -1e-12 || budget.delta_remaining - cost.delta < -1e-21;
      parts.push(
        `${budget.scope} ${budget.name}: ε ${format(budget.epsilon_remaining)} remaining, ` +
          `${format(Math.max(after, 0))} after.`,
      );
    }
    const errors = Object.entries(report.expected_error || {});
    if (errors.length) {
      const level = Math.round((state.schema ? state.schema.dataset.confidence : 0.95) * 100);
      const shown = errors.map(([name, half]) => `${name} ±${half === null ? "depends on the data" : format(half)}`);
      parts.push(`Expected error (${level}% interval): ${shown.join(", ")}.`);
    }
    for (const warning of (report.plan && report.plan.warnings) || []) parts.push(`Warning: ${warning}`);
    if (exceeds) parts.push("This query exceeds the remaining budget and would be refused.");
    line.textContent = parts.join(" ");
    line.className = exceeds ? "bad" : "muted";
  } catch (error) {
    if (seq !== state.previewSeq) return;
    line.textContent = error.message;
    line.className = "bad";
  }
}

async function run() {
  const button = $("run");
  button.disabled = true;
  showError(null);
  try {
    renderResult(await api("POST", "/v1/query", queryRequest()));
  } catch (error) {
    showError(error);
  } finally {
    button.disabled = false;
  }
  await Promise.all([refreshBudget(), refreshLedger()]);
  schedulePreview(0);
}

function renderResult(result) {
  $("results-panel").hidden = false;
  $("result-meta").textContent =
    `Spent ε=${format(result.epsilon_spent)}, δ=${format(result.delta_spent)} with ` +
    `${result.mechanism}; ledger entry ${result.ledger_entry}; error bars are ` +
    `${Math.round(result.confidence * 100)}% intervals.` +
    ((result.details && result.details.warnings) || []).map((w) => ` Warning: ${w}`).join("");
  const columns = [];
  for (const name of result.columns) {
    columns.push(name);
    if (name in result.intervals) columns.push(`${name}_low`, `${name}_high`);
  }
  const rows = result.rows.map((row, r) => {
    const out = [];
    result.columns.forEach((name, i) => {
      if (name in result.intervals) out.push(...shownWithNoise(row[i], result.intervals[name][r]));
      else out.push(row[i]);
    });
    return out;
  });
  fillTable($("results"), columns, rows);
  const measured = result.columns.findIndex(
    (name, i) => name in result.intervals && result.rows.some((row) => typeof row[i] === "number"),
  );
  const chart = $("chart");
  chart.replaceChildren();
  if (measured < 0) return;
  const keys = result.columns.map((_, i) => i).filter((i) => !(result.columns[i] in result.intervals));
  const labels = result.rows.map((row) =>
    keys.length ? keys.map((i) => format(row[i])).join(" / ") : result.columns[measured],
  );
  const name = result.columns[measured];
  chart.appendChild(
    barChart(labels, result.rows.map((row) => row[measured]), result.intervals[name], name),
  );
}

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function barChart(labels, values, intervals, name) {
  const n = values.length;
  const width = Math.max(360, 70 * n + 90);
  const height = 280;
  const margin = { left: 70, right: 20, top: 20, bottom: 60 };
  const numbers = values.filter((v) => typeof v === "number");
  for (const [low, high] of intervals) {
    if (low !== null) numbers.push(low);
    if (high !== null) numbers.push(high);
  }
  let low = Math.min(0, ...numbers);
  let high = Math.max(0, ...numbers);
  if (high === low) high = low + 1;
  const plot = height - margin.top - margin.bottom;
  const y = (v) => margin.top + plot * (1 - (v - low) / (high - low));
  const step = (width - margin.left - margin.right) / n;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  root.appendChild(svg("title", {}, `${name} with intervals`));
  for (let t = 0; t <= 4; t++) {
    const v = low + ((high - low) * t) / 4;
    root.appendChild(svg("line", { x1: margin.left - 4, x2: width - margin.right, y1: y(v), y2: y(v), stroke: "#e6eaf0" }));
    root.appendChild(svg("text", { x: margin.left - 8, y: y(v) + 4, "text-anchor": "end" }, format(Number(v.toPrecision(3)))));
  }
  values.forEach((value, i) => {
    const x = margin.left + i * step;
    if (typeof value === "number") {
      const top = Math.min(y(value), y(0));
      root.appendChild(
        svg("rect", { class: "bar", x: x + step * 0.15, y: top, width: step * 0.7, height: Math.max(1, Math.abs(y(value) - y(0))) }),
      ).appendChild(svg("title", {}, `${labels[i]}: ${format(value)}`));
    }
    const [lo, hi] = intervals[i];
    if (lo !== null && hi !== null) {
      const mid = x + step / 2;
      const cap = step * 0.15;
      for (const [x1, x2, y1, y2] of [
        [mid, mid, y(lo), y(hi)],
        [mid - cap, mid + cap, y(lo), y(lo)],
        [mid - cap, mid + cap, y(hi), y(hi)],
      ]) {
        root.appendChild(svg("line", { class: "error-bar", x1, x2, y1, y2 }));
      }
    }
    root.appendChild(
      svg("text", { x: x + step / 2, y: height - margin.bottom + 16, "text-anchor": "middle" }, labels[i]),
    );
  });
  root.appendChild(svg("line", { x1: margin.left, x2: width - margin.right, y1: y(0), y2: y(0), stroke: "#5c667a" }));
  return root;
}

// Budget and ledger ---------------------------------------------------------------------------
async function refreshBudget() {
  const box = $("budget");
  try {
    const report = await api("GET", "/v1/budget");
    box.replaceChildren();
    for (const line of report.lines) {
      if (line.scope === "partition") continue;
      const share = line.epsilon_cap > 0 ? line.epsilon_spent / line.epsilon_cap : 1;
      const gauge = element("div", undefined, share > 0.9 ? "gauge low" : "gauge");
      gauge.dataset.scope = line.scope;
      gauge.dataset.name = line.name;
      gauge.dataset.remaining = String(line.epsilon_remaining);
      gauge.appendChild(
        element(
          "div",
          `${line.scope} ${line.name}: ε ${format(line.epsilon_spent)} of ${format(line.epsilon_cap)} ` +
            `spent, ${format(line.epsilon_remaining)} remaining; δ ${format(line.delta_spent)} of ` +
            `${format(line.delta_cap)}`,
        ),
      );
      const bar = element("div", undefined, "bar");
      const spent = element("div", undefined, "spent");
      spent.style.width = `${Math.min(100, share * 100).toFixed(1)}%`;
      bar.appendChild(spent);
      gauge.appendChild(bar);
      box.appendChild(gauge);
    }
  } catch (error) {
    showError(error);
  }
}

async function refreshLedger() {
  try {
    const entries = await api("GET", "/v1/ledger");
    const columns = ["seq", "time", "kind", "analyst", "epsilon", "delta", "mechanism", "query"];
    const rows = entries.reverse().map((e) => columns.map((c) => (c === "time" ? e.time.slice(0, 19) : e[c])));
    fillTable($("ledger"), columns, rows);
  } catch (error) {
    showError(error);
  }
}

async function verify() {
  const out = $("verify-result");
  try {
    const report = await api("GET", "/v1/ledger/verify");
    out.textContent = report.verified ? `Verified: ${report.detail}` : `FAILED: ${report.detail}`;
    out.className = report.verified ? "ok" : "bad";
  } catch (error) {
    out.textContent = error.message;
    out.className = "bad";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim());
  });
  $("sign-out").addEventListener("click", signOut);
  $("run").addEventListener("click", run);
  $("refresh-ledger").addEventListener("click", () => Promise.all([refreshLedger(), refreshBudget()]));
  $("verify").addEventListener("click", verify);
  $("schema").addEventListener("click", (event) => {
    const button = event.target.closest("button[data-insert]");
    if (button && state.me && state.me.role === "analyst") insertIntoEditor(button.dataset.insert);
  });
  for (const id of ["sql", "epsilon", "delta", "mechanism"]) {
    $(id).addEventListener("input", () => schedulePreview());
  }
  const saved = sessionStorage.getItem(STORAGE_KEY);
  if (saved) signIn(saved);
});
