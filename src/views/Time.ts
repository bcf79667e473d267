/**
 * The one way an instant is written for a reader, in the console and on the command line:
 * `2026-11-25 17:56:00 UTC`, always with seconds, so a minute cron's tick and a seconds cron's
 * line up in one list. (`--json` and the API keep ISO-8601 for programs; the console's script,
 * src/http/console/dashboard.js, writes the same shape.)
 */
export const formatUtc = (at: string | Date): string => {
  const iso = typeof at === "string" ? new Date(at).toISOString() : at.toISOString()
  return `${iso.slice(0, 10)} ${iso.slice(11, 19)} UTC`
}
