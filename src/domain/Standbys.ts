/**
 * Which streaming standbys the health gate's `replicationLag` watches, pure.
 *
 * A delayed standby (`recovery_min_apply_delay`, kept an hour behind for disaster recovery) replays
 * late on purpose: counting it as lag would hold every batch for as long as its delay. The primary
 * cannot read a standby's recovery_min_apply_delay; what it sees in pg_stat_replication is a
 * standby that writes and flushes what it receives promptly (small flush_lag) and replays it far
 * later (large replay_lag). A standby whose replay struggles looks alike for a while, but its lag
 * grows from nothing and crosses any sensible stop (seconds, megabytes) long before it reaches
 * DELAYED_REPLAY_S, so the gate has already held; a delayed standby reports its delay from its first
 * replay on. A paused replay (`pg_wal_replay_pause()`) keeps its last, small, measured replay_lag
 * and is watched. Until a delayed standby has replayed once after its delay (replay_lag not yet
 * measured) it cannot be told apart: the operator names it (`SWEEPER_HEALTH_STANDBYS`).
 */
import * as Schema from "effect/Schema"

/** A replay this far behind while the flush keeps up is a delay someone set, not a struggling replay. */
export const DELAYED_REPLAY_S = 300
/** A flush behind by less than this keeps up with the primary. */
export const PROMPT_FLUSH_S = 10

/**
 * `SWEEPER_HEALTH_STANDBYS`: standbys by `application_name` (primary_conninfo's, `walreceiver`
 * unless set). `watch`: counted even when they look delayed; `ignore`: never counted. A name in both is refused.
 */
export const StandbySelection = Schema.Struct({
  watch: Schema.optionalKey(Schema.Array(Schema.NonEmptyString)),
  ignore: Schema.optionalKey(Schema.Array(Schema.NonEmptyString))
}).check(Schema.makeFilter((s) => {
  const both = (s.watch ?? []).find((name) => (s.ignore ?? []).includes(name))
  return both === undefined ? true : `standby ${JSON.stringify(both)} is both watched and ignored`
}))
export type StandbySelection = typeof StandbySelection.Type

export const StandbySelectionJson = Schema.fromJsonString(StandbySelection)

export const NO_SELECTION: StandbySelection = {}

/** One physical standby as pg_stat_replication shows it on the primary. */
export interface StandbyRow {
  readonly name: string
  /** Bytes its replay is behind pg_current_wal_lsn(). */
  readonly bytes: number
  /** flush_lag and replay_lag in seconds; null when not measured (caught up and idle, or never replayed). */
  readonly flushLagS: number | null
  readonly replayLagS: number | null
}

export interface StandbyVerdict {
  readonly watched: boolean
  readonly reason: string
}

export const standbyVerdict = (row: StandbyRow, selection: StandbySelection): StandbyVerdict => {
  if (selection.ignore?.includes(row.name)) return { watched: false, reason: "ignored by SWEEPER_HEALTH_STANDBYS" }
  if (selection.watch?.includes(row.name)) return { watched: true, reason: "watched by SWEEPER_HEALTH_STANDBYS" }
  const flushKeepsUp = (row.flushLagS ?? 0) < PROMPT_FLUSH_S
  if (flushKeepsUp && row.replayLagS !== null && row.replayLagS >= DELAYED_REPLAY_S) {
    return {
      watched: false,
      reason: `delayed: flushes promptly, replays ${Math.round(row.replayLagS)} s late (recovery_min_apply_delay)`
    }
  }
  return { watched: true, reason: "streaming standby" }
}
