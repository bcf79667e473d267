import { assert, describe, it } from "@effect/vitest"
import { Effect, Option, Schema } from "effect"
import {
  camelize,
  MAX_RESUME_UNLIMITED,
  parseDeferred,
  parseTrackerField,
  resumableCount,
  resumedJob,
  runningJobClass,
  underscore,
  workerKeyFormOf,
  workerKeys
} from "../../src/domain/ConcurrencyLimit.ts"

describe("Rails inflections", () => {
  it.effect.each([
    ["Releases::CreateEvidenceWorker", "releases/create_evidence_worker"],
    ["ConcurrencyLimit::ResumeWorker", "concurrency_limit/resume_worker"],
    ["Ci::StuckBuilds::DropCancelingWorker", "ci/stuck_builds/drop_canceling_worker"],
    ["PostReceive", "post_receive"],
    ["Gitlab::GithubImport::Stage::ImportRepositoryWorker", "gitlab/github_import/stage/import_repository_worker"],
    ["Geo::VerificationBatchWorker", "geo/verification_batch_worker"],
    ["Namespaces::ProcessSyncEventsWorker", "namespaces/process_sync_events_worker"]
  ])("%s ⇄ %s", ([name, key]) =>
    Effect.sync(() => {
      assert.strictEqual(underscore(name), key)
      assert.strictEqual(camelize(key), name)
    }))

  it.effect("acronyms without inflections: Rails splits before the last capital of a run", () =>
    Effect.sync(() => {
      assert.strictEqual(underscore("API::V4::HTTPWorker"), "api/v4/http_worker")
      assert.strictEqual(underscore("SSHKeyWorker"), "ssh_key_worker")
      assert.strictEqual(underscore("Web-Hook"), "web_hook")
      assert.strictEqual(underscore("already_underscored/name"), "already_underscored/name")
      // Without an acronym inflection the round trip loses the capitals, as in Rails.
      assert.strictEqual(camelize("api/v4/http_worker"), "Api::V4::HttpWorker")
    }))

  it.effect("acronyms with inflections round-trip (inflect.acronym)", () =>
    Effect.sync(() => {
      const inflections = { acronyms: ["API", "HTTP", "SSH"] }
      for (const name of ["API::V4::HTTPWorker", "Keys::SSHKeyWorker", "HTTPIntegrationWorker", "MyAPIClientWorker"]) {
        assert.strictEqual(camelize(underscore(name, inflections), inflections), name)
      }
      assert.strictEqual(underscore("MyAPIClientWorker", inflections), "my_api_client_worker")
      assert.strictEqual(camelize("keys/ssh_key_worker", inflections), "Keys::SSHKeyWorker")
    }))
})

describe("keys", () => {
  it.effect("GitLab's key formats, one hash tag per worker", () =>
    Effect.sync(() => {
      assert.deepStrictEqual(workerKeys("Releases::CreateEvidenceWorker"), {
        deferred: "sidekiq:concurrency_limit:throttled_jobs:{releases/create_evidence_worker}",
        executing: "sidekiq:concurrency_limit:{releases/create_evidence_worker}:executing",
        pendingResumed: "sidekiq:concurrency_limit:{releases/create_evidence_worker}:pending_resumed",
        currentLimit: "sidekiq:concurrency_limit:{releases/create_evidence_worker}:current_limit",
        dead: "sidekiq:concurrency_limit:dead:{releases/create_evidence_worker}",
        journal: "sidekiq:concurrency_limit:{releases/create_evidence_worker}:sweeper_moving"
      })
      assert.deepStrictEqual(
        workerKeyFormOf("sidekiq:concurrency_limit:throttled_jobs:{releases/create_evidence_worker}"),
        Option.some("releases/create_evidence_worker")
      )
      assert.isTrue(Option.isNone(workerKeyFormOf("sidekiq:concurrency_limit:throttled_jobs:{}")))
      assert.isTrue(Option.isNone(workerKeyFormOf("queue:default")))
    }))
})

