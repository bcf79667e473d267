/**
 * Pending direct uploads, as GitLab's ObjectStorage::PendingDirectUpload keeps them: one
 * Redis hash, field `<location>:<path>`, value = the epoch second the upload was prepared. An entry
 * still there hours later belongs to an upload that never completed.
 */
import * as DateTime from "effect/DateTime"
import * as Duration from "effect/Duration"
import * as Option from "effect/Option"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import { decodeUtf8, escapeBytes } from "./Bytes.ts"

/** GitLab's `ObjectStorage::PendingDirectUpload::KEY`. */
export const PENDING_DIRECT_UPLOADS_KEY = "pending_direct_uploads"

/** GitLab's `MAX_UPLOAD_DURATION`: an upload prepared longer ago than this will not complete. */
export const STALE_AFTER = Duration.hours(3)

/** GitLab's `DeleteStaleDirectUploadsService::MAX_EXEC_DURATION`: the default run budget. */
export const MAX_EXEC_DURATION = Duration.seconds(250)

/**
 * HSCAN COUNT hint: fields fetched per round trip, and the largest step delete-stale-direct-uploads
 * repairs at once. Each step costs a fixed set of round trips (fence, HMGET, the events' INSERT and
 * its commit, the compare-and-delete script) however few stale entries it holds, so larger pages
 * amortise them (at 1000 a page these round trips, not Redis, bounded the run). A page
 * of 5000 fields is a few hundred kB, and the compare-and-delete script over its stale ones (1000
 * at 20 % stale) holds Redis for about a millisecond. S3's 1,000 keys per DeleteObjects request are
 * the store layer's concern (it splits).
 */
export const SCAN_PAGE_SIZE = 5000

/** The object-storage locations GitLab prepares direct uploads for (`ObjectStorage::Config` keys). */
export const LOCATIONS = [
  "artifacts",
  "external_diffs",
  "lfs",
  "uploads",
  "packages",
  "dependency_proxy",
  "terraform_state",
  "pages",
  "ci_secure_files"
] as const

export const Location = Schema.Literals(LOCATIONS)
export type Location = typeof Location.Type

/**
 * The hash value: non-negative decimal epoch seconds. Stricter than JavaScript's Number() on purpose
 * ("", " 1", "0x10" are not timestamps); GitLab's `to_i` would read garbage as 0, i.e. stale.
 */
export const EpochSeconds = Schema.String.check(Schema.isPattern(/^\d+(\.\d+)?$/)).pipe(
  Schema.decodeTo(Schema.FiniteFromString)
)

/** A hash entry as Redis returns it: untrusted bytes, never decoded on the way. */
export interface RawPendingEntry {
  readonly field: Uint8Array
  readonly value: Uint8Array
}

/** A well-formed pending upload. */
export interface PendingDirectUpload {
  /** The hash field's exact bytes: what HDEL must be given (never a re-encoding of `path`). */
  readonly field: Uint8Array
  readonly location: Location
  /** Everything after the first `:`, further colons included. */
  readonly path: string
  /** Epoch seconds. */
  readonly preparedAt: number
}

export type InvalidReason = "not_utf8" | "non_numeric_value" | "no_colon" | "unknown_location" | "empty_path"

/** An entry Sweeper will not act on (never deleted, only reported). */
export interface InvalidPendingEntry {
  /** The field for a log line: `escapeBytes` of its bytes. */
  readonly field: string
  /** The value for a log line: `escapeBytes` of its bytes. */
  readonly value: string
  readonly reason: InvalidReason
}

/**
 * `Location` and `EpochSeconds` as plain checks: a scan parses every entry of the hash, and the Schema
 * decoders' per-call machinery was most of `staleEntries`' time (2.2 ms for a page of 5000; a test
 * holds both to the schemas).
 */
const LOCATION_NAMES: ReadonlySet<string> = new Set(LOCATIONS)
export const decodeLocation = (text: string): Option.Option<Location> =>
  LOCATION_NAMES.has(text) ? Option.some(text as Location) : Option.none()
const EPOCH_SECONDS = /^\d+(\.\d+)?$/
export const decodeEpochSeconds = (text: string): Option.Option<number> => {
  if (!EPOCH_SECONDS.test(text)) return Option.none()
  const seconds = Number(text)
  return Number.isFinite(seconds) ? Option.some(seconds) : Option.none()
}

/**
 * Decodes field and value as strict UTF-8 (either one not UTF-8 ⇒ `not_utf8`), splits the field at
 * its FIRST `:` (GitLab's `split(':')` would drop anything after a second one, losing part of the
 * path) and decodes both halves and the value.
 */
