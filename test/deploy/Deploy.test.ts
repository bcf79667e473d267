/**
 * deploy/ is checked by the tools that will read it, and against what Sweeper really reads and
 * exposes, so none of it can drift from the code:
 *
 * - the alert rules pass `promtool check rules` and their unit tests (`promtool test rules`), and
 *   every alert has a firing and a non-firing case;
 * - the systemd unit passes `systemd-analyze verify` (in a scratch root holding the ExecStart path)
 *   and its offline security review, and its stop timeout covers the default shutdown grace;
 * - the environment example lists exactly the variables Sweeper's configuration reads (recorded
 *   through a ConfigProvider), loads as valid configuration after `sh` has read it, and shows the
 *   real defaults;
 * - every metric the dashboard and the rules query is one a started supervisor exposes on /metrics
 *   (or, for repair counters that appear with the first repair, one the metrics module renders),
 *   and every dashboard query parses as PromQL.
 *
 * promtool (Debian's `prometheus`) and systemd-analyze (`systemd`) are required: a missing tool
 * fails these tests, it never skips them (.ci/run installs both).
 */
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect, Layer, Metric, Option } from "effect"
import { Redis as IORedis } from "ioredis"
import { spawnSync } from "node:child_process"
import { chmodSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { configureBatches, SweeperConfig, type SweeperSettings } from "../../src/config/Config.ts"
import { workerKeys } from "../../src/domain/ConcurrencyLimit.ts"
import { leaseTtlVariable } from "../../src/domain/Schedule.ts"
import { lastSuccessAgeSeconds } from "../../src/http/Http.ts"
import { MetricsPrometheus } from "../../src/layers/prometheus/MetricsPrometheus.ts"
import { batches } from "../../src/programs/index.ts"
import * as Metrics from "../../src/services/Metrics.ts"
import { LoggingLive } from "../../src/supervisor/Logging.ts"
import { freshDatabase } from "../support/postgres.ts"
import { startSweeper, waitFor } from "../support/processes.ts"
import { freshRedisUrl } from "../support/redis.ts"

const root = fileURLToPath(new URL("../..", import.meta.url))
const deploy = (path: string) => join(root, "deploy", path)
const RULES = deploy("prometheus/sweeper.rules.yml")
const RULE_TESTS = deploy("prometheus/sweeper.rules.test.yml")
const UNIT = deploy("systemd/sweeper.service")
const ENV_EXAMPLE = deploy("sweeper.env.example")
const DASHBOARD = deploy("grafana/sweeper.json")

/** Runs a required tool; a missing one is a failure with the package to install, never a skip. */
const tool = (command: string, args: ReadonlyArray<string>, options: { cwd?: string; pkg: string }) => {
  const result = spawnSync(command, args, { cwd: options.cwd ?? root, encoding: "utf8" })
  if (result.error !== undefined) {
    throw new Error(`${command} is required (Debian package ${options.pkg}): ${result.error.message}`)
  }
  return { status: result.status, out: `${result.stdout}${result.stderr}`, stderr: result.stderr }
}

const rulesText = readFileSync(RULES, "utf8")
const alertNames = [...rulesText.matchAll(/^\s*- alert: (\w+)$/gm)].map((m) => m[1]!)

/** Metric-like identifiers a PromQL expression reads: Sweeper's prefixes, and `up`. */
const metricNames = (expr: string): Array<string> => {
  // Label values in quotes are not metric names ({batch="sweeper_x"} would otherwise count).
  const unquoted = expr.replace(/"(?:[^"\\]|\\.)*"/g, "\"\"")
  return [...unquoted.matchAll(/\b(?:sweeper|sidekiq|nodejs|process)_[a-z0-9_]+|\bup\b(?=\s*[{[)]|$)/g)].map((m) =>
    m[0]
  )
}

/** Labels Prometheus adds to every scraped series: not Sweeper's to expose. */
const TARGET_LABELS = ["job", "instance"]

