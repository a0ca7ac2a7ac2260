"""The phases an operation's progress names (docs/api.md: Operations, Operation): what its worker was doing when
it last measured, or how its attempt ended. A phase is only a name beside measured counts, never a
percentage or an ETA.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """``progress.phase`` of an operation, in the order an export meets them.

    The repository writes the phases that end an attempt with the state it writes
    (``shared.repository.leases``); an attempt that ends in RETRY_AT, FAILED or FAILED_REPAIR shows
    that state's name in lower case.
    """

    WAITING = "waiting"
    STARTING = "starting"
    WRITING = "writing"
    UPLOADING = "uploading"
    DONE = "done"
    RETRY_AT = "retry_at"
    FAILED = "failed"
    FAILED_REPAIR = "failed_repair"
    CANCELED = "canceled"
    EXPIRED = "expired"
    HANDED_BACK = "handed back"


def described() -> str:
    """Every phase as prose for the API's schema: ``waiting (not started), starting, ... or handed back``."""
    names = [f"{Phase.WAITING} (not started)", *(phase.value for phase in list(Phase)[1:])]
    return ", ".join(names[:-1]) + " or " + names[-1]
