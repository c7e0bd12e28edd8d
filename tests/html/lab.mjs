// The JupyterLab check (`make test-lab`): what a reader sees who runs a notebook in
// JupyterLab. It starts `make lab` itself, headless, on a temporary copy of one notebook (Run
// All and saving never touch notebooks/), opens the notebook in Debian's Chromium and fails on:
//   - a notebook marked modified by opening it (the tab's dirty dot, once the kernel is idle);
//   - a solution cell (tag "solution") whose folded input shows more than "%%solution"
//     (JupyterLab shows a folded cell's first line: the answer must not be on it);
//   - after Run All (the Run menu): an error output; an exercise cell (the code cell before a
//     solution) that does not say "Not answered yet"; a solution cell that shows more of
//     its output than its one "Solution: ..." line (no "Correct", no number);
//   - an explorer (a cell that calls explore...()) whose picture does not change within 2 s
//     when its first slider moves a step (a keypress, 2 s after the last picture): six
//     moves, to three settings it has not drawn yet (cold) and three it has (warm); the
//     median of each kind counts.
// It prints each step's time, every redraw's time (cold and warm) and a summary line.
//
// How the server starts: `make lab`, unchanged, run with `make -C <tmp> -f <repo>/Makefile`
// so that its relative paths (notebooks/, .venv) resolve in a temporary folder that holds a
// copy of the notebook and links to .venv and pyproject.toml. So the check runs the target a
// reader runs (as root too: the Makefile adds --allow-root), and the rest of the set-up comes
// from a temporary JUPYTER_CONFIG_DIR: 127.0.0.1, a free port, a random token, no browser,
// autosave off, no news, and the app exposed to the page (window.jupyterapp: the kernel's
// state and the document's model, which the failure messages quote; every check reads what
// the page shows). The server and its kernels are stopped on exit, on an error, on Ctrl-C
// and on SIGTERM; a process left behind is reported and killed.
//
// Usage: node tests/html/lab.mjs [notebooks/collectives.ipynb]
// (Chromium is /usr/bin/chromium, or $CHROMIUM; LAB_KEEP=1 keeps the temporary folder.)

import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, openSync, readFileSync, readdirSync, readlinkSync, rmSync,
         symlinkSync, writeFileSync } from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const NOTEBOOK = resolve(process.argv[2] ?? join(REPO, "notebooks", "collectives.ipynb"));
const BROWSER = process.env.CHROMIUM ?? "/usr/bin/chromium";
const TOKEN = randomBytes(16).toString("hex");
const SERVER_START_S = 180;     // `make lab` on a loaded 2-core machine (its $(STAMP) first)
const KERNEL_IDLE_S = 180;      // a kernel's start on a loaded machine
const SETTLE_MS = 5_000;        // after the kernel is idle: what the page still does by itself
const RUN_ALL_S = 900;          // Run All (collectives: ~25 s; fourd: ~2 min alone on 2 cores)
const REDRAW_MAX_MS = 2_000;    // the solution rules (issue 42): every explorer, on 2 cores
const REDRAW_WAIT_MS = 60_000;  // how long a redraw is waited for, to print its time anyway
const LOOK_MS = 2_000;          // a reader looks at a picture before moving the slider again
                                // (the 4D explorer plans the next settings meanwhile)

const log = (line) => console.log(`lab: ${line}`);
const seconds = (ms) => `${(ms / 1000).toFixed(1)} s`;

// ---------------------------------------------------------------- the server

// The temporary folder `make lab` runs in: notebooks/ (the one copy), links to the venv and
// pyproject.toml (the $(STAMP) rule's prerequisite), and JupyterLab's configuration.
function makeLabDir() {
  const notebook = asThisPythonSavedIt(NOTEBOOK);
  const dir = mkdtempSync(join(tmpdir(), "minipar-lab-"));
  mkdirSync(join(dir, "notebooks"));
  writeFileSync(join(dir, "notebooks", basename(NOTEBOOK)), notebook);
  symlinkSync(join(REPO, ".venv"), join(dir, ".venv"));
  symlinkSync(join(REPO, "pyproject.toml"), join(dir, "pyproject.toml"));
  const config = join(dir, "config");
  const write = (path, value) => {
    mkdirSync(dirname(join(config, path)), { recursive: true });
    writeFileSync(join(config, path), JSON.stringify(value, null, 1));
  };
  write("jupyter_server_config.json", {
    ServerApp: { ip: "127.0.0.1", port: 0, open_browser: false },
    IdentityProvider: { token: TOKEN },
    LabApp: { expose_app_in_browser: true },
  });
  // LabApp keeps user settings and workspaces under JUPYTER_CONFIG_DIR/lab: a reader's own
  // settings and open tabs stay out of the check.
  const settings = "lab/user-settings/@jupyterlab";
  write(`${settings}/docmanager-extension/plugin.jupyterlab-settings`, { autosave: false });
  write(`${settings}/apputils-extension/notification.jupyterlab-settings`,
        { fetchNews: "false", checkForUpdates: false });
  return dir;
}