/** Each metric's label names in Prometheus text. */
const exposedLabels = (text: string) => {
  const labels = new Map<string, Set<string>>()
  for (const line of text.split("\n")) {
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? /.exec(line)
    if (match === null) continue
    const set = labels.get(match[1]!) ?? new Set<string>()
    for (const label of (match[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="/g)) set.add(label[1]!)
    labels.set(match[1]!, set)
  }
  return labels
}

/**
 * The label names an expression selects on or groups by, each with the metrics it must be a label
 * of: `m{l="…"}` needs l on m; `sum by (l) (…)` needs l on one of the metrics inside the
 * aggregation. Target labels are left out.
 */
const labelUses = (expr: string): Array<{ label: string; metrics: Array<string> }> => {
  const uses: Array<{ label: string; metrics: Array<string> }> = []
  for (const selector of expr.matchAll(/\b([a-z][a-z0-9_]*)\{([^}]*)\}/g)) {
    const names = metricNames(selector[1]!)
    if (names.length === 0 || names[0] === "up") continue
    for (const matcher of selector[2]!.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)/g)) {
      uses.push({ label: matcher[1]!, metrics: names })
    }
  }
  for (const grouping of expr.matchAll(/\bby \(([^)]*)\)\s*\(/g)) {
    // The aggregated expression: from the "(" after the grouping to its matching ")".
    let depth = 0
    let end = grouping.index + grouping[0].length - 1
    for (; end < expr.length; end++) {
      if (expr[end] === "(") depth++
      if (expr[end] === ")" && --depth === 0) break
    }
    const inner = metricNames(expr.slice(grouping.index + grouping[0].length, end)).filter((name) => name !== "up")
    for (const label of grouping[1]!.split(",").map((l) => l.trim()).filter((l) => l !== "")) {
      uses.push({ label, metrics: inner })
    }
  }
  return uses.filter((use) => !TARGET_LABELS.includes(use.label))
}

const ruleExprs = (): Array<string> => {
  // Each `expr:` is one line or a `|` block indented below it.
  const exprs: Array<string> = []
  const lines = rulesText.split("\n")
  lines.forEach((line, i) => {
    const match = /^(\s*)expr: (.*)$/.exec(line)
    if (match === null) return
    if (match[2] !== "|") return exprs.push(match[2]!)
    const body: Array<string> = []
    for (let j = i + 1; j < lines.length && (lines[j]!.startsWith(`${match[1]}  `) || lines[j]!.trim() === ""); j++) {
      body.push(lines[j]!)
    }
    exprs.push(body.join("\n"))
  })
  return exprs
}