export const parseEntry = (raw: RawPendingEntry): Result.Result<PendingDirectUpload, InvalidPendingEntry> => {
  const invalid = (reason: InvalidReason) =>
    Result.fail<InvalidPendingEntry>({ field: escapeBytes(raw.field), value: escapeBytes(raw.value), reason })
  const field = decodeUtf8(raw.field)
  const value = decodeUtf8(raw.value)
  if (Option.isNone(field) || Option.isNone(value)) return invalid("not_utf8")
  const colon = field.value.indexOf(":")
  if (colon === -1) return invalid("no_colon")
  const location = decodeLocation(field.value.slice(0, colon))
  if (Option.isNone(location)) return invalid("unknown_location")
  const path = field.value.slice(colon + 1)
  // `artifacts:` would name the location's root itself; never a file somebody uploaded.
  if (path.length === 0) return invalid("empty_path")
  const preparedAt = decodeEpochSeconds(value.value)
  if (Option.isNone(preparedAt)) return invalid("non_numeric_value")
  return Result.succeed({ field: raw.field, location: location.value, path, preparedAt: preparedAt.value })
}

/** The GitLab hash field for a location and path. */
export const fieldOf = (location: string, path: string) => `${location}:${path}`

/** The same field as the bytes GitLab writes (UTF-8). */
export const fieldBytesOf = (location: string, path: string): Uint8Array =>
  new TextEncoder().encode(fieldOf(location, path))

/** Prepared strictly before this instant ⇒ stale. */
export const staleCutoff = (now: DateTime.Utc): DateTime.Utc => DateTime.subtractDuration(now, STALE_AFTER)

/**
 * The staleness test for decisions made at `now`, the cutoff computed once (a run tests every
 * entry of the hash against the same instant; computing the cutoff per entry showed in profiles).
 */
export const staleAt = (now: DateTime.Utc): (upload: Pick<PendingDirectUpload, "preparedAt">) => boolean => {
  const cutoffMillis = DateTime.toEpochMillis(staleCutoff(now))
  return (upload) => upload.preparedAt * 1000 < cutoffMillis
}

/** A stale upload as parsed, with the exact value bytes read (the repair's compare-and-delete compares them). */
export type StaleUpload = PendingDirectUpload & { readonly value: Uint8Array }

/** A step's entries sorted: the stale ones to repair, the malformed ones to report (never acted on). */
export const staleEntries = (
  entries: ReadonlyArray<RawPendingEntry>,
  isStale: (upload: PendingDirectUpload) => boolean
): { readonly stale: ReadonlyArray<StaleUpload>; readonly invalid: ReadonlyArray<InvalidPendingEntry> } => {
  const stale: Array<StaleUpload> = []
  const invalid: Array<InvalidPendingEntry> = []
  for (const raw of entries) {
    const parsed = parseEntry(raw)
    if (Result.isFailure(parsed)) invalid.push(parsed.failure)
    else if (isStale(parsed.success)) stale.push({ ...parsed.success, value: raw.value })
  }
  return { stale, invalid }
}

/**
 * How much larger each step may be than the one before (the repair loop's `growingSteps`: 1, 8,
 * 64, 512, 4096, a page: five steps to full pages where doubling took thirteen).
 */
export const STEP_GROWTH = 8
/** How many bad entries / failed deletes the run's single log line for each quotes. */
export const LOG_SAMPLE_SIZE = 5

/**
 * What a run has met besides its repairs — malformed entries, failed deletes, locations without a
 * store — counted in full, the first LOG_SAMPLE_SIZE of the first two kept for the run's log lines.
 */
export class UploadsMet<F> {
  invalidEntries = 0
  failedDeletes = 0
  skippedNoStore = 0
  invalidSample: ReadonlyArray<InvalidPendingEntry> = []
  failedSample: ReadonlyArray<F> = []

  /** A step's entries sorted (`staleEntries`): the malformed ones counted, the stale ones returned. */
  sorted({ stale, invalid }: ReturnType<typeof staleEntries>): ReadonlyArray<StaleUpload> {
    this.invalidEntries += invalid.length
    this.invalidSample = [...this.invalidSample, ...invalid].slice(0, LOG_SAMPLE_SIZE)
    return stale
  }

