/**
 * GitLab's exclusive lease key and Sweeper's fencing-epoch key beside it: the key forms,
 * pure (the protocol is services/Lease.ts and its layers).
 */
import { hashTagOf } from "./RedisKey.ts"

export const leaseKey = (name: string) => `gitlab:exclusive_lease:${name}`

/**
 * The fencing epoch of a lease, in the same cluster hash slot as GitLab's untagged lease key (one
 * Lua script touches both): the lease key's hashed part as this key's `{tag}`. GitLab's key format
 * cannot change; ours can. A hashed part containing `}` cannot be a tag: such names are refused
 * (Sweeper's own lease names never contain braces).
 */
export const epochKey = (name: string) => {
  const lease = leaseKey(name)
  const hashed = hashTagOf(lease)
  if (hashed.includes("}")) {
    throw new Error(`lease name ${JSON.stringify(name)} cannot share a hash slot with its epoch key`)
  }
  return hashed === lease
    ? `sweeper:exclusive_lease_epoch:{${lease}}`
    : `sweeper:exclusive_lease_epoch:{${hashed}}:${name}`
}

/** The epoch key outlives every lease by far and is refreshed on each acquisition. */
export const EPOCH_TTL_SECONDS = 30 * 24 * 3600
