"""The envelope's ``unique`` policy (OJS unique-jobs spec), enforced by the broker.

RabbitMQ cannot look jobs up, but it can refuse a publish: a ``unique`` job claims its
fingerprint with the lock queue of :mod:`._dedup` (the mechanism of ``idempotency_key``)
for the policy's ``period``.  What that enforces, and what it cannot:

* ``on_conflict="reject"`` (the default): a second job with the same fingerprint within the
  period raises :class:`DuplicateJobError`; ``"ignore"``: the push returns the *existing*
  job's id instead and publishes nothing.  Concurrent pushes cannot both win (the lock
  queue's ``x-max-length: 1`` with ``reject-publish`` is atomic): **strong** uniqueness, in
  the spec's terms, within the period.
* ``"replace"`` and ``"replace_except_schedule"`` are refused: a queued message cannot be
  taken back out of a RabbitMQ queue to be replaced.
* A policy without a ``period`` is refused: the lock is a message TTL, at most 2^32-1 ms.
* ``states``: the lock holds for the whole period from the first push, whatever state the
  first job is in (RabbitMQ cannot see it): a job that completed within the period still
  blocks a duplicate.  That is the spec's behaviour when ``states`` includes the terminal
  states, and stricter than its default.

Pure functions: the fingerprint is the spec's (§4): the dimensions (``type`` always, plus
``keys``), canonical JSON (object keys sorted at every level, compact, strings in NFC),
SHA-256, lowercase hex.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from typing import Any

import msgspec

from .._misuse import UsageError
from ._envelope import Job, UniquePolicy
from ._iso_duration import parse_duration_ms

__all__ = ["fingerprint", "unique_lock"]

#: The prefix of the idempotency key a unique job claims (its fingerprint follows).
KEY_PREFIX = "unique:"


def _nfc(value: Any) -> Any:
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, list):
        return [_nfc(v) for v in value]
    if isinstance(value, dict):
        return {_nfc(k): _nfc(v) for k, v in value.items()}
    return value


def _args_dimension(job: Job, policy: UniquePolicy) -> Any:
    if isinstance(policy.args_keys, msgspec.UnsetType):
        return list(job.args)
    args = list(job.args)
    if len(args) != 1 or not isinstance(args[0], dict):
        raise UsageError(
            f"job {job.id}: unique.args_keys selects keys of the job's arguments, so the arguments "
            "must be one JSON object (args=[{...}])"
        )
    missing = [k for k in policy.args_keys if k not in args[0]]
    if missing:
        raise UsageError(f"job {job.id}: unique.args_keys names keys the arguments lack: {missing}")
    return {k: args[0][k] for k in policy.args_keys}


def fingerprint(job: Job) -> str:
    """The uniqueness fingerprint of ``job`` under its ``unique`` policy (spec §4)."""
    policy = job.unique
    if isinstance(policy, msgspec.UnsetType):
        raise UsageError(f"job {job.id} has no unique policy")
    keys = set() if isinstance(policy.keys, msgspec.UnsetType) else set(policy.keys)
    dimensions: dict[str, Any] = {"type": job.type}
    if "queue" in keys:
        dimensions["queue"] = job.queue
    if "args" in keys:
        dimensions["args"] = _args_dimension(job, policy)
    if "meta" in keys:
        meta = msgspec.to_builtins(job.meta) if not isinstance(job.meta, msgspec.UnsetType) else {}
        wanted = () if isinstance(policy.meta_keys, msgspec.UnsetType) else policy.meta_keys
        dimensions["meta"] = {k: meta[k] for k in wanted if isinstance(meta, dict) and k in meta}
    canonical = json.dumps(_nfc(dimensions), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def unique_lock(job: Job) -> tuple[str, float, bool]:
    """``(key, period in seconds, ignore)`` for a unique job's claim, or :class:`UsageError`
    with the reason when the policy cannot be enforced on a broker."""
    policy = job.unique
    assert not isinstance(policy, msgspec.UnsetType)
    on_conflict = "reject" if isinstance(policy.on_conflict, msgspec.UnsetType) else policy.on_conflict
    if on_conflict in ("replace", "replace_except_schedule"):
        raise UsageError(
            f"job {job.id}: unique.on_conflict={on_conflict!r} cannot be enforced on RabbitMQ: a queued "
            "message cannot be taken back out of its queue to be replaced; use 'reject' or 'ignore'"
        )
    if isinstance(policy.period, msgspec.UnsetType):
        raise UsageError(
            f"job {job.id}: a unique policy needs a 'period' here: the broker holds the lock as a message "
            "TTL, at most 2^32-1 ms (about 49.7 days), so 'no expiry' cannot be enforced"
        )
    period_ms = parse_duration_ms(policy.period)
    return f"{KEY_PREFIX}{fingerprint(job)}", period_ms / 1000, on_conflict == "ignore"
