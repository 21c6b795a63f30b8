// Live KV-cache dashboard: polls /kvserve/v1/* while the Cache tab is visible.
// Recent requests arrive incrementally (`after` = the last seq seen) and are prepended, never re-rendered.
import { apiJson } from "./api.js";
import { bar, el, num } from "./dom.js";

// At 100 requests/s nobody reads every row: each poll fetches (and renders) the newest 50 at most.
const REQUESTS_MS = 1000, CACHE_MS = 2000, CHECKPOINTS_MS = 5000, MAX_RECENT_ROWS = 100, MAX_NEW_ROWS = 50;
const CHECKPOINT_ROWS = 100;  // the first 100 in the chosen order; the API pages through the rest
let visible = false, lastSeq = 0, sort = "score", order = "asc", checkpointsShown = "";
const timers = [];
// Each poll's duration (fetch + render), the last 200 per kind: read by scripts/console_load.py.
const stats = (window.kvserveConsoleStats = { requests: [], cache: [], checkpoints: [] });
const $ = (id) => document.getElementById(id);

const short = (id) => (id.length > 22 ? `${id.slice(0, 20)}…` : id);

function bytes(n) {
  for (const unit of ["B", "KiB", "MiB", "GiB"]) {
    if (n < 1024 || unit === "GiB") return unit === "B" ? `${n} B` : `${n.toFixed(1)} ${unit}`;
    n /= 1024;
  }
}

function ago(seconds) {
  if (seconds < 60) return `${seconds.toFixed(0)}s`;
  if (seconds < 3600) return `${(seconds / 60).toFixed(0)}m`;
  if (seconds < 86400) return `${(seconds / 3600).toFixed(1)}h`;
  return `${(seconds / 86400).toFixed(1)}d`;
}

function badge(source) {
  return el("span", { class: `badge ${source}` }, source);
}

// -- requests ----------------------------------------------------------------------------

function inflightRow(r) {
  const cachedFrac = r.num_prompt_tokens ? r.num_cached_tokens / r.num_prompt_tokens : 0;
  const doneFrac = r.num_prompt_tokens ? (r.num_computed_tokens - r.num_cached_tokens) / r.num_prompt_tokens : 0;
  const progress = el("div", {}, bar([["cachedpart", cachedFrac], ["done", Math.max(0, doneFrac)]]),
    el("span", { class: "muted" }, `${num(r.num_computed_tokens)}/${num(r.num_prompt_tokens)} (${num(r.num_cached_tokens)} cached)`));
  return el("tr", { "data-id": r.request_id },
    el("td", { class: "mono", title: r.request_id }, short(r.request_id)), el("td", {}, r.phase), el("td", {}, r.phase === "queued" ? "–" : badge(r.source)),
    el("td", {}, progress), el("td", { class: "num" }, num(r.num_output_tokens)), el("td", { class: "num" }, `${r.elapsed_s.toFixed(1)}s`));
}

function divergenceCell(r) {
  const d = r.divergence;
  if (!d) return el("td", { class: "muted" }, r.source === "cold" ? "no earlier prefix" : "");
  const whole = d.token_index >= r.num_prompt_tokens;
  const text = el("div", { class: "div-text" },
    el("span", { class: "muted" }, `token ${num(d.token_index)} vs ${d.reference_kind} ${short(d.reference_id)}${whole ? " (whole prompt matched)" : ""}\n`),
    `…${d.before}`, el("span", { class: "point" }, "┃"), d.after,
    d.reference_after && !whole ? el("span", { class: "theirs" }, `\n   was: ${d.reference_after}`) : "");
  return el("td", { class: "divergence" }, text);
}

function recentRow(r, fresh) {
  return el("tr", { class: fresh ? "fresh" : "", "data-id": r.request_id, "data-source": r.source },
    el("td", { class: "num" }, r.seq), el("td", { class: "mono", title: r.request_id }, short(r.request_id)),
    el("td", {}, badge(r.source), r.checkpoint_id ? el("div", { class: "mono muted" }, r.checkpoint_id.slice(0, 12)) : ""),
    el("td", { class: "num" }, num(r.num_prompt_tokens)),
    el("td", { class: "num" }, `${num(r.num_cached_tokens)}${r.num_disk_tokens ? ` (${num(r.num_disk_tokens)} disk)` : ""}`),
    divergenceCell(r), el("td", { class: "num" }, num(r.num_output_tokens)),
    el("td", { class: "num" }, r.ttft_s == null ? "–" : `${(r.ttft_s * 1000).toFixed(0)} ms`),
    el("td", { class: "num" }, r.decode_tokens_per_s.toFixed(1)), el("td", {}, r.outcome));
}

async function pollRequests() {
  const data = await apiJson(`/kvserve/v1/requests?after=${lastSeq}&limit=${MAX_NEW_ROWS}`);
  $("inflight").tBodies[0].replaceChildren(...data.in_flight.map(inflightRow));
  $("inflight-count").textContent = `(${data.in_flight.length})`;
  const body = $("recent").tBodies[0];
  if (data.recent.length) {
    const fresh = data.recent.length < 10;  // flash new rows only when the eye can follow them
    const rows = data.recent.map((r) => recentRow(r, fresh)).reverse();  // newest first
    body.prepend(...rows);
    while (body.rows.length > MAX_RECENT_ROWS) body.lastElementChild.remove();
  }
  lastSeq = Math.max(lastSeq, data.last_seq);
  $("recent-count").textContent = `(last ${body.rows.length} of ${num(lastSeq)})`;
}

// -- pool, disk, chart -------------------------------------------------------------------

