// The browser check of the built book (`make test-html`): serve _build/html on 127.0.0.1,
// open every page in headless Chromium and fail on anything a reader would see go wrong
// offline. Every page is read three times: on a laptop (1280x800), on a phone (390x844, at
// twice the pixels, touch) and on a 2x laptop screen (1280x800 at device scale factor 2).
//
// On every screen:
//   - a console error or an uncaught exception;
//   - a request that failed, returned >= 400, or left this machine (the book must be
//     readable with no network, so any request not to 127.0.0.1 is a failure);
//   - an image that did not load; math that MathJax did not typeset (or typeset as an
//     error);
//   - a page wider than the screen (the document scrolls sideways);
//   - a figure of the book ({mpfig}, an SVG) whose smallest text is shown under 9 px: its
//     font sizes are read from the SVG file, times the scale it is shown at.
// On the laptop:
//   - an internal link to a missing page, or to an anchor the page does not have;
//   - a figure shown more than 1.5x smaller than it was drawn (figures are drawn for the
//     672 px column, minipar.teach.style.PAGE_WIDTH);
//   - a code or output block that scrolls sideways (folded cells opened first);
//   - the ☰ button that does not fold the table of contents away and back;
//   - a caption, table caption or explorer note under WCAG AA contrast (4.5:1), in the
//     light and in the dark theme;
//   - an explorer (book/_ext/explorer_html.py) that does not draw once the reader scrolls
//     to it, whose picture does not change when its first control moves, or that does not
//     draw a setting (blank, or not the one asked) as each control steps through every
//     value it offers, one control at a time.
// On the phone:
//   - the ☰ button that does not open the table of contents (and "contents" the page's);
//   - a figure whose full-size view (a tap) is not larger than the page shows it;
//   - a page that loads more than 2.5 MB when opened (every response's bytes, cache off;
//     the weight after reading it through, explorers included, is printed beside it).
// On the 2x screen: a figure that is a raster shown at less than 2 device pixels per pixel.
// Once, from file:// (no server): search shows a snippet under each result, and the
// glossary is not the first result for most queries.
//
// It saves a screenshot of each page's first screen under _build/screens/ (laptop, and
// phone-<page>.png), and of each explorer after its control moved (explorer-<chapter>.png),
// prints each page's weight, the smallest figure text at 390 px and how long each explorer
// took to draw after it was asked for, and writes what each explorer drew for two settings to
// _build/screens/explorers-drawn.json, which tests/html/test_agreement.py compares with the
// Python figures (`make test-html`).
//
// Usage: node tests/html/check.mjs [_build/html] [_build/screens]
// (CHECK_PAGES=book/memory.html,search.html checks only those pages, links and all.)
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
const MAX_SHRINK = 1.5;         // natural width / shown width of a figure, on the laptop
const MIN_TEXT_PX = 9;          // the smallest figure text shown, in CSS px, on any screen
const MAX_PAGE_BYTES = 2.5e6;   // what a page may load when opened
const MIN_CONTRAST = 4.5;       // WCAG AA, for text

// The three screens every page is read on.
const LAPTOP = { name: "laptop", viewport: { width: 1280, height: 800 }, deviceScaleFactor: 1 };
const PHONE = { name: "phone", viewport: { width: 390, height: 844 }, deviceScaleFactor: 2,
                isMobile: true, hasTouch: true };
const LAPTOP_2X = { name: "laptop-2x", viewport: { width: 1280, height: 800 }, deviceScaleFactor: 2 };

// Queries a reader of the book would type: the glossary may come first for a few of them,
// not for most.
const QUERIES = ["pipeline bubble", "all-reduce", "ZeRO", "MFU", "activation recomputation",
                 "tensor parallelism", "ring attention", "micro-batch", "checkpoint", "NVLink"];

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
  const body = await readFile(path);
  res.writeHead(200, { "content-type": type, "content-length": body.length }).end(body);
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
    shown: img.getBoundingClientRect().width,
    shrink: img.getBoundingClientRect().width > 0
      ? img.naturalWidth / img.getBoundingClientRect().width : 0,
    // device pixels of the file per device pixel of the screen (a raster's sharpness)
    sharpness: img.getBoundingClientRect().width > 0
      ? img.naturalWidth / (img.getBoundingClientRect().width * devicePixelRatio) : 0,
    // a figure of the book, or a picture a notebook drew (both SVG, text as text)
    figure: Boolean(img.closest("figure.mpfig, .cell_output")),
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

