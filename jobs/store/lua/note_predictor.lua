-- Say what a node is doing with a job's predictor (jobs/store/records.py: `note_predictor`), only
-- while the job exists: a node late for an expired job must not make its hash again (with no TTL).
-- KEYS[1] the job hash. ARGV: the note. Returns 1 when written.
if redis.call('HEXISTS', KEYS[1], 'record') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'predictor_note', ARGV[1])
return 1