function drawChart(points, bucketS) {
  const svg = $("hit-chart");
  const W = 600, H = 140, top = 8, bottom = 18;
  const ns = "http://www.w3.org/2000/svg";
  const make = (tag, attrs) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  };
  const shown = points.slice(-120);
  const children = [make("line", { class: "axis", x1: 0, y1: H - bottom, x2: W, y2: H - bottom })];
  if (shown.length) {
    const step = W / Math.max(shown.length, 2);
    const maxReqs = Math.max(...shown.map((p) => p.num_requests), 1);
    const y = (rate) => top + (1 - rate) * (H - top - bottom);
    shown.forEach((p, i) => {
      const h = (p.num_requests / maxReqs) * (H - top - bottom) * 0.5;
      children.push(make("rect", { class: "reqs", x: i * step + 1, y: H - bottom - h, width: Math.max(step - 2, 1), height: h }));
    });
    const path = shown.map((p, i) => `${i ? "L" : "M"}${(i * step + step / 2).toFixed(1)},${y(p.hit_rate).toFixed(1)}`).join(" ");
    children.push(make("path", { class: "line", d: path }));
    const label = make("text", { x: 4, y: top + 8 });
    label.textContent = "100%";
    const last = shown[shown.length - 1];
    const now = make("text", { x: W - 4, y: H - 4, "text-anchor": "end" });
    now.textContent = `last: ${(100 * last.hit_rate).toFixed(0)}% of ${num(last.num_prompt_tokens)} tokens, ${last.num_requests} req`;
    children.push(label, now);
  }
  svg.replaceChildren(...children);
  $("chart-caption").textContent = `(${bucketS}s buckets; bars: requests)`;
}

async function pollCache() {
  const data = await apiJson("/kvserve/v1/cache");
  const pool = data.pool;
  if (pool) {
    $("pool").replaceChildren(
      bar([["used", pool.num_used_blocks / pool.num_blocks]]),
      el("div", {}, `${num(pool.num_used_blocks)} of ${num(pool.num_blocks)} blocks in use (${pool.block_size} tokens each)`),
      el("div", { class: "muted" }, `${num(pool.num_cached_blocks)} hold a cached prefix · ${num(pool.num_free_blocks)} allocatable`
        + (data.prefix_cache_hit_rate != null ? ` · hit rate since start ${(100 * data.prefix_cache_hit_rate).toFixed(1)}%` : "")));
  }
  const disk = data.disk;
  $("disk").replaceChildren(...(disk
    ? [bar([["used", disk.num_bytes / disk.budget_bytes]]),
       el("div", {}, `${num(disk.num_checkpoints)} checkpoints · ${bytes(disk.num_bytes)} of ${bytes(disk.budget_bytes)}`),
       el("div", { class: "muted mono" }, disk.directory)]
    : [el("div", { class: "muted" }, "no disk tier (--no-kv-cache)")]));
  drawChart(data.hit_rate, data.hit_rate_bucket_s);
}

async function pollCheckpoints() {
  let data;
  try {
    data = await apiJson(`/kvserve/v1/cache/checkpoints?sort=${sort}&order=${order}&limit=${CHECKPOINT_ROWS}`);
  } catch (error) {
    $("ckpt-count").textContent = `(${error.message})`;
    $("checkpoints").tBodies[0].replaceChildren();
    return;
  }
  // Rebuild the table only when what it shows changed (most polls: nothing did).
  const shown = JSON.stringify([sort, order, data.total, data.checkpoints.map((c) => [c.checkpoint_id, c.hits, c.last_used, c.score.toPrecision(3)])]);
  if (shown === checkpointsShown) return;
  checkpointsShown = shown;
  const now = Date.now() / 1000;
  $("checkpoints").tBodies[0].replaceChildren(...data.checkpoints.map((c) => el("tr", {},
    el("td", {}, c.reason), el("td", { class: "mono", title: c.checkpoint_id }, c.checkpoint_id.slice(0, 12)),
    el("td", { class: "num" }, num(c.num_tokens)), el("td", { class: "num" }, bytes(c.total_bytes)),
    el("td", { class: "num" }, bytes(c.marginal_bytes)),
    el("td", { class: "num", title: `decayed: ${c.effective_hits.toFixed(2)}` }, num(c.hits)),
    el("td", { class: "num" }, ago(c.age_s)), el("td", { class: "num" }, c.last_used ? ago(now - c.last_used) : "–"),
    el("td", { class: "num" }, c.score.toPrecision(3)))));
  $("ckpt-count").textContent = `(${data.checkpoints.length} of ${num(data.total)}, by ${sort} ${order})`;
  for (const th of document.querySelectorAll("#checkpoints th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === sort);
    th.classList.toggle("desc", th.dataset.sort === sort && order === "desc");
  }
}

// -- polling -------------------------------------------------------------------------------

function every(ms, poll, kind) {
  let running = false;
  const tick = async () => {
    if (!visible || running) return;
    running = true;
    const started = performance.now();
    try {
      await poll();
      stats[kind].push(performance.now() - started);
      if (stats[kind].length > 200) stats[kind].shift();
    } catch (error) { console.warn(error); } finally { running = false; }
  };
  timers.push(tick);
  setInterval(tick, ms);
  return tick;
}

export function setCacheVisible(isVisible) {
  const was = visible;
  visible = isVisible;
  if (visible && !was) for (const tick of timers) tick();
}

export function initCache() {
  every(REQUESTS_MS, pollRequests, "requests");
  every(CACHE_MS, pollCache, "cache");
  const checkpoints = every(CHECKPOINTS_MS, pollCheckpoints, "checkpoints");
  for (const th of document.querySelectorAll("#checkpoints th[data-sort]")) {
    th.addEventListener("click", () => {
      order = th.dataset.sort === sort && order === "asc" ? "desc" : "asc";
      sort = th.dataset.sort;
      checkpoints();
    });
  }
}
