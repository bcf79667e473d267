/**
 * reschedule-stuck-issue-rebalances over arbitrary bytes in the running-rebalances set:
 * members built from type and id pieces, bad bytes (0xFF, a lone surrogate's encoding, a truncated
 * sequence, a byte-order mark), NUL and look-alikes (`01`, `05`, `-3`, `1e3`, U+FFFD). After a real run:
 * every malformed member is counted and nothing is enqueued for it; every valid member is enqueued
 * exactly once with GitLab's args; the set itself is left as it was. The oracle is written apart
 * from the domain: a member is UTF-8 when Node's decoder round-trips it.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Context, Effect, Layer, Schema } from "effect"
import { RUNNING_REBALANCES_KEY } from "../../src/domain/Rebalancing.ts"
import { queueKey } from "../../src/domain/Sidekiq.ts"
import { EventLogMemory, MemoryEvents } from "../../src/layers/memory/EventLogMemory.ts"
import { JobQueueMemory } from "../../src/layers/memory/JobQueueMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { MemoryPlatformRecords, PlatformRecordsMemory } from "../../src/layers/memory/PlatformRecordsMemory.ts"
import { RebalancingStateMemory } from "../../src/layers/memory/RebalancingStateMemory.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { RebalanceRescheduleLive } from "../../src/layers/protocols/RebalanceRescheduleLive.ts"
import { JobQueueRedis } from "../../src/layers/redis/JobQueueRedis.ts"
import { RebalancingStateRedis } from "../../src/layers/redis/RebalancingStateRedis.ts"
import { Redis } from "../../src/layers/redis/Redis.ts"
import { RescheduleStuckIssueRebalances } from "../../src/programs/RescheduleStuckIssueRebalances.ts"
import { RedisTest } from "../support/redis.ts"

const utf8 = (text: string) => [...Buffer.from(text, "utf8")]
const TYPES: ReadonlyArray<ReadonlyArray<number>> = [
  utf8("1"),
  utf8("1"),
  utf8("2"),
  utf8("2"),
  utf8("3"),
  utf8("0"),
  utf8("01"),
  [],
  [0xff],
  [0xef, 0xbb, 0xbf, ...utf8("1")]
]
/** Pieces after the id digits. */
const SUFFIXES: ReadonlyArray<ReadonlyArray<number>> = [
  [],
  [],
  [],
  [],
  [0xff],
  [0xed, 0xa0, 0x80],
  [0xc3],
  [0x00],
  utf8("\uFFFD"),
  utf8("/6"),
  utf8(".0"),
  utf8("e3"),
  utf8(" ")
]
const index = (n: number) => Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: n - 1 }))
const Member = Schema.Struct({
  type: index(TYPES.length),
  /** 0: no slash. */
  slash: index(5),
  /** 0: "0", 1: "05", 2: "-3", 3: "abc", otherwise the id itself (1–40). */
  id: index(41),
  suffix: index(SUFFIXES.length)
})
const Case = { members: Schema.Array(Member).check(Schema.isMaxLength(12)) }
type Member = typeof Member.Type

const idBytes = (id: number) => utf8(id === 0 ? "0" : id === 1 ? "05" : id === 2 ? "-3" : id === 3 ? "abc" : String(id))
const memberOf = (m: Member) =>
  Buffer.from([...TYPES[m.type]!, ...(m.slash === 0 ? [] : utf8("/")), ...idBytes(m.id), ...SUFFIXES[m.suffix]!])

const isUtf8 = (bytes: Buffer) => Buffer.from(bytes.toString("utf8"), "utf8").equals(bytes)

/** The oracle: `[type, id]` for a member GitLab's rebalancer could have written, else undefined. */
const validOf = (member: Buffer): readonly [1 | 2, number] | undefined => {
  if (!isUtf8(member)) return undefined
  const match = /^([12])\/([1-9][0-9]*)$/.exec(member.toString("utf8"))
  return match === null ? undefined : [Number(match[1]) as 1 | 2, Number(match[2])]
}

/** The set and the queue, behind the services' back. */
class Raw extends Context.Service<Raw, {
  reset: Effect.Effect<void>
  add(members: ReadonlyArray<Buffer>): Effect.Effect<void>
  membersHex: Effect.Effect<Array<string>>
  queued: Effect.Effect<Array<string>>
}>()("test/programs/RescheduleStuckIssueRebalances.property/Raw") {}

