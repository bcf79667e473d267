/**
 * `npm run repl`: a Node REPL with the same runtime and registry as the supervisor.
 *
 *   sweeper> await sweeper.run("drop-canceling-builds", { dryRun: true })
 *   sweeper> await sweeper.events({ stream: "build:123" })
 *   sweeper> sweeper.batches
 */
import { ConfigProvider, Effect, Layer, ManagedRuntime } from "effect"
import repl from "node:repl"
import { environment } from "../config/Config.ts"
import { batchNames, findBatch } from "../programs/index.ts"
import { type EventFilter, EventLog } from "../services/EventLog.ts"
import { AppLayer } from "./App.ts"
import { LoggingLive } from "./Logging.ts"
import { runBatch } from "./RunGuard.ts"

const runtime = ManagedRuntime.make(
  AppLayer.pipe(Layer.provideMerge(LoggingLive), Layer.provide(ConfigProvider.layer(environment)))
)

const sweeper = {
  batches: batchNames,
  run: (name: string, options: { readonly dryRun?: boolean } = {}) =>
    runtime.runPromise(Effect.flatMap(findBatch(name), (batch) => runBatch(batch, { trigger: "manual", ...options }))),
  events: (filter: EventFilter = {}) =>
    runtime.runPromise(Effect.gen(function*() {
      const log = yield* EventLog
      return yield* log.query({ newestFirst: true, limit: 20, ...filter })
    }))
}

const server = repl.start({ prompt: "sweeper> " })
server.context.sweeper = sweeper
server.on("exit", () => {
  runtime.dispose().then(() => process.exit(0), () => process.exit(1))
})
