"""The tape's one declared record layout: the docs' table, the header and the shipped
tapes all agree with it, byte for byte."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from engine.events import RequestAccepted, RequestFinished, StepSample, TokenEvent, UserMessage
from engine.tape.format import (
    EXTRAS_NOTE,
    FIELDS,
    LAYOUT,
    Abandoned,
    CardRecord,
    Decoder,
    Encoder,
    Kind,
    NewChat,
    RecordingEnded,
    StartedRequest,
    dumps,
    layout_markdown,
)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "docs" / "tapes" / "README.md"
SHIPPED = sorted((ROOT / "docs" / "tapes").glob("*.jsonl"))
BEGIN = "<!-- the record layout: made by engine.tape.format.layout_markdown() -->\n"
END = "<!-- end of the record layout -->\n"


def test_the_docs_table_is_the_declared_layout() -> None:
    text = README.read_text("utf-8")
    assert BEGIN in text
    assert END in text
    documented = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert documented == layout_markdown(), (
        "docs/tapes/README.md's record table is not engine.tape.format.LAYOUT: paste "
        "layout_markdown()'s output between its two markers"
    )


def test_the_headers_note_names_the_kinds_with_extras() -> None:
    named = {
        tag.strip() for tag in EXTRAS_NOTE.split(" records")[0].replace(" and ", ",").split(",")
    }
    assert named == {layout.tag for layout in LAYOUT if layout.extras is not None}


def test_an_event_layout_names_only_the_events_fields() -> None:
    # The encoder reads these records' fields off the event by name.
    for layout in LAYOUT:
        if layout.extras is not None:
            own = {f.name for f in dataclasses.fields(layout.extras)}
            assert set(layout.names) - {"at"} <= own, layout.tag


@pytest.mark.parametrize("tape", SHIPPED, ids=lambda p: p.name)
def test_the_shipped_tapes_read_and_write_back_byte_for_byte(tape: Path) -> None:
    header, *lines = tape.read_bytes().splitlines()
    assert json.loads(header)["records"] == FIELDS
    decoder, encoder = Decoder(), Encoder()
    for number, line in enumerate(lines, 2):
        kind, value, at = _handed(*decoder.decode(json.loads(line)))
        assert dumps(encoder.encode(kind, value, at)) == line, f"{tape.name} line {number}"


def _handed(value: Any, at: float) -> tuple[Kind, Any, float]:
    """What the recorder was handed for a record that decoded to `value`."""
    if isinstance(value, CardRecord):
        return "card", value.card, value.time_s
    if isinstance(value, StepSample):
        return "step", value, 0.0
    if isinstance(value, StartedRequest):
        # The tape keeps only the count of a request's token IDs.
        count = value.prompt_ids_len
        ids = None if count is None else (0,) * count
        request = dataclasses.replace(value.request, prompt_token_ids=ids)
        return "request", request, value.time_s
    if isinstance(value, UserMessage):
        return "message", value, 0.0
    if isinstance(value, NewChat):
        return "chat", None, value.time_s
    if isinstance(value, RecordingEnded):
        return "end", (value.reason, value.detail), value.time_s
    if isinstance(value, Abandoned):
        return "abandoned", value.request_id, value.time_s
    assert isinstance(value, RequestAccepted | TokenEvent | RequestFinished), value
    return "event", value, at if isinstance(value, RequestFinished) else 0.0
