/**
 * A small in-process Redis: the data types and commands Sweeper's services use, with key expiry read
 * from the effect `Clock` (so `TestClock` expires keys). The memory implementations of the
 * Redis-backed services keep their state here under GitLab's key formats, which lets tests and the
 * simulator seed both backends the same way. Single-threaded JS makes every method atomic, which is
 * what the Lua scripts give the real implementations.
 *
 * Hash fields and values and set members are bytes, as in Redis: a string given to a method is
 * stored as its UTF-8 bytes (what ioredis sends), string-returning methods decode them as ioredis does
 * (lossily), and the `…Buffer` methods return the exact bytes, like ioredis's `hscanBuffer`.
 */
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"

type Value =
  | { readonly type: "string"; value: string }
  | { readonly type: "hash"; readonly value: Map<string, string> }
  | { readonly type: "list"; value: Array<Buffer> }
  | { readonly type: "set"; readonly value: Set<string> }

interface Entry {
  readonly data: Value
  expiresAt: number | undefined
}

/** A byte string as Redis stores it: a string (sent as UTF-8, like ioredis does) or raw bytes. */
export type Bytes = string | Uint8Array

/**
 * Bytes kept as a "binary" JS string, one char (0–255) per byte, so Map and Set compare exact bytes
 * while staying cheap to copy and to use as keys.
 */
const toBinary = (value: Bytes): string =>
  (typeof value === "string"
    ? Buffer.from(value, "utf8")
    : Buffer.from(value.buffer, value.byteOffset, value.byteLength)).toString("latin1")
const toBuffer = (binary: string): Buffer => Buffer.from(binary, "latin1")
/** What ioredis hands back for a reply it decodes: UTF-8 with U+FFFD for invalid bytes. */
const toText = (binary: string): string => toBuffer(binary).toString("utf8")

const globToRegExp = (pattern: string) =>
  new RegExp(`^${pattern.replace(/[.+^${}()|\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".")}$`)

const toBytes = (value: string | Uint8Array): Buffer =>
  typeof value === "string" ? Buffer.from(value, "utf8") : Buffer.from(value)

export class MemoryRedisStore {
  private readonly entries = new Map<string, Entry>()
  private readonly now: () => number

  constructor(now: () => number) {
    this.now = now
  }

  private live(key: string): Entry | undefined {
    const entry = this.entries.get(key)
    if (entry === undefined) return undefined
    if (entry.expiresAt !== undefined && entry.expiresAt <= this.now()) {
      this.entries.delete(key)
      return undefined
    }
    return entry
  }

  private typed<T extends Value["type"]>(key: string, type: T): Extract<Value, { type: T }> | undefined {
    const entry = this.live(key)
    if (entry === undefined) return undefined
    if (entry.data.type !== type) throw new Error(`WRONGTYPE ${key} holds a ${entry.data.type}, not a ${type}`)
    return entry.data as Extract<Value, { type: T }>
  }

  private create<T extends Value>(key: string, data: T): T {
    this.added()
    this.entries.set(key, { data, expiresAt: undefined })
    return data
  }

  /** Keys added since the last eviction of expired ones, and how many more start the next one. */
  private addedSinceEviction = 0
  private evictionAfter = 64

  /**
   * Expired keys are evicted here too, not only when read: a key that is never read again (a tick's
   * lease, a finished job's marker) would otherwise stay for the life of the process, as it would in
   * a Redis without active expiry. One walk per as many additions as the store holds keeps the cost
   * constant per addition and the expired keys held at most about as many as the live ones.
   */
  private added() {
    if (++this.addedSinceEviction < this.evictionAfter) return
    const now = this.now()
    for (const [key, entry] of this.entries) {
      if (entry.expiresAt !== undefined && entry.expiresAt <= now) this.entries.delete(key)
    }
    this.addedSinceEviction = 0
    this.evictionAfter = Math.max(this.entries.size, 64)
  }

  private dropIfEmpty(key: string, size: number) {
    if (size === 0) this.entries.delete(key)
  }

  exists(key: string): boolean {
    return this.live(key) !== undefined
  }

  del(...keys: ReadonlyArray<string>): number {
    let n = 0
    for (const key of keys) if (this.live(key) !== undefined && this.entries.delete(key)) n++
    return n
  }

  keys(pattern: string): Array<string> {
    const re = globToRegExp(pattern)
    return [...this.entries.keys()].filter((key) => re.test(key) && this.live(key) !== undefined)
  }

  /**
   * Scan order of keys: a sequence number per key name, given the first time a SCAN sees it and
   * kept while the key exists (each SCAN carries over the positions of the keys it finds).
   */
  private keyScanOrder = new Map<string, number>()
  private keyScanSeq = 0

