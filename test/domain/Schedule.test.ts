import { assert, describe, it } from "@effect/vitest"
import { Duration, Result } from "effect"
import { CRON_HORIZON, currentPeriod, firesWithin, parseCron, tickClaimTtl } from "../../src/domain/Schedule.ts"

const cron = (expression: string) => Result.getOrThrow(parseCron(expression, "UTC"))

describe("firesWithin", () => {
  it("a cron with no possible date never fires; Feb 29 fires within the horizon even across 2100", () => {
    assert.isFalse(firesWithin(cron("0 0 31 2 *"), new Date("2026-01-01T00:00:00Z"), CRON_HORIZON))
    assert.isFalse(firesWithin(cron("0 0 31 4 *"), new Date("2026-01-01T00:00:00Z"), CRON_HORIZON))
    // 2100 is not a leap year: from March 2096 the next Feb 29 is in 2104, 8 years later.
    assert.isTrue(firesWithin(cron("0 0 29 2 *"), new Date("2096-03-01T00:00:00Z"), CRON_HORIZON))
    assert.isTrue(firesWithin(cron("*/2 * * * * *"), new Date("2026-01-01T00:00:00Z"), Duration.seconds(2)))
    assert.isFalse(firesWithin(cron("0 0 29 2 *"), new Date("2026-03-01T00:00:00Z"), Duration.days(365)))
  })
})

describe("currentPeriod", () => {
  const seconds = (expression: string, at: string) => Duration.toSeconds(currentPeriod(cron(expression), new Date(at)))

  it("is each default batch's period, whatever the instant inside it", () => {
    assert.strictEqual(seconds("45 * * * *", "2026-01-01T10:00:00Z"), 3600)
    assert.strictEqual(seconds("30 * * * *", "2026-01-01T10:30:00Z"), 3600)
    assert.strictEqual(seconds("*/6 * * * *", "2026-01-01T10:05:59Z"), 360)
    assert.strictEqual(seconds("*/15 * * * *", "2026-01-01T10:14:00Z"), 900)
    assert.strictEqual(seconds("* * * * *", "2026-01-01T10:14:30Z"), 60)
    assert.strictEqual(seconds("*/2 * * * * *", "2026-01-01T10:14:31Z"), 2)
  })

  it("follows an irregular cron: the period the instant falls in", () => {
    // Ticks at 09:00 and 17:00: 8 hours from 09:00, 16 hours from 17:00 to the next 09:00.
    assert.strictEqual(seconds("0 9,17 * * *", "2026-01-01T09:00:00Z"), 8 * 3600)
    assert.strictEqual(seconds("0 9,17 * * *", "2026-01-01T16:59:59Z"), 8 * 3600)
    assert.strictEqual(seconds("0 9,17 * * *", "2026-01-01T17:00:00Z"), 16 * 3600)
    assert.strictEqual(seconds("0 9,17 * * *", "2026-01-02T03:00:00Z"), 16 * 3600)
  })
})

describe("tickClaimTtl", () => {
  const minutes = (period: Duration.Duration) => Duration.toMinutes(tickClaimTtl(period))
  it("is two periods, at least ten minutes and at most 25 hours", () => {
    assert.strictEqual(minutes(Duration.seconds(2)), 10)
    assert.strictEqual(minutes(Duration.minutes(1)), 10)
    assert.strictEqual(minutes(Duration.minutes(15)), 30)
    assert.strictEqual(minutes(Duration.hours(1)), 120)
    assert.strictEqual(minutes(Duration.days(1)), 25 * 60)
    assert.strictEqual(minutes(Duration.days(7)), 25 * 60)
  })
})
