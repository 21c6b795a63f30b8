"""Answer extractors: pull the model's final answer out of free text, one function per answer kind.

Hardened like the reference's ds4-eval (seed §5) against the false negatives that naive rules give:
- the answer line is the last line that starts with `Answer:` (the format every prompt asks for),
  else the first line mentioning "answer" that yields a value, else a fallback per kind (below);
- on that line a capital letter that starts a word of prose ("I think", "I'll", "A careful") is not
  a choice, unless nothing else on the line is (then a reverse scan takes it: "Answer: I."); with no
  answer line at all, prose capitals are never a choice ("A rectangle is 5 cm long" names no option);
  a letter the line states as the answer is not prose ("A is correct");
- an answer that is only the prompt's own placeholder ("Answer: <answer>", the instruction echoed
  back) is no answer;
- a letter right after a negation cue (not, n't, rule(s/d) out, eliminate, reject, except) is a
  distractor, judged within the answer line only, never across lines ("Answer: D, not B" -> D);
- an integer answer line showing its working takes the value after the last `=`
  ("m+n = 256+37 = 293" -> 293); leading zeros are dropped ("082" -> 82).

Rules for replies without an answer line, each from a mistake seen in a real trace:
- two or more lines copied from the prompt in its own order (the passage or the option list echoed
  back) are not the answer (`without_echo`); one copied line is ("D. Wednesday" names option D),
  and so are lines picked out of order ("1. ..." and "5. ..." name lines 1 and 5);
- a choice: a reply naming exactly one option by its text and none by letter chose that option
  ("... = 15 square centimeters" with "B. 15");
- an integer: the last line with a number decides, by the same `=` rule (its stated result may be no
  integer: "3.5 * 60 = 21.5 minutes" is none), and with no digit at all a number word counts ("runs
  twice a day" -> 2).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_THINK_CLOSE = "</think>"
_LEADING_MARKER = re.compile(r"^[\s>*_#`-]*(?:final\s+|correct\s+)?answer\s*\**\s*[:：]", re.IGNORECASE)
_ANY_MARKER = re.compile(r"\banswer\b(?:\s+(?:is|would be|should be)\b|\s*[:=：])", re.IGNORECASE)
_LETTER = re.compile(r"(?<![A-Za-z0-9])([A-Z])(?![A-Za-z0-9])")
_WORD = re.compile(r"[A-Za-z']+|[’]")
_INT = re.compile(r"(?<![\w.])([-−]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.0+)?(?![\w.]*\d)")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_RANGE = re.compile(r"(\d+)\s*(?:-|–|to)\s*(\d+)|(\d+)")
_PLACEHOLDER = re.compile(r"[\s`*\"'(]*<[^<>\n]{1,60}>[\s`*\"').]*")
_COPULA = re.compile(r"\s+(?:is|was|seems|looks|appears|fits)\b")
_NUMBER = re.compile(r"\d")
_WORDS_0_TO_20 = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
)  # fmt: skip
_NUMBER_WORDS = {word: value for value, word in enumerate(_WORDS_0_TO_20)} | {
    "once": 1,
    "twice": 2,
    "thrice": 3,
}
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_FILLER = frozenset({"option", "options", "choice", "choices", "letter", "answer"})
_NEGATIONS = frozenset({"not", "except", "excluding", "eliminate", "eliminates", "eliminated", "reject"})
_NEGATIONS |= {"rejects", "rejected", "eliminating", "rejecting"}
_RULE = frozenset({"rule", "rules", "ruled", "ruling"})
_LIST_WORDS = frozenset({"and", "or", "nor", "both", "either", "neither"})


def _is_choice(word: str) -> bool:
    return len(word) == 1 and word.isupper()


def visible_text(text: str) -> str:
    """The text after the first `</think>` (reasoning that leaked into the content is not an answer)."""
    head, sep, tail = text.partition(_THINK_CLOSE)
    return tail if sep else head


def without_echo(text: str, prompt: str) -> str:
    """The reply minus every stretch of two or more lines copied from the prompt in the prompt's own
    order (consecutive prompt lines; blank lines aside): an echoed passage or option list is not an
    answer, while quoting chosen lines ("1. ...", then "5. ...") is."""
    position: dict[str, int] = {}
    for i, line in enumerate(line.strip() for line in prompt.splitlines() if line.strip()):
        position.setdefault(line, i)
    lines = text.splitlines()
    dropped: set[int] = set()
    run: list[int] = []  # reply line numbers of the current stretch
    previous: int | None = None  # the prompt position of the last non-empty reply line
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        at = position.get(line.strip())
        if at is not None and previous is not None and run and at == previous + 1:
            run.append(i)
        else:
            dropped |= _echo_run(run)
            run = [i] if at is not None else []
        previous = at
    dropped |= _echo_run(run)
    return "\n".join(line for i, line in enumerate(lines) if i not in dropped)


def _echo_run(run: list[int]) -> set[int]:
    return set(range(run[0], run[-1] + 1)) if len(run) >= 2 else set()


def answer_regions(text: str) -> Iterator[str]:
    """Candidate answer regions, best first: the text after the marker on `Answer:` lines (last line
    first; a bare `Answer:` takes the next non-empty line), then after "answer is"/"answer:" on
    other lines (first line first)."""
    lines = visible_text(text).splitlines()
    for i in reversed(range(len(lines))):
        if m := _LEADING_MARKER.match(lines[i]):
            rest = lines[i][m.end() :]
            yield _unless_placeholder(rest if rest.strip() else _next_content_line(lines[i + 1 :]))
    for line in lines:
        if not _LEADING_MARKER.match(line) and (m := _ANY_MARKER.search(line)):
            yield _unless_placeholder(line[m.end() :])


def _unless_placeholder(region: str) -> str:
    """The prompt's format echoed back ("<answer>") is not an answer: an empty region instead."""
    return "" if _PLACEHOLDER.fullmatch(region) else region


