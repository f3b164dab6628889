"""Answer extraction for tasks answered by instruction-tuned LMs in free text.

A completion may reason first and then state its answer in one of the usual
formats. :func:`extract_answer` tries, in order:

1. the last ``<answer>...</answer>`` tag (case-insensitive; an unclosed final
   ``<answer>`` takes the rest of the text);
2. the last ``\\boxed{...}``;
3. the last ``Answer: x`` (also ``Final answer: x``, ``the answer is x``,
   case-insensitive), up to the end of that line;
4. the final non-empty line; if it is an equation (``1 + 5 = 6``), the text
   after its last ``=``.

:func:`normalize_answer` then strips whitespace, wrapping markdown (``**``,
backticks, ``$``) and one trailing period. Scoring compares normalised strings
exactly (see :func:`exact_match`): no partial credit.

>>> extract_answer("2 + 3 is 5.\\n<answer> 5 </answer>")
'5'
>>> extract_answer("Let me think.\\nAnswer: **42**.")
'42'
>>> extract_answer("first\\n\\n  7  \\n"), extract_answer("1 + 5 = 6"), extract_answer("The answer is 14.")
('7', '6', '14')
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger(__name__)

_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
_OPEN_TAG = re.compile(r"<answer>(.*)\Z", re.IGNORECASE | re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER_LINE = re.compile(r"answer\s*(?:is\s*[:=]?|[:=])\s*(.*)", re.IGNORECASE)
_WRAPPERS = ("**", "`", "$", '"', "'")


def normalize_answer(text: str) -> str:
    """Strip whitespace, wrapping markdown/quotes, and one trailing period.

    >>> normalize_answer("  **12.** ")
    '12'
    >>> normalize_answer("3.5")
    '3.5'
    """
    s = text.strip()
    for _ in range(3):  # nested wrappers such as **`x`**
        before = s
        if s.endswith(".") and not s[:-1].rstrip().endswith("."):
            s = s[:-1].rstrip()
        for w in _WRAPPERS:
            if len(s) >= 2 * len(w) and s.startswith(w) and s.endswith(w):
                s = s[len(w) : -len(w)].strip()
        if s == before:
            break
    return s


def _tagged(text: str) -> list[str]:
    """What ``re.findall(r"<answer>(.*?)</answer>", text, IGNORECASE | DOTALL)`` finds, in linear time.

    The regex rescans to the end from every unclosed ``<answer>``: quadratic, ~130 ms for a
    peer's 16,384-character completion of ``"<answer>" * 2048`` (an input bench/fuzz_protocol.py sends).
    """
    found, pos = [], 0
    while (start := _OPEN.search(text, pos)) is not None:
        end = _CLOSE.search(text, start.end())
        if end is None:
            break
        found.append(text[start.end() : end.start()])
        pos = end.end()
    return found


def extract_answer(text: str) -> str:
    """The answer stated in a free-text completion (see the module docstring for the formats)."""
    tags = _tagged(text)
    if tags:
        return normalize_answer(tags[-1])
    open_tag = _OPEN_TAG.search(text)
    if open_tag:
        return normalize_answer(open_tag.group(1))
    boxed = _BOXED.findall(text)
    if boxed:
        return normalize_answer(boxed[-1])
    lines = [line for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        m = _ANSWER_LINE.search(line)
        if m and m.group(1).strip():
            return normalize_answer(m.group(1))
    if not lines:
        return ""
    last = lines[-1]
    if "=" in last and last.rsplit("=", 1)[1].strip():
        last = last.rsplit("=", 1)[1]
    return normalize_answer(last)


def exact_match(completion: str, gold: str) -> float:
    """1.0 if the answer extracted from ``completion`` equals the normalised ``gold``, else 0.0.

    >>> exact_match("The answer is: 8", "8"), exact_match("<answer>80</answer>", "8")
    (1.0, 0.0)
    """
    return 1.0 if extract_answer(completion) == normalize_answer(gold) else 0.0
