/** Migration 0004: nothing left in the transaction; its indexes are online steps (Migrations.ts). */
import * as Effect from "effect/Effect"

/**
 * Event retention (prune-events): its DELETE pages walk events by time, and its kept-for-state rule
 * reads every batch-stream event. Its two indexes are built by the online steps (ONLINE_STEPS in
 * Migrations.ts: concurrently, outside any transaction): this migration once built them inside its
 * transaction, which held every append to sweeper_events for the length of the build on a large ledger.
 */
export const retentionIndexes = Effect.void
