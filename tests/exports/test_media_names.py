"""A file's name as a ZIP member (docs/api.md: Submitting an export, Exports with media): nothing a name holds
makes the member leave its attachment's folder, on any system that unzips it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.export.media import LEFT_OUT_REASONS, MAX_SAFE_NAME_BYTES, member_path, safe_name


@pytest.mark.parametrize(
    ("given", "made"),
    [
        ("image.png", "image.png"),
        ("../../etc/passwd", ".._.._etc_passwd"),
        ("/absolute/x.png", "_absolute_x.png"),
        ("C:\\Windows\\x.exe", "C__Windows_x.exe"),
        ("a\x00b\x1fc\x7fd.txt", "a_b_c_d.txt"),
        ("\u202egnp.exe", "_gnp.exe"),
        ("..", "file"),
        (". .", "file"),
        ("name. . ", "name"),
        ("\uff0e\uff0e\uff0fx", ".._x"),  # full-width full stops and solidus
        ("\u00a5..\u00a5x", "_.._x"),  # the yen sign is a backslash in Japanese code pages
        ("nul.png", "_nul.png"),
        ("COM1", "_COM1"),
        ("console.log", "console.log"),
        ("photo <1>?.png", "photo _1__.png"),
        ("caf\u00e9.jpg", "caf\u00e9.jpg"),
    ],
)
def test_a_name_is_made_safe(given: str, made: str) -> None:
    assert safe_name(given) == made


def test_a_long_name_keeps_its_extension_within_the_byte_limit() -> None:
    made = safe_name("\u00e9" * 300 + ".jpeg")
    assert made.endswith(".jpeg") and len(made.encode()) <= MAX_SAFE_NAME_BYTES


def test_the_member_is_always_one_name_inside_its_folder() -> None:
    for hostile in ("../x", "a/../../b", "..\\..\\c", "\uff0f\uff0e\uff0e", "/", "\\"):
        folder, _, name = member_path("att_1", hostile).rpartition("/")
        assert folder == "media/att_1" and name and "/" not in name and "\\" not in name and name not in (".", "..")


def test_the_docs_name_every_reason_a_file_is_left_out() -> None:
    documented = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    assert [reason for reason in LEFT_OUT_REASONS if f"`{reason}`" not in documented] == []
