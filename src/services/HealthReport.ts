/**
 * What the health gate sees now, for the operator surfaces: `/api/health`, `sweeper
 * status` and the dashboard say each signal's reading, threshold and state, and which batch is
 * held by what since when. A reference with a default, like `HealthGate`: without SWEEPER_HEALTH
 * (or in a bare spec) the report says the gate is not configured.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type { DatabaseName } from "../domain/Databases.ts"

export interface SignalReport {
  /** Configuration key (or a Prometheus rule's name). */
  readonly signal: string
  /**
   * What it was read on: the database (`main`, `ci`) for a database-wide PostgreSQL signal, a table,
   * store or queue, or `""` the server as a whole (Prometheus).
   */
  readonly subject: string
  /** The database a PostgreSQL signal is read on (absent for Redis, Sidekiq and Prometheus signals). */
  readonly database?: DatabaseName | undefined
  /** `over`: past its stop threshold now; `ok`: not; `unknown`: could not be read (`reason` says why). */
  readonly state: "ok" | "over" | "unknown" | "pending"
  readonly value: number | null
  /** The reading for people: `38 MB`, `12 s`, `0.93`. */
  readonly display: string
  readonly stop: string
  readonly resume: string
  readonly reason?: string | undefined
  /** ISO time of the reading (null before the first). */
  readonly readAt: string | null
}

export interface HoldReport {
  readonly batch: string
  readonly signal: string
  /** The database a PostgreSQL signal held on. */
  readonly database?: DatabaseName | undefined
  readonly value: number | null
  readonly display: string
  readonly threshold: string
  /** ISO time the hold began. */
  readonly since: string
  /** One line: `drop-canceling-builds held by replicationLag on ci: 38 MB > 8 MB since 06:45:10`. */
  readonly text: string
}

export interface ThrottleReport {
  readonly worker: string
  readonly limit: number
  readonly effective: number
}

export interface HealthSnapshot {
  readonly configured: boolean
  readonly signals: ReadonlyArray<SignalReport>
  readonly holds: ReadonlyArray<HoldReport>
  readonly throttled: ReadonlyArray<ThrottleReport>
}

export const NOT_CONFIGURED: HealthSnapshot = { configured: false, signals: [], holds: [], throttled: [] }

export interface HealthReportShape {
  readonly snapshot: Effect.Effect<HealthSnapshot>
}

export const HealthReport = Context.Reference<HealthReportShape>("sweeper/services/HealthReport", {
  defaultValue: () => ({ snapshot: Effect.succeed(NOT_CONFIGURED) })
})
