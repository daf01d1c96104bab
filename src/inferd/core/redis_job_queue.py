"""`RedisJobQueue`: async jobs in Redis Streams, one queue shared by several servers
(`--async-queue redis://host:6379/0`).

Each job is a hash (its document, as JSON, the stream entry that carries it, and a small inline
body the queue keeps, until the job ends) and an entry in
the stream of its priority, read by the consumer group `workers`: a server reads new entries with
XREADGROUP, and an entry stays pending (in the group's PEL) until the job ends and the server
acknowledges it. A job whose lease has run out (its server died, or it waits out a backoff) is
found among the pending entries and claimed by whichever server asks first. Every change of a
job's state is one Lua script, so it is atomic across servers: a lease takes the job only if it
is queued or its lease has run out, and gives it a token one higher; an end, an extension or a
requeue changes the job only for the holder of the latest token (a late writer, fenced out,
changes nothing).

Keys, under the prefix (default `inferd:async`): `job:{id}` (hash), `stream:{priority}`,
`priorities` (zset), `submitted` (zset by submit time: the list), `open:{model}` (zset: the
backlog), `models` (set), `ttl` (zset by expiry), `notify` (set: the outbox).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

from inferd.config.async_queue import DEFAULT_PREFIX, GROUP, stream_name
from inferd.core.async_jobs import IN_QUEUE, Backlog, Job, JobEnd, JobQuery, JobState, Lease, LeaseLength

# Pending entries looked at a lease for claims (ones whose lease ran out, or whose backoff ended).
_PENDING_SCAN = 100
# Jobs the list looks through (newest first) for those its filters match.
_LIST_SCAN = 10_000

_SUBMIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HGET', KEYS[1], 'doc') end
local entry = redis.call('XADD', KEYS[2], '*', 'id', ARGV[1])
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'entry', entry, 'stream', KEYS[2], 'lease_until', '0')
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
redis.call('SADD', KEYS[6], ARGV[5])
if ARGV[6] ~= '' then redis.call('ZADD', KEYS[7], ARGV[6], ARGV[1]) end
if ARGV[7] == '1' then redis.call('HSET', KEYS[1], 'body', ARGV[8]) end
return false
"""

# KEYS: job. ARGV: now, lease seconds (-1: the job's timeout decides, given in ARGV[3] and ARGV[4]).
_LEASE = """
local raw = redis.call('HGET', KEYS[1], 'doc')
if not raw then return false end
local job = cjson.decode(raw)
local now = tonumber(ARGV[1])
local takeable = (job.state == 'queued' and job.not_before <= now)
    or (job.state == 'running' and job.lease_until < now)
if not takeable then return false end
local lease_s = tonumber(ARGV[2])
if job.timeout_s ~= cjson.null and job.timeout_s then lease_s = tonumber(ARGV[3]) end
job.state = 'running'
job.attempts = job.attempts + 1
job.token = job.token + 1
job.lease_until = now + lease_s
if job.started_at == cjson.null or not job.started_at then job.started_at = now end
local encoded = cjson.encode(job)
redis.call('HSET', KEYS[1], 'doc', encoded, 'lease_until', tostring(job.lease_until))
return encoded
"""

# KEYS: job. ARGV: token, the changes (JSON). Only the latest token's holder, on a running job.
_FENCED = """
local raw = redis.call('HGET', KEYS[1], 'doc')
if not raw then return false end
local job = cjson.decode(raw)
if job.token ~= tonumber(ARGV[1]) or job.state ~= 'running' then return false end
for name, value in pairs(cjson.decode(ARGV[2])) do job[name] = value end
local encoded = cjson.encode(job)
redis.call('HSET', KEYS[1], 'doc', encoded, 'lease_until', tostring(job.lease_until))
return encoded
"""

# KEYS: job. ARGV: the state it must be in, the changes (JSON).
_IF_STATE = """
local raw = redis.call('HGET', KEYS[1], 'doc')
if not raw then return false end
local job = cjson.decode(raw)
if job.state ~= ARGV[1] then return raw end
for name, value in pairs(cjson.decode(ARGV[2])) do job[name] = value end
local encoded = cjson.encode(job)
redis.call('HSET', KEYS[1], 'doc', encoded, 'lease_until', tostring(job.lease_until))
return encoded
"""