// The notebook as this machine's Python would have saved it: language_info.version is the
// Python that last ran it, and JupyterLab records the kernel's own when it opens the notebook
// (a reader with another Python sees it marked modified; no notebook can avoid that). The
// copy gets the venv's version, so that the check tests what the notebook controls.
function asThisPythonSavedIt(path) {
  const notebook = JSON.parse(readFileSync(path, "utf8"));
  const python = spawnSync(join(REPO, ".venv", "bin", "python"),
                           ["-c", "import platform; print(platform.python_version())"],
                           { encoding: "utf8" }).stdout?.trim();
  const info = notebook.metadata.language_info;
  if (info && python && info.version !== python) {
    log(`the copy's language_info.version: ${info.version} -> ${python} (this venv's Python)`);
    info.version = python;
  }
  return JSON.stringify(notebook, null, 1) + "\n";
}

// `make lab`, in its own process group (so that one signal reaches make and the server).
function startLab(dir) {
  const out = join(dir, "lab.log");
  const fd = openLog(out);
  const child = spawn("make", ["--no-print-directory", "-s", "-C", dir, "-f", join(REPO, "Makefile"), "lab"], {
    detached: true, stdio: ["ignore", fd, fd],
    env: { ...process.env, JUPYTER_CONFIG_DIR: join(dir, "config"),
           JUPYTER_RUNTIME_DIR: join(dir, "runtime") },
  });
  child.exited = new Promise((ok) => child.on("exit", (code, signal) => ok(code ?? signal)));
  child.logPath = out;
  return child;
}

function openLog(path) {
  writeFileSync(path, "");
  return openSync(path, "a");
}

const tail = (path, lines = 15) =>
  readFileSync(path, "utf8").trim().split("\n").slice(-lines).map((l) => `    ${l}`).join("\n");

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

// Waits for the server's runtime file (it names the port) and for its API to answer.
async function waitForServer(dir, child) {
  const runtime = join(dir, "runtime");
  const deadline = Date.now() + SERVER_START_S * 1000;
  let exited = null;
  child.exited.then((why) => { exited = why; });
  while (Date.now() < deadline) {
    if (exited !== null) throw new Error(`make lab exited (${exited}):\n${tail(child.logPath)}`);
    const info = safeList(runtime).find((f) => /^jpserver-\d+\.json$/.test(f));
    if (info) {
      const { port } = JSON.parse(readFileSync(join(runtime, info), "utf8"));
      const base = new URL(`http://127.0.0.1:${port}/`);
      if (await api(base, "api/status").then((r) => r.ok, () => false)) return base;
    }
    await sleep(500);
  }
  throw new Error(`make lab did not serve within ${SERVER_START_S} s:\n${tail(child.logPath)}`);
}

const safeList = (dir) => { try { return readdirSync(dir); } catch { return []; } };

function api(base, path, method = "GET") {
  return fetch(new URL(path, base), { method, headers: { Authorization: `token ${TOKEN}` } });
}

// The processes this check started: make, the server and the kernels, found by what ties
// them to the temporary folder (make's -C, the server's working directory, the kernels'
// connection files under runtime/). Linux's /proc; elsewhere none are found.
function ourProcesses(dir) {
  const pids = [];
  for (const pid of safeList("/proc").filter((p) => /^\d+$/.test(p) && +p !== process.pid)) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      const cwd = readlinkSync(`/proc/${pid}/cwd`);
      if (cmd.includes(dir) || cwd === dir || cwd.startsWith(dir + "/")) pids.push(+pid);
    } catch { /* gone, or not ours to read */ }
  }
  return pids;
}

