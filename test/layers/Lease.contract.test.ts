/**
 * One contract for both Lease implementations: LeaseMemory over MemoryRedis (TestClock drives
 * expiry) and LeaseRedis on a real Redis (real, short TTLs). `RawKeys` reads and pokes the keys
 * underneath, so the suite checks GitLab's key format, not just the service's own view.
 */
import { assert, describe, layer, type Vitest } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Option } from "effect"
import { TestClock } from "effect/testing"
import { randomUUID } from "node:crypto"
import { EPOCH_TTL_SECONDS, epochKey, leaseKey } from "../../src/domain/Lease.ts"
import { LeaseMemory } from "../../src/layers/memory/LeaseMemory.ts"
import { MemoryRedis } from "../../src/layers/memory/MemoryRedis.ts"
import { LeaseRedis } from "../../src/layers/redis/LeaseRedis.ts"
import { SharedStateRedis } from "../../src/layers/redis/Redis.ts"
import { Lease, type LeaseHandle } from "../../src/services/Lease.ts"
import { type RedisTopology, RedisTopologyTest, topologies } from "../support/redisTopology.ts"

/** Direct access to the store under the lease, bypassing the service. */
class RawKeys extends Context.Service<RawKeys, {
  get(key: string): Effect.Effect<string | null>
  /** Remaining TTL in ms (-2 missing, -1 none). */
  pttl(key: string): Effect.Effect<number>
  pexpire(key: string, ms: number): Effect.Effect<void>
  /** Somebody else's lease: SET key value NX-less EX seconds. */
  set(key: string, value: string, seconds: number): Effect.Effect<void>
  del(key: string): Effect.Effect<void>
}>()("test/layers/Lease/RawKeys") {}

const RawMemory = Layer.effect(
  RawKeys,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    return RawKeys.of({
      get: (key) => Effect.sync(() => store.get(key)),
      pttl: (key) => Effect.sync(() => store.pttl(key)),
      pexpire: (key, ms) => Effect.sync(() => void store.expire(key, ms / 1000)),
      set: (key, value, seconds) => Effect.sync(() => void store.set(key, value, { exSeconds: seconds })),
      del: (key) => Effect.sync(() => void store.del(key))
    })
  })
)

const RawRedis = Layer.effect(
  RawKeys,
  Effect.gen(function*() {
    const { client } = yield* SharedStateRedis
    return RawKeys.of({
      get: (key) => Effect.promise(() => client.get(key)),
      pttl: (key) => Effect.promise(() => client.pttl(key)),
      pexpire: (key, ms) => Effect.promise(() => client.pexpire(key, ms)).pipe(Effect.asVoid),
      set: (key, value, seconds) => Effect.promise(() => client.set(key, value, "EX", seconds)).pipe(Effect.asVoid),
      del: (key) => Effect.promise(() => client.del(key)).pipe(Effect.asVoid)
    })
  })
)

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** Every test takes its own lease name, so a shared store never couples tests. */
const uniqueName = (label: string) => `test/${label}/${randomUUID()}`

const acquired = (name: string, ttl: Duration.Input) =>
  Effect.gen(function*() {
    const lease = yield* Lease
    const handle = yield* lease.tryAcquire(name, Duration.fromInputUnsafe(ttl))
    assert.isTrue(Option.isSome(handle), `expected to acquire ${name}`)
    return Option.getOrThrow(handle)
  })

interface ContractOptions {
  /** Lets time pass: TestClock.adjust for memory, a real sleep for Redis. */
  readonly wait: (duration: Duration.Duration) => Effect.Effect<void>
}

