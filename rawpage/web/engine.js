// The live view of the engine: the KV block pool as a grid, the CPU swap pool, the
// scheduler's queues, the token budget of the last steps, and two sparklines. It reads
// the snapshots of GET /v1/engine/events (docs/engine-events.md).
import { api, readEvents } from "/web/api.js";

const STATES = ["free", "used", "shared", "cached"]; // the codes of the snapshot's "state"
const STEPS_SHOWN = 60;
const SPARK_POINTS = 120;
const $ = (id) => document.getElementById(id);

const grids = { gpu: [], cpu: [] }; // one element per block, created once per pool size
const history = { steps: [], tps: [], kv: [] };
let previous = null; // the last snapshot, for rates

export async function startEngineView() {
  for (let delay = 1000; ; delay = Math.min(2 * delay, 10000)) {
    try {
      const response = await fetch("/v1/engine/events", { headers: api.headers() });
      if (response.ok) {
        delay = 1000;
        await readEvents(response, (name, data) => {
          if (name === "snapshot") renderOrSay(JSON.parse(data));
        });
      }
    } catch {
      // the server went away (a drawing error never gets here: renderOrSay shows it); try again below
    }
    $("pool-info").textContent = "(reconnecting)";
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
}

// [v0, n0, v1, n1, ...] -> [v0 x n0, v1 x n1, ...]
function expand(runs) {
  const out = [];
  for (let i = 0; i < runs.length; i += 2) for (let k = 0; k < runs[i + 1]; k++) out.push(runs[i]);
  return out;
}

export function seqColour(id) {
  return `hsl(${(id * 137.508) % 360} 65% 52%)`;
}

// A snapshot the page cannot draw is a bug in the page: say so, on the page and in the
// console, rather than let it read as a lost connection.
function renderOrSay(snap) {
  try {
    render(snap);
  } catch (e) {
    $("pool-info").textContent = `(cannot draw this snapshot: ${e.message})`;
    console.error("rawpage: drawing the engine view failed", e);
  }
}

function render(snap) {
  const pool = snap.pool;
  const state = expand(snap.state);
  const owner = expand(snap.owner);
  // A tenant's view (a key that is not the admin's) has no reference counts and never says
  // "shared": each block it shows in use has one holder, as far as that key may know.
  const refs = snap.refs ? expand(snap.refs) : state.map((s) => (s === 1 ? 1 : 0));
  const image = snap.image ? expand(snap.image) : []; // 1: the block holds image tokens
  const gpu = cellsFor($("block-grid"), grids.gpu, pool.num_blocks, "gpu");
  for (let b = 0; b < pool.num_blocks; b++) paintCell(gpu[b], b, STATES[state[b]], owner[b], refs[b], image[b] === 1);
  const cpuOwner = expand(snap.cpu_owner);
  const cpu = cellsFor($("cpu-grid"), grids.cpu, pool.num_cpu_blocks, "cpu");
  for (let b = 0; b < pool.num_cpu_blocks; b++) {
    paintCell(cpu[b], b, cpuOwner[b] >= 0 ? "swapped" : "free", cpuOwner[b], cpuOwner[b] >= 0 ? 1 : 0);
  }
  $("cpu-info").textContent = pool.num_cpu_blocks ? `${pool.num_cpu_blocks} blocks` : "(off: --preemption-mode recompute)";
  $("pool-info").textContent = `${pool.num_blocks} blocks × ${pool.block_size} tokens`;
  showPoolStats(snap, state, image);
  for (const name of ["running", "waiting", "swapped"]) showQueue(name, snap.queues[name], snap.counts[name]);
  history.steps.push(...snap.steps);
  history.steps.splice(0, history.steps.length - STEPS_SHOWN);
  drawSteps($("steps"), history.steps, pool.max_num_batched_tokens);
  const used = state.filter((s) => s === 1 || s === 2).length;
  if (previous) {
    const seconds = snap.time - previous.time;
    if (seconds > 0) pushPoint(history.tps, generatedSince(previous, snap) / seconds);
  }
  pushPoint(history.kv, used / Math.max(1, pool.num_blocks));
  drawSparkline($("spark-tps"), history.tps, null);
  drawSparkline($("spark-kv"), history.kv, 1);
  $("tps-now").textContent = history.tps.length ? history.tps.at(-1).toFixed(1) : "";
  $("kv-now").textContent = `${used} of ${pool.num_blocks}`;
  previous = snap;
}

// Tokens generated between two snapshots: the engine's counter where the view has it; a
// tenant's view has only its own steps, where each decode is one token generated.
function generatedSince(before, snap) {
  const total = (s) => s.totals.generation_tokens;
  if (total(snap) !== undefined) return total(snap) - total(before);
  return snap.steps.reduce((sum, [, , decodes]) => sum + decodes, 0);
}

function cellsFor(grid, cells, count, pool) {
  if (cells.length !== count) {
    cells.length = 0;
    for (let b = 0; b < count; b++) {
      const cell = document.createElement("div");
      cell.className = "cell";
      cell.dataset.testid = "block";
      cell.dataset.pool = pool;
      cells.push(cell);
    }
    // One fragment, not replaceChildren(...cells): a 2 GiB pool of a tiny model is 262,144
    // blocks, past the most arguments a call may take in Chromium.
    const fragment = document.createDocumentFragment();
    for (const cell of cells) fragment.append(cell);
    grid.replaceChildren(fragment);
  }
  return cells;
}

// A held block is drawn in its sequence's colour; one holding image tokens, or swapped out
// to the CPU, in that kind's colour (style.css), ringed in its sequence's colour. A free
// block still named in the prefix cache has no owner, and is drawn striped (style.css).
function paintCell(cell, block, state, owner, refs, image = false) {
  const key = `${state}/${owner}/${refs}/${image}`;
  if (cell.dataset.key === key) return; // most cells do not change between snapshots
  cell.dataset.key = key;
  cell.dataset.state = state;
  if (image) cell.dataset.image = "1";
  else delete cell.dataset.image;
  const colour = owner >= 0 ? seqColour(owner) : "";
  const ringed = image || state === "swapped";
  cell.style.backgroundColor = ringed ? "" : colour;
  cell.style.boxShadow = ringed && colour ? `inset 0 0 0 2px ${colour}` : "";
  cell.textContent = state === "shared" ? (refs < 10 ? String(refs) : "+") : "";
  const who = owner >= 0 ? `, sequence ${owner}` : "";
  cell.title = `block ${block}: ${state}${who}${refs > 1 ? `, ${refs} references` : ""}${image ? ", image tokens" : ""}`;
}

function showPoolStats(snap, state, image) {
  const count = [0, 0, 0, 0];
  for (const s of state) count[s]++;
  const images = image.reduce((n, i) => n + i, 0);
  const t = snap.totals;
  const blocks = `in use ${count[1]} (images ${images}) · shared ${count[2]} · cached ${count[3]} · free ${count[0]} · `;
  if (t.prefix_queries === undefined) {
    // A tenant's view: the engine-wide counters would tell one key about another's prompts.
    $("pool-stats").textContent = `${blocks}snapshot ${snap.cost_ms} ms (your requests; other keys' blocks unnamed)`;
    return;
  }
  const hits = t.prefix_queries ? ((100 * t.prefix_hits) / t.prefix_queries).toFixed(1) : "0.0";
  $("pool-stats").textContent =
    blocks +
    `prefix-cache hits ${hits}% · copy-on-write ${t.cow_copies} · evictions ${t.evictions} · ` +
    `preemptions ${t.preemptions} · swaps ${t.swap_outs} out, ${t.swap_ins} in · snapshot ${snap.cost_ms} ms`;
}

function showQueue(name, seqs, count) {
  $(`count-${name}`).textContent = String(count);
  const items = seqs.map((s) => {
    const li = document.createElement("li");
    li.dataset.seq = s.id;
    li.dataset.state = s.state;
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.backgroundColor = seqColour(s.id);
    li.append(swatch, `#${s.id} ${s.state}: ${s.tokens} tokens (${s.prompt} prompt), ${s.computed} computed, ${s.blocks} blocks`);
    li.title = `request ${s.request}`;
    return li;
  });
  if (count > seqs.length) {
    const more = document.createElement("li");
    more.textContent = `… and ${count - seqs.length} more`;
    items.push(more);
  }
  $(`queue-${name}`).replaceChildren(...items);
}

// One bar per step, as tall as the token budget: prefill chunks stacked in blue shades,
// then the decodes (one token each) in orange. The scale is logarithmic: on a linear one a
// stream's decode, 1 token of a 2048-token budget, is a sliver, and one stream's chart
// looked blank. Segments stack by running total (each spans y(before) to y(after)), with
// faint lines at 1, 10, 100, 1000 tokens. A segment is at least 2 px tall to be seen.
function drawSteps(canvas, steps, budget) {
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  const barWidth = width / STEPS_SHOWN;
  const top = Math.max(budget, ...steps.map(([, chunks, decodes]) => chunks.reduce((a, b) => a + b, decodes)));
  const y = (tokens) => height - (Math.log1p(tokens) / Math.log1p(top)) * height;
  const segment = (x, below, tokens, colour) => {
    const bottom = y(below);
    const h = Math.max(2, bottom - y(below + tokens));
    ctx.fillStyle = colour;
    ctx.fillRect(x, bottom - h, barWidth - 1, h);
  };
  steps.forEach(([, chunks, decodes], i) => {
    const x = i * barWidth;
    ctx.fillStyle = "#eee";
    ctx.fillRect(x, 0, barWidth - 1, height);
    let total = 0;
    chunks.forEach((n, k) => {
      segment(x, total, n, k % 2 ? "#5b8def" : "#2f5fc4");
      total += n;
    });
    if (decodes) segment(x, total, decodes, "#f08c2e");
  });
  ctx.fillStyle = "rgba(0, 0, 0, 0.12)";
  for (let tokens = 1; tokens < top; tokens *= 10) ctx.fillRect(0, Math.round(y(tokens)), width, 1);
}

function pushPoint(series, value) {
  series.push(value);
  if (series.length > SPARK_POINTS) series.shift();
}

function drawSparkline(canvas, series, max) {
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  if (series.length < 2) return;
  const top = max ?? Math.max(1, ...series);
  ctx.strokeStyle = "#2f5fc4";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  series.forEach((v, i) => {
    const x = (i / (SPARK_POINTS - 1)) * width;
    const y = height - 2 - (v / top) * (height - 4);
    if (i === 0) ctx.moveTo(x, y);
    else ctx.lineTo(x, y);
  });
  ctx.stroke();
}
