/**
 * Debian's chromium driven by playwright-core, as every browser test launches it: headless, no
 * network of its own (the background-networking flags keep it from dialling out of this closed
 * machine), a fresh temporary profile per launch (playwright's default), and a launch limit long
 * enough for a busy 2-core machine. A missing browser fails the test: `.ci/run` installs it.
 */
import { assert } from "@effect/vitest"
import { existsSync } from "node:fs"
import { type Browser, chromium } from "playwright-core"

export const CHROMIUM = "/usr/bin/chromium"

export const launchChromium = (): Promise<Browser> => {
  assert.isTrue(existsSync(CHROMIUM), `${CHROMIUM} is missing: apt-get install -y chromium`)
  return chromium.launch({
    // Readiness, not a guess: a busy 2-core machine may take far longer than playwright's 30 s.
    timeout: 180_000,
    executablePath: CHROMIUM,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync"
    ]
  })
}
