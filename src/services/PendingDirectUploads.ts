/**
 * GitLab's `pending_direct_uploads` Redis hash. Entries come back raw: the exact bytes of
 * field and value, never decoded here (a lossy decode would name a different object); `parseEntry`
 * in the domain decides what they mean. The scan never loads the whole hash: it is HSCAN
 * with a COUNT hint, one page per round trip, pulled only as fast as the consumer handles entries.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type * as Stream from "effect/Stream"
import type { RawPendingEntry } from "../domain/DirectUpload.ts"
import type { RedisError } from "../domain/Errors.ts"

export class PendingDirectUploads extends Context.Service<PendingDirectUploads, {
  /** HLEN. */
  readonly count: Effect.Effect<number, RedisError>
  /**
   * HSCAN from cursor 0 until the cursor returns to 0, `pageSize` (COUNT hint) per round trip. As
   * with Redis, an entry present for the whole scan is emitted at least once (possibly more), also
   * while entries are removed during the scan.
   */
  scan(options?: { readonly pageSize?: number }): Stream.Stream<RawPendingEntry, RedisError>
  /** HEXISTS of exactly these bytes (as `scan` returned them); true when the field is there. */
  exists(field: Uint8Array): Effect.Effect<boolean, RedisError>
  /**
   * HMGET of exactly these bytes: each field's current value (null when gone), in the order given.
   * One round trip for a page.
   */
  values(fields: ReadonlyArray<Uint8Array>): Effect.Effect<ReadonlyArray<Uint8Array | null>, RedisError>
  /**
   * Compare-and-delete, one round trip (one script on the one hash, so one slot): each field is
   * HDELed only when its current value is byte for byte the value given (the value it was read
   * with). A field changed since it was read (re-registered) or already gone stays as it is.
   * Returns, in the order given, whether each field was removed.
   */
  removeUnchanged(entries: ReadonlyArray<RawPendingEntry>): Effect.Effect<ReadonlyArray<boolean>, RedisError>
  /** HDEL of exactly these bytes (as `scan` returned them); true when the field was there. */
  remove(field: Uint8Array): Effect.Effect<boolean, RedisError>
}>()("sweeper/services/PendingDirectUploads") {}
