/**
 * A lease taken with `underLease` (concurrency-limit-resume's per-worker lease) on real Redis is
 * kept alive while the gate holds the passes under it: a hold longer than the TTL must not let
 * another process take the lease and run the same worker at the same time.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Layer, Logger, Option } from "effect"
import { randomUUID } from "node:crypto"
import { RedisError } from "../../src/domain/Errors.ts"
import { leaseKey } from "../../src/domain/Lease.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { passes, underLease } from "../../src/repair/RepairLoop.ts"
import { HealthGate, openGate } from "../../src/services/HealthGate.ts"
import { Lease } from "../../src/services/Lease.ts"
import { RedisTest } from "../support/redis.ts"

describe("underLease on real Redis", () => {
  it.live("the lease is kept alive through a gate hold longer than its TTL", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const name = `sweeper/test/${randomUUID()}`
      let asked = 0
      // The second pass is held for 3.5 s, over three times the lease's 1 s TTL.
      const holding = Effect.provideService(HealthGate, {
        ...openGate,
        beforeUnit: () =>
          ++asked === 2
            ? Effect.as(Effect.sleep("3500 millis"), { proceed: true, heldMs: 3500, heldBy: ["replicationLag"] })
            : Effect.succeed({ proceed: true, heldMs: 0, heldBy: [] })
      })
      const worker = underLease(name, Duration.seconds(1), (renew) =>
        passes({
          batch: "b",
          budget: Duration.minutes(1),
          delay: Duration.millis(10),
          pass: (first) => Effect.succeed(Option.some(first)),
          next: (first) => first ? "wait" : "stop",
          between: renew
        }).pipe(holding))
      // Another process tries to take the lease in the middle of the hold.
      const rival = Effect.sleep("2500 millis").pipe(Effect.andThen(lease.tryAcquire(name, Duration.seconds(1))))
      const [ran, taken] = yield* Effect.all([worker, rival], { concurrency: 2 })
      assert.isTrue(Option.isNone(taken), "another process took the lease during the hold")
      assert.deepStrictEqual(Option.map(ran, (r) => r.results), Option.some([true, false]))
    }).pipe(Effect.provide(LeaseRedis.pipe(Layer.provideMerge(RedisTest)))), 20_000)

  it.live(
    "a background renewal that errs says so in a log line (and is left to the next one)",
    () =>
      Effect.gen(function*() {
        const lease = yield* Lease
        const warnings: Array<string> = []
        const collector = Logger.make((options) => {
          if (options.logLevel === "Warn") warnings.push(String(options.message))
        })
        // Redis refuses every renewal; the body waits 1.2 s, long enough for the renewal at a third of 3 s.
        const refusing = Lease.of({
          ...lease,
          renew: () =>
            Effect.fail(new RedisError({ operation: "lease.renew", cause: new Error("OOM command not allowed") }))
        })
        const ran = yield* underLease(
          `sweeper/test/${randomUUID()}`,
          Duration.seconds(3),
          () => Effect.sleep("1200 millis")
        ).pipe(
          Effect.provideService(Lease, refusing),
          Effect.provide(Logger.layer([collector]))
        )
        assert.isTrue(Option.isSome(ran))
        assert.isTrue(
          warnings.some((message) => message.includes("Lease renewal failed")),
          `warnings: ${JSON.stringify(warnings)}`
        )
      }).pipe(Effect.provide(LeaseRedis.pipe(Layer.provideMerge(RedisTest)))),
    20_000
  )

  it.live("a lease taken by another process during a hold: the held pass does not run", () =>
    Effect.gen(function*() {
      const redis = yield* Redis
      const name = `sweeper/test/${randomUUID()}`
      let asked = 0
      // While the second pass is held, another process owns the lease (ours lapsed, say).
      const holding = Effect.provideService(HealthGate, {
        ...openGate,
        beforeUnit: () =>
          ++asked === 2
            ? Effect.as(
              Effect.andThen(
                redis.use("steal", (c) => c.set(leaseKey(name), "another-process", "EX", 60)).pipe(Effect.orDie),
                Effect.sleep("200 millis")
              ),
              { proceed: true, heldMs: 200, heldBy: ["replicationLag"] }
            )
            : Effect.succeed({ proceed: true, heldMs: 0, heldBy: [] })
      })
      const ran = yield* underLease(name, Duration.seconds(15), (renew) =>
        passes({
          batch: "b",
          budget: Duration.minutes(1),
          delay: Duration.millis(10),
          pass: (first) => Effect.succeed(Option.some(first)),
          next: (first) => first ? "wait" : "stop",
          between: renew
        }).pipe(holding))
      assert.deepStrictEqual(Option.map(ran, (r) => r.results), Option.some([true]))
      assert.strictEqual(yield* redis.use("get", (c) => c.get(leaseKey(name))), "another-process")
    }).pipe(Effect.provide(LeaseRedis.pipe(Layer.provideMerge(RedisTest)))), 20_000)
})
