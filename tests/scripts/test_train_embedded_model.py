"""``scripts/train_embedded_model.py``: recall rows asked after a stretch, as the decode protocol
asks."""

import re

import pytest
import torch
from script_support import load_script


def _script():
    return load_script("scripts/train_embedded_model.py")  # puts scripts/ on the path: below


def _stretch_rows(rows: int, seed: int = 0):
    _script()
    from embedded_model.data_mix import LONG_LEN, RecallMix
    from embedded_model.progress import Progress

    mix = RecallMix(1.0, [1024], ["lookup", "multi_key", "chain"], seed, 1.0)
    ids = torch.zeros(rows, LONG_LEN + 1, dtype=torch.long)
    done = Progress()
    masks = mix.rows(ids, done)
    return ids, masks, done, mix


def test_a_stretch_row_holds_context_stretch_question_and_answer_with_matching_masks():
    from kvpop_compile.embedded.recall import make_item

    ids, masks, done, mix = _stretch_rows(6)
    from embedded_model.data_mix import LOOP_UNIT, STRETCH_ITEM_LEN

    # One item to a row, drawn in order from the training split's stream (seed 0).
    asked = [{make_item("train", t, 1024, 0, row) for t in mix.tasks} for row in range(6)]

    assert done.recall_items == done.stretch_items == 6
    for row in range(6):
        data = bytes(ids[row].tolist())
        stretch = masks.stretch[row].nonzero().squeeze(1)
        questions = masks.questions[row].nonzero().squeeze(1)
        answers = masks.answers[row].nonzero().squeeze(1)
        # Target j predicts byte j + 1: each mask is one contiguous run, in the order
        # stretch, question, answer, with the answer at the question's end.
        assert torch.equal(stretch, torch.arange(stretch[0], stretch[-1] + 1))
        assert stretch.numel() == STRETCH_ITEM_LEN
        assert questions[0] == stretch[-1] + 1
        assert answers[-1] == questions[-1] == len(data) - 3  # a newline ends the row
        filler = data[stretch[0] + 1 : stretch[-1] + 2]
        question = data[questions[0] + 1 : answers[0] + 1]
        answer = data[answers[0] + 1 : answers[-1] + 2]
        # The context before the stretch is the item's own prompt up to its question line,
        # and the question is that line whole.
        context = data[: stretch[0] + 1]
        assert any(
            item.prompt == context + question and item.answer == answer
            and item.question == b"\n" + question
            for item in asked[row]
        )  # fmt: skip
        # The stretch ends in a loop of one unit, and gives no word of the answer away.
        assert not any(w in filler for w in re.findall(rb"\w+", question + answer))
        tail = filler[-2 * LOOP_UNIT[1] :]
        assert any(
            tail[p:] == tail[: len(tail) - p] for p in range(LOOP_UNIT[0], LOOP_UNIT[1] + 1)
        ), tail
    assert mix.next_index == 6


def test_stretch_rows_leave_the_loop_out_of_the_next_byte_loss_only():
    ids, masks, _, _ = _stretch_rows(2, seed=3)
    assert not (masks.stretch & masks.questions).any()
    assert masks.stretch.sum() == 2 * 1024 and masks.answers.sum() > 0


def test_no_stretch_fraction_draws_no_stretch_rows():
    _script()
    from embedded_model.data_mix import LONG_LEN, RecallMix
    from embedded_model.progress import Progress

    ids = torch.zeros(3, LONG_LEN + 1, dtype=torch.long)
    done = Progress()
    masks = RecallMix(1.0, [1024], ["lookup"], 0).rows(ids, done)
    assert done.recall_items == 6 and done.stretch_items == 0 and not masks.stretch.any()


@pytest.mark.parametrize("fraction", ["-0.1", "1.5"])
def test_a_stretch_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(SystemExit, match=r"--recall-stretch-fraction must be in \[0, 1\], got"):
        _script().parse_args(["--recall-stretch-fraction", fraction])
