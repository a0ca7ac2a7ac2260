"""The corpus loader: file discovery, ids, senders and the odd values a YAML corpus holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import corpus
from shared.ids import is_valid_id


def test_every_installed_corpus_file_loads_with_valid_ids() -> None:
    files = corpus.corpus_files()
    assert {"chinese", "english"} <= {language for language, _ in files}
    conversation_ids = set()
    for language, path in files:
        conversation = corpus.load_file(language, path)
        assert is_valid_id(conversation.conversation_id)
        conversation_ids.add(conversation.conversation_id)
        message_ids = [line.message_id for line in conversation.lines]
        assert len(set(message_ids)) == len(message_ids)
        assert all(is_valid_id(message_id) for message_id in message_ids)
        assert all(line.body.strip() and isinstance(line.body, str) for line in conversation.lines)
    assert len(conversation_ids) == len(files)  # one conversation per file
    assert "corpus-chinese-greetings" in conversation_ids


def test_limit_files_applies_per_language() -> None:
    files = corpus.corpus_files(["chinese", "english"], limit_files=2)
    assert [language for language, _ in files] == ["chinese", "chinese", "english", "english"]
    assert [path.name for _, path in files][:2] == sorted(path.name for _, path in files[:2])


def test_an_unknown_language_is_refused() -> None:
    with pytest.raises(ValueError, match="klingon"):
        corpus.corpus_files(["klingon"])


def test_senders_take_turns_across_the_whole_file() -> None:
    conversation = corpus.build_conversation("xx", "topic", [["a", "b", "c"], ["d", "e"]])
    assert [line.sender_id for line in conversation.lines] == ["alice", "bob", "carol", "alice", "bob"]
    assert [line.message_id for line in conversation.lines] == [
        "topic-0-0",
        "topic-0-1",
        "topic-0-2",
        "topic-1-0",
        "topic-1-1",
    ]
    assert conversation.members == ("alice", "bob", "carol")
    sent = [line.sent_at for line in conversation.lines]
    assert sent == sorted(sent) and len(set(sent)) == len(sent)


def test_odd_lines_become_text_or_are_skipped_keeping_positions() -> None:
    dialogs = [[1, True, None, "", "  ", ["nested"], 2.5, "x\x00y"], "a bare string dialog"]
    conversation = corpus.build_conversation("xx", "odd", dialogs)
    assert [(line.message_id, line.body) for line in conversation.lines] == [
        ("odd-0-0", "1"),
        ("odd-0-1", "True"),
        ("odd-0-6", "2.5"),
        ("odd-0-7", "xy"),
        ("odd-1-0", "a bare string dialog"),
    ]


def test_yaml_scalars_keep_their_written_text(tmp_path: Path) -> None:
    path = tmp_path / "quirks.yml"
    path.write_text("categories: [q]\nconversations:\n- - yes\n  - 3.10\n  - ~\n  - '007'\n", encoding="utf-8")
    conversation = corpus.load_file("xx", path)
    # A typed YAML loader would give True, 3.1, None and "007"; the corpus means the words as written.
    assert [line.body for line in conversation.lines] == ["yes", "3.10", "~", "007"]
    assert conversation.conversation_id == "corpus-xx-quirks"


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.yml"
    path.write_text("- just\n- a list\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a mapping"):
        corpus.load_file("xx", path)


def test_ids_are_kept_inside_the_id_alphabet_and_length() -> None:
    assert corpus.conversation_id_for("xx", "tech support/ä") == "corpus-xx-tech_support__"
    long = corpus.build_conversation("xx", "t" * 80, [["a"]])
    assert len(long.conversation_id) == 64 and is_valid_id(long.conversation_id)
    assert len(long.lines[0].message_id) == 64 and long.lines[0].message_id.endswith("-0-0")
