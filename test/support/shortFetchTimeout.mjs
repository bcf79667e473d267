// Preloaded into a CLI child (NODE_OPTIONS=--import): Node's fetch gives up waiting for response
// headers after TEST_FETCH_HEADERS_TIMEOUT_MS instead of its default five minutes, so a test can
// show in seconds what an operator sees after five minutes.
import { Agent, setGlobalDispatcher } from "undici"

const ms = Number(process.env.TEST_FETCH_HEADERS_TIMEOUT_MS ?? "1000")
setGlobalDispatcher(new Agent({ headersTimeout: ms, bodyTimeout: ms }))
