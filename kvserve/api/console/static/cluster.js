// The Cluster tab (`kvserve cluster` only): each replica's load, cache hit rate and routing decisions,
// from /kvserve/v1/cluster (the cluster's ingress answers it; a single server has no such route, and
// the tab stays hidden). Polled while the tab is visible.
import { apiFetch, apiJson } from "./api.js";
import { bar, el, num } from "./dom.js";

const CLUSTER_PATH = "/kvserve/v1/cluster", POLL_MS = 2000;
const REASONS = ["session", "response", "prefix", "least_loaded"];
let visible = false, running = false;
const $ = (id) => document.getElementById(id);
const pct = (f) => `${(100 * f).toFixed(1)}%`;

// Whether this console talks to a cluster: the route answers (after the key, when one is needed).
export async function hasCluster() {
  try {
    return (await apiFetch(CLUSTER_PATH)).ok;
  } catch {
    return false;
  }
}

function decisionsText(decisions) {
  return REASONS.filter((r) => decisions[r]).map((r) => `${r.replace("_", " ")} ${num(decisions[r])}`).join(" · ") || "none yet";
}

function replicaRow(r) {
  return el("tr", { "data-replica": r.replica },
    el("td", { class: "mono", title: `pid ${r.pid}` }, r.replica),
    el("td", { class: "mono", title: r.node_id }, r.node_id.slice(0, 12)),
    el("td", { class: "num" }, num(r.num_requests_in_flight)), el("td", { class: "num" }, num(r.num_sessions)),
    el("td", { class: "num" }, `${num(r.num_running)} / ${num(r.num_waiting)}`),
    el("td", {}, bar([["used", r.kv_usage]]), el("span", { class: "muted" }, pct(r.kv_usage))),
    el("td", { class: "num hit-rate" }, pct(r.hit_rate)),
    el("td", { class: "num" }, `${num(r.num_cached_prompt_tokens)} / ${num(r.num_prompt_tokens)}`),
    el("td", { class: "num" }, num(r.num_disk_hit_tokens)), el("td", { class: "num" }, num(r.num_generation_tokens)),
    el("td", { class: "decisions" }, decisionsText(r.decisions)));
}

async function poll() {
  const data = await apiJson(CLUSTER_PATH);
  $("cluster-summary").replaceChildren(
    bar([["cachedpart", data.hit_rate]]),
    el("div", { id: "cluster-hit-rate" }, `hit rate ${pct(data.hit_rate)}: ${num(data.num_cached_prompt_tokens)} of ${num(data.num_prompt_tokens)} prompt tokens cached`),
    el("div", { class: "muted" }, `${data.num_replicas} replicas · ${num(data.num_requests_in_flight)} requests in flight · ${num(data.num_sessions)} live sessions`));
  const total = Object.values(data.decisions).reduce((a, b) => a + b, 0);
  $("cluster-decisions").replaceChildren(
    ...REASONS.filter((r) => data.decisions[r]).map((r) => el("div", { "data-reason": r },
      bar([["used", data.decisions[r] / total]]), el("span", {}, `${r.replace("_", " ")}: ${num(data.decisions[r])}`))),
    el("div", { class: "muted" }, total ? `${num(total)} requests routed` : "no request routed yet"));
  $("replicas").tBodies[0].replaceChildren(...data.replicas.map(replicaRow));
  $("replica-count").textContent = `(${data.num_replicas})`;
}

async function tick() {
  if (!visible || running) return;
  running = true;
  try { await poll(); } catch (error) { console.warn(error); } finally { running = false; }
}

export function setClusterVisible(isVisible) {
  const was = visible;
  visible = isVisible;
  if (visible && !was) tick();
}

export function initCluster() {
  setInterval(tick, POLL_MS);
}
