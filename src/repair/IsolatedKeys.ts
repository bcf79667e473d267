/**
 * Work over many keys where one key's permanent failure (a key of the wrong type) is reported and
 * skipped, and any other failure fails the whole after every key has finished.
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import { WrongTypeKey } from "../domain/Errors.ts"

/** A key whose unit hit a key of the wrong type: permanent and about that key alone. */
export interface KeyFailure<K> {
  readonly of: K
  readonly key: string
  readonly error: string
}

/**
 * The default isolation: a WrongTypeKey is permanent and concerns one key (re-running cannot fix
 * it, and the other keys are fine), so that key is skipped and reported, never retried.
 */
const wrongTypeKey = <K>(of: K, error: unknown): Option.Option<KeyFailure<K>> =>
  error instanceof WrongTypeKey
    ? Option.some({ of, key: error.key, error: error.message })
    : Option.none()

/**
 * `f` for every key concurrently (at most `concurrency` at once); one key's failure neither stops
 * nor hides the others: all finish. A failure `isolate` recognises (permanent, and about that key
 * alone; by default a WrongTypeKey) is returned with the others' results and the run goes on; any
 * other is logged with `logFailure` and fails the whole afterwards, so the run guard records and
 * retries it. The default log lines read "<label> skipped <noun> <key>: …" and
 * "<label> failed for a <noun>", annotated with the key under `noun`.
 */
export const isolatedEach = <K, A, E, R, F = KeyFailure<K>>(
  keys: ReadonlyArray<K>,
  f: (key: K) => Effect.Effect<A, E, R>,
  options: {
    readonly concurrency: number
    readonly label?: string
    readonly noun?: string
    readonly isolate?: (key: K, error: E) => Option.Option<F>
    readonly logIsolated?: (failure: F) => Effect.Effect<void>
    readonly logFailure?: (key: K, cause: Cause.Cause<E>) => Effect.Effect<void>
  }
) =>
  Effect.gen(function*() {
    const { label = "Batch", noun = "key" } = options
    const isolate = options.isolate ?? (wrongTypeKey as (key: K, error: E) => Option.Option<F>)
    const logIsolated = options.logIsolated ?? ((failure: F) => {
      const { of, key, error } = failure as KeyFailure<K>
      return Effect.logError(`${label} skipped ${noun} ${String(of)}: key ${key} holds the wrong type (${error})`).pipe(
        Effect.annotateLogs({ [noun]: of, key })
      )
    })
    const logFailure = options.logFailure ?? ((of: K, cause: Cause.Cause<E>) =>
      Effect.logError(`${label} failed for a ${noun}`, cause).pipe(Effect.annotateLogs({ [noun]: of })))
    const exits = yield* Effect.forEach(keys, (key) => Effect.exit(f(key)), { concurrency: options.concurrency })
    const results: Array<A> = []
    const isolated: Array<F> = []
    let failed: Cause.Cause<E> | undefined
    for (const [i, exit] of exits.entries()) {
      if (Exit.isSuccess(exit)) {
        results.push(exit.value)
        continue
      }
      const known = Option.flatMap(Cause.findErrorOption(exit.cause), (error) => isolate(keys[i]!, error))
      if (Option.isSome(known)) {
        isolated.push(known.value)
        yield* logIsolated(known.value)
      } else {
        yield* logFailure(keys[i]!, exit.cause)
        failed ??= exit.cause
      }
    }
    if (failed !== undefined) return yield* Effect.failCause(failed)
    return { results, isolated }
  })
