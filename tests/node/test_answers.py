"""Answer extraction from free-text completions, and exact-match scoring."""

from __future__ import annotations

import pytest

from node.tasks.answers import exact_match, extract_answer, normalize_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>42</answer>", "42"),
        ("Think: 40 + 2.\n<answer>\n 42 \n</answer>\nDone.", "42"),
        ("<answer>1</answer> wait, no: <ANSWER>2</ANSWER>", "2"),  # the last tag wins, any case
        ("reasoning...\n<answer>17", "17"),  # unclosed final tag (cut by max_new_tokens)
        ("so the result is \\boxed{12}.", "12"),
        ("Answer: 7", "7"),
        ("Step 1...\nFinal answer: **-61**.", "-61"),
        ("The answer is 14.", "14"),
        ("answer = tac", "tac"),
        ("lots of words\n\n  19  \n\n", "19"),  # final non-empty line
        ("1 + 5 = 6", "6"),  # an equation on the final line: its right-hand side
        ("`abc`", "abc"),
        ("", ""),
    ],
)
def test_extract_answer_formats(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


def test_tag_beats_answer_line_and_final_line() -> None:
    assert extract_answer("Answer: 3\n<answer>4</answer>\n5") == "4"
    assert extract_answer("Answer: 3\nsomething else") == "3"


def test_normalize_keeps_decimals_and_inner_dots() -> None:
    assert normalize_answer("3.5") == "3.5"
    assert normalize_answer("e.g.") == "e.g"
    assert normalize_answer(' "**x**." ') == "x"


def test_exact_match_is_binary_and_exact() -> None:
    assert exact_match("<answer>80</answer>", "80") == 1.0
    assert exact_match("<answer>800</answer>", "80") == 0.0  # no partial credit
    assert exact_match("80 legs", "80") == 0.0
    assert exact_match("Answer: tac", " tac ") == 1.0


def test_tag_scan_matches_the_regex_it_replaces() -> None:
    # the linear scan (a peer's "<answer>" * 2048 made the regex quadratic) finds exactly what the regex found
    import random
    import re

    from node.tasks.answers import _tagged

    regex = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
    rng = random.Random(0)
    parts = ["<answer>", "</answer>", "<ANSWER>", "</Answer>", "x", "12", " ", "\n", "İ"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(12)))
        assert _tagged(text) == regex.findall(text), text
    assert _tagged("<answer>" * 2048) == []
