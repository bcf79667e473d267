/**
 * The three Redis deployments Sweeper must work on, for contract and integration tests:
 *
 * - `"single"`  — one server for every store: a claimed db of the shared test Redis (./redis.ts).
 * - `"split"`   — three separate `redis-server`s, one per store (SharedState, Queues, QueuesMetadata).
 * - `"cluster"` — a local Redis Cluster of three masters; all three stores point at it.
 *
 * The extra servers run on free loopback ports in a temp dir, started at first use and shared by the
 * whole test file, stopped after the file's last test (`SIGTERM`: the servers run with `--save ""`,
 * so that is `shutdown nosave`). Each `RedisTopologyTest` layer
 * FLUSHALLs the split servers / cluster masters when it is built, so a layer per test (or per
 * `layer()` block) starts empty; tests sharing one layer isolate by key names as they do today.
 *
 * API:
 *   topologies                       ["single", "split", "cluster"], for `describe.each` / loops
 *   RedisTopologyTest(topology)      Layer: Redis, SharedStateRedis, QueuesRedis, QueuesMetadataRedis,
 *                                    RedisStores, TestRedisStores (URLs and env for child processes)
 *   TestRedisStores                  { topology, urls: {sharedState, queues, queuesMetadata}, env, flush }
 *                                    `env` = REDIS_URL + the three REDIS_*_URL variables;
 *                                    `flush` empties every store of the topology
 *   startSplitServers() / startCluster()   the raw servers (memoised per file), with `flushAll()`
 *   scanKeys(client, pattern)        SCAN every master (a cluster's SCAN only sees one node)
 */
import { Context, Effect, Layer, Redacted } from "effect"
import { Cluster, Redis as IORedis } from "ioredis"
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { mkdirSync, mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll } from "vitest"
import { Redis, type RedisClient } from "../../src/layers/redis/Redis.ts"
import { freshRedisUrl } from "./redis.ts"

export type RedisTopology = "single" | "split" | "cluster"
export const topologies: ReadonlyArray<RedisTopology> = ["single", "split", "cluster"]

export interface StoreUrlStrings {
  readonly sharedState: string
  readonly queues: string
  readonly queuesMetadata: string
}

export class TestRedisStores extends Context.Service<TestRedisStores, {
  readonly topology: RedisTopology
  readonly urls: StoreUrlStrings
  /** For a child `sweeper` process: REDIS_URL (= SharedState) and the three store variables. */
  readonly env: Readonly<Record<string, string>>
  /** Empties every store (FLUSHDB of the claimed db; FLUSHALL of each split server / cluster master). */
  readonly flush: Effect.Effect<void>
}>()("test/support/TestRedisStores") {}

export const storeEnv = (urls: StoreUrlStrings): Record<string, string> => ({
  REDIS_URL: urls.sharedState,
  REDIS_SHARED_STATE_URL: urls.sharedState,
  REDIS_QUEUES_URL: urls.queues,
  REDIS_QUEUES_METADATA_URL: urls.queuesMetadata
})

// ---------------------------------------------------------------------------------------------
// Servers

let split: Promise<RedisServers> | undefined
let cluster: Promise<RedisServers> | undefined
const children = new Set<ChildProcess>()
const dirs = new Set<string>()
const stopAllNow = () => {
  for (const child of children) child.kill("SIGTERM")
  children.clear()
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
  dirs.clear()
}
// Imported while vitest collects a test file, so this hook belongs to that file: its servers stop
// when its last test is done. The exit handler covers a worker that ends some other way.
afterAll(async () => {
  const stopping = [split, cluster].filter((servers) => servers !== undefined)
  split = undefined
  cluster = undefined
  for (const servers of stopping) await (await servers.catch(() => undefined))?.stop()
  stopAllNow()
})
process.on("exit", stopAllNow)