  /**
   * SCAN cursor MATCH pattern COUNT count. As in Redis, COUNT bounds the keys walked per call and
   * MATCH filters them afterwards (a page may be empty while the cursor is not 0); the cursor is the
   * scan sequence number of the last key walked, so a key present for the whole scan is returned at
   * least once whatever is added or deleted meanwhile.
   */
  scan(cursor: string, pattern: string, count: number): [string, Array<string>] {
    const re = globToRegExp(pattern)
    const order = new Map<string, number>()
    for (const key of Array.from(this.entries.keys())) {
      if (this.live(key) === undefined) continue
      order.set(key, this.keyScanOrder.get(key) ?? ++this.keyScanSeq)
    }
    this.keyScanOrder = order
    const after = Number(cursor)
    const remaining = [...order].filter(([, seq]) => seq > after).sort((a, b) => a[1] - b[1])
    const page = remaining.slice(0, count)
    const next = remaining.length <= count ? "0" : String(page[page.length - 1]![1])
    return [next, page.map(([key]) => key).filter((key) => re.test(key))]
  }

  expire(key: string, seconds: number): boolean {
    const entry = this.live(key)
    if (entry === undefined) return false
    entry.expiresAt = this.now() + seconds * 1000
    return true
  }

  /** Remaining TTL in ms: -2 missing, -1 no expiry (as PTTL). */
  pttl(key: string): number {
    const entry = this.live(key)
    if (entry === undefined) return -2
    return entry.expiresAt === undefined ? -1 : entry.expiresAt - this.now()
  }

  // strings
  get(key: string): string | null {
    return this.typed(key, "string")?.value ?? null
  }

  set(key: string, value: string, options: { readonly exSeconds?: number; readonly nx?: boolean } = {}): boolean {
    if (options.nx === true && this.live(key) !== undefined) return false
    this.added()
    this.entries.set(key, {
      data: { type: "string", value },
      expiresAt: options.exSeconds === undefined ? undefined : this.now() + options.exSeconds * 1000
    })
    return true
  }

  incrBy(key: string, by: number): number {
    const current = this.typed(key, "string")
    const next = Number(current?.value ?? "0") + by
    if (current === undefined) this.create(key, { type: "string", value: String(next) })
    else current.value = String(next)
    return next
  }

  // hashes (fields and values as binary strings, see toBinary)
  hset(key: string, fields: Record<string, string> | Iterable<readonly [Bytes, Bytes]>): number {
    const hash = this.typed(key, "hash") ?? this.create(key, { type: "hash", value: new Map() })
    const pairs: Iterable<readonly [Bytes, Bytes]> = Symbol.iterator in fields ? fields : Object.entries(fields)
    let added = 0
    for (const [field, value] of pairs) {
      const binary = toBinary(field)
      if (!hash.value.has(binary)) added++
      hash.value.set(binary, toBinary(value))
    }
    return added
  }

  hget(key: string, field: Bytes): string | null {
    const value = this.typed(key, "hash")?.value.get(toBinary(field))
    return value === undefined ? null : toText(value)
  }

  /** HGET returning the exact bytes. */
  hgetBuffer(key: string, field: Bytes): Buffer | null {
    const value = this.typed(key, "hash")?.value.get(toBinary(field))
    return value === undefined ? null : toBuffer(value)
  }

  hdel(key: string, ...fields: ReadonlyArray<Bytes>): number {
    const hash = this.typed(key, "hash")
    if (hash === undefined) return 0
    let n = 0
    for (const field of fields) if (hash.value.delete(toBinary(field))) n++
    this.dropIfEmpty(key, hash.value.size)
    return n
  }

  hlen(key: string): number {
    return this.typed(key, "hash")?.value.size ?? 0
  }

  /** Decoded as ioredis's HGETALL does (fields that decode alike collapse, as they do there). */
  hgetall(key: string): Record<string, string> {
    return Object.fromEntries(
      [...(this.typed(key, "hash")?.value ?? [])].map(([field, value]) => [toText(field), toText(value)])
    )
  }

  /** The exact bytes of every field and value. */
  hgetallBuffer(key: string): Array<[Buffer, Buffer]> {
    return [...(this.typed(key, "hash")?.value ?? [])].map(([field, value]) => [toBuffer(field), toBuffer(value)])
  }

  /** Scan order of hash fields: a sequence number per field, given the first time a scan sees it. */
  private readonly scanOrder = new WeakMap<Map<string, string>, Map<string, number>>()
  private scanSeq = 0

  /**
   * HSCAN. The cursor is the scan sequence number of the last field returned, so it survives any
   * field being deleted meanwhile, the last one returned included (a scan that deletes what it
   * reads, like delete-stale-direct-uploads). Like Redis, an entry present for the whole scan is
   * returned at least once; one added meanwhile may or may not be.
   */
  hscanBuffer(key: string, cursor: string, count: number): [string, Array<[Buffer, Buffer]>] {
    const hash = this.typed(key, "hash")
    if (hash === undefined) return ["0", []]
    const previous = this.scanOrder.get(hash.value) ?? new Map<string, number>()
    const order = new Map<string, number>()
    for (const field of hash.value.keys()) order.set(field, previous.get(field) ?? ++this.scanSeq)
    this.scanOrder.set(hash.value, order)
    const after = Number(cursor)
    const remaining = [...order].filter(([, seq]) => seq > after).sort((a, b) => a[1] - b[1])
    const page = remaining.slice(0, count)
    const next = remaining.length <= count ? "0" : String(page[page.length - 1]![1])
    return [next, page.map(([field]) => [toBuffer(field), toBuffer(hash.value.get(field)!)])]
  }

