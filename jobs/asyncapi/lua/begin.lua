-- A delivery (ARGV[2], its owner) takes the request: counted, and in progress unless it has ended or
-- another owner holds it in progress (status, deliveries, held: 1 for that); a request taken comes
-- with its record's fields (the node needs its payload: one round trip instead of two). With ARGV[3]
-- (the delivery's in-flight entry), the delivery first enters its node's in-flight hash (KEYS[3]),
-- whatever the request's state: the node's step of `jobs/nodes/registry.py` `begin_delivery`, in the same trip.
-- A delivery finding the request (ARGV[4] its id) took its message: it is no longer unstarted (KEYS[4]).
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[2], ARGV[3]) end
redis.call('ZREM', KEYS[4], ARGV[4])
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'', 0, 0} end
if status ~= 'in_queue' and status ~= 'in_progress' then return {status, 0, 0} end
local owner = redis.call('HGET', KEYS[1], 'owner')
if status == 'in_progress' and owner and owner ~= '' and owner ~= ARGV[2] then return {status, 0, 1} end
redis.call('HSET', KEYS[1], 'status', 'in_progress', 'started', ARGV[1], 'owner', ARGV[2])
if status == 'in_queue' then
  redis.call('HINCRBY', KEYS[2], 'in_queue', -1)
  redis.call('HINCRBY', KEYS[2], 'in_progress', 1)
end
local taken = {status, redis.call('HINCRBY', KEYS[1], 'deliveries', 1), 0}
for _, value in ipairs(redis.call('HGETALL', KEYS[1])) do taken[#taken + 1] = value end
return taken