describe("Prometheus alert rules", () => {
  it("pass promtool check rules", () => {
    const check = tool("promtool", ["check", "rules", RULES], { pkg: "prometheus" })
    assert.strictEqual(check.status, 0, check.out)
    assert.include(check.out, `SUCCESS: ${alertNames.length} rules found`)
  })

  it("pass their unit tests, which cover every alert firing and not firing", () => {
    const run = tool("promtool", ["test", "rules", RULE_TESTS], { cwd: deploy("prometheus"), pkg: "prometheus" })
    assert.strictEqual(run.status, 0, run.out)
    assert.include(run.out, "SUCCESS")
    assert.notInclude(run.out, "FAILED")

    const tests = readFileSync(RULE_TESTS, "utf8").split("\n")
    const firing = new Set<string>()
    const silent = new Set<string>()
    tests.forEach((line, i) => {
      const name = /^\s*alertname: (\w+)$/.exec(line)?.[1]
      if (name === undefined) return
      const expected = tests[i + 1]!.trim()
      if (expected === "exp_alerts: []") silent.add(name)
      else if (expected.startsWith("exp_alerts:")) firing.add(name)
    })
    assert.isAbove(alertNames.length, 8)
    assert.deepStrictEqual([...firing].sort(), [...alertNames].sort(), "every alert has a case where it fires")
    assert.deepStrictEqual([...silent].sort(), [...alertNames].sort(), "every alert has a case where it must not fire")
    for (const name of [...firing, ...silent]) assert.include(alertNames, name)
  })

  it("each alert carries severity, summary, description and a runbook hint", () => {
    const blocks = rulesText.split(/^\s*- alert: /m).slice(1)
    assert.strictEqual(blocks.length, alertNames.length)
    for (const block of blocks) {
      const name = block.split("\n")[0]
      assert.match(block, /severity: (critical|warning|info)\n/, `${name}: severity`)
      for (const key of ["summary", "description", "runbook"]) {
        assert.match(block, new RegExp(`\\n\\s+${key}: "`), `${name}: ${key}`)
      }
      assert.match(
        block,
        /runbook: "(README|docs\/[a-z-]+)\.md#[a-z-]+/,
        `${name}: runbook points at a section of README or a docs/ page`
      )
    }
    // The sections exist: GitHub's anchor of each heading of the page named (lower case,
    // punctuation dropped, spaces to hyphens).
    const anchorsOf = (page: string) =>
      readFileSync(join(root, page), "utf8").split("\n").filter((line) => /^#{1,6} /.test(line))
        .map((line) =>
          line.replace(/^#+ /, "").trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, "").replace(/\s/g, "-")
        )
    const referenced = [...rulesText.matchAll(/((?:README|docs\/[a-z-]+)\.md)#([a-z0-9-]+)/g)].map((m) => ({
      page: m[1]!,
      anchor: m[2]!
    }))
    assert.includeMembers(referenced.map(({ anchor }) => anchor), [
      "deploying",
      "failure-handling",
      "resume-across-stores-concurrency-limit-resume"
    ])
    for (const { anchor, page } of referenced) {
      assert.include(anchorsOf(page), anchor, `${page} has a section #${anchor}`)
    }
  })
})

describe("systemd unit", () => {
  const unit = readFileSync(UNIT, "utf8")
  const directive = (key: string) => new RegExp(`^${key}=(.*)$`, "m").exec(unit)?.[1]

  it("passes systemd-analyze verify and its offline security review", () => {
    // verify checks that ExecStart's binary exists and is executable: a scratch root holds the
    // installed layout (a stand-in executable) and the distribution's units the unit depends on.
    const scratch = mkdtempSync(join(tmpdir(), "sweeper-unit-"))
    try {
      const execStart = directive("ExecStart")!.split(/\s+/)
      const binary = join(scratch, execStart[0]!)
      mkdirSync(join(binary, ".."), { recursive: true })
      writeFileSync(binary, "#!/bin/sh\n")
      chmodSync(binary, 0o755)
      mkdirSync(join(scratch, "usr/lib/systemd"), { recursive: true })
      cpSync("/usr/lib/systemd/system", join(scratch, "usr/lib/systemd/system"), {
        recursive: true,
        verbatimSymlinks: true
      })
      mkdirSync(join(scratch, "etc/systemd/system"), { recursive: true })
      const installed = join(scratch, "etc/systemd/system/sweeper.service")
      cpSync(UNIT, installed)

      const verify = tool(
        "systemd-analyze",
        ["verify", "--man=no", "--generators=no", `--root=${scratch}`, installed],
        { pkg: "systemd" }
      )
      assert.strictEqual(verify.status, 0, verify.out)
      // Unknown keys and bad values are warnings with exit 0: any output is a failure.
      assert.strictEqual(verify.out.trim(), "", verify.out)

      // Exposure 0 (locked down) .. 10 (unsafe); the unit scores 1.7 ("OK"). Above 2.5 is a regression.
      const security = tool("systemd-analyze", [
        "security",
        "--offline=yes",
        "--threshold=25",
        `--root=${scratch}`,
        installed
      ], { pkg: "systemd" })
      assert.strictEqual(security.status, 0, security.out)
      assert.match(security.out, /Overall exposure level for sweeper\.service: [0-2]\.\d/)
    } finally {
      rmSync(scratch, { recursive: true, force: true })
    }
  })

  it.effect("runs the package's node hardened, and its stop timeout covers the default shutdown grace", () =>
    Effect.gen(function*() {
      // The same process as `npm start`: its malloc setting, its V8 flags and its entry point (which
      // enables the compile cache).
      const startScript = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")).scripts
        .start as string
      assert.strictEqual(
        startScript,
        "MALLOC_ARENA_MAX=2 exec node --max-semi-space-size=1 --heap-growing-percent=30 bin/sweeper.mjs start"
      )
      assert.strictEqual(
        directive("ExecStart"),
        "/opt/sweeper/node_modules/node/bin/node --max-semi-space-size=1 --heap-growing-percent=30 /opt/sweeper/bin/sweeper.mjs start"
      )
      assert.match(unit, /^Environment=MALLOC_ARENA_MAX=2$/m)
      assert.strictEqual(directive("CacheDirectory"), "sweeper")
      assert.match(unit, /^Environment=NODE_COMPILE_CACHE=\/var\/cache\/sweeper$/m)
      for (
        const [key, value] of Object.entries({
          DynamicUser: "yes",
          NoNewPrivileges: "yes",
          ProtectSystem: "strict",
          StateDirectory: "sweeper",
          EnvironmentFile: "/etc/sweeper/sweeper.env",
          Restart: "on-failure",
          KillSignal: "SIGTERM"
        })
      ) assert.strictEqual(directive(key), value, key)
      // The data directory is the state directory.
      assert.strictEqual(directive("Environment"), "SWEEPER_DATA_DIR=/var/lib/sweeper")
      const settings = yield* loadSettings({})
      const stopSeconds = /^(\d+)s$/.exec(directive("TimeoutStopSec") ?? "")?.[1]
      assert.isDefined(stopSeconds, "TimeoutStopSec in seconds, e.g. 45s")
      // The grace, then closing the connections and flushing the last events: at least 10 s more.
      assert.isAtLeast(Number(stopSeconds) * 1000, Duration.toMillis(settings.shutdownGrace) + 10_000)
    }))
})

/** Every variable Sweeper's configuration and logging read, recorded through a ConfigProvider. */
const readVariables = Effect.gen(function*() {
  const seen = new Set<string>()
  const recording = ConfigProvider.make((path) =>
    Effect.sync(() => {
      seen.add(path.join("_"))
      return undefined
    })
  )
  yield* Effect.gen(function*() {
    yield* Layer.build(LoggingLive)
    yield* configureBatches(batches)
  }).pipe(
    Effect.scoped,
    Effect.provide(SweeperConfig.layer),
    Effect.provideService(ConfigProvider.ConfigProvider, recording)
  )
  return seen
})

const loadSettings = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const settings = yield* SweeperConfig
    const configured = yield* configureBatches(batches)
    return { ...settings, configured }
  }).pipe(
    Effect.provide(SweeperConfig.layer),
    Effect.provideService(ConfigProvider.ConfigProvider, ConfigProvider.fromEnv({ env, preserveEmptyStrings: true }))
  ) as Effect.Effect<
    SweeperSettings & { configured: ReadonlyArray<{ batch: (typeof batches)[number]; cronText: string }> },
    unknown
  >