const leaseContract = (it: Vitest.MethodsNonLive<Lease | RawKeys>, { wait }: ContractOptions) => {
  it.effect("stores a uuid under gitlab:exclusive_lease:<name> with the requested TTL", () =>
    Effect.gen(function*() {
      const raw = yield* RawKeys
      const name = uniqueName("format")
      const handle = yield* acquired(name, "2 seconds")
      assert.strictEqual(leaseKey(name), `gitlab:exclusive_lease:${name}`)
      assert.match(handle.token, UUID)
      assert.strictEqual(handle.name, name)
      assert.strictEqual(yield* raw.get(`gitlab:exclusive_lease:${name}`), handle.token)
      const ttl = yield* raw.pttl(`gitlab:exclusive_lease:${name}`)
      assert.isAtLeast(ttl, 1_000)
      assert.isAtMost(ttl, 2_000)
    }))

  it.effect("a TTL is rounded up to whole seconds (SET EX), never to zero", () =>
    Effect.gen(function*() {
      const raw = yield* RawKeys
      const name = uniqueName("round")
      yield* acquired(name, "300 millis")
      const ttl = yield* raw.pttl(leaseKey(name))
      assert.isAbove(ttl, 300)
      assert.isAtMost(ttl, 1_000)
    }))

  it.effect("a second acquisition while held is None and leaves the holder's key alone", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("held")
      const first = yield* acquired(name, "10 seconds")
      const second = yield* lease.tryAcquire(name, Duration.seconds(10))
      assert.isTrue(Option.isNone(second))
      assert.strictEqual(yield* raw.get(leaseKey(name)), first.token)
      // Held by somebody outside Sweeper (GitLab itself): also None.
      const foreign = uniqueName("foreign")
      yield* raw.set(leaseKey(foreign), "gitlab-sidekiq-holder", 30)
      assert.isTrue(Option.isNone(yield* lease.tryAcquire(foreign, Duration.seconds(10))))
      assert.strictEqual(yield* raw.get(leaseKey(foreign)), "gitlab-sidekiq-holder")
    }))

  it.effect("the epoch strictly increases across acquisitions (release, expiry) and is per name", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("epoch")
      const a = yield* acquired(name, "1 second")
      assert.isTrue(yield* lease.release(a))
      const b = yield* acquired(name, "1 second")
      assert.isAbove(b.epoch, a.epoch)
      yield* wait(Duration.millis(1_200))
      const c = yield* acquired(name, "1 second")
      assert.isAbove(c.epoch, b.epoch)
      assert.notStrictEqual(c.token, b.token)
      // A failed attempt takes no epoch.
      const stored = yield* raw.get(epochKey(name))
      assert.strictEqual(stored, String(c.epoch))
      assert.isTrue(Option.isNone(yield* lease.tryAcquire(name, Duration.seconds(1))))
      assert.strictEqual(yield* raw.get(epochKey(name)), stored)
      assert.isTrue(yield* lease.release(c))
      const d = yield* acquired(name, "1 second")
      assert.isAbove(d.epoch, c.epoch)
      // Another name has its own counter.
      const otherName = uniqueName("epoch-other")
      const other = yield* acquired(otherName, "1 second")
      assert.strictEqual(yield* raw.get(epochKey(otherName)), String(other.epoch))
      assert.strictEqual(yield* raw.get(epochKey(name)), String(d.epoch))
    }))

  it.effect("the epoch key shares the lease key's hash slot through a {tag} and expires (refreshed on acquire)", () =>
    Effect.gen(function*() {
      const raw = yield* RawKeys
      const name = uniqueName("epoch-ttl")
      assert.strictEqual(epochKey(name), `sweeper:exclusive_lease_epoch:{gitlab:exclusive_lease:${name}}`)
      yield* acquired(name, "1 second")
      const ttl = yield* raw.pttl(epochKey(name))
      assert.isAbove(ttl, (EPOCH_TTL_SECONDS - 60) * 1000)
      assert.isAtMost(ttl, EPOCH_TTL_SECONDS * 1000)
      // An epoch key with little time left gets its full TTL back at the next acquisition.
      yield* raw.pexpire(epochKey(name), 5_000)
      yield* wait(Duration.millis(1_200))
      yield* acquired(name, "1 second")
      assert.isAbove(yield* raw.pttl(epochKey(name)), (EPOCH_TTL_SECONDS - 60) * 1000)
    }))

  it.effect("after the epoch key expired, the next epoch is still above every earlier one (clock floor)", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("epoch-expired")
      const a = yield* acquired(name, "1 second")
      assert.isTrue(yield* lease.release(a))
      const b = yield* acquired(name, "1 second")
      assert.isTrue(yield* lease.release(b))
      yield* raw.del(epochKey(name))
      yield* wait(Duration.millis(5))
      const c = yield* acquired(name, "1 second")
      assert.isAbove(c.epoch, b.epoch)
    }))

  it.effect("a tick claim is SET NX EX under GitLab's key format and creates no epoch key", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("claim")
      assert.isTrue(yield* lease.claim(name, Duration.seconds(10)))
      assert.match((yield* raw.get(leaseKey(name)))!, UUID)
      const ttl = yield* raw.pttl(leaseKey(name))
      assert.isAbove(ttl, 8_000)
      assert.isAtMost(ttl, 10_000)
      assert.isNull(yield* raw.get(epochKey(name)))
      assert.isFalse(yield* lease.claim(name, Duration.seconds(10)))
      // A claim and a lease of the same name exclude each other (one key).
      assert.isTrue(Option.isNone(yield* lease.tryAcquire(name, Duration.seconds(1))))
    }))

  it.effect("renew extends our own lease back to its TTL", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("renew")
      const handle = yield* acquired(name, "10 seconds")
      yield* raw.pexpire(leaseKey(name), 400)
      assert.isTrue(yield* lease.renew(handle))
      const ttl = yield* raw.pttl(leaseKey(name))
      assert.isAbove(ttl, 9_000)
      assert.isAtMost(ttl, 10_000)
      assert.strictEqual(yield* raw.get(leaseKey(name)), handle.token)
      // Past the shortened expiry it is still ours.
      yield* wait(Duration.millis(600))
      assert.isTrue(yield* lease.isHeld(handle))
    }))

  it.effect("an expired lease: not held, renew is false and does not resurrect the key", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("expired")
      const handle = yield* acquired(name, "1 second")
      assert.isTrue(yield* lease.isHeld(handle))
      yield* wait(Duration.millis(1_200))
      assert.isFalse(yield* lease.isHeld(handle))
      assert.isFalse(yield* lease.renew(handle))
      assert.isNull(yield* raw.get(leaseKey(name)))
      assert.isFalse(yield* lease.release(handle))
    }))

  it.effect("after someone else took the lease: renew and release are false, the new holder keeps its key", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("stale")
      const stale = yield* acquired(name, "1 second")
      yield* wait(Duration.millis(1_200))
      const fresh = yield* acquired(name, "10 seconds")
      assert.isAbove(fresh.epoch, stale.epoch)
      assert.isFalse(yield* lease.isHeld(stale))
      assert.isFalse(yield* lease.renew(stale))
      assert.isFalse(yield* lease.release(stale))
      assert.strictEqual(yield* raw.get(leaseKey(name)), fresh.token)
      assert.isAbove(yield* raw.pttl(leaseKey(name)), 8_000)
      assert.isTrue(yield* lease.isHeld(fresh))
      // The renewal of the stale holder did not shorten or extend the new holder's TTL to its own.
      assert.isTrue(yield* lease.renew(fresh))
    }))

  it.effect("release deletes the key only while it is ours; a second release is false", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("release")
      const handle = yield* acquired(name, "10 seconds")
      assert.isTrue(yield* lease.release(handle))
      assert.isNull(yield* raw.get(leaseKey(name)))
      assert.isFalse(yield* lease.isHeld(handle))
      assert.isFalse(yield* lease.release(handle))
      // A foreign value under the key (e.g. a GitLab process) survives our release.
      yield* raw.set(leaseKey(name), "someone-else", 30)
      assert.isFalse(yield* lease.release(handle))
      assert.strictEqual(yield* raw.get(leaseKey(name)), "someone-else")
      yield* raw.del(leaseKey(name))
      assert.isTrue(Option.isSome(yield* lease.tryAcquire(name, Duration.seconds(1))))
    }))

  it.effect("isHeld compares the token, not just the key's existence", () =>
    Effect.gen(function*() {
      const lease = yield* Lease
      const raw = yield* RawKeys
      const name = uniqueName("isheld")
      const handle = yield* acquired(name, "10 seconds")
      assert.isTrue(yield* lease.isHeld(handle))
      const forged: LeaseHandle = { ...handle, token: randomUUID() }
      assert.isFalse(yield* lease.isHeld(forged))
      assert.isFalse(yield* lease.renew(forged))
      assert.isFalse(yield* lease.release(forged))
      assert.strictEqual(yield* raw.get(leaseKey(name)), handle.token)
    }))
}

