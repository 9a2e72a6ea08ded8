// agent-chat-ui against wakeful in headless Chromium (a manual check; see docs/langgraph-api.md).
// node screenshot.mjs out.png, from the agent-chat-ui app folder (puppeteer-core installed there).
import puppeteer from "puppeteer-core";
const browser = await puppeteer.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const page = await browser.newPage();
await page.setViewport({ width: 1280, height: 800 });
page.on("console", (m) => console.log("console:", m.type(), m.text()));
page.on("response", (r) => { if (r.url().includes("/langgraph")) console.log("http:", r.status(), r.request().method(), r.url()); });
const url = "http://127.0.0.1:5173/?apiUrl=" + encodeURIComponent("http://127.0.0.1:5173/langgraph") + "&assistantId=agent";
await page.goto(url, { waitUntil: "networkidle0", timeout: 60000 });
await page.waitForSelector("textarea", { timeout: 30000 });
await page.type("textarea", "Hello from headless Chromium: are you durable?");
await page.keyboard.press("Enter");
try {
  await page.waitForFunction(() => document.body.innerText.includes("token by token to the waiting client"), { timeout: 30000 });
  console.log("REPLY RENDERED");
} catch (e) { console.log("no reply:", e.message); }
await new Promise((r) => setTimeout(r, 1000));
await page.screenshot({ path: process.argv[2] });
console.log((await page.evaluate(() => document.body.innerText)).slice(0, 600));
await browser.close();
