import { assert, describe, it } from "@effect/vitest"
import { Duration, Result } from "effect"
import { CRON_HORIZON, firesWithin, parseCron } from "../../src/domain/Schedule.ts"

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
