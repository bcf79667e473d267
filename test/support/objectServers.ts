/**
 * Real object stores on loopback for storage tests, started by the tests themselves and stopped
 * with the scope: S3 through `s3rver` and Azure Blob through Microsoft's `azurite`, each a child
 * process on a port the OS picks (port 0, read back from the server's own "listening" line), with
 * its data in a fresh temp dir. Azurite runs with --disableTelemetry: by default it reports to an
 * Azure endpoint, and tests send traffic to loopback only.
 */
import { CreateBucketCommand, ListObjectsV2Command, PutObjectCommand, S3Client } from "@aws-sdk/client-s3"
import { BlobServiceClient, StorageSharedKeyCredential } from "@azure/storage-blob"
import { Effect, Option, Redacted } from "effect"
import { spawn } from "node:child_process"
import { mkdtemp, rm } from "node:fs/promises"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import type { AzureConnection, S3Connection } from "../../src/config/ObjectStorageConfig.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))

/** s3rver's built-in account. */
export const S3RVER_KEY = { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" }
/** Azurite's well-known development account (public, documented by Microsoft). */
export const AZURITE_ACCOUNT = {
  name: "devstoreaccount1",
  key: "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
}

/** Starts `script args` under this Node; resolves with the port once `listening` matches its output. */
const startChild = (name: string, script: string, args: (dir: string) => ReadonlyArray<string>, listening: RegExp) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const dir = await mkdtemp(join(tmpdir(), `sweeper-${name}-`))
      const child = spawn(process.execPath, [join(root, script), ...args(dir)], {
        cwd: dir,
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      // Readiness is the server saying it listens; the limit only has to outlast a busy machine.
      const port = await new Promise<number>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`${name} did not start within 180 s:\n${output}`)), 180_000)
        const collect = (chunk: Buffer) => {
          output += chunk.toString()
          const match = listening.exec(output)
          if (match?.[1] !== undefined) {
            clearTimeout(timer)
            resolve(Number(match[1]))
          }
        }
        child.stdout.on("data", collect)
        child.stderr.on("data", collect)
        child.on("exit", (code) => {
          clearTimeout(timer)
          reject(new Error(`${name} exited (${code}) before listening:\n${output}`))
        })
      }).catch(async (error: unknown) => {
        // A failed setup leaves no process and no temp dir behind.
        child.kill("SIGKILL")
        await rm(dir, { recursive: true, force: true })
        throw error
      })
      const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()))
      return { child, dir, port, exited }
    }),
    ({ child, dir, exited }) =>
      Effect.promise(async () => {
        if (child.exitCode === null && child.signalCode === null) {
          child.kill("SIGTERM")
          await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5_000))])
          if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
        }
        await rm(dir, { recursive: true, force: true })
      })
  )

/** A loopback port nothing listens on (taken from the OS, then released): "the server is down". */
export const closedPort = Effect.promise(() =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.on("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => resolve(port))
    })
  })
)

export interface S3Server {
  readonly endpoint: string
  /** A connection as SWEEPER_OBJECT_STORAGE would decode to, with s3rver's keys. */
  readonly connection: S3Connection
  readonly client: S3Client
  readonly createBucket: (bucket: string) => Effect.Effect<void>
  readonly put: (bucket: string, key: string) => Effect.Effect<void>
  /** Every key in the bucket, sorted. */
  readonly list: (bucket: string) => Effect.Effect<ReadonlyArray<string>>
  /** Stops the server now (the scope would otherwise do it at the end). */
  readonly stop: Effect.Effect<void>
}

export const s3Connection = (endpoint: string, key = S3RVER_KEY): S3Connection => ({
  region: "us-east-1",
  accessKeyId: Option.some(Redacted.make(key.accessKeyId)),
  secretAccessKey: Option.some(Redacted.make(key.secretAccessKey)),
  endpoint: Option.some(endpoint),
  pathStyle: true
})

