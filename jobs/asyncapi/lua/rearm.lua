-- After a batch: 1 when requests are still queued and no task for them is on its way (the caller sends one).
if redis.call('LLEN', KEYS[1]) == 0 then return 0 end
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then return 1 end
return 0
