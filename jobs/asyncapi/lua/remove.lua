-- Forgets an expired request (ARGV[2] its id); one whose record is still there unended leaves its API's
-- counts, and its unstarted set (KEYS[4]).
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'in_queue' or status == 'in_progress' then redis.call('HINCRBY', KEYS[3], status, -1) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
