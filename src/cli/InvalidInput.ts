import { redact } from "../domain/Redaction.ts"

/**
 * One shape for every configuration and flag error a user reads: what was wrong, the value given,
 * and what is expected — `SWEEPER_HTTP_PORT="abc": expected a decimal port number 0-65535`,
 * `--now="yesterday": expected an ISO-8601 instant … or a duration ago (1h, 30m, 7d)`. effect's
 * Schema and Config wrap the expectation in their own words (`SchemaError(… at ["VAR"])`,
 * `Expected: Schema validation failed: …, got "…"`); those are peeled off here, once.
 */

/** Variables whose value is never printed, even masked: a wrong token is still someone's token. */
const SECRET_VARIABLES: ReadonlySet<string> = new Set(["SWEEPER_API_TOKEN"])

/** The expectation alone, without the wrappers effect's Schema, Config and CLI put around it. */
export const plainProblem = (message: string): string => {
  const problem = peel(message)
  // A choice is printed by effect as `"a" | "b" | "c"`.
  return /^"[^"]*"( \| "[^"]*")+$/.test(problem)
    ? `expected one of: ${problem.split(" | ").map((choice) => choice.slice(1, -1)).join(", ")}`
    : problem
}

const peel = (message: string): string =>
  message
    .replace(/^SchemaError\(([\s\S]*)\)$/, "$1")
    .replace(/\s+at \[[^\]]*\]$/, "")
    .replace(/^Expected:\s*/, "")
    .replace(/^Schema validation failed:\s*/, "")
    // The value is printed in front; a repeat at the end only lengthens the line.
    .replace(/, got ("[^"]*"|\S+)$/, "")
    .trim()

/**
 * `name="value": problem`, or `name: problem` when no value was given (or it is not shown). The
 * value is redacted before it is quoted: quoting escapes a JSON configuration's quotes, and the
 * redaction knows its secrets (`"aws_secret_access_key": "…"`) only unescaped.
 */
export const invalidInput = (name: string, given: string | undefined, problem: string): string =>
  given === undefined
    ? `${name}: ${plainProblem(problem)}`
    : `${name}=${JSON.stringify(redact(given))}: ${plainProblem(problem)}`

/** The value a variable was given, when one was and it may be shown. */
export const givenValue = (variable: string, env: Record<string, string | undefined> = process.env) =>
  SECRET_VARIABLES.has(variable) ? undefined : env[variable]