describe("resumableCount", () => {
  it.effect("positive limit: the free capacity, never negative", () =>
    Effect.sync(() => {
      assert.strictEqual(resumableCount(5, 2), 3)
      assert.strictEqual(resumableCount(5, 0), 5)
      assert.strictEqual(resumableCount(5, 5), 0)
      assert.strictEqual(resumableCount(5, 9), 0)
      assert.strictEqual(resumableCount(1, 0), 1)
    }))

  it.effect("0 is unlimited (5000 per pass, whatever runs); negative is the open circuit breaker", () =>
    Effect.sync(() => {
      assert.strictEqual(resumableCount(0, 0), MAX_RESUME_UNLIMITED)
      assert.strictEqual(resumableCount(0, 5000), 5000)
      assert.strictEqual(MAX_RESUME_UNLIMITED, 5000)
      assert.strictEqual(resumableCount(-1, 0), 0)
      assert.strictEqual(resumableCount(-5, 0), 0)
    }))

  it.effect.prop(
    "never more than the free capacity",
    [Schema.Int, Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))],
    ([limit, current]) =>
      Effect.sync(() => {
        const n = resumableCount(limit, current)
        assert.isAtLeast(n, 0)
        if (limit > 0) assert.isAtMost(n, Math.max(limit - current, 0))
        if (limit < 0) assert.strictEqual(n, 0)
      })
  )
})

describe("untrusted data", () => {
  it.effect("deferred elements: args required, context and buffered_at optional; anything else is unparsable", () =>
    Effect.sync(() => {
      assert.isTrue(
        Option.isSome(parseDeferred(`{"args":[1,"a"],"context":{"meta.user":"root"},"buffered_at":1772366400.25}`))
      )
      assert.isTrue(Option.isSome(parseDeferred(`{"args":[]}`)))
      assert.isTrue(Option.isSome(parseDeferred(`{"args":[1],"context":null,"buffered_at":null}`)))
      for (
        const bad of [
          "",
          "not json",
          "[1,2]",
          "null",
          `{"context":{}}`,
          `{"args":"x"}`,
          `{"args":[],"buffered_at":"soon"}`,
          `{"args":[],"context":[]}`
        ]
      ) {
        assert.isTrue(Option.isNone(parseDeferred(bad)), bad)
      }
    }))

  it.effect("a resumed job: stored args, context merged in, resume marker; context cannot overwrite job keys", () =>
    Effect.sync(() => {
      const deferred = Option.getOrThrow(parseDeferred(
        `{"args":[7,{"k":"v"}],"context":{"meta.project":"a/b","jid":"forged","class":"Evil"},"buffered_at":1772366400.5}`
      ))
      const job = resumedJob({
        worker: "Releases::CreateEvidenceWorker",
        queue: "default",
        deferred,
        jid: "0123456789abcdef01234567",
        nowMillis: 1772366460123
      })
      assert.strictEqual(
        JSON.stringify(job),
        `{"class":"Releases::CreateEvidenceWorker","args":[7,{"k":"v"}],"jid":"0123456789abcdef01234567","queue":"default","retry":true,` +
          `"created_at":1772366460.123,"enqueued_at":1772366460.123,"meta.project":"a/b","concurrency_limit_resume":true,` +
          `"concurrency_limit_buffered_at":1772366400.5}`
      )
    }))

  it.effect("tracker fields <pid>:tid:<tid>; the pid may itself contain colons", () =>
    Effect.sync(() => {
      assert.deepStrictEqual(
        parseTrackerField("host-1:4242:0a1b2c:tid:abc"),
        Option.some({ pid: "host-1:4242:0a1b2c", tid: "abc" })
      )
      assert.isTrue(Option.isNone(parseTrackerField("no-tid-here")))
      assert.isTrue(Option.isNone(parseTrackerField(":tid:abc")))
      assert.isTrue(Option.isNone(parseTrackerField("host:tid:")))
    }))

  it.effect("Sidekiq work hash values: payload as a JSON string (Sidekiq 7) or an object", () =>
    Effect.sync(() => {
      const payload = JSON.stringify({ class: "Releases::CreateEvidenceWorker", args: [] })
      assert.deepStrictEqual(
        runningJobClass(JSON.stringify({ queue: "default", payload, run_at: 1 })),
        Option.some("Releases::CreateEvidenceWorker")
      )
      assert.deepStrictEqual(
        runningJobClass(JSON.stringify({ queue: "default", payload: { class: "X" }, run_at: 1 })),
        Option.some("X")
      )
      assert.isTrue(Option.isNone(runningJobClass("garbage")))
    }))
})
