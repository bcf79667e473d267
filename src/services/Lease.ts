/**
 * GitLab's exclusive lease (SPEC §0.2): `gitlab:exclusive_lease:<name>` set NX EX to a uuid. Renew
 * and release only touch the key while it still holds our uuid. Each successful acquisition takes a
 * new fencing epoch (monotonic per name), which guarded writes compare so a holder that lost its
 * lease cannot write after a newer holder has.
 */
import { Context, type Duration, type Effect, type Option } from "effect"
import type { RedisError } from "../domain/Errors.ts"

export interface LeaseHandle {
  readonly name: string
  readonly token: string
  readonly epoch: number
  readonly ttl: Duration.Duration
}

export const leaseKey = (name: string) => `gitlab:exclusive_lease:${name}`
export const epochKey = (name: string) => `sweeper:exclusive_lease_epoch:${name}`

export class Lease extends Context.Service<Lease, {
  /** None when somebody else holds it: an outcome, not an error. */
  tryAcquire(name: string, ttl: Duration.Duration): Effect.Effect<Option.Option<LeaseHandle>, RedisError>
  /** Extends the TTL; false when the lease is no longer ours. */
  renew(handle: LeaseHandle): Effect.Effect<boolean, RedisError>
  /** Deletes the key if it is still ours; false otherwise. */
  release(handle: LeaseHandle): Effect.Effect<boolean, RedisError>
  isHeld(handle: LeaseHandle): Effect.Effect<boolean, RedisError>
}>()("sweeper/services/Lease") {}
