/**
 * Where a running supervisor can be reached: `<SWEEPER_DATA_DIR>/supervisor.json`, written once it
 * listens and removed when it stops. On the embedded default the database belongs to that one
 * process, so the CLI reads this file and asks the supervisor over HTTP for `status`, `events`
 * and `run` instead of failing with "database open in process N".
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { randomBytes } from "node:crypto"
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { isAlive } from "../layers/postgres/Postgres.ts"

const Published = Schema.fromJsonString(Schema.Struct({ pid: Schema.Number, url: Schema.String, token: Schema.String }))

/**
 * This process's local token: the CLI beside an embedded supervisor reads it from the address
 * file (mode 0600, so only the same user) and may use the mutating API with it, as if it were
 * SWEEPER_API_TOKEN, without the operator having to configure one.
 */
export const localToken = randomBytes(24).toString("hex")

export interface SupervisorEndpoint {
  readonly url: string
  readonly token: string
  /** The supervisor's process, when it published one (SWEEPER_URL names none). */
  readonly pid?: number | undefined
}

export const addressFile = (dataDir: string) => join(dataDir, "supervisor.json")

/** Writes the address for the scope's lifetime. */
export const publishAddress = (dataDir: string, url: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      mkdirSync(dataDir, { recursive: true })
      writeFileSync(addressFile(dataDir), JSON.stringify({ pid: process.pid, url, token: localToken }), { mode: 0o600 })
    }),
    () => Effect.sync(() => rmSync(addressFile(dataDir), { force: true }))
  )

/** The running supervisor's base URL and local token, if one published them and is still alive. */
export const findSupervisor = (dataDir: string): Effect.Effect<Option.Option<SupervisorEndpoint>> =>
  Effect.sync(() => {
    try {
      return readFileSync(addressFile(dataDir), "utf8")
    } catch {
      return undefined
    }
  }).pipe(
    Effect.flatMap((text) =>
      text === undefined
        ? Effect.succeedNone
        : Schema.decodeUnknownEffect(Published)(text).pipe(
          Effect.map((p) =>
            isAlive(p.pid) && p.pid !== process.pid
              ? Option.some({ url: p.url, token: p.token, pid: p.pid })
              : Option.none()
          ),
          Effect.orElseSucceed(() => Option.none<SupervisorEndpoint>())
        )
    )
  )