const QUEUE = queueKey("issues_rebalancing")

const RawMemory = Layer.effect(
  Raw,
  Effect.map(MemoryRedis, (store) =>
    Raw.of({
      reset: Effect.sync(() => store.flushAll()),
      add: (members) => Effect.sync(() => void store.sadd(RUNNING_REBALANCES_KEY, ...members)),
      membersHex: Effect.sync(() => store.smembersBuffer(RUNNING_REBALANCES_KEY).map((m) => m.toString("hex")).sort()),
      queued: Effect.sync(() => store.lrange(QUEUE, 0, -1))
    }))
)

const RawRedis = Layer.effect(
  Raw,
  Effect.map(Redis, ({ client }) =>
    Raw.of({
      reset: Effect.promise(() => client.flushdb()).pipe(Effect.asVoid),
      add: (members) => Effect.promise(() => client.sadd(RUNNING_REBALANCES_KEY, ...members)).pipe(Effect.asVoid),
      membersHex: Effect.promise(async () =>
        (await client.smembersBuffer(RUNNING_REBALANCES_KEY)).map((m) => m.toString("hex")).sort()
      ),
      queued: Effect.promise(() => client.lrange(QUEUE, 0, -1))
    }))
)

const checkCase = ({ members }: { readonly members: ReadonlyArray<Member> }) =>
  Effect.gen(function*() {
    const raw = yield* Raw
    yield* raw.reset
    const distinct = [...new Map(members.map(memberOf).map((m) => [m.toString("hex"), m])).values()]
    if (distinct.length > 0) yield* raw.add(distinct)
    const before = yield* raw.membersHex

    const summary = yield* RescheduleStuckIssueRebalances.run

    const valid = distinct.flatMap((m) => {
      const v = validOf(m)
      return v === undefined ? [] : [v]
    })
    const ids = (type: 1 | 2) =>
      [...new Set(valid.filter(([t]) => t === type).map(([, id]) => id))].sort((a, b) => a - b)
    assert.strictEqual(summary.invalidMembers, distinct.length - valid.length)
    assert.deepStrictEqual(summary.namespaceIds, ids(1))
    assert.deepStrictEqual(summary.projectIds, ids(2))
    const args = (yield* raw.queued).map((payload) => JSON.stringify((JSON.parse(payload) as { args: unknown }).args))
      .sort()
    assert.deepStrictEqual(
      args,
      [
        ...ids(1).map((id) => JSON.stringify([null, null, id])),
        ...ids(2).map((id) => JSON.stringify([null, id, null]))
      ].sort()
    )
    assert.strictEqual(summary.enqueuedNamespaces + summary.enqueuedProjects, args.length)
    assert.deepStrictEqual(yield* raw.membersHex, before)
  })

/** Every id the generator can produce exists in the database, so "valid" means "enqueued". */
const Records = Layer.effectDiscard(Effect.map(MemoryPlatformRecords, (records) => {
  for (let id = 1; id <= 40; id++) {
    records.namespaces.add(id)
    records.projects.add(id)
  }
})).pipe(Layer.provideMerge(PlatformRecordsMemory))

// Events pile up across cases in the shared layer; only the counts above matter here.
const Events = EventLogMemory.pipe(Layer.provideMerge(MemoryEvents.layer))

describe("reschedule-stuck-issue-rebalances over arbitrary bytes", () => {
  layer(
    RebalanceRescheduleLive.pipe(
      Layer.provideMerge(
        Layer.mergeAll(RebalancingStateMemory, JobQueueMemory, RawMemory, Records, Events, MetricsPrometheus)
      ),
      Layer.provideMerge(MemoryRedis.layer)
    )
  )(
    "memory",
    (it) => {
      it.effect.prop("malformed members counted and never enqueued; valid ones enqueued once", Case, checkCase, {
        arbitrary: { runs: 50 }
      })
    }
  )
  layer(
    RebalanceRescheduleLive.pipe(
      Layer.provideMerge(
        Layer.mergeAll(RebalancingStateRedis, JobQueueRedis, RawRedis, Records, Events, MetricsPrometheus)
      ),
      Layer.provideMerge(RedisTest)
    ),
    {
      timeout: "60 seconds"
    }
  )("real Redis", (it) => {
    it.effect.prop("malformed members counted and never enqueued; valid ones enqueued once", Case, checkCase, {
      arbitrary: { runs: 40 }
    })
  })
})
