"""``chatexport export``'s options (docs/command-line.md: Command-line client): what they submit, the default output
name, and the usage errors they are checked for before any request.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from chatexport.client import commands
from chatexport.client.download import extension_of, result_part_path


def parse(*arguments: str) -> argparse.Namespace:
    """The client's commands alone (no server code) parsing ``arguments``; argparse exits 2 on a bad one."""
    parser = argparse.ArgumentParser(prog="chatexport")
    commands.add_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(arguments)


def request_of(*options: str) -> dict[str, object]:
    return commands.export_request(parse("export", "c1", *options))


def test_without_options_the_request_is_the_one_earlier_versions_stored() -> None:
    # A state file written before the options existed still matches, and its key still replays.
    assert request_of() == {"format": "jsonl"}


def test_every_option_reaches_the_request_in_canonical_form() -> None:
    assert request_of(
        "--after-seq",
        "3",
        "--before-seq",
        "90",
        "--since",
        "2024-05-01T10:00:00.123456+02:00",
        "--until",
        "2024-05-02t00:00:00z",
        "--sender",
        "bob",
        "--sender",
        "alice",
        "--sender",
        "bob",
        "--format",
        "csv",
        "--gzip",
        "--max-part-bytes",
        "5242880",
    ) == {
        "format": "csv",
        "after_seq": 3,
        "before_seq": 90,
        # The next whole millisecond, as the API takes a bound between two (it selects the same messages).
        "since": "2024-05-01T08:00:00.124Z",
        "until": "2024-05-02T00:00:00.000Z",
        "senders": ["alice", "bob"],
        "compression": "gzip",
        "max_part_bytes": 5242880,
    }


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ((), "c1.jsonl"),
        (("--format", "csv"), "c1.csv"),
        (("--format", "html", "--gzip"), "c1.html.gz"),
        (("--gzip", "--incremental"), "c1.jsonl.gz"),
    ],
)
def test_the_default_output_name_follows_the_format(options: tuple[str, ...], name: str) -> None:
    assert "c1" + extension_of(request_of(*options)) == name


@pytest.mark.parametrize(
    "options",
    [
        ("--since", "2024-05-01T08:00:00"),  # no offset
        ("--since", "2024-05-01 08:00:00Z"),  # not RFC 3339's T
        ("--since", "2024-W18-3T08:00:00Z"),  # an ISO week date
        ("--until", "2024-02-30T08:00:00Z"),  # no such day
        ("--until", "2024-05-01T24:00:00+00:00"),
        ("--until", "0001-01-01T00:00:00+01:00"),  # before the first instant Python holds, in UTC
        ("--since", "2026-01-01T00:00:00+05:99"),  # an offset RFC 3339 has not
        ("--since", "0999-12-31T00:00:00Z"),  # before the API's first year
        ("--after-seq", str(2**63)),  # over Postgres' bigint
        ("--sender", "a b"),
        ("--sender", "x" * 65),
        ("--format", "../x"),  # not a name: it would name the output file
        ("--max-part-bytes", "5242879"),
        ("--max-part-bytes", "5MiB"),
        ("--progress-interval", "0"),
        ("--progress-interval", "5e-324"),
        ("--progress-interval", "0.09"),
        ("--progress-interval", "-1"),
        ("--progress-interval", "inf"),
        ("--progress-interval", "nan"),
        ("--progress-interval", "soon"),
    ],
)
def test_a_bad_option_is_a_usage_error(options: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("export", "c1", *options)
    assert exited.value.code == commands.EXIT_USAGE
    assert options[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (("--since", "2024-05-02T00:00:00Z", "--until", "2024-05-02T02:00:00+02:00"), "--until must be later"),
        (tuple(f"--sender=u{n}" for n in range(101)), "at most 100"),
        (("--incremental", "--after-seq", "3"), "no --after-seq"),
        (("--incremental", "--before-seq", "30"), "no --after-seq or --before-seq"),
        (("--incremental", "--format", "csv"), "one JSONL file"),
        (("--incremental", "--format", "html", "--gzip"), "one JSONL file"),
        (("--incremental", "--max-part-bytes", "5242880"), "no --max-part-bytes"),
    ],
)
def test_options_that_do_not_go_together_are_a_usage_error_before_any_request(
    options: tuple[str, ...], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No token and an API that cannot answer: the command must stop before it needs either.
    args = parse("export", "c1", "--api", "http://127.0.0.1:9", *options)
    args.token = None
    assert args.handler(args) == commands.EXIT_USAGE
    assert said in capsys.readouterr().err


def test_progress_lines_come_every_ten_seconds_unless_told_otherwise() -> None:
    assert (parse("export", "c1").progress_interval, parse("export", "c1").quiet) == (10.0, False)
    told = parse("export", "c1", "--progress-interval", "0.5", "--quiet")
    assert (told.progress_interval, told.quiet) == (0.5, True)
    assert parse("export", "c1", "-q").quiet


def test_a_hundred_senders_and_repeats_are_allowed() -> None:
    senders = [f"--sender=u{n:03d}" for n in range(100)]
    assert request_of(*senders, "--sender=u000")["senders"] == [f"u{n:03d}" for n in range(100)]


@pytest.mark.parametrize(
    ("output", "extension", "part"),
    [
        ("c1.csv.gz", ".csv.gz", "c1.part-1.csv.gz"),
        ("c1.jsonl", ".jsonl", "c1.part-1.jsonl"),
        ("my.export.html", ".html", "my.export.part-1.html"),
        ("out.txt", ".jsonl", "out.part-1.txt"),  # not the format's extension: before the last suffix
        ("c1.jsonl.gz", ".csv.gz", "c1.jsonl.part-1.gz"),
        ("out", ".jsonl", "out.part-1"),
        (".jsonl", ".jsonl", ".jsonl.part-1"),  # a hidden file's name is all stem
    ],
)
def test_a_part_goes_beside_the_output_with_its_number_before_the_extension(
    output: str, extension: str, part: str, tmp_path: Path
) -> None:
    assert result_part_path(tmp_path / output, 1, extension) == tmp_path / part


def test_parts_are_numbered_as_the_status_numbers_them(tmp_path: Path) -> None:
    assert result_part_path(tmp_path / "c1.jsonl", 12, ".jsonl").name == "c1.part-12.jsonl"


def test_the_extension_of_an_operation_request_follows_its_format_and_compression() -> None:
    # As an operation shows it: every option, defaults included.
    shown = {"format": "html", "compression": "gzip", "after_seq": 0, "since": None, "max_part_bytes": None}
    assert extension_of(shown) == ".html.gz"
    assert extension_of({**shown, "compression": "none"}) == ".html"
    assert extension_of({}) == ".jsonl"
