/**
 * A private PostgreSQL primary with a streaming standby, started by the test that needs real
 * replication lag (the health gate's replicationLag and walRate signals): `initdb`, `pg_basebackup
 * -R`, both on loopback ports the OS picked, data in a temp dir removed at scope close. Replay is
 * paused on the standby with `pg_wal_replay_pause()` to make lag, resumed to let it catch up.
 *
 * PostgreSQL refuses to run as root: as root, every server command runs as the `postgres` OS user
 * (Debian's package creates it) in a temp dir it owns. The binaries are the newest under
 * /usr/lib/postgresql/<version>/bin (Debian's postgresql package, which .ci/run installs); a
 * missing one fails the test, never skips it. About 2 s to start on this machine.
 */
import { Effect } from "effect"
import { spawnSync } from "node:child_process"
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"

const binDir = (): string => {
  const root = "/usr/lib/postgresql"
  const versions = existsSync(root) ? readdirSync(root).filter((v) => existsSync(join(root, v, "bin", "initdb"))) : []
  const newest = versions.sort((a, b) => Number(b) - Number(a))[0]
  if (newest === undefined) {
    throw new Error("initdb not found under /usr/lib/postgresql/*/bin (Debian package postgresql)")
  }
  return join(root, newest, "bin")
}

const asRoot = process.getuid?.() === 0

/**
 * How long a server may take to start or stop: generous, because a busy 2-core machine running other
 * suites beside this one can take minutes where an idle one takes two seconds.
 */
const START_WITHIN_S = 300

/** Runs a PostgreSQL binary, as the postgres OS user when we are root. */
const run = (dir: string, command: string, args: ReadonlyArray<string>) => {
  const bin = join(binDir(), command)
  const [file, argv] = asRoot ? ["runuser", ["-u", "postgres", "--", bin, ...args]] : [bin, [...args]]
  const result = spawnSync(file, argv, { cwd: dir, encoding: "utf8", timeout: (START_WITHIN_S + 30) * 1000 })
  if (result.status !== 0) {
    throw new Error(
      `${command} ${args.join(" ")} failed (${result.status}): ${result.stdout}${result.stderr}${
        result.error?.message ?? ""
      }`
    )
  }
  return result.stdout
}

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      server.close(() =>
        typeof address === "object" && address !== null ? resolve(address.port) : reject(new Error("no port"))
      )
    })
  })

export interface ReplicatedPostgres {
  /** The primary, database `postgres`. */
  readonly primaryUrl: string
  readonly urlOf: (database: string) => string
  readonly standbyUrl: string
  /** Runs SQL on the primary's `postgres` database (psql); rows of text columns. */
  readonly primary: (text: string, database?: string) => Promise<ReadonlyArray<ReadonlyArray<string>>>
  readonly standby: (text: string) => Promise<ReadonlyArray<ReadonlyArray<string>>>
  readonly pauseReplay: () => Promise<void>
  readonly resumeReplay: () => Promise<void>
  /** Bytes the standby's replay is behind the primary's current WAL position. */
  readonly lagBytes: () => Promise<number>
}

/** One statement through psql (no client library needed); rows of tab-separated text columns. */
const query = async (url: string, text: string): Promise<ReadonlyArray<ReadonlyArray<string>>> => {
  const result = spawnSync("psql", [url, "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", text], {
    encoding: "utf8",
    timeout: 60_000
  })
  if (result.status !== 0) throw new Error(`psql ${text.slice(0, 80)}: ${result.stderr}${result.error?.message ?? ""}`)
  return result.stdout.split("\n").filter((line) => line.length > 0).map((line) => line.split("\t"))
}

const settings = (port: number, dir: string) =>
  [
    `-c listen_addresses=127.0.0.1`,
    `-c port=${port}`,
    `-c unix_socket_directories=${dir}`,
    // logical (a superset of replica): a test may add a logical subscriber beside the standby.
    `-c wal_level=logical`,
    `-c max_wal_senders=4`,
    `-c hot_standby=on`,
    // Disposable: no fsync, small footprint; autovacuum wakes every second for the autovacuum test.
    `-c fsync=off`,
    `-c synchronous_commit=off`,
    `-c full_page_writes=off`,
    `-c shared_buffers=16MB`,
    `-c max_connections=40`,
    `-c autovacuum_naptime=1`,
    // Replay lag is tracked from standby feedback: report it often.
    `-c wal_receiver_status_interval=1`
  ].join(" ")

