/**
 * ConcurrencyLimits on real Redis, each key in its GitLab store: deferred and dead lists
 * and move journals in SharedState, trackers and reserved slots in QueuesMetadata, Sidekiq's queues
 * and work hashes in Queues. Reads are plain commands (SCAN with MATCH/COUNT, never KEYS); every
 * compare-and-act step is a Lua script over keys of ONE store and ONE cluster slot, and no step
 * relies on atomicity with another — the move protocol (docs/architecture.md, "Resume across stores") makes the
 * sequence safe wherever the process dies:
 *
 * - BEGIN_MOVE (SharedState, slot `{w}`): if no journal is pending and the deferred list still starts
 *   with exactly the bytes we read and decided on, LTRIM them off, RPUSH the unparsable ones to the
 *   dead list (byte for byte: Lua holds the raw elements; its TTL refreshed) and write the journal — header (with
 *   the dead count) and jobs; a header alone when all were unparsable, so their record survives a crash — with its
 *   TTL. Jobs that GitLab RPUSHes to the tail meanwhile are not part of the head, so they stay.
 * - RESERVE (QueuesMetadata, one key): INCRBY pending_resumed and reset its TTL.
 * - PUSH (Queues, slot of `queue:<q>`: the marker carries its hash tag): SET marker NX, and only if
 *   it was not there LPUSH the jobs, so a replay never pushes a batch twice.
 * - END_MOVE (SharedState): delete the journal only while it is still our batch's.
 * (Jobs are built in TypeScript from Schema-decoded elements, not with cjson inside Redis: cjson
 * turns `[]` into `{}` and rounds numbers to 14 digits, which would corrupt args.)
 * - HDEL_IF_EQUALS removes a stale tracker only if it still holds the start time we judged stale;
 *   field and value are read (HSCAN) and given back as the exact bytes, so a tracker holding bytes
 *   that are not UTF-8 is compared and removed like any other.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { Cluster } from "ioredis"
import { SweeperConfig } from "../../config/Config.ts"
import { processWorkKey } from "../../domain/ConcurrencyLimit.ts"
import { queueKey, QUEUES_SET } from "../../domain/Sidekiq.ts"
import { ConcurrencyLimits } from "../../services/ConcurrencyLimits.ts"
import {
  type BeginMove,
  type BeginOutcome,
  type ConcurrencyLimitStore,
  makeConcurrencyLimits
} from "../protocols/ConcurrencyLimitsShared.ts"
import { QueuesMetadataRedis, QueuesRedis, type Redis, type RedisClient, SharedStateRedis } from "./Redis.ts"

/**
 * The scripts push their elements with variadic RPUSH/LPUSH, this many per call (LPUSH k a b c is
 * LPUSH k a, LPUSH k b, LPUSH k c: the same list), not one redis.call per element (the
 * scripts' server time for 100,000 jobs went from 0.83–0.85 s to 0.57–0.76 s, Redis SLOWLOG). Lua's
 * unpack takes at most ~8000 values, so larger moves go in chunks.
 */
const PUSH_CHUNK = 1000

// KEYS: deferred list, journal, dead list
// ARGV: journal TTL seconds, journal header, n, dead-list TTL seconds, expected[1..n], payload[1..n] ('' = dead)
// Returns 1 moved, 0 head changed, -1 a journal is pending.
export const BEGIN_MOVE = `
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local n = tonumber(ARGV[3])
local head = redis.call('LRANGE', KEYS[1], 0, n - 1)
if #head ~= n then return 0 end
for i = 1, n do
  if head[i] ~= ARGV[4 + i] then return 0 end
end
redis.call('LTRIM', KEYS[1], n, -1)
local jobs, dead = { ARGV[2] }, {}
for i = 1, n do
  local payload = ARGV[4 + n + i]
  if payload == '' then dead[#dead + 1] = head[i] else jobs[#jobs + 1] = payload end
end
for i = 1, #jobs, ${PUSH_CHUNK} do
  redis.call('RPUSH', KEYS[2], unpack(jobs, i, math.min(i + ${PUSH_CHUNK - 1}, #jobs)))
end
redis.call('EXPIRE', KEYS[2], ARGV[1])
if #dead > 0 then
  for i = 1, #dead, ${PUSH_CHUNK} do
    redis.call('RPUSH', KEYS[3], unpack(dead, i, math.min(i + ${PUSH_CHUNK - 1}, #dead)))
  end
  redis.call('EXPIRE', KEYS[3], ARGV[4])
end
return 1`

// KEYS: pending_resumed. ARGV: count, TTL seconds
export const RESERVE = `
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1`

// KEYS: queue:<queue>, batch marker (same slot). ARGV: marker TTL seconds, payload[1..n]
export const PUSH = `
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then return 0 end
for i = 2, #ARGV, ${PUSH_CHUNK} do
  redis.call('LPUSH', KEYS[1], unpack(ARGV, i, math.min(i + ${PUSH_CHUNK - 1}, #ARGV)))
end
return 1`

// KEYS: journal. ARGV: header
export const END_MOVE = `
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`

// KEYS: journal, dead list. ARGV: header, dead-list TTL seconds
export const BURY_JOURNAL = `
if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return 0 end
local all = redis.call('LRANGE', KEYS[1], 0, -1)
for i = 1, #all do redis.call('RPUSH', KEYS[2], all[i]) end
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
return 1`

export const HDEL_IF_EQUALS = `
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0`

/**
 * SCAN over the whole keyspace: on a single server, SCAN itself; on a cluster each master holds its
 * own slots, so the masters are scanned one after the other under a composite cursor
 * `<master index>:<that master's cursor>` ("0" = start, and done).
 */
