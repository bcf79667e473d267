/**
 * Migration 0012 (online steps, Migrations.ts): a stream's events found through a hash index on
 * `stream` instead of the B-tree on `(stream, id)`.
 *
 * Every repair appends one event row, and each row enters every index of sweeper_events. The B-tree
 * on `(stream, id)` was the dearest of them: repair streams are long, distinct texts
 * (`direct_upload:<bucket>/<path>`, `build:<id>`), so each row's entry lands on a random leaf page
 * and carries the whole text; a hash index stores a 4-byte hash code. Measured (BENCHMARKS.md):
 * appending 1000-row pages took 1.3–1.7× as long with that B-tree as without it.
 *
 * What the B-tree served: `stream = $1 ORDER BY id [DESC] LIMIT n`. A repair stream holds a few rows,
 * so the hash index finds them and a top-n sort orders them. A batch's streams (`batch:<name>`,
 * `batch:<name>:health`) may hold tens of thousands: their queries say `stream LIKE 'batch:%'`
 * literally (EventLogSql) and read index_sweeper_events_on_batch_streams, the partial `(stream, id)`
 * B-tree, in order.
 */

/** Built first (CONCURRENTLY), so no query is ever without an index on `stream`. */
export const STREAM_HASH_INDEX = "index_sweeper_events_on_stream_hash"
export const STREAM_HASH_DEFINITION = "USING hash (stream)"

/** Dropped (CONCURRENTLY) once the hash index is valid. */
export const STREAM_BTREE_INDEX = "index_sweeper_events_on_stream_and_id"