class RedisJobQueue:
    def __init__(self, url: str, consumer: str = "", prefix: str = DEFAULT_PREFIX) -> None:
        """`consumer`: this server's name in the consumer group, the same across its restarts (so
        that it takes back at once what it was running); default the host's name."""
        import redis

        self._redis: Any = redis.Redis.from_url(url, decode_responses=True)
        self._bodies: Any = redis.Redis.from_url(url)  # bodies are bytes, not text
        self._redis.ping()  # a wrong URL is said at startup, not at the first job
        self._consumer = consumer or socket.gethostname()
        self._prefix = prefix
        self._groups: set[str] = set()
        self._submit = self._redis.register_script(_SUBMIT)
        self._lease = self._redis.register_script(_LEASE)
        self._fenced = self._redis.register_script(_FENCED)
        self._if_state = self._redis.register_script(_IF_STATE)

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    def _stream(self, priority: int) -> str:
        stream = stream_name(priority, self._prefix)
        if stream not in self._groups:
            try:
                self._redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except Exception as exc:  # BUSYGROUP: another server made it first
                if "BUSYGROUP" not in str(exc):
                    raise
            self._groups.add(stream)
        return stream

    def submit(self, job: Job, body: bytes | None = None) -> tuple[Job, bool]:
        expires = "" if job.ttl_s is None else repr(job.submitted_at + job.ttl_s)
        existing = self._submit(
            keys=[
                self._key("job", job.id), self._stream(job.priority), self._key("priorities"),
                self._key("submitted"), self._key("open", job.request.model), self._key("models"), self._key("ttl"),
            ],
            args=[job.id, json.dumps(job.document()), job.priority, job.submitted_at, job.request.model, expires,
                  "0" if body is None else "1", body or b""],
        )  # fmt: skip
        if existing:
            return Job.from_document(json.loads(existing)), False
        return job, True

    def get(self, job_id: str) -> Job | None:
        raw = self._redis.hget(self._key("job", job_id), "doc")
        return None if raw is None else Job.from_document(json.loads(raw))

    def query(self, query: JobQuery) -> list[Job]:
        ids = self._redis.zrevrange(self._key("submitted"), 0, _LIST_SCAN - 1)
        found: list[Job] = []
        for start in range(0, len(ids), 500):
            pipeline = self._redis.pipeline(transaction=False)
            for job_id in ids[start : start + 500]:
                pipeline.hget(self._key("job", job_id), "doc")
            for raw in pipeline.execute():
                if raw is None:
                    continue
                job = Job.from_document(json.loads(raw))
                if (query.model and job.request.model != query.model) or (
                    query.state is not None and job.state is not query.state
                ):
                    continue
                found.append(job)
                if len(found) >= query.limit:
                    return found
        return found

    def recover(self, now: float) -> int:
        """Jobs this server (its consumer name) was running when it stopped: leased again at once."""
        recovered = 0
        for stream in self._streams():
            for pending in self._redis.xpending_range(stream, GROUP, "-", "+", 1000, consumername=self._consumer):
                job_id = self._entry_job(stream, pending["message_id"])
                if job_id is None:
                    continue
                if self._if_state(keys=[self._key("job", job_id)], args=["running", json.dumps({"lease_until": 0})]):
                    recovered += 1
        return recovered

    def lease(self, now: float, lease_s: LeaseLength) -> Lease | None:
        for stream in self._streams():
            lease = self._claim_pending(stream, now, lease_s) or self._read_new(stream, now, lease_s)
            if lease is not None:
                return lease
        return None

    def lease_many(self, now: float, lease_s: LeaseLength, limit: int) -> list[Lease]:
        leases: list[Lease] = []
        while len(leases) < limit and (lease := self.lease(now, lease_s)) is not None:
            leases.append(lease)
        return leases

    def _claim_pending(self, stream: str, now: float, lease_s: LeaseLength) -> Lease | None:
        pending = self._redis.xpending_range(stream, GROUP, "-", "+", _PENDING_SCAN)
        if not pending:
            return None
        pipeline = self._redis.pipeline(transaction=False)
        entries = self._redis.xrange(stream, pending[0]["message_id"], pending[-1]["message_id"])
        jobs = {entry_id: fields.get("id") for entry_id, fields in entries}
        candidates = [(p["message_id"], jobs.get(p["message_id"])) for p in pending]
        for _, job_id in candidates:
            pipeline.hget(self._key("job", job_id or ""), "lease_until")
        for (entry_id, job_id), lease_until in zip(candidates, pipeline.execute(), strict=True):
            if job_id is None or lease_until is None:
                self._redis.xack(stream, GROUP, entry_id)  # an entry of no job: nothing to run
                continue
            if float(lease_until) >= now:
                continue  # held, or waiting out a backoff
            lease = self._take(job_id, now, lease_s)
            if lease is not None:
                # Ownership follows the lease (for XPENDING's view, and this server's recover).
                self._redis.xclaim(stream, GROUP, self._consumer, 0, [entry_id], justid=True)
                return lease
            job = self.get(job_id)
            if job is not None and job.state.ended:
                self._redis.xack(stream, GROUP, entry_id)
        return None

    def _read_new(self, stream: str, now: float, lease_s: LeaseLength) -> Lease | None:
        while True:
            read = self._redis.xreadgroup(GROUP, self._consumer, {stream: ">"}, count=1)
            if not read:
                return None
            entry_id, fields = read[0][1][0]
            lease = self._take(fields.get("id", ""), now, lease_s)
            if lease is not None:
                return lease
            job = self.get(fields.get("id", ""))
            if job is None or job.state.ended:  # cancelled or expired before it was read
                self._redis.xack(stream, GROUP, entry_id)
            # else: queued but not due (a backoff): pending, claimed when its lease_until passes

    def _take(self, job_id: str, now: float, lease_s: LeaseLength) -> Lease | None:
        raw = self.get(job_id)
        if raw is None:
            return None
        taken = self._lease(keys=[self._key("job", job_id)], args=[now, lease_s(None), lease_s(raw.timeout_s)])
        if not taken:
            return None
        job = Job.from_document(json.loads(taken))
        body = self._bodies.hget(self._key("job", job_id), "body") if job.input_location == IN_QUEUE else None
        return Lease(job, job.token, body)

    def extend(self, lease: Lease, until: float) -> bool:
        return bool(self._change(lease, {"lease_until": until}))

    def end_many(self, ends: Sequence[JobEnd], now: float) -> list[bool]:
        return [self._end(end, now) for end in ends]

    def _end(self, end: JobEnd, now: float) -> bool:
        changes = {"state": end.state.value, "ended_at": now, "error": end.error, "error_code": end.error_code,
                   "notify_pending": end.notify, "dead_lettered": end.dead_lettered}  # fmt: skip
        ended = self._change(end.lease, changes)
        if ended is None:
            return False
        self._closed(ended, end.notify)
        return True

    def requeue(self, lease: Lease, not_before: float, error: str) -> bool:
        # The entry stays pending: the job is claimed again once `not_before` (its lease) passes.
        changes = {"state": "queued", "not_before": not_before, "lease_until": not_before, "error": error}
        return self._change(lease, changes) is not None

    def cancel(self, job_id: str, now: float) -> Job | None:
        raw = self._if_state(keys=[self._key("job", job_id)], args=["queued", json.dumps(
            {"state": "cancelled", "ended_at": now})])  # fmt: skip
        if not raw:
            return None
        job = Job.from_document(json.loads(raw))
        if job.state is JobState.CANCELLED:
            self._closed(job, notify=False)
        return job

    def expire(self, now: float) -> list[Job]:
        expired = []
        for job_id in self._redis.zrangebyscore(self._key("ttl"), "-inf", now):
            changes = {"state": "expired", "ended_at": now, "error": "its TTL passed before it ran"}
            raw = self._if_state(keys=[self._key("job", job_id)], args=["queued", json.dumps(changes)])
            self._redis.zrem(self._key("ttl"), job_id)
            if raw:
                job = Job.from_document(json.loads(raw))
                if job.state is JobState.EXPIRED:
                    self._closed(job, notify=False)
                    expired.append(job)
        return expired

    def pending_notifications(self, limit: int) -> list[Job]:
        jobs = [self.get(job_id) for job_id in self._redis.srandmember(self._key("notify"), limit)]
        return [job for job in jobs if job is not None]

    def notified(self, job_id: str) -> None:
        self._redis.srem(self._key("notify"), job_id)

    def backlog(self, now: float) -> Sequence[Backlog]:
        entries = []
        for model in sorted(self._redis.smembers(self._key("models"))):
            key = self._key("open", model)
            count = self._redis.zcard(key)
            if not count:
                continue
            oldest = self._redis.zrange(key, 0, 0, withscores=True)
            entries.append(Backlog(model, int(count), max(0.0, now - float(oldest[0][1]))))
        return entries

    def close(self) -> None:
        self._redis.close()
        self._bodies.close()

    # -- the steps each change shares ----------------------------------------------------------

    def _streams(self) -> list[str]:
        """The streams, highest priority first."""
        return [self._stream(int(p)) for p in self._redis.zrevrange(self._key("priorities"), 0, -1)]

    def _entry_job(self, stream: str, entry_id: str) -> str | None:
        entries = self._redis.xrange(stream, entry_id, entry_id)
        return entries[0][1].get("id") if entries else None

    def _change(self, lease: Lease, changes: dict[str, Any]) -> Job | None:
        raw = self._fenced(keys=[self._key("job", lease.job.id)], args=[lease.token, json.dumps(changes)])
        return None if not raw else Job.from_document(json.loads(raw))

    def _closed(self, job: Job, notify: bool) -> None:
        """An ended job leaves the stream's pending entries, the backlog and the expiry list, and
        its body (if the queue kept it) is let go."""
        key = self._key("job", job.id)
        entry, stream = self._redis.hmget(key, "entry", "stream")
        pipeline = self._redis.pipeline(transaction=False)
        if entry and stream:
            pipeline.xack(stream, GROUP, entry)
        pipeline.zrem(self._key("open", job.request.model), job.id)
        pipeline.zrem(self._key("ttl"), job.id)
        pipeline.hdel(key, "body")
        if notify:
            pipeline.sadd(self._key("notify"), job.id)
        pipeline.execute()
