// jaxcap-serve's page: choose an input, caption it, hover a word for its attention heatmap.
"use strict";

const $ = (id) => document.getElementById(id);
const PAGE = 12;  // thumbnails per page of the test split
const state = { meta: null, examples: [], page: 0, input: null, result: null };

function status(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "hint error" : "hint";
}

function query() {
  const method = $("method").value;
  const q = new URLSearchParams({ method });
  if (method === "beam") q.set("beam_size", $("beam-size").value);
  if (method === "sample") q.set("samples", $("samples").value);
  return q;
}

function showControls() {
  const method = $("method").value;
  $("beam-label").hidden = method !== "beam";
  $("samples-label").hidden = method !== "sample";
}

async function caption() {
  const input = state.input;
  if (!input) return;
  const q = query();
  let init = { method: "POST" };
  if (input.kind === "example") q.set("example", input.index);
  else init = { method: "POST", body: input.file, headers: { "Content-Type": input.type } };
  status("captioning…");
  const started = performance.now();
  try {
    const response = await fetch("caption?" + q.toString(), init);
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    state.result = body;
    render(body);
    status(`${body.method} in ${Math.round(performance.now() - started)} ms`);
  } catch (e) {
    $("captions").textContent = "";
    status(e.message, true);
  }
}

function wordLine(seq, cls, boxes) {
  const line = document.createElement("div");
  line.className = cls;
  if (!seq.words.length) line.textContent = "(empty caption)";
  seq.words.forEach((word, t) => {
    const span = document.createElement("span");
    span.className = "word";
    span.textContent = word;
    span.dataset.step = t;
    const show = () => {
      document.querySelectorAll(".word.active").forEach((w) => w.classList.remove("active"));
      span.classList.add("active");
      heatmap(seq.attention ? seq.attention[t] : null, boxes, word, t);
    };
    span.addEventListener("mouseenter", show);
    span.addEventListener("click", show);
    line.appendChild(span);
    line.appendChild(document.createTextNode(" "));
  });
  return line;
}

function render(body) {
  const out = $("captions");
  out.textContent = "";
  clearHeatmap();
  const first = body.captions[0];  // the page sends one image per request
  out.appendChild(wordLine(first, "caption", first.boxes));
  (first.alternatives || []).forEach((alt) => out.appendChild(wordLine(alt, "caption alternative", first.boxes)));
  if (!first.attention) $("heat-label").textContent = "This model records no attention over the regions.";
  else $("heat-label").textContent = "Hover or click a word to see where the model looked.";
}

function clearHeatmap() {
  const canvas = $("heatmap");
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  delete canvas.dataset.word;
  $("bars").textContent = "";
}

// Attention over boxes (normalised x1, y1, x2, y2): each cell of a fine grid sums the weights of
// the boxes covering it (nested regions add up), scaled to the largest, drawn as a red overlay.
function heatmap(weights, boxes, word, t) {
  clearHeatmap();
  if (!weights) return;
  const canvas = $("heatmap");
  canvas.dataset.word = word;
  canvas.dataset.step = t;
  $("heat-label").textContent = `attention of "${word}" (word ${t + 1})`;
  if (!boxes || !$("picture").src || $("picture").hidden) {  // no image: one bar per region
    const top = Math.max(...weights, 1e-9);
    weights.forEach((w) => {
      const bar = document.createElement("div");
      bar.style.height = `${Math.round(60 * w / top)}px`;
      bar.title = w.toFixed(3);
      $("bars").appendChild(bar);
    });
    return;
  }
  const G = 64, heat = new Float32Array(G * G);
  boxes.forEach((b, i) => {
    const w = weights[i] || 0;
    for (let y = Math.floor(b[1] * G); y < Math.min(G, Math.ceil(b[3] * G)); y++)
      for (let x = Math.floor(b[0] * G); x < Math.min(G, Math.ceil(b[2] * G)); x++) heat[y * G + x] += w;
  });
  const top = Math.max(...heat, 1e-9);
  const ctx = canvas.getContext("2d");
  const cell = canvas.width / G;
  for (let y = 0; y < G; y++)
    for (let x = 0; x < G; x++) {
      const v = heat[y * G + x] / top;
      ctx.fillStyle = `rgba(0, 0, 0, ${0.65 * (1 - v)})`;  // darken what the word did not look at
      ctx.fillRect(x * cell, y * cell, cell, cell);
    }
  const best = weights.indexOf(Math.max(...weights));
  const b = boxes[best];
  ctx.strokeStyle = "#ff3030";
  ctx.lineWidth = 3;
  ctx.strokeRect(b[0] * canvas.width, b[1] * canvas.height, (b[2] - b[0]) * canvas.width, (b[3] - b[1]) * canvas.height);
}

