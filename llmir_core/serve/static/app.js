// llmir Playground: chat with streamed tokens, the artifact's IR, pass diffs and bench charts.
// Plain JS and SVG, no dependencies: everything here ships in the llmir package.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, history: [], busy: false };

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// -- tabs ------------------------------------------------------------------------------------------
document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
function showTab(name) {
  document.querySelectorAll("nav button").forEach((b) => b.classList.toggle("active", b.dataset.tab === name));
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t.id === "tab-" + name));
}

// -- charts (SVG) ----------------------------------------------------------------------------------
function barChart(el, labels, values, unit) {
  const W = 420, H = 200, padL = 44, padB = 28, padT = 10;
  const max = Math.max(1e-9, ...values);
  const bw = (W - padL - 10) / Math.max(1, values.length);
  let svg = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="bar chart">`;
  for (let i = 0; i <= 4; i++) {
    const y = padT + (H - padT - padB) * (1 - i / 4);
    svg += `<line x1="${padL}" x2="${W - 5}" y1="${y}" y2="${y}" stroke="#eee"/>`;
    svg += `<text x="${padL - 4}" y="${y + 4}" text-anchor="end">${fmt(max * i / 4)}</text>`;
  }
  values.forEach((v, i) => {
    const h = (H - padT - padB) * (v / max);
    const x = padL + i * bw + bw * 0.15;
    svg += `<rect class="bar" x="${x}" y="${H - padB - h}" width="${bw * 0.7}" height="${Math.max(h, 0.5)}">` +
      `<title>${esc(labels[i])}: ${fmt(v)} ${esc(unit)}</title></rect>`;
    if (values.length <= 24) {
      svg += `<text x="${x + bw * 0.35}" y="${H - padB + 14}" text-anchor="middle">${esc(labels[i])}</text>`;
    }
  });
  el.innerHTML = svg + "</svg>";
}

function fmt(x) {
  if (x === 0) return "0";
  if (Math.abs(x) >= 100) return x.toFixed(0);
  if (Math.abs(x) >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

// -- chat ------------------------------------------------------------------------------------------
function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.innerHTML = `<span class="who">${role === "user" ? "you" : role === "assistant" ? "model" : role}</span>`;
  const body = document.createElement("span");
  body.className = "body";
  body.textContent = text || "";
  div.appendChild(body);
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return body;
}

async function send(text) {
  if (state.busy || !text.trim()) return;
  state.busy = true;
  $("send").disabled = true;
  state.history.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant", "");
  out.parentElement.classList.add("streaming");
  const body = {
    model: state.model, messages: state.history, stream: true,
    temperature: Number($("temperature").value), top_p: Number($("top-p").value),
    max_tokens: Number($("max-tokens").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  const t0 = performance.now();
  const times = [];
  let reply = "", usage = null;
  try {
    const resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!resp.ok) {
      const err = await resp.json().catch(() => ({ error: { message: resp.statusText } }));
      throw new Error(`HTTP ${resp.status}: ${err.error ? err.error.message : resp.statusText}`);
    }
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("");
        if (!data || data === "[DONE]") continue;
        const msg = JSON.parse(data);
        if (msg.error) throw new Error(msg.error.message);
        if (msg.usage) usage = msg.usage;
        const piece = msg.choices && msg.choices[0] && msg.choices[0].delta ? msg.choices[0].delta.content : "";
        if (!piece) continue;
        const now = performance.now();
        const gap = now - (times.length ? times[times.length - 1] : t0);
        times.push(now);
        const span = document.createElement("span");
        span.className = "tok";
        span.title = (times.length === 1 ? "first token: " : "") + gap.toFixed(1) + " ms";
        span.textContent = piece;
        out.appendChild(span);
        reply += piece;
        $("messages").scrollTop = $("messages").scrollHeight;
      }
    }
    state.history.push({ role: "assistant", content: reply });
    showStats(t0, times, usage);
  } catch (e) {
    state.history.pop();
    const err = addMessage("error", String(e.message || e));
    err.parentElement.classList.add("error");
  } finally {
    out.parentElement.classList.remove("streaming");
    out.parentElement.classList.add("done");
    state.busy = false;
    $("send").disabled = false;
    refreshHealth();
  }
}

function showStats(t0, times, usage) {
  if (!times.length) return;
  const gaps = times.map((t, i) => t - (i ? times[i - 1] : t0));
  const total = (times[times.length - 1] - t0) / 1000;
  const inter = gaps.slice(1).sort((a, b) => a - b);
  $("stat-ttft").textContent = gaps[0].toFixed(1) + " ms";
  $("stat-tokens").textContent = usage ? `${usage.completion_tokens} (prompt ${usage.prompt_tokens})` : String(times.length);
  $("stat-tps").textContent = total > 0 ? (times.length / total).toFixed(1) : "-";
  $("stat-itl").textContent = inter.length ? inter[Math.floor(inter.length / 2)].toFixed(1) + " ms" : "-";
  barChart($("latency-chart"), gaps.map((_, i) => String(i + 1)), gaps, "ms");
}

$("chat-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("chat-input").value;
  $("chat-input").value = "";
  send(text);
});
$("chat-input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("chat-form").requestSubmit();
  }
});
$("clear").addEventListener("click", () => { state.history = []; $("messages").innerHTML = ""; });
$("api-key").value = localStorage.getItem("llmir-api-key") || "";
$("api-key").addEventListener("change", () => { localStorage.setItem("llmir-api-key", $("api-key").value); load(); });

async function refreshHealth() {
  try {
    const r = await fetch("/health");
    $("health").textContent = JSON.stringify(await r.json(), null, 1);
  } catch (e) { $("health").textContent = String(e); }
}

// -- IR view -----------------------------------------------------------------------------------------
const TOKEN = new RegExp([
  String.raw`(\/\/.*$)`, // comment
  String.raw`("(?:[^"\\]|\\.)*")`, // string
  String.raw`([%@][\w.$#-]+)`, // SSA value or symbol
  String.raw`\b((?:tensor|vector|memref)<[^>]*>)`, // type
  String.raw`\b(module|func\.func|return|attributes|dense)\b`, // keyword
  String.raw`\b([a-z_][a-z0-9_]*\.[a-z_][\w.]*)\b`, // op name
  String.raw`(-?\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b)`, // number
].join("|"), "g");
const CLASSES = ["k-com", "k-str", "k-ssa", "k-type", "k-kw", "k-op", "k-num"];
const LOC = /\sloc\(("(?:[^"\\]|\\.)*")\)\s*$/;