// Runs in the page: wider than `width` (the screen) means the document scrolls sideways.
// Names the outermost elements that stick out, not inside a box that scrolls itself.
function tooWide(width) {
  const scrollWidth = document.documentElement.scrollWidth;
  if (scrollWidth <= width) return null;
  const inScrollBox = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement)
      if (getComputedStyle(p).overflowX !== "visible") return true;
    return false;
  };
  const culprits = Array.from(document.querySelectorAll("body *")).filter((el) => {
    const box = el.getBoundingClientRect();
    return box.width > 0 && box.right > width + 1 && !inScrollBox(el)
      && !(el.parentElement?.getBoundingClientRect().right > width + 1);
  });
  return { scrollWidth, culprits: culprits.slice(0, 3).map((el) =>
    `<${el.tagName.toLowerCase()} class="${el.getAttribute("class") ?? ""}"> ` +
    (el.textContent ?? "").trim().replace(/\s+/g, " ").slice(0, 50)) };
}

// Runs in the page: the WCAG contrast of each caption, table caption and explorer note with
// what is behind it (backgrounds with alpha composed up to the first opaque one).
function captionContrasts() {
  const rgba = (css) => {
    const m = css.match(/rgba?\(([^)]+)\)/);
    if (!m) return null;
    const [r, g, b, a = 1] = m[1].split(/[\s,/]+/).filter(Boolean).map(Number);
    return [r, g, b, a];
  };
  const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3]));
  const backdrop = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) layers.push(c);
      if (c && c[3] >= 1) break;
    }
    return layers.reverse().reduce((under, top) => over(top, under), [255, 255, 255]);
  };
  const luminance = (rgb) => rgb.map((v) => {
    const c = v / 255;
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  }).reduce((sum, c, i) => sum + c * [0.2126, 0.7152, 0.0722][i], 0);
  return Array.from(document.querySelectorAll(
    "figcaption, table > caption, p.minipar-explorer-note"))
    .filter((el) => el.getClientRects().length && el.textContent.trim())
    .map((el) => {
      const back = backdrop(el);
      const text = over(rgba(getComputedStyle(el).color), back);
      const [l1, l2] = [luminance(text), luminance(back)].sort((a, b) => b - a);
      return { what: `<${el.tagName.toLowerCase()}> ${el.textContent.trim().slice(0, 40)}`,
               ratio: (l1 + 0.05) / (l2 + 0.05) };
    });
}

