"""What ``chatexport export --incremental`` remembers beside OUTPUT (docs/command-line.md: Command-line client): the
watermark, and an append recorded before OUTPUT grows so that a crash before the watermark is saved is
undone by the next run, never duplicated.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from chatexport.client import incremental
from chatexport.client.incremental import History, history_path
from chatexport.client.statefiles import UnusableStateFile

CID = "c1"
REQUEST = {"format": "jsonl"}


def lines(first: int, last: int) -> bytes:
    """The export of the messages ``first`` to ``last`` (by seq), as OUTPUT holds them."""
    return b"".join(b'{"seq":%d}\n' % seq for seq in range(first, last + 1))


def run(output: Path, piece_bytes: bytes, *, next_after_seq: int, crash_before_commit: bool = False) -> History:
    """One run's local steps: resume, the verified piece the export gave, append, and the watermark's save
    unless it crashes just before that.
    """
    history = incremental.resume(output, conversation_id=CID, request=REQUEST)
    piece = output.with_name(output.name + ".part")
    piece.write_bytes(piece_bytes)
    pending = incremental.append(output, history, piece, next_after_seq=next_after_seq)
    return pending if crash_before_commit else incremental.commit(output, pending)


def recorded(output: Path) -> dict[str, object]:
    state: dict[str, object] = json.loads(history_path(output).read_text())
    return state


def test_the_first_run_starts_at_seq_0_and_each_run_appends_after_the_last(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    assert incremental.resume(output, conversation_id=CID, request=REQUEST).next_after_seq == 0

    run(output, lines(1, 3), next_after_seq=3)
    assert incremental.resume(output, conversation_id=CID, request=REQUEST).next_after_seq == 3
    run(output, lines(4, 5), next_after_seq=5)

    assert output.read_bytes() == lines(1, 5)
    assert recorded(output) == {
        "conversation_id": CID,
        "request": REQUEST,
        "next_after_seq": 5,
        "output_bytes": len(lines(1, 5)),
        "pending_next_after_seq": None,
    }
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c1.jsonl", "c1.jsonl.incremental.json"]


def test_a_run_with_nothing_new_appends_nothing_and_still_moves_the_watermark(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3)
    # Seqs 4 and 5 were recalled, or are another sender's: the file is empty, the watermark moves past them.
    run(output, b"", next_after_seq=5)
    assert output.read_bytes() == lines(1, 3)
    assert incremental.resume(output, conversation_id=CID, request=REQUEST).next_after_seq == 5


def test_the_pending_append_is_recorded_before_output_grows(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3)
    run(output, lines(4, 5), next_after_seq=5, crash_before_commit=True)
    assert recorded(output)["pending_next_after_seq"] == 5
    # The size before the append, which a crash now is cut back to.
    assert recorded(output)["output_bytes"] == len(lines(1, 3))


def test_a_crash_between_the_append_and_the_watermark_save_does_not_duplicate_on_the_rerun(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3)
    run(output, lines(4, 5), next_after_seq=5, crash_before_commit=True)
    assert output.read_bytes() == lines(1, 5)  # appended, but the watermark still says 3

    rerun = incremental.resume(output, conversation_id=CID, request=REQUEST)
    assert rerun.next_after_seq == 3 and rerun.pending_next_after_seq is None
    assert output.read_bytes() == lines(1, 3)
    # The rerun exports after seq 3 again, and meanwhile seq 6 came.
    run(output, lines(4, 6), next_after_seq=6)
    assert output.read_bytes() == lines(1, 6)


def test_a_partial_append_is_cut_back_too(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3)
    run(output, lines(4, 5), next_after_seq=5, crash_before_commit=True)
    with output.open("r+b") as file:  # the crash came in the middle of the write
        file.truncate(len(lines(1, 4)) - 3)

    run(output, lines(4, 5), next_after_seq=5)
    assert output.read_bytes() == lines(1, 5)


def test_a_crash_on_the_first_append_is_undone_as_well(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3, crash_before_commit=True)
    assert incremental.resume(output, conversation_id=CID, request=REQUEST).next_after_seq == 0
    assert output.read_bytes() == b""


def test_gzip_pieces_append_into_one_valid_gzip_file(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl.gz"
    run(output, gzip.compress(lines(1, 3)), next_after_seq=3)
    run(output, gzip.compress(lines(4, 5)), next_after_seq=5)
    assert gzip.decompress(output.read_bytes()) == lines(1, 5)


def test_an_output_something_else_changed_is_refused(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3)
    output.write_bytes(lines(1, 5))  # say, a full export written over it
    with pytest.raises(UnusableStateFile, match="something else changed it"):
        incremental.resume(output, conversation_id=CID, request=REQUEST)


def test_an_output_shorter_than_a_pending_append_began_is_refused_not_extended(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3)
    run(output, lines(4, 5), next_after_seq=5, crash_before_commit=True)
    output.write_bytes(b"")
    with pytest.raises(UnusableStateFile, match="has 0 bytes"):
        incremental.resume(output, conversation_id=CID, request=REQUEST)
    assert output.read_bytes() == b""


def test_output_grown_while_the_export_ran_is_refused_before_the_append(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3)
    history = incremental.resume(output, conversation_id=CID, request=REQUEST)
    with output.open("ab") as file:
        file.write(b"edited\n")
    piece = tmp_path / "piece"
    piece.write_bytes(lines(4, 5))
    with pytest.raises(UnusableStateFile):
        incremental.append(output, history, piece, next_after_seq=5)
    assert recorded(output)["pending_next_after_seq"] is None


def test_a_file_that_was_not_an_incremental_export_is_not_appended_to(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    output.write_bytes(lines(1, 3))
    with pytest.raises(UnusableStateFile, match="not an incremental export's"):
        incremental.resume(output, conversation_id=CID, request=REQUEST)


def test_an_empty_file_may_begin_a_history(tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    output.touch()
    run(output, lines(1, 3), next_after_seq=3)
    assert output.read_bytes() == lines(1, 3)


@pytest.mark.parametrize(
    ("conversation_id", "request_"),
    [("c2", REQUEST), (CID, {"format": "jsonl", "compression": "gzip"}), (CID, {**REQUEST, "senders": ["bob"]})],
)
def test_the_history_of_another_export_is_refused(
    conversation_id: str, request_: dict[str, object], tmp_path: Path
) -> None:
    output = tmp_path / "c1.jsonl"
    run(output, lines(1, 3), next_after_seq=3)
    with pytest.raises(UnusableStateFile, match="belongs to an incremental export of c1"):
        incremental.resume(output, conversation_id=conversation_id, request=request_)


@pytest.mark.parametrize(
    "content",
    [
        "garbage",
        "[]",
        '{"conversation_id": "c1"}',
        '{"conversation_id": "c1", "request": {"format": "jsonl"}, "next_after_seq": "3"}',
        '{"conversation_id": "c1", "request": {"format": "jsonl"}, "output_bytes": -1}',
        '{"conversation_id": "c1", "request": {"format": "jsonl"}, "pending_next_after_seq": true}',
        '{"conversation_id": "c1", "request": {"format": "jsonl"}, "next_after_seq": 3, "other": 1}',
    ],
)
def test_a_state_file_that_is_not_ours_is_refused(content: str, tmp_path: Path) -> None:
    output = tmp_path / "c1.jsonl"
    history_path(output).write_text(content)
    with pytest.raises(UnusableStateFile, match="not a state file of this command"):
        incremental.resume(output, conversation_id=CID, request=REQUEST)
