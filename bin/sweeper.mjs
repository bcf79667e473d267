#!/usr/bin/env node
// Needs Node >= 24 (TypeScript type stripping). `npx sweeper …` from the project root puts the
// project's own Node 24 (the `node` dependency) first on PATH.
//
// The compile cache (Node's own, under the OS temp directory unless NODE_COMPILE_CACHE names one)
// keeps the compiled modules between starts. It must be enabled here, in plain JavaScript, before
// the first module is loaded. A failure to write the cache only means the next start compiles again.
//
// What runs is the bundled build of src/ (bin/bundle.mjs: built on the first start after the sources
// changed, about 2 MB of JavaScript instead of 7.6 MB of modules' source text held at idle), or
// src/main.ts itself where it cannot be built. From source, a start that finds the compile cache
// never loads the TypeScript stripper (a WebAssembly module that stays resident, about 18 MB).
import { enableCompileCache } from "node:module"
import { pathToFileURL } from "node:url"
import { bundledEntry } from "./bundle.mjs"

enableCompileCache?.()
const entry = bundledEntry()
await import(entry === undefined ? "../src/main.ts" : pathToFileURL(entry).href)