// Shuts the kernels down through the API (the server waits for them), then stops the
// server as Ctrl-C would; whatever is left after 15 s is killed and named.
async function stopLab(dir, child, base) {
  if (base) {
    const kernels = await api(base, "api/kernels").then((r) => r.json(), () => []);
    await Promise.all(kernels.map((k) => api(base, `api/kernels/${k.id}`, "DELETE").catch(() => {})));
  }
  try { process.kill(-child.pid, "SIGTERM"); } catch { /* already gone */ }
  const deadline = Date.now() + 15_000;
  while (ourProcesses(dir).length && Date.now() < deadline) await sleep(250);
  const left = ourProcesses(dir);
  for (const pid of left) try { process.kill(pid, "SIGKILL"); } catch { /* gone */ }
  return left;
}

// ---------------------------------------------------------------- the page

// Put in the page before JupyterLab loads, for the functions below that run in the page:
// the notebook's panel by its path (relative to the server's root), and how many of its
// cells wait for the kernel ("[*]" in their prompt).
function definePageHelpers() {
  window.labPanel = (path) => Array.from(window.jupyterapp?.shell.widgets("main") ?? [])
    .find((w) => w.context?.path === path);
  window.labPending = (path) => window.labPanel(path).content.widgets
    .filter((c) => c.node.querySelector(".jp-InputPrompt")?.textContent.includes("*")).length;
}

// Runs in the page: the panel's kernel is idle and the document has loaded.
function kernelIdle(path) {
  const panel = window.labPanel(path);
  return Boolean(panel?.context.isReady && panel.sessionContext.session?.kernel?.status === "idle");
}

// Runs in the page: is the notebook's tab marked modified (the dot where its × is)?
function tabDirty(path) {
  const panel = window.labPanel(path);
  const tab = Array.from(document.querySelectorAll(".lm-DockPanel-tabBar .lm-TabBar-tab"))
    .find((t) => t.dataset.id === panel.id);
  return { tab: Boolean(tab?.classList.contains("jp-mod-dirty")), model: panel.context.model.dirty,
           document: panel.context.model.toJSON() };
}

// Runs in the page: each cell's kind, execution count and outputs, from the model.
function cellStates(path) {
  const panel = window.labPanel(path);
  return panel.content.widgets.map((cell) => ({
    type: cell.model.type,
    count: cell.model.type === "code" ? cell.model.executionCount : null,
    outputs: cell.model.type === "code" ? cell.model.outputs.toJSON() : [],
  }));
}

// Runs in the page: what cell `i` shows, read off the screen (the cell scrolled into view
// first: JupyterLab skips drawing cells off screen). A prompt ("[3]:", "Out[3]:") is not text.
function shownText([path, i]) {
  const panel = window.labPanel(path);
  const cell = panel.content.widgets[i].node;
  cell.scrollIntoView({ block: "center" });
  const text = (el) => {
    if (!el || !el.getClientRects().length) return null;      // not shown at all
    return el.innerText.split("\n").filter((line) => !/^\s*(Out)?\[[\d *]*\]:\s*$/.test(line))
      .join("\n").trim();
  };
  const input = cell.querySelector(".jp-Cell-inputWrapper");
  return {
    inputFolded: Boolean(cell.querySelector(".jp-InputPlaceholder")?.getClientRects().length) &&
                 !cell.querySelector(".jp-InputArea")?.getClientRects().length,
    input: text(input),
    outputFolded: Boolean(cell.querySelector(".jp-OutputPlaceholder")?.getClientRects().length),
    output: text(cell.querySelector(".jp-Cell-outputWrapper")),
  };
}

async function openNotebook(tab, base, name, report) {
  tab.on("pageerror", (err) => report(`uncaught exception in the page: ${err.message}`));
  const url = new URL(`lab/tree/${encodeURIComponent(name)}`, base);
  url.searchParams.set("token", TOKEN);
  const started = Date.now();
  await tab.goto(url.href, { waitUntil: "load", timeout: 120_000 });
  await tab.waitForFunction(kernelIdle, name, { timeout: KERNEL_IDLE_S * 1000, polling: 250 });
  return Date.now() - started;
}

// ---------------------------------------------------------------- the checks

