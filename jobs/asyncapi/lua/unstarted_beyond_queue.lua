-- The oldest unstarted requests (KEYS[1]) beyond as many as there are messages on the API's queue
-- (KEYS[2..], its lists), at most ARGV[1]: read in one step, so that no message moves between the counts.
local waiting = redis.call('ZCARD', KEYS[1])
local messages = 0
for i = 2, #KEYS do messages = messages + redis.call('LLEN', KEYS[i]) end
local beyond = math.min(waiting - messages, tonumber(ARGV[1]))
if beyond <= 0 then return {} end
return redis.call('ZRANGE', KEYS[1], 0, beyond - 1)
