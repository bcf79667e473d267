import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import { StandbySelectionJson, standbyVerdict } from "../../src/domain/Standbys.ts"

const delayed = { name: "dr-east", bytes: 21_000_000, flushLagS: 0.01, replayLagS: 3600 }
const struggling = { name: "replica-1", bytes: 21_000_000, flushLagS: 0.01, replayLagS: 12 }

describe("which standbys replicationLag watches", () => {
  it("a standby that flushes promptly and replays an hour late is delayed: not watched unless named", () => {
    assert.isFalse(standbyVerdict(delayed, {}).watched)
    assert.include(standbyVerdict(delayed, {}).reason, "delayed")
    assert.deepStrictEqual(standbyVerdict(delayed, { watch: ["dr-east"] }), {
      watched: true,
      reason: "watched by SWEEPER_HEALTH_STANDBYS"
    })
  })

  it("a replay seconds behind is lag; a flush behind is lag however late the replay", () => {
    assert.isTrue(standbyVerdict(struggling, {}).watched)
    assert.isTrue(standbyVerdict({ ...delayed, flushLagS: 60 }, {}).watched)
    assert.isFalse(standbyVerdict(struggling, { ignore: ["replica-1"] }).watched)
  })

  it("SWEEPER_HEALTH_STANDBYS refuses a name both watched and ignored", () => {
    const decode = Schema.decodeUnknownOption(StandbySelectionJson)
    assert.isTrue(decode(JSON.stringify({ watch: ["a"], ignore: ["b"] }))._tag === "Some")
    assert.isTrue(decode(JSON.stringify({ watch: ["a"], ignore: ["a"] }))._tag === "None")
    assert.isTrue(decode(JSON.stringify({ watch: "a" }))._tag === "None")
  })
})