// Opening a notebook must not mark it modified: a reader who closes it is asked to save
// changes they never made. When it does, say what the page changed (its model against the
// file), which is the cause.
async function checkOpenedClean(tab, name, saved, report) {
  await sleep(SETTLE_MS);
  await tab.waitForFunction(kernelIdle, name, { timeout: KERNEL_IDLE_S * 1000, polling: 250 });
  const dirty = await tab.evaluate(tabDirty, name);
  if (!dirty.tab && !dirty.model) return;
  // Left out: what the page adds on load without marking the notebook modified: a cell's
  // "trusted" (the server strips it when it saves) and "collapsed" (JupyterLab's copy of
  // jupyter.outputs_hidden).
  const changed = differences(saved, dirty.document)
    .filter((d) => !/^cells\.\d+\.metadata\.(trusted|collapsed): \(none\) -> /.test(d)).slice(0, 8);
  report(`opening ${name} marks it modified (tab: ${dirty.tab}, model: ${dirty.model}); the page ` +
         `changed: ${changed.join("; ") || "nothing the document's JSON shows"}`);
}

// Where two notebook JSONs differ, as "path: saved -> now" (multi-line strings compared as
// one string, the way nbformat reads them).
function differences(a, b, path = "") {
  const join = (v) => (Array.isArray(v) && v.every((s) => typeof s === "string") ? v.join("") : v);
  [a, b] = [join(a), join(b)];
  if (JSON.stringify(a) === JSON.stringify(b)) return [];
  if (a && b && typeof a === "object" && typeof b === "object") {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    return keys.flatMap((k) => differences(a[k], b[k], path ? `${path}.${k}` : k));
  }
  const show = (v) => (v === undefined ? "(none)" : JSON.stringify(v).slice(0, 60));
  return [`${path}: ${show(a)} -> ${show(b)}`];
}

