/**
 * Every numeric and time flag of every command refuses a bad
 * value — negative, zero where it means nothing, a fraction, huge, empty, garbage — with one line
 * on stderr and exit 2, no stack trace, before anything opens a database. Relative instants (`1h`,
 * `30m`, `7d`) are read from the Clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { attachDashedValues, BudgetText, DurationText, InstantText } from "../../src/cli/CliFlags.ts"
import { runCli } from "../support/cli.ts"

type Kind = "count" | "duration" | "budget" | "instant"

/** Every command × value flag, with the arguments the command needs besides it. */
const FLAGS: ReadonlyArray<{ readonly command: ReadonlyArray<string>; readonly flag: string; readonly kind: Kind }> = [
  { command: ["events"], flag: "--limit", kind: "count" },
  { command: ["events"], flag: "--since", kind: "instant" },
  { command: ["events"], flag: "--until", kind: "instant" },
  { command: ["events", "prune"], flag: "--before", kind: "instant" },
  { command: ["run", "drop-canceling-builds"], flag: "--budget", kind: "budget" },
  { command: ["run", "drop-canceling-builds", "--dry-run"], flag: "--now", kind: "instant" },
  { command: ["simulate"], flag: "--rate", kind: "count" },
  { command: ["simulate"], flag: "--duration", kind: "duration" },
  { command: ["demo"], flag: "--rate", kind: "count" }
]

const BAD: Record<Kind, ReadonlyArray<readonly [label: string, value: string]>> = {
  count: [["negative", "-3"], ["zero", "0"], ["float", "1.5"], ["huge", "99999999999999999999"], ["empty", ""], [
    "garbage",
    "many"
  ]],
  // A zero budget means something (one unit of work, then stop): its "zero" case is a bare 0.
  budget: [["negative", "-5s"], ["zero without a unit", "0"], ["float", "1.5"], ["huge", "99999999d"], ["empty", ""], [
    "garbage",
    "soon"
  ]],
  duration: [["negative", "-5s"], ["zero", "0s"], ["float", "1.5"], ["huge", "99999999d"], ["empty", ""], [
    "garbage",
    "soon"
  ]],
  instant: [["negative", "-1h"], ["zero", "0s"], ["float", "1.5"], ["huge", "99999999d"], ["empty", ""], [
    "garbage",
    "yesterday"
  ]]
}

const CASES = FLAGS.flatMap(({ command, flag, kind }) =>
  BAD[kind].map(([label, value]) => ({
    name: `${command.join(" ")} ${flag} ${JSON.stringify(value)} (${label})`,
    args: [...command, flag, value],
    flag
  }))
)

/** A few processes at a time: each is a Node start-up, and the machine is shared. */
const CONCURRENCY = 3

describe("bad flag values", () => {
  it.live(
    `${CASES.length} command × flag × bad value cases: exit 2, one line naming the flag, no stack trace, nothing on stdout`,
    () =>
      Effect.gen(function*() {
        // No DATABASE_URL: nothing here may get as far as opening a database (or starting a simulator).
        const results = yield* Effect.forEach(CASES, (c) =>
          Effect.promise(() => runCli(c.args, {}, 30_000)).pipe(Effect.map((r) => ({ ...c, ...r }))), {
          concurrency: CONCURRENCY
        })
        const wrong = results.flatMap((r) => {
          const lines = r.stderr.split("\n").filter((line) =>
            line.trim() !== ""
          )
          const problems = [
            r.code !== 2 ? `exit ${r.code}` : "",
            r.stdout !== "" ? "stdout not empty" : "",
            lines.length !== 1 ? `${lines.length} lines on stderr` : "",
            !(lines[0] ?? "").startsWith("sweeper: ") || !(lines[0] ?? "").includes(r.flag)
              ? "the line does not name the flag"
              : "",
            /\n\s+at /.test(r.stderr) ? "stack trace" : ""
          ].filter((p) => p !== "")
          return problems.length === 0
            ? []
            : [`${r.name}: ${problems.join(", ")}\n${r.stderr}${r.stdout.slice(0, 300)}`]
        })
        assert.deepStrictEqual(wrong, [])
      }),
    600_000
  )

  it.effect("durations: short and long units, positive and bounded", () =>
    Effect.gen(function*() {
      const decode = Schema.decodeUnknownEffect(DurationText)
      for (
        const [text, ms] of [
          ["30s", 30_000],
          ["30 seconds", 30_000],
          ["250ms", 250],
          ["5m", 300_000],
          ["1h", 3_600_000],
          ["7d", 604_800_000],
          ["1.5h", 5_400_000]
        ] as const
      ) {
        assert.strictEqual(Duration.toMillis(yield* decode(text)), ms, text)
      }
      for (const text of ["0s", "-1s", "1.5", "soon", "", "99999999d"]) {
        assert.strictEqual((yield* Effect.flip(decode(text)))._tag, "SchemaError", text)
      }
      // A budget may be zero: exactly one unit of work.
      assert.strictEqual(Duration.toMillis(yield* Schema.decodeUnknownEffect(BudgetText)("0s")), 0)
      assert.strictEqual((yield* Effect.flip(Schema.decodeUnknownEffect(BudgetText)("-1s")))._tag, "SchemaError")
    }))

  it.effect("instants: ISO-8601, or a duration ago read from the Clock", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(Date.parse("2026-05-01T12:00:00Z"))
      const decode = Schema.decodeUnknownEffect(InstantText)
      assert.strictEqual((yield* decode("1h")).toISOString(), "2026-05-01T11:00:00.000Z")
      assert.strictEqual((yield* decode("30m")).toISOString(), "2026-05-01T11:30:00.000Z")
      assert.strictEqual((yield* decode("7d")).toISOString(), "2026-04-24T12:00:00.000Z")
      assert.strictEqual((yield* decode("2026-01-01T05:00:00Z")).toISOString(), "2026-01-01T05:00:00.000Z")
      assert.strictEqual((yield* decode("2026-01-01")).toISOString(), "2026-01-01T00:00:00.000Z")
      for (const text of ["yesterday", "2026-13-45", "0s", "-1h", ""]) {
        assert.strictEqual((yield* Effect.flip(decode(text)))._tag, "SchemaError", text)
      }
    }))

  it("a value with a leading minus is the flag's value, not short flags", () => {
    assert.deepStrictEqual(attachDashedValues(["events", "--since", "-1h", "--json"]), [
      "events",
      "--since=-1h",
      "--json"
    ])
    assert.deepStrictEqual(attachDashedValues(["events", "--json", "-h"]), ["events", "--json", "-h"])
  })
})
