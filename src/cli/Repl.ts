/**
 * `npm run repl`: a Node REPL over the same Operator as the CLI (Operator.ts). It finds the running
 * supervisor of its data directory (or SWEEPER_URL) on its own and says which one it talks to; a
 * one-off run then goes through that supervisor — its run guard, lease, mailbox and events, as a
 * scheduled run would — which is also how it works on the embedded default, whose database and
 * Redis live inside the supervisor's process. With DATABASE_URL and no supervisor it runs here.
 *
 *   sweeper> await sweeper.run("drop-canceling-builds", { dryRun: true })
 *   sweeper> await sweeper.events({ type: "BuildDropped" })
 *   sweeper> await sweeper.status()
 *   sweeper> sweeper.batches
 */
import * as ConfigProvider from "effect/ConfigProvider"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as ManagedRuntime from "effect/ManagedRuntime"
import * as Schema from "effect/Schema"
import repl from "node:repl"
import { environment } from "../config/Config.ts"
import { batchNames } from "../programs/index.ts"
import type { EventFilter } from "../services/EventLog.ts"
import { LoggingLive } from "../supervisor/Logging.ts"
import * as Operator from "./Operator.ts"

const runtime = ManagedRuntime.make(
  Operator.layer.pipe(Layer.provideMerge(LoggingLive), Layer.provide(ConfigProvider.layer(environment)))
)

/** Calls under way: `.exit` (or the end of piped input) waits for their answers before closing. */
const pending = new Set<Promise<unknown>>()

/** A call's failure as the REPL shows it: the one line the CLI would print. */
class ReplCallFailed extends Schema.TaggedError<ReplCallFailed>()("ReplCallFailed", { message: Schema.String }) {}

/** One line, as the CLI says it: the REPL prints a rejected promise's message. */
const call = <A>(effect: Effect.Effect<A, unknown, Operator.Operator>): Promise<A> => {
  const promise = runtime.runPromise(effect.pipe(
    Effect.mapError((error) => new ReplCallFailed({ message: error instanceof Error ? error.message : String(error) }))
  ))
  pending.add(promise)
  const settled = () => pending.delete(promise)
  promise.then(settled, settled)
  return promise
}

const operator = await runtime.runPromise(Operator.Operator).catch(async (error: unknown) => {
  process.stderr.write(`sweeper: ${error instanceof Error ? error.message : String(error)}\n`)
  await runtime.dispose()
  process.exit(3)
})

/** The answer as the CLI's --json prints it: a field the run did not set is absent, not `undefined`. */
const withoutUndefined = <A extends object>(value: A): A =>
  Object.fromEntries(Object.entries(value).filter(([, field]) => field !== undefined)) as A

export interface RunOptions {
  readonly dryRun?: boolean
  /** Run a batch listed in SWEEPER_DISABLED_BATCHES. */
  readonly force?: boolean
  /** Judge thresholds at this instant (a future one only with dryRun). */
  readonly now?: Date | string
}

const sweeper = {
  batches: batchNames,
  /** Which supervisor (or database) this session talks to. */
  target: operator.target,
  run: (name: string, options: RunOptions = {}) =>
    call(operator.run(name, {
      dryRun: options.dryRun === true,
      force: options.force === true,
      asOf: options.now === undefined ? undefined : new Date(options.now)
    })).then(withoutUndefined),
  events: (filter: EventFilter = {}) => call(operator.events({ newestFirst: true, limit: 20, ...filter })),
  status: () => call(operator.views),
  // What `sweeper pause` / `resume` print, rather than `undefined`.
  pause: (name: string) => call(operator.setPaused(name, "pause")).then(() => `${name} paused`),
  resume: (name: string) => call(operator.setPaused(name, "resume")).then(() => `${name} resumed`)
}

process.stdout.write(
  `Sweeper REPL, talking to ${operator.target}.\n` +
    `Try: await sweeper.run("drop-canceling-builds", { dryRun: true }), await sweeper.status(), ` +
    `await sweeper.events({ type: "BuildDropped" }); sweeper.batches lists the batches.\n`
)
const server = repl.start({ prompt: "sweeper> " })
server.context.sweeper = sweeper

/**
 * One line at a time, as typed: piped input reaches the REPL faster than an awaited run answers,
 * and Node's REPL evaluates each line as it arrives, so answers came back concurrently and out of
 * order. Each line now waits for the one before it to be answered.
 */
const evaluate = server.eval
let previous: Promise<void> = Promise.resolve()
const inTurn: repl.REPLEval = function(this: repl.REPLServer, code, context, file, answer) {
  previous = previous.then(() =>
    new Promise<void>((done) => {
      evaluate.call(this, code, context, file, (error, result) => {
        answer(error, result)
        done()
      })
    })
  )
}
Object.assign(server, { eval: inTurn })

server.on("exit", () => {
  // A run asked for and then left by `.exit` (or the end of piped input) would be cancelled by
  // closing the client under it: the lines still waiting their turn, and the calls under way, finish first.
  previous.then(() => Promise.allSettled(pending)).then(() => runtime.dispose()).then(
    () => process.exit(0),
    () => process.exit(1)
  )
})
