"""The resumable SHA-256 of chunked assemblies (docs/chunks.md: Chunked exports, A coordinator's takeover): any
split of the bytes, with the state saved and taken up again at each cut, gives hashlib's digest.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from services.worker.chunked.sha256_state import STATE_BYTES, ResumableSha256


@pytest.mark.parametrize("seed", range(8))
def test_a_state_taken_up_at_any_cut_gives_hashlibs_digest(seed: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(0, 300_000))
    cuts = sorted(rng.randrange(0, len(data) + 1) for _ in range(rng.randrange(0, 6)))
    hasher = ResumableSha256()
    start = 0
    for cut in [*cuts, len(data)]:
        hasher.update(data[start:cut])
        hasher = ResumableSha256(hasher.state())
        start = cut
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_digest_midway_leaves_the_hash_going_on() -> None:
    hasher = ResumableSha256()
    hasher.update(b"abc")
    assert hasher.hexdigest() == hashlib.sha256(b"abc").hexdigest()
    hasher.update(b"def")
    assert hasher.hexdigest() == hashlib.sha256(b"abcdef").hexdigest()


def test_a_state_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match=str(STATE_BYTES)):
        ResumableSha256(b"\0" * (STATE_BYTES - 1))
