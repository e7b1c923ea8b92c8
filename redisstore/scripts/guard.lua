-- fleetrate failover guard (Options.EmptyAfterFailover): prepended to each
-- script, it runs it only on the master the store expects. ARGV[1] is the
-- replication ID (INFO replication's master_replid) of that master; it is
-- removed, so the script after it reads its own ARGV unchanged. A replica
-- promoted to master, or a master restarted without its data, has a new
-- replication ID: the script then writes nothing and fails with
-- "FLEETRATE_MASTER <id>", so the store first empties the buckets that the
-- old master may have granted from (see failover.go). A server that is not
-- a master fails with "READONLY FLEETRATE_NOTMASTER": the READONLY prefix
-- Redis itself gives a write to a replica, on which go-redis closes the
-- connection and retries on a new one, so that a client left on a demoted
-- master follows the failover as it does without the guard. Reading INFO costs Redis
-- about 4 µs per call, which is why the guard is an option.
local expect = table.remove(ARGV, 1)
local info = redis.call('INFO', 'replication')
if not string.find(info, 'role:master', 1, true) then
  return redis.error_reply('READONLY FLEETRATE_NOTMASTER this server is not a master')
end
local id = string.match(info, 'master_replid:(%x+)')
if id ~= expect then
  return redis.error_reply('FLEETRATE_MASTER ' .. tostring(id))
end
