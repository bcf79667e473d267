/**
 * The console's script and styles, real files beside this one (type-checked and formatted like the
 * rest of the tree), read once at start. Their URLs carry a hash of their content, so a browser may
 * keep them for a day and still never runs an old script against a new server.
 */
import { createHash } from "node:crypto"
import { readFileSync } from "node:fs"

const read = (name: string) => readFileSync(new URL(name, import.meta.url), "utf8")

export const SCRIPT = read("./dashboard.js")
export const STYLE = read("./dashboard.css")
export const ASSET_VERSION = createHash("sha256").update(SCRIPT).update(STYLE).digest("hex").slice(0, 12)
export const SCRIPT_PATH = "/console/dashboard.js"
export const STYLE_PATH = "/console/dashboard.css"
