/**
 * `SWEEPER_OBJECT_STORAGE`, decoded and validated at the edge so that no later step can
 * turn a bad value into a wrong delete. Two JSON forms:
 *
 * - GitLab's consolidated object-store form:
 *   `{"connection": {"provider": "AWS" | "AzureRM" | "Local", …},`
 *   ` "objects": {"<location>": {"bucket": "name[/prefix]"} | {"root": "/abs/dir"}}}`
 *   (`connection` may be left out when every object names a `root`);
 * - the older location → root form: `{"artifacts": "/srv/objects/artifacts"}`.
 *
 * Why so strict: an empty root once resolved to the working directory and a stale field deleted a
 * file there; an unknown location key (a typo) silently leaves that location's objects behind. So
 * roots are absolute, non-empty and not `/`, locations are GitLab's own, buckets are non-empty, and
 * each provider's required keys are present. Secrets are decoded straight into `Redacted`, and the
 * error messages never quote the input (a JSON syntax error would otherwise echo a secret).
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import * as SchemaGetter from "effect/SchemaGetter"
import * as SchemaIssue from "effect/SchemaIssue"
import { isAbsolute, join, resolve } from "node:path"
import { type Location, LOCATIONS } from "../domain/DirectUpload.ts"
import { redact } from "../domain/Redaction.ts"

/** A bucket (S3) or container (Azure) and the key prefix every object of the location sits under. */
export interface BucketRef {
  readonly bucket: string
  /** Without leading or trailing `/`; "" for none. */
  readonly prefix: string
}

export interface S3Connection {
  readonly region: string
  /** Both None with `use_iam_profile`: the SDK's default credential chain. */
  readonly accessKeyId: Option.Option<Redacted.Redacted<string>>
  readonly secretAccessKey: Option.Option<Redacted.Redacted<string>>
  /** An S3-compatible server (MinIO, Ceph, s3rver); None for AWS itself. */
  readonly endpoint: Option.Option<string>
  /** `path_style`: `http://host/bucket/key` instead of `http://bucket.host/key`. */
  readonly pathStyle: boolean
}

export interface AzureConnection {
  readonly accountName: string
  readonly accessKey: Redacted.Redacted<string>
  /** The blob service URL: `endpoint` if given (azurite), else `https://<account>.<azure_storage_domain>`. */
  readonly serviceUrl: string
}

export type ObjectStorageSettings =
  | { readonly _tag: "Local"; readonly roots: Partial<Record<Location, string>> }
  | { readonly _tag: "S3"; readonly connection: S3Connection; readonly buckets: Partial<Record<Location, BucketRef>> }
  | {
    readonly _tag: "Azure"
    readonly connection: AzureConnection
    readonly containers: Partial<Record<Location, BucketRef>>
  }

/** Nothing configured: every location is without a store (its stale entries are `skippedNoStore`). */
export const NoObjectStorage: ObjectStorageSettings = { _tag: "Local", roots: {} }

/** The key of `<path>` in a bucket: after the bucket's prefix, if any. */
export const objectKey = (ref: BucketRef, path: string): string => (ref.prefix === "" ? path : `${ref.prefix}/${path}`)

/**
 * An endpoint for a log line: without user information (the SDKs take credentials from the
 * configuration, never from the URL, so it says nothing about where objects go), and any secret
 * left in it, a SAS token in a query say, masked.
 */
const forLog = (url: string): string => {
  const parsed = new URL(url)
  parsed.username = ""
  parsed.password = ""
  return redact(parsed.toString().replace(/\/$/, ""))
}

/** Locations this configuration has a store for (for start-up logs; never secrets). */
export const describeObjectStorage = (settings: ObjectStorageSettings): string => {
  switch (settings._tag) {
    case "Local":
      return Object.keys(settings.roots).length === 0
        ? "none"
        : `local (${Object.entries(settings.roots).map(([location, root]) => `${location} → ${root}`).join(", ")})`
    case "S3":
      return `S3 ${
        Option.match(settings.connection.endpoint, {
          onNone: () => `AWS ${settings.connection.region}`,
          onSome: forLog
        })
      } (${
        Object.entries(settings.buckets).map(([location, ref]) =>
          `${location} → ${ref.bucket}${ref.prefix === "" ? "" : `/${ref.prefix}`}`
        ).join(", ")
      })`
    case "Azure":
      return `Azure ${forLog(settings.connection.serviceUrl)} (${
        Object.entries(settings.containers).map(([location, ref]) =>
          `${location} → ${ref.bucket}${ref.prefix === "" ? "" : `/${ref.prefix}`}`
        ).join(", ")
      })`
  }
}