def _next_content_line(lines: list[str]) -> str:
    """The line under a bare `Answer:`, unless it is only another answer marker."""
    for line in lines:
        if line.strip():
            is_marker = _LEADING_MARKER.match(line) or _ANY_MARKER.search(line)
            return "" if is_marker else line
    return ""


def has_answer(text: str) -> bool:
    """Whether the text states an answer anywhere (a marker with something after it)."""
    return any(region.strip() for region in answer_regions(text))


# --- multiple choice -------------------------------------------------------------------------------


def find_letter(text: str, num_choices: int, choices: tuple[str, ...] = ()) -> str | None:
    """The chosen letter among the first `num_choices` (A..), or None. `choices` (the options'
    texts) lets a reply that names an option only by its text count."""
    last = chr(ord("A") + num_choices - 1)
    regions = list(answer_regions(text))
    for region in regions:
        if letter := _scan_forward(region, last) or _scan_backward(region, last, prose_guard=False):
            return letter
    lines = visible_text(text).splitlines()
    for line in reversed(lines):
        if letter := _scan_backward(line, last, prose_guard=True):
            return letter
    stated = [r for r in regions if r.strip()] or [line for line in lines if line.strip()][-1:]
    return next((letter for r in stated if (letter := _choice_named(r, choices))), None)


def _choice_named(region: str, choices: tuple[str, ...]) -> str | None:
    """The letter of the one option whose text appears in `region` as whole words, or None (none or
    several do; one-letter options are left out: they would match stray letters)."""
    text = region.casefold()
    named = [
        chr(ord("A") + i)
        for i, choice in enumerate(choices)
        if len(option := normalize(choice)) > 1 or option.isdigit()
        if re.search(rf"(?<![\w^.]){re.escape(option)}(?![\w^]|\.\d)", text)
    ]
    return named[0] if len(named) == 1 else None


def _scan_forward(region: str, last: str) -> str | None:
    for m in _LETTER.finditer(region):
        if m.group(1) <= last and not _is_prose(region, m.end()) and not _is_negated(region[: m.start()]):
            return m.group(1)
    return None


def _scan_backward(region: str, last: str, prose_guard: bool) -> str | None:
    for m in reversed(list(_LETTER.finditer(region))):
        if m.group(1) > last or _is_negated(region[: m.start()]):
            continue
        if not (prose_guard and _is_prose(region, m.end())):
            return m.group(1)
    return None


def _is_prose(region: str, end: int) -> bool:
    """A capital that begins prose: "I'll", "I think", "A careful reading" (but "A is correct"
    states a choice: neither the pronoun nor the article is followed by "is")."""
    rest = region[end:]
    if _COPULA.match(rest):
        return False
    return rest[:1] in ("'", "’") or bool(re.match(r"\s+[a-z]", rest))


def _is_negated(before: str) -> bool:
    """Whether the words just before a letter (same line, same clause) negate it: "not B",
    "rules out C", and the later members of a negated list: "rule out A and B"."""
    clause = re.split(r"[.;:!?]", before)[-1]
    words = [w if len(w) == 1 and w.isupper() else w.lower() for w in _WORD.findall(clause)]
    while words and (words[-1] in _FILLER or words[-1] in _LIST_WORDS or _is_choice(words[-1])):
        words.pop()
    if not words:
        return False
    word = words[-1]
    if word in _NEGATIONS or word.endswith(("n't", "n’t")):
        return True
    return word == "out" and len(words) > 1 and words[-2] in _RULE


# --- numbers and line numbers ----------------------------------------------------------------------


def parse_integer(text: str) -> int | None:
    """An integer written alone ("082", "-5", "1,234"), else None."""
    m = _INT.fullmatch(text.strip().rstrip("."))
    return _int_value(m) if m else None


