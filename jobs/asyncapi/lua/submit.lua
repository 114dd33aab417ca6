-- A request submitted: refused (-1) unless its API is registered (KEYS[4], field ARGV[4]; the API
-- routed it by a view of the registry up to a second old), 0 when one of its id exists already, else
-- created (`_CREATE`), its task's message (ARGV[8], when given) pushed on the broker's list (KEYS[7]),
-- and, when ARGV[6] is '1' (`server_side_batching`), offered to batches at once
-- (`_QUEUE`: 2 when the caller sends the task for the queued requests, else 1), else unstarted.
-- -2, nothing done, when ARGV[9] (the registry generation the caller routed the request by) is given
-- and the registry's (KEYS[9]) has moved on: a deploy or delete since may have changed the route.
-- KEYS: record, expiry set, counts, registry, queued list, wake key, the task's broker list, unstarted
-- set, registry generation.
-- ARGV: expire seconds, expiry score, expiry member, api name, request id, queued, wake ttl, task
-- message, routed generation (or ''), fields.
if ARGV[9] ~= '' and (redis.call('GET', KEYS[9]) or '0') ~= ARGV[9] then return -2 end
if redis.call('HEXISTS', KEYS[4], ARGV[4]) == 0 then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 10))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'in_queue', 1)
if ARGV[8] ~= '' then redis.call('LPUSH', KEYS[7], ARGV[8]) end
if ARGV[6] ~= '1' then
  UNSTARTED(KEYS[8], ARGV[5])
  return 1
end
redis.call('LPUSH', KEYS[5], ARGV[5])
redis.call('EXPIRE', KEYS[5], ARGV[1])
if redis.call('SET', KEYS[6], '1', 'NX', 'EX', ARGV[7]) then return 2 end
return 1