// The cells the rules are about, from the saved notebook: solutions (tag "solution"), the
// exercise each answers (the code cell before it) and explorers (a call of explore...()).
function roles(notebook) {
  const code = notebook.cells.map((c, i) => [c, i]).filter(([c]) => c.cell_type === "code");
  const source = (c) => [c.source].flat().join("");
  const solutions = code.filter(([c]) => c.metadata?.tags?.includes("solution")).map(([, i]) => i);
  const exercises = solutions.map((s) => code.filter(([, i]) => i < s).pop()?.[1])
    .filter((i) => i !== undefined && !solutions.includes(i));
  const explorers = code.filter(([c]) => /^\s*explore\w*\(/m.test(source(c))).map(([, i]) => i);
  return { solutions, exercises, explorers };
}

// A folded solution shows its first line, and it must be "%%solution" and nothing more
// (the answer's own comment comes after it).
async function checkFoldedInputs(tab, name, solutions, report) {
  for (const i of solutions) {
    const shown = await tab.evaluate(shownText, [name, i]);
    if (!shown.inputFolded) report(`solution cell ${i}: its input is not folded`);
    else if (!/^%%solution$/.test(shown.input.replace(/[·…]+$/, "").trim()))
      report(`solution cell ${i}: folded, it shows "${shown.input.slice(0, 80)}" (only "%%solution" may show)`);
  }
}

// What a solution cell may show of its output: nothing (folded), or its one line saying
// that it passes, with no verdict ("Correct") and no number from the answer (a digit inside
// a name, check_llama3_..., is not one).
function solutionOutputProblem(shown) {
  if (shown.outputFolded || !shown.output) return null;
  const lines = shown.output.split("\n").map((l) => l.trim()).filter(Boolean);
  const giveaway = (line) => /Correct/.test(line) || /\d/.test(line.replace(/\w*[A-Za-z_]\w*/g, ""));
  if (lines.length === 1 && /^Solution: /.test(lines[0]) && !giveaway(lines[0])) return null;
  return `shows its output: "${shown.output.replace(/\s+/g, " ").slice(0, 100)}"`;
}

// Run All from the Run menu, as a reader would. JupyterLab queues every cell at once ("[*]");
// it is done when none waits and the kernel is idle (a failed cell ends it early: the
// kernel drops the rest of the queue).
async function runAll(tab, name) {
  const started = Date.now();
  await tab.getByRole("menuitem", { name: "Run", exact: true }).click();
  await tab.getByRole("menuitem", { name: /^Run All Cells/ }).click();
  await tab.waitForFunction((path) => window.labPending(path) > 0, name,
                           { timeout: 30_000, polling: "raf" });
  await tab.waitForFunction((path) => window.labPending(path) === 0 &&
                            window.labPanel(path).sessionContext.session?.kernel?.status === "idle",
                           name, { timeout: RUN_ALL_S * 1000, polling: 500 });
  return Date.now() - started;
}

async function checkAfterRunAll(tab, name, cells, report) {
  const states = await tab.evaluate(cellStates, name);
  states.forEach((s, i) => {
    for (const o of s.outputs.filter((o) => o.output_type === "error"))
      report(`cell ${i}: ${o.ename}: ${o.evalue.slice(0, 120)}`);
  });
  const notRun = states.flatMap((s, i) => (s.type === "code" && s.count === null ? [i] : []));
  if (notRun.length) report(`${notRun.length} cells did not run (Run All stops at a failed cell): ${notRun.join(", ")}`);
  for (const i of cells.exercises) {
    const shown = await tab.evaluate(shownText, [name, i]);
    if (!shown.output?.includes("Not answered yet"))
      report(`exercise cell ${i} does not say "Not answered yet" after Run All: "${(shown.output ?? "").slice(0, 80)}"`);
  }
  for (const i of cells.solutions) {
    const problem = solutionOutputProblem(await tab.evaluate(shownText, [name, i]));
    if (problem) report(`solution cell ${i} after Run All ${problem}`);
  }
}

// ---------------------------------------------------------------- the explorers

// Runs in the page: the explorer's first slider (its value as shown) and its picture.
function explorerState([path, i]) {
  const panel = window.labPanel(path);
  const cell = panel.content.widgets[i].node;
  const slider = cell.querySelector(".widget-slider");
  return { value: slider?.querySelector(".widget-readout")?.textContent.trim() ?? null,
           label: slider?.querySelector(".widget-label")?.textContent.trim() ?? null,
           picture: cell.querySelector(".widget-output img")?.src ?? null };
}

// Moves the explorer's first slider one step with the keyboard (as a reader can: the
// handle takes arrow keys) and times the picture's change, from the keypress.
async function timeRedraw(tab, name, i, key) {
  const before = await tab.evaluate(explorerState, [name, i]);
  const handle = (await tab.evaluateHandle(([path, cell]) => window.labPanel(path).content
    .widgets[cell].node.querySelector(".widget-slider .noUi-handle"), [name, i])).asElement();
  await handle.focus();
  const pressed = await tab.evaluate(() => performance.now());
  await handle.press(key);
  const drawnAt = await tab.waitForFunction(([path, cell, old]) => {
    const panel = window.labPanel(path);
    const src = panel.content.widgets[cell].node.querySelector(".widget-output img")?.src;
    return src && src !== old ? performance.now() : false;
  }, [name, i, before.picture], { timeout: REDRAW_WAIT_MS, polling: "raf" })
    .then((h) => h.jsonValue(), () => null);
  const after = await tab.evaluate(explorerState, [name, i]);
  return { from: before.value, to: after.value, label: before.label,
           ms: drawnAt === null ? null : drawnAt - pressed };
}

// The moves: right to a new value, back, left to another, back, there again, one further
// left: three settings the kernel has not drawn (cold: it computes them, or its prefetcher
// did while the reader read) and three it has (warm).
const MOVES = ["ArrowRight", "ArrowLeft", "ArrowLeft", "ArrowRight", "ArrowLeft", "ArrowLeft"];

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];

// Each explorer redraws within REDRAW_MAX_MS: the median of its cold redraws and of its warm
// ones (one slow redraw of three is the machine's other work: 2 cores shared with a test
// run double a redraw's time; it is printed, and fails only when the others are slow too).
async function checkExplorers(tab, name, explorers, report) {
  const times = [];
  for (const i of explorers) {
    const first = await tab.evaluate(explorerState, [name, i]);
    if (!first.picture || first.value === null) {
      report(`explorer cell ${i}: no slider and picture after Run All`);
      continue;
    }
    const drawn = new Set([first.value]);
    for (const key of MOVES) {
      await sleep(LOOK_MS);
      const t = await timeRedraw(tab, name, i, key);
      if (t.from === t.to) continue;                       // at the slider's end: no move
      times.push({ cell: i, kind: drawn.has(t.to) ? "warm" : "cold", ...t });
      drawn.add(t.to);
      if (t.ms === null)
        report(`explorer cell ${i}: ${t.label} ${t.from} -> ${t.to}: no new picture within ${REDRAW_WAIT_MS / 1000} s`);
    }
    for (const kind of ["cold", "warm"]) {
      const ms = times.filter((t) => t.cell === i && t.kind === kind && t.ms !== null).map((t) => t.ms);
      if (!ms.length) report(`explorer cell ${i}: no ${kind} redraw (did its first slider move?)`);
      else if (median(ms) > REDRAW_MAX_MS)
        report(`explorer cell ${i}: ${kind} redraws take ${median(ms).toFixed(0)} ms (median of ` +
               `${ms.map((m) => m.toFixed(0)).join(", ")}; at most ${REDRAW_MAX_MS} ms)`);
    }
  }
  return times;
}