  /**
   * A step's repair (`tallyOutcomes`): failures and store-less locations counted, the step's
   * summary counts returned.
   */
  repaired(step: StepTally<F>): { readonly totalDeletedStaleEntries: number; readonly vanished: number } {
    this.failedDeletes += step.failed.length
    this.skippedNoStore += step.skippedNoStore
    this.failedSample = [...this.failedSample, ...step.failed].slice(0, LOG_SAMPLE_SIZE)
    return { totalDeletedStaleEntries: step.deleted, vanished: step.vanished }
  }
}

/** The run's summary, with the time the health gate held it. */
export interface DeleteStaleDirectUploadsSummary {
  readonly totalPendingEntries: number
  readonly totalDeletedStaleEntries: number
  readonly executionTimeout: boolean
  readonly invalidEntries: number
  readonly failedDeletes: number
  /** Stale entries of a location with no object store configured: field removed, no object deleted. */
  readonly skippedNoStore: number
  /** Stale entries gone or re-registered before their step compared them: their objects left alone. */
  readonly vanished: number
  readonly heldMs: number
  readonly heldBy: ReadonlyArray<string>
}

/** A warning a run logs once, with its fields. */
export interface RunWarning {
  readonly message: string
  readonly fields: Readonly<Record<string, unknown>>
}

/**
 * The run's closing warnings: the malformed entries and the objects that could not be deleted,
 * each counted in full with a sample (the storage's error message for a failed delete).
 */
export const runWarnings = <F extends { readonly location: string; readonly path: string; readonly message: string }>(
  met: UploadsMet<F>
): ReadonlyArray<RunWarning> => [
  ...(met.invalidEntries > 0
    ? [{
      message: "Skipped malformed pending direct upload entries",
      fields: { invalid_entries: met.invalidEntries, sample: invalidSampleForLog(met.invalidSample) }
    }]
    : []),
  ...(met.failedDeletes > 0
    ? [{
      message: "Could not delete stale direct upload objects; their entries are kept",
      fields: {
        failed_deletes: met.failedDeletes,
        sample: met.failedSample.map(({ location, path, message }) => ({ location, path, message }))
      }
    }]
    : [])
]

/** The summary as the run's closing log line annotates it. */
export const summaryLogFields = (summary: DeleteStaleDirectUploadsSummary, dryRun: boolean) => ({
  total_pending_entries: summary.totalPendingEntries,
  total_deleted_stale_entries: summary.totalDeletedStaleEntries,
  execution_timeout: summary.executionTimeout,
  invalid_entries: summary.invalidEntries,
  failed_deletes: summary.failedDeletes,
  skipped_no_store: summary.skippedNoStore,
  vanished: summary.vanished,
  dry_run: dryRun
})

/** Untrusted strings quoted in a log line are cut to this length. */
const clip = (text: string) => (text.length > 200 ? `${text.slice(0, 200)}…` : text)

/** The malformed entries as the run's warning quotes them (each string clipped). */
export const invalidSampleForLog = (sample: ReadonlyArray<InvalidPendingEntry>) =>
  sample.map(({ field, value, reason }) => ({ field: clip(field), value: clip(value), reason }))

/** `preparedAt < now − 3 h` (strict: exactly 3 h old is not stale yet). */
export const isStale = (upload: Pick<PendingDirectUpload, "preparedAt">, now: DateTime.Utc): boolean =>
  staleAt(now)(upload)

/**
 * What became of one stale upload in a repair step: its object `deleted` or already `missing`
 * (both count as deleted), its location `unconfigured` (no store: only the field goes), `vanished`
 * (the field was gone or held another value when its step compared it, before touching its
 * object: not ours to delete, record or remove), or its object could not be deleted (`failed`,
 * the storage's error).
 */
export type StaleUploadOutcome<F> = "deleted" | "missing" | "unconfigured" | "vanished" | { readonly failed: F }

/** A step's outcomes as the run's summary counts them. */
export interface StepTally<F> {
  readonly deleted: number
  readonly skippedNoStore: number
  readonly vanished: number
  readonly failed: ReadonlyArray<F>
}

export const tallyOutcomes = <F>(outcomes: ReadonlyArray<StaleUploadOutcome<F>>): StepTally<F> => {
  let deleted = 0
  let skippedNoStore = 0
  let vanished = 0
  const failed: Array<F> = []
  for (const outcome of outcomes) {
    if (outcome === "deleted" || outcome === "missing") deleted++
    else if (outcome === "unconfigured") skippedNoStore++
    else if (outcome === "vanished") vanished++
    else failed.push(outcome.failed)
  }
  return { deleted, skippedNoStore, vanished, failed }
}
