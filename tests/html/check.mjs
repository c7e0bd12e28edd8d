// The browser check of the built book (`make test-html`): serve _build/html on 127.0.0.1,
// open every page in headless Chromium and fail on anything a reader would see go wrong
// offline:
//   - a console error or an uncaught exception;
//   - a request that failed, returned >= 400, or left this machine (the book must be
//     readable with no network, so any request not to 127.0.0.1 is a failure);
//   - an image that did not load;
//   - an internal link to a missing page, or to an anchor the page does not have;
//   - math that MathJax did not typeset (or typeset as an error);
//   - a figure shown more than 1.5x smaller than it was drawn (its text would be too small
//     to read: figures are drawn for the 672 px column, minipar.teach.style.PAGE_WIDTH);
//   - a code or output block that scrolls sideways (folded cells opened first);
//   - an explorer (book/_ext/explorer_html.py) that does not draw, or whose picture does
//     not change when its first control moves.
// It saves a screenshot of each page's first screen under _build/screens/ (and of each
// explorer after its control moved, explorer-<chapter>.png), prints how long
// each explorer took to draw after the page's DOMContentLoaded, and writes what each
// explorer drew for two settings to _build/screens/explorers-drawn.json, which
// tests/html/test_agreement.py compares with the Python figures (`make test-html`).
//
// Usage: node tests/html/check.mjs [_build/html] [_build/screens]
// Chromium is Debian's (/usr/bin/chromium, or $CHROMIUM), driven by playwright-core.

import { createServer } from "node:http";
import { readFile, readdir, mkdir, stat, writeFile } from "node:fs/promises";
import { extname, join, relative, resolve, sep } from "node:path";
import { chromium } from "playwright-core";

const ROOT = resolve(process.argv[2] ?? "_build/html");
const SCREENS = resolve(process.argv[3] ?? join(ROOT, "..", "screens"));
const BROWSER = process.env.CHROMIUM ?? "/usr/bin/chromium";
const PAGE_TIMEOUT_MS = 30_000;
const SETTLE_MS = 10_000;
const MAX_SHRINK = 1.5;      // natural width / shown width of a figure

// ---------------------------------------------------------------- a static file server

const MIME = {
  ".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript",
  ".css": "text/css", ".json": "application/json", ".svg": "image/svg+xml",
  ".png": "image/png", ".jpg": "image/jpeg", ".gif": "image/gif", ".ico": "image/x-icon",
  ".woff": "font/woff", ".woff2": "font/woff2", ".ttf": "font/ttf", ".txt": "text/plain",
};

// Resolves a URL path to a file under ROOT (a folder means its index.html), or null.
async function fileFor(urlPath) {
  let path = join(ROOT, decodeURIComponent(urlPath));
  if (path !== ROOT && !path.startsWith(ROOT + sep)) return null;   // no escaping the root
  try {
    if ((await stat(path)).isDirectory()) path = join(path, "index.html");
    await stat(path);
    return path;
  } catch {
    return null;
  }
}

async function serve(req, res) {
  const path = await fileFor(new URL(req.url, "http://x").pathname);
  if (!path) { res.writeHead(404).end(); return; }
  const type = MIME[extname(path)] ?? "application/octet-stream";
  res.writeHead(200, { "content-type": type }).end(await readFile(path));
}

// Port 0: the system picks a free port, so two checks never collide.
function startServer() {
  return new Promise((ok) => {
    const server = createServer(serve).listen(0, "127.0.0.1", () => ok(server));
  });
}

// ---------------------------------------------------------------- the pages, one by one

// Every .html page of the build, except Sphinx's copies of sources and static files.
async function listPages(dir = ROOT) {
  const pages = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory() && !entry.name.startsWith("_")) pages.push(...await listPages(path));
    else if (entry.isFile() && entry.name.endsWith(".html")) pages.push(relative(ROOT, path));
  }
  return pages.sort();
}

