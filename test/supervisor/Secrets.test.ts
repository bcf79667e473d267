/**
 * No password Sweeper was given is printed: in each form a driver accepts, through each place that
 * prints a URL — the start-up "Backends" line and `doctor` (describeBackends), the dashboard's
 * databases (describePostgres), errors (describeError), a configuration error quoting a value, and
 * the CLI's "Talking to" line for SWEEPER_URL — and, whatever a log line quotes, the logger.
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Effect, Logger, Option, Redacted } from "effect"
import { SweeperConfig } from "../../src/config/Config.ts"
import { foldHistory } from "../../src/domain/BatchState.ts"
import { describeError } from "../../src/domain/Errors.ts"
import { runDetailOf } from "../../src/layers/postgres/RunHistorySql.ts"
import { describeBackends, describePostgres } from "../../src/supervisor/App.ts"
import { jsonLogger, textLogger } from "../../src/supervisor/Logging.ts"
import { runCli } from "../support/cli.ts"

/** Every secret below contains this; none may be printed. */
const SECRET = "s3cret"

const settings = (env: {
  readonly main: string
  readonly ci?: string
  readonly redis: string
  readonly queues?: string
}) =>
  Effect.provide(
    SweeperConfig.useSync((loaded) => loaded),
    SweeperConfig.layer
  ).pipe(Effect.provideService(
    ConfigProvider.ConfigProvider,
    ConfigProvider.fromEnv({
      env: {
        DATABASE_URL: env.main,
        ...(env.ci === undefined ? {} : { CI_DATABASE_URL: env.ci }),
        REDIS_URL: env.redis,
        ...(env.queues === undefined ? {} : { SWEEPER_QUEUES_REDIS_URL: env.queues }),
        SWEEPER_OBJECT_STORAGE: JSON.stringify({
          connection: {
            provider: "AWS",
            region: "us-east-1",
            aws_access_key_id: "AKIAEXAMPLE",
            aws_secret_access_key: `${SECRET}-aws`,
            endpoint: `http://minio:${SECRET}-endpoint@127.0.0.1:9000`
          },
          objects: { artifacts: { bucket: "artifacts" } }
        })
      }
    })
  ))

/** URLs in each form PostgreSQL's and Redis's drivers take a password in. */
const FORMS = [
  {
    main: `postgres://gitlab:${SECRET}-userinfo@db:5432/gitlabhq_production`,
    ci: `postgresql://gitlab@db:5432/gitlabhq_ci?password=${SECRET}-query&sslmode=require`,
    redis: `redis://:${SECRET}-redis@cache:6379/0`,
    queues: `rediss://default:${SECRET}-tls@queues:6380`
  },
  {
    main: `postgres://gitlab@db/gitlab?sslmode=verify-full&sslpassword=${SECRET}-key&password=${SECRET}-q2`,
    ci: `postgres://gitlab:${SECRET}@with@at@db/ci`,
    redis: `redis://cache:6379/0?password=${SECRET}-redis-query`,
    queues: `redis://u:${SECRET}-c1@n1:7000,redis://u:${SECRET}-c2@n2:7001`
  },
  {
    main: `postgres://gitlab:${SECRET} with space@db/gitlab`,
    redis: `redis://cache:6379?sentinelPassword=${SECRET}-sentinel&family=4`
  }
]

describe("secrets are never printed", () => {
  it.effect("the Backends line, doctor and the dashboard name each database and store without its password", () =>
    Effect.gen(function*() {
      for (const form of FORMS) {
        const loaded = yield* settings(form)
        const printed = JSON.stringify([describeBackends(loaded), describePostgres(loaded)])
        assert.notInclude(printed, SECRET, printed)
        // What is left still says where: host, database, the role.
        assert.include(printed, "db")
        assert.include(printed, "gitlab")
        assert.include(printed, "cache")
      }
    }))

  it("an error quoting a URL shows none of its secrets", () => {
    for (const url of [...FORMS.flatMap((form) => [form.main, form.redis]), FORMS[0]!.ci!, FORMS[1]!.queues!]) {
      const text = describeError(new Error(`could not connect to ${url}: connection refused`))
      assert.notInclude(text, SECRET, text)
      assert.include(text, "connection refused")
    }
  })

  it.effect("a configuration error quoting an object-storage endpoint with credentials", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(
        Effect.provide(SweeperConfig.useSync((loaded) => loaded), SweeperConfig.layer).pipe(
          Effect.provideService(
            ConfigProvider.ConfigProvider,
            ConfigProvider.fromEnv({
              env: {
                SWEEPER_OBJECT_STORAGE: JSON.stringify({
                  connection: {
                    provider: "AWS",
                    region: "us-east-1",
                    use_iam_profile: true,
                    endpoint: `ftp://minio:${SECRET}-endpoint@127.0.0.1:9000`
                  },
                  objects: { artifacts: { bucket: "artifacts" } }
                })
              }
            })
          )
        )
      )
      assert.notInclude(error.message, SECRET, error.message)
      assert.include(error.message, "endpoint")
    }))

  it.effect("a log line quoting a URL, in its message, a field or its cause, in either format", () =>
    Effect.gen(function*() {
      const lines: Array<string> = []
      const url = FORMS[1]!.main
      const logged = Effect.logWarning(`cannot reach ${url}`, { url, nested: { url } }).pipe(
        Effect.annotateLogs({ target: FORMS[0]!.ci! }),
        Effect.andThen(Effect.logError("failed", new Error(`connect ${FORMS[0]!.main}`)))
      )
      const write = (line: string) => {
        lines.push(line)
      }
      yield* logged.pipe(Effect.provide(Logger.layer([jsonLogger("n", write), textLogger("n", write)])))
      assert.lengthOf(lines, 4)
      for (const line of lines) assert.notInclude(line, SECRET, line)
    }))

  it("a run error a ledger kept from before is shown redacted on the card, the run page and the API", () => {
    const finished = {
      id: 2,
      stream: "batch:stuck-export-jobs",
      type: "RunFinished",
      data: { outcome: "failed", duration_ms: 5, error: `SqlError: cannot reach ${FORMS[1]!.main}` },
      runId: "00000000-0000-4000-8000-000000000000",
      occurredAt: new Date("2026-01-01T00:00:00Z")
    }
    const shown = [foldHistory([finished]).lastRun?.error, runDetailOf(finished.runId, undefined, finished, [])?.error]
    for (const text of shown) {
      assert.include(text, "cannot reach postgres://gitlab@db/gitlab")
      assert.notInclude(text, SECRET)
    }
  })

  it.live("SWEEPER_URL with credentials or a token in its query is logged without them", () =>
    Effect.gen(function*() {
      const result = yield* Effect.promise(() =>
        runCli(["status"], { SWEEPER_URL: `http://operator:${SECRET}-basic@127.0.0.1:9/?token=${SECRET}-token` })
      )
      const output = result.stdout + result.stderr
      assert.include(output, "127.0.0.1:9")
      assert.notInclude(output, SECRET, output)
    }), 60_000)
})

// The settings loader must not be what hides them: the URLs are really configured.
it.effect("(the URLs above reach the settings unchanged)", () =>
  Effect.gen(function*() {
    const loaded = yield* settings(FORMS[0]!)
    assert.include(Redacted.value(Option.getOrThrow(loaded.databaseUrl)), SECRET)
  }))
