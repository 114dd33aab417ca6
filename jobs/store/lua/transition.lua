-- Move a job to a new status, only from one of the allowed ones (jobs/store/records.py: `transition`).
-- KEYS[1] the job hash, KEYS[2] the figure of ended jobs.
-- ARGV: new status, end time ('' for none), message ('' for none), token, allowed current statuses...
-- Returns 1 if the job moved (or this very call, same token, moved it already), else 0. A job that
-- ends is counted in the figure here (foundation/figures.py), so exactly once whichever process ends it.
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return 0 end
if current == ARGV[1] and redis.call('HGET', KEYS[1], 'moved_by') == ARGV[4] then return 1 end
for i = 5, #ARGV do
  if ARGV[i] == current then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], 'moved_by', ARGV[4])
    if ARGV[2] ~= '' then
      redis.call('HSET', KEYS[1], 'end_time', ARGV[2])
      local ok, record = pcall(cjson.decode, redis.call('HGET', KEYS[1], 'record') or '')
      local api = (ok and type(record) == 'table' and record['api_name']) or ''
      redis.call('HINCRBY', KEYS[2], cjson.encode({tostring(api), (string.gsub(ARGV[1], '^status_', ''))}), 1)
    end
    if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'message', ARGV[3]) end
    return 1
  end
end
return 0