// ---------------------------------------------------------------- main

async function main(dir, state) {
  const name = basename(NOTEBOOK);
  const saved = JSON.parse(readFileSync(join(dir, "notebooks", name), "utf8"));
  const cells = roles(saved);
  const problems = [];
  const report = (what) => problems.push(what);

  state.child = startLab(dir);
  const started = Date.now();
  state.base = await waitForServer(dir, state.child);
  log(`make lab serves ${name} (a copy in ${dir}) on ${state.base.host} after ${seconds(Date.now() - started)}`);

  const browser = state.browser = await chromium.launch({
    executablePath: BROWSER, headless: true,
    handleSIGINT: false, handleSIGTERM: false, handleSIGHUP: false,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  // Nothing but this server: JupyterLab must work offline.
  await context.route("**/*", (route) =>
    new URL(route.request().url()).host === state.base.host ? route.continue() : route.abort());
  await context.addInitScript(definePageHelpers);
  const tab = await context.newPage();

  const openMs = await openNotebook(tab, state.base, name, report);
  log(`opened, kernel idle after ${seconds(openMs)}`);
  await checkOpenedClean(tab, name, saved, report);
  await checkFoldedInputs(tab, name, cells.solutions, report);
  for (const i of cells.solutions) {
    const problem = solutionOutputProblem(await tab.evaluate(shownText, [name, i]));
    if (problem) report(`solution cell ${i}, as saved, ${problem}`);
  }
  const runMs = await runAll(tab, name);
  log(`Run All: ${seconds(runMs)}`);
  await checkAfterRunAll(tab, name, cells, report);
  const times = await checkExplorers(tab, name, cells.explorers, report);
  for (const t of times)
    log(`explorer cell ${t.cell}: ${t.label} ${t.from} -> ${t.to} (${t.kind}): ` +
        (t.ms === null ? "no new picture" : `${t.ms.toFixed(0)} ms`));
  await browser.close();
  state.browser = null;

  const left = await stopLab(dir, state.child, state.base);
  state.child = null;
  if (left.length) report(`processes left after the server stopped (killed): ${left.join(", ")}`);

  const redraws = (kind) => times.filter((t) => t.kind === kind && t.ms !== null)
    .map((t) => t.ms.toFixed(0)).join(", ").replace(/.$/, "$& ms") || "none";
  for (const problem of problems) console.log(`FAIL ${problem}`);
  log(`${name}: ${cells.solutions.length} solutions, ${cells.exercises.length} exercises, ` +
      `${cells.explorers.length} explorer(s); Run All ${seconds(runMs)}; redraws cold ${redraws("cold")}, ` +
      `warm ${redraws("warm")} (load average ${loadavg()[0].toFixed(1)} on ${cpus().length} ` +
      `cores); ${problems.length} problems`);
  return problems.length ? 1 : 0;
}

// The server and the browser are stopped however the check ends: done, failed, Ctrl-C,
// SIGTERM (Playwright's own signal handlers are off: they would exit before the server stops).
const dir = makeLabDir();
const state = { child: null, base: null, browser: null, stopping: null };
function cleanUp() {
  state.stopping ??= (async () => {
    await state.browser?.close().catch(() => {});
    if (state.child) {
      const left = await stopLab(dir, state.child, state.base);
      if (left.length) console.log(`lab: killed what was left: ${left.join(", ")}`);
    }
    if (!process.env.LAB_KEEP) rmSync(dir, { recursive: true, force: true });
  })();
  return state.stopping;
}
for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143], ["SIGHUP", 129]])
  process.on(signal, () => {
    if (state.stopping) return;
    console.log(`lab: ${signal}, stopping the server and its kernel`);
    cleanUp().finally(() => process.exit(code));
  });
try {
  process.exitCode = await main(dir, state);
} catch (err) {
  if (!state.stopping) {
    console.log(`FAIL ${err.message.split("\n")[0]}`);
    if (state.child) console.log(`lab: the server's log:\n${tail(state.child.logPath)}`);
  }
  process.exitCode = 1;
} finally {
  await cleanUp();
}
