/**
 * The health gate's pure rules: SWEEPER_HEALTH as configuration (a bad value is one line
 * naming the variable and the path), the hysteresis between stop and resume, relative thresholds
 * against the signal's own median over the last hour (sampled under TestClock), and the throttled
 * concurrency limit's steps.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, ConfigProvider, Duration, Effect, Option, Result, Schema } from "effect"
import { TestClock } from "effect/testing"
import { SweeperConfig } from "../../src/config/Config.ts"
import { InvalidConfig } from "../../src/domain/Errors.ts"
import {
  addSample,
  baselineOf,
  databaseOfSubject,
  databasesOf,
  judge,
  median,
  nextHeld,
  openHolds,
  type Sample,
  type SignalRule,
  subjectsFor,
  type ThrottleState,
  throttleStep,
  unknown,
  value,
  worstOf
} from "../../src/domain/Health.ts"
import { compileHealth, HealthJson, RawHealth } from "../../src/domain/HealthConfig.ts"

const decode = (json: unknown) => Schema.decodeUnknownResult(HealthJson)(JSON.stringify(json))
const rules = (json: unknown): ReadonlyArray<SignalRule> => {
  const result = decode(json)
  if (Result.isFailure(result)) throw new Error(String(result.failure))
  return result.success.rules
}
const rule = (json: unknown) => rules(json)[0]!
const failure = (json: unknown): string => {
  const result = decode(json)
  assert.isTrue(Result.isFailure(result), `expected ${JSON.stringify(json)} to be refused`)
  return Result.isFailure(result) ? String(result.failure) : ""
}

describe("SWEEPER_HEALTH", () => {
  it("every signal the gate knows, thresholds in the signal's unit", () => {
    const all = rules({
      replicationLag: { stop: "64MB", resume: "16MB" },
      walRate: { stop: "3x", resume: "2x" },
      autovacuum: { stop: true },
      longTransactions: { stop: "10m", resume: "5m", onUnknown: "hold" },
      redisMemory: { stop: 0.9, resume: 0.8 },
      queueLatency: { stop: "5m", resume: "1m" },
      prometheus: {
        url: "http://127.0.0.1:9090",
        rules: [{ name: "patroniApdex", query: "apdex", stop: "< 0.99", resume: ">= 0.995" }]
      }
    })
    assert.deepStrictEqual(
      all.map((r) => [r.signal, r.unit, r.stop.op, r.stop.bound, r.resume.op, r.resume.bound, r.onUnknown]),
      [
        ["replicationLag", "bytes", ">", { _tag: "Absolute", value: 64_000_000 }, "<=", {
          _tag: "Absolute",
          value: 16_000_000
        }, "healthy"],
        ["walRate", "bytes/s", ">", { _tag: "Relative", factor: 3 }, "<=", { _tag: "Relative", factor: 2 }, "healthy"],
        ["autovacuum", "tables", ">", { _tag: "Absolute", value: 0 }, "<=", { _tag: "Absolute", value: 0 }, "healthy"],
        [
          "longTransactions",
          "seconds",
          ">",
          { _tag: "Absolute", value: 600 },
          "<=",
          { _tag: "Absolute", value: 300 },
          "hold"
        ],
        [
          "queueLatency",
          "seconds",
          ">",
          { _tag: "Absolute", value: 300 },
          "<=",
          { _tag: "Absolute", value: 60 },
          "healthy"
        ],
        [
          "redisMemory",
          "ratio",
          ">",
          { _tag: "Absolute", value: 0.9 },
          "<=",
          { _tag: "Absolute", value: 0.8 },
          "healthy"
        ],
        [
          "patroniApdex",
          "value",
          "<",
          { _tag: "Absolute", value: 0.99 },
          ">=",
          { _tag: "Absolute", value: 0.995 },
          "healthy"
        ]
      ]
    )
  })

  it("replicationLag as a duration reads replay_lag; walRate as an absolute rate; resume defaults to half of stop", () => {
    const lag = rule({ replicationLag: { stop: "10s" } })
    assert.deepStrictEqual(lag.source, { _tag: "ReplicationLag", measure: "seconds" })
    assert.deepStrictEqual([lag.stop.bound, lag.resume.bound], [{ _tag: "Absolute", value: 10 }, {
      _tag: "Absolute",
      value: 5
    }])
    assert.deepStrictEqual(rule({ walRate: { stop: "48MB/s", resume: "32MiB/s" } }).resume.bound, {
      _tag: "Absolute",
      value: 32 * 1024 * 1024
    })
    // A Prometheus rule without resume releases one part in a thousand past its stop.
    const apdex = rule({ prometheus: { url: "http://p:9090", rules: [{ name: "apdex", query: "q", stop: "< 0.99" }] } })
    assert.deepStrictEqual([apdex.resume.op, apdex.resume.bound], [">=", { _tag: "Absolute", value: 0.99099 }])
  })

  it("a low redisMemory stop still gets a default resume a reading can reach: half of stop, never 0", () => {
    const r = rule({ redisMemory: { stop: 0.04 } })
    const resume = r.resume.bound._tag === "Absolute" ? r.resume.bound.value : Number.NaN
    assert.strictEqual(resume, 0.02)
    // A store using 1 % of its memory releases a hold (with a default of 0 it never would).
    assert.isFalse(nextHeld(r, true, value(0.01)))
  })

  it("a rule without resume still has hysteresis: a reading hovering at stop does not hold and release on every check", () => {
    const bounds = (json: unknown) => {
      const r = rule(json)
      return [r.stop.bound, r.resume.bound].map((b) => b._tag === "Absolute" ? b.value : `${b.factor}x`)
    }
    assert.deepStrictEqual(bounds({ replicationLag: { stop: "8MB" } }), [8e6, 4e6])
    assert.deepStrictEqual(bounds({ walRate: { stop: "3x" } }), ["3x", "1.5x"])
    assert.deepStrictEqual(bounds({ walRate: { stop: "48MB/s" } }), [48e6, 24e6])
    assert.deepStrictEqual(bounds({ longTransactions: { stop: "10m" } }), [600, 300])
    assert.deepStrictEqual(bounds({ queueLatency: { stop: "5m" } }), [300, 150])
    assert.deepStrictEqual(bounds({ redisMemory: { stop: 0.9 } }), [0.9, 0.85])
    const walk = (json: unknown, readings: ReadonlyArray<number>) => {
      const r = rule(json)
      let held = false
      let flips = 0
      for (const v of readings) {
        const next = nextHeld(r, held, value(v))
        if (next !== held) flips++
        held = next
      }
      return flips
    }
    // Hovering around 8 MB: one hold, no release until well under it.
    assert.strictEqual(walk({ replicationLag: { stop: "8MB" } }, [7.9e6, 8.1e6, 7.9e6, 8.1e6, 7.5e6, 8.2e6]), 1)
    assert.strictEqual(
      walk({ prometheus: { url: "http://p", rules: [{ name: "a", query: "q", stop: "< 0.99" }] } }, [
        0.989,
        0.99,
        0.989
      ]),
      1
    )
  })

  for (
    const [json, says] of [
      [
        { replicationLag: { stop: "lots" } },
        `replicationLag.stop: expected a size like "64MB" or a duration like "10s", got "lots"`
      ],
      [{ replicationLag: { stop: "64MB", resume: "5s" } }, `replicationLag.resume: "5s" must be a size like stop`],
      [
        { replicationLag: { stop: "8MB", resume: "16MB" } },
        `replicationLag.resume: "16MB" must be on the healthy side of stop "8MB"`
      ],
      [
        { walRate: { stop: "fast" } },
        `walRate.stop: expected a rate like "48MB/s" or a multiple of its median like "3x"`
      ],
      [
        { walRate: { stop: "3x", resume: "10MB/s" } },
        `walRate.resume: "10MB/s" must be on the healthy side of stop "3x"`
      ],
      [{ longTransactions: { stop: "forever" } }, `longTransactions.stop: expected a duration like "10m"`],
      [{ replicationlag: { stop: "8MB" } }, `unknown signal "replicationlag"`],
      [{ autovacuum: { stop: false } }, `autovacuum`],
      [{ redisMemory: { stop: 1.5 } }, `redisMemory`],
      [{ queueLatency: { stop: "5m", onUnknown: "wait" } }, `onUnknown`],
      [
        { prometheus: { url: "http://p", rules: [{ name: "apdex", query: "q", stop: "0.99" }] } },
        `prometheus.rules[0].stop: expected a comparison like "< 0.99"`
      ],
      [
        { prometheus: { url: "http://p", rules: [{ name: "apdex", query: "q", stop: "< 0.99", resume: "< 0.995" }] } },
        `must be on the healthy side of stop "< 0.99"`
      ],
      [
        { prometheus: { url: "http://p", rules: [{ name: "walRate", query: "q", stop: "< 1" }] } },
        `"walRate" is already a signal's name`
      ],
      [{}, "no signal configured"]
    ] as const
  ) {
    it(`${JSON.stringify(json)} is refused: ${says}`, () => {
      assert.include(failure(json), says)
    })
  }

  it.effect("through SweeperConfig: absent = no gate; bad = InvalidConfig naming SWEEPER_HEALTH in one line", () =>
    Effect.gen(function*() {
      const load = (env: Record<string, string>) =>
        Effect.map(SweeperConfig, (s) => s.health).pipe(
          Effect.provide(SweeperConfig.layer),
          Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env }))
        )
      assert.isTrue(Option.isNone(yield* load({})))
      const some = yield* load({ SWEEPER_HEALTH: JSON.stringify({ replicationLag: { stop: "8MB", resume: "1MB" } }) })
      assert.strictEqual(Option.getOrThrow(some).rules[0]!.signal, "replicationLag")
      const error = yield* Effect.flip(
        load({ SWEEPER_HEALTH: JSON.stringify({ replicationLag: { stop: "8MB", resume: "16MB" } }) })
      )
      assert.instanceOf(error, InvalidConfig)
      assert.strictEqual(error.variable, "SWEEPER_HEALTH")
      assert.include(error.message, "must be on the healthy side")
      const notJson = yield* Effect.flip(load({ SWEEPER_HEALTH: "{replicationLag" }))
      assert.strictEqual(notJson.variable, "SWEEPER_HEALTH")
    }))

  it("RawHealth and compileHealth agree with the JSON decoder", () => {
    const raw = Schema.decodeUnknownSync(RawHealth)({ queueLatency: { stop: "5m" } })
    assert.isTrue(Result.isSuccess(compileHealth(raw)))
  })
})

describe("hysteresis", () => {
  const lag = rule({ replicationLag: { stop: "8MB", resume: "2MB" } })

  it("holds above stop, keeps holding between resume and stop, releases at resume", () => {
    // Open: exactly at stop does not hold; one byte over does.
    assert.isFalse(nextHeld(lag, false, value(8_000_000)))
    assert.isTrue(nextHeld(lag, false, value(8_000_001)))
    // Held: between resume and stop it stays held (no flapping around one threshold).
    assert.isTrue(nextHeld(lag, true, value(8_000_000)))
    assert.isTrue(nextHeld(lag, true, value(2_000_001)))
    // At resume it releases; an open signal between the two stays open.
    assert.isFalse(nextHeld(lag, true, value(2_000_000)))
    assert.isFalse(nextHeld(lag, false, value(5_000_000)))
  })

  it("a walk of readings: one hold, one release", () => {
    const readings = [1, 5, 9, 12, 7, 3, 2.5, 2, 4, 7.9, 8.1].map((mb) => value(mb * 1_000_000))
    let held = false
    const trace: Array<boolean> = []
    for (const reading of readings) {
      held = nextHeld(lag, held, reading)
      trace.push(held)
    }
    assert.deepStrictEqual(trace, [false, false, true, true, true, true, true, false, false, false, true])
  })

  it("unknown is healthy by default for an open rule but never ends a hold; onUnknown hold holds and keeps holding", () => {
    assert.isFalse(nextHeld(lag, false, unknown("connection refused")))
    // One slow read mid-incident is no news that the incident is over.
    assert.isTrue(nextHeld(lag, true, unknown("connection refused")))
    const strict = { ...lag, onUnknown: "hold" as const }
    assert.isTrue(nextHeld(strict, false, unknown("permission denied")))
    assert.isTrue(nextHeld(strict, true, unknown("permission denied")))
  })

  it("a Prometheus rule holds below its stop and releases at or above its resume", () => {
    const apdex = rule({
      prometheus: { url: "http://p:9090", rules: [{ name: "apdex", query: "q", stop: "< 0.99", resume: ">= 0.995" }] }
    })
    assert.isFalse(nextHeld(apdex, false, value(0.99)))
    assert.isTrue(nextHeld(apdex, false, value(0.989)))
    assert.isTrue(nextHeld(apdex, true, value(0.994)))
    assert.isFalse(nextHeld(apdex, true, value(0.995)))
  })

  it("per-subject readings: the worst known value, unknown only when nothing known already holds", () => {
    const memory = rule({ redisMemory: { stop: 0.9, resume: 0.8 } })
    assert.deepStrictEqual(worstOf(memory, [value(0.5), value(0.95)]), value(0.95))
    assert.deepStrictEqual(worstOf(memory, [value(0.95), unknown("down")]), value(0.95))
    assert.deepStrictEqual(worstOf(memory, [value(0.5), unknown("down")]), unknown("down"))
    assert.deepStrictEqual(worstOf(memory, []), value(0))
  })

  it("a held rule is judged against resume over every subject: a subject between resume and stop beside an unknown one keeps the hold", () => {
    const memory = rule({ redisMemory: { stop: 0.9, resume: 0.8 } })
    // Was released: the 0.85 is under stop, the unknown one read healthy (default) ⇒ before, the hold ended.
    assert.deepStrictEqual(judge(memory, true, [value(0.85), unknown("down")]).held, true)
    assert.deepStrictEqual(judge(memory, true, [value(0.85), value(0.5)]), { held: true, reading: value(0.85) })
    assert.deepStrictEqual(judge(memory, true, [value(0.8), value(0.5)]), { held: false, reading: value(0.8) })
    // Not held: stop decides; an unknown subject holds only with onUnknown hold.
    assert.isFalse(judge(memory, false, [value(0.85), unknown("down")]).held)
    assert.isTrue(judge({ ...memory, onUnknown: "hold" }, false, [value(0.5), unknown("down")]).held)
    // Nothing read yet changes nothing.
    assert.isTrue(judge(memory, true, []).held)
    assert.isFalse(judge(memory, false, []).held)
  })

  it("a relative baseline warms up: no baseline before 30 samples over 5 minutes", () => {
    let samples: Array<{ at: number; value: number }> = []
    for (let i = 0; i < 29; i++) samples = addSample(samples, i * 20_000, 1e6)
    assert.isTrue(Option.isNone(baselineOf(samples)), "29 samples")
    samples = addSample(samples, 29 * 20_000, 1e6)
    assert.deepStrictEqual(baselineOf(samples), Option.some(1e6))
    // Thirty samples in thirty seconds (a burst of readings) are no normal yet.
    let quick: Array<{ at: number; value: number }> = []
    for (let i = 0; i < 60; i++) quick = addSample(quick, i * 1000, 1e6)
    assert.isTrue(Option.isNone(baselineOf(quick)))
  })

  it("autovacuum never watches Sweeper's own tables", () => {
    const vacuum = rule({ autovacuum: { stop: true } })
    const writes = {
      tables: ["ci_builds", "sweeper_events", "sweeper_runs"],
      redisStores: [],
      queues: [],
      databases: ["ci" as const]
    }
    assert.deepStrictEqual(subjectsFor(vacuum, writes), ["ci_builds"])
    assert.deepStrictEqual(subjectsFor(vacuum, { ...writes, tables: ["sweeper_events"] }), [])
  })

  it("database-wide PostgreSQL signals are read on the database the batch writes; tables where they are kept", () => {
    const lagRule = rule({ replicationLag: { stop: "8MB" } })
    const vacuum = rule({ autovacuum: { stop: true } })
    const prometheus = rule({
      prometheus: { url: "http://p:9090", rules: [{ name: "apdex", query: "q", stop: "< 1" }] }
    })
    const drop = { tables: ["ci_builds", "sweeper_events"] }
    const exports = { tables: ["project_export_jobs", "sweeper_events"] }
    const uploads = { tables: ["sweeper_events"] }
    // Decomposed: drop-* batches write ci, the others main; a batch writing no table, no database.
    assert.deepStrictEqual(databasesOf(drop, true), ["ci"])
    assert.deepStrictEqual(databasesOf(exports, true), ["main"])
    assert.deepStrictEqual(databasesOf(uploads, true), ["main"])
    assert.deepStrictEqual(databasesOf({}, true), [])
    // One database: every batch's is main.
    assert.deepStrictEqual(databasesOf(drop, false), ["main"])
    const writes = { ...drop, redisStores: [], queues: [], databases: databasesOf(drop, true) }
    assert.deepStrictEqual(subjectsFor(lagRule, writes), ["ci"])
    assert.deepStrictEqual(subjectsFor(prometheus, writes), [""])
    assert.strictEqual(databaseOfSubject(lagRule, "ci", true), "ci")
    assert.strictEqual(databaseOfSubject(lagRule, "main", true), "main")
    assert.strictEqual(databaseOfSubject(vacuum, "ci_builds", true), "ci")
    assert.strictEqual(databaseOfSubject(vacuum, "ci_builds", false), "main")
    assert.strictEqual(databaseOfSubject(vacuum, "project_export_jobs", true), "main")
    assert.isUndefined(databaseOfSubject(prometheus, "", true))
  })
})

describe("relative thresholds: the signal's own median over the last hour", () => {
  const wal = rule({ walRate: { stop: "3x", resume: "1.5x" } })

  it.effect("a steady platform's rate is its normal; a burst past 3x its median holds until 1.5x", () =>
    Effect.gen(function*() {
      let samples: ReadonlyArray<Sample> = []
      const sample = (v: number) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          samples = addSample(samples, now, v)
          return median(samples)
        })
      // An hour of a busy but normal 10 MB/s, one sample a second.
      for (let i = 0; i < 3600; i++) {
        yield* sample(10e6)
        yield* TestClock.adjust(Duration.seconds(1))
      }
      const baseline = yield* sample(10e6)
      assert.deepStrictEqual(baseline, Option.some(10e6))
      assert.isFalse(nextHeld(wal, false, value(30e6), baseline), "exactly 3x is not over")
      assert.isTrue(nextHeld(wal, false, value(31e6), baseline))
      assert.isTrue(nextHeld(wal, true, value(16e6), baseline))
      assert.isFalse(nextHeld(wal, true, value(15e6), baseline))
      assert.strictEqual(samples.length, 3600, "samples older than the hour are forgotten")
    }))

  it.effect("after an hour at a new level the median follows it, and the old normal is forgotten", () =>
    Effect.gen(function*() {
      let samples: ReadonlyArray<Sample> = []
      for (let i = 0; i < 3600; i++) {
        samples = addSample(samples, yield* Clock.currentTimeMillis, 1e6)
        yield* TestClock.adjust(Duration.seconds(1))
      }
      // Half an hour at 5 MB/s: still under half the window, the median stays 1 MB/s.
      for (let i = 0; i < 1799; i++) {
        samples = addSample(samples, yield* Clock.currentTimeMillis, 5e6)
        yield* TestClock.adjust(Duration.seconds(1))
      }
      assert.deepStrictEqual(median(samples), Option.some(1e6))
      assert.isTrue(nextHeld(wal, false, value(5e6), median(samples)))
      for (let i = 0; i < 1802; i++) {
        samples = addSample(samples, yield* Clock.currentTimeMillis, 5e6)
        yield* TestClock.adjust(Duration.seconds(1))
      }
      assert.deepStrictEqual(median(samples), Option.some(5e6))
      assert.isFalse(nextHeld(wal, false, value(5e6), median(samples)))
    }))

  it("no baseline yet: a relative threshold never holds", () => {
    assert.isFalse(nextHeld(wal, false, value(1e12), Option.none()))
    assert.deepStrictEqual(median([]), Option.none())
    assert.deepStrictEqual(median([{ at: 0, value: 1 }, { at: 1, value: 3 }]), Option.some(2))
  })
})

describe("throttled concurrency limits (GitLab's numbers)", () => {
  const walk = (limit: number, health: ReadonlyArray<boolean>) => {
    let state = Option.none<ThrottleState>()
    return health.map((unhealthy) => {
      const next = throttleStep(limit, state, unhealthy)
      state = Option.some(next)
      return next.effective
    })
  }

  it("×0.8 at once, ×0.5 after three unhealthy passes in a row, never below 1", () => {
    assert.deepStrictEqual(walk(100, [true, true, true, true, true, true, true, true]), [80, 64, 51, 25, 12, 6, 3, 1])
    assert.deepStrictEqual(walk(1, [true, true, true, true, true]), [1, 1, 1, 1, 1])
  })

  it("recovers by max(+1, ×1.1) per healthy pass up to the configured limit", () => {
    assert.deepStrictEqual(walk(100, [true, true, true, true, false, false, false, false, false]), [
      80,
      64,
      51,
      25,
      27,
      29,
      31,
      34,
      37
    ])
    assert.deepStrictEqual(walk(10, [true, false, false, false]), [8, 9, 10, 10])
  })

  it("a healthy pass resets the count: the next unhealthy one is soft again", () => {
    assert.deepStrictEqual(walk(100, [true, true, true, false, true]), [80, 64, 51, 56, 44])
  })

  it("0 (unlimited) and negative (breaker open) are never throttled; a lowered limit caps at once", () => {
    assert.deepStrictEqual(walk(0, [true, true, true, true]), [0, 0, 0, 0])
    assert.deepStrictEqual(walk(-1, [true, false]), [-1, -1])
    const lowered = throttleStep(20, Option.some<ThrottleState>({ effective: 50, unhealthyPasses: 0 }), false)
    assert.strictEqual(lowered.effective, 20)
  })
})

describe("open holds from a batch's stream (sweeper status)", () => {
  const at = (s: number) => new Date(Date.UTC(2026, 0, 1, 6, 45, s))
  const held = (signal: string, runId: string, s: number, data: Record<string, unknown> = {}) => ({
    type: "RepairHeld",
    data: {
      batch: "drop-canceling-builds",
      signal,
      value: 38_000_000,
      threshold: 8_000_000,
      stop: "8MB",
      unit: "bytes",
      ...data
    },
    runId,
    occurredAt: at(s)
  })
  const released = (signal: string, runId: string, s: number) => ({
    type: "RepairReleased",
    data: { batch: "drop-canceling-builds", signal, heldMs: 1000 },
    runId,
    occurredAt: at(s)
  })
  const finished = (runId: string, s: number) => ({
    type: "RunFinished",
    data: { batch: "drop-canceling-builds", outcome: "abandoned" },
    runId,
    occurredAt: at(s)
  })

  it("a RepairHeld without its RepairReleased, in a run not finished, is open; the line says value, threshold and since", () => {
    assert.deepStrictEqual(openHolds([held("replicationLag", "r1", 10, { database: "ci" })]).map((h) => h.text), [
      "drop-canceling-builds held by replicationLag on ci: 38 MB > 8 MB since 06:45:10"
    ])
    assert.strictEqual(openHolds([held("replicationLag", "r1", 10, { database: "ci" })])[0]?.database, "ci")
    assert.deepStrictEqual(openHolds([held("replicationLag", "r1", 10), released("replicationLag", "r1", 12)]), [])
    // A run killed while held: its RunFinished (abandoned) closes the hold.
    assert.deepStrictEqual(openHolds([held("replicationLag", "r1", 10), finished("r1", 50)]), [])
    // Prometheus rules carry their comparison; unknown readings say why; a hold written before holds
    // named their database says none.
    const apdex = held("patroniApdex", "r2", 20, { value: 0.95, threshold: 0.99, stop: "< 0.99", unit: "value" })
    const unknownLag = held("replicationLag", "r2", 21, {
      value: null,
      unknown: "pg_stat_replication: needs pg_read_all_stats"
    })
    assert.deepStrictEqual(openHolds([apdex, unknownLag]).map((h) => h.text), [
      "drop-canceling-builds held by patroniApdex: 0.95 < 0.99 since 06:45:20",
      "drop-canceling-builds held by replicationLag: unknown (pg_stat_replication: needs pg_read_all_stats) > 8 MB since 06:45:21"
    ])
  })
})