  /** HSCAN decoded as ioredis's `hscan` does. */
  hscan(key: string, cursor: string, count: number): [string, Array<[string, string]>] {
    const [next, page] = this.hscanBuffer(key, cursor, count)
    return [next, page.map(([field, value]) => [field.toString("utf8"), value.toString("utf8")])]
  }

  // lists: elements are bytes, as in Redis (a string is stored as its UTF-8 encoding; `lrange`
  // decodes like ioredis does, `lrangeBuffer` gives the exact bytes)
  rpush(key: string, ...values: ReadonlyArray<string | Uint8Array>): number {
    const list = this.typed(key, "list") ?? this.create(key, { type: "list", value: [] })
    list.value.push(...values.map(toBytes))
    return list.value.length
  }

  lpush(key: string, ...values: ReadonlyArray<string | Uint8Array>): number {
    const list = this.typed(key, "list") ?? this.create(key, { type: "list", value: [] })
    for (const value of values) list.value.unshift(toBytes(value))
    return list.value.length
  }

  lpop(key: string, count: number): Array<string> {
    const list = this.typed(key, "list")
    if (list === undefined) return []
    const popped = list.value.splice(0, count)
    this.dropIfEmpty(key, list.value.length)
    return popped.map((bytes) => bytes.toString("utf8"))
  }

  /** RPOP: Sidekiq pushes at the head (LPUSH) and its fetcher takes from the tail (the simulator's consumer). */
  rpop(key: string): string | null {
    const list = this.typed(key, "list")
    if (list === undefined) return null
    const popped = list.value.pop()
    this.dropIfEmpty(key, list.value.length)
    return popped === undefined ? null : popped.toString("utf8")
  }

  lrangeBuffer(key: string, start: number, stop: number): Array<Buffer> {
    const list = this.typed(key, "list")?.value ?? []
    const end = stop < 0 ? list.length + stop + 1 : stop + 1
    return list.slice(start < 0 ? Math.max(list.length + start, 0) : start, end).map((bytes) => Buffer.from(bytes))
  }

  lrange(key: string, start: number, stop: number): Array<string> {
    return this.lrangeBuffer(key, start, stop).map((bytes) => bytes.toString("utf8"))
  }

  /** LTRIM with a non-negative start and stop -1 (keep from `start` on), the only form Sweeper uses. */
  ltrimFrom(key: string, start: number): void {
    const list = this.typed(key, "list")
    if (list === undefined) return
    list.value.splice(0, start)
    this.dropIfEmpty(key, list.value.length)
  }

  llen(key: string): number {
    return this.typed(key, "list")?.value.length ?? 0
  }

  // sets (members as binary strings, see toBinary)
  sadd(key: string, ...members: ReadonlyArray<Bytes>): number {
    const set = this.typed(key, "set") ?? this.create(key, { type: "set", value: new Set() })
    let added = 0
    for (const member of members) {
      const binary = toBinary(member)
      if (!set.value.has(binary)) added++
      set.value.add(binary)
    }
    return added
  }

  srem(key: string, ...members: ReadonlyArray<Bytes>): number {
    const set = this.typed(key, "set")
    if (set === undefined) return 0
    let n = 0
    for (const member of members) if (set.value.delete(toBinary(member))) n++
    this.dropIfEmpty(key, set.value.size)
    return n
  }

  /** Decoded as ioredis's SMEMBERS does. */
  smembers(key: string): Array<string> {
    return [...(this.typed(key, "set")?.value ?? [])].map(toText)
  }

  /** The exact bytes of every member. */
  smembersBuffer(key: string): Array<Buffer> {
    return [...(this.typed(key, "set")?.value ?? [])].map(toBuffer)
  }

  flushAll(): void {
    this.entries.clear()
  }

  /** What the store holds in memory: keys (expired ones not yet evicted included) and SCAN positions. */
  held(): { readonly keys: number; readonly scanPositions: number } {
    return { keys: this.entries.size, scanPositions: this.keyScanOrder.size }
  }
}

export class MemoryRedis extends Context.Service<MemoryRedis, MemoryRedisStore>()("sweeper/layers/memory/MemoryRedis") {
  /** A fresh store whose expiry follows the Clock of the context the layer is built in. */
  static readonly layer = Layer.effect(
    MemoryRedis,
    Effect.gen(function*() {
      const clock = yield* Clock.Clock
      return new MemoryRedisStore(() => clock.currentTimeMillisUnsafe())
    })
  )
}