function highlightLine(line) {
  let html = "", last = 0, m;
  TOKEN.lastIndex = 0;
  while ((m = TOKEN.exec(line)) !== null) {
    if (m[0] === "") { TOKEN.lastIndex++; continue; }
    html += esc(line.slice(last, m.index));
    const k = m.slice(1).findIndex((g) => g !== undefined);
    html += `<span class="${CLASSES[k]}">${esc(m[0])}</span>`;
    last = m.index + m[0].length;
  }
  return html + esc(line.slice(last));
}

function renderIR(el, text, pane) {
  if (!text) { el.innerHTML = `<span class="line muted">(not available: pass --ir / --lowered to llmir serve)</span>`; return; }
  const lines = text.split("\n");
  const parts = new Array(lines.length);
  lines.forEach((line, i) => {
    const m = LOC.exec(line);
    let body = line, loc = null;
    if (m) { body = line.slice(0, m.index); loc = JSON.parse(m[1]); }
    let html = `<span class="ln">${i + 1}</span>` + highlightLine(body);
    if (loc !== null) html += ` <a class="k-loc" data-loc="${esc(loc)}" title="show every op from ${esc(loc)}">loc(${esc(m[1])})</a>`;
    parts[i] = `<span class="line" id="${pane}-L${i + 1}"${loc !== null ? ` data-loc="${esc(loc)}"` : ""}>${html}</span>`;
  });
  el.innerHTML = parts.join("");
}

