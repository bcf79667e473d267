/**
 * `SWEEPER_OBJECT_STORAGE` validated at the edge: the forms that decode,
 * and a table of bad values, each run through the real CLI: exit 2, one line on stderr naming the
 * variable and what is wrong, no secret echoed.
 */
import { assert, describe, it } from "@effect/vitest"
import { Config, ConfigProvider, Effect, Option, Redacted } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  describeObjectStorage,
  NoObjectStorage,
  ObjectStorageJson,
  type ObjectStorageSettings
} from "../../src/config/ObjectStorageConfig.ts"
import { runCli } from "../support/cli.ts"

const decode = (json: string) =>
  Config.schema(ObjectStorageJson, "SWEEPER_OBJECT_STORAGE").parse(
    ConfigProvider.fromEnv({ env: { SWEEPER_OBJECT_STORAGE: json } })
  )

const SECRET = "sup3r-s3cret-value"
const aws = (extra: Record<string, unknown> = {}) => ({
  provider: "AWS",
  region: "us-east-1",
  aws_access_key_id: "AKIA-TEST",
  aws_secret_access_key: SECRET,
  ...extra
})
const azure = { provider: "AzureRM", azure_storage_account_name: "gitlabstorage", azure_storage_access_key: SECRET }

describe("SWEEPER_OBJECT_STORAGE forms that decode", () => {
  it.effect("the older location → root form", () =>
    Effect.gen(function*() {
      const settings = yield* decode(JSON.stringify({ uploads: "/srv/uploads", artifacts: "/srv/artifacts/" }))
      assert.deepStrictEqual(settings, {
        _tag: "Local",
        roots: { uploads: "/srv/uploads", artifacts: "/srv/artifacts/" }
      })
    }))

  it.effect("consolidated, local roots without a connection; fog-local's local_root + bucket", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* decode(JSON.stringify({ objects: { lfs: { root: "/srv/lfs" } } })), {
        _tag: "Local",
        roots: { lfs: "/srv/lfs" }
      })
      const fog = yield* decode(
        JSON.stringify({
          connection: { provider: "Local", local_root: "/srv/gitlab" },
          objects: { uploads: { bucket: "uploads/pre" } }
        })
      )
      assert.deepStrictEqual(fog, { _tag: "Local", roots: { uploads: "/srv/gitlab/uploads/pre" } })
    }))

  it.effect("consolidated AWS: bucket and prefix split, path_style, secrets Redacted, disabled objects left out", () =>
    Effect.gen(function*() {
      const settings = yield* decode(JSON.stringify({
        connection: aws({ endpoint: "http://127.0.0.1:9000", path_style: true }),
        objects: {
          artifacts: { bucket: "artifacts" },
          uploads: { bucket: "uploads/tmp/pre/" },
          lfs: { bucket: "lfs", enabled: false }
        },
        proxy_download: true
      }))
      assert.strictEqual(settings._tag, "S3")
      const s3 = settings as Extract<ObjectStorageSettings, { _tag: "S3" }>
      assert.deepStrictEqual(s3.buckets, {
        artifacts: { bucket: "artifacts", prefix: "" },
        uploads: { bucket: "uploads", prefix: "tmp/pre" }
      })
      assert.deepStrictEqual([s3.connection.region, s3.connection.endpoint, s3.connection.pathStyle], [
        "us-east-1",
        Option.some("http://127.0.0.1:9000"),
        true
      ])
      assert.isTrue(Redacted.isRedacted(Option.getOrThrow(s3.connection.secretAccessKey)))
      assert.strictEqual(Redacted.value(Option.getOrThrow(s3.connection.secretAccessKey)), SECRET)
      assert.notInclude(String(s3.connection.secretAccessKey), SECRET)
      assert.notInclude(JSON.stringify(settings), SECRET)
    }))

  it.effect("the start-up description names stores and buckets, never a secret", () =>
    Effect.gen(function*() {
      const settings = yield* decode(JSON.stringify({
        connection: aws({ endpoint: `http://user:${SECRET}@127.0.0.1:9000` }),
        objects: { uploads: { bucket: "gitlab/uploads" } }
      }))
      const text = describeObjectStorage(settings)
      assert.strictEqual(text, "S3 http://127.0.0.1:9000 (uploads → gitlab/uploads)")
      assert.strictEqual(
        describeObjectStorage(yield* decode(JSON.stringify({ lfs: "/srv/lfs" }))),
        "local (lfs → /srv/lfs)"
      )
      assert.strictEqual(describeObjectStorage(NoObjectStorage), "none")
    }))

  it.effect("AWS with use_iam_profile needs no keys", () =>
    Effect.gen(function*() {
      const settings = yield* decode(
        JSON.stringify({
          connection: { provider: "AWS", region: "eu-west-1", use_iam_profile: true },
          objects: { uploads: { bucket: "u" } }
        })
      )
      assert.strictEqual(settings._tag, "S3")
    }))

  it.effect("AzureRM: the service URL from account and domain, or an endpoint (azurite)", () =>
    Effect.gen(function*() {
      const byDomain = yield* decode(
        JSON.stringify({
          connection: { ...azure, azure_storage_domain: "blob.core.chinacloudapi.cn" },
          objects: { uploads: { bucket: "gitlab/uploads" } }
        })
      )
      assert.deepStrictEqual(byDomain._tag === "Azure" && [byDomain.connection.serviceUrl, byDomain.containers], [
        "https://gitlabstorage.blob.core.chinacloudapi.cn",
        { uploads: { bucket: "gitlab", prefix: "uploads" } }
      ])
      const azurite = yield* decode(
        JSON.stringify({
          connection: { ...azure, endpoint: "http://127.0.0.1:10000/devstoreaccount1/" },
          objects: { uploads: { bucket: "c" } }
        })
      )
      assert.strictEqual(
        azurite._tag === "Azure" && azurite.connection.serviceUrl,
        "http://127.0.0.1:10000/devstoreaccount1"
      )
    }))
})

