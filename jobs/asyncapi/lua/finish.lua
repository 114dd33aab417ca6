-- The outcome, once: only a request still queued or in progress ends (1), any later call is 0.
-- The one call that ends it counts it: out of its API's queued or in-progress count, into the
-- slot of requests ended (`jobs/asyncapi/counts.py`), the outcome figure and the duration histogram
-- (submission to now, both server times; `foundation/figures.py`'s stored form).
-- With ARGV[9] (a delivery's task id), that delivery also leaves its node's in-flight hash (KEYS[7]),
-- whether or not this call ends the request: its last step (`jobs/nodes/registry.py` `end_delivery`).
-- An ended request is not unstarted (KEYS[8]).
-- KEYS: record, expiry set, counts, ended slot, outcome figure, duration figure, in-flight hash,
-- unstarted set.
-- ARGV: expire seconds, expiry score, expiry member, now, status, outcome field, duration labels,
-- slot expire seconds, ending delivery's task id, request id, then the fields to set.
if ARGV[9] ~= '' then redis.call('HDEL', KEYS[7], ARGV[9]) end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'in_queue' and status ~= 'in_progress' then return 0 end
redis.call('ZREM', KEYS[8], ARGV[10])
local created = tonumber(redis.call('HGET', KEYS[1], 'created') or '')
redis.call('HSET', KEYS[1], unpack(ARGV, 11))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], status, -1)
redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
redis.call('EXPIRE', KEYS[4], ARGV[8])
redis.call('HINCRBY', KEYS[5], ARGV[6], 1)
if created then
  local seconds = math.max(0, tonumber(ARGV[4]) - created)
  local le = '+Inf'
  for i = 1, #BOUNDS do
    if seconds <= BOUNDS[i] then le = LES[i]; break end
  end
  redis.call('HINCRBY', KEYS[6], ARGV[7] .. '|' .. le, 1)
  redis.call('HINCRBYFLOAT', KEYS[6], ARGV[7] .. '|sum', tostring(seconds))
end
return 1
