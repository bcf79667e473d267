import { assert, describe, it } from "@effect/vitest"
import { DateTime, Duration } from "effect"
import {
  decideStuckExport,
  EXPORT_JOBS_EXPIRATION,
  ExportJobStatus,
  isEnqueued,
  isParallelExportInProgress,
  parallelExportCutoff
} from "../../src/domain/ExportJob.ts"

const NOW = DateTime.makeUnsafe("2026-03-01T12:30:00Z")
const ago = (seconds: number) => DateTime.subtractDuration(NOW, Duration.seconds(seconds))
const SIX_HOURS = 21600

describe("ExportJob rules", () => {
  it("statuses are GitLab's smallints; only queued and started are enqueued", () => {
    assert.deepStrictEqual(ExportJobStatus, { queued: 0, started: 1, finished: 2, failed: 3 })
    assert.deepStrictEqual([0, 1, 2, 3, 4].map(isEnqueued), [true, true, false, false, false])
  })

  it("EXPORT_JOBS_EXPIRATION is 6 hours (21600 s) and the cutoff is now − 6 h", () => {
    assert.strictEqual(Duration.toSeconds(EXPORT_JOBS_EXPIRATION), SIX_HOURS)
    assert.strictEqual(DateTime.formatIso(parallelExportCutoff(NOW)), "2026-03-01T06:30:00.000Z")
  })

  it("a parallel export is in progress only while strictly younger than 6 h", () => {
    const parallel = (age: number) => isParallelExportInProgress({ relationExports: 1, createdAt: ago(age) }, NOW)
    assert.isTrue(parallel(0))
    assert.isTrue(parallel(SIX_HOURS - 1))
    assert.isFalse(parallel(SIX_HOURS))
    assert.isFalse(parallel(SIX_HOURS + 1))
  })

  it("without relation exports a job is never a parallel export in progress", () => {
    assert.isFalse(isParallelExportInProgress({ relationExports: 0, createdAt: ago(1) }, NOW))
  })

  describe("decideStuckExport", () => {
    const completed = new Set(["a", "b"])
    const decide = (jid: string, relationExports: number, age: number) =>
      decideStuckExport({ jid, relationExports, createdAt: ago(age) }, NOW, completed)

    it("fails a completed job without relation exports, whatever its age", () => {
      assert.strictEqual(decide("a", 0, 1), "fail")
      assert.strictEqual(decide("a", 0, SIX_HOURS - 1), "fail")
      assert.strictEqual(decide("a", 0, 10 * SIX_HOURS), "fail")
    })

    it("parallel exports: 6 h − 1 s skipped, exactly 6 h and 6 h + 1 s failed", () => {
      assert.strictEqual(decide("a", 3, SIX_HOURS - 1), "skippedParallel")
      assert.strictEqual(decide("a", 3, SIX_HOURS), "fail")
      assert.strictEqual(decide("a", 3, SIX_HOURS + 1), "fail")
    })

    it("a job whose current jid is not among the completed ones was re-enqueued", () => {
      assert.strictEqual(decide("c", 0, SIX_HOURS * 2), "skippedRequeued")
      assert.strictEqual(decide("c", 2, SIX_HOURS), "skippedRequeued")
    })

    it("a young parallel export counts as parallel even if re-enqueued", () => {
      assert.strictEqual(decide("c", 2, 60), "skippedParallel")
    })
  })
})
