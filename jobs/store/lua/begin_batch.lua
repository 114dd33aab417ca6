-- Check and count one delivery of a batch (jobs/store/ledger.py: `begin_batch`).
-- KEYS[1] the job hash, KEYS[2] its done set, KEYS[3] its starts hash, KEYS[4] the node's in-flight hash,
-- KEYS[5] kombu's unacknowledged hash and KEYS[6] its index (written only when the broker left its
-- write to this script: jobs/transport/delivery.py `BrokerReceipt`), KEYS[7] the job's timed-out tries.
-- ARGV: batch index, task id ('' for none), in-flight entry, token, the receipt's delivery tag,
-- its unacknowledged entry and the time it was taken ('' x3 for none), active statuses...
-- Returns {status, already recorded (0/1), deliveries of this batch so far, tries the time limit used up}. Deliveries are counted
-- only while the job is active, so an ended job gains no key, and a repeat of the same call (same
-- token) is not counted again. A batch that will run is entered in its node's in-flight hash under
-- its task id, so that it can be given back if the node dies (jobs/settle.py).
if ARGV[5] ~= '' then  -- what kombu writes when a node takes a message, whatever becomes of the batch
  redis.call('ZADD', KEYS[6], ARGV[7], ARGV[5])
  redis.call('HSET', KEYS[5], ARGV[5], ARGV[6])
end
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'', 0, 0, 0} end
local done = redis.call('SISMEMBER', KEYS[2], ARGV[1])
local starts = 0
for i = 8, #ARGV do
  if ARGV[i] == status then
    local token_field = ARGV[1] .. ':by'
    if redis.call('HGET', KEYS[3], token_field) == ARGV[4] then
      starts = tonumber(redis.call('HGET', KEYS[3], ARGV[1]))
    else
      starts = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
      redis.call('HSET', KEYS[3], token_field, ARGV[4])
    end
  end
end
if starts > 0 and done == 0 and ARGV[2] ~= '' then redis.call('HSET', KEYS[4], ARGV[2], ARGV[3]) end
local timed_out = tonumber(redis.call('HGET', KEYS[7], ARGV[1]) or 0)
return {status, done, starts, timed_out}
