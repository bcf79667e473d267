/**
 * The exact commands that reach a running supervisor from another terminal in the checkout: its
 * status, a dry run, and the REPL. The demo prints them beside the dashboard's URL; they name the
 * supervisor's data directory, because that is where it publishes its address and local token
 * (SupervisorAddress.ts), which the CLI and the REPL find there on their own.
 */

export interface ReachCommand {
  /** What the command does, in a few words. */
  readonly label: string
  /** The command line, ready to paste into a shell in the checkout. */
  readonly command: string
}

/** Single-quoted for a POSIX shell unless it needs no quoting at all. */
const shellQuote = (text: string) => /^[\w@%+=:,./-]+$/.test(text) ? text : `'${text.replace(/'/g, `'\\''`)}'`

/** The commands that reach the supervisor whose data directory is `dataDir`. */
export const reachCommands = (dataDir: string): ReadonlyArray<ReachCommand> => {
  const env = `SWEEPER_DATA_DIR=${shellQuote(dataDir)}`
  return [
    { label: "status", command: `${env} npx sweeper status` },
    { label: "dry run", command: `${env} npx sweeper run drop-canceling-builds --dry-run` },
    { label: "REPL", command: `${env} npm run --silent repl` }
  ]
}

/** The same, as lines for a terminal banner: `  status   SWEEPER_DATA_DIR=… npx sweeper status`. */
export const reachCommandLines = (dataDir: string): ReadonlyArray<string> => {
  const commands = reachCommands(dataDir)
  const width = Math.max(...commands.map((c) => c.label.length))
  return commands.map((c) => `  ${c.label.padEnd(width)}  ${c.command}`)
}