// ---------------------------------------------------------------------------------------------
// The raw JSON shapes.

const isLocation = (key: string): key is Location => (LOCATIONS as ReadonlyArray<string>).includes(key)

/** Every key of a location map is one of GitLab's locations. */
const knownLocations = Schema.makeFilter((record: Readonly<Record<string, unknown>>) => {
  const unknown = Object.keys(record).filter((key) => !isLocation(key))
  return unknown.length === 0
    ? undefined
    : `unknown location ${unknown.map((key) => JSON.stringify(key)).join(", ")} (known: ${LOCATIONS.join(", ")})`
})

const Root = Schema.String.check(Schema.makeFilter((root: string) =>
  root.length === 0
    ? "a root must not be empty (it would resolve to the working directory)"
    : !isAbsolute(root)
    ? `a root must be an absolute path, got ${JSON.stringify(root)}`
    : resolve(root) === "/"
    ? "a root must not be / (the whole filesystem)"
    : undefined
))

/** `name[/prefix]`: a non-empty name; prefix segments that are neither empty, `.` nor `..`. */
const BucketName = Schema.String.check(Schema.makeFilter((text: string) => {
  const [name, ...prefix] = text.replace(/\/+$/, "").split("/")
  if (name === undefined || name.length === 0) {
    return `a bucket must be "name" or "name/prefix", got ${JSON.stringify(text)}`
  }
  if (
    name === "." || name === ".." || prefix.some((segment) => segment === "" || segment === "." || segment === "..")
  ) {
    return `a bucket's name and prefix must not contain empty, "." or ".." segments, got ${JSON.stringify(text)}`
  }
  return undefined
}))

const toBucketRef = (text: string): BucketRef => {
  const [name, ...prefix] = text.replace(/\/+$/, "").split("/")
  return { bucket: name!, prefix: prefix.join("/") }
}

const NonEmpty = Schema.String.check(
  Schema.makeFilter((text: string) => text.length > 0 ? undefined : "must not be empty")
)
const Secret = Schema.RedactedFromValue(NonEmpty)
const Url = Schema.String.check(
  Schema.makeFilter((text: string) =>
    URL.canParse(text) && /^https?:$/.test(new URL(text).protocol)
      ? undefined
      : `must be an http(s) URL, got ${JSON.stringify(redact(text))}`
  )
)

const ObjectEntry = Schema.Struct({
  bucket: Schema.optionalKey(BucketName),
  root: Schema.optionalKey(Root),
  /** GitLab's per-object switch: false means no store for this location. */
  enabled: Schema.optionalKey(Schema.Boolean)
}).check(Schema.makeFilter((entry) =>
  entry.bucket !== undefined && entry.root !== undefined
    ? "give either bucket or root, not both"
    : entry.bucket === undefined && entry.root === undefined && entry.enabled !== false
    ? "needs a bucket (AWS, AzureRM, Local with local_root) or a root (Local)"
    : undefined
))

const Objects = Schema.Record(Schema.String, ObjectEntry).check(knownLocations)

const AwsConnection = Schema.Struct({
  provider: Schema.Literal("AWS"),
  region: NonEmpty,
  aws_access_key_id: Schema.optionalKey(Secret),
  aws_secret_access_key: Schema.optionalKey(Secret),
  use_iam_profile: Schema.optionalKey(Schema.Boolean),
  endpoint: Schema.optionalKey(Url),
  path_style: Schema.optionalKey(Schema.Boolean)
}).check(
  Schema.makeFilter((c) =>
    c.use_iam_profile === true || (c.aws_access_key_id !== undefined && c.aws_secret_access_key !== undefined)
      ? undefined
      : "provider AWS needs aws_access_key_id and aws_secret_access_key (or use_iam_profile: true)"
  )
)

const AzureConnection = Schema.Struct({
  provider: Schema.Literal("AzureRM"),
  azure_storage_account_name: NonEmpty,
  azure_storage_access_key: Secret,
  azure_storage_domain: Schema.optionalKey(NonEmpty),
  /** Not GitLab's: a full blob service URL, for azurite (`http://127.0.0.1:10000/devstoreaccount1`). */
  endpoint: Schema.optionalKey(Url)
})

const LocalConnection = Schema.Struct({
  provider: Schema.Literal("Local"),
  /** fog-local's root: a `bucket` then names the directory `<local_root>/<name>/<prefix>`. */
  local_root: Schema.optionalKey(Root)
})

const PROVIDERS = ["AWS", "AzureRM", "Local"] as const

const Consolidated = Schema.Struct({
  enabled: Schema.optionalKey(Schema.Boolean),
  connection: Schema.optionalKey(Schema.Union([AwsConnection, AzureConnection, LocalConnection])),
  objects: Objects
})

