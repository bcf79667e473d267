#!/usr/bin/env node
// Needs Node >= 24 (TypeScript type stripping). `npx sweeper …` from the project root puts the
// project's own Node 24 (the `node` dependency) first on PATH.
import "../src/main.ts"
