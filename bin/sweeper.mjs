#!/usr/bin/env node
// Needs Node >= 24 (TypeScript type stripping). `npx sweeper …` from the project root puts the
// project's own Node 24 (the `node` dependency) first on PATH.
//
// The compile cache (Node's own, under the OS temp directory unless NODE_COMPILE_CACHE names one)
// keeps the TypeScript-stripped, compiled modules between starts: a start that finds them never
// loads the type stripper (a WebAssembly module that stays resident, about 18 MB of RSS for the
// life of the process; issue 9). It must be enabled here, in plain JavaScript, before the first
// TypeScript module is loaded. A failure to write the cache only means the next start strips again.
import { enableCompileCache } from "node:module"

enableCompileCache?.()
await import("../src/main.ts")
