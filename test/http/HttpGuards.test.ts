/** The Host check's reading of a Host header, in each form a client sends. */
import { assert, describe, it } from "@effect/vitest"
import { hostName, isOwnHost } from "../../src/http/HttpGuards.ts"

describe("Host check", () => {
  it("reads the name without its port, in lower case, IPv6 without brackets", () => {
    assert.strictEqual(hostName("LocalHost:9394"), "localhost")
    assert.strictEqual(hostName("127.0.0.1"), "127.0.0.1")
    assert.strictEqual(hostName("[::1]:9394"), "::1")
    assert.strictEqual(hostName("[::1]"), "::1")
    assert.strictEqual(hostName("::1"), "::1")
    assert.strictEqual(hostName(" sweeper.internal "), "sweeper.internal")
  })

  it("answers to its names and to the address the request came in on, nothing else", () => {
    const names = new Set(["localhost", "127.0.0.1", "sweeper.internal"])
    for (const own of ["localhost:1", "127.0.0.1:9394", "Sweeper.Internal", "10.0.0.5:9394"]) {
      assert.isTrue(isOwnHost(own, names, "10.0.0.5"), own)
    }
    // An IPv4 request on a dual-stack socket shows its local address IPv4-mapped.
    assert.isTrue(isOwnHost("10.0.0.5", new Set(), "::ffff:10.0.0.5"))
    for (
      const foreign of ["evil.example", "localhost.evil", "127.0.0.1.nip.io", "sweeper.internal.evil", "", "[::2]"]
    ) {
      assert.isFalse(isOwnHost(foreign, names, "10.0.0.5"), foreign)
    }
  })
})
