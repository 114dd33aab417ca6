-- A request offered to batches (KEYS[1] the API's queued list, KEYS[2] its wake key, KEYS[3] its
-- unstarted set, which it leaves): 1 when no task for the queued requests is on its way (the caller
-- sends one: the wake key is now set for it).
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[3]) then return 1 end
return 0
