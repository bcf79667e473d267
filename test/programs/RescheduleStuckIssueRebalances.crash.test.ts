/**
 * reschedule-stuck-issue-rebalances killed between any two of its writes ("a repair's event
 * is written so that a crash can duplicate it but never lose it"). The process dies right before or
 * right after its k-th write step — a claim check, an events INSERT, a push — for every k; then,
 * before the next run, the pushed jobs either stay pending or are run by Sidekiq (which finishes the
 * rebalance: the container leaves the running set and the job's claim is released, so the next run
 * has nothing to record for it). Afterwards every job that was ever pushed has at least one
 * `RebalanceRescheduled` naming its jid. With the old order (push, then events) the kill after the
 * push followed by the job running lost the event; here the events go first.
 */
import { assert, describe, it } from "@effect/vitest"
import { DateTime, Effect, Exit, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import { RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { queueKey } from "../../src/domain/Sidekiq.ts"
import { MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { jobQueueMemoryStore } from "../../src/layers/memory/JobQueueMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { MemoryPlatformRecords } from "../../src/layers/memory/PlatformRecordsMemory.ts"
import { duplicateKey, type JobQueueStore, makeJobQueue } from "../../src/layers/protocols/JobQueueShared.ts"
import { RebalanceRescheduleLive } from "../../src/layers/protocols/RebalanceRescheduleLive.ts"
import { RescheduleStuckIssueRebalances } from "../../src/programs/RescheduleStuckIssueRebalances.ts"
import { EventLog } from "../../src/services/EventLog.ts"
import { JobQueue } from "../../src/services/JobQueue.ts"
import { MemoryPlatform } from "../support/memory.ts"

const WORKER = "Issues::RebalancingWorker"
const QUEUE = "issues_rebalancing"
const MEMBERS = ["1/10", "1/11", "2/20", "2/21"]
/** Per container type: check claims, INSERT events, push. */
const STEPS = 6

const Job = Schema.fromJsonString(
  Schema.Struct({ jid: Schema.String, args: Schema.Array(Schema.NullOr(Schema.Number)) })
)
const parseJob = Schema.decodeUnknownSync(Job)
const containerOf = (args: ReadonlyArray<number | null>) => (args[2] !== null ? `1/${args[2]}` : `2/${args[1]}`)

/**
 * The program with its write steps numbered: it is interrupted (as by kill -9; nothing after runs)
 * right before, or right after, step `k`. k beyond the last step: never killed.
 */
const runKilledAt = (k: number, after: boolean) =>
  Effect.gen(function*() {
    const redis = yield* MemoryRedis
    const log = yield* EventLog
    let step = 0
    const counted = <A, E>(effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
      Effect.suspend(() => {
        step++
        if (step !== k) return effect
        return after ? Effect.andThen(effect, Effect.interrupt) : Effect.interrupt
      })
    const store = jobQueueMemoryStore(redis)
    const killing: JobQueueStore = {
      checkClaims: (keys) => counted(store.checkClaims(keys)),
      push: (queue, jobs) => counted(store.push(queue, jobs)),
      pushOnce: store.pushOnce,
      peek: store.peek
    }
    return yield* Effect.exit(RescheduleStuckIssueRebalances.run.pipe(
      // The push step built over the killing queue and the counting log (fresh: layers are memoized).
      Effect.provide(Layer.fresh(RebalanceRescheduleLive)),
      Effect.provideService(JobQueue, makeJobQueue(killing)),
      Effect.provideService(EventLog, EventLog.of({ ...log, appendAll: (events) => counted(log.appendAll(events)) }))
    ))
  })

/** Sidekiq runs every pending job: each finishes its rebalance and releases its claim. */
const sidekiqRunsEverything = Effect.gen(function*() {
  const redis = yield* MemoryRedis
  const ran: Array<string> = []
  for (const payload of redis.lrange(queueKey(QUEUE), 0, -1)) {
    const job = parseJob(payload)
    ran.push(job.jid)
    redis.srem(RUNNING_REBALANCES_KEY, containerOf(job.args))
    redis.del(duplicateKey(QUEUE, WORKER, job.args))
  }
  redis.del(queueKey(QUEUE))
  return ran
})

describe("reschedule-stuck-issue-rebalances killed at every write step", () => {
  for (const jobRuns of [false, true]) {
    it.effect(`every pushed job has at least one event (jobs ${jobRuns ? "run" : "stay pending"} before the next run)`, () =>
      Effect.gen(function*() {
        let extraEvents = 0
        for (let k = 1; k <= STEPS + 1; k++) {
          for (const after of [false, true]) {
            yield* Effect.gen(function*() {
              yield* TestClock.setTime(DateTime.toEpochMillis(DateTime.makeUnsafe("2026-03-01T12:15:00Z")))
              const redis = yield* MemoryRedis
              redis.sadd(RUNNING_REBALANCES_KEY, ...MEMBERS)
              const records = yield* MemoryPlatformRecords
              records.namespaces.add(10).add(11)
              records.projects.add(20).add(21)

              const killed = yield* runKilledAt(k, after)
              if (k <= STEPS) assert.isTrue(Exit.isFailure(killed), `killed ${after ? "after" : "before"} step ${k}`)
              const ranBetween = jobRuns ? yield* sidekiqRunsEverything : []
              const next = yield* runKilledAt(Number.POSITIVE_INFINITY, false)
              assert.isTrue(Exit.isSuccess(next))

              const pushed = [
                ...ranBetween,
                ...redis.lrange(queueKey(QUEUE), 0, -1).map((payload) => parseJob(payload).jid)
              ]
              const events = (yield* MemoryEvents).filter((event) => event.type === "RebalanceRescheduled")
              const recorded = new Set(
                events.filter((event) => event.data.duplicate === false).map((event) => event.data.jid)
              )
              for (const jid of pushed) {
                assert.isTrue(
                  recorded.has(jid),
                  `killed ${after ? "after" : "before"} step ${k}: pushed job ${jid} has no event`
                )
              }
              // Every container still running after the second run is recorded by it; extra events
              // are those of pushes a kill stopped (written, then the push never happened).
              const streams = new Set(events.map((event) => event.stream))
              for (const member of redis.smembers(RUNNING_REBALANCES_KEY)) {
                assert.isTrue(streams.has(`rebalance:${member}`))
              }
              extraEvents += events.filter((event) =>
                event.data.duplicate === false && !pushed.includes(event.data.jid as string)
              ).length
            }).pipe(Effect.provide(MemoryPlatform()))
          }
        }
        // Kills before a push leave events for pushes that never happened: duplicates, as README says.
        assert.isAbove(extraEvents, 0, "some kill fell between the events and their push")
      }))
  }
})
