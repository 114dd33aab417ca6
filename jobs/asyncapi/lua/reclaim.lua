-- The owner's claimed requests still in progress under it, taken again: {id, deliveries, ...}.
local taken = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local record = ARGV[3] .. id
  if redis.call('HGET', record, 'status') == 'in_progress' and redis.call('HGET', record, 'owner') == ARGV[2] then
    redis.call('HSET', record, 'started', ARGV[1])
    taken[#taken + 1] = id
    taken[#taken + 1] = redis.call('HINCRBY', record, 'deliveries', 1)
  end
end
return taken
