"""Live stream entries are bounded (issue 21, item 9): a large stored event
is announced cut, a large delta is split, nothing is lost."""

from __future__ import annotations

import json

from orchestrator.events import ENTRY_CHARS, ENTRY_EVENT, ENTRY_NAME, is_cut, stream_entries
from orchestrator.store.tables import utcnow
from schemas import Event, EventName


def _event(name: EventName, seq: int | None, **data: object) -> Event:
    return Event(
        name=name,
        conversation_id="c",
        root_id="c",
        turn_id="t",
        step=0,
        correlation_id="k",
        time=utcnow(),
        seq=seq,
        data=data,
    )


def test_a_small_event_is_one_whole_entry() -> None:
    event = _event(EventName.TURN_COMPLETED, 7, status="completed", output="fine")
    [entry] = stream_entries(event)
    assert entry == {ENTRY_EVENT: event.model_dump_json(), ENTRY_NAME: "turn.completed"}
    assert not is_cut({k: str(v) for k, v in entry.items()})


def test_a_large_stored_event_is_announced_cut_with_its_number() -> None:
    event = _event(EventName.TURN_COMPLETED, 7, status="completed", output="x" * 50_000)
    [entry] = stream_entries(event)
    fields = {str(k): str(v) for k, v in entry.items()}
    assert len(fields[ENTRY_EVENT]) <= ENTRY_CHARS and is_cut(fields)
    stub = Event.model_validate_json(fields[ENTRY_EVENT])
    assert (stub.seq, stub.name, stub.turn_id) == (7, event.name, "t")
    assert stub.data == {"cut": True, "size": len(event.model_dump_json())}


def test_a_large_delta_is_split_into_bounded_entries_keeping_all_its_text() -> None:
    text = "\x01" * 3000 + "é" * 20_000 + "\n" * 3000  # escaped up to six characters each
    entries = stream_entries(_event(EventName.ASSISTANT_DELTA, None, text=text))
    assert len(entries) > 1
    assert all(len(str(e[ENTRY_EVENT])) <= ENTRY_CHARS for e in entries)
    pieces = [json.loads(str(e[ENTRY_EVENT]))["data"]["text"] for e in entries]
    assert "".join(pieces) == text