function showPicture(src) {
  $("picture").src = src;
  $("picture").hidden = !src;
}

function selectExample(index) {
  state.input = { kind: "example", index };
  document.querySelectorAll("#thumbs img").forEach((img) => img.classList.toggle("selected", +img.dataset.index === index));
  showPicture(`examples/${index}.png`);
  caption();
}

function showPage() {
  const thumbs = $("thumbs");
  thumbs.textContent = "";
  const start = state.page * PAGE, items = state.examples.slice(start, start + PAGE);
  items.forEach((ex) => {
    const img = document.createElement("img");
    img.src = ex.image;
    img.dataset.index = ex.index;
    img.title = ex.references[0] || `test image ${ex.index}`;
    img.addEventListener("click", () => selectExample(ex.index));
    thumbs.appendChild(img);
  });
  $("example-range").textContent = `${start}–${start + items.length - 1} of ${state.examples.length}`;
}

function chooseFile(file, type) {
  if (!file) return;
  if (type === "image" && !/^image\/(png|jpeg)$/.test(file.type)) {
    status(`${file.name}: expected a PNG or JPEG image`, true);
    return;
  }
  state.input = { kind: type, file, type: type === "image" ? file.type : "application/x-npy" };
  showPicture(type === "image" ? URL.createObjectURL(file) : "");
  caption();
}

async function start() {
  const meta = await (await fetch("metadata")).json();
  state.meta = meta;
  const run = meta.run || {};
  const source = run.workdir || run.artefact || "";
  $("model").title = source;  // the full path; the header shows the run's folder name
  $("model").textContent = `${meta.model} · ${source.split("/").filter(Boolean).pop() || ""}` +
    (run.step != null ? ` · step ${run.step}` : "") + ` · ${meta.vocab_size} words`;
  $("feature-shape").textContent = `[N ≤ ${meta.input.max_regions}, ${meta.input.feature_dim}]`;
  $("method").value = (meta.decoding && meta.decoding.method) || "greedy";
  showControls();
  if (meta.input.images) {
    $("drop").hidden = false;
    const zone = $("dropzone");
    zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
    zone.addEventListener("dragleave", () => zone.classList.remove("over"));
    zone.addEventListener("drop", (e) => {
      e.preventDefault();
      zone.classList.remove("over");
      chooseFile(e.dataTransfer.files[0], "image");
    });
    $("image-file").addEventListener("change", (e) => chooseFile(e.target.files[0], "image"));
  } else if (meta.input.no_images) {
    // Say why there is no image drop, and which run would take one (the server's own words).
    $("no-drop-why").textContent = meta.input.no_images;
    $("no-drop").hidden = false;
  }
  $("npy-file").addEventListener("change", (e) => chooseFile(e.target.files[0], "npy"));
  ["method", "beam-size", "samples"].forEach((id) => $(id).addEventListener("change", () => { showControls(); caption(); }));
  if (meta.input.examples) {
    state.examples = (await (await fetch("examples")).json()).examples;
    $("examples").hidden = false;
    $("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); showPage(); });
    $("next").addEventListener("click", () => {
      if ((state.page + 1) * PAGE < state.examples.length) state.page += 1;
      showPage();
    });
    showPage();
  }
  status("ready");
  document.body.dataset.ready = "1";
}

start().catch((e) => status(`could not start: ${e.message}`, true));