export const startS3rver = Effect.gen(function*() {
  const server = yield* startChild(
    "s3rver",
    "node_modules/s3rver/bin/s3rver.js",
    (dir) => ["--directory", dir, "--address", "127.0.0.1", "--port", "0", "--silent"],
    /S3rver listening on [\d.]+:(\d+)/
  )
  const endpoint = `http://127.0.0.1:${server.port}`
  const client = yield* Effect.acquireRelease(
    Effect.sync(() => new S3Client({ region: "us-east-1", endpoint, forcePathStyle: true, credentials: S3RVER_KEY })),
    (opened) => Effect.sync(() => opened.destroy())
  )
  const list = (bucket: string) =>
    Effect.promise(async () => {
      const keys: Array<string> = []
      let token: string | undefined
      do {
        const page = await client.send(new ListObjectsV2Command({ Bucket: bucket, ContinuationToken: token }))
        for (const object of page.Contents ?? []) keys.push(object.Key!)
        token = page.IsTruncated === true ? page.NextContinuationToken : undefined
      } while (token !== undefined)
      return keys.sort()
    })
  return {
    endpoint,
    connection: s3Connection(endpoint),
    client,
    createBucket: (bucket) =>
      Effect.promise(() => client.send(new CreateBucketCommand({ Bucket: bucket }))).pipe(Effect.asVoid),
    put: (bucket, key) =>
      Effect.promise(() => client.send(new PutObjectCommand({ Bucket: bucket, Key: key, Body: "half an upload" })))
        .pipe(Effect.asVoid),
    list,
    stop: Effect.sync(() => void server.child.kill("SIGKILL")).pipe(Effect.andThen(Effect.promise(() => server.exited)))
  } satisfies S3Server
})

export interface AzuriteServer {
  readonly serviceUrl: string
  readonly connection: AzureConnection
  readonly service: BlobServiceClient
  readonly createContainer: (container: string) => Effect.Effect<void>
  readonly put: (container: string, name: string) => Effect.Effect<void>
  readonly list: (container: string) => Effect.Effect<ReadonlyArray<string>>
  readonly stop: Effect.Effect<void>
}

export const azureConnection = (serviceUrl: string, key = AZURITE_ACCOUNT.key): AzureConnection => ({
  accountName: AZURITE_ACCOUNT.name,
  accessKey: Redacted.make(key),
  serviceUrl
})

export const startAzurite = Effect.gen(function*() {
  const server = yield* startChild(
    "azurite",
    "node_modules/azurite/dist/src/blob/main.js",
    (
      dir
    ) => [
      "--blobHost",
      "127.0.0.1",
      "--blobPort",
      "0",
      "--location",
      dir,
      "--silent",
      "--skipApiVersionCheck",
      "--disableTelemetry"
    ],
    /listens on http:\/\/127\.0\.0\.1:(\d+)/
  )
  const serviceUrl = `http://127.0.0.1:${server.port}/${AZURITE_ACCOUNT.name}`
  const service = new BlobServiceClient(
    serviceUrl,
    new StorageSharedKeyCredential(AZURITE_ACCOUNT.name, AZURITE_ACCOUNT.key)
  )
  return {
    serviceUrl,
    connection: azureConnection(serviceUrl),
    service,
    createContainer: (container) =>
      Effect.promise(() => service.getContainerClient(container).createIfNotExists()).pipe(Effect.asVoid),
    put: (container, name) =>
      Effect.promise(() => service.getContainerClient(container).getBlockBlobClient(name).upload("half an upload", 14))
        .pipe(Effect.asVoid),
    list: (container) =>
      Effect.promise(async () => {
        const names: Array<string> = []
        for await (const blob of service.getContainerClient(container).listBlobsFlat()) names.push(blob.name)
        return names.sort()
      }),
    stop: Effect.sync(() => void server.child.kill("SIGKILL")).pipe(Effect.andThen(Effect.promise(() => server.exited)))
  } satisfies AzuriteServer
})