const Legacy = Schema.Record(Schema.String, Root).check(knownLocations)

// ---------------------------------------------------------------------------------------------
// Raw → settings.

type Fail = { readonly path: ReadonlyArray<string>; readonly message: string }

const toSettings = (raw: typeof Consolidated.Type): ObjectStorageSettings | Fail => {
  const enabled = Object.entries(raw.objects).filter(([, entry]) => entry.enabled !== false) as Array<
    [Location, typeof ObjectEntry.Type]
  >
  if (raw.enabled === false) return NoObjectStorage
  const connection = raw.connection
  if (connection === undefined || connection.provider === "Local") {
    const roots: Partial<Record<Location, string>> = {}
    for (const [location, entry] of enabled) {
      if (entry.root !== undefined) {
        roots[location] = entry.root
      } else {
        const localRoot = connection?.local_root
        if (localRoot === undefined) {
          return {
            path: ["objects", location, "bucket"],
            message:
              "a bucket needs connection {\"provider\": \"Local\", \"local_root\": \"/abs/dir\"} (or give a root)"
          }
        }
        const ref = toBucketRef(entry.bucket!)
        roots[location] = join(localRoot, ref.bucket, ref.prefix)
      }
    }
    return { _tag: "Local", roots }
  }
  const refs: Partial<Record<Location, BucketRef>> = {}
  for (const [location, entry] of enabled) {
    if (entry.bucket === undefined) {
      return {
        path: ["objects", location, "root"],
        message: `provider ${connection.provider} takes a bucket, not a root`
      }
    }
    refs[location] = toBucketRef(entry.bucket)
  }
  if (connection.provider === "AWS") {
    return {
      _tag: "S3",
      connection: {
        region: connection.region,
        accessKeyId: Option.fromUndefinedOr(connection.aws_access_key_id),
        secretAccessKey: Option.fromUndefinedOr(connection.aws_secret_access_key),
        endpoint: Option.fromUndefinedOr(connection.endpoint),
        pathStyle: connection.path_style ?? false
      },
      buckets: refs
    }
  }
  return {
    _tag: "Azure",
    connection: {
      accountName: connection.azure_storage_account_name,
      accessKey: connection.azure_storage_access_key,
      serviceUrl: connection.endpoint?.replace(/\/+$/, "") ??
        `https://${connection.azure_storage_account_name}.${connection.azure_storage_domain ?? "blob.core.windows.net"}`
    },
    containers: refs
  }
}

const isSettings = (u: unknown): u is ObjectStorageSettings =>
  typeof u === "object" && u !== null && "_tag" in u && (u._tag === "Local" || u._tag === "S3" || u._tag === "Azure")

const SettingsType = Schema.declare(isSettings)

const issueAt = (path: ReadonlyArray<string>, message: string): SchemaIssue.Issue =>
  new SchemaIssue.Pointer(path, new SchemaIssue.InvalidValue({ message }))

/** Either form, told apart by GitLab's `connection`/`objects` keys (neither is a location). */
export const ObjectStorageJson = Schema.fromJsonString(Schema.Unknown).pipe(
  Schema.decodeTo(SettingsType, {
    decode: SchemaGetter.transformEffect((raw: unknown) => {
      const consolidated = typeof raw === "object" && raw !== null && !Array.isArray(raw) &&
        ("connection" in raw || "objects" in raw)
      if (!consolidated) {
        return Schema.decodeUnknownEffect(Legacy)(raw).pipe(
          Effect.map((roots): ObjectStorageSettings => ({ _tag: "Local", roots })),
          Effect.mapError((error) => error.issue)
        )
      }
      // A provider Sweeper does not know would otherwise be reported as "none of three shapes matched".
      const provider = "connection" in raw && typeof raw.connection === "object" && raw.connection !== null &&
          "provider" in raw.connection
        ? raw.connection.provider
        : undefined
      if (provider !== undefined && !PROVIDERS.includes(provider as never)) {
        return Effect.fail(
          issueAt(
            ["connection", "provider"],
            `provider must be one of ${PROVIDERS.join(", ")}, got ${JSON.stringify(provider)}`
          )
        )
      }
      return Schema.decodeUnknownEffect(Consolidated)(raw).pipe(
        Effect.mapError((error) => error.issue),
        Effect.flatMap((decoded) => {
          const settings = toSettings(decoded)
          return "_tag" in settings ? Effect.succeed(settings) : Effect.fail(issueAt(settings.path, settings.message))
        })
      )
    }),
    encode: SchemaGetter.forbidden(() => "SWEEPER_OBJECT_STORAGE is never encoded")
  })
)