/** A free loopback port (the OS picks, we release it; redis-server binds it a moment later). */
const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      server.close(
        () => (typeof address === "object" && address !== null ? resolve(address.port) : reject(new Error("no port")))
      )
    })
  })

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const waitUntil = async (
  what: string,
  probe: () => Promise<boolean>,
  gaveUp: () => boolean = () => false,
  // Generous: on a busy 2-core machine a server or a cluster can take far longer than when idle.
  timeoutMs = 120_000
) => {
  const deadline = Date.now() + timeoutMs
  let last: unknown
  while (Date.now() < deadline && !gaveUp()) {
    try {
      if (await probe()) return
    } catch (error) {
      last = error
    }
    await sleep(50)
  }
  throw new Error(`timed out waiting for ${what}${last === undefined ? "" : `: ${String(last)}`}`)
}

const withClient = async <A>(port: number, f: (client: IORedis) => Promise<A>) => {
  const client = new IORedis({
    host: "127.0.0.1",
    port,
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null
  })
  client.on("error", () => {})
  await client.connect()
  try {
    return await f(client)
  } finally {
    client.disconnect()
  }
}

export interface RedisServers {
  readonly ports: ReadonlyArray<number>
  /** FLUSHALL on every server (every master, for a cluster). */
  readonly flushAll: () => Promise<void>
  /** Stops the servers now (otherwise they stop when the test file's worker exits). */
  readonly stop: () => Promise<void>
}

/**
 * One redis-server on a free port. The port is free when the OS hands it out but another process
 * may take it before redis-server binds it (and a cluster node also binds a bus port): a server
 * that exits before it answers is started again on new ports.
 */
const startServer = async (dir: string, extra: (nodeDir: string, port: number) => Promise<ReadonlyArray<string>>) => {
  for (let attempt = 1;; attempt++) {
    const port = await freePort()
    const nodeDir = join(dir, String(port))
    mkdirSync(nodeDir, { recursive: true })
    const child = spawn("redis-server", [
      "--port",
      String(port),
      "--bind",
      "127.0.0.1",
      "--save",
      "",
      "--appendonly",
      "no",
      "--dir",
      nodeDir,
      ...(await extra(nodeDir, port))
    ], { stdio: "ignore" })
    children.add(child)
    let exited = false
    child.once("exit", () => (exited = true))
    try {
      await waitUntil(`redis-server on ${port}`, async () => {
        if (exited) throw new Error("exited")
        return withClient(port, async (c) => (await c.ping()) === "PONG")
      }, () => exited)
      return { port, child }
    } catch (error) {
      children.delete(child)
      child.kill("SIGKILL")
      if (attempt >= 5) throw error
    }
  }
}

const startServers = async (
  count: number,
  extra: (nodeDir: string, port: number) => Promise<ReadonlyArray<string>>
) => {
  const dir = mkdtempSync(join(tmpdir(), "sweeper-redis-"))
  dirs.add(dir)
  const started: Array<{ port: number; child: ChildProcess }> = []
  for (let i = 0; i < count; i++) started.push(await startServer(dir, extra))
  const ports = started.map((server) => server.port)
  const stop = async () => {
    for (const { child } of started) {
      children.delete(child)
      const exited = new Promise((resolve) => child.once("exit", resolve))
      child.kill("SIGTERM")
      await Promise.race([exited, sleep(2_000)])
    }
    rmSync(dir, { recursive: true, force: true })
    dirs.delete(dir)
  }
  return { ports, stop }
}

/** Three independent servers, one per store; started once per test file. */
export const startSplitServers = (): Promise<
  RedisServers
> => (split ??= startServers(3, async () => []).then(({ ports, stop }) => ({
  ports,
  stop,
  flushAll: async () => {
    for (const port of ports) await withClient(port, (c) => c.flushall())
  }
})))

/** A Redis Cluster of three masters (no replicas); started once per test file. */
export const startCluster = (): Promise<RedisServers> => (cluster ??= startServers(3, async (dir) => [
  "--cluster-enabled",
  "yes",
  "--cluster-config-file",
  join(dir, "nodes.conf"),
  "--cluster-node-timeout",
  "5000",
  // The bus port defaults to port + 10000, which may be taken (or past 65535): pick a free one too.
  "--cluster-port",
  String(await freePort())
])
  .then(async ({ ports, stop }) => {
    const created = spawnSync("redis-cli", [
      "--cluster",
      "create",
      ...ports.map((p) => `127.0.0.1:${p}`),
      "--cluster-yes"
    ], {
      encoding: "utf8",
      timeout: 120_000
    })
    if (created.status !== 0) {
      throw new Error(`redis-cli --cluster create failed:\n${created.stdout}\n${created.stderr}`)
    }
    for (const port of ports) {
      await waitUntil(
        `cluster_state:ok on ${port}`,
        () => withClient(port, async (c) => String(await c.cluster("INFO")).includes("cluster_state:ok"))
      )
    }
    return {
      ports,
      stop,
      flushAll: async () => {
        // Every node is a master here; FLUSHALL is refused on a replica, and there are none.
        for (const port of ports) await withClient(port, (c) => c.flushall())
      }
    }
  }))

