-- Fix a job's batch count once enqueueing is over (jobs/store/ledger.py: `seal`).
-- KEYS[1] the job hash, KEYS[2] its done set. ARGV: total batch count, token, now.
-- Returns 1 when every batch is already recorded (then the caller sends the completion task; a
-- repeat of that very call is told 1 again), else 0.
if redis.call('HEXISTS', KEYS[1], 'record') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'sealed_total', ARGV[1])
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[1]) then
  if redis.call('HSETNX', KEYS[1], 'finishing', ARGV[2]) == 1 then
    redis.call('HSET', KEYS[1], 'finishing_at', ARGV[3])
    return 1
  end
  if redis.call('HGET', KEYS[1], 'finishing') == ARGV[2] then return 1 end
end
return 0