// The smallest text of an SVG figure, in its own units, and its width in those units:
// font sizes as matplotlib writes them with text kept as text (minipar_book.save_svg).
async function svgText(src) {
  const path = await fileFor(new URL(src).pathname);
  if (!path) return null;
  const svg = await readFile(path, "utf8");
  const box = svg.match(/<svg\b[^>]*?\bviewBox="[-\d.]+ [-\d.]+ ([\d.]+) [\d.]+"/);
  const sizes = Array.from(svg.matchAll(/font(?:-size)?:[^;"]*?([\d.]+)px/g), (m) => +m[1]);
  if (!box || !sizes.length) return null;
  return { smallest: Math.min(...sizes), width: +box[1] };
}

// The figures' smallest text as shown (CSS px): for every SVG figure shown on the page.
async function figureText(seen, page, report, device) {
  const shown = [];
  for (const img of seen.images.filter((i) => i.figure && i.shown > 0)) {
    if (!img.src.endsWith(".svg")) {
      if (device === LAPTOP) report(`figure is not an SVG: ${img.src}`);
      continue;
    }
    const svg = await svgText(img.src);
    if (!svg) { report(`figure has no text sizes to read: ${img.src}`); continue; }
    const px = svg.smallest * img.shown / svg.width;
    shown.push({ page, src: img.src, px });
    if (px < MIN_TEXT_PX - 0.01)             // 0.01: the layout's rounding of the width
      report(`figure text shown at ${px.toFixed(1)} px at ${device.viewport.width} px (under ` +
             `${MIN_TEXT_PX}): ${img.src}`);
  }
  return shown;
}

// A page that is only a <meta http-equiv="refresh"> (Sphinx's index.html) navigates away
// at once: check that its target exists instead of rendering it.
async function redirectTarget(page) {
  const html = await readFile(join(ROOT, page), "utf8");
  return html.match(/<meta http-equiv="refresh" content="\d+;\s*url=([^"]+)"/i)?.[1];
}

async function checkPage(context, base, page, problems, device) {
  const target = await redirectTarget(page);
  if (target) {
    const url = new URL(target, new URL(page, base));
    if (!(await fileFor(url.pathname))) problems.push(`${page}: redirects to a missing page: ${target}`);
    return { links: [url.href], ids: [] };
  }
  const tab = await context.newPage();
  try {
    return await inspectInBrowser(tab, base, page, problems, device);
  } finally {
    await tab.close();
  }
}

// A page the browser could not drive (a timeout on a loaded 2-core machine) gets one more
// try in a fresh tab, said aloud; only the last try's findings count.
async function checkPageTwice(context, base, page, problems, device) {
  for (let attempt = 1; ; attempt++) {
    const found = [];
    try {
      const seen = await checkPage(context, base, page, found, device);
      problems.push(...found);
      return seen;
    } catch (err) {
      const why = `${page} [${device.name}]: could not be checked: ${err.message.split("\n")[0]}`;
      if (attempt === 2) { problems.push(...found, why); return null; }
      console.log(`again: ${why}`);
    }
  }
}

// Opens the page and waits for what it loads by itself: MathJax, its fonts, the network.
// Returns the bytes of every response so far and a function that gives the running total.
async function open(tab, base, page, report) {
  let bytes = 0;
  tab.on("console", (msg) => { if (msg.type() === "error") report(`console error: ${msg.text()}`); });
  tab.on("pageerror", (err) => report(`uncaught exception: ${err.message}`));
  tab.on("requestfailed", (req) => {
    if (new URL(req.url()).host !== base.host) report(`request leaves the machine: ${req.url()}`);
    else report(`request failed: ${req.url()} (${req.failure()?.errorText})`);
  });
  tab.on("response", (res) => {
    if (res.status() >= 400) report(`HTTP ${res.status()}: ${res.url()}`);
    bytes += Number(res.headers()["content-length"] ?? 0);
  });
  await tab.goto(new URL(page, base).href, { waitUntil: "load", timeout: PAGE_TIMEOUT_MS });
  // MathJax typesets after load; wait for it, then for the fonts it asks for.
  await tab.evaluate(() => window.MathJax?.startup?.promise);
  // Then let the network settle. A page with a live explorer may not go quiet for the 500 ms
  // "networkidle" asks for (Plotly keeps drawing); waiting is not the check: every request
  // is checked as it fails or leaves the machine (the listeners above), so stop waiting
  // after a while instead of failing the page.
  await tab.waitForLoadState("networkidle", { timeout: SETTLE_MS }).catch(() => {});
  return () => bytes;
}

// The checks every screen makes, once the page has been read through.
async function checkSeen(tab, seen, page, report, device) {
  for (const img of seen.images) if (!img.loaded) report(`broken image: ${img.src}`);
  if (seen.mathCount > 0 && !seen.hasMathJax) report("has math but MathJax did not load");
  for (const tex of seen.untypeset) report(`math not typeset: ${tex}`);
  for (const tex of seen.mathErrors) report(`math error: ${tex}`);
  if (seen.rawMath.length) report(`math left as source (${seen.rawMath.length}×): ${seen.rawMath[0]}`);
  const wide = await tab.evaluate(tooWide, device.viewport.width);
  if (wide) report(`the page is ${wide.scrollWidth} px wide at ${device.viewport.width} px: ` +
                   wide.culprits.join("; "));
  seen.figureText = await figureText(seen, page, report, device);
}

async function inspectInBrowser(tab, base, page, problems, device) {
  const report = (what) => problems.push(`${page} [${device.name}]: ${what}`);
  const bytes = await open(tab, base, page, report);
  const opened = bytes();
  if (device === PHONE) await checkSidebarPhone(tab, report);
  if (device === LAPTOP) await checkSidebarLaptop(tab, report);
  await readThrough(tab);
  const seen = await tab.evaluate(inspectPage);
  seen.weight = { opened, read: bytes() };
  await checkSeen(tab, seen, page, report, device);
  const name = page.replace(/\.html$/, "").split(sep).join("__") + ".png";
  if (device === LAPTOP) {
    for (const img of seen.images)
      if (img.shrink > MAX_SHRINK) report(`figure shown ${img.shrink.toFixed(2)}x smaller than drawn: ${img.src}`);
    for (const line of seen.scrolling) report(`block scrolls sideways at 1280 px: ${line.slice(0, 80)}`);
    await checkContrast(tab, report);
    seen.explorers = await checkExplorers(tab, report);
    await tab.screenshot({ path: join(SCREENS, name) });   // book/intro.html -> book__intro.png
  }
  if (device === PHONE) {
    if (opened > MAX_PAGE_BYTES)
      report(`loads ${(opened / 1e6).toFixed(2)} MB when opened (at most ${MAX_PAGE_BYTES / 1e6} MB)`);
    seen.zoom = await checkZoom(tab, report);
    await tab.evaluate(() => scrollTo(0, 0));
    await tab.screenshot({ path: join(SCREENS, `phone-${name}`) });
  }
  if (device === LAPTOP_2X) {
    for (const img of seen.images.filter((i) => i.figure && i.shown > 0 && !i.src.endsWith(".svg")))
      if (img.sharpness < 1) report(`figure is a raster of ${img.sharpness.toFixed(2)} pixels per device pixel at 2x: ${img.src}`);
  }
  return seen;
}

// ---------------------------------------------------------------- the reader's gestures

// Resolves true once `fn(arg)` is true in the page, false after `ms`.
function until(tab, fn, arg, ms = 3000) {
  return tab.waitForFunction(fn, arg, { timeout: ms }).then(() => true, () => false);
}

// Runs in the page: is the left sidebar (the table of contents) on screen, as `want`s?
function tocShown(want = true) {
  const bar = document.getElementById("pst-primary-sidebar");
  if (!bar) return !want;
  const style = getComputedStyle(bar), box = bar.getBoundingClientRect();
  const shown = style.visibility !== "hidden" && style.display !== "none" && +style.opacity > 0
    && box.right > 0 && box.width > 0;
  return shown === want;
}

// Runs in the page: is the dialog `id` open with a link the reader can tap on screen?
function dialogWithLinks(id) {
  const dialog = document.getElementById(id);
  return Boolean(dialog?.open) && Array.from(dialog.querySelectorAll("a")).some((a) => {
    const box = a.getBoundingClientRect();
    return box.width > 0 && box.left >= 0 && box.right <= innerWidth && box.top < innerHeight;
  });
}

// The laptop: ☰ folds the table of contents away, and a second click brings it back.
async function checkSidebarLaptop(tab, report) {
  const toggle = tab.locator(".primary-toggle:visible").first();
  if (!(await toggle.count()) || !(await tab.evaluate(tocShown))) return;
  await toggle.click();
  if (!(await until(tab, tocShown, false)))
    report("☰ does not fold the table of contents away at 1280 px");
  await toggle.click();
  if (!(await until(tab, tocShown, true))) report("☰ does not bring the table of contents back");
}

// The phone: ☰ opens the table of contents, "contents" the page's own, each as a dialog
// with links on screen that Escape closes.
async function checkSidebarPhone(tab, report) {
  const sidebars = [["primary", "pst-primary-sidebar-modal", "the table of contents"],
                    ["secondary", "pst-secondary-sidebar-modal", "the page's contents"]];
  for (const [kind, dialog, what] of sidebars) {
    const toggle = tab.locator(`.${kind}-toggle:visible`).first();
    const hasLinks = await tab.evaluate((k) =>
      Boolean(document.querySelector(`#pst-${k}-sidebar a`)), kind);
    if (!hasLinks) continue;
    if (!(await toggle.count())) { report(`no button opens ${what} at 390 px`); continue; }
    await toggle.click();
    if (!(await until(tab, dialogWithLinks, dialog))) {
      report(`the ${kind} sidebar button does not open ${what} at 390 px`);
      continue;
    }
    await tab.keyboard.press("Escape");
    if (!(await until(tab, (id) => !document.getElementById(id).open, dialog)))
      report(`Escape does not close ${what}`);
  }
}

// The phone: a tap on the first figure opens it larger than the page shows it.
async function checkZoom(tab, report) {
  const picture = tab.locator("figure.mpfig a.image-reference img:visible").first();
  if (!(await picture.count())) return null;
  // Scrolled and tapped without Playwright's wait for a still layout: a page whose explorer
  // is still resizing on a slow machine never holds still for it, and the tap is the test.
  await picture.evaluate((img) => img.scrollIntoView({ block: "center" }));
  const onPage = (await picture.boundingBox()).width;
  await picture.click({ force: true });
  const opened = await until(tab, () => {
    const img = document.querySelector("dialog.minipar-zoom[open] img");
    return img?.complete && img.naturalWidth > 0;
  });
  if (!opened) { report("a tap on a figure does not open it full size"); return null; }
  const full = await tab.evaluate(() =>
    document.querySelector("dialog.minipar-zoom img").getBoundingClientRect().width);
  if (!(full > onPage)) report(`a figure's full-size view (${full} px) is not larger than on the page (${onPage} px)`);
  await tab.keyboard.press("Escape");
  if (!(await until(tab, () => !document.querySelector("dialog.minipar-zoom[open]"))))
    report("Escape does not close a figure's full-size view");
  return { onPage, full };
}

// Scrolls through the page as a reader would, so that lazy pictures and the explorers'
// scripts load; then asks for every picture left and waits for the network to settle.
async function readThrough(tab) {
  await tab.evaluate(async () => {
    for (let y = 0; y < document.documentElement.scrollHeight; y += innerHeight / 2) {
      scrollTo(0, y);
      await new Promise((ok) => setTimeout(ok, 20));
    }
    scrollTo(0, 0);
  });
  await tab.waitForLoadState("networkidle", { timeout: SETTLE_MS }).catch(() => {});
  await tab.evaluate((ms) => Promise.race([
    Promise.all(Array.from(document.images).map((img) => {
      img.loading = "eager";
      return img.complete ? null : new Promise((ok) => { img.onload = img.onerror = ok; });
    })),
    new Promise((ok) => setTimeout(ok, ms)),
  ]), PAGE_TIMEOUT_MS);
}

// The laptop, light and dark: every caption and explorer note at 4.5:1 or more.
async function checkContrast(tab, report) {
  for (const mode of ["light", "dark"]) {
    await tab.evaluate((m) => {
      document.documentElement.dataset.theme = m;
      document.documentElement.dataset.mode = m;
    }, mode);
    for (const c of await tab.evaluate(captionContrasts))
      if (c.ratio < MIN_CONTRAST)
        report(`${mode} theme: contrast ${c.ratio.toFixed(2)}:1 (under ${MIN_CONTRAST}) for ${c.what}`);
  }
  await tab.evaluate(() => { document.documentElement.dataset.theme = "light";
                             document.documentElement.dataset.mode = "light"; });
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

// Runs in the page: moves each control of the explorer through every value it offers, one
// control at a time (each put back before the next), as a reader would (an input event),
// and waits for each redraw (the frames were drawn when the book was built: each is a small
// script to load and a Plotly redraw). Returns the moves made and what went wrong: a
// setting that did not draw, drew another setting's frame, or drew a blank plot.
async function stepEveryControl(chapter) {
  const el = window.miniparExplorers[chapter];
  const plot = el.querySelector(".minipar-explorer-plot");
  const inputs = Array.from(el.querySelectorAll(
    ".minipar-explorer-controls select, .minipar-explorer-controls input"));
  const redrawn = (draws, ms = 5000) => new Promise((resolve) => {
    const start = performance.now();
    (function poll() {
      if (el.minipar.draws > draws) resolve(true);
      else if (performance.now() - start > ms) resolve(false);
      else setTimeout(poll, 5);
    })();
  });
  const move = (input, i) => {
    const draws = el.minipar.draws;
    input.value = String(i);
    input.dispatchEvent(new Event("input", { bubbles: true }));
    return redrawn(draws);
  };
  const problems = [];
  let moves = 0;
  for (const input of inputs) {
    const home = +input.value;
    const count = input.tagName === "SELECT" ? input.options.length : +input.max + 1;
    for (let i = 0; i < count; i++) {
      if (i === home) continue;
      moves += 1;
      if (!(await move(input, i))) {
        problems.push(`${input.name} = its value ${i + 1} of ${count} did not draw`);
        continue;
      }
      const setting = `${input.name} = ${JSON.stringify(el.minipar.values[input.name])}`;
      const want = inputs.map((x) => x.value).join(",");    // alone controls went back
      if (el.minipar.key !== want) problems.push(`${setting} drew ${el.minipar.key}, not ${want}`);
      const traces = plot.data?.length ?? 0, texts = plot.layout?.annotations?.length ?? 0;
      if ((traces === 0 && texts === 0) || !plot.querySelector("svg.main-svg"))
        problems.push(`${setting} drew a blank plot`);
    }
    if (+input.value !== home && !(await move(input, home)))
      problems.push(`${input.name} did not draw when put back`);
  }
  return { moves, problems };
}

// Every explorer on the page must draw once the reader has come near it (its scripts load
// then: book/_static/minipar-explorer-loader.js), and draw something else when its first
// control moves; then every control steps through every value it offers, each setting
// drawn (console errors are reported by the page's listener). Returns, per chapter, the
// first draw's time after the scripts were asked for, what was drawn before and after the
// first move, and how many settings were stepped through.
async function checkExplorers(tab, report) {
  const chapters = await tab.evaluate(() => Array.from(
    document.querySelectorAll(".minipar-explorer[data-chapter]"), (el) => el.dataset.chapter));
  const found = [];
  for (const chapter of chapters) {
    const box = tab.locator(`.minipar-explorer[data-chapter="${chapter}"]`);
    await box.evaluate((el) => el.scrollIntoView());
    const drawn = (n) => tab.waitForFunction(
      ([c, k]) => (window.miniparExplorers?.[c]?.minipar?.draws ?? 0) >= k, [chapter, n],
      { timeout: PAGE_TIMEOUT_MS });
    try {
      await drawn(1);
    } catch {
      report(`explorer ${chapter} did not draw`);
      continue;
    }
    // performance.now() counts from the navigation's start; so does the time the loader
    // asked for the scripts
    const [firstDrawMs, askedMs] = await tab.evaluate((c) => [
      window.miniparExplorers[c].minipar.firstDrawMs, window.miniparExplorersAskedMs ?? 0], chapter);
    const before = await tab.evaluate(readExplorer, chapter);
    const moved = await tab.evaluate(moveFirstControl, chapter);
    try {
      await drawn(before.draws + 1);
    } catch {
      report(`explorer ${chapter}: moving ${moved} did not redraw`);
      continue;
    }
    const after = await tab.evaluate(readExplorer, chapter);
    await box.screenshot({ path: join(SCREENS, `explorer-${chapter}.png`) });
    if (JSON.stringify(after.traces) === JSON.stringify(before.traces) || after.svg === before.svg)
      report(`explorer ${chapter}: moving ${moved} did not change the picture`);
    const started = Date.now();
    const stepped = await tab.evaluate(stepEveryControl, chapter);
    for (const problem of stepped.problems) report(`explorer ${chapter}: ${problem}`);
    found.push({ chapter, firstDrawMs, afterAskedMs: firstDrawMs - askedMs, moved,
                 drawn: [before, after], stepped: stepped.moves, stepMs: Date.now() - started });
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

// ---------------------------------------------------------------- search, from file://

// Runs in the search page: the results once Sphinx's search has finished and each result's
// snippet has had time to come: [{page, snippet}], best first.
async function searchResults() {
  const done = () => document.querySelector("#search-results h2")?.textContent === "Search Results";
  for (let i = 0; i < 200 && !done(); i++) await new Promise((ok) => setTimeout(ok, 50));
  await new Promise((ok) => setTimeout(ok, 300));
  return Array.from(document.querySelectorAll("#search-results ul.search > li"), (li) => ({
    page: li.querySelector("a")?.getAttribute("href") ?? "",
    snippet: li.querySelector("p.context")?.textContent.trim() ?? "",
  }));
}

// Opens search.html from file:// (nothing may leave the machine there either) for each query:
// every result has a snippet, and the glossary is first for fewer than half of the queries.
async function checkSearch(browser, problems) {
  const context = await browser.newContext({ viewport: LAPTOP.viewport });
  await context.route(/^(https?|wss?):/, (route) => route.abort());
  const firsts = [];
  try {
    for (const query of QUERIES) {
      const tab = await context.newPage();
      const report = (what) => problems.push(`search.html (file://) "${query}": ${what}`);
      tab.on("console", (msg) => { if (msg.type() === "error") report(`console error: ${msg.text()}`); });
      tab.on("pageerror", (err) => report(`uncaught exception: ${err.message}`));
      const url = new URL(`file://${join(ROOT, "search.html")}`);
      url.searchParams.set("q", query);
      await tab.goto(url.href, { waitUntil: "load", timeout: PAGE_TIMEOUT_MS });
      const results = await tab.evaluate(searchResults);
      if (!results.length) report("no results");
      const bare = results.filter((r) => !r.snippet);
      if (bare.length) report(`${bare.length} of ${results.length} results without a snippet (first: ${bare[0].page})`);
      firsts.push({ query, first: results[0]?.page ?? "", count: results.length });
      await tab.close();
    }
  } finally {
    await context.close();
  }
  const glossaryFirst = firsts.filter((f) => f.first.includes("glossary"));
  if (glossaryFirst.length * 2 >= QUERIES.length)
    problems.push(`search: the glossary comes first for ${glossaryFirst.length} of ${QUERIES.length} queries`);
  return firsts;
}

// ---------------------------------------------------------------- main

// Reads every page on one screen; returns {page: what was seen}.
async function readAll(browser, base, pages, device, problems) {
  const context = await browser.newContext(device);
  // Offline means offline: a request to anywhere but this server is refused (and reported
  // by the page's requestfailed handler), so the check passes only for a book that needs no
  // network, even on a machine that has one. (Routing also turns the cache off, so each
  // page's weight counts everything it loads.)
  await context.route("**/*", (route) =>
    new URL(route.request().url()).host === base.host ? route.continue() : route.abort());
  const seenByPage = new Map();
  for (const page of pages) {
    const seen = await checkPageTwice(context, base, page, problems, device);
    if (seen) seenByPage.set(page, seen);
  }
  await context.close();
  return seenByPage;
}

const MB = (bytes) => (bytes / 1e6).toFixed(2);

// What the reader of the phone gets: each page's weight, and the smallest figure text.
function printPhone(seenByPage) {
  console.log("page weight at 390x844 (MB): opened / read through, explorers included");
  for (const [page, seen] of seenByPage)
    if (seen.weight) console.log(`  ${page.padEnd(36)} ${MB(seen.weight.opened)} / ${MB(seen.weight.read)}`);
  const texts = [...seenByPage.values()].flatMap((seen) => seen.figureText ?? []);
  const smallest = texts.reduce((a, b) => (b.px < a.px ? b : a), texts[0]);
  if (smallest)
    console.log(`smallest figure text at 390 px: ${smallest.px.toFixed(1)} px ` +
                `(${texts.length} figures; ${smallest.page}, ${smallest.src.split("/").pop()})`);
}

async function main() {
  const only = process.env.CHECK_PAGES?.split(",");
  const pages = (await listPages()).filter((p) => !only || only.includes(p));
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
  const problems = [];
  const seenByPage = await readAll(browser, base, pages, LAPTOP, problems);
  await checkLinks(base, seenByPage, problems);
  const onPhone = await readAll(browser, base, pages, PHONE, problems);
  await readAll(browser, base, pages, LAPTOP_2X, problems);
  const searches = await checkSearch(browser, problems);
  await browser.close();
  server.close();

  const explorers = [...seenByPage.entries()].flatMap(([page, seen]) =>
    (seen.explorers ?? []).map((e) => ({ page, ...e })));
  for (const e of explorers)
    console.log(`explorer ${e.chapter}: first draw ${e.afterAskedMs.toFixed(0)} ms after its ` +
                `scripts were asked for (${e.firstDrawMs.toFixed(0)} ms after the navigation began); ` +
                `${e.stepped} settings stepped through in ${(e.stepMs / 1000).toFixed(1)} s`);
  await writeFile(join(SCREENS, "explorers-drawn.json"), JSON.stringify(explorers));
  console.log(`explorers: ${explorers.length} drew and redrew`);
  printPhone(onPhone);
  console.log("search from file://, first result: " +
              searches.map((s) => `"${s.query}" ${s.first} (${s.count})`).join("; "));

  const failed = new Set(problems.map((p) => p.split(": ")[0]));
  for (const problem of problems) console.log(`FAIL ${problem}`);
  console.log(`screenshots: ${relative(process.cwd(), SCREENS)}/`);
  console.log(`html: ${pages.length} pages on 3 screens; ${failed.size} page-screens failed`);
  process.exitCode = problems.length ? 1 : 0;
}

await main();