const exampleText = readFileSync(ENV_EXAMPLE, "utf8")
const exampleVariables = [...exampleText.matchAll(/^#?([A-Z][A-Z0-9_]*)=/gm)].map((m) => m[1]!)

/** The example with every variable line uncommented, as `sh` reads it (the same file systemd reads). */
const exampleUncommented = (): Record<string, string> => {
  const dir = mkdtempSync(join(tmpdir(), "sweeper-env-"))
  try {
    const file = join(dir, "sweeper.env")
    writeFileSync(file, exampleText.replace(/^#([A-Z][A-Z0-9_]*=)/gm, "$1"))
    const script = `set -a; . "${file}"; set +a; for v in ${
      exampleVariables.join(" ")
    }; do eval "printf '%s=%s\\0' \\"$v\\" \\"\\$$v\\""; done`
    const result = spawnSync("sh", ["-c", script], { encoding: "utf8", env: {} })
    assert.strictEqual(result.status, 0, result.stderr)
    return Object.fromEntries(
      result.stdout.split("\0").filter((entry) => entry !== "").map((entry) => {
        const at = entry.indexOf("=")
        return [entry.slice(0, at), entry.slice(at + 1)]
      })
    )
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

describe("environment example", () => {
  it.effect("lists exactly the variables Sweeper reads, each once", () =>
    Effect.gen(function*() {
      const read = yield* readVariables
      // A lease TTL is read for every batch but refused for one that takes no lease: not listed.
      const noLease = batches.filter((batch) => Option.isNone(batch.lease)).map((batch) => leaseTtlVariable(batch.name))
      const expected = [...read].filter((name) => !noLease.includes(name)).sort()
      assert.isAbove(expected.length, 20)
      assert.deepStrictEqual([...exampleVariables].sort(), expected)
      assert.strictEqual(new Set(exampleVariables).size, exampleVariables.length, "no variable listed twice")
    }))

  it.effect("is valid configuration once uncommented, and shows the real defaults", () =>
    Effect.gen(function*() {
      const example = exampleUncommented()
      assert.deepStrictEqual(Object.keys(example).sort(), [...exampleVariables].sort())
      const loaded = yield* loadSettings(example)
      const defaults = yield* loadSettings({})
      assert.isTrue(Option.isSome(loaded.databaseUrl))
      assert.strictEqual(loaded.objectStorage._tag, "S3")
      assert.deepStrictEqual(Object.keys(loaded.concurrencyLimits), ["Releases::CreateEvidenceWorker"])
      // Every line not marked as an example shows the default: uncommenting it changes nothing.
      for (
        const key of [
          "httpHost",
          "httpPort",
          "timezone",
          "shutdownGrace",
          "dropBatchSize",
          "failureReasons",
          "eventRetention"
        ] as const
      ) {
        assert.deepStrictEqual(loaded[key], defaults[key], key)
      }
      for (const batch of batches) {
        const mine = loaded.configured.find((c) => c.batch.name === batch.name)!
        assert.strictEqual(mine.cronText, batch.cron, `${batch.name} cron`)
        assert.deepStrictEqual(
          Option.map(mine.batch.lease, (lease) => Duration.toMillis(lease.ttl)),
          Option.map(batch.lease, (lease) => Duration.toMillis(lease.ttl)),
          `${batch.name} lease TTL`
        )
      }
      assert.strictEqual(example.SWEEPER_LOG_LEVEL, "Info")
      assert.strictEqual(example.SWEEPER_DATA_DIR, "/var/lib/sweeper")
    }))
})

/** Metric names in Prometheus text, with histogram series (`_bucket`, `_sum`, `_count`) as exposed. */
const exposedNames = (text: string) =>
  new Set(text.split("\n").filter((line) => line !== "" && !line.startsWith("#")).map((line) => line.split(/[{ ]/)[0]!))

/** Every metric the metrics module defines, updated once in-process and rendered by the real formatter. */
const renderedNames = Effect.gen(function*() {
  const defined = [...Object.values(Metrics), lastSuccessAgeSeconds].filter(Metric.isMetric) as Array<
    Metric.Metric<number, unknown>
  >
  for (const metric of defined) yield* Metric.update(metric, 0)
  return exposedNames(yield* Metrics.prometheusText)
}).pipe(Effect.provide(MetricsPrometheus))

describe("Grafana dashboard and rules against /metrics", () => {
  it.live(
    "query only metrics a started supervisor exposes, and every dashboard query parses",
    () =>
      Effect.gen(function*() {
        const dashboard = JSON.parse(readFileSync(DASHBOARD, "utf8")) as {
          uid: string
          title: string
          templating: { list: Array<{ name: string; type: string; query?: unknown }> }
          panels: Array<
            {
              id: number
              type: string
              title: string
              gridPos: Record<string, number>
              targets?: Array<{ refId: string; expr: string }>
            }
          >
        }
        assert.strictEqual(dashboard.uid, "sweeper")
        const ids = dashboard.panels.map((p) => p.id)
        assert.strictEqual(new Set(ids).size, ids.length, "panel ids are unique")
        const panels = dashboard.panels.filter((p) => p.type !== "row")
        for (const panel of panels) {
          assert.isAbove(panel.targets?.length ?? 0, 0, `${panel.title} has queries`)
          for (const key of ["x", "y", "w", "h"]) assert.isNumber(panel.gridPos[key], `${panel.title} gridPos.${key}`)
          const refIds = panel.targets!.map((t) => t.refId)
          assert.strictEqual(new Set(refIds).size, refIds.length, `${panel.title} refIds are unique`)
        }
        const variables = dashboard.templating.list.map((v) => v.name)
        assert.deepStrictEqual(variables, ["datasource", "job", "batch"])
        const dashboardExprs = panels.flatMap((p) => p.targets!.map((t) => t.expr))
        const variableQueries = dashboard.templating.list.flatMap((v) =>
          typeof v.query === "object" && v.query !== null ? [String((v.query as { query: string }).query)] : []
        )
        // What an operator asked for: runs by outcome, durations, last success, ticks missed, breaker
        // and pause, deferred jobs.
        const all = dashboardExprs.join("\n")
        for (
          const metric of [
            "sweeper_runs_total",
            "sweeper_run_duration_seconds_bucket",
            "sweeper_last_success_age_seconds",
            "sweeper_ticks_missed_total",
            "sweeper_batch_breaker_open",
            "sweeper_batch_paused",
            "sidekiq_concurrency_limit_queue_jobs"
          ]
        ) assert.include(all, metric)

        // Every query parses as PromQL: promtool checks them as recording rules, with the Grafana
        // variables replaced by values of their kind.
        const scratch = mkdtempSync(join(tmpdir(), "sweeper-dashboard-"))
        try {
          const asPromQL = (expr: string) =>
            expr.replaceAll("$__rate_interval", "5m").replaceAll("$job", "sweeper").replaceAll("$batch", ".*")
          const rules = [
            "groups:",
            "  - name: dashboard",
            "    rules:",
            ...[...dashboardExprs, ...variableQueries.map((q) => q.replace(/^label_values\((.*), \w+\)$/, "$1"))]
              .flatMap((expr, i) => [
                `      - record: dashboard:query_${i}`,
                `        expr: ${JSON.stringify(asPromQL(expr))}`
              ])
          ].join("\n")
          writeFileSync(join(scratch, "dashboard.rules.yml"), `${rules}\n`)
          const check = tool("promtool", ["check", "rules", join(scratch, "dashboard.rules.yml")], {
            pkg: "prometheus"
          })
          assert.strictEqual(check.status, 0, check.out)
        } finally {
          rmSync(scratch, { recursive: true, force: true })
        }

        // A real supervisor on real PostgreSQL and Redis: four batches every second, drop-canceling-
        // builds on its default hourly cron, and a throttled worker with a deferred job so the
        // concurrency-limit gauges are there.
        const db = yield* freshDatabase
        const redisUrl = yield* freshRedisUrl
        const worker = "Deploy::CheckWorker"
        yield* Effect.promise(async () => {
          const redis = new IORedis(redisUrl, { lazyConnect: true })
          await redis.connect()
          await redis.rpush(
            workerKeys(worker).deferred,
            JSON.stringify({ args: [1], context: {}, buffered_at: Date.now() / 1000 })
          )
          await redis.quit()
        })
        const sweeper = yield* Effect.acquireRelease(
          Effect.sync(() =>
            startSweeper("deploy", {
              DATABASE_URL: db.url,
              REDIS_URL: redisUrl,
              SWEEPER_CRON_STUCK_EXPORT_JOBS: "* * * * * *",
              SWEEPER_CRON_DELETE_STALE_DIRECT_UPLOADS: "* * * * * *",
              SWEEPER_CRON_RESCHEDULE_STUCK_ISSUE_REBALANCES: "*/2 * * * * *",
              SWEEPER_CRON_CONCURRENCY_LIMIT_RESUME: "* * * * * *",
              // A negative limit is GitLab's breaker: the deferred job stays where it is.
              SWEEPER_CONCURRENCY_LIMITS: JSON.stringify({ [worker]: { limit: -1 } }),
              // The health gate's series (held, unknown) exist from start-up once it is configured.
              SWEEPER_HEALTH: JSON.stringify({ longTransactions: { stop: "6h" } })
            })
          ),
          (p) =>
            Effect.promise(async () => {
              p.child.kill("SIGKILL")
              await p.exited
            })
        )
        const base = yield* Effect.promise(() => sweeper.listening)
        const scrape = () => fetch(`${base}/metrics`).then((response) => response.text())
        const text = yield* Effect.promise(() =>
          waitFor("every success age and the concurrency-limit gauges on /metrics", async () => {
            const body = await scrape()
            const ages = body.match(/^sweeper_last_success_age_seconds\{/gm)?.length ?? 0
            return ages >= 4 && body.includes(`sidekiq_concurrency_limit_queue_jobs{worker="${worker}"} 1`)
              ? body
              : undefined
          }, 40_000)
        )
        const live = exposedNames(text)
        const exposable = new Set([...live, ...(yield* renderedNames)])

        // The period gauge follows each batch's configured cron.
        assert.match(text, /^sweeper_batch_period_seconds\{batch="drop-canceling-builds"\} 3600$/m)
        assert.match(text, /^sweeper_batch_period_seconds\{batch="stuck-export-jobs"\} 1$/m)
        assert.match(text, /^sweeper_batch_period_seconds\{batch="reschedule-stuck-issue-rebalances"\} 2$/m)

        // `up` comes from Prometheus itself.
        for (const expr of [...dashboardExprs, ...variableQueries]) {
          for (const name of metricNames(expr)) {
            if (name !== "up") {
              assert.isTrue(exposable.has(name), `dashboard queries ${name}, which Sweeper does not expose: ${expr}`)
            }
          }
        }
        // Every label selected on or grouped by is one of the metric's own labels on /metrics (a metric
        // only defined, like a repair counter, has none of its own there: selecting on one fails).
        const labels = exposedLabels(text)
        for (const expr of [...dashboardExprs, ...variableQueries, ...ruleExprs()]) {
          for (const use of labelUses(expr)) {
            assert.isTrue(
              use.metrics.some((metric) => labels.get(metric)?.has(use.label) === true),
              `${use.label} is not a label of ${use.metrics.join(", ")} on /metrics: ${expr}`
            )
          }
        }

        // Alerts only on what a running supervisor really exposes (not merely defines).
        const ruleMetrics = ruleExprs().flatMap(metricNames)
        assert.includeMembers(ruleMetrics, [
          "sweeper_last_success_age_seconds",
          "sweeper_batch_period_seconds",
          "sweeper_runs_total",
          "sweeper_batch_breaker_open",
          "sweeper_ticks_missed_total",
          "sidekiq_concurrency_limit_queue_jobs",
          "up"
        ])
        for (const name of ruleMetrics) {
          if (name !== "up") assert.isTrue(live.has(name), `the rules query ${name}, which /metrics does not expose`)
        }
      }),
    90_000
  )
})