def _int_value(m: re.Match[str]) -> int:
    value = int(m.group(2).replace(",", ""))  # int() drops leading zeros: "082" -> 82
    return -value if m.group(1) else value


def _integer_in(region: str) -> int | None:
    if "=" in region:
        region = region.rsplit("=", 1)[1]
    m = _INT.search(region)
    return _int_value(m) if m else None


def _number_word_in(region: str) -> int | None:
    """The value of the one number word in a region without digits ("twice a day" -> 2), or None."""
    if _NUMBER.search(region):
        return None
    values = {_NUMBER_WORDS[w] for w in re.findall(r"[a-z]+", region.lower()) if w in _NUMBER_WORDS}
    return values.pop() if len(values) == 1 else None


def find_integer(text: str) -> int | None:
    for region in answer_regions(text):
        if (value := _integer_in(region)) is not None or (value := _number_word_in(region)) is not None:
            return value
    visible = visible_text(text)
    for boxed in reversed(_BOXED.findall(visible)):
        if (value := _integer_in(boxed)) is not None:
            return value
    lines = [line for line in visible.splitlines() if line.strip()]
    numbered = [line for line in lines if _NUMBER.search(line)]
    if not numbered:
        return _number_word_in(lines[-1]) if lines else None
    last = numbered[-1]  # the reply's last stated number: its result if it shows working, else its last
    if "=" in last:
        return _integer_in(last)
    found = list(_INT.finditer(last))
    return _int_value(found[-1]) if found else None


def parse_line_set(text: str) -> frozenset[int]:
    """Line numbers in "9", "9,15", "20-22", "lines 3 and 7"."""
    lines: set[int] = set()
    for m in _RANGE.finditer(text):
        if m.group(3):
            lines.add(int(m.group(3)))
        elif int(m.group(2)) - int(m.group(1)) <= 1000:
            lines.update(range(int(m.group(1)), int(m.group(2)) + 1))
    return frozenset(lines)


def find_line_set(text: str) -> frozenset[int]:
    for region in answer_regions(text):
        if lines := parse_line_set(region):
            return lines
    return frozenset({value}) if (value := find_integer(text)) is not None else frozenset()


# --- strings and sequences -------------------------------------------------------------------------


def normalize(text: str) -> str:
    """Case, surrounding quotes/markdown, a trailing period and repeated spaces do not matter."""
    text = re.sub(r"[*_`]+", "", text).strip()
    text = re.sub(r"^(?:is|:|=|-)(?:\s+|$)", "", text.strip(), flags=re.IGNORECASE).strip()
    text = text.strip("\"'“”‘’ ").rstrip(".!").strip("\"'“”‘’ ")
    return " ".join(text.split()).casefold()


def find_string(text: str) -> str | None:
    candidates = string_candidates(text)
    return candidates[0] if candidates else None


def string_candidates(text: str) -> list[str]:
    """Readings of the answer, best first: the whole answer region (else the last line), the part
    after its last ':' or 'is'/'are' ("The reversed string is tenalp"), and its last quoted text."""
    regions = list(answer_regions(text))
    region = next((r for r in regions if normalize(r)), None)
    if region is None and regions:
        return []  # it said "Answer:" and nothing after it
    if region is None:
        lines = [line for line in visible_text(text).splitlines() if line.strip()]
        if not lines:
            return []
        region = lines[-1]
    quoted = re.findall(r"[\"“`]([^\"”`]+)[\"”`]|(?<!\w)'([^']+)'(?!\w)", region)
    readings = [region, re.split(r":|\bis\b|\bare\b", region)[-1]]
    readings += [a or b for a, b in quoted[-1:]]
    return list(dict.fromkeys(value for value in map(normalize, readings) if value))


def split_sequence(text: str) -> tuple[str, ...]:
    text = normalize(text).strip("[]()")
    parts = re.split(r"\s*(?:,|;|->|→|\bthen\b)\s*", text)
    if len(parts) == 1:
        parts = text.split()
    return tuple(normalize(p) for p in parts if normalize(p))


def find_sequence(text: str) -> tuple[str, ...]:
    candidates = sequence_candidates(text)
    return candidates[0] if candidates else ()


def sequence_candidates(text: str) -> list[tuple[str, ...]]:
    return [items for value in string_candidates(text) if (items := split_sequence(value))]


# --- code ------------------------------------------------------------------------------------------


def find_code(text: str, entry_point: str) -> str:
    """The Python the model wrote: the last fenced block defining `entry_point`, else the first
    fenced block, else the whole visible text (an unclosed fence at the end counts: output ran out)."""
    visible = visible_text(text)
    blocks = [
        body for lang, body in _FENCE.findall(visible) if lang.lower() in ("", "python", "py", "python3")
    ]
    defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.MULTILINE)]
    if defining:
        return defining[-1]
    return blocks[0] if blocks else visible
