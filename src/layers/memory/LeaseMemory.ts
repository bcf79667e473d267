/** Lease over the in-memory Redis, same keys and semantics as LeaseRedis. */
import { Effect, Layer, Option } from "effect"
import { randomUUID } from "node:crypto"
import { epochKey, Lease, leaseKey, type LeaseHandle } from "../../services/Lease.ts"
import { ttlSeconds } from "../LeaseRedis.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const LeaseMemory = Layer.effect(
  Lease,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    const ours = (handle: LeaseHandle) => store.get(leaseKey(handle.name)) === handle.token
    return Lease.of({
      tryAcquire: (name, ttl) =>
        Effect.sync(() => {
          const token = randomUUID()
          if (!store.set(leaseKey(name), token, { nx: true, exSeconds: ttlSeconds(ttl) })) return Option.none()
          return Option.some<LeaseHandle>({ name, token, epoch: store.incrBy(epochKey(name), 1), ttl })
        }),
      renew: (handle) => Effect.sync(() => ours(handle) && store.expire(leaseKey(handle.name), ttlSeconds(handle.ttl))),
      release: (handle) => Effect.sync(() => ours(handle) && store.del(leaseKey(handle.name)) === 1),
      isHeld: (handle) => Effect.sync(() => ours(handle))
    })
  })
)
