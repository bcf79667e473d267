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
import {
  closeSync,
  constants,
  fchmodSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync
} from "node:fs"
import { basename, dirname, join } from "node:path"
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

/**
 * `text` at `path`, readable by this user only, whatever was there: written to a new file of our
 * own (O_EXCL: never an existing file nor a link someone planted, its mode 0600 from creation),
 * synced, then renamed over `path`. A rename replaces the entry itself, so a symlink at `path` is
 * replaced, not followed; a mode `path` had does not survive (writing into it in place kept 0644).
 */
const writePrivately = (path: string, text: string) => {
  const temporary = join(dirname(path), `.${basename(path)}.${process.pid}.${randomBytes(6).toString("hex")}`)
  const flags = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW
  return Effect.acquireUseRelease(
    Effect.sync(() => openSync(temporary, flags, 0o600)),
    (fd) =>
      Effect.sync(() => {
        // The umask can only narrow 0600; set it anyway so the file's mode never depends on it.
        fchmodSync(fd, 0o600)
        writeFileSync(fd, text)
        fsyncSync(fd)
      }),
    (fd) => Effect.sync(() => closeSync(fd))
  ).pipe(
    Effect.andThen(Effect.sync(() => renameSync(temporary, path))),
    Effect.onError(() => Effect.sync(() => rmSync(temporary, { force: true })))
  )
}

/** Writes the address for the scope's lifetime. */
export const publishAddress = (dataDir: string, url: string) =>
  Effect.acquireRelease(
    Effect.sync(() => mkdirSync(dataDir, { recursive: true })).pipe(
      Effect.andThen(writePrivately(addressFile(dataDir), JSON.stringify({ pid: process.pid, url, token: localToken })))
    ),
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
