"""The page at GET /: try the model in a browser. Self-contained (no CDN, no network): a
textarea, a button, the translation, and its cross-attention drawn on a canvas from
POST /v1/attention (rows: output pieces, columns: source pieces; darker = more attention).
A model of several target languages gets a picker of them (from GET /languages), whose
choice is sent as `tgt_lang`; a bilingual model's page has none."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>attn-mt</title>
<style>
  body { font-family: sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em; }
  textarea { width: 100%; height: 5em; font-size: 1em; }
  #translation { font-size: 1.2em; margin: 1em 0; min-height: 1.5em; }
  #error { color: #b00; }
</style>
</head>
<body>
<h1>attn-mt</h1>
<textarea id="source" placeholder="A sentence to translate"></textarea>
<p><label id="into" hidden>into <select id="target"></select></label>
<button id="go">Translate</button> <span id="error"></span></p>
<div id="translation"></div>
<canvas id="heatmap" width="10" height="10"></canvas>
<script>
const CELL = 28, FONT = "12px sans-serif";

async function listTargets() {
  const reply = await fetch("/languages");
  if (!reply.ok) return;
  const targets = [...new Set((await reply.json()).flatMap((lang) => lang.targets))];
  if (targets.length < 2) return;  // one target language: nothing to choose
  const select = document.getElementById("target");
  for (const code of targets) select.add(new Option(code, code));
  document.getElementById("into").hidden = false;
}

async function translate() {
  const text = document.getElementById("source").value;
  document.getElementById("error").textContent = "";
  const body = {text: text};
  if (!document.getElementById("into").hidden) {
    body.tgt_lang = document.getElementById("target").value;
  }
  const reply = await fetch("/v1/attention", {
    method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify(body),
  });
  const data = await reply.json();
  if (!reply.ok) {
    document.getElementById("error").textContent = data.error;
    return;
  }
  document.getElementById("translation").textContent = data.translation;
  draw(data);
}

function draw(data) {
  const canvas = document.getElementById("heatmap");
  const ctx = canvas.getContext("2d");
  ctx.font = FONT;
  const width = (labels) => Math.max(0, ...labels.map((l) => ctx.measureText(l).width)) + 8;
  const left = width(data.target), top = width(data.source);
  canvas.width = left + CELL * data.source.length;
  canvas.height = top + CELL * data.target.length;
  ctx.font = FONT;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  data.weights.forEach((row, r) => row.forEach((w, c) => {
    const shade = Math.round(255 * (1 - w));
    ctx.fillStyle = `rgb(${shade}, ${shade}, 255)`;
    ctx.fillRect(left + c * CELL, top + r * CELL, CELL, CELL);
  }));
  ctx.fillStyle = "#000";
  data.target.forEach((piece, r) => ctx.fillText(piece, 2, top + r * CELL + CELL * 0.65));
  data.source.forEach((piece, c) => {
    ctx.save();
    ctx.translate(left + c * CELL + CELL * 0.65, top - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(piece, 0, 0);
    ctx.restore();
  });
  canvas.dataset.drawn = String(data.weights.length);
}

document.getElementById("go").addEventListener("click", translate);
listTargets();
</script>
</body>
</html>
"""