const MemoryLease = Layer.mergeAll(LeaseMemory, RawMemory).pipe(Layer.provideMerge(MemoryRedis.layer))
const RedisLease = (topology: RedisTopology) =>
  Layer.mergeAll(LeaseRedis, RawRedis).pipe(Layer.provideMerge(RedisTopologyTest(topology)))

describe("Lease contract", () => {
  // layer() builds MemoryRedis under the suite's TestClock, so adjusting it expires keys.
  layer(MemoryLease)("LeaseMemory (MemoryRedis, TestClock)", (it) => {
    leaseContract(it, { wait: (duration) => TestClock.adjust(duration) })
  })

  for (const topology of topologies) {
    layer(RedisLease(topology), { excludeTestServices: true, timeout: "180 seconds" })(
      `LeaseRedis (real Redis, ${topology})`,
      (it) => {
        leaseContract(it, { wait: (duration) => Effect.sleep(duration) })
        if (topology === "cluster") {
          it.effect("CLUSTER KEYSLOT: every lease key and its epoch key share a slot (Sweeper's names, braces)", () =>
            Effect.gen(function*() {
              const { client } = yield* SharedStateRedis
              const names = [
                "sweeper/delete_stale_direct_uploads",
                "ci/stuck_builds/drop_canceling_worker",
                "sweeper/reschedule_stuck_issue_rebalances",
                "sweeper/concurrency_limit_resume/concurrency_limit/resume_worker",
                "a{tag}b",
                "a{b",
                "{",
                uniqueName("random")
              ]
              for (const name of names) {
                const slot = (key: string) => Effect.promise(() => client.cluster("KEYSLOT", key) as Promise<number>)
                assert.strictEqual(yield* slot(epochKey(name)), yield* slot(leaseKey(name)), name)
                // And the script runs (a CROSSSLOT error would fail here).
                yield* acquired(name, "1 second")
              }
            }))
        }
      }
    )
  }
})
