"""The Lua scripts behind every RedisDirectory write. A script runs atomically, so the
fencing check and the write it guards cannot be split by another client (the race WATCH/MULTI
would have to retry), and the PUBLISH inside it orders announcements exactly as the changes.
Times come from Redis `TIME`, one clock for all clients. Each script is the shared PRELUDE plus
a body; numbers cross as strings and are compared as numbers.
"""

PRELUDE = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local FIELDS = {'owner', 'incarnation', 'epoch', 'num_cached_tokens', 'prefix_hash', 'lease_expires_ms'}

local function read_record(key)
  local v = redis.call('HMGET', key, unpack(FIELDS))
  if not v[1] then return nil end
  return {owner = v[1], incarnation = v[2], epoch = tonumber(v[3]), num_cached_tokens = tonumber(v[4]),
          prefix_hash = v[5], lease_expires_ms = tonumber(v[6])}
end

local function write_record(key, rec)
  redis.call('HSET', key, 'owner', rec.owner, 'incarnation', rec.incarnation, 'epoch', rec.epoch,
             'num_cached_tokens', rec.num_cached_tokens, 'prefix_hash', rec.prefix_hash,
             'lease_expires_ms', rec.lease_expires_ms)
  redis.call('PEXPIREAT', key, rec.lease_expires_ms)
end

-- The record, only if `owner` holds it at `epoch` (the fencing check).
local function held(key, owner, epoch)
  local rec = read_record(key)
  if rec and rec.owner == owner and rec.epoch == tonumber(epoch) then return rec end
  return nil
end

-- The largest epoch issued so far: the remembered one, or the live record's if that is larger.
local function last_epoch(record_key, epoch_key)
  local last = tonumber(redis.call('GET', epoch_key) or '0')
  local rec = read_record(record_key)
  if rec and rec.epoch > last then last = rec.epoch end
  return last
end

local function announce(channel, kind, cid, rec)
  redis.call('PUBLISH', channel, cjson.encode({
    kind = kind, conversation_id = cid, owner = rec.owner, incarnation = rec.incarnation,
    epoch = rec.epoch, num_cached_tokens = rec.num_cached_tokens, prefix_hash = rec.prefix_hash,
    lease_expires_ms = rec.lease_expires_ms}))
end

-- Keeps the worker zset's own TTL at its latest member's expiry, trimming expired members.
local function track_worker(zset, worker_id, expires_ms, now)
  redis.call('ZADD', zset, expires_ms, worker_id)
  redis.call('ZREMRANGEBYSCORE', zset, '-inf', now)
  local last = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', zset, last[2])
end
"""

# KEYS: record, epoch. ARGV: channel, cid, owner, incarnation, lease_ms, epoch_retention_ms,
# num_cached_tokens, prefix_hash
CLAIM = r"""
local now = now_ms()
local epoch = math.max(last_epoch(KEYS[1], KEYS[2]) + 1, now)
redis.call('SET', KEYS[2], epoch, 'PX', ARGV[6])
local rec = {owner = ARGV[3], incarnation = ARGV[4], epoch = epoch, num_cached_tokens = tonumber(ARGV[7]),
             prefix_hash = ARGV[8], lease_expires_ms = now + tonumber(ARGV[5])}
write_record(KEYS[1], rec)
announce(ARGV[1], 'claimed', ARGV[2], rec)
return epoch
"""

# KEYS: record. ARGV: channel, cid, owner, epoch, num_cached_tokens, prefix_hash, lease_ms
UPDATE = r"""
local rec = held(KEYS[1], ARGV[3], ARGV[4])
if not rec then return 0 end
rec.num_cached_tokens = tonumber(ARGV[5])
rec.prefix_hash = ARGV[6]
rec.lease_expires_ms = now_ms() + tonumber(ARGV[7])
write_record(KEYS[1], rec)
announce(ARGV[1], 'updated', ARGV[2], rec)
return 1
"""

# KEYS: record. ARGV: owner, epoch, lease_ms
RENEW = r"""
local rec = held(KEYS[1], ARGV[1], ARGV[2])
if not rec then return 0 end
rec.lease_expires_ms = now_ms() + tonumber(ARGV[3])
write_record(KEYS[1], rec)
return 1
"""

# KEYS: record. ARGV: channel, cid, owner, epoch
RELEASE = r"""
local rec = held(KEYS[1], ARGV[3], ARGV[4])
if not rec then return 0 end
redis.call('DEL', KEYS[1])
announce(ARGV[1], 'released', ARGV[2], rec)
return 1
"""

# KEYS: record, epoch. ARGV: channel, cid, owner, incarnation, epoch, num_cached_tokens,
# prefix_hash, remaining_lease_ms, epoch_retention_ms
RESTORE = r"""
local epoch = tonumber(ARGV[5])
local last = last_epoch(KEYS[1], KEYS[2])
local cur = read_record(KEYS[1])
if cur then
  local is_same_holder = cur.owner == ARGV[3] and cur.incarnation == ARGV[4]
  if cur.epoch > epoch or (cur.epoch == epoch and not is_same_holder) then return 0 end
elseif last > epoch then
  return 0
end
redis.call('SET', KEYS[2], math.max(last, epoch), 'PX', ARGV[9])
local rec = {owner = ARGV[3], incarnation = ARGV[4], epoch = epoch, num_cached_tokens = tonumber(ARGV[6]),
             prefix_hash = ARGV[7], lease_expires_ms = now_ms() + tonumber(ARGV[8])}
write_record(KEYS[1], rec)
announce(ARGV[1], 'restored', ARGV[2], rec)
return 1
"""

# KEYS: worker, workers zset. ARGV: worker_id, info_json, incarnation, load_json, ttl_ms.
# Returns the replaced registration's {info, load} (nils when there was none).
REGISTER = r"""
local now = now_ms()
local previous = redis.call('HMGET', KEYS[1], 'info', 'load')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'info', ARGV[2], 'incarnation', ARGV[3], 'load', ARGV[4], 'ttl_ms', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
track_worker(KEYS[2], ARGV[1], now + tonumber(ARGV[5]), now)
return previous
"""

# KEYS: worker, workers zset. ARGV: worker_id, incarnation ('' = any), load_json ('' = keep)
HEARTBEAT = r"""
local v = redis.call('HMGET', KEYS[1], 'incarnation', 'ttl_ms')
if not v[1] or (ARGV[2] ~= '' and v[1] ~= ARGV[2]) then return 0 end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'load', ARGV[3]) end
redis.call('PEXPIRE', KEYS[1], v[2])
local now = now_ms()
track_worker(KEYS[2], ARGV[1], now + tonumber(v[2]), now)
return 1
"""

# KEYS: worker, workers zset. ARGV: worker_id, incarnation
UNREGISTER = r"""
if redis.call('HGET', KEYS[1], 'incarnation') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

# KEYS: workers zset. Returns the ids of live workers.
LIVE_WORKER_IDS = r"""
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

ALL = {
    "claim": CLAIM,
    "update": UPDATE,
    "renew": RENEW,
    "release": RELEASE,
    "restore": RESTORE,
    "register": REGISTER,
    "heartbeat": HEARTBEAT,
    "unregister": UNREGISTER,
    "live_worker_ids": LIVE_WORKER_IDS,
}