/** [name, value, a fragment the one-line error must contain, run through the real CLI too]. */
const BAD: ReadonlyArray<readonly [string, string, string, "cli" | "in-process"]> = [
  [
    "empty root (it would become the working directory)",
    JSON.stringify({ uploads: "" }),
    "must not be empty",
    "cli"
  ],
  ["relative root", JSON.stringify({ uploads: "objects/uploads" }), "must be an absolute path", "cli"],
  ["the filesystem root", JSON.stringify({ uploads: "/" }), "must not be /", "cli"],
  ["unknown location (a typo)", JSON.stringify({ uplaods: "/srv/uploads" }), "unknown location \"uplaods\"", "cli"],
  [
    "unknown location, consolidated",
    JSON.stringify({ connection: aws(), objects: { artifact: { bucket: "a" } } }),
    "unknown location \"artifact\"",
    "cli"
  ],
  [
    "empty bucket",
    JSON.stringify({ connection: aws(), objects: { uploads: { bucket: "" } } }),
    "a bucket must be",
    "cli"
  ],
  [
    "AWS without a secret key",
    JSON.stringify({
      connection: { provider: "AWS", region: "r", aws_access_key_id: "AK" },
      objects: { uploads: { bucket: "u" } }
    }),
    "aws_secret_access_key",
    "cli"
  ],
  [
    "AzureRM without an access key",
    JSON.stringify({
      connection: { provider: "AzureRM", azure_storage_account_name: "a" },
      objects: { uploads: { bucket: "c" } }
    }),
    "azure_storage_access_key",
    "cli"
  ],
  [
    "not JSON (with a secret in it)",
    `{"connection": {"provider": "AWS", "aws_secret_access_key": "${SECRET}"`,
    "valid JSON",
    "cli"
  ],
  [
    "empty root, consolidated",
    JSON.stringify({ objects: { uploads: { root: "" } } }),
    "must not be empty",
    "in-process"
  ],
  ["root that resolves to /", JSON.stringify({ uploads: "/srv/../" }), "must not be /", "in-process"],
  [
    "bucket with a .. prefix",
    JSON.stringify({ connection: aws(), objects: { uploads: { bucket: "b/../other" } } }),
    "must not contain empty",
    "in-process"
  ],
  [
    "bucket with no name",
    JSON.stringify({ connection: aws(), objects: { uploads: { bucket: "/prefix" } } }),
    "a bucket must be",
    "in-process"
  ],
  [
    "AWS without a region",
    JSON.stringify({ connection: aws({ region: undefined }), objects: { uploads: { bucket: "u" } } }),
    "region",
    "in-process"
  ],
  [
    "AWS with an empty secret",
    JSON.stringify({ connection: aws({ aws_secret_access_key: "" }), objects: { uploads: { bucket: "u" } } }),
    "aws_secret_access_key",
    "in-process"
  ],
  [
    "AWS with a non-string secret",
    JSON.stringify({ connection: aws({ aws_secret_access_key: 12345678 }), objects: { uploads: { bucket: "u" } } }),
    "aws_secret_access_key",
    "in-process"
  ],
  [
    "AzureRM without an account name",
    JSON.stringify({
      connection: { provider: "AzureRM", azure_storage_access_key: SECRET },
      objects: { uploads: { bucket: "c" } }
    }),
    "azure_storage_account_name",
    "in-process"
  ],
  [
    "an unknown provider",
    JSON.stringify({ connection: { provider: "Google" }, objects: {} }),
    "provider must be one of AWS, AzureRM, Local",
    "in-process"
  ],
  [
    "a root under a bucket provider",
    JSON.stringify({ connection: aws(), objects: { uploads: { root: "/srv/u" } } }),
    "takes a bucket, not a root",
    "in-process"
  ],
  [
    "both a root and a bucket",
    JSON.stringify({
      connection: { provider: "Local", local_root: "/srv" },
      objects: { uploads: { root: "/srv/u", bucket: "u" } }
    }),
    "either bucket or root",
    "in-process"
  ],
  [
    "a bucket without a connection",
    JSON.stringify({ objects: { uploads: { bucket: "u" } } }),
    "local_root",
    "in-process"
  ],
  [
    "an endpoint that is not a URL",
    JSON.stringify({ connection: aws({ endpoint: "127.0.0.1:9000" }), objects: { uploads: { bucket: "u" } } }),
    "must be an http(s) URL",
    "in-process"
  ],
  ["a JSON array", "[\"/srv/uploads\"]", "Expected object", "in-process"]
]

