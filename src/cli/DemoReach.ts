/**
 * What the demo prints beside its dashboard URL: the link that hands the dashboard's buttons the
 * demo's token (in the URL's fragment, which the browser never sends to the server; the page keeps
 * it for the tab and takes it out of the address bar), and the commands that reach the running
 * demo from another terminal. One function, called once by the demo, so a shared commands text can
 * take its place in one line. The commands are ReachCommands' (status, a dry run, the REPL), the
 * ones the CLI's own tests play.
 */
import { reachCommands } from "./ReachCommands.ts"

export interface DemoReach {
  readonly url: string
  readonly dataDir: string
  /** The token the demo generated; undefined when the operator gave SWEEPER_API_TOKEN themselves. */
  readonly token: string | undefined
}

export const demoReachText = ({ dataDir, token, url }: DemoReach): string => {
  const base = url.replace(/\/$/, "")
  const commands = reachCommands(dataDir)
  return [
    token === undefined
      ? `Buttons: the dashboard asks once for your SWEEPER_API_TOKEN.`
      : `Buttons (Run now, Dry run, Pause): open this link once; it hands the tab the demo's token:\n  ${base}/#token=${token}`,
    `From another terminal in this checkout:`,
    ...commands.map(({ command }) => `  ${command}`),
    token === undefined
      ? `  curl -X POST -H "Authorization: Bearer $SWEEPER_API_TOKEN" ${base}/api/batches/drop-canceling-builds/run`
      : `  curl -X POST -H 'Authorization: Bearer ${token}' ${base}/api/batches/drop-canceling-builds/run`
  ].join("\n")
}
