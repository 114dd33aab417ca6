-- Sets the record's fields unless it exists already; its expiry is remembered; one more queued; it is
-- unstarted (KEYS[4]; ARGV[4] its id) after the newest there.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'in_queue', 1)
UNSTARTED(KEYS[4], ARGV[4])
return 1