describe("SWEEPER_OBJECT_STORAGE bad values: decoding fails with a message naming what is wrong", () => {
  for (const [name, value, fragment] of BAD) {
    it.effect(name, () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(decode(value))
        assert.include(error.message, "SWEEPER_OBJECT_STORAGE")
        assert.include(error.message, fragment)
        assert.notInclude(error.message, SECRET)
      }))
  }
})

describe("SWEEPER_OBJECT_STORAGE bad values: real CLI, exit 2, one line", () => {
  // Each is a process start (≈1.5 s on an idle machine): the issue's own values, one per kind.
  for (const [name, value, fragment] of BAD.filter(([, , , how]) => how === "cli")) {
    it.live(name, () =>
      Effect.gen(function*() {
        const dataDir = yield* Effect.acquireRelease(
          Effect.promise(() => mkdtemp(join(tmpdir(), "sweeper-objcfg-"))),
          (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
        )
        const result = yield* Effect.promise(() =>
          runCli(["run", "delete-stale-direct-uploads", "--json"], {
            SWEEPER_OBJECT_STORAGE: value,
            SWEEPER_DATA_DIR: dataDir
          })
        )
        assert.strictEqual(result.code, 2, `${result.stderr}\n${result.stdout}`)
        const lines = result.stderr.split("\n").filter((line) => line.trim().length > 0)
        assert.lengthOf(lines, 1, result.stderr)
        assert.include(lines[0]!, "SWEEPER_OBJECT_STORAGE")
        assert.include(lines[0]!, fragment)
        assert.notInclude(result.stderr + result.stdout, SECRET)
        assert.strictEqual(result.stdout, "")
      }), 60_000)
  }
})
