/** Rules about Redis key names that hold for every GitLab store. */

/**
 * The part of a key Redis Cluster hashes (its hash tag): the text between the first `{` and the next
 * `}` when that is non-empty, else the whole key. Keys that one script touches must agree on it.
 */
export const hashTagOf = (key: string): string => {
  const open = key.indexOf("{")
  if (open < 0) return key
  const close = key.indexOf("}", open + 1)
  return close <= open + 1 ? key : key.slice(open + 1, close)
}