/**
 * Starts a server on a port the OS just handed out. The port was free then, but another process may
 * bind it before PostgreSQL does: that start fails with "Address already in use" in the log, and the
 * next attempt takes a new port. `pg_ctl -w -t` waits on the server's readiness, not a fixed time.
 */
const startServer = async (dir: string, node: string): Promise<number> => {
  for (let attempt = 0;; attempt++) {
    const port = await freePort()
    const log = join(dir, `${node}.log`)
    try {
      run(dir, "pg_ctl", [
        "-D",
        join(dir, node),
        "-l",
        log,
        "-w",
        "-t",
        String(START_WITHIN_S),
        "-o",
        settings(port, dir),
        "start"
      ])
      return port
    } catch (error) {
      const logged = existsSync(log) ? readFileSync(log, "utf8") : ""
      if (attempt >= 4 || !/address already in use/i.test(logged)) throw error
    }
  }
}

/** Stops both servers (whichever started) and removes their data. */
const stopAll = (dir: string) => {
  for (const node of ["standby", "primary"]) {
    if (!existsSync(join(dir, node, "postmaster.pid"))) continue
    try {
      run(dir, "pg_ctl", ["-D", join(dir, node), "-m", "immediate", "-w", "-t", String(START_WITHIN_S), "stop"])
    } catch {
      // Already down: nothing to stop.
    }
  }
  rmSync(dir, { recursive: true, force: true })
}

/** Starts the pair for the scope; both stopped and their data removed when it closes. */
export const replicatedPostgres = Effect.acquireRelease(
  Effect.promise(async (): Promise<ReplicatedPostgres & { readonly dir: string }> => {
    const dir = mkdtempSync(join(tmpdir(), "sweeper-pg-standby-"))
    if (asRoot) {
      const uid = Number(spawnSync("id", ["-u", "postgres"], { encoding: "utf8" }).stdout.trim())
      const gid = Number(spawnSync("id", ["-g", "postgres"], { encoding: "utf8" }).stdout.trim())
      chownSync(dir, uid, gid)
    }
    try {
      return await startPair(dir)
    } catch (error) {
      // A failed setup leaves no server and no temp dir behind.
      stopAll(dir)
      throw error
    }
  }),
  ({ dir }) => Effect.sync(() => stopAll(dir))
)

const startPair = async (dir: string): Promise<ReplicatedPostgres & { readonly dir: string }> => {
  run(dir, "initdb", ["-D", join(dir, "primary"), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
  const primaryPort = await startServer(dir, "primary")
  run(dir, "pg_basebackup", [
    "-h",
    "127.0.0.1",
    "-p",
    String(primaryPort),
    "-U",
    "postgres",
    "-D",
    join(dir, "standby"),
    "-R",
    "-X",
    "stream",
    "--no-sync"
  ])
  const standbyPort = await startServer(dir, "standby")
  const urlOf = (database: string) => `postgres://postgres@127.0.0.1:${primaryPort}/${database}`
  const primaryUrl = urlOf("postgres")
  const standbyUrl = `postgres://postgres@127.0.0.1:${standbyPort}/postgres`
  // Streaming, with a replay position, before anyone measures lag.
  const streamingBy = Date.now() + START_WITHIN_S * 1000
  for (;;) {
    const rows = await query(primaryUrl, "SELECT state FROM pg_stat_replication WHERE replay_lsn IS NOT NULL")
    if (rows.some((row) => row[0] === "streaming")) break
    if (Date.now() > streamingBy) throw new Error(`standby not streaming within ${START_WITHIN_S} s`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return {
    dir,
    primaryUrl,
    urlOf,
    standbyUrl,
    primary: (text, database = "postgres") => query(urlOf(database), text),
    standby: (text) => query(standbyUrl, text),
    pauseReplay: async () => {
      await query(standbyUrl, "SELECT pg_wal_replay_pause()")
      // Paused means replay stopped (pg_get_wal_replay_pause_state, PostgreSQL 14+).
      const pausedBy = Date.now() + 60_000
      while (Date.now() < pausedBy) {
        const [row] = await query(standbyUrl, "SELECT pg_get_wal_replay_pause_state() AS state")
        if (row?.[0] === "paused") return
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
      throw new Error("standby replay not paused within 60 s")
    },
    resumeReplay: async () => {
      await query(standbyUrl, "SELECT pg_wal_replay_resume()")
    },
    lagBytes: async () => {
      const [row] = await query(
        primaryUrl,
        "SELECT max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn))::float8 AS lag FROM pg_stat_replication"
      )
      return Number(row?.[0] || 0)
    }
  }
}
