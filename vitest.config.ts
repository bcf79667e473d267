import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Storage tests each get their own database / Redis db; two workers fit the 2-core machines.
    maxWorkers: 2
  }
})
