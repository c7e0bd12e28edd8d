import { chromium } from "playwright-core";
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, args: ["--no-sandbox"] });
const tab = await (await browser.newContext({ viewport: { width: 500, height: 400 } })).newPage();
await tab.goto("file:///tmp/html/t.html");
console.log(await tab.evaluate(() => JSON.stringify(document.getElementById("b").innerText)));
await tab.screenshot({ path: "/tmp/html/t.png" });
await browser.close();
