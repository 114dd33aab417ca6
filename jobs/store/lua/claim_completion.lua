-- Who may run a job's `on_job_complete` (jobs/store/claims.py: `claim_completion`).
-- KEYS[1] the job hash. ARGV: claim token ("<task id>/<nonce>"), task id ('' for none).
-- The first claimant, and a repeat of its own call, get 'claimed'. Later claimants learn whether
-- the hook already ran ('ran': settle the job's status), whether an earlier delivery of their very
-- task claimed it and died ('died': it may or may not have run, and it is never run twice), or
-- whether someone else holds it now ('busy'); 'gone' when the job's record is gone.
if redis.call('HEXISTS', KEYS[1], 'record') == 0 then return 'gone' end
local current = redis.call('HGET', KEYS[1], 'completing')
if not current then
  redis.call('HSET', KEYS[1], 'completing', ARGV[1])
  return 'claimed'
end
if redis.call('HEXISTS', KEYS[1], 'hook_done') == 1 then return 'ran' end
if current == ARGV[1] then return 'claimed' end
if ARGV[2] ~= '' and string.sub(current, 1, #ARGV[2] + 1) == ARGV[2] .. '/' then return 'died' end
return 'busy'
