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

/** How failures are reported: the label and noun of the log lines, and the log of a failure not isolated. */
export interface IsolatedEachOptions<K, E> {
  readonly concurrency: number
  readonly label?: string
  readonly noun?: string
  readonly logFailure?: (key: K, cause: Cause.Cause<E>) => Effect.Effect<void>
}

/** A caller's own isolation: which failures are permanent and about one key, and how each is logged. */
export interface Isolation<K, E, F> {
  readonly isolate: (key: K, error: E) => Option.Option<F>
  readonly logIsolated: (failure: F) => Effect.Effect<void>
}

/** Every key's result, and the keys whose failure was isolated. */
export interface IsolatedResults<A, F> {
  readonly results: Array<A>
  readonly isolated: Array<F>
}

/**
 * `f` for every key concurrently (at most `concurrency` at once); one key's failure neither stops
 * nor hides the others: all finish. A WrongTypeKey (permanent, and about that key alone) is
 * returned with the others' results and the run goes on; any other failure is logged with
 * `logFailure` and fails the whole afterwards, so the run guard records and retries it. The log
 * lines read "<label> skipped <noun> <key>: …" and "<label> failed for a <noun>", annotated with
 * the key under `noun`.
 */
export const isolatedEach = <K, A, E, R>(
  keys: ReadonlyArray<K>,
  f: (key: K) => Effect.Effect<A, E, R>,
  options: IsolatedEachOptions<K, E>
): Effect.Effect<IsolatedResults<A, KeyFailure<K>>, E, R> => {
  const { label = "Batch", noun = "key" } = options
  return isolatedEachWith(keys, f, {
    ...options,
    isolate: wrongTypeKey,
    logIsolated: ({ of, key, error }) =>
      Effect.logError(`${label} skipped ${noun} ${String(of)}: key ${key} holds the wrong type (${error})`).pipe(
        Effect.annotateLogs({ [noun]: of, key })
      )
  })
}

/** `isolatedEach` with the caller's own isolation: which failures are permanent and one key's, and their log. */
export const isolatedEachWith = <K, A, E, R, F>(
  keys: ReadonlyArray<K>,
  f: (key: K) => Effect.Effect<A, E, R>,
  options: IsolatedEachOptions<K, E> & Isolation<K, E, F>
): Effect.Effect<IsolatedResults<A, F>, E, R> =>
  Effect.gen(function*() {
    const { label = "Batch", noun = "key", isolate, logIsolated } = options
    const logFailure = options.logFailure ?? ((of: K, cause: Cause.Cause<E>) =>
      Effect.logError(`${label} failed for a ${noun}`, cause).pipe(Effect.annotateLogs({ [noun]: of })))
    const exits = yield* Effect.forEach(keys, (key) => Effect.map(Effect.exit(f(key)), (exit) => ({ key, exit })), {
      concurrency: options.concurrency
    })
    const results: Array<A> = []
    const isolated: Array<F> = []
    let failed: Cause.Cause<E> | undefined
    for (const { key, exit } of exits) {
      if (Exit.isSuccess(exit)) {
        results.push(exit.value)
        continue
      }
      const known = Option.flatMap(Cause.findErrorOption(exit.cause), (error) => isolate(key, error))
      if (Option.isSome(known)) {
        isolated.push(known.value)
        yield* logIsolated(known.value)
      } else {
        yield* logFailure(key, exit.cause)
        failed ??= exit.cause
      }
    }
    if (failed !== undefined) return yield* Effect.failCause(failed)
    return { results, isolated }
  })
