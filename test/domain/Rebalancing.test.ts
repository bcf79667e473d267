import { assert, describe, it } from "@effect/vitest"
import { Duration } from "effect"
import {
  MAX_NUMBER_OF_CONCURRENT_REBALANCES,
  parseRunningRebalances,
  rebalanceMember,
  REBALANCING_QUEUE,
  REBALANCING_WORKER,
  rebalancingWorkerArgs,
  REDIS_EXPIRY_TIME,
  RUNNING_REBALANCES_KEY
} from "../../src/domain/Rebalancing.ts"

describe("Rebalancing", () => {
  it("uses GitLab's key, worker, queue and limits", () => {
    assert.strictEqual(RUNNING_REBALANCES_KEY, "gitlab:issues-position-rebalances:running_rebalances")
    assert.strictEqual(REBALANCING_WORKER, "Issues::RebalancingWorker")
    assert.strictEqual(REBALANCING_QUEUE, "issues_rebalancing")
    assert.strictEqual(MAX_NUMBER_OF_CONCURRENT_REBALANCES, 5)
    assert.strictEqual(Duration.toSeconds(REDIS_EXPIRY_TIME), 864000)
  })

  it("worker args: [null, null, namespace_id] and [null, project_id, null]", () => {
    assert.deepStrictEqual(rebalancingWorkerArgs(1, 42), [null, null, 42])
    assert.deepStrictEqual(rebalancingWorkerArgs(2, 42), [null, 42, null])
    assert.strictEqual(rebalanceMember(1, 42), "1/42")
    assert.strictEqual(rebalanceMember(2, 7), "2/7")
  })

  it("splits members by type, ids ascending", () => {
    const parsed = parseRunningRebalances(["2/30", "1/9", "2/4", "1/100"])
    assert.deepStrictEqual(parsed, {
      namespaceIds: [9, 100],
      projectIds: [4, 30],
      invalidMembers: 0,
      invalidSample: []
    })
  })

  it("empty set: nothing, nothing invalid", () => {
    assert.deepStrictEqual(parseRunningRebalances([]), {
      namespaceIds: [],
      projectIds: [],
      invalidMembers: 0,
      invalidSample: []
    })
  })

  it("other types, non-numeric or non-canonical ids and junk are counted as invalid, never thrown", () => {
    const invalid = [
      "3/5",
      "0/5",
      "2/abc",
      "junk",
      "",
      "1/",
      "/5",
      "1/0",
      "1/-3",
      "1/05",
      "1/1e3",
      "1/ 5",
      "1/5.0",
      "1/0x10",
      "1/5/6",
      "01/5",
      "1/99999999999999999999",
      "2/9007199254740993"
    ]
    const parsed = parseRunningRebalances([...invalid, "1/5", "2/9007199254740991"])
    assert.deepStrictEqual(parsed.namespaceIds, [5])
    assert.deepStrictEqual(parsed.projectIds, [9007199254740991])
    assert.strictEqual(parsed.invalidMembers, invalid.length)
    assert.deepStrictEqual(parsed.invalidSample, invalid.slice(0, 5))
  })

  it("non-string members (defensive: decoded, not trusted) are invalid", () => {
    const parsed = parseRunningRebalances([5, null, { type: 1 }, "2/8"])
    assert.deepStrictEqual(parsed.projectIds, [8])
    assert.strictEqual(parsed.invalidMembers, 3)
  })

  it("members as bytes: UTF-8 members decoded; anything else invalid, escaped in the sample, never acted on", () => {
    const utf8 = (text: string) => new TextEncoder().encode(text)
    const parsed = parseRunningRebalances([
      utf8("1/7"),
      utf8("2/8"),
      // "1/9" with a trailing 0xFF, a lone surrogate, and an overlong "1" that a lax decoder could read as "1/9".
      Uint8Array.from([0x31, 0x2f, 0x39, 0xff]),
      Uint8Array.from([0x31, 0x2f, 0xed, 0xa0, 0x80]),
      Uint8Array.from([0xc0, 0xb1, 0x2f, 0x39]),
      // A byte-order mark before a member is kept, so the member is not "2/3".
      Uint8Array.from([0xef, 0xbb, 0xbf, 0x32, 0x2f, 0x33])
    ])
    assert.deepStrictEqual(parsed.namespaceIds, [7])
    assert.deepStrictEqual(parsed.projectIds, [8])
    assert.strictEqual(parsed.invalidMembers, 4)
    assert.deepStrictEqual(parsed.invalidSample, ["1/9\\xff", "1/\\xed\\xa0\\x80", "\\xc0\\xb1/9", "\uFEFF2/3"])
  })
})