function showLoc(loc, from) {
  document.querySelectorAll(".ir .line.hl").forEach((l) => l.classList.remove("hl"));
  for (const pane of ["ir-source", "ir-lowered"]) {
    const hits = [...$(pane).querySelectorAll(".line")].filter((l) => l.dataset.loc === loc);
    hits.forEach((l) => l.classList.add("hl"));
    if (hits.length && pane !== from) hits[0].scrollIntoView({ block: "center" });
  }
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a.k-loc");
  if (a) { ev.preventDefault(); showLoc(a.dataset.loc, a.closest(".ir").id); }
});

// -- passes and report --------------------------------------------------------------------------------
function renderPasses(report, passes) {
  $("report").textContent = report || "(no report: pass --report FILE, the output of `llmir optimize --report`)";
  if (!passes || !passes.length) {
    $("passes").innerHTML = `<p class="muted">(no pass dumps: pass --dump-dir DIR from \`llmir optimize --print-after-all --dump-dir DIR\`)</p>`;
    return;
  }
  $("passes").innerHTML = passes.map((p) => {
    const lines = (p.diff || "").split("\n").map((l) => {
      const cls = l.startsWith("@@") ? "d-hunk" : l.startsWith("+") && !l.startsWith("+++") ? "d-add"
        : l.startsWith("-") && !l.startsWith("---") ? "d-del" : "";
      return cls ? `<span class="${cls}">${esc(l)}</span>` : esc(l) + "\n";
    }).join("");
    return `<details class="pass"${p.changed ? "" : ""}><summary>${esc(p.file)} <b>${esc(p.pass)}</b> ` +
      `${p.changed ? "" : '<span class="muted">(no change)</span>'}</summary><pre>${lines}</pre></details>`;
  }).join("");
}

// -- bench -----------------------------------------------------------------------------------------
function renderBench(bench) {
  if (!bench) {
    $("bench-info").textContent = "(no bench results: pass --bench FILE, the output of `llmir bench ARTIFACT --format json`)";
    return;
  }
  const c = bench.config || {}, r = bench.results || {}, runs = bench.runs || [];
  const fp = bench.fingerprint || {};
  $("bench-info").textContent = `prompt ${c.prompt_len} tokens, generate ${c.gen_len}, batch ${c.batch}, ` +
    `threads ${c.threads}, ${runs.length} runs` + (fp.cpu ? ` on ${fp.cpu}` : "");
  const labels = runs.map((_, i) => "run " + (i + 1));
  barChart($("chart-decode"), labels, runs.map((x) => (x.itl_s || []).length * (c.batch || 1) / (x.decode_s || 1e-9)), "tok/s");
  barChart($("chart-ttft"), labels, runs.map((x) => (x.ttft_s || 0) * 1000), "ms");
  const itl = r.itl_ms || {};
  barChart($("chart-itl"), ["p50", "p90", "p99"], [itl.p50 || 0, itl.p90 || 0, itl.p99 || 0], "ms");
}

// -- startup ---------------------------------------------------------------------------------------
async function load() {
  try {
    const resp = await fetch("/api/playground", { headers: headers() });
    const info = await resp.json();
    if (!resp.ok) throw new Error(info.error ? info.error.message : resp.statusText);
    state.model = info.model;
    $("model-name").textContent = `${info.model} (context ${info.max_context})`;
    renderIR($("ir-source"), info.source && info.source.text, "ir-source");
    renderIR($("ir-lowered"), info.lowered && info.lowered.text, "ir-lowered");
    if (info.source) $("source-title").textContent = "Source IR: " + info.source.file;
    if (info.lowered) $("lowered-title").textContent = "Lowered IR: " + info.lowered.file;
    renderPasses(info.report, info.passes);
    renderBench(info.bench);
    document.body.dataset.loaded = "1";
  } catch (e) {
    $("model-name").textContent = "cannot load the playground data: " + (e.message || e);
  }
  refreshHealth();
}
load();