/**
 * One server of the caller's own for the current scope (stopped when it closes), for a test that
 * makes Redis misbehave (a busy script, CONFIG SET) where other tests would feel it.
 */
export const privateServer = Effect.acquireRelease(
  Effect.promise(() => startServers(1, async () => [])),
  (servers) => Effect.promise(servers.stop)
).pipe(
  Effect.flatMap(({ ports: [port] }) =>
    port === undefined ? Effect.die(new Error("no private redis-server started")) : Effect.succeed(port)
  )
)

/** The URL list a Sweeper process takes for the test cluster (the seed-node form). */
export const clusterUrl = (servers: RedisServers) => servers.ports.map((p) => `redis://127.0.0.1:${p}`).join(",")

// ---------------------------------------------------------------------------------------------
// Layers

/** URLs of each store for a topology, flushed, and how to flush them again (scoped: a "single" db claim is released with the scope). */
export const topologyUrls = (topology: RedisTopology) =>
  Effect.gen(function*() {
    switch (topology) {
      case "single": {
        const url = yield* freshRedisUrl
        const flush = Effect.promise(async () => {
          const client = new IORedis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
          await client.connect()
          await client.flushdb().finally(() => client.disconnect())
        })
        return { urls: { sharedState: url, queues: url, queuesMetadata: url } satisfies StoreUrlStrings, flush }
      }
      case "split": {
        const servers = yield* Effect.promise(startSplitServers)
        yield* Effect.promise(servers.flushAll)
        const [a, b, c] = servers.ports.map((p) => `redis://127.0.0.1:${p}`)
        return {
          urls: { sharedState: a!, queues: b!, queuesMetadata: c! } satisfies StoreUrlStrings,
          flush: Effect.promise(servers.flushAll)
        }
      }
      case "cluster": {
        const servers = yield* Effect.promise(startCluster)
        yield* Effect.promise(servers.flushAll)
        const url = clusterUrl(servers)
        return {
          urls: { sharedState: url, queues: url, queuesMetadata: url } satisfies StoreUrlStrings,
          flush: Effect.promise(servers.flushAll)
        }
      }
    }
  })

/**
 * Sweeper's production store composition (`Redis.layerStores`) over the topology's servers, plus
 * `TestRedisStores`. Provides Redis (= SharedState), SharedStateRedis, QueuesRedis,
 * QueuesMetadataRedis and RedisStores.
 */
export const RedisTopologyTest = (topology: RedisTopology) =>
  Layer.unwrap(Effect.map(topologyUrls(topology), ({ urls, flush }) =>
    Redis.layerStores({
      sharedState: Redacted.make(urls.sharedState),
      queues: Redacted.make(urls.queues),
      queuesMetadata: Redacted.make(urls.queuesMetadata)
    }).pipe(
      Layer.merge(Layer.succeed(TestRedisStores, { topology, urls, env: storeEnv(urls), flush })),
      Layer.orDie
    )))

/** Every key matching `pattern` (SCAN), on every master of a cluster (a cluster SCAN sees one node). */
export const scanKeys = async (client: RedisClient, pattern = "*"): Promise<Array<string>> => {
  const nodes: ReadonlyArray<IORedis> = client instanceof Cluster ? client.nodes("master") : [client]
  const keys: Array<string> = []
  for (const node of nodes) {
    let cursor = "0"
    do {
      const [next, batch] = await node.scan(cursor, "MATCH", pattern, "COUNT", 1000)
      keys.push(...batch)
      cursor = next
    } while (cursor !== "0")
  }
  return keys
}
