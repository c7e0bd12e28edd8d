import { chromium } from "playwright-core";
const [root, ...pages] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, args: ["--no-sandbox"] });
const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
for (const p of pages) {
  const tab = await ctx.newPage();
  await tab.goto("file://" + root + "/" + p, { waitUntil: "load" });
  await tab.evaluate(() => window.MathJax?.startup?.promise);
  await tab.evaluate(() => Promise.all(Array.from(document.images).map((img) => { img.loading = "eager"; return img.complete ? null : new Promise((ok) => { img.onload = img.onerror = ok; }); })));
  const r = await tab.evaluate(() => {
    const art = document.querySelector("article");
    const imgs = Array.from(document.querySelectorAll("article img")).map((i) => ({ src: i.src.split("/").pop(), nat: i.naturalWidth, shown: Math.round(i.getBoundingClientRect().width), alt: i.alt.slice(0, 60), link: i.closest("a")?.href?.split("/").pop() }));
    const blocks = Array.from(document.querySelectorAll("article pre")).filter((el) => el.scrollWidth > el.clientWidth + 1).map((el) => ({ cls: el.parentElement.className.slice(0, 50) + " / " + (el.closest(".cell_output") ? "output" : el.closest(".cell_input") ? "input" : "md"), over: el.scrollWidth - el.clientWidth, text: el.innerText.split("\n").sort((a, b) => b.length - a.length)[0].slice(0, 100) }));
    const ev = Array.from(document.querySelectorAll(".evidence")).slice(0, 2).map((e) => ({ size: getComputedStyle(e).fontSize, title: e.querySelector("abbr")?.title }));
    const tables = Array.from(document.querySelectorAll("article table")).map((t) => ({ w: t.scrollWidth, cw: t.parentElement.clientWidth, cap: t.querySelector("caption")?.innerText.slice(0, 80) }));
    return { artWidth: art?.clientWidth, imgs, blocks, nblocks: document.querySelectorAll("article pre").length, ev, tables };
  });
  console.log(p, JSON.stringify(r, null, 1));
  await tab.close();
}
await browser.close();
