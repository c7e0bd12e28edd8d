import { chromium } from "playwright-core";
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, args: ["--no-sandbox"] });
const tab = await (await browser.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
await tab.goto("file:///tmp/html/snap/_build/html/book/memory.html", { waitUntil: "load" });
console.log(await tab.evaluate(() => { const el = document.querySelector("article pre"); const cs = getComputedStyle(el);
 return { cw: el.clientWidth, sw: el.scrollWidth, font: cs.font, fam: cs.fontFamily, pad: cs.padding, lh: cs.lineHeight, parentW: el.parentElement.clientWidth, sidebar: document.querySelector(".bd-sidebar-primary")?.clientWidth, sec: document.querySelector(".bd-sidebar-secondary")?.clientWidth, main: document.querySelector(".bd-main")?.clientWidth, article: document.querySelector(".bd-article")?.clientWidth, artc: document.querySelector(".bd-article-container")?.clientWidth }; }));
await browser.close();
