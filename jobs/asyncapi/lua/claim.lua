-- Up to ARGV[3] queued requests of the API (KEYS[1] its queued list, KEYS[2] the owner's claims,
-- KEYS[3] the API's counts, KEYS[4] its unstarted set,
-- ARGV[4] the record key's prefix) taken by the owner ARGV[2]: {id, deliveries, ...}. Ids of
-- requests no longer queued (taken by their own delivery, ended, expired) are dropped from the list.
local claimed = {}
local wanted = tonumber(ARGV[3])
while #claimed < 2 * wanted do
  local id = redis.call('RPOP', KEYS[1])
  if not id then break end
  local record = ARGV[4] .. id
  if redis.call('HGET', record, 'status') == 'in_queue' then
    redis.call('HSET', record, 'status', 'in_progress', 'started', ARGV[1], 'owner', ARGV[2])
    redis.call('SADD', KEYS[2], id)
    redis.call('ZREM', KEYS[4], id)
    redis.call('HINCRBY', KEYS[3], 'in_queue', -1)
    redis.call('HINCRBY', KEYS[3], 'in_progress', 1)
    claimed[#claimed + 1] = id
    claimed[#claimed + 1] = redis.call('HINCRBY', record, 'deliveries', 1)
  end
end
if #claimed > 0 then redis.call('EXPIRE', KEYS[2], ARGV[5]) end
return claimed