// Runs in the page once it has loaded: images, links, anchors and math, as the reader sees
// them. Returns plain data; the judging happens in Node.
function inspectPage() {
  const images = Array.from(document.images).map((img) => ({
    src: img.currentSrc || img.src,
    loaded: img.complete && img.naturalWidth > 0,
    // how much smaller than drawn the reader sees it (0: not shown, e.g. a folded output)
    shrink: img.getBoundingClientRect().width > 0
      ? img.naturalWidth / img.getBoundingClientRect().width : 0,
  }));
  // Every code and output block, folded ones opened: none may scroll sideways.
  const folded = Array.from(document.querySelectorAll("details:not([open])"));
  folded.forEach((d) => { d.open = true; });
  const scrolling = Array.from(document.querySelectorAll("article pre"))
    .filter((pre) => pre.scrollWidth > pre.clientWidth + 1)
    .map((pre) => pre.innerText.split("\n").reduce((a, b) => (b.length > a.length ? b : a), ""));
  folded.forEach((d) => { d.open = false; });
  const links = Array.from(document.querySelectorAll("a[href]")).map((a) => a.href);
  const ids = Array.from(document.querySelectorAll("[id]")).map((el) => el.id);
  // Sphinx wraps every formula in .math; MathJax puts an mjx-container inside it.
  const math = Array.from(document.querySelectorAll(".math"));
  const untypeset = math.filter((el) => !el.querySelector("mjx-container"))
    .map((el) => el.textContent.trim().slice(0, 60));
  // A TeX error typesets as <mjx-merror>; an undefined macro (MathJax's noundefined) as
  // its own name in red <mjx-mtext>. (\color{red} makes an <mjx-mstyle>, not this.)
  const mathErrors = Array.from(document.querySelectorAll(
    "mjx-merror, mjx-mtext[style*='color: red']"))
    .map((el) => (el.closest("mjx-container")?.querySelector("mjx-assistive-mml")
                  ?.textContent ?? el.textContent).trim().slice(0, 60));
  // Math the parser never recognised is left in the prose as $...$ or \(...\): look at the
  // text outside code, where a dollar sign is not a delimiter.
  const prose = Array.from(document.querySelectorAll("article p, article li, article td"))
    .filter((el) => !el.closest("pre, code, .highlight, .output, .cell_output"))
    .map((el) => el.innerText).join("\n");
  const rawMath = prose.match(/\$[^$\n]*\\[a-zA-Z]+[^$\n]*\$|\\\(|\\\[/g) ?? [];
  return { images, scrolling, links, ids, mathCount: math.length, untypeset, mathErrors, rawMath,
           hasMathJax: typeof window.MathJax?.startup?.promise !== "undefined" };
}

// A page that is only a <meta http-equiv="refresh"> (Sphinx's index.html) navigates away
// at once: check that its target exists instead of rendering it.
async function redirectTarget(page) {
  const html = await readFile(join(ROOT, page), "utf8");
  return html.match(/<meta http-equiv="refresh" content="\d+;\s*url=([^"]+)"/i)?.[1];
}

async function checkPage(context, base, page, problems) {
  const target = await redirectTarget(page);
  if (target) {
    const url = new URL(target, new URL(page, base));
    if (!(await fileFor(url.pathname))) problems.push(`${page}: redirects to a missing page: ${target}`);
    return { links: [url.href], ids: [] };
  }
  const tab = await context.newPage();
  try {
    return await inspectInBrowser(tab, base, page, problems);
  } finally {
    await tab.close();
  }
}

async function inspectInBrowser(tab, base, page, problems) {
  const report = (what) => problems.push(`${page}: ${what}`);
  tab.on("console", (msg) => { if (msg.type() === "error") report(`console error: ${msg.text()}`); });
  tab.on("pageerror", (err) => report(`uncaught exception: ${err.message}`));
  tab.on("requestfailed", (req) => {
    if (new URL(req.url()).host !== base.host) report(`request leaves the machine: ${req.url()}`);
    else report(`request failed: ${req.url()} (${req.failure()?.errorText})`);
  });
  tab.on("response", (res) => { if (res.status() >= 400) report(`HTTP ${res.status()}: ${res.url()}`); });

  await tab.goto(new URL(page, base).href, { waitUntil: "load", timeout: PAGE_TIMEOUT_MS });
  // MathJax typesets after load; wait for it, then for the fonts it asks for.
  await tab.evaluate(() => window.MathJax?.startup?.promise);
  // Then let the network settle. A page with a live explorer may not go quiet for the 500 ms
  // "networkidle" asks for (Plotly keeps drawing); waiting is not the check: every request
  // is checked as it fails or leaves the machine (the listeners above), so stop waiting
  // after a while instead of failing the page.
  await tab.waitForLoadState("networkidle", { timeout: SETTLE_MS }).catch(() => {});
  // Lazy images below the fold have not loaded yet: ask for them all, and wait (a while).
  await tab.evaluate((ms) => Promise.race([
    Promise.all(Array.from(document.images).map((img) => {
      img.loading = "eager";
      return img.complete ? null : new Promise((ok) => { img.onload = img.onerror = ok; });
    })),
    new Promise((ok) => setTimeout(ok, ms)),
  ]), PAGE_TIMEOUT_MS);

  const seen = await tab.evaluate(inspectPage);
  for (const img of seen.images) if (!img.loaded) report(`broken image: ${img.src}`);
  for (const img of seen.images) {
    if (img.shrink > MAX_SHRINK) report(`figure shown ${img.shrink.toFixed(2)}x smaller than drawn: ${img.src}`);
  }
  for (const line of seen.scrolling) report(`block scrolls sideways at 1280 px: ${line.slice(0, 80)}`);
  if (seen.mathCount > 0 && !seen.hasMathJax) report("has math but MathJax did not load");
  for (const tex of seen.untypeset) report(`math not typeset: ${tex}`);
  for (const tex of seen.mathErrors) report(`math error: ${tex}`);
  if (seen.rawMath.length) report(`math left as source (${seen.rawMath.length}×): ${seen.rawMath[0]}`);

  seen.explorers = await checkExplorers(tab, report);

  // book/intro.html -> book__intro.png: one flat folder of first screens.
  const name = page.replace(/\.html$/, "").split(sep).join("__") + ".png";
  await tab.screenshot({ path: join(SCREENS, name) });
  return seen;
}

// ---------------------------------------------------------------- the explorers

// Runs in the page: what an explorer gave Plotly (its traces' numbers, its texts) and the
// SVG Plotly drew from them.
function readExplorer(chapter) {
  const el = window.miniparExplorers[chapter];
  const plot = el.querySelector(".minipar-explorer-plot");
  return {
    key: el.minipar.key, values: el.minipar.values, draws: el.minipar.draws,
    traces: plot.data.map((t) => ({ meta: t.meta, xaxis: t.xaxis, x: t.x, y: t.y,
                                    fill: t.fill, color: t.fillcolor ?? t.line?.color })),
    texts: (plot.layout.annotations ?? []).map((a) => a.text),
    ticks: Object.keys(plot.layout).filter((k) => /^[xy]axis\d*$/.test(k)).sort()
      .map((k) => ({ axis: k, vals: plot.layout[k].tickvals, text: plot.layout[k].ticktext })),
    svg: Array.from(plot.querySelectorAll("path")).map((p) => p.getAttribute("d")).join(" "),
  };
}

// Moves the first control one step (to its next value, or back to the first) as a reader
// would, with an input event.
function moveFirstControl(chapter) {
  const input = window.miniparExplorers[chapter]
    .querySelector(".minipar-explorer-controls select, .minipar-explorer-controls input");
  const count = input.tagName === "SELECT" ? input.options.length : +input.max + 1;
  input.value = String((+input.value + 1) % count);
  input.dispatchEvent(new Event("input", { bubbles: true }));
  return input.name;
}

// Every explorer on the page must draw, and draw something else when its first control
// moves. Returns, per chapter, the first draw's time and what was drawn before and after.
async function checkExplorers(tab, report) {
  const chapters = await tab.evaluate(() => Array.from(
    document.querySelectorAll(".minipar-explorer[data-chapter]"), (el) => el.dataset.chapter));
  const found = [];
  for (const chapter of chapters) {
    const drawn = (n) => tab.waitForFunction(
      ([c, k]) => (window.miniparExplorers?.[c]?.minipar?.draws ?? 0) >= k, [chapter, n],
      { timeout: PAGE_TIMEOUT_MS });
    try {
      await drawn(1);
    } catch {
      report(`explorer ${chapter} did not draw`);
      continue;
    }
    // performance.now() counts from the navigation's start; so does the DOMContentLoaded mark
    const [firstDrawMs, loadedMs] = await tab.evaluate((c) => [
      window.miniparExplorers[c].minipar.firstDrawMs,
      performance.getEntriesByType("navigation")[0].domContentLoadedEventStart], chapter);
    const before = await tab.evaluate(readExplorer, chapter);
    const moved = await tab.evaluate(moveFirstControl, chapter);
    try {
      await drawn(before.draws + 1);
    } catch {
      report(`explorer ${chapter}: moving ${moved} did not redraw`);
      continue;
    }
    const after = await tab.evaluate(readExplorer, chapter);
    await tab.locator(`.minipar-explorer[data-chapter="${chapter}"]`)
      .screenshot({ path: join(SCREENS, `explorer-${chapter}.png`) });
    if (JSON.stringify(after.traces) === JSON.stringify(before.traces) || after.svg === before.svg)
      report(`explorer ${chapter}: moving ${moved} did not change the picture`);
    found.push({ chapter, firstDrawMs, afterLoadedMs: firstDrawMs - loadedMs, moved,
                 drawn: [before, after] });
  }
  return found;
}

// An internal link must name a file that exists and, with a #fragment, an id on that page.
async function checkLinks(base, seenByPage, problems) {
  for (const [page, seen] of seenByPage) {
    for (const href of new Set(seen.links)) {
      const url = new URL(href);
      if (url.origin !== base.origin) continue;                     // external: not fetched
      const file = await fileFor(url.pathname);
      if (!file) { problems.push(`${page}: broken link: ${href}`); continue; }
      // Anchors are known for the pages we opened (not for, say, a notebook download).
      const ids = seenByPage.get(relative(ROOT, file))?.ids;
      const fragment = decodeURIComponent(url.hash.slice(1));
      if (fragment && ids && !ids.includes(fragment))
        problems.push(`${page}: link to a missing anchor: ${href}`);
    }
  }
}

// ---------------------------------------------------------------- main

async function main() {
  const pages = await listPages();
  if (pages.length === 0) throw new Error(`no pages under ${ROOT}: run make book first`);
  await mkdir(SCREENS, { recursive: true });
  const server = await startServer();
  const base = new URL(`http://127.0.0.1:${server.address().port}/`);

  const browser = await chromium.launch({
    executablePath: BROWSER,
    headless: true,
    // Running as root in CI needs --no-sandbox; the rest keep Chromium itself off the network.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const problems = [];
  // Offline means offline: a request to anywhere but this server is refused (and reported
  // by the page's requestfailed handler), so the check passes only for a book that needs no
  // network, even on a machine that has one.
  await context.route("**/*", (route) =>
    new URL(route.request().url()).host === base.host ? route.continue() : route.abort());

  const seenByPage = new Map();
  for (const page of pages) {
    try {
      seenByPage.set(page, await checkPage(context, base, page, problems));
    } catch (err) {
      problems.push(`${page}: could not be checked: ${err.message.split("\n")[0]}`);
    }
  }
  await checkLinks(base, seenByPage, problems);
  await browser.close();
  server.close();

  const explorers = [...seenByPage.entries()].flatMap(([page, seen]) =>
    (seen.explorers ?? []).map((e) => ({ page, ...e })));
  for (const e of explorers)
    console.log(`explorer ${e.chapter}: first draw ${e.afterLoadedMs.toFixed(0)} ms after ` +
                `DOMContentLoaded (${e.firstDrawMs.toFixed(0)} ms after the navigation began)`);
  await writeFile(join(SCREENS, "explorers-drawn.json"), JSON.stringify(explorers));
  console.log(`explorers: ${explorers.length} drew and redrew`);

  const failed = new Set(problems.map((p) => p.split(": ")[0]));
  for (const problem of problems) console.log(`FAIL ${problem}`);
  console.log(`screenshots: ${relative(process.cwd(), SCREENS)}/`);
  console.log(`html: ${pages.length - failed.size} passed, ${failed.size} failed`);
  process.exitCode = problems.length ? 1 : 0;
}

await main();
