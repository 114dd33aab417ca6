-- Lua: the request `id` joins the unstarted set `key` after the newest there (the set keeps the order
-- requests were stored in; scores restart from 1 once it is empty).
local function UNSTARTED(key, id)
  local newest = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
  local score = 1
  if newest[2] then score = tonumber(newest[2]) + 1 end
  redis.call('ZADD', key, score, id)
end
