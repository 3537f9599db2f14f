"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("data").textContent);
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const view = { source: 0, index: 0 };

  // The only way data reaches the page: text nodes. No innerHTML anywhere.
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function fmt(x) {
    if (x === null || x === undefined) return "-";
    return Number.isInteger(x) ? String(x) : Number(x).toFixed(3);
  }
  function option(select, value, label) {
    const o = el("option", null, label);
    o.value = String(value);
    select.appendChild(o);
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  // ---- episodes tab ----
  function filtered() {
    const src = DATA.sources[view.source];
    const outcome = $("outcome").value, env = $("env").value;
    return src.episodes.filter((e) =>
      (outcome === "all" || (outcome === "success") === e.success) &&
      (env === "" || e.env_id === env));
  }

  function actionChips(turn) {
    const line = el("div");
    const executed = turn.executed.map((a) => String(a).trim().toLowerCase());
    line.appendChild(el("span", null, "actions: "));
    if (!turn.actions.length) line.appendChild(el("span", "bad", "(none parsed)"));
    for (const a of turn.actions) {
      const hit = executed.includes(String(a).trim().toLowerCase());
      line.appendChild(el("span", "chip " + (hit ? "ok" : turn.num_invalid ? "bad" : ""), a));
    }
    line.appendChild(el("span", null, "  executed: " + (turn.executed.join(", ") || "none")));
    if (turn.num_invalid) line.appendChild(el("span", "bad", "  invalid: " + turn.num_invalid));
    return line;
  }

  function turnCard(turn, k) {
    const card = el("div", "turn");
    card.appendChild(el("h3", null, "Turn " + (k + 1)));
    if (turn.window_start > 1) {  // rollout.context_window dropped earlier turns
      const shown = turn.window_start === k + 1 ? "turn " + (k + 1) + " only" :
        "turns " + turn.window_start + "-" + (k + 1);
      card.appendChild(el("div", "window", "prompt showed the task and " + shown));
    }
    const cols = el("div", "cols2");
    const left = el("div"), right = el("div");
    left.appendChild(el("h4", null, "State"));
    left.appendChild(el("pre", "state", turn.state));
    if (turn.think) {
      right.appendChild(el("h4", null, "Think"));
      right.appendChild(el("pre", "think", turn.think));
    }
    right.appendChild(el("h4", null, "Response"));
    right.appendChild(el("pre", "response", turn.response));
    cols.appendChild(left); cols.appendChild(right);
    card.appendChild(cols);
    card.appendChild(actionChips(turn));
    for (const result of turn.tool_results || []) {  // a tool-calling env's answers
      const failed = String(result).startsWith("Error:");
      card.appendChild(el("pre", "tool" + (failed ? " bad" : ""), "tool → " + result));
    }
    let rewards = "env reward " + fmt(turn.env_reward) + " · training reward " + fmt(turn.reward);
    if (turn.format_penalty) rewards += " (format penalty " + fmt(turn.format_penalty) + ")";
    if (turn.format_bonus) rewards += " (format bonus " + fmt(turn.format_bonus) + ")";
    card.appendChild(el("div", null, rewards));
    if (!turn.format_ok) card.appendChild(el("div", "bad", "format broken"));
    if (turn.finish_reason === "length") card.appendChild(el("div", "bad", "cut at token budget"));
    return card;
  }

  function episodeHeader(ep) {
    const head = el("div", "ephead");
    const add = (id, label, value, cls) => {
      const s = el("span", cls, label + value); s.id = id; head.appendChild(s);
    };
    add("ep-env", "env ", ep.env_id);
    add("ep-seed", "seed ", ep.seed);
    if (ep.group !== null) add("ep-group", "group ", ep.group);
    add("ep-policy", "policy ", ep.policy);
    add("ep-outcome", "", ep.success ? "success" : "failure", ep.success ? "ok" : "bad");
    if (ep.error) add("ep-error", "env error: ", ep.error, "bad");
    add("ep-reward", "reward ", fmt(ep.reward) + " (env " + fmt(ep.env_reward) + ")");
    add("turn-count", "turns ", ep.turns.length);
    add("ep-actions", "actions ", ep.num_actions);
    return head;
  }

  function renderEpisode() {
    const src = DATA.sources[view.source], list = filtered(), box = $("episode");
    const wins = src.episodes.filter((e) => e.success).length;
    let note = src.episodes.length + " episodes in " + src.label + " (" + src.file + "), " +
      wins + " successful; " + list.length + " match the filters.";
    if (src.total > src.episodes.length)
      note += " Showing the first " + src.episodes.length + " of " + src.total +
        " (the page embeds at most " + DATA.cap + " per step).";
    $("source-note").textContent = note;
    view.index = Math.max(0, Math.min(view.index, list.length - 1));
    $("position").textContent = list.length ? (view.index + 1) + " / " + list.length : "0 / 0";
    clear(box);
    if (!list.length) {
      box.appendChild(el("p", "note", "No episode matches the filters."));
      return;
    }
    const ep = list[view.index];
    box.appendChild(episodeHeader(ep));
    ep.turns.forEach((t, k) => box.appendChild(turnCard(t, k)));
    box.appendChild(el("h4", null, "Final state"));
    box.appendChild(el("pre", "state", ep.final_state));
  }

  function step(delta) {
    const n = filtered().length;
    if (n) { view.index = (view.index + delta + n) % n; renderEpisode(); }
  }

  function fillEnvs() {
    const envs = new Set(DATA.sources[view.source].episodes.map((e) => e.env_id));
    const select = $("env"), keep = select.value;
    clear(select);
    option(select, "", "all");
    for (const e of [...envs].sort()) option(select, e, e);
    select.value = envs.has(keep) ? keep : "";
  }

  // ---- same seed across steps ----
  function stepSources(kind) { return DATA.sources.filter((s) => s.kind === kind); }

  function fillSeeds() {
    const seeds = new Set();
    for (const s of stepSources($("seed-kind").value))
      for (const e of s.episodes) seeds.add(e.seed);
    const select = $("seed"), keep = select.value;
    clear(select);
    for (const s of [...seeds].sort((a, b) => a - b)) option(select, s, s);
    if (seeds.has(Number(keep))) select.value = keep;
    renderSeeds();
  }

  function renderSeeds() {
    const box = $("seed-columns"), seed = Number($("seed").value);
    clear(box);
    for (const src of stepSources($("seed-kind").value)) {
      const col = el("div", "column");
      col.appendChild(el("h3", null, src.label));
      const eps = src.episodes.filter((e) => e.seed === seed);
      if (!eps.length) col.appendChild(el("div", "note", "seed not in this step"));
      for (const ep of eps) {
        const mini = el("div", "mini");
        mini.appendChild(el("div", ep.success ? "ok" : "bad",
          (ep.success ? "success" : "failure") + " · reward " + fmt(ep.reward)));
        ep.turns.forEach((t, k) => {
          mini.appendChild(el("pre", "state", t.state));
          mini.appendChild(el("div", null, (k + 1) + ": " + (t.actions.join(", ") || "(none)") +
            (t.num_invalid ? "  [" + t.num_invalid + " invalid]" : "") + " → " + fmt(t.reward)));
        });
        mini.appendChild(el("pre", "state", ep.final_state));
        col.appendChild(mini);
      }
      box.appendChild(col);
    }
  }

  // ---- metric curves (own SVG, no library) ----
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const k in attrs) node.setAttribute(k, String(attrs[k]));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function chart(name, points) {
    const W = 640, H = 170, L = 56, R = 12, T = 20, B = 24;
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= 1; y1 += 1; }
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    const root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, class: "chart" });
    root.appendChild(svg("text", { x: L, y: 14 }, name));
    root.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999" }));
    root.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#999" }));
    root.appendChild(svg("text", { x: 4, y: T + 8 }, fmt(y1)));
    root.appendChild(svg("text", { x: 4, y: H - B }, fmt(y0)));
    root.appendChild(svg("text", { x: L, y: H - 6 }, "step " + fmt(x0)));
    root.appendChild(svg("text", { x: W - R - 60, y: H - 6 }, "step " + fmt(x1)));
    for (const a of DATA.alerts) {
      if (typeof a.step !== "number" || a.step < x0 || a.step > x1) continue;
      const color = a.state === "critical" ? "#b3261e" : "#e08a00";
      const line = svg("line", { x1: sx(a.step), y1: T, x2: sx(a.step), y2: H - B,
        stroke: color, "stroke-dasharray": "4 3", class: "alert-mark" });
      line.appendChild(svg("title", {}, "step " + a.step + " " + a.state + " " + a.rule +
        ": " + a.message));
      root.appendChild(line);
    }
    const d = points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " +
      sy(p[1]).toFixed(1)).join(" ");
    root.appendChild(svg("path", { d: d, fill: "none", stroke: "#1f5fa8", "stroke-width": 1.5 }));
    if (points.length < 30)
      for (const p of points)
        root.appendChild(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: "#1f5fa8" }));
    return root;
  }

  function renderCharts() {
    const box = $("charts");
    clear(box);
    for (const box2 of $("metric-picker").querySelectorAll("input:checked")) {
      const name = box2.value, points = DATA.metrics[name];
      if (points && points.length) box.appendChild(chart(name, points));
    }
  }

  function buildMetrics() {
    const picker = $("metric-picker"), names = Object.keys(DATA.metrics).sort();
    if (!names.length) picker.appendChild(el("p", "note", "No metrics.jsonl in this folder."));
    for (const name of names) {
      const label = el("label"), input = el("input");
      input.type = "checkbox"; input.value = name;
      input.checked = DATA.default_metrics.includes(name);
      input.addEventListener("change", renderCharts);
      label.appendChild(input); label.appendChild(document.createTextNode(" " + name));
      picker.appendChild(label);
    }
    const list = $("alerts");
    if (!DATA.alerts.length) list.appendChild(el("li", null, "no alerts"));
    for (const a of DATA.alerts)
      list.appendChild(el("li", a.state === "critical" ? "bad" : null,
        "step " + a.step + " · " + a.state + " · " + a.rule + " · " + a.message));
    renderCharts();
  }

  // ---- wiring ----
  function showTab(name) {
    for (const b of document.querySelectorAll("header button"))
      b.classList.toggle("active", b.dataset.tab === name);
    for (const s of document.querySelectorAll("section"))
      s.hidden = s.id !== "tab-" + name;
  }

  // Lines the reader skipped (a run killed mid-write): said on the page, not hidden.
  function showWarnings() {
    const box = $("warnings"), warnings = DATA.warnings || [];
    for (const w of warnings) box.appendChild(el("div", null, "warning: " + w));
    box.hidden = !warnings.length;
  }

  function init() {
    $("title").textContent = "starpo viewer · " + DATA.run;
    showWarnings();
    const src = $("source");
    DATA.sources.forEach((s, i) => option(src, i, s.label + " (" + s.total + ")"));
    src.addEventListener("change", () => {
      view.source = Number(src.value); view.index = 0; fillEnvs(); renderEpisode();
    });
    for (const id of ["outcome", "env"])
      $(id).addEventListener("change", () => { view.index = 0; renderEpisode(); });
    $("prev").addEventListener("click", () => step(-1));
    $("next").addEventListener("click", () => step(1));
    document.addEventListener("keydown", (e) => {
      if (e.target.tagName === "SELECT" || e.target.tagName === "INPUT") return;
      if (e.key === "ArrowLeft") step(-1);
      if (e.key === "ArrowRight") step(1);
    });
    const kinds = ["train", "val", "eval", "sft"].filter((k) => stepSources(k).length);
    for (const k of kinds) option($("seed-kind"), k, k);
    $("seed-kind").addEventListener("change", fillSeeds);
    $("seed").addEventListener("change", renderSeeds);
    for (const b of document.querySelectorAll("header button"))
      b.addEventListener("click", () => showTab(b.dataset.tab));
    if (DATA.summary !== null) $("summary").textContent = JSON.stringify(DATA.summary, null, 2);
    else $("tab-button-summary").hidden = true;
    fillEnvs(); renderEpisode(); fillSeeds(); buildMetrics(); showTab("episodes");
    document.body.dataset.ready = "1";  // lets tests wait for the first render
  }
  init();
})();
