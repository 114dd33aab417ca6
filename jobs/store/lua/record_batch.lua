-- Record a batch's outcome once, whoever reports it (jobs/store/ledger.py: `record_success`, `record_failure`).
-- KEYS[1] the job hash, KEYS[2] its done set, KEYS[3] its failed hash, KEYS[4] the node's in-flight
-- hash, KEYS[5] the job's kept payloads, and with a broker receipt (jobs/transport/delivery.py)
-- KEYS[6] kombu's unacknowledged hash and KEYS[7] its index.
-- ARGV: index, 'ok'|'failed', seconds, failure json, task id ('' for none), token, now, the receipt's
-- delivery tag ('' for none): the message is acknowledged here, as the batch leaves the node.
-- Returns 0 for a batch already recorded, 1 once recorded, 2 when this record was the last one of
-- a sealed job: the caller alone then sends the job's completion task (a repeat of that very call,
-- same token, is told 2 again: its first reply may never have reached it).
if ARGV[5] ~= '' then redis.call('HDEL', KEYS[4], ARGV[5]) end
if ARGV[8] and ARGV[8] ~= '' then
  redis.call('ZREM', KEYS[7], ARGV[8])
  redis.call('HDEL', KEYS[6], ARGV[8])
end
if redis.call('HEXISTS', KEYS[1], 'record') == 0 then return 0 end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then
  if redis.call('HGET', KEYS[1], 'finishing') == ARGV[6] then return 2 end
  return 0
end
redis.call('HDEL', KEYS[5], ARGV[1])
if ARGV[2] == 'ok' then
  redis.call('HINCRBY', KEYS[1], 'succeeded', 1)
else
  redis.call('HINCRBY', KEYS[1], 'failed', 1)
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
end
redis.call('HINCRBYFLOAT', KEYS[1], 'time_total', ARGV[3])
-- A batch finishing after its job ended must not leave keys that never expire.
local ttl = redis.call('TTL', KEYS[1])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[2], ttl)
  if ARGV[2] ~= 'ok' then redis.call('EXPIRE', KEYS[3], ttl) end
end
local total = redis.call('HGET', KEYS[1], 'sealed_total')
if total and redis.call('SCARD', KEYS[2]) >= tonumber(total) then
  if redis.call('HSETNX', KEYS[1], 'finishing', ARGV[6]) == 1 then
    redis.call('HSET', KEYS[1], 'finishing_at', ARGV[7])
    return 2
  end
end
return 1
