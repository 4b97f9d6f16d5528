"""Task ids name the cursor position they serve, so copies are recognisable."""

from __future__ import annotations

from orchestrator.engine.actions import Position, advance_task_id, position_of, step_task_id


def test_a_step_and_an_advance_id_give_back_their_position() -> None:
    assert position_of(step_task_id("c1", "t1", 3)) == Position("c1", "t1", 3, -1)
    assert position_of(advance_task_id("c1", "t1", 3, 2)) == Position("c1", "t1", 3, 2)


def test_copies_of_one_position_share_an_id_and_positions_differ() -> None:
    assert step_task_id("c", "t", 0) == step_task_id("c", "t", 0)
    assert step_task_id("c", "t", 0) != step_task_id("c", "t", 1)
    assert advance_task_id("c", "t", 0, 0) != advance_task_id("c", "t", 0, 1)


def test_other_ids_name_no_position() -> None:
    for other in ("0f3c9a", "step:c:t", "step:c:t:x", "advance:c:t:1", "tool:c:t:1:2"):
        assert position_of(other) is None
