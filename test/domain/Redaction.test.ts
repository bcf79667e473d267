/** The one redaction: each form a driver or store takes a secret in, masked; where it points, kept. */
import { assert, describe, it } from "@effect/vitest"
import { redact } from "../../src/domain/Redaction.ts"

const cases: ReadonlyArray<readonly [string, string]> = [
  // A URL's password: PostgreSQL, Redis (user-less, TLS), any scheme.
  ["postgres://gitlab:hunter2@db:5432/gitlab", "postgres://gitlab:***@db:5432/gitlab"],
  ["postgresql://gitlab:hunter2@db/gitlab?sslmode=require", "postgresql://gitlab:***@db/gitlab?sslmode=require"],
  ["redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"],
  ["rediss://default:hunter2@cache:6380", "rediss://default:***@cache:6380"],
  ["http://operator:hunter2@127.0.0.1:9394/", "http://operator:***@127.0.0.1:9394/"],
  // Characters a parser accepts in a password: `@` (it takes the last one), spaces, `:`.
  ["postgres://gitlab:p@ss@w0rd@db/gitlab", "postgres://gitlab:***@db/gitlab"],
  ["postgres://gitlab:two words@db/gitlab", "postgres://gitlab:***@db/gitlab"],
  ["redis://u:a:b:c@cache:6379", "redis://u:***@cache:6379"],
  // One no parser accepts (a `/` in it), as a message might still quote it.
  ["postgres://gitlab:pass/word@db/gitlab", "postgres://gitlab:***@db/gitlab"],
  // A cluster's seed nodes, each its own URL.
  [
    "redis://u:one@n1:7000,redis://n2:7001,redis://u:three@n3:7002",
    "redis://u:***@n1:7000,redis://n2:7001,redis://u:***@n3:7002"
  ],
  // Parameters: libpq's, ioredis's.
  ["postgres://gitlab@db/gitlab?password=hunter2", "postgres://gitlab@db/gitlab?password=***"],
  [
    "postgres://db/gitlab?sslmode=verify-full&sslpassword=hunter2&user=gitlab&password=x",
    "postgres://db/gitlab?sslmode=verify-full&sslpassword=***&user=gitlab&password=***"
  ],
  ["redis://cache:6379/0?password=hunter2&db=1", "redis://cache:6379/0?password=***&db=1"],
  ["redis://cache?sentinelPassword=hunter2&family=4", "redis://cache?sentinelPassword=***&family=4"],
  ["redis://cache?pass=hunter2", "redis://cache?pass=***"],
  // libpq keyword strings, quoted or not.
  ["host=db user=gitlab password=hunter2 dbname=gitlab", "host=db user=gitlab password=*** dbname=gitlab"],
  ["host=db password='two words' dbname=gitlab", "host=db password=*** dbname=gitlab"],
  // Object storage: a presigned S3 URL, an Azure SAS URL and connection string, keys in JSON.
  [
    "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20260101&X-Amz-Signature=abc123",
    "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***&X-Amz-Signature=***"
  ],
  [
    "https://acct.blob.core.windows.net/c/o?sv=2022-11-02&se=2026-01-01&sp=rd&sig=AbC%2Bd%3D",
    "https://acct.blob.core.windows.net/c/o?sv=2022-11-02&se=2026-01-01&sp=rd&sig=***"
  ],
  [
    "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5==;EndpointSuffix=core.windows.net",
    "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net"
  ],
  [
    "BlobEndpoint=https://acct;SharedAccessSignature=sv=1&sig=x",
    "BlobEndpoint=https://acct;SharedAccessSignature=***&sig=***"
  ],
  [
    `{"aws_access_key_id":"AKIA","aws_secret_access_key":"hunter2","azure_storage_access_key": "a2V5"}`,
    `{"aws_access_key_id":"AKIA","aws_secret_access_key":"***","azure_storage_access_key": "***"}`
  ],
  // SWEEPER_URL with a token in its query.
  ["http://127.0.0.1:9394/?token=hunter2", "http://127.0.0.1:9394/?token=***"],
  // Inside a message, with text around it.
  [
    "cannot reach postgres://gitlab:hunter2@db:5432/gitlab (timeout); retrying",
    "cannot reach postgres://gitlab:***@db:5432/gitlab (timeout); retrying"
  ],
  ["GET http://u:hunter2@h:1/?token=hunter2/api/batches): refused", "GET http://u:***@h:1/?token=***): refused"]
]

/** Left as they are: nothing secret in them. */
const untouched = [
  "postgres://gitlab@db:5432/gitlab?sslmode=require&sslkey=/etc/key.pem&application_name=sweeper",
  "redis://cache:6379/0",
  "http://127.0.0.1:9394 (SWEEPER_URL)",
  "Talking to the supervisor at http://127.0.0.1:9394",
  "aws_access_key_id=AKIA region=us-east-1",
  "embedded PGlite (/var/lib/sweeper/pgdata)",
  "a bypass=1 and passport=2 are not passwords",
  "redis://h1:7000,redis://h2:7001"
]

describe("redact", () => {
  it("masks each form", () => {
    for (const [input, expected] of cases) assert.strictEqual(redact(input), expected, input)
  })

  it("leaves text without a secret as it is", () => {
    for (const text of untouched) assert.strictEqual(redact(text), text)
  })

  it("is idempotent: a redacted text stays as it is", () => {
    for (const [, expected] of cases) assert.strictEqual(redact(expected), expected)
  })
})