const scanAll = async (
  client: RedisClient,
  cursor: string,
  match: string,
  count: number
): Promise<readonly [string, Array<string>]> => {
  if (!(client instanceof Cluster)) return client.scan(cursor, "MATCH", match, "COUNT", count)
  const masters = client.nodes("master").toSorted((a, b) =>
    `${a.options.host}:${a.options.port}`.localeCompare(`${b.options.host}:${b.options.port}`)
  )
  const [index, nodeCursor] = cursor === "0" ? [0, "0"] : [Number(cursor.split(":")[0]), cursor.split(":")[1] ?? "0"]
  const node = masters[index]
  if (node === undefined) return ["0", []]
  const [next, keys] = await node.scan(nodeCursor, "MATCH", match, "COUNT", count)
  if (next !== "0") return [`${index}:${next}`, keys]
  return [index + 1 < masters.length ? `${index + 1}:0` : "0", keys]
}

/** The very bytes as a Buffer (ioredis sends a Buffer argument as is, a string as UTF-8). */
const exactly = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)

const BEGIN_OUTCOMES: Record<number, BeginOutcome> = { 1: "moved", 0: "changed", [-1]: "busy" }

/** The connections of the three GitLab stores (one and the same on a single server). */
export interface ConcurrencyLimitStores {
  readonly sharedState: Redis["Service"]
  readonly queues: Redis["Service"]
  readonly queuesMetadata: Redis["Service"]
}

/** The primitives over ioredis connections (exported for the contract suite's fault injection). */
export const makeRedisStore = (
  { queues, queuesMetadata, sharedState }: ConcurrencyLimitStores
): ConcurrencyLimitStore => ({
  scan: (cursor, match, count) =>
    sharedState.use("concurrency_limit.scan", (client) => scanAll(client, cursor, match, count)),
  llen: (key) => sharedState.use("concurrency_limit.llen", (client) => client.llen(key)),
  lrange: (key, start, stop) =>
    sharedState.use("concurrency_limit.lrange", (client) => client.lrangeBuffer(key, start, stop)),
  beginMove: (move: BeginMove) =>
    Effect.map(
      sharedState.use("concurrency_limit.begin_move", (client) =>
        client.eval(
          BEGIN_MOVE,
          3,
          move.keys.deferred,
          move.keys.journal,
          move.keys.dead,
          move.journalTtlSeconds,
          move.header,
          move.expected.length,
          move.deadTtlSeconds,
          ...move.expected.map((bytes) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)),
          ...move.payloads.map((payload) => payload ?? "")
        ) as Promise<number>),
      (reply) => BEGIN_OUTCOMES[reply] ?? "changed"
    ),
  endMove: (journalKey, header) =>
    Effect.map(
      sharedState.use("concurrency_limit.end_move", (client) =>
        client.eval(END_MOVE, 1, journalKey, Buffer.from(header)) as Promise<number>),
      (n) =>
        n === 1
    ),
  buryJournal: (journalKey, deadKey, header, deadTtlSeconds) =>
    Effect.map(
      sharedState.use("concurrency_limit.bury_journal", (client) =>
        client.eval(BURY_JOURNAL, 2, journalKey, deadKey, Buffer.from(header), deadTtlSeconds) as Promise<number>),
      (n) =>
        n === 1
    ),
  get: (key) => queuesMetadata.use("concurrency_limit.get", (client) => client.get(key)),
  hlen: (key) => queuesMetadata.use("concurrency_limit.hlen", (client) => client.hlen(key)),
  hscan: (key, cursor, count) =>
    Effect.map(
      queuesMetadata.use("concurrency_limit.hscan", (client) => client.hscanBuffer(key, cursor, "COUNT", count)),
      ([next, flat]) => {
        const entries: Array<readonly [Uint8Array, Uint8Array]> = []
        for (let i = 0; i + 1 < flat.length; i += 2) entries.push([flat[i]!, flat[i + 1]!])
        return [next.toString("latin1"), entries] as const
      }
    ),
  hdelIfEquals: (key, field, value) =>
    Effect.map(
      queuesMetadata.use("concurrency_limit.hdel_if_equals", (client) =>
        client.eval(HDEL_IF_EQUALS, 1, key, exactly(field), exactly(value)) as Promise<number>),
      (n) =>
        n === 1
    ),
  reserve: (key, count, ttlSeconds) =>
    Effect.asVoid(
      queuesMetadata.use("concurrency_limit.reserve", (client) => client.eval(RESERVE, 1, key, count, ttlSeconds))
    ),
  processWork: (pid, tid) =>
    queues.use("concurrency_limit.process_work", (client) => client.hget(processWorkKey(pid), tid)),
  registerQueue: (queue) =>
    Effect.asVoid(queues.use("concurrency_limit.register_queue", (client) => client.sadd(QUEUES_SET, queue))),
  push: (queue, marker, payloads, ttlSeconds) =>
    Effect.map(
      queues.use("concurrency_limit.push", (client) =>
        client.eval(PUSH, 2, queueKey(queue), marker, ttlSeconds, ...payloads) as Promise<number>),
      (n) =>
        n === 1
    ),
  forgetMarker: (marker) => Effect.asVoid(queues.use("concurrency_limit.forget_marker", (client) => client.del(marker)))
})

export const ConcurrencyLimitsRedis = Layer.effect(
  ConcurrencyLimits,
  Effect.gen(function*() {
    const { concurrencyLimits } = yield* SweeperConfig
    const store = makeRedisStore({
      sharedState: yield* SharedStateRedis,
      queues: yield* QueuesRedis,
      queuesMetadata: yield* QueuesMetadataRedis
    })
    return makeConcurrencyLimits(store, concurrencyLimits)
  })
)
