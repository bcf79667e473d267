/**
 * What the demo prints beside its dashboard URL: the link that hands the dashboard's buttons the
 * demo's token (in the URL's fragment, which the browser never sends to the server; the page keeps
 * it for the tab and takes it out of the address bar), and the commands that reach the running
 * demo from another terminal. One function, called once by the demo, so a shared commands text can
 * take its place in one line.
 */
export interface DemoReach {
  readonly url: string
  readonly dataDir: string
  /** The token the demo generated; undefined when the operator gave SWEEPER_API_TOKEN themselves. */
  readonly token: string | undefined
}

const quote = (text: string) => /^[\w@%+=:,./-]+$/.test(text) ? text : `'${text.replace(/'/g, "'\\''")}'`

export const demoReachText = ({ dataDir, token, url }: DemoReach): string => {
  const base = url.replace(/\/$/, "")
  const env = `SWEEPER_DATA_DIR=${quote(dataDir)}`
  return [
    token === undefined
      ? `Buttons: the dashboard asks once for your SWEEPER_API_TOKEN.`
      : `Buttons (Run now, Dry run, Pause): open this link once; it hands the tab the demo's token:\n  ${base}/#token=${token}`,
    `From another terminal in this checkout:`,
    `  ${env} npx sweeper status`,
    `  ${env} npx sweeper run drop-canceling-builds --dry-run`,
    `  ${env} npx sweeper events --type BuildDropped --limit 5`,
    `  ${env} npm run repl`,
    token === undefined
      ? `  curl -X POST -H "Authorization: Bearer $SWEEPER_API_TOKEN" ${base}/api/batches/drop-canceling-builds/run`
      : `  curl -X POST -H 'Authorization: Bearer ${token}' ${base}/api/batches/drop-canceling-builds/run`
  ].join("\n")
}
