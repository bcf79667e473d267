/** Lease over the in-memory Redis, same keys and semantics as LeaseRedis. */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { randomUUID } from "node:crypto"
import { EPOCH_TTL_SECONDS, epochKey, leaseKey } from "../../domain/Lease.ts"
import { Lease, type LeaseHandle } from "../../services/Lease.ts"
import { ttlSeconds } from "../redis/LeaseRedis.ts"
import { MemoryRedis } from "./MemoryRedis.ts"

export const LeaseMemory = Layer.effect(
  Lease,
  Effect.gen(function*() {
    const store = yield* MemoryRedis
    const ours = (handle: LeaseHandle) => store.get(leaseKey(handle.name)) === handle.token
    return Lease.of({
      tryAcquire: (name, ttl) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Effect.sync(() => {
            const token = randomUUID()
            const key = epochKey(name)
            if (!store.set(leaseKey(name), token, { nx: true, exSeconds: ttlSeconds(ttl) })) return Option.none()
            // max(stored + 1, now in ms) with a refreshed TTL, as LeaseRedis's script.
            const epoch = Math.max(Number(store.get(key) ?? "0") + 1, now)
            store.set(key, String(epoch), { exSeconds: EPOCH_TTL_SECONDS })
            return Option.some<LeaseHandle>({ name, token, epoch, ttl })
          })),
      claim: (name, ttl) =>
        Effect.sync(() => store.set(leaseKey(name), randomUUID(), { nx: true, exSeconds: ttlSeconds(ttl) })),
      renew: (handle) => Effect.sync(() => ours(handle) && store.expire(leaseKey(handle.name), ttlSeconds(handle.ttl))),
      release: (handle) => Effect.sync(() => ours(handle) && store.del(leaseKey(handle.name)) === 1),
      isHeld: (handle) => Effect.sync(() => ours(handle))
    })
  })
)
