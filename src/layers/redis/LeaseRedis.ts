/** Lease on real Redis: acquisition, renewal and release are single Lua scripts (compare-and-act). */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { randomUUID } from "node:crypto"
import { EPOCH_TTL_SECONDS, epochKey, leaseKey } from "../../domain/Lease.ts"
import { Lease, type LeaseHandle } from "../../services/Lease.ts"
import { SharedStateRedis } from "./Redis.ts"

// SET NX EX exactly as GitLab's ExclusiveLease, plus a fencing epoch taken in the same step:
// max(stored + 1, TIME in ms), so it stays monotonic even after its key expired (see Lease.ts).
// Both keys share a hash slot (epochKey's tag). TIME before a write is fine: Redis 7 replicates
// a script's effects, not the script.
const ACQUIRE = `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  local time = redis.call('TIME')
  local floor = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local epoch = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1
  if floor > epoch then epoch = floor end
  redis.call('SET', KEYS[2], string.format('%d', epoch), 'EX', ARGV[3])
  return epoch
end
return 0`

const RENEW = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 0`

const RELEASE = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`

export const ttlSeconds = (ttl: Duration.Duration) => Math.max(1, Math.ceil(Duration.toSeconds(ttl)))

export const LeaseRedis = Layer.effect(
  Lease,
  Effect.gen(function*() {
    const redis = yield* SharedStateRedis
    const tryAcquire = Effect.fn("Lease.tryAcquire")(function*(name: string, ttl: Duration.Duration) {
      const token = randomUUID()
      const epochKeyOfName = epochKey(name)
      const epoch = yield* redis.use(
        "lease.acquire",
        (client) =>
          client.eval(ACQUIRE, 2, leaseKey(name), epochKeyOfName, token, ttlSeconds(ttl), EPOCH_TTL_SECONDS) as Promise<
            number
          >
      )
      return epoch > 0 ? Option.some<LeaseHandle>({ name, token, epoch, ttl }) : Option.none()
    })
    const renew = Effect.fn("Lease.renew")(function*(handle: LeaseHandle) {
      const renewed = yield* redis.use(
        "lease.renew",
        (client) =>
          client.eval(RENEW, 1, leaseKey(handle.name), handle.token, ttlSeconds(handle.ttl)) as Promise<number>
      )
      return renewed === 1
    })
    const release = Effect.fn("Lease.release")(function*(handle: LeaseHandle) {
      const released = yield* redis.use(
        "lease.release",
        (client) => client.eval(RELEASE, 1, leaseKey(handle.name), handle.token) as Promise<number>
      )
      return released === 1
    })
    const isHeld = Effect.fn("Lease.isHeld")(function*(handle: LeaseHandle) {
      return (yield* redis.use("lease.get", (client) => client.get(leaseKey(handle.name)))) === handle.token
    })
    const claim = Effect.fn("Lease.claim")(function*(name: string, ttl: Duration.Duration) {
      const set = yield* redis.use(
        "lease.claim",
        (client) => client.set(leaseKey(name), randomUUID(), "EX", ttlSeconds(ttl), "NX")
      )
      return set === "OK"
    })
    return Lease.of({ tryAcquire, renew, release, isHeld, claim })
  })
)
